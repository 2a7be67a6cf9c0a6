"""Base types of the framefuse op set: tensor specs, op schemas and dtype names.

Every op folder (`framefuse/plugins/<op>/schema.py`) defines one `OpSchema`; the rewrite passes,
the ONNX Runtime bridge, the engines and the kernels' Python entries all read it, so the op's
signature is written down exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from framefuse.errors import FrameFuseError

# Storage dtypes of sequence tensors and weights ("T" in a TensorSpec). Recurrent state is float32.
STORAGE_DTYPES = ("float32", "float16", "bfloat16")
STATE_DTYPE = "float32"

# ONNX TensorProto element types of the dtypes above (onnx.TensorProto.FLOAT / FLOAT16 / BFLOAT16 /
# DOUBLE), spelled out so this module imports without onnx.
_ONNX_ELEM = {"float32": 1, "float16": 10, "bfloat16": 16, "float64": 11}
_ONNX_ELEM_TO_NAME = {v: k for k, v in _ONNX_ELEM.items()}


class SchemaError(FrameFuseError):
    """An op was given attributes, inputs or dtypes that its schema does not allow."""


def dtype_name(dtype: Any) -> str:
    """Canonical name ("float32", "float16", "bfloat16", "float64", ...) of a torch dtype, numpy
    dtype, ONNX element type (int) or string ("fp16", "half", "bf16" are accepted)."""
    if isinstance(dtype, str):
        aliases = {
            "fp32": "float32",
            "float": "float32",
            "f32": "float32",
            "fp16": "float16",
            "half": "float16",
            "f16": "float16",
            "bf16": "bfloat16",
            "fp64": "float64",
            "double": "float64",
            "f64": "float64",
        }
        name = dtype.lower().removeprefix("torch.")
        return aliases.get(name, name)
    if isinstance(dtype, bool):
        raise SchemaError(f"not a dtype: {dtype!r}")
    if isinstance(dtype, int):
        if dtype not in _ONNX_ELEM_TO_NAME:
            raise SchemaError(f"ONNX element type {dtype} is not a float type framefuse supports")
        return _ONNX_ELEM_TO_NAME[dtype]
    text = str(dtype)
    if text.startswith("torch."):  # torch.float32 -> "float32"
        return text.removeprefix("torch.")
    try:  # numpy dtype or scalar type
        import numpy as np

        return np.dtype(dtype).name
    except TypeError as exc:
        raise SchemaError(f"not a dtype: {dtype!r}") from exc


def _convert_like(name: str, like: Any) -> Any:
    """`name` expressed in the same family (str / torch / numpy / ONNX int) as `like`."""
    if isinstance(like, str):
        return name
    if isinstance(like, int) and not isinstance(like, bool):
        return _ONNX_ELEM[name]
    if str(like).startswith("torch."):
        import torch

        return getattr(torch, name)
    import numpy as np

    if name == "bfloat16":
        try:
            import ml_dtypes  # numpy has no bfloat16 of its own

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError as exc:
            raise SchemaError("numpy has no bfloat16 dtype (install ml_dtypes)") from exc
    return np.dtype(name)


_DIM = re.compile(r"^(\d*)([A-Za-z_][A-Za-z0-9_]*)$")


def parse_dim(dim: str | int) -> tuple[int, str | None]:
    """A symbolic dim as (coefficient, symbol): "4H" → (4, "H"), "Dk" → (1, "Dk"), 3 → (3, None)."""
    if isinstance(dim, int) and not isinstance(dim, bool):
        return dim, None
    match = _DIM.match(str(dim))
    if match is None:
        raise SchemaError(f"symbolic dim {dim!r} is not an integer, a name or an integer times a name (e.g. 4H)")
    return int(match.group(1) or 1), match.group(2)


def resolve_dims(dims: tuple, bound: Mapping[str, int]) -> tuple[int | None, ...]:
    """Concrete sizes of symbolic `dims` under `bound` (None where a symbol is not bound)."""
    sizes = []
    for dim in dims:
        coef, symbol = parse_dim(dim)
        sizes.append(coef if symbol is None else (coef * bound[symbol] if symbol in bound else None))
    return tuple(sizes)


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of an op. dims: its shape in symbols ("B", "T", "4H", ...) that the
    ops' Python entries check arguments against (`checks.prepare`) and size outputs from; None
    where no fixed symbolic shape says it (a broadcastable mask)."""

    name: str
    rank: int
    dtype: str  # "T" (storage dtype: float32/float16/bfloat16) or "float32" (state)
    optional: bool = False
    doc: str = ""
    dims: tuple[str | int, ...] | None = None
    # the op exponentiates this input (a gate's pre-activation): an fp16 / bf16 build computes it,
    # and runs the op, in float32 (precision/convert.exponent_chains), as it keeps Exp in float32
    exponentiated: bool = False

    def __post_init__(self):
        if self.dims is not None:
            if len(self.dims) != self.rank:
                raise SchemaError(f"tensor {self.name}: dims {list(self.dims)} do not have rank {self.rank}")
            for dim in self.dims:
                parse_dim(dim)


