"""cuda-python launch infrastructure shared by every fused op.

A kernel comes from the prebuilt fatbin of `make kernels` (`framefuse/plugins/_kernels/<op>.fatbin`)
when that holds code this GPU can run, else it is compiled from its `.cu` source with NVRTC for the
current device and cached on disk. Launches go through `cuLaunchKernel` on the caller's stream
(default: torch's current stream, so a launch during `torch.cuda.graph` capture is captured) and
never synchronise.

cuda-python is imported lazily: `import framefuse.plugins.cuda` works on machines without it or
without a GPU; only loading or launching a kernel needs them.

Environment:
  FRAMEFUSE_CACHE           kernel cache folder (default ~/.cache/framefuse/kernels)
  FRAMEFUSE_KERNEL_SOURCE   "auto" (default: fatbin if usable, else NVRTC), "fatbin" (fatbin or
                            error) or "nvrtc" (always compile the source)
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import pathlib
import re
import tempfile
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from framefuse.errors import FrameFuseError

PLUGINS_DIR = pathlib.Path(__file__).resolve().parent
KERNELS_DIR = PLUGINS_DIR / "_kernels"  # prebuilt fatbins (`make kernels`)

# NVRTC options used for every kernel (NVRTC rejects -O3; it optimises by default).
BASE_NVRTC_OPTIONS = ("-std=c++17",)


class CudaError(FrameFuseError):
    """A CUDA driver, NVRTC or kernel problem."""


class CudaUnavailableError(CudaError):
    """cuda-python, the CUDA driver, NVRTC or a GPU is missing."""


class KernelCompileError(CudaError):
    """NVRTC could not compile a kernel source."""


class KernelLoadError(CudaError):
    """The driver could not load a compiled kernel."""


class KernelLaunchError(CudaError):
    """cuLaunchKernel (or an attribute call before it) failed."""


# --------------------------------------------------------------------------------------------
# lazy cuda-python access and error checking


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CudaUnavailableError(
            "cuda-python is not installed (pip install 'framefuse[gpu]' or cuda-python); "
            f"it is needed to run framefuse CUDA kernels ({exc})"
        ) from exc
    return driver


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise CudaUnavailableError(f"cuda-python's NVRTC bindings are not importable ({exc})") from exc
    return nvrtc


def cuda_error_text(err) -> str:
    """'CUDA_ERROR_X: description' for a CUresult."""
    driver = _driver()
    try:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        return f"{name}: {text}"
    except Exception:  # noqa: BLE001 - an unknown code still gets reported
        return f"CUresult {int(err)}"


def _check(result, what: str, error_type: type[CudaError] = CudaError):
    """Unpack a cuda-python (err, *values) tuple; raise `error_type` naming `what` on failure."""
    err = result[0]
    if int(err) != 0:
        raise error_type(f"{what} failed: {cuda_error_text(err)}")
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def _check_nvrtc(result, what: str):
    err = result[0]
    if int(err) != 0:
        nvrtc = _nvrtc()
        try:
            _, text = nvrtc.nvrtcGetErrorString(err)
            text = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # noqa: BLE001
            text = str(err)
        raise KernelCompileError(f"{what} failed: {text}")
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


# --------------------------------------------------------------------------------------------
# device and context


_init_lock = threading.RLock()
_initialised = False
_primary_contexts: dict[int, Any] = {}  # device ordinal -> CUcontext (retained once per process)
_properties: dict[int, dict] = {}


def _cu_init() -> None:
    global _initialised
    if _initialised:
        return
    with _init_lock:
        if not _initialised:
            driver = _driver()
            try:
                _check(driver.cuInit(0), "cuInit", CudaUnavailableError)
            except CudaUnavailableError:
                raise
            except Exception as exc:  # noqa: BLE001 - libcuda missing: no driver on this machine
                raise CudaUnavailableError(f"the CUDA driver is not available on this machine ({exc})") from exc
            _initialised = True


def current_device() -> int:
    """torch's current CUDA device ordinal (0 without torch)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_device()
    except ImportError:
        pass
    return 0


def ensure_context(device: int | None = None):
    """Make the primary context of `device` current on this thread and return it.

    torch creates the primary context lazily; retaining it here (the same context torch uses)
    avoids CUDA_ERROR_INVALID_CONTEXT when a module is loaded before torch touched the GPU.
    """
    _cu_init()
    driver = _driver()
    device = current_device() if device is None else int(device)
    ctx = _primary_contexts.get(device)
    if ctx is None:
        with _init_lock:
            ctx = _primary_contexts.get(device)
            if ctx is None:
                dev = _check(driver.cuDeviceGet(device), f"cuDeviceGet({device})", CudaUnavailableError)
                ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain({device})")
                _primary_contexts[device] = ctx
    # checked live each time: torch may have made another device's context current meanwhile
    live = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if live is None or int(live) != int(ctx):
        _check(driver.cuCtxSetCurrent(ctx), f"cuCtxSetCurrent(device {device})")
    return ctx


