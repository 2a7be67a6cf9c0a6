"""Input checks shared by every op's Python entry: each error names the op, the argument, what was
expected and what was given."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from framefuse.errors import FrameFuseError
from framefuse.plugins.schema import OpSchema, SchemaError, parse_dim, resolve_dims


class OpArgumentError(FrameFuseError):
    """A fused op was called with a tensor of the wrong shape, dtype, device or layout."""


def _torch():
    import torch

    return torch


def as_tensor(op: str, arg: str, x: Any):
    """`x` as a torch tensor without copying: torch tensors pass through; objects with
    `__cuda_array_interface__` (CuPy, Numba, ...) or DLPack (`__dlpack__`) are wrapped zero-copy."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        try:
            return torch.as_tensor(x, device="cuda")
        except Exception as exc:  # noqa: BLE001 - rewrap with the op and argument named
            raise OpArgumentError(f"{op}: argument {arg}: cannot wrap __cuda_array_interface__ object: {exc}") from exc
    if hasattr(x, "__dlpack__"):
        try:
            return torch.from_dlpack(x)
        except Exception as exc:  # noqa: BLE001
            raise OpArgumentError(f"{op}: argument {arg}: cannot import via DLPack: {exc}") from exc
    raise OpArgumentError(
        f"{op}: argument {arg} must be a torch tensor or an object with __cuda_array_interface__ or "
        f"__dlpack__, got {type(x).__name__}"
    )


def _dtype_label(d) -> str:
    return str(d).removeprefix("torch.")


def check_tensor(
    op: str,
    arg: str,
    t: Any,
    *,
    shape: Sequence[int | None] | None = None,
    dtype: Any = None,
    cuda: bool = True,
    device: Any = None,
    contiguous: bool = True,
):
    """Check one op argument and return it as a torch tensor.

    shape: expected shape; None entries match any size. dtype: a torch dtype or an iterable of
    allowed ones. cuda: must live on a CUDA device. device: must live on exactly this device
    (a torch.device), e.g. the device of the op's first input. contiguous: row-major contiguous.
    Raises OpArgumentError ("<op>: argument <arg>: expected ..., got ...").
    """
    torch = _torch()
    if t is None:
        raise OpArgumentError(f"{op}: argument {arg} is required but was None")
    t = as_tensor(op, arg, t)
    if shape is not None:
        expected = tuple(shape)
        actual = tuple(t.shape)
        if len(expected) != len(actual) or any(e is not None and e != a for e, a in zip(expected, actual)):
            shown = "[" + ", ".join("?" if e is None else str(e) for e in expected) + "]"
            raise OpArgumentError(f"{op}: argument {arg}: expected shape {shown}, got {list(actual)}")
    if dtype is not None:
        allowed = tuple(dtype) if isinstance(dtype, Iterable) and not isinstance(dtype, torch.dtype) else (dtype,)
        if t.dtype not in allowed:
            names = " or ".join(_dtype_label(d) for d in allowed)
            raise OpArgumentError(f"{op}: argument {arg}: expected dtype {names}, got {_dtype_label(t.dtype)}")
    if cuda and t.device.type != "cuda":
        raise OpArgumentError(f"{op}: argument {arg}: expected a CUDA tensor, got one on {t.device}")
    if device is not None and t.device != torch.device(device):
        raise OpArgumentError(f"{op}: argument {arg}: expected a tensor on {device}, got one on {t.device}")
    if contiguous and not t.is_contiguous():
        raise OpArgumentError(
            f"{op}: argument {arg}: expected a contiguous (row-major) tensor, got strides {list(t.stride())} "
            f"for shape {list(t.shape)} (call .contiguous() first)"
        )
    return t


def storage_dtypes():
    """The torch storage dtypes every kernel supports (fp32, fp16, bf16)."""
    torch = _torch()
    return (torch.float32, torch.float16, torch.bfloat16)


def check_storage_dtype(op: str, arg: str, t) -> None:
    if t.dtype not in storage_dtypes():
        raise OpArgumentError(
            f"{op}: argument {arg}: storage dtype must be float32, float16 or bfloat16, got {_dtype_label(t.dtype)}"
        )


