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
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
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
        ("pad2", ctypes.c_int32),
    ]


_lock = threading.Lock()
_loaded: dict = {}  # "lib" -> (ff_frame, ff_wait) or None; "why" -> the reason it is None


def _compiler() -> list[str] | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return cc.split() if cc else None


def _cache_dir() -> Path:
    from framefuse.plugins.cuda import cache_dir

    return cache_dir() / "host"


def _build(cc: list[str]) -> Path:
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"{' '.join(cc)} --version failed: {exc}") from exc
    digest = hashlib.sha256(source + version.encode() + sys.platform.encode()).hexdigest()[:16]
    target = _cache_dir() / f"hostpath-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        # no -ffast-math: the frame check relies on NaN * 0 being NaN
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)]
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
    """'' when FrameState matches the compiled ff_frame_state field for field, else what differs."""
    fn = dll.ff_layout
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    fn.restype = ctypes.c_int
    out = (ctypes.c_int64 * 64)()
    count = fn(out, 64)
    mine = [ctypes.sizeof(FrameState)] + [getattr(FrameState, name).offset for name, _ in FrameState._fields_]
    theirs = list(out[:count])
    if mine != theirs:
        return f"the C struct's layout {theirs} is not FrameState's {mine}"
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
                        why = str(path)
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    why = f"build failed: {exc}"
        _loaded["lib"], _loaded["why"] = lib, why
        return lib


def status() -> str:
    """Which per-frame host path the step bindings use, and why."""
    lib = load()
    return f"native ({_loaded['why']})" if lib else f"python ({_loaded['why']})"


def _reset_for_tests() -> None:
    with _lock:
        _loaded.clear()
