"""op_type → op package (`framefuse/plugins/<folder>/`), shared by the rewrite passes, the ONNX
Runtime custom-op bridge and the engines.

Modules are imported lazily: `import framefuse.plugins.registry` costs nothing, and an op whose
package is broken or missing only fails when someone asks for it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from framefuse.errors import FrameFuseError

DOMAIN = "framefuse"
VERSION = 1

# op_type (ONNX node op_type in domain `framefuse`) → package folder under framefuse/plugins/
OP_FOLDERS: dict[str, str] = {
    "LinearScan": "linear_scan",
    "SelectiveScan": "selective_scan",
    "LSTMSeq": "lstm_seq",
    "GRUSeq": "gru_seq",
    "Attention": "attention",
    "DeltaRuleScan": "delta_rule_scan",
    "MLSTMScan": "mlstm_scan",
    "LiquidScan": "liquid_scan",
    "WKVScan": "wkv_scan",
    "GatedDeltaRuleScan": "gated_delta_rule_scan",
}
OP_TYPES: tuple[str, ...] = tuple(OP_FOLDERS)


class UnknownOpError(FrameFuseError):
    """An op_type that is not part of the framefuse op set."""


class OpUnavailableError(FrameFuseError):
    """An op of the op set whose package cannot be imported."""


_cache: dict[str, ModuleType] = {}


def get_op(op_type: str) -> ModuleType:
    """The package of `op_type` (exports SCHEMA, reference, launch and a friendly entry)."""
    module = _cache.get(op_type)
    if module is not None:
        return module
    folder = OP_FOLDERS.get(op_type)
    if folder is None:
        raise UnknownOpError(f"unknown framefuse op {op_type!r} (known: {', '.join(OP_TYPES)})")
    module_name = f"framefuse.plugins.{folder}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise OpUnavailableError(f"framefuse op {op_type}: package {module_name} does not exist") from exc
        raise
    schema = getattr(module, "SCHEMA", None)
    if schema is None or schema.name != op_type:
        raise OpUnavailableError(f"framefuse op {op_type}: {module_name} does not export SCHEMA for {op_type}")
    _cache[op_type] = module
    return module


def get_schema(op_type: str):
    """The OpSchema of `op_type`."""
    return get_op(op_type).SCHEMA


def is_framefuse_node(domain: str, op_type: str) -> bool:
    return domain == DOMAIN and op_type in OP_FOLDERS


def available_ops() -> dict[str, ModuleType | Exception]:
    """Every op type → its module, or the exception that importing it raised (for reports/benches)."""
    found: dict[str, ModuleType | Exception] = {}
    for op_type in OP_TYPES:
        try:
            found[op_type] = get_op(op_type)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, not hidden
            found[op_type] = exc
    return found


def has_kernel(op_type: str) -> bool:
    """Whether the op's package has a CUDA entry (`launch`)."""
    try:
        return callable(getattr(get_op(op_type), "launch", None))
    except FrameFuseError:
        return False