def check_attr_range(op: str, name: str, value, *, low=None, high=None, choices=None) -> None:
    """Attribute bounds check, e.g. check_attr_range("SelectiveScan", "N", n, low=1, high=256)."""
    if choices is not None and value not in choices:
        raise OpArgumentError(f"{op}: {name}={value!r} must be one of {list(choices)}")
    if low is not None and value < low:
        raise OpArgumentError(f"{op}: {name}={value!r} must be >= {low}")
    if high is not None and value > high:
        raise OpArgumentError(f"{op}: {name}={value!r} must be <= {high}")


def check_outputs(op: str, outputs, specs: Sequence[tuple[str, tuple, Any]], device, *, cuda: bool = True) -> list:
    """Check preallocated outputs against (name, shape, dtype) specs; returns them as torch tensors."""
    if len(outputs) != len(specs):
        raise OpArgumentError(
            f"{op}: expected {len(specs)} preallocated outputs ({', '.join(s[0] for s in specs)}), got {len(outputs)}"
        )
    return [
        check_tensor(op, f"output {name}", out, shape=shape, dtype=dtype, device=device, cuda=cuda)
        for out, (name, shape, dtype) in zip(outputs, specs)
    ]


@dataclass
class Prepared:
    """An op call after `prepare`: checked inputs in schema order (None where absent), attributes
    with defaults, the storage dtype and device, the sizes of the schema's symbols and the outputs
    (allocated, or the caller's after checking)."""

    attrs: dict
    dtype: Any
    device: Any
    dims: dict[str, int]
    inputs: list
    outputs: list


def _bare_symbols(spec) -> set[str]:
    return {symbol for coef, symbol in map(parse_dim, spec.dims or ()) if symbol is not None and coef == 1}


def _check_order(schema: OpSchema, present: list[int], bound: Mapping[str, int]) -> list[int]:
    """The present inputs in the order to check them: in schema order, each next input whose
    derived dims ("4H") have their symbol sized by an input already checked or by itself (R [4H, H]
    sizes H and checks its own 4H), so an error is reported at the input that is wrong, not at one
    whose expected shape was derived from it."""
    known = set(bound)
    order = []
    remaining = list(present)
    while remaining:
        ready = [
            i
            for i in remaining
            if all(
                symbol is None or symbol in known or symbol in _bare_symbols(schema.inputs[i])
                for _, symbol in map(parse_dim, schema.inputs[i].dims or ())
            )
        ]
        i = ready[0] if ready else remaining[0]
        order.append(i)
        remaining.remove(i)
        known |= _bare_symbols(schema.inputs[i])
    return order


