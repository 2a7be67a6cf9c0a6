"""Finding the model to export: a zoo architecture by name, or ``path/to/file.py:factory``."""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framefuse.exporter.errors import ModelLoadError


def zoo_architectures() -> list[str]:
    try:
        from framefuse import models
    except ImportError as exc:  # the zoo itself failed to import: say so, do not hide it
        raise ModelLoadError(f"the model zoo (framefuse.models) cannot be imported: {exc}") from exc
    archs = getattr(models, "ARCHITECTURES", None)
    if archs is None:
        raise ModelLoadError("the model zoo (framefuse.models) defines no ARCHITECTURES yet")
    return list(archs)


def is_model_file_spec(spec: str) -> bool:
    """``FILE.py:FACTORY`` (or a path) rather than an architecture name (which has no ':')."""
    return ":" in spec or spec.endswith(".py") or "/" in spec or "\\" in spec


def check_arch(arch: str) -> None:
    archs = zoo_architectures()
    if arch not in archs:
        close = difflib.get_close_matches(arch, archs, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ModelLoadError(f"unknown architecture '{arch}'{hint}; available: {', '.join(archs)}")


def build_zoo_model(arch: str, model_config: Mapping[str, Any], seed: int):
    """A zoo model with weights drawn from ``seed`` (same seed, same weights, same ONNX bytes)."""
    import torch

    check_arch(arch)
    from framefuse import models

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = models.build_model(arch, dict(model_config))
    return model.eval()


def split_model_spec(spec: str) -> tuple[Path, str]:
    if ":" not in spec:
        raise ModelLoadError(f"--model expects FILE.py:FACTORY (e.g. my_model.py:make_model), got '{spec}'")
    path_text, factory = spec.rsplit(":", 1)
    if not factory.isidentifier():
        raise ModelLoadError(f"--model '{spec}': '{factory}' is not a Python name of a factory in {path_text}")
    return Path(path_text), factory


def load_module_from_file(path: Path):
    """Import a user's ``.py`` file (its folder is on sys.path while it runs, for its own imports)."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"model file {path} is not a file")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    module_name = f"framefuse_user_model_{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot load model file {path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up here
    folder = str(resolved.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_name]
        raise ModelLoadError(f"cannot load model file {path}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # ImportError, NameError, ...: the user's file is broken
        del sys.modules[module_name]
        raise ModelLoadError(f"cannot load model file {path}: {type(exc).__name__}: {exc}") from exc
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    return module


def _takes_config(factory) -> bool:
    """Whether the factory wants the model config as its one argument."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.name == "config" for p in params):
        return True
    return any(p.default is p.empty for p in positional)


def load_user_model(spec: str, model_config: Mapping[str, Any], seed: int):
    """Build the model of ``FILE.py:FACTORY``.

    FACTORY is a function or class called as ``FACTORY(config)`` when it takes an argument
    (``config`` is the flat model config: the config's ``model`` section plus in/out features)
    and as ``FACTORY()`` otherwise; or an ``nn.Module`` instance, used as it is.
    """
    import torch
    from torch import nn

    path, factory_name = split_model_spec(spec)
    module = load_module_from_file(path)
    if not hasattr(module, factory_name):
        names = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        hint = f"; it defines: {', '.join(names)}" if names else ""
        raise ModelLoadError(f"model file {path} has no '{factory_name}'{hint}")
    factory = getattr(module, factory_name)
    if isinstance(factory, nn.Module):
        model = factory
    else:
        if not callable(factory):
            raise ModelLoadError(
                f"'{factory_name}' in {path} is of type {type(factory).__name__}, not a factory function or class"
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                model = factory(dict(model_config)) if _takes_config(factory) else factory()
            except Exception as exc:
                raise ModelLoadError(f"factory '{factory_name}' in {path} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelLoadError(
            f"factory '{factory_name}' in {path} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model.eval()


def model_label(model) -> str:
    """The architecture name recorded for a model: its zoo ``arch`` or its class name."""
    arch = getattr(model, "arch", None)
    if isinstance(arch, str) and arch and arch != "base":
        return arch
    return type(model).__name__