def device_properties(device: int | None = None) -> dict:
    """sm_count, max_shared_per_block (default), max_shared_per_block_optin, cc (major, minor),
    arch ("sm_90"), name, warp_size, max_threads_per_block, l2_bytes, kernel_exec_timeout,
    compute_preemption."""
    device = current_device() if device is None else int(device)
    props = _properties.get(device)
    if props is not None:
        return props
    ensure_context(device)
    driver = _driver()
    dev = _check(driver.cuDeviceGet(device), "cuDeviceGet")
    attr = driver.CUdevice_attribute

    def get(a):
        return int(_check(driver.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a})"))

    major = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    name = _check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    props = {
        "device": device,
        "name": name,
        "cc": (major, minor),
        "arch": f"sm_{major}{minor}",
        "sm_count": get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "max_shared_per_block": get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        "max_shared_per_block_optin": get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        "max_shared_per_sm": get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        "max_threads_per_block": get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        "max_threads_per_sm": get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
        "warp_size": get(attr.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        "l2_bytes": get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        # a run-time limit on kernels (a display's watchdog), and whether a running kernel can be
        # preempted: what a kernel that never ends (the resident step) has to know
        "kernel_exec_timeout": get(attr.CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT),
        "compute_preemption": get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED),
    }
    _properties[device] = props
    return props


# --------------------------------------------------------------------------------------------
# pointers and streams