def _no_shape_rule(shapes, attrs):  # pragma: no cover - placeholder default
    raise NotImplementedError


@dataclass(frozen=True)
class OpSchema:
    """The signature of one fused op (domain `framefuse`)."""

    name: str  # ONNX op_type, e.g. "LinearScan"
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attributes: Mapping[str, tuple[type, object]] = field(default_factory=dict)
    infer_shapes: Callable[[list[tuple[int, ...] | None], dict], list[tuple[int, ...]]] = _no_shape_rule
    domain: str = "framefuse"
    version: int = 1
    doc: str = ""

    # frozen dataclass with a dict field: hash by identity-defining fields only
    def __hash__(self) -> int:
        return hash((self.domain, self.name, self.version))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    @property
    def required_inputs(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs if not s.optional)

    def input_index(self, name: str) -> int:
        try:
            return self.input_names.index(name)
        except ValueError:
            raise SchemaError(f"{self.name} has no input {name!r} (inputs: {', '.join(self.input_names)})") from None

    def output_dtypes(self, storage_dtype: Any) -> list:
        """Dtype of each output for a given storage dtype, in the same family as `storage_dtype`
        (torch dtype → torch dtypes, numpy → numpy, ONNX elem int → ints, str → names)."""
        name = dtype_name(storage_dtype)
        if name not in STORAGE_DTYPES and name != "float64":
            raise SchemaError(
                f"{self.name}: storage dtype {name} is not supported (expected one of {', '.join(STORAGE_DTYPES)})"
            )
        out = []
        for spec in self.outputs:
            out_name = name if spec.dtype == "T" else spec.dtype
            out.append(_convert_like(out_name, storage_dtype))
        return out

    def input_dtypes(self, storage_dtype: Any) -> list:
        """Expected dtype of each input (same family rules as `output_dtypes`)."""
        name = dtype_name(storage_dtype)
        return [_convert_like(name if s.dtype == "T" else s.dtype, storage_dtype) for s in self.inputs]

    def attrs_with_defaults(self, attrs: Mapping[str, Any] | None) -> dict:
        """`attrs` completed with defaults and cast to the declared types; unknown names raise."""
        attrs = dict(attrs or {})
        unknown = sorted(set(attrs) - set(self.attributes))
        if unknown:
            known = ", ".join(self.attributes) or "none"
            raise SchemaError(f"{self.name}: unknown attribute(s) {', '.join(unknown)} (known: {known})")
        result = {}
        for key, (typ, default) in self.attributes.items():
            value = attrs.get(key, default)
            if value is None:
                result[key] = None
                continue
            if isinstance(value, bytes) and typ is str:
                value = value.decode()
            try:
                result[key] = typ(value)
            except (TypeError, ValueError) as exc:
                raise SchemaError(f"{self.name}: attribute {key}={value!r} is not a {typ.__name__}") from exc
        return result

    def check_arity(self, n_inputs: int) -> None:
        n_required = len(self.required_inputs)
        if not n_required <= n_inputs <= len(self.inputs):
            raise SchemaError(
                f"{self.name}: got {n_inputs} inputs, expected {n_required} to {len(self.inputs)} "
                f"({', '.join(self.input_names)})"
            )


def require_rank(op: str, arg: str, shape, rank: int) -> tuple:
    """Shape-rule helper: `shape` as a tuple, after checking its rank (error names op + argument)."""
    if shape is None:
        raise SchemaError(f"{op}: input {arg} is required but was not given")
    shape = tuple(shape)
    if len(shape) != rank:
        raise SchemaError(f"{op}: input {arg} must have rank {rank}, got shape {list(shape)}")
    return shape


def require_equal(op: str, what: str, *pairs: tuple[str, Any]) -> None:
    """Shape-rule helper: all known (non-None, int) values in `pairs` are equal."""
    known = [(n, v) for n, v in pairs if isinstance(v, int) and v >= 0]
    if known and any(v != known[0][1] for _, v in known):
        listing = ", ".join(f"{n}={v}" for n, v in known)
        raise SchemaError(f"{op}: {what} disagree: {listing}")
