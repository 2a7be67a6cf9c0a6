"""Run configs: one YAML file per architecture (``configs/<arch>.yaml``), validated and merged
with command-line overrides (the command line wins).

A config is a plain dict::

    arch: min_gru            # zoo architecture (or a label for a user's model)
    model: {embed: 256, layers: 2, ...}   # the architecture's own keys
    batch: 1                 # static shapes of the exported graphs
    seq: 32
    in_features: 64
    out_features: 32
    precision: fp32          # fp32 | fp16 | bf16 | int8
    int8_mode: null          # int8: weights (the default) | qdq (activations too, calibrated)
    tolerance: {fp32: 1.0e-4, fp16: 1.0e-2, bf16: 3.0e-2, int8: 1.0e-1}
    seed: 0
    weights: trained         # zoo: trained (seeded init + the synthetic game task) | random (seeded init)
    checkpoint: null         # a state_dict file (.pt) loaded over the model's weights (any model)
    opset: 17                # ONNX opset of the export (>= 17)

``model_config(cfg)`` is what a zoo model is built from: the ``model`` section plus
``in_features`` / ``out_features``.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framefuse.errors import FrameFuseError

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
INT8_MODES = ("weights", "qdq")
MIN_OPSET = 17
# The TorchScript exporter (torch.onnx.export(dynamo=False)) knows opsets up to 20.
MAX_OPSET = 20

#: Element-wise tolerance of each precision against fp32 (atol and rtol): the one definition the
#: configs, the accuracy gate and the parity comparisons all read.
PRECISION_TOLERANCE: dict[str, float] = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 3e-2, "int8": 1e-1}

DEFAULTS: dict[str, Any] = {
    "arch": None,
    "model": {"embed": 256, "layers": 2},
    "batch": 1,
    "seq": 32,
    "in_features": 64,
    "out_features": 32,
    "precision": "fp32",
    "int8_mode": None,
    "tolerance": dict(PRECISION_TOLERANCE),
    "seed": 0,
    "weights": "trained",
    "checkpoint": None,
    "opset": 17,
}
#: ``weights``: how a zoo model gets its weights. trained: seeded init, then the small training on
#: the synthetic game task (framefuse.models.training, cached); random: the seeded init only.
WEIGHTS = ("trained", "random")

#: Top-level keys whose value must be a positive integer.
_POSITIVE_INTS = ("batch", "seq", "in_features", "out_features")


class ConfigError(FrameFuseError):
    """A config file or override is invalid: the message names the file (or 'command line') and key."""


def repo_root() -> Path:
    """The checkout this package was imported from (parent of the ``framefuse`` folder)."""
    return Path(__file__).resolve().parent.parent


def config_dirs() -> list[Path]:
    """Where ``<arch>.yaml`` is looked for, in order: configs shipped inside the package
    (``framefuse/configs``, present in a wheel install) and the repository's ``configs/``."""
    here = Path(__file__).resolve().parent
    return [here / "configs", repo_root() / "configs"]


def find_arch_config(arch: str) -> Path | None:
    """The config file for a zoo architecture, or None when no folder has one."""
    for folder in config_dirs():
        candidate = folder / f"{arch}.yaml"
        if candidate.is_file():
            return candidate
    return None


def available_configs() -> list[str]:
    names: set[str] = set()
    for folder in config_dirs():
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.yaml"))
    return sorted(names)


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


