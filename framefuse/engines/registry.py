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
    name: str
    module: str
    artifact_name: str
    summary: str
    install_hint: str = ""

    @property
    def suffix(self) -> str:
        return Path(self.artifact_name).suffix


ENGINES: dict[str, EngineKind] = {
    "cuda-graph": EngineKind(
        "cuda-graph",
        "framefuse.engines.cuda_graph",
        "engine.ffe",
        "torch + framefuse CUDA kernels captured in one CUDA graph per shape (eager CPU executor without a GPU)",
        "a CUDA build of torch and `pip install 'framefuse[gpu]'` (cuda-python)",
    ),
    "onnxruntime": EngineKind(
        "onnxruntime",
        "framefuse.engines.onnxruntime",
        "engine.ort",
        "ONNX Runtime with I/O binding (CPU EP everywhere, CUDA EP with onnxruntime-gpu)",
        "`pip install onnxruntime` (or onnxruntime-gpu for the CUDA EP)",
    ),
    "tensorrt": EngineKind(
        "tensorrt",
        "framefuse.engines.tensorrt",
        "engine.plan",
        "a serialized TensorRT engine with the framefuse plugins",
        "`pip install 'framefuse[tensorrt]'` (TensorRT 10) on a machine with an NVIDIA GPU",
    ),
}

ENGINE_NAMES = tuple(ENGINES)


def _build_error(message: str) -> Exception:
    # base imports torch; only pay for it when there is an error to raise
    from framefuse.engines.base import EngineBuildError

    return EngineBuildError(message)


def get_kind(name: str) -> EngineKind:
    kind = ENGINES.get(name)
    if kind is None:
        raise _build_error(f"unknown engine {name!r}; the engines are: {', '.join(ENGINE_NAMES)}")
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
    return [name for name in ENGINE_NAMES if unavailable_reason(name, **kwargs) is None]


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
