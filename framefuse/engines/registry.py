"""The engine backends framefuse knows, shared by ``framefuse build --engine``, ``Session.load``
and ``framefuse check``.

Every backend is a module ``framefuse.engines.<backend>`` exporting::

    NAME: str
    unavailable_reason() -> str | None      # None: usable here; else one line with an install hint
    build(source, *, out=None, precision="fp32", device=None, options=None, log=None) -> EngineRunner
    load(artifact, *, device=None, check_source=True) -> EngineRunner

This module imports nothing heavy (no torch, no backend library) so the command line can list
the engines cheaply; backends are imported on first use.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class EngineKind:
    """One backend, and what the stages above it need to know about it, so that none of them
    matches an engine by its name: the build options it takes, which graph of an artifact folder
    it builds from, the precisions it cannot run, whether its build is checked by default."""

    name: str
    module: str
    artifact_name: str
    summary: str
    install_hint: str = ""
    #: build options the command line and Session.load can set (each backend reads its own)
    options: tuple[str, ...] = ()
    #: builds a folder's original model.onnx, the fused graph only on request (framefuse nodes
    #: would run through their Python references); the others take model.fused.onnx first
    original_first: bool = False
    #: runs framefuse nodes natively on any machine: the default for a graph that exists only fused
    runs_fused_anywhere: bool = False
    #: precision -> why this engine cannot run it
    unsupported_precisions: tuple[tuple[str, str], ...] = ()
    #: `framefuse build` runs the parity gate unless told not to (an engine we cannot run here)
    checked_by_default: bool = False

    @property
    def suffix(self) -> str:
        return Path(self.artifact_name).suffix

    def unsupported_precision(self, precision: str) -> str | None:
        return dict(self.unsupported_precisions).get(precision)


ENGINES: dict[str, EngineKind] = {
    "cuda-graph": EngineKind(
        "cuda-graph",
        "framefuse.engines.cuda_graph",
        "engine.ffe",
        "torch + framefuse CUDA kernels captured in one CUDA graph per shape (eager CPU executor without a GPU)",
        "a CUDA build of torch and `pip install 'framefuse[gpu]'` (cuda-python)",
        options=("framefuse_impl", "input_shapes", "optimize", "select", "unfused", "exact_math", "fp32_graph"),
        runs_fused_anywhere=True,
    ),
    "onnxruntime": EngineKind(
        "onnxruntime",
        "framefuse.engines.onnxruntime",
        "engine.ort",
        "ONNX Runtime with I/O binding (CPU EP everywhere, CUDA EP with onnxruntime-gpu)",
        "`pip install onnxruntime` (or onnxruntime-gpu for the CUDA EP)",
        options=("fused", "providers", "intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level"),
        original_first=True,
        unsupported_precisions=(
            (
                "bf16",
                "the onnxruntime engine cannot run bf16: ONNX Runtime's CPU provider has no bfloat16 kernels for "
                "MatMul/Gemm and most elementwise ops; build bf16 with --engine cuda-graph or tensorrt",
            ),
        ),
    ),
    "tensorrt": EngineKind(
        "tensorrt",
        "framefuse.engines.tensorrt",
        "engine.plan",
        "a serialized TensorRT engine with the framefuse plugins",
        "`pip install 'framefuse[tensorrt]'` (TensorRT 10) on a machine with an NVIDIA GPU",
        options=(
            "workspace",
            "timing_cache",
            "builder_optimization_level",
            "compute_capabilities",
            "cuda_graph",
            "verbose",
        ),
        checked_by_default=True,
    ),
}

ENGINE_NAMES = tuple(ENGINES)  # as shipped; a parser lists tuple(ENGINES), which an added entry joins
#: the engine that runs a graph which exists only fused when the default engine would not run it natively
FUSED_ANYWHERE = next(kind.name for kind in ENGINES.values() if kind.runs_fused_anywhere)


def option_owner(option: str) -> str:
    """The engine(s) a build option belongs to, for the one-line refusal of another engine."""
    owners = [kind.name for kind in ENGINES.values() if option in kind.options]
    return " / ".join(owners) or "no"


def check_option(engine: str, option: str, flag: str, error=None) -> None:
    """Refuse ``flag`` (the option as the user typed it) for an engine that does not take ``option``."""
    if option not in get_kind(engine).options:
        message = f"{flag} is an option of the {option_owner(option)} engine, not of {engine}"
        raise (error or _build_error)(message)


def _build_error(message: str) -> Exception:
    # base imports torch; only pay for it when there is an error to raise
    from framefuse.engines.base import EngineBuildError

    return EngineBuildError(message)


def get_kind(name: str) -> EngineKind:
    kind = ENGINES.get(name)
    if kind is None:
        raise _build_error(f"unknown engine {name!r}; the engines are: {', '.join(ENGINES)}")
    return kind


def _import_error_reason(kind: EngineKind, exc: BaseException) -> str:
    missing = getattr(exc, "name", None)
    if missing == kind.module:
        return f"engine '{kind.name}' is not part of this framefuse version ({kind.module} does not exist)"
    what = f"{missing} is not installed" if missing else f"{type(exc).__name__}: {exc}"
    return f"engine '{kind.name}' cannot be imported ({what}); install {kind.install_hint}"


def get_backend(name: str) -> ModuleType:
    """The backend module of engine ``name`` (imported now). Unknown name or a backend that cannot
    be imported: EngineBuildError with a one-line reason."""
    kind = get_kind(name)
    try:
        return importlib.import_module(kind.module)
    except ImportError as exc:
        raise _build_error(_import_error_reason(kind, exc)) from exc


def unavailable_reason(name: str, **kwargs) -> str | None:
    """None when engine ``name`` can be built and run here, else one line saying why not (with an
    install hint). ``kwargs`` (e.g. ``device="cuda"``) are passed to backends that accept them."""
    kind = get_kind(name)
    try:
        module = importlib.import_module(kind.module)
    except ImportError as exc:
        return _import_error_reason(kind, exc)
    check = getattr(module, "unavailable_reason", None)
    if check is None:
        return None
    accepted = inspect.signature(check).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    return check(**{k: v for k, v in kwargs.items() if takes_any or k in accepted})


def available_engines(**kwargs) -> list[str]:
    return [name for name in ENGINES if unavailable_reason(name, **kwargs) is None]


def artifact_kind(path) -> EngineKind | None:
    """The engine whose artifact ``path`` is, by file name or suffix; None when it is none."""
    path = Path(path)
    for kind in ENGINES.values():
        if path.name == kind.artifact_name or path.suffix == kind.suffix:
            return kind
    return None


def artifacts_in(folder) -> list[tuple[EngineKind, Path]]:
    """Every engine artifact present in ``folder``, in the order of ``ENGINES``."""
    folder = Path(folder)
    return [(kind, folder / kind.artifact_name) for kind in ENGINES.values() if (folder / kind.artifact_name).is_file()]


def backend_for_artifact(path) -> EngineKind:
    """The engine of an artifact file (by its name), or of the first artifact present in a folder.
    EngineBuildError when there is none."""
    path = Path(path)
    if path.is_dir():
        found = artifacts_in(path)
        if not found:
            names = ", ".join(k.artifact_name for k in ENGINES.values())
            raise _build_error(f"{path}: no engine artifact in this folder (looked for {names})")
        return found[0][0]
    kind = artifact_kind(path)
    if kind is None:
        suffixes = ", ".join(k.suffix for k in ENGINES.values())
        raise _build_error(f"{path}: not an engine artifact (expected a file ending in {suffixes})")
    return kind


__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "EngineKind",
    "artifact_kind",
    "artifacts_in",
    "available_engines",
    "backend_for_artifact",
    "get_backend",
    "get_kind",
    "unavailable_reason",
]


def cuda_graph_usable() -> bool:
    """A CUDA GPU that torch sees and cuda-python to launch the framefuse kernels."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        return False
    return True


def default_engine(device=None) -> str:
    """The engine used when none is named (``framefuse build``, ``Session.load``): cuda-graph on a
    usable GPU (or when cuda is asked for), else ONNX Runtime (else the cuda-graph engine's CPU
    executor). ``device``: None, "cuda", "cpu" or a torch.device."""
    wanted = None
    if device is not None:
        import torch

        wanted = torch.device(device).type
    if wanted == "cuda" or (wanted is None and cuda_graph_usable()):
        return "cuda-graph"
    if unavailable_reason("onnxruntime") is None:
        return "onnxruntime"
    return FUSED_ANYWHERE