@functools.cache
def _yaml_loader():
    """PyYAML's SafeLoader, reading ``1e-4`` as a float (YAML 1.2) rather than a string."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
            |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
            |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        list("-+0123456789."),
    )
    return Loader


def _load_yaml_text(text: str):
    import yaml

    return yaml.load(text, Loader=_yaml_loader())


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        data = _load_yaml_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{where}: not valid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys to values, got {type(data).__name__}")
    return data


def validate_config(cfg: Mapping[str, Any], source: str = "config", model_keys: set[str] | None = None) -> dict:
    """Check every key and value of a (complete or partial) config.

    ``source`` names where it came from (a file path or 'command line') in error messages.
    ``model_keys``: the keys the architecture accepts in its ``model`` section; None skips
    that check (a user's model accepts whatever its factory accepts).
    """
    cfg = dict(cfg)
    for key in cfg:
        if key not in DEFAULTS:
            raise ConfigError(f"{source}: unknown key '{key}'{_suggest(key, DEFAULTS)}; valid keys: {sorted(DEFAULTS)}")

    if "arch" in cfg and cfg["arch"] is not None and not isinstance(cfg["arch"], str):
        raise ConfigError(f"{source}: 'arch' must be a string, got {cfg['arch']!r}")

    for key in _POSITIVE_INTS:
        if key in cfg:
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{source}: '{key}' must be a positive integer, got {value!r}")

    if "seed" in cfg and (isinstance(cfg["seed"], bool) or not isinstance(cfg["seed"], int) or cfg["seed"] < 0):
        raise ConfigError(f"{source}: 'seed' must be a non-negative integer, got {cfg['seed']!r}")

    if "opset" in cfg:
        opset = cfg["opset"]
        if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
            raise ConfigError(
                f"{source}: 'opset' must be an integer from {MIN_OPSET} to {MAX_OPSET} "
                f"(the TorchScript ONNX exporter's range), got {opset!r}"
            )

    if "weights" in cfg and cfg["weights"] not in WEIGHTS:
        raise ConfigError(f"{source}: 'weights' must be one of {list(WEIGHTS)}, got {cfg['weights']!r}")

    if cfg.get("checkpoint") is not None and (not isinstance(cfg["checkpoint"], str) or not cfg["checkpoint"]):
        raise ConfigError(f"{source}: 'checkpoint' must be a file path, got {cfg['checkpoint']!r}")

    if cfg.get("int8_mode") not in (None, *INT8_MODES):
        raise ConfigError(f"{source}: 'int8_mode' must be one of {list(INT8_MODES)}, got {cfg['int8_mode']!r}")

    if "precision" in cfg and cfg["precision"] not in PRECISIONS:
        raise ConfigError(f"{source}: 'precision' must be one of {list(PRECISIONS)}, got {cfg['precision']!r}")

    if "tolerance" in cfg:
        tol = cfg["tolerance"]
        if not isinstance(tol, dict):
            raise ConfigError(f"{source}: 'tolerance' must be a mapping like {{fp32: 1.0e-4}}, got {tol!r}")
        for dtype, value in tol.items():
            if dtype not in PRECISIONS:
                raise ConfigError(
                    f"{source}: unknown key 'tolerance.{dtype}'{_suggest(str(dtype), PRECISIONS)}; "
                    f"valid keys: {list(PRECISIONS)}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{source}: 'tolerance.{dtype}' must be a positive number, got {value!r}")

    if "model" in cfg:
        model = cfg["model"]
        if not isinstance(model, dict):
            raise ConfigError(f"{source}: 'model' must be a mapping of the architecture's keys, got {model!r}")
        for key in ("in_features", "out_features", "arch"):
            if key in model:
                raise ConfigError(f"{source}: 'model.{key}' belongs at the top level of the config, not under 'model'")
        if model_keys is not None:
            for key in model:
                if key not in model_keys:
                    raise ConfigError(
                        f"{source}: unknown key 'model.{key}'{_suggest(key, model_keys)} for arch "
                        f"'{cfg.get('arch')}'; valid keys: {sorted(model_keys)}"
                    )
    return cfg


def zoo_model_keys(arch: str | None) -> tuple[set[str] | None, dict]:
    """The model-section keys and defaults a zoo architecture accepts (None, {}: not a zoo arch)."""
    if not arch:
        return None, {}
    try:
        from framefuse import models
    except ImportError:
        return None, {}
    if arch not in getattr(models, "ARCHITECTURES", ()):
        return None, {}
    defaults = {
        k: v for k, v in models.default_config(arch).items() if k not in ("in_features", "out_features", "arch")
    }
    return set(defaults), defaults


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from ``--set`` (VALUE parsed as YAML: ``16`` is an int, ``true`` a bool)."""
    import yaml

    if "=" not in text:
        raise ConfigError(f"command line: --set expects KEY=VALUE (e.g. model.d_state=16), got '{text}'")
    key, _, raw = text.partition("=")
    key = key.strip()
    try:
        value = _load_yaml_text(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if value is None:
        raise ConfigError(f"command line: --set {key}= has no value")
    return key, value


def _apply_overrides(cfg: dict, overrides: Mapping[str, Any], model_keys: set[str] | None) -> None:
    """Put each override in its place: ``model.X`` or a known model key → ``model``;
    ``tolerance.fp16`` → ``tolerance``; anything else top level (validated afterwards)."""
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:
            section, _, sub = key.partition(".")
            if section not in ("model", "tolerance"):
                raise ConfigError(f"command line: unknown key '{key}' (only model.* and tolerance.* take a dot)")
            cfg[section] = {**cfg.get(section, {}), sub: value}
        elif key in DEFAULTS and key != "model":
            cfg[key] = value
        elif (
            key in cfg.get("model", {}) or (model_keys is not None and key in model_keys) or key in ("embed", "layers")
        ):
            cfg["model"] = {**cfg.get("model", {}), key: value}
        else:
            raise ConfigError(
                f"command line: unknown key '{key}'{_suggest(key, list(DEFAULTS) + sorted(model_keys or ()))}"
            )


def load_config(
    path: str | Path | None = None,
    *,
    arch: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict:
    """The complete, validated config.

    Order (later wins): built-in defaults → the zoo architecture's own defaults →
    the config file (``path``, or ``configs/<arch>.yaml`` when ``path`` is None) → ``overrides``.
    A file that names a different ``arch`` than the one asked for is an error.
    """
    cfg = copy.deepcopy(DEFAULTS)
    file_cfg: dict = {}
    source = "command line"
    if path is not None:
        path = Path(path)
        file_cfg = _read_yaml(path)
        source = str(path)
    elif arch is not None:
        found = find_arch_config(arch)
        if found is not None:
            file_cfg = _read_yaml(found)
            source = str(found)

    if arch is not None and file_cfg.get("arch") not in (None, arch):
        raise ConfigError(f"{source}: config is for arch '{file_cfg['arch']}' but arch '{arch}' was asked for")
    arch = arch or file_cfg.get("arch")
    model_keys, model_defaults = zoo_model_keys(arch)
    validate_config(file_cfg, source, model_keys)

    cfg["model"] = {**cfg["model"], **model_defaults}
    for key, value in file_cfg.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    cfg["arch"] = arch
    if overrides:
        _apply_overrides(cfg, overrides, model_keys)
    return validate_config(cfg, "command line" if overrides else source, model_keys)


def model_config(cfg: Mapping[str, Any]) -> dict:
    """The flat dict a zoo model (or a user's factory) is built from."""
    return {**cfg.get("model", {}), "in_features": cfg["in_features"], "out_features": cfg["out_features"]}


def tolerance(cfg: Mapping[str, Any], precision: str | None = None) -> float:
    precision = precision or cfg["precision"]
    return float(cfg["tolerance"][precision])


def to_json(cfg: Mapping[str, Any]) -> str:
    """Canonical JSON of a config (sorted keys): stored in ONNX metadata and manifests."""
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))