def device_pointer(t: Any) -> int:
    """Device address of a torch tensor, an object with `__cuda_array_interface__`, or a DLPack
    capsule/producer (wrapped with torch.from_dlpack). None → 0 (a null pointer for absent inputs)."""
    if t is None:
        return 0
    data_ptr = getattr(t, "data_ptr", None)
    if callable(data_ptr):
        return int(data_ptr())
    cai = getattr(t, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    if hasattr(t, "__dlpack__") or type(t).__name__ == "PyCapsule":
        import torch

        return int(torch.from_dlpack(t).data_ptr())
    raise CudaError(
        f"cannot get a device pointer from {type(t).__name__} (no data_ptr, __cuda_array_interface__ or DLPack)"
    )


def stream_handle(stream: Any = None) -> int:
    """CUstream handle as int. None → torch.cuda.current_stream().cuda_stream (so that launches
    during torch.cuda.graph capture are captured); torch.cuda.Stream → its handle; ints pass;
    cuda-python CUstream and objects with `__cuda_stream__` (cuda.core) are accepted too."""
    if stream is None:
        import torch

        return int(torch.cuda.current_stream().cuda_stream)
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return int(handle)
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        info = protocol() if callable(protocol) else protocol
        return int(info[1])
    try:
        return int(stream)  # cuda.bindings CUstream supports int()
    except (TypeError, ValueError) as exc:
        raise CudaError(f"not a CUDA stream: {stream!r}") from exc


# --------------------------------------------------------------------------------------------
# compilation and caching


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def local_includes(source: pathlib.Path) -> list[pathlib.Path]:
    """Every file reached through `#include "..."` from `source`, recursively (resolved paths)."""
    seen: list[pathlib.Path] = []
    stack = [pathlib.Path(source).resolve()]
    visited = set()
    while stack:
        path = stack.pop()
        if path in visited:
            continue
        visited.add(path)
        for rel in _INCLUDE_RE.findall(path.read_text()):
            inc = (path.parent / rel).resolve()
            if inc.exists() and inc not in visited:
                seen.append(inc)
                stack.append(inc)
    return seen


def source_digest(source: pathlib.Path, extra: Sequence[str] = ()) -> str:
    """sha256 of a kernel source, its local headers and `extra` strings (arch, options, versions)."""
    source = pathlib.Path(source).resolve()
    h = hashlib.sha256()
    h.update(source.read_bytes())
    for inc in sorted(local_includes(source)):
        h.update(b"\0" + inc.name.encode() + b"\0" + inc.read_bytes())
    for item in extra:
        h.update(b"\0" + str(item).encode())
    return h.hexdigest()


def cuda_include_dirs() -> list[str]:
    """Folders with the CUDA headers (cuda_fp16.h, cuda_bf16.h, nv/target) for NVRTC."""
    candidates: list[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            candidates += [os.path.join(root, "include"), os.path.join(root, "include", "cccl")]
    try:
        import cuda.pathfinder as pathfinder

        for lib in ("cudart", "cccl", "nvrtc"):
            try:
                found = pathfinder.find_nvidia_header_directory(lib)
            except Exception:  # noqa: BLE001 - not every install has every header set
                found = None
            if found:
                candidates.append(str(found))
    except ImportError:
        pass
    candidates += ["/usr/local/cuda/include", "/usr/local/cuda/include/cccl"]
    result: list[str] = []
    for c in candidates:
        if c and os.path.isdir(c) and c not in result:
            result.append(c)
    # keep only folders that matter: the one with cuda_fp16.h first, then any with nv/target
    with_fp16 = [c for c in result if os.path.exists(os.path.join(c, "cuda_fp16.h"))]
    with_nv = [c for c in result if os.path.isdir(os.path.join(c, "nv")) and c not in with_fp16]
    return with_fp16[:1] + with_nv[:1] if with_fp16 else result


def nvrtc_version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    try:
        major, minor = _check_nvrtc(nvrtc.nvrtcVersion(), "nvrtcVersion")
    except CudaError:
        raise
    except Exception as exc:  # noqa: BLE001 - libnvrtc missing
        raise CudaUnavailableError(f"NVRTC (libnvrtc) is not available: {exc}") from exc
    return int(major), int(minor)


def nvrtc_supported_archs() -> list[int]:
    nvrtc = _nvrtc()
    return [int(a) for a in _check_nvrtc(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")]


def _nvrtc_target(cc: int) -> tuple[str, bool]:
    """(--gpu-architecture value, produces_cubin). A GPU newer than this NVRTC knows gets PTX for
    the newest arch NVRTC supports, which the driver JIT-compiles."""
    supported = nvrtc_supported_archs()
    if cc in supported:
        return f"sm_{cc}", True
    older = [a for a in supported if a <= cc]
    if not older:
        raise KernelCompileError(f"NVRTC {nvrtc_version()} supports no architecture at or below sm_{cc}")
    return f"compute_{max(older)}", False


def cache_dir() -> pathlib.Path:
    root = os.environ.get("FRAMEFUSE_CACHE")
    path = pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "framefuse" / "kernels"
    return path


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def compile_source(source: pathlib.Path, arch: str, options: Sequence[str] = ()) -> bytes:
    """Compile a .cu file with NVRTC for `arch` ("sm_90" → cubin, "compute_90" → PTX).

    Needs only NVRTC (no GPU): usable for compile checks. Raises KernelCompileError with the log.
    """
    nvrtc = _nvrtc()
    source = pathlib.Path(source).resolve()
    opts = [*BASE_NVRTC_OPTIONS, f"--gpu-architecture={arch}", f"--include-path={source.parent}"]
    opts += [f"--include-path={d}" for d in cuda_include_dirs()]
    opts += list(options)
    try:
        prog = _check_nvrtc(
            nvrtc.nvrtcCreateProgram(source.read_bytes(), str(source.name).encode(), 0, [], []),
            "nvrtcCreateProgram",
        )
    except KernelCompileError:
        raise
    except Exception as exc:  # noqa: BLE001 - libnvrtc missing
        raise CudaUnavailableError(f"NVRTC (libnvrtc) is not available: {exc}") from exc
    try:
        result = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        size = _check_nvrtc(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # NVRTC writes into this buffer: never let it be CPython's shared 1-byte b" " object
        log = b" " * (int(size) + 1)
        _check_nvrtc(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        log_text = log.rstrip(b"\0 ").decode(errors="replace")
        if int(result[0]) != 0:
            raise KernelCompileError(
                f"NVRTC could not compile {source} for {arch} (options {' '.join(opts)}):\n{log_text}"
            )
        if arch.startswith("sm_"):
            size = _check_nvrtc(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            image = b" " * max(int(size), 2)
            _check_nvrtc(nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN")
        else:
            size = _check_nvrtc(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            image = b" " * max(int(size), 2)
            _check_nvrtc(nvrtc.nvrtcGetPTX(prog, image), "nvrtcGetPTX")
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_cached(source: pathlib.Path, arch_cc: int, options: Sequence[str] = ()) -> bytes:
    """NVRTC image for compute capability `arch_cc` (e.g. 90), from the disk cache when the
    sha256 of (source + local headers + arch + options + NVRTC version) matches."""
    target, _ = _nvrtc_target(arch_cc)
    version = nvrtc_version()
    digest = source_digest(source, [target, *BASE_NVRTC_OPTIONS, *options, f"nvrtc{version[0]}.{version[1]}"])
    path = cache_dir() / f"{pathlib.Path(source).stem}-{target}-{digest[:24]}.bin"
    try:
        return path.read_bytes()
    except OSError:
        pass
    image = compile_source(source, target, options)
    try:
        _atomic_write(path, image)
    except OSError as exc:  # a read-only home still runs, it just compiles again next time
        warnings.warn(f"framefuse: could not write the kernel cache {path}: {exc}", stacklevel=2)
    return image


def fatbin_path(source: pathlib.Path) -> pathlib.Path:
    """Where `make kernels` puts the fatbin of `source` (framefuse/plugins/_kernels/<op>.fatbin)."""
    return KERNELS_DIR / f"{pathlib.Path(source).stem}.fatbin"


def fatbin_is_current(source: pathlib.Path) -> bool:
    """False when the fatbin's sidecar (<op>.fatbin.json, written by build_kernels) records a
    different source digest than the current source: a stale fatbin must not hide an edit."""
    meta_path = fatbin_path(source).with_suffix(".fatbin.json")
    if not meta_path.exists():
        return True  # installed packages may ship fatbins without the sidecar
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return False
    return meta.get("source_sha256") == source_digest(source)


# --------------------------------------------------------------------------------------------
# kernels


class Kernel:
    """One loaded `extern "C"` kernel function (in the primary context of one device)."""

    def __init__(self, name: str, function: Any, module: Any, device: int, origin: str):
        self.name = name
        self.device = device
        self.origin = origin  # "fatbin:<path>" or "nvrtc:<target>"
        self._function = function
        self._module = module  # kept alive with the function
        self._max_dynamic_smem = 0

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, device={self.device}, origin={self.origin!r})"

    def set_max_dynamic_shared_memory(self, nbytes: int) -> None:
        """Opt in to more than 48 KiB of dynamic shared memory (idempotent, cached)."""
        nbytes = int(nbytes)
        if nbytes <= self._max_dynamic_smem:
            return
        driver = _driver()
        ensure_context(self.device)
        _check(
            driver.cuFuncSetAttribute(
                self._function,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                nbytes,
            ),
            f"cuFuncSetAttribute({self.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes})",
            KernelLaunchError,
        )
        self._max_dynamic_smem = nbytes

    def attribute(self, name: str) -> int:
        """A CUfunction attribute, e.g. "NUM_REGS", "MAX_THREADS_PER_BLOCK", "SHARED_SIZE_BYTES"."""
        driver = _driver()
        attr = getattr(driver.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return int(_check(driver.cuFuncGetAttribute(attr, self._function), f"cuFuncGetAttribute({name})"))

    def launch(
        self,
        grid: Sequence[int] | int,
        block: Sequence[int] | int,
        args: Sequence[Any],
        *,
        shared_mem: int = 0,
        stream: Any = None,
        op: str = "",
        detail: str = "",
    ) -> None:
        """Launch asynchronously on `stream` (None → torch's current stream).

        args: ctypes values (ctypes.c_void_p(ptr), ctypes.c_int(n), ctypes.c_float(x), ...), in
        the kernel's parameter order. Raises KernelLaunchError naming op, detail and the CUDA error.
        """
        grid3 = _dim3(grid)
        block3 = _dim3(block)
        handle = stream_handle(stream)
        ensure_context(self.device)
        if shared_mem > 48 * 1024:
            self.set_max_dynamic_shared_memory(shared_mem)
        # void* kernelParams[] pointing at each ctypes value (kept alive until the call returns;
        # cuLaunchKernel copies the values at launch)
        pointers = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
        driver = _driver()
        err = driver.cuLaunchKernel(
            self._function,
            grid3[0],
            grid3[1],
            grid3[2],
            block3[0],
            block3[1],
            block3[2],
            int(shared_mem),
            handle,
            ctypes.addressof(pointers),
            0,
        )[0]
        if int(err) != 0:
            where = f"{op} " if op else ""
            info = f" [{detail}]" if detail else ""
            raise KernelLaunchError(
                f"{where}kernel {self.name} launch failed{info}: grid={grid3} block={block3} "
                f"shared_mem={shared_mem}: {cuda_error_text(err)}"
            )


def _dim3(value) -> tuple[int, int, int]:
    if isinstance(value, int):
        return (value, 1, 1)
    dims = tuple(int(v) for v in value) + (1, 1)
    return dims[:3]  # type: ignore[return-value]


_kernels: dict[tuple, Kernel] = {}
_modules: dict[tuple, tuple[Any, str]] = {}
_load_lock = threading.Lock()


def _kernel_source_mode() -> str:
    mode = os.environ.get("FRAMEFUSE_KERNEL_SOURCE", "auto").lower()
    if mode not in ("auto", "fatbin", "nvrtc"):
        raise CudaError(f"FRAMEFUSE_KERNEL_SOURCE={mode!r}: expected auto, fatbin or nvrtc")
    return mode


def _load_module(source: pathlib.Path, options: tuple[str, ...], device: int) -> tuple[Any, str]:
    """(CUmodule, origin) for `source` on `device`: prebuilt fatbin when usable, else NVRTC."""
    driver = _driver()
    ensure_context(device)
    props = device_properties(device)
    cc = props["cc"][0] * 10 + props["cc"][1]
    mode = _kernel_source_mode()
    fatbin = fatbin_path(source)
    fatbin_problem = None
    # A fatbin is built without the per-op NVRTC options, so it is used only for the default ones.
    if mode in ("auto", "fatbin") and not options:
        if not fatbin.exists():
            fatbin_problem = f"{fatbin} does not exist (run `make kernels`)"
        elif not fatbin_is_current(source):
            fatbin_problem = f"{fatbin} is stale (built from another version of {source.name}; run `make kernels`)"
            warnings.warn(f"framefuse: {fatbin_problem}; compiling with NVRTC instead", stacklevel=3)
        else:
            err, module = driver.cuModuleLoadData(fatbin.read_bytes())
            if int(err) == 0:
                return module, f"fatbin:{fatbin}"
            # NO_BINARY_FOR_GPU: the fatbin has no code for this arch (nor PTX it can JIT)
            fatbin_problem = f"{fatbin} has no usable code for {props['arch']}: {cuda_error_text(err)}"
    elif mode == "fatbin":
        fatbin_problem = f"options {options} need an NVRTC build"
    if mode == "fatbin":
        raise KernelLoadError(f"FRAMEFUSE_KERNEL_SOURCE=fatbin but {fatbin_problem}")
    image = compile_cached(source, cc, options)
    target, _ = _nvrtc_target(cc)
    module = _check(driver.cuModuleLoadData(image), f"cuModuleLoadData({source.name} for {target})", KernelLoadError)
    return module, f"nvrtc:{target}"


def get_kernel(
    source: pathlib.Path | str,
    name: str,
    options: tuple[str, ...] = (),
    *,
    device: int | None = None,
) -> Kernel:
    """The `extern "C"` function `name` of `source` on `device` (default: torch's current one).

    Loaded once per (source, options, device) per process; see the module doc for where the code
    comes from. `options` are extra NVRTC options, e.g. ("-DHEAD_DIM=64",).
    """
    device = current_device() if device is None else int(device)
    key = (str(source), name, tuple(options), device)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    with _load_lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel
        source_path = pathlib.Path(source).resolve()
        if not source_path.exists():
            raise KernelLoadError(f"kernel source {source_path} does not exist")
        module_key = (str(source_path), tuple(options), device)
        if module_key not in _modules:
            _modules[module_key] = _load_module(source_path, tuple(options), device)
        module, origin = _modules[module_key]
        driver = _driver()
        ensure_context(device)
        function = _check(
            driver.cuModuleGetFunction(module, name.encode()),
            f"cuModuleGetFunction({name} in {source_path.name}, {origin})",
            KernelLoadError,
        )
        kernel = Kernel(name, function, module, device, origin)
        _kernels[key] = kernel
        return kernel


# ctypes helpers so interfaces read as a parameter list
def ptr(t: Any) -> ctypes.c_void_p:
    """Kernel argument: device pointer of a tensor (None → null)."""
    return ctypes.c_void_p(device_pointer(t))


def i32(v: int) -> ctypes.c_int:
    return ctypes.c_int(int(v))


def i64(v: int) -> ctypes.c_longlong:
    return ctypes.c_longlong(int(v))


def f32(v: float) -> ctypes.c_float:
    return ctypes.c_float(float(v))


def dtype_suffix(dtype: Any) -> str:
    """Entry-point suffix of a storage dtype: torch.float32 → "f32", float16 → "f16", bfloat16 → "bf16"."""
    text = str(dtype).removeprefix("torch.")
    suffix = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(text)
    if suffix is None:
        raise CudaError(f"no kernel for storage dtype {text} (expected float32, float16 or bfloat16)")
    return suffix


def clear_kernel_cache() -> None:
    """Forget loaded kernels (tests switching between fatbin and NVRTC; modules stay loaded)."""
    with _load_lock:
        _kernels.clear()
        _modules.clear()
