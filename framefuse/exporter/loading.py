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


def zoo_model(arch: str, cfg: Mapping[str, Any], *, progress=None):
    """The zoo model a config describes, with the weights it asks for (:func:`apply_weights`):
    what ``framefuse export --arch`` exports, for peers and references that must match it."""
    from framefuse.config import model_config

    model = build_zoo_model(arch, model_config(cfg), int(cfg["seed"]))
    apply_weights(model, arch, cfg, progress=progress)
    return model


def apply_weights(model, arch: str | None, cfg: Mapping[str, Any], *, progress=None) -> dict:
    """Give ``model`` the weights ``cfg`` asks for and return the manifest's account of them:
    ``checkpoint`` (a state_dict file, any model) wins; a model given as an object or made by a
    file's factory keeps its own;
    a zoo model is trained on the synthetic game task (``weights: trained``, cached; see
    framefuse.models.training) or keeps its seeded init (``weights: random``)."""
    checkpoint = cfg.get("checkpoint")
    if checkpoint:
        return load_checkpoint(model, Path(checkpoint))
    if arch is None:  # ``weights`` is a zoo key: a model object or a file's factory keeps its own
        return {"source": "given"}
    seed = int(cfg["seed"])
    # A complete config always names its weights; one without the key is a manifest written before
    # the zoo was trained, whose weights were the seeded init.
    if cfg.get("weights", "random") == "random":
        return {"source": "random", "seed": seed}
    import torch

    from framefuse.config import model_config
    from framefuse.models import training

    task = training.task_for(cfg)
    with torch.random.fork_rng(devices=[]):
        state, summary = training.trained_state_dict(arch, model, model_config(cfg), seed, task, progress=progress)
    model.load_state_dict(state)
    model.eval()
    return {"source": "trained", "seed": seed, **summary}


def load_checkpoint(model, path: Path) -> dict:
    """``path``'s state_dict loaded over ``model`` (strict); one line naming the file and the first
    keys or shapes that do not fit."""
    import torch

    if not path.is_file():
        raise ModelLoadError(f"checkpoint not found: {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"{path}: not a readable torch checkpoint ({first})") from None
    if isinstance(data, Mapping) and not any(isinstance(v, torch.Tensor) for v in data.values()):
        data = data.get("state_dict", data.get("model", data))
    if not isinstance(data, Mapping) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise ModelLoadError(f"{path}: expected a state_dict (names -> tensors), got {type(data).__name__}")
    wanted = model.state_dict()
    missing = [k for k in wanted if k not in data]
    unexpected = [k for k in data if k not in wanted]
    shapes = [
        f"{k} {list(data[k].shape)} (model {list(wanted[k].shape)})"
        for k in wanted
        if k in data and tuple(data[k].shape) != tuple(wanted[k].shape)
    ]
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
        if items:
            more = f" and {len(items) - 3} more" if len(items) > 3 else ""
            problems.append(f"{label}: {', '.join(items[:3])}{more}")
    if problems:
        raise ModelLoadError(f"{path}: does not fit the model ({'; '.join(problems)})")
    model.load_state_dict(data)
    model.eval()
    return {"source": "checkpoint", "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def describe_weights(weights: Mapping | None) -> str:
    """One line for reports: which weights a manifest's model had."""
    weights = weights or {}
    source = weights.get("source")
    if source == "trained":
        return (
            f"trained on the synthetic game task ({weights.get('steps')} steps, loss {weights.get('loss_first')} -> "
            f"{weights.get('loss_last')}, seed {weights.get('seed')})"
        )
    if source == "random":
        return f"seeded random init (seed {weights.get('seed')}), not trained"
    if source == "checkpoint":
        return f"checkpoint {weights.get('path')}"
    if source == "given":
        return "the model's own (as given or as its factory made them)"
    return "not recorded"


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
