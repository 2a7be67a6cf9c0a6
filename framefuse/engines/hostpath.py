"""The step kernel's per-frame host work as one foreign call (``hostpath.c``).

Session.step on a step-kernel binding is: the frame into mapped memory, a NaN/Inf check, the done
words cleared, ``cuGraphLaunch`` (or the resident kernel's bell), a spin on the done words. Done
from Python that is two ctypes calls (0.6–1.1 µs each on the 2-core CI machine before they do
anything), a numpy probe and a Python polling loop; ``hostpath.c`` does all but the frame copy in
one call.

The C file is compiled on first use with the system's C compiler (``$CC`` or ``cc``: the one
torch's Triton needs for its own launchers) into the kernel cache, under a hash of the source
and the compiler, written to a temporary name and renamed. Without a compiler, or with
``FRAMEFUSE_HOSTPATH=0``, the bindings keep the Python path (the same outputs; on an H200 2.4–4.5 µs more a step);
``status()`` says which one runs and why.

Where the Python headers are installed (``sysconfig``'s include folder: python3-dev, or what
torch's Triton needs for its launchers) the same file is built with ``FF_PYTHON`` and is also the
extension module ``framefuse_hostpath``: its ``step(context, frame)`` is Session.step's whole hot
path (``StepContext``), so a frame costs one C call instead of a numpy copy, a ctypes call and a
Python latency record. Without the headers, the ctypes call remains.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("hostpath.c")

# ff_frame's answers (hostpath.c)
DONE, NONFINITE, LAUNCH_FAILED, SPINNING, UNWAITED, NOT_RUNNING = range(6)


class FrameState(ctypes.Structure):
    """hostpath.c's ff_frame_state, field for field."""

    _fields_ = [
        ("launch", ctypes.c_void_p),
        ("exec", ctypes.c_void_p * 2),
        ("stream", ctypes.c_void_p),
        ("done", ctypes.c_void_p),
        ("bell", ctypes.c_void_p),
        ("frame", ctypes.c_void_p),
        ("frame_floats", ctypes.c_int64),
        ("spin_limit", ctypes.c_int64),
        ("launches", ctypes.c_int64),
        ("epoch_base", ctypes.c_int64),
        ("frames", ctypes.c_int64),
        ("launch_ns", ctypes.c_int64),
        ("wait_ns", ctypes.c_int64),
        ("start_ns", ctypes.c_int64),
        ("expected", ctypes.c_uint32),
        ("n_done", ctypes.c_int32),
        ("n_execs", ctypes.c_int32),
        ("parity", ctypes.c_int32),
        ("unwaited", ctypes.c_int32),
        ("running", ctypes.c_int32),
        ("error", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("tag_src", ctypes.c_void_p),
        ("tag_dst", ctypes.c_void_p),
        ("tag_len", ctypes.c_void_p),
        ("tag_inputs", ctypes.c_int32),
        ("flush_frame", ctypes.c_int32),
        ("out_words", ctypes.c_void_p),
        ("out_floats", ctypes.c_void_p),
        ("out_len", ctypes.c_void_p),
        ("out_tensors", ctypes.c_int32),
        ("tag_flip", ctypes.c_int32),
    ]


class CpuWorker(ctypes.Structure):
    """hostpath.c's ff_cpu_worker, field for field: the CPU step on a core of its own
    (engines/cpustep.CpuResidentBinding)."""

    _fields_ = [
        ("frame", ctypes.c_void_p),
        ("answered", ctypes.c_int64),
        ("yield_polls", ctypes.c_int64),
        ("stop", ctypes.c_int32),
        ("parity", ctypes.c_int32),
        ("started", ctypes.c_int32),
        ("error", ctypes.c_int32),
        ("seen", ctypes.c_uint32),
        ("tid", ctypes.c_int32),
        ("thread", ctypes.c_uint64),
    ]


MAX_DIMS = 8  # hostpath.c's FF_MAX_DIMS


class StepContext(ctypes.Structure):
    """hostpath.c's ff_step_context: what the extension's step needs of a session (the frame
    state, the frame's type, dtype and shape, the mapped input, the output, the latency buffers).
    The py_object fields hold their references."""

    _fields_ = [
        ("state", ctypes.c_void_p),
        ("ndarray", ctypes.py_object),
        ("dtype", ctypes.py_object),
        ("out", ctypes.py_object),
        ("buffer", ctypes.c_void_p),
        ("nbytes", ctypes.c_int64),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("ndim", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("ring", ctypes.c_void_p),
        ("stats", ctypes.c_void_p),
    ]


_lock = threading.Lock()
# "lib" -> (ff_frame, ff_wait) or None; "why" -> the reason it is None; "module" -> the extension
# module or None; "module_why" -> why it is None
_loaded: dict = {}


def _compiler() -> list[str] | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return cc.split() if cc else None


def _cache_dir() -> Path:
    from framefuse.plugins.cuda import cache_dir

    return cache_dir() / "host"


def python_include() -> str | None:
    """The folder holding this interpreter's Python.h, or None where the headers are not installed."""
    include = sysconfig.get_paths().get("include")
    return include if include and os.path.exists(os.path.join(include, "Python.h")) else None


def _build(cc: list[str]) -> Path:
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"{' '.join(cc)} --version failed: {exc}") from exc
    include = python_include()
    # the extension is built for this interpreter: its version and ABI are part of the name
    python = f"{include}|{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}" if include else "no-python"
    digest = hashlib.sha256(source + version.encode() + sys.platform.encode() + python.encode()).hexdigest()[:16]
    target = _cache_dir() / f"hostpath-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        # no -ffast-math: the frame check relies on NaN * 0 being NaN
        python_flags = ["-DFF_PYTHON", f"-I{include}"] if include else []
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-pthread", *python_flags, "-o", tmp, str(SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            first = ((done.stderr or done.stdout).strip().splitlines() or [f"exit status {done.returncode}"])[0]
            raise RuntimeError(f"{' '.join(cmd)} failed: {first}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _layout_mismatch(dll) -> str:
    """'' when FrameState and CpuWorker match the compiled ff_frame_state and ff_cpu_worker field
    for field, else what differs."""
    for function, mirror in (("ff_layout", FrameState), ("ff_worker_layout", CpuWorker)):
        fn = getattr(dll, function)
        fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        fn.restype = ctypes.c_int
        out = (ctypes.c_int64 * 64)()
        count = fn(out, 64)
        mine = [ctypes.sizeof(mirror)] + [getattr(mirror, name).offset for name, _ in mirror._fields_]
        theirs = list(out[:count])
        if mine != theirs:
            return f"the C struct's layout {theirs} is not {mirror.__name__}'s {mine}"
    return ""


def load():
    """(ff_frame, ff_wait) as ctypes functions taking a FrameState pointer, or None (see status)."""
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]
        lib, why = None, ""
        if os.environ.get("FRAMEFUSE_HOSTPATH", "1") == "0":
            why = "FRAMEFUSE_HOSTPATH=0"
        elif not sys.platform.startswith("linux"):
            why = f"not built on {sys.platform}"
        else:
            cc = _compiler()
            if cc is None:
                why = "no C compiler (set CC)"
            else:
                try:
                    path = _build(cc)
                    dll = ctypes.CDLL(str(path))
                    frame, wait = dll.ff_frame, dll.ff_wait
                    for fn in (frame, wait):
                        fn.argtypes = [ctypes.POINTER(FrameState)]
                        fn.restype = ctypes.c_int
                    mismatch = _layout_mismatch(dll)
                    if mismatch:
                        why = f"{path}: {mismatch}"
                    else:
                        lib = (frame, wait)
                        start, stop = dll.ff_worker_start, dll.ff_worker_stop
                        for fn in (start, stop):
                            fn.argtypes = [ctypes.POINTER(CpuWorker)]
                            fn.restype = ctypes.c_int
                        _loaded["worker"] = (start, stop)
                        fence = dll.ff_store_fence
                        fence.argtypes, fence.restype = [], None
                        _loaded["fence"] = fence
                        why = str(path)
                        _loaded["module"], _loaded["module_why"] = _load_module(path)
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    why = f"build failed: {exc}"
        _loaded["lib"], _loaded["why"] = lib, why
        _loaded.setdefault("module", None)
        _loaded.setdefault("module_why", why)
        return lib


def _load_module(path: Path):
    """(the extension module, '') from the built library, or (None, why not)."""
    if python_include() is None:
        return None, f"no Python headers ({sysconfig.get_paths().get('include')}/Python.h)"
    try:
        loader = importlib.machinery.ExtensionFileLoader("framefuse_hostpath", str(path))
        spec = importlib.util.spec_from_file_location("framefuse_hostpath", str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except (ImportError, OSError) as exc:
        return None, f"{path} is not an extension module: {exc}"
    mismatch = _module_mismatch(module)
    return (None, f"{path}: {mismatch}") if mismatch else (module, "")


def _module_mismatch(module) -> str:
    """'' when StepContext matches ff_step_context and the extension reads numpy arrays as numpy
    describes them, else what differs."""
    import numpy as np

    mine = tuple([ctypes.sizeof(StepContext)] + [getattr(StepContext, n).offset for n, _ in StepContext._fields_])
    theirs = tuple(module.layout())
    if mine != theirs:
        return f"the C step context's layout {theirs} is not StepContext's {mine}"
    probe = np.zeros((3, 5), dtype=np.float32)
    for array in (probe, probe[1:], probe[:, 1:], probe.T, probe.astype(np.float64)):
        data, ndim, shape, flags, dtype = module.probe(array)
        want = (array.ctypes.data, array.ndim, array.shape, array.flags.c_contiguous, id(array.dtype))
        if (data, ndim, shape, bool(flags & 1), dtype) != want:
            return f"numpy {np.__version__}'s arrays are not laid out as hostpath.c reads them"
    return ""


def worker():
    """(ff_worker_start, ff_worker_stop) as ctypes functions taking a CpuWorker pointer, or None
    where hostpath.c is not built (see status)."""
    load()
    return _loaded.get("worker")


def store_fence():
    """hostpath.c's ff_store_fence as a ctypes function of no arguments (x86's sfence: what
    write-combined memory needs between stores that must be seen in order, and to send them), or
    None where hostpath.c is not built (see status)."""
    load()
    return _loaded.get("fence")


def extension():
    """The extension module (its ``step`` is Session.step's hot path), or None (see status)."""
    load()
    return _loaded.get("module")


def status() -> str:
    """Which per-frame host path the step bindings use, and why."""
    lib = load()
    if not lib:
        return f"python ({_loaded['why']})"
    if _loaded.get("module") is None:
        return f"native through ctypes ({_loaded['why']}; no extension: {_loaded['module_why']})"
    return f"native ({_loaded['why']})"


def _reset_for_tests() -> None:
    with _lock:
        _loaded.clear()