def prepare(
    schema: OpSchema,
    inputs,
    attrs=None,
    outputs=None,
    *,
    shape_rule: Callable[[list], dict] | None = None,
    attr_rule: Callable[[dict], None] | None = None,
    also_float32: tuple[str, ...] = (),
    limits: Mapping[str, tuple[int, int]] | None = None,
    cuda: bool = True,
) -> Prepared:
    """Check one call of an op against its schema and size its outputs: what every op's `launch`
    does before its kernel-specific planning.

    The first input fixes the storage dtype ("T") and device; every input is then checked for
    rank, shape (its `TensorSpec.dims` under the symbols' sizes), dtype ("T" or float32 state),
    device and contiguity, and errors name the op and the argument ("LSTMSeq: argument W:
    expected shape [64, 8], got [64, 4]"). A symbol takes its size from the first input checked
    where it stands bare, and an input whose dims derive from a symbol ("4H") is checked after
    the input that sizes it, so a wrong R of an LSTM is reported as R, not as the W sized from
    it. shape_rule: the op's own
    shape check (`check_shapes(shapes) -> symbol sizes`), for ops whose inputs constrain each
    other beyond what dims say (masks that broadcast, head counts that divide); it runs after the
    dtype checks and its sizes win. attr_rule: the op's check of its attributes' values (defaults
    filled in; it raises), run before any tensor is looked at. also_float32: inputs that may be float32 as well as the
    storage dtype. limits: {symbol: (low, high)} sizes a kernel supports, checked as soon as the
    input that sizes the symbol is. cuda=False lets CPU tests reach every check but the device type.
    """
    torch = _torch()
    op = schema.name
    inputs = list(inputs)
    schema.check_arity(len(inputs))
    inputs += [None] * (len(schema.inputs) - len(inputs))
    attrs = schema.attrs_with_defaults(attrs)
    if attr_rule is not None:
        attr_rule(attrs)
    anchor = check_tensor(op, schema.inputs[0].name, inputs[0], cuda=cuda)
    check_storage_dtype(op, schema.inputs[0].name, anchor)
    dtype, device = anchor.dtype, anchor.device
    inputs[0] = anchor

    def expected_dtype(spec):
        if spec.dtype != "T":
            return getattr(torch, spec.dtype)
        return (dtype, torch.float32) if spec.name in also_float32 and dtype != torch.float32 else dtype

    for i, spec in enumerate(schema.inputs):
        if inputs[i] is None and not spec.optional:
            check_tensor(op, spec.name, None)  # raises: "argument k is required but was None"
    present = [i for i, spec in enumerate(schema.inputs) if inputs[i] is not None]
    for i in present[1:]:
        inputs[i] = as_tensor(op, schema.inputs[i].name, inputs[i])
    bound: dict[str, int] = {}
    checked = {0}  # inputs whose dtype, device and layout are checked already
    if shape_rule is not None:
        for i in present[1:]:
            spec = schema.inputs[i]
            inputs[i] = check_tensor(op, spec.name, inputs[i], dtype=expected_dtype(spec), device=device, cuda=cuda)
        checked.update(present)
        bound.update(shape_rule([None if t is None else tuple(t.shape) for t in inputs]))
    for i in _check_order(schema, present, bound):
        spec = schema.inputs[i]
        t = inputs[i]
        if i not in checked:
            t = check_tensor(op, spec.name, t, dtype=expected_dtype(spec), device=device, cuda=cuda)
        if spec.dims is not None:
            if t.dim() != spec.rank:
                shape = resolve_dims(spec.dims, bound)
                if None not in shape:
                    check_tensor(op, spec.name, t, shape=shape, cuda=cuda)  # raises, shape named
                raise OpArgumentError(
                    f"{op}: argument {spec.name}: expected rank {spec.rank} [{', '.join(map(str, spec.dims))}], "
                    f"got shape {list(t.shape)}"
                )
            for dim, size in zip(spec.dims, t.shape):
                coef, symbol = parse_dim(dim)
                if symbol is not None and coef == 1:
                    bound.setdefault(symbol, int(size))
            check_tensor(op, spec.name, t, shape=resolve_dims(spec.dims, bound), cuda=cuda)
            for symbol, (low, high) in (limits or {}).items():
                if symbol in _bare_symbols(spec) and not low <= bound[symbol] <= high:
                    raise OpArgumentError(
                        f"{op}: argument {spec.name}: {symbol}={bound[symbol]} must be between {low} and {high}"
                    )
        inputs[i] = t

    out_specs = []
    for spec in schema.outputs:
        if spec.dims is None:
            raise SchemaError(f"{op}: output {spec.name} declares no dims (prepare sizes outputs from them)")
        shape = resolve_dims(spec.dims, bound)
        if None in shape:
            raise OpArgumentError(f"{op}: output {spec.name} has dims {list(spec.dims)} that no input sizes")
        out_specs.append((spec.name, shape, dtype if spec.dtype == "T" else getattr(torch, spec.dtype)))
    if outputs is None:
        outputs = [torch.empty(shape, dtype=dt, device=device) for _, shape, dt in out_specs]
    else:
        outputs = check_outputs(op, list(outputs), out_specs, device, cuda=cuda)
    return Prepared(attrs, dtype, device, bound, inputs, outputs)
