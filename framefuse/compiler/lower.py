"""Lower a fused ONNX graph (one step, static shapes) into the step IR.

One small function per op type, in the tables :data:`STANDARD` (ONNX ops) and :data:`FRAMEFUSE`
(the framefuse ops' single-step bodies); :func:`lower_model` is the driver. Values are either IR
nodes (they depend on the graph's inputs or states) or numpy arrays (constants: initializers and
everything computed from them alone, evaluated here). A node the compiler cannot lower raises
:class:`CompileError` naming the node and the reason; nothing is approximated.
"""

from __future__ import annotations

import math
import os
from collections import ChainMap
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from framefuse.compiler import ir
from framefuse.compiler.ir import CompileError, Leaf, Node, Program
from framefuse.compiler.simplify import runs_in_columns
from framefuse.errors import read_onnx
from framefuse.onnx_spec import slice_bounds

FLOAT, BOOL = 1, 9
FLOAT_LIKE = {FLOAT}
FLOAT16, BFLOAT16 = 10, 16
# A precision build's graph (precision/convert: fp16 / bf16 storage) lowered with widened storage:
# its fp16 / bf16 constants become the float32 values they hold, a Cast of a constant to fp16 /
# bf16 still rounds it, and a Cast of a computed value to fp16 / bf16 is the value itself. The
# kernel then computes with the weights the graph stores and float32 activations and state: the
# weight-only reading of the build (issue 19: weights stored narrow, fp32 accumulation), not the
# graph's rounding of every activation. Set for one lowering by lower_model(widen_storage=True).
_WIDEN_STORAGE: ContextVar[bool] = ContextVar("widen_storage", default=False)
_LOW_FLOATS = {FLOAT16: np.float16, BFLOAT16: None}  # bfloat16's numpy type comes from ml_dtypes


def _low_float_type(elem: int):
    if elem == BFLOAT16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    return _LOW_FLOATS[elem]


def stored(array: np.ndarray, elem: int) -> tuple[np.ndarray, int]:
    """A constant of ONNX type ``elem`` as the lowering holds it: with widened storage an fp16 /
    bf16 one is the float32 array of the same values (exact), anything else as it is."""
    if elem in _LOW_FLOATS and _WIDEN_STORAGE.get():
        return np.asarray(array).astype(np.float32), FLOAT
    return array, elem


INT_TYPES = {2, 3, 5, 6, 7, 12, 13}  # uint8, int8, int16, int32, int64, uint32, uint64
STATE_PREFIX, NEXT_STATE_PREFIX = "state.", "next_state."
WKV_MAX_INIT = -1e38
# The most elements (positions x carried values) a window's Scan may have when each element runs
# the recurrence up to its own position (the row form, simplify.runs_in_columns false):
# scheduling such a window took 154 s on a 2-core CPU for xlstm's C (524,288 elements at embed
# 256, T = 32) — a build times up to eight tactics. Mamba's (262,144) schedules in 33 s but runs 544 us on
# the H100 (device time; session 23), three times the fused-op engine's whole window. A scan run
# column by column has no such bound (mamba's schedules in 14 s and runs 72 us, xlstm's 21 s).
SCAN_MAX_ELEMENTS = 1 << 17
# LSTMSeq / GRUSeq / LiquidScan windows unrolled into T cells, each a product by R of the hidden
# value before it (about two dependency levels a position), up to UNROLL_MAX_STEPS positions: the
# schedule of an unrolled window grows faster than T (2-layer lstm at embed 256 on a 2-core CPU:
# T = 8 11 s and 0.9 GB, T = 16 53 s and 3.3 GB, T = 32 killed at 21 GB), and a build times six
# tactics. Longer windows are declined naming the node. Used only with RECUR_WINDOWS off (below).
UNROLL_NONLINEAR = True
UNROLL_MAX_STEPS = 8
# ...unless they are one ir.Recur each (on): the positions in a loop inside one task, R on chip
# (codegen's _recur), any T; the input products of every position stay one product over the window.
RECUR_WINDOWS = True
# DeltaRuleScan / GatedDeltaRuleScan windows as one ir.DeltaScan each (every state row a loop over
# the positions); off, a window is declined (the cuda-graph plan runs it).
DELTA_WINDOWS = True


@dataclass
class Ctx:
    node: onnx.NodeProto
    label: str
    attrs: dict
    types: list  # ONNX elem types of the inputs (None for absent)
    out_types: list = field(default_factory=list)

    def fail(self, reason: str) -> CompileError:
        return CompileError(f"{self.label}: {reason}")

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)


Value = Node | np.ndarray


def as_node(value: Value, label: str = "") -> Node:
    if isinstance(value, Node):
        return value
    return ir.constant(np.asarray(value, dtype=np.float32), label=label)


def const_of(ctx: Ctx, value: Value | None, what: str) -> np.ndarray:
    if value is None:
        raise ctx.fail(f"{what} is missing")
    if isinstance(value, Node):
        raise ctx.fail(f"{what} must be a constant (it depends on the graph's inputs)")
    return np.asarray(value)


def shape_of(value: Value) -> tuple[int, ...]:
    return tuple(value.shape)


def _decode(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


# -- elementwise -----------------------------------------------------------------------------------

NUMPY_FOLD: dict[str, Callable] = {}


def _ew(op: str, *values: Value, params: tuple = (), ctx: Ctx) -> Value:
    if all(not isinstance(v, Node) for v in values):
        # every input constant: fold with the op's numpy meaning (the interpreter's)
        from framefuse.compiler.ops import EW

        with np.errstate(all="ignore"):
            return np.asarray(
                EW[op].numpy(*[np.asarray(v, dtype=np.float64) for v in values], params), dtype=np.float32
            )
    return ir.ew(op, *[as_node(v, ctx.label) for v in values], params=params, label=ctx.label)


def _unary(op: str, params: tuple = ()):
    def lower(ctx, ins):
        return [_ew(op, ins[0], params=params, ctx=ctx)]

    return lower


def _binary(op: str):
    def lower(ctx, ins):
        return [_ew(op, ins[0], ins[1], ctx=ctx)]

    return lower


def _variadic(op: str):
    def lower(ctx, ins):
        values = [v for v in ins if v is not None]
        out = values[0]
        for v in values[1:]:
            out = _ew(op, out, v, ctx=ctx)
        return [out]

    return lower


def _mean_of(ctx, ins):
    values = [v for v in ins if v is not None]
    out = _variadic("add")(ctx, values)[0]
    return [_ew("mul", out, np.float32(1.0 / len(values)), ctx=ctx)]


def _pow(ctx, ins):
    base, exponent = ins
    if not isinstance(exponent, Node) and np.asarray(exponent).size == 1:
        e = float(np.asarray(exponent).reshape(()))
        if e == 2.0:
            return [_ew("square", base, ctx=ctx)]
        if e == 1.0:
            return [base]
        if e == 0.5:
            return [_ew("sqrt", base, ctx=ctx)]
    return [_ew("pow", base, exponent, ctx=ctx)]


def _clip(ctx, ins):
    x = ins[0]
    lo = ctx.attr("min", -np.inf)
    hi = ctx.attr("max", np.inf)
    if len(ins) > 1 and ins[1] is not None:
        lo = float(const_of(ctx, ins[1], "Clip's min").reshape(()))
    if len(ins) > 2 and ins[2] is not None:
        hi = float(const_of(ctx, ins[2], "Clip's max").reshape(()))
    return [_ew("clip", x, params=(float(lo), float(hi)), ctx=ctx)]


def _cast(ctx, ins):
    to = int(ctx.attr("to"))
    src = ctx.types[0]
    if to == BOOL:
        return [_ew("tobool", ins[0], ctx=ctx)]
    if to == FLOAT:
        if not isinstance(ins[0], Node) and np.asarray(ins[0]).dtype.kind == "f":
            return [np.asarray(ins[0]).astype(np.float32)]
        return [ins[0]]  # float -> float, bool (0/1) -> float: the value is unchanged
    if to in INT_TYPES and src == BOOL:
        return [ins[0]]
    if to in _LOW_FLOATS and _WIDEN_STORAGE.get():
        ctx.out_types = [FLOAT]
        if isinstance(ins[0], Node):
            return [ins[0]]  # a computed value stays float32 (see _WIDEN_STORAGE)
        rounded = np.asarray(ins[0]).astype(np.float32).astype(_low_float_type(to))
        return [rounded.astype(np.float32)]  # a constant is stored rounded, as the graph stores it
    if not isinstance(ins[0], Node):
        return [np.asarray(ins[0]).astype(helper.tensor_dtype_to_np_dtype(to))]
    raise ctx.fail(
        f"Cast to {helper.tensor_dtype_to_string(to)}: the step compiler computes in float32 "
        f"(an fp16 / bf16 build's graph lowers with widen_storage=True, its weights as stored and its "
        f"activations in float32; int graphs are not lowered)"
    )


def _dequantize_linear(ctx, ins):
    """A weight-only int8 graph's weights (precision/quantize: int8 values, a float32 scale per
    output channel): folded to the float32 constant (x − zero point) · scale at compile time, so
    the products read the very values the graph computes. A computed input (activation Q/DQ) is
    declined: the step compiler computes in float32."""
    x = ins[0]
    if isinstance(x, Node):
        raise ctx.fail(
            "DequantizeLinear of a computed value (activation Q/DQ): the step compiler computes in float32 "
            "(build int8 mode 'weights' for the step kernel)"
        )
    if ctx.attr("block_size", 0):
        raise ctx.fail("blocked DequantizeLinear (block_size) is not lowered")
    if len(ctx.types) > 1 and ctx.types[1] not in (None, FLOAT):
        raise ctx.fail(f"scale of type {helper.tensor_dtype_to_string(ctx.types[1])}: only float32 scales are lowered")
    x = np.asarray(x)
    if x.dtype.kind not in "iu":
        raise ctx.fail(f"DequantizeLinear of {x.dtype} values: only integer ones are lowered")
    scale = const_of(ctx, ins[1], "the scale").astype(np.float32)
    zero = np.zeros((), np.int64) if len(ins) < 3 or ins[2] is None else const_of(ctx, ins[2], "the zero point")
    if scale.ndim == 1 and x.ndim > 0:  # per axis: scale and zero point along `axis`
        shape = [1] * x.ndim
        shape[int(ctx.attr("axis", 1)) % x.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape) if zero.ndim == 1 else zero
    ctx.out_types = [FLOAT]
    return [((x.astype(np.int64) - zero.astype(np.int64)).astype(np.float32) * scale).astype(np.float32)]


def _where(ctx, ins):
    cond, a, b = ins
    return [_ew("where", cond, a, b, ctx=ctx)]


def _act(op: str, param_names: tuple = (), defaults: tuple = ()):
    def lower(ctx, ins):
        params = tuple(float(ctx.attr(n, d)) for n, d in zip(param_names, defaults))
        return [_ew(op, ins[0], params=params, ctx=ctx)]

    return lower


def _gelu(ctx, ins):
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.fail(f"Gelu approximate={approximate!r}")
    return [_ew("gelu", ins[0], params=(1.0 if approximate == "tanh" else 0.0,), ctx=ctx)]


def _selu(ctx, ins):
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    x = ins[0]
    return [_ew("mul", _ew("elu", x, params=(alpha,), ctx=ctx), np.float32(gamma), ctx=ctx)]


def _hard_swish(ctx, ins):
    x = ins[0]
    return [_ew("mul", x, _ew("hard_sigmoid", x, params=(1.0 / 6.0, 0.5), ctx=ctx), ctx=ctx)]


def _mish(ctx, ins):
    x = ins[0]
    return [_ew("mul", x, _ew("tanh", _ew("softplus", x, ctx=ctx), ctx=ctx), ctx=ctx)]


# -- data movement ----------------------------------------------------------------------------------


def _movement(ctx, ins, fn_node, fn_numpy):
    x = ins[0]
    if isinstance(x, Node):
        return [fn_node(x)]
    return [fn_numpy(np.asarray(x))]


def _reshape(ctx, ins):
    x = ins[0]
    target = [int(v) for v in const_of(ctx, ins[1], "Reshape's shape").reshape(-1)]
    shape = list(shape_of(x))
    allowzero = int(ctx.attr("allowzero", 0))
    out = []
    for i, d in enumerate(target):
        out.append(shape[i] if (d == 0 and not allowzero) else d)
    if out.count(-1) > 1:
        raise ctx.fail(f"Reshape to {target}: more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        total = int(np.prod(shape, dtype=np.int64))
        out[out.index(-1)] = total // known if known else 0
    return _movement(ctx, ins, lambda n: ir.reshape(n, out, ctx.label), lambda a: a.reshape(out))


def _flatten(ctx, ins):
    shape = shape_of(ins[0])
    axis = int(ctx.attr("axis", 1)) % (len(shape) + 1) if shape else 0
    out = [int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))]
    return _movement(ctx, ins, lambda n: ir.reshape(n, out, ctx.label), lambda a: a.reshape(out))


def _axes(ctx, ins, position: int, attr: str = "axes"):
    if len(ins) > position and ins[position] is not None:
        return [int(v) for v in const_of(ctx, ins[position], "axes").reshape(-1)]
    value = ctx.attr(attr)
    return None if value is None else [int(v) for v in value]


def _squeeze(ctx, ins):
    shape = list(shape_of(ins[0]))
    axes = _axes(ctx, ins, 1)
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = {a % len(shape) for a in axes}
    out = [d for i, d in enumerate(shape) if i not in axes]
    return _movement(ctx, ins, lambda n: ir.reshape(n, out, ctx.label), lambda a: a.reshape(out))


def _unsqueeze(ctx, ins):
    shape = list(shape_of(ins[0]))
    axes = _axes(ctx, ins, 1)
    rank = len(shape) + len(axes)
    axes = sorted(a % rank for a in axes)
    out = list(shape)
    for a in axes:
        out.insert(a, 1)
    return _movement(ctx, ins, lambda n: ir.reshape(n, out, ctx.label), lambda a: a.reshape(out))


def _transpose(ctx, ins):
    rank = len(shape_of(ins[0]))
    perm = ctx.attr("perm")
    perm = list(reversed(range(rank))) if perm is None else [int(p) % rank for p in perm]
    return _movement(ctx, ins, lambda n: ir.transpose(n, perm, ctx.label), lambda a: a.transpose(perm))


def _expand(ctx, ins):
    target = [int(v) for v in const_of(ctx, ins[1], "Expand's shape").reshape(-1)]
    out = ir.broadcast_shape(shape_of(ins[0]), target, label=ctx.label)
    return _movement(ctx, ins, lambda n: ir.broadcast_to(n, out, ctx.label), lambda a: np.broadcast_to(a, out))


def _tile(ctx, ins):
    reps = [int(v) for v in const_of(ctx, ins[1], "Tile's repeats").reshape(-1)]
    x = ins[0]
    if not isinstance(x, Node):
        return [np.tile(np.asarray(x), reps)]
    src_shape = x.shape
    out = [d * r for d, r in zip(src_shape, reps)]
    from framefuse.compiler import iexpr as ix

    def fn(index, src_shape=src_shape):
        return [ix.mod(i, d) for i, d in zip(index, src_shape)]

    return [ir.Map(x, out, fn, f"tile{reps}", label=ctx.label)]


def _slice_params(ctx, ins, shape):
    if len(ins) > 1:  # opset >= 10: starts, ends, axes, steps as inputs
        starts = [int(v) for v in const_of(ctx, ins[1], "Slice's starts").reshape(-1)]
        ends = [int(v) for v in const_of(ctx, ins[2], "Slice's ends").reshape(-1)]
        axes = _axes(ctx, ins, 3) or list(range(len(starts)))
        steps = (
            [int(v) for v in const_of(ctx, ins[4], "Slice's steps").reshape(-1)]
            if len(ins) > 4 and ins[4] is not None
            else [1] * len(starts)
        )
    else:
        starts = [int(v) for v in ctx.attr("starts")]
        ends = [int(v) for v in ctx.attr("ends")]
        axes = [int(v) for v in ctx.attr("axes", list(range(len(starts))))]
        steps = [1] * len(starts)
    result = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= len(shape)
        if step == 0:
            raise ctx.fail("Slice step 0")
        start, end = slice_bounds(start, end, step, shape[axis])  # as the engines' executor clamps
        length = max(0, -(-(end - start) // step)) if step > 0 else max(0, -(-(start - end) // -step))
        result.append((axis, start, step, length))
    return result


def _slice(ctx, ins):
    x = ins[0]
    params = _slice_params(ctx, ins, shape_of(x))
    if not isinstance(x, Node):
        out = np.asarray(x)
        for axis, start, step, length in params:
            idx = start + step * np.arange(length)
            out = np.take(out, idx, axis=axis)
        return [out]
    for axis, start, step, length in params:
        x = ir.slice_axis(x, axis, start, step, length, ctx.label)
    return [x]


def _gather(ctx, ins):
    data = ins[0]
    indices = const_of(ctx, ins[1], "Gather's indices").astype(np.int64)
    axis = int(ctx.attr("axis", 0)) % len(shape_of(data))
    dim = shape_of(data)[axis]
    indices = np.where(indices < 0, indices + dim, indices)
    if not isinstance(data, Node):
        return [np.take(np.asarray(data), indices, axis=axis)]
    return [ir.take(data, axis, indices, ctx.label)]


def _concat(ctx, ins):
    axis = int(ctx.attr("axis"))
    values = [v for v in ins if v is not None]
    if all(not isinstance(v, Node) for v in values):
        return [np.concatenate([np.asarray(v) for v in values], axis=axis)]
    return [ir.concat([as_node(v, ctx.label) for v in values], axis, ctx.label)]


def _split(ctx, ins):
    x = ins[0]
    shape = shape_of(x)
    axis = int(ctx.attr("axis", 0)) % len(shape)
    n_out = len(ctx.node.output)
    if len(ins) > 1 and ins[1] is not None:
        sizes = [int(v) for v in const_of(ctx, ins[1], "Split's sizes").reshape(-1)]
    elif ctx.attr("split") is not None:
        sizes = [int(v) for v in ctx.attr("split")]
    else:
        chunk = -(-shape[axis] // n_out)
        sizes = [min(chunk, shape[axis] - chunk * i) for i in range(n_out)]
    outs, start = [], 0
    for size in sizes:
        if isinstance(x, Node):
            outs.append(ir.slice_axis(x, axis, start, 1, size, ctx.label))
        else:
            outs.append(np.take(np.asarray(x), np.arange(start, start + size), axis=axis))
        start += size
    return outs


def _constant(ctx, ins):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in ctx.attrs:
            value = ctx.attrs[key]
            if isinstance(value, onnx.TensorProto):
                array, elem = stored(numpy_helper.to_array(value), value.data_type)
                if elem != value.data_type:  # widened: the value is float32 now
                    ctx.out_types = [elem]
                return [array]
            return [np.asarray(value)]
    raise ctx.fail("Constant without a supported value attribute")


def _shape(ctx, ins):
    shape = np.asarray(shape_of(ins[0]), dtype=np.int64)
    start = int(ctx.attr("start", 0))
    end = ctx.attr("end")
    return [shape[start : (int(end) if end is not None else None)]]


def _constant_of_shape(ctx, ins):
    shape = [int(v) for v in const_of(ctx, ins[0], "ConstantOfShape's shape").reshape(-1)]
    value = ctx.attr("value")
    if value is None:
        return [np.full(shape, np.float32(0))]
    fill, elem = stored(numpy_helper.to_array(value).reshape(-1)[:1], value.data_type)
    if elem != value.data_type:  # widened: the value is float32 now
        ctx.out_types = [elem]
    return [np.full(shape, fill[0])]


# -- reductions and normalisations --------------------------------------------------------------------


def _reduce(op: str, post: str | None = None, pre: str | None = None):
    def lower(ctx, ins):
        x = ins[0]
        shape = shape_of(x)
        axes = _axes(ctx, ins, 1)
        if not axes:
            if int(ctx.attr("noop_with_empty_axes", 0)):
                return [x]
            axes = list(range(len(shape)))
        keepdims = bool(int(ctx.attr("keepdims", 1)))
        x = as_node(x, ctx.label)
        if pre:
            x = ir.ew(pre, x, label=ctx.label)
        if op == "mean":
            out = ir.mean(x, axes, keepdims, ctx.label)
        else:
            out = ir.reduce(op, x, axes, keepdims, ctx.label)
        if post:
            out = ir.ew(post, out, label=ctx.label)
        return [out]

    return lower


# A LayerNorm's statistics from the row shifted by its first element (see _layer_norm); off only
# to measure it (bench/microbench/stepkernel_variants.py "ln-unshifted").
LN_SHIFTED = True


def _first_of_rows(x: Node, axis: int, label: str) -> Node:
    """x[..., 0, ..., 0] over the axes from ``axis`` on, kept as size-1 axes (broadcasts back)."""
    first = x
    for a in range(axis, x.rank):
        first = ir.slice_axis(first, a, 0, 1, 1, label)
    return first


def _layer_norm(ctx, ins):
    x, scale = as_node(ins[0], ctx.label), ins[1]
    bias = ins[2] if len(ins) > 2 else None
    axis = int(ctx.attr("axis", -1)) % x.rank
    eps = float(ctx.attr("epsilon", 1e-5))
    axes = list(range(axis, x.rank))
    # One pass over the row shifted by its first element: with d = x − x₀, mean = x₀ + E[d] and
    # var = E[d²] − E[d]². The two means read only x, so they are computed side by side (one phase
    # of the step kernel instead of two). Unshifted (E[x²] − E[x]²) the subtraction cancels when
    # the row's mean is large against its spread: the emulated kernel was 5e-4 off the float64
    # reference at a mean of 100 (ONNX Runtime 1.7e-4); shifted, the error follows the spread.
    first = _first_of_rows(x, axis, ctx.label) if LN_SHIFTED else ir.constant(0.0)
    shifted = ir.ew("sub", x, first, label=ctx.label) if LN_SHIFTED else x
    shift_mean = ir.mean(shifted, axes, True, ctx.label)
    mean = ir.ew("add", first, shift_mean, label=ctx.label) if LN_SHIFTED else shift_mean
    centred = ir.ew("sub", x, mean, label=ctx.label)
    mean_square = ir.mean(ir.ew("square", shifted, label=ctx.label), axes, True, ctx.label)
    var = ir.ew(
        "max",
        ir.ew("sub", mean_square, ir.ew("square", shift_mean, label=ctx.label), label=ctx.label),
        ir.constant(0.0),
    )
    inv = ir.ew("reciprocal", ir.ew("sqrt", ir.ew("add", var, ir.constant(eps), label=ctx.label), label=ctx.label))
    y = ir.ew("mul", ir.ew("mul", centred, inv, label=ctx.label), as_node(scale, ctx.label), label=ctx.label)
    if bias is not None:
        y = ir.ew("add", y, as_node(bias, ctx.label), label=ctx.label)
    outs = [y]
    if len(ctx.node.output) > 1:
        outs.append(mean)
    if len(ctx.node.output) > 2:
        outs.append(inv)
    return outs


def _softmax(log: bool):
    def lower(ctx, ins):
        x = as_node(ins[0], ctx.label)
        axis = int(ctx.attr("axis", -1)) % x.rank
        top = ir.reduce("max", x, [axis], True, ctx.label)
        shifted = ir.ew("sub", x, top, label=ctx.label)
        e = ir.ew("exp", shifted, label=ctx.label)
        total = ir.reduce("sum", e, [axis], True, ctx.label)
        if log:
            return [ir.ew("sub", shifted, ir.ew("log", total, label=ctx.label), label=ctx.label)]
        return [ir.ew("div", e, total, label=ctx.label)]

    return lower


# -- products -------------------------------------------------------------------------------------------


def matmul(a: Value, b: Value, label: str) -> Value:
    """ONNX MatMul (numpy semantics) of two values, one or both of them nodes."""
    if not isinstance(a, Node) and not isinstance(b, Node):
        return np.matmul(np.asarray(a, np.float32), np.asarray(b, np.float32))
    a_shape, b_shape = shape_of(a), shape_of(b)
    if not isinstance(b, Node) and len(b_shape) == 2:
        w = np.asarray(b, dtype=np.float32)
        a_node = as_node(a, label)
        return ir.Dot(a_node, w.T, label=label)
    if not isinstance(a, Node) and len(a_shape) == 2 and len(b_shape) >= 2:
        # W·B: the product of Bᵀ by W as rows, transposed back
        w = np.asarray(a, dtype=np.float32)
        rank = len(b_shape)
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        bt = ir.transpose(b, perm, label)
        return ir.transpose(ir.Dot(bt, w, label=label), perm, label)
    # activation × activation (or a batched constant): Σ_k A[..., m, k] · B[..., k, n]
    a_node, b_node = as_node(a, label), as_node(b, label)
    squeeze_a = a_node.rank == 1
    squeeze_b = b_node.rank == 1
    if squeeze_a:
        a_node = ir.reshape(a_node, (1,) + a_node.shape, label)
    if squeeze_b:
        b_node = ir.reshape(b_node, b_node.shape + (1,), label)
    m, k = a_node.shape[-2:]
    k2, n = b_node.shape[-2:]
    if k != k2:
        raise CompileError(f"{label}: MatMul of {list(a_shape)} by {list(b_shape)}")
    batch = ir.broadcast_shape(a_node.shape[:-2], b_node.shape[:-2], label=label)
    a5 = ir.broadcast_to(ir.reshape(a_node, a_node.shape + (1,), label), batch + (m, k, n), label)
    b5 = ir.broadcast_to(ir.reshape(b_node, b_node.shape[:-2] + (1, k, n), label), batch + (m, k, n), label)
    out = ir.reduce("sum", ir.ew("mul", a5, b5, label=label), [len(batch) + 1], False, label)
    shape = list(out.shape)
    if squeeze_b:
        shape.pop(-1)
    if squeeze_a:
        shape.pop(-2 if not squeeze_b else -1)
    return ir.reshape(out, shape, label)


def _conv(ctx, ins):
    """1-D Conv (N, C, L) with groups, pads, strides and dilations — the depthwise causal
    convolution of Mamba-style blocks: out[n, o, t] = Σ_{c, k} W[o, c, k] · x_pad[n, g·Cg + c,
    t·stride + k·dilation] + b[o], as a reduction over (c, k) of the zero-padded input."""
    from framefuse.compiler import iexpr as ix

    x = as_node(ins[0], ctx.label)
    w = _weight(ctx, ins[1], "Conv's weight")
    bias = ins[2] if len(ins) > 2 else None
    if x.rank != 3 or w.ndim != 3:
        raise ctx.fail(f"Conv of rank {x.rank} (only 1-D convolutions, input [N, C, L], are lowered)")
    if ctx.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise ctx.fail(f"Conv auto_pad={ctx.attr('auto_pad')!r}")
    batch, channels, length = x.shape
    out_ch, group_ch, kernel = w.shape
    groups = int(ctx.attr("group", 1))
    if channels != group_ch * groups or out_ch % groups:
        raise ctx.fail(f"Conv weight {list(w.shape)} does not fit {channels} input channels in {groups} groups")
    stride = int((ctx.attr("strides") or [1])[0])
    dilation = int((ctx.attr("dilations") or [1])[0])
    pad_lo, pad_hi = (int(p) for p in (ctx.attr("pads") or [0, 0]))
    padded = ir.concat(
        [
            ir.constant(np.zeros((batch, channels, pad_lo), np.float32)),
            x,
            ir.constant(np.zeros((batch, channels, pad_hi), np.float32)),
        ],
        2,
        ctx.label,
    )
    out_len = (length + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1
    per_group = out_ch // groups
    shape5 = (batch, out_ch, out_len, group_ch, kernel)

    def window(index, per_group=per_group, group_ch=group_ch, stride=stride, dilation=dilation):
        n, o, t, c, k = index
        group = ix.floordiv(o, per_group)
        return [n, ix.add(ix.mul(group, group_ch), c), ix.add(ix.mul(t, stride), ix.mul(k, dilation))]

    windows = ir.Map(padded, shape5, window, f"conv window (stride {stride}, dilation {dilation})", label=ctx.label)
    weights = ir.broadcast_to(
        ir.reshape(ir.constant(w), (1, out_ch, 1, group_ch, kernel), ctx.label), shape5, ctx.label
    )
    out = ir.reduce("sum", ir.ew("mul", windows, weights, label=ctx.label), [3, 4], False, ctx.label)
    if bias is not None:
        out = ir.ew("add", out, ir.reshape(as_node(bias, ctx.label), (1, out_ch, 1), ctx.label), label=ctx.label)
    return [out]


def _matmul(ctx, ins):
    return [matmul(ins[0], ins[1], ctx.label)]


def _gemm(ctx, ins):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if int(ctx.attr("transA", 0)):
        a = ir.transpose(a, [1, 0], ctx.label) if isinstance(a, Node) else np.asarray(a).T
    if int(ctx.attr("transB", 0)):
        b = ir.transpose(b, [1, 0], ctx.label) if isinstance(b, Node) else np.asarray(b).T
    y = matmul(a, b, ctx.label)
    if alpha != 1.0:
        y = _ew("mul", y, np.float32(alpha), ctx=ctx)
    if c is not None:
        if beta != 1.0:
            c = _ew("mul", c, np.float32(beta), ctx=ctx)
        y = _ew("add", y, c, ctx=ctx)
    return [y]


STANDARD: dict[str, Callable] = {
    "Add": _binary("add"),
    "Sub": _binary("sub"),
    "Mul": _binary("mul"),
    "Div": _binary("div"),
    "Pow": _pow,
    "Neg": _unary("neg"),
    "Abs": _unary("abs"),
    "Sqrt": _unary("sqrt"),
    "Exp": _unary("exp"),
    "Log": _unary("log"),
    "Reciprocal": _unary("reciprocal"),
    "Floor": _unary("floor"),
    "Ceil": _unary("ceil"),
    "Round": _unary("round"),
    "Sign": _unary("sign"),
    "Sin": _unary("sin"),
    "Cos": _unary("cos"),
    "Erf": _unary("erf"),
    "Sigmoid": _unary("sigmoid"),
    "Tanh": _unary("tanh"),
    "Relu": _unary("relu"),
    "Softplus": _unary("softplus"),
    "Softsign": _unary("softsign"),
    "LeakyRelu": _act("leaky_relu", ("alpha",), (0.01,)),
    "Elu": _act("elu", ("alpha",), (1.0,)),
    "HardSigmoid": _act("hard_sigmoid", ("alpha", "beta"), (0.2, 0.5)),
    "HardSwish": _hard_swish,
    "Mish": _mish,
    "Selu": _selu,
    "Gelu": _gelu,
    "Clip": _clip,
    "Max": _variadic("max"),
    "Min": _variadic("min"),
    "Sum": _variadic("add"),
    "Mean": _mean_of,
    "Where": _where,
    "Greater": _binary("gt"),
    "GreaterOrEqual": _binary("ge"),
    "Less": _binary("lt"),
    "LessOrEqual": _binary("le"),
    "Equal": _binary("eq"),
    "Not": _unary("not"),
    "And": _binary("and"),
    "Or": _binary("or"),
    "IsNaN": _unary("isnan"),
    "IsInf": lambda ctx, ins: [_ew("isinf", ins[0], ctx=ctx)],
    "Cast": _cast,
    "DequantizeLinear": _dequantize_linear,
    "Identity": lambda ctx, ins: [ins[0]],
    "Dropout": lambda ctx, ins: [ins[0]],
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Transpose": _transpose,
    "Expand": _expand,
    "Tile": _tile,
    "Slice": _slice,
    "Gather": _gather,
    "Concat": _concat,
    "Split": _split,
    "Constant": _constant,
    "Shape": _shape,
    "Size": lambda ctx, ins: [np.asarray(int(np.prod(shape_of(ins[0]), dtype=np.int64)))],
    "ConstantOfShape": _constant_of_shape,
    "ReduceSum": _reduce("sum"),
    "ReduceMean": _reduce("mean"),
    "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"),
    "ReduceProd": _reduce("prod"),
    "ReduceSumSquare": _reduce("sum", pre="square"),
    "ReduceL2": _reduce("sum", pre="square", post="sqrt"),
    "LayerNormalization": _layer_norm,
    "Softmax": _softmax(False),
    "LogSoftmax": _softmax(True),
    "MatMul": _matmul,
    "Conv": _conv,
    "Gemm": _gemm,
}

BOOL_OUTPUT = {"Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Equal", "Not", "And", "Or", "IsNaN", "IsInf"}


# -- framefuse ops: one step -----------------------------------------------------------------------------


def _one_step(ctx: Ctx, value: Value, axis: int, what: str) -> Node:
    node = as_node(value, ctx.label)
    if node.shape[axis] != 1:
        raise ctx.fail(
            f"{what} has {node.shape[axis]} time steps: the step compiler lowers the single-step form "
            f"(T = 1); sequence forms go through the cuda-graph plan"
        )
    shape = list(node.shape)
    shape.pop(axis)
    return ir.reshape(node, shape, ctx.label)


def _state_or(ctx: Ctx, value: Value | None, shape, fill: float = 0.0) -> Node:
    if value is None:
        return ir.constant(np.full(shape, fill, dtype=np.float32), label=ctx.label)
    return as_node(value, ctx.label)


def _weight(ctx: Ctx, value: Value | None, what: str) -> np.ndarray:
    if isinstance(value, Node):
        raise ctx.fail(f"{what} must be a constant weight (it depends on the graph's inputs)")
    return np.asarray(value, dtype=np.float32)


def _unsq(node: Node, axes: list[int], label: str) -> Node:
    shape = list(node.shape)
    for a in sorted(a % (node.rank + len(axes)) for a in axes):
        shape.insert(a, 1)
    return ir.reshape(node, shape, label)


def _step_ew(ctx: Ctx, op: str, *args: Node, params: tuple = ()) -> Node:
    return ir.ew(op, *args, params=params, label=ctx.label)


def _scan_window(ctx: Ctx, op: str, xs: list[Node], init: Node, carry: int, *, axis: int = 1) -> list[Node]:
    """The sequence form of a scan op whose step is the elementwise ``op``, positions along
    ``axis``: the outputs over every position and the state after the last."""
    y = ir.Scan(op, xs, init, axis, carry, label=ctx.label)
    if y.size > SCAN_MAX_ELEMENTS and not runs_in_columns(y):
        raise ctx.fail(
            f"its window's recurrence over {list(y.shape)} has {y.size} elements, more than the "
            f"{SCAN_MAX_ELEMENTS} the step compiler runs one recurrence an element for"
        )
    last = ir.slice_axis(y, axis, y.steps - 1, 1, 1, ctx.label)
    return [y, ir.reshape(last, init.shape, ctx.label)]


def _linear_scan(ctx, ins):
    a, b = as_node(ins[0], ctx.label), as_node(ins[1], ctx.label)
    if a.rank == 3 and a.shape[1] > 1:
        shape = ir.broadcast_shape(a.shape, b.shape, label=ctx.label)
        a, b = ir.broadcast_to(a, shape, ctx.label), ir.broadcast_to(b, shape, ctx.label)
        h0 = _state_or(ctx, ins[2] if len(ins) > 2 else None, (shape[0], shape[2]))
        return _scan_window(ctx, "linear_scan_step", [a, b], h0, 2)
    a, b = _one_step(ctx, ins[0], 1, "a"), _one_step(ctx, ins[1], 1, "b")
    h0 = _state_or(ctx, ins[2] if len(ins) > 2 else None, a.shape)
    h = _step_ew(ctx, "linear_scan_step", a, b, h0)
    return [_unsq(h, [1], ctx.label), h]


def _selective_scan_window(ctx, ins):
    x, dt = as_node(ins[0], ctx.label), as_node(ins[1], ctx.label)  # [B, T, D]
    A = as_node(ins[2], ctx.label)  # [D, N]
    Bm, Cm = as_node(ins[3], ctx.label), as_node(ins[4], ctx.label)  # [B, T, N]
    batch, steps, d = x.shape
    n = A.shape[1]
    full = (batch, steps, d, n)
    dt_bias = _state_or(ctx, ins[7], (d,))
    delta = _step_ew(ctx, "ssm_delta", dt, dt_bias, params=(int(ctx.attr("delta_softplus", 1)),))
    delta_x = _step_ew(ctx, "mul", delta, x)
    h0 = _state_or(ctx, ins[8], (batch, d, n))
    xs = [
        ir.broadcast_to(_unsq(delta, [-1], ctx.label), full, ctx.label),
        ir.broadcast_to(A, full, ctx.label),
        ir.broadcast_to(_unsq(delta_x, [-1], ctx.label), full, ctx.label),
        ir.broadcast_to(_unsq(Bm, [2], ctx.label), full, ctx.label),
    ]
    h, last = _scan_window(ctx, "ssm_state", xs, h0, 0)
    y = ir.reduce("sum", _step_ew(ctx, "mul", h, _unsq(Cm, [2], ctx.label)), [-1], False, ctx.label)
    if ins[5] is not None:
        y = _step_ew(ctx, "add", y, _step_ew(ctx, "mul", as_node(ins[5], ctx.label), x))
    if ins[6] is not None:
        y = _step_ew(ctx, "ssm_gate", y, as_node(ins[6], ctx.label))
    return [y, last]


def _selective_scan(ctx, ins):
    ins = list(ins) + [None] * (9 - len(ins))
    if as_node(ins[0], ctx.label).shape[1] > 1:
        return _selective_scan_window(ctx, ins)
    x, dt = _one_step(ctx, ins[0], 1, "x"), _one_step(ctx, ins[1], 1, "dt")
    A = as_node(ins[2], ctx.label)  # [D, N]
    Bm, Cm = _one_step(ctx, ins[3], 1, "B"), _one_step(ctx, ins[4], 1, "C")  # [B, N]
    batch, d = x.shape
    n = A.shape[1]
    dt_bias = _state_or(ctx, ins[7], (d,))
    delta = _step_ew(ctx, "ssm_delta", dt, dt_bias, params=(int(ctx.attr("delta_softplus", 1)),))
    h0 = _state_or(ctx, ins[8], (batch, d, n))
    delta_x = _step_ew(ctx, "mul", delta, x)
    h = _step_ew(
        ctx,
        "ssm_state",
        h0,
        _unsq(delta, [-1], ctx.label),
        _unsq(A, [0], ctx.label),
        _unsq(delta_x, [-1], ctx.label),
        _unsq(Bm, [1], ctx.label),
    )
    y = ir.reduce("sum", _step_ew(ctx, "mul", h, _unsq(Cm, [1], ctx.label)), [-1], False, ctx.label)
    if ins[5] is not None:
        y = _step_ew(ctx, "add", y, _step_ew(ctx, "mul", as_node(ins[5], ctx.label), x))
    if ins[6] is not None:
        y = _step_ew(ctx, "ssm_gate", y, _one_step(ctx, ins[6], 1, "z"))
    return [_unsq(y, [1], ctx.label), h]


def _rnn_inputs(ctx, ins, gates: int, *, window: bool = False):
    """(x, W, R, W's bias, R's bias, h0, hidden) of an LSTMSeq / GRUSeq: x is X [B, I] of the step,
    or with ``window`` X [T, B, I] whole."""
    x = as_node(ins[0], ctx.label) if window else _one_step(ctx, ins[0], 0, "X")
    W = _weight(ctx, ins[1], "W")
    R = _weight(ctx, ins[2], "R")
    hidden = R.shape[1]
    bias = ins[3] if len(ins) > 3 else None
    bias = np.zeros(2 * gates * hidden, np.float32) if bias is None else _weight(ctx, bias, "bias")
    h0 = _state_or(ctx, ins[4] if len(ins) > 4 else None, (x.shape[-2], hidden))
    return x, W, R, bias[: gates * hidden], bias[gates * hidden :], h0, hidden


def _gate(node: Node, g: int, hidden: int, label: str) -> Node:
    return ir.slice_axis(node, -1, g * hidden, 1, hidden, label)


def _position(node: Value, axis: int, t: int, label: str) -> Value:
    """Position ``t`` of ``node`` along ``axis``, the axis dropped (a constant stays one)."""
    if isinstance(node, np.ndarray):
        return np.take(node, t, axis=axis)
    shape = list(node.shape)
    shape.pop(axis)
    return ir.reshape(ir.slice_axis(node, axis, t, 1, 1, label), shape, label)


def _unrolled_steps(ctx, value, axis: int, what: str) -> int:
    """The window's positions when it is unrolled; a refusal naming the node when it is too long."""
    steps = as_node(value, ctx.label).shape[axis]
    if steps > UNROLL_MAX_STEPS:
        raise ctx.fail(
            f"{what} has {steps} time steps: the step compiler unrolls a nonlinear recurrence over at most "
            f"{UNROLL_MAX_STEPS} (longer windows go through the cuda-graph plan)"
        )
    return steps


def _lstm_window(ctx, ins):
    """An LSTMSeq window ``X [T, B, I]``: the input products of every position at once, then the
    cells in order, each a product by R of the hidden value before it (nonlinear: no position
    starts before the one before it ends, but a layer's cell at t runs beside the layer below's at
    t + 1 — the wavefront falls out of the dependency levels)."""
    X, W, R, wb, rb, h, H = _rnn_inputs(ctx, ins, 4, window=True)
    c = _state_or(ctx, ins[5] if len(ins) > 5 else None, h.shape)
    wx = _step_ew(ctx, "add", ir.Dot(X, W, ctx.label), ir.constant(wb + rb))  # [T, B, 4H]
    ys = []
    for t in range(X.shape[0]):
        pre = _step_ew(ctx, "add", _position(wx, 0, t, ctx.label), ir.Dot(h, R, ctx.label))
        i, o, f, g = (_gate(pre, k, H, ctx.label) for k in range(4))
        c = _step_ew(ctx, "lstm_cell", i, f, g, c)
        h = _step_ew(ctx, "lstm_hidden", o, c)
        ys.append(_unsq(h, [0], ctx.label))
    return [ir.concat(ys, 0, ctx.label), h, c]


def _gru_window(ctx, ins):
    X, W, R, wb, rb, h, H = _rnn_inputs(ctx, ins, 3, window=True)
    gx_all = _step_ew(ctx, "add", ir.Dot(X, W, ctx.label), ir.constant(wb))  # [T, B, 3H]
    ys = []
    for t in range(X.shape[0]):
        gx = _position(gx_all, 0, t, ctx.label)
        gh = _step_ew(ctx, "add", ir.Dot(h, R, ctx.label), ir.constant(rb))
        xz, xr, xh = (_gate(gx, k, H, ctx.label) for k in range(3))
        hz, hr, hh = (_gate(gh, k, H, ctx.label) for k in range(3))
        h = _step_ew(ctx, "gru_hidden", xz, hz, xr, hr, xh, hh, h)
        ys.append(_unsq(h, [0], ctx.label))
    return [ir.concat(ys, 0, ctx.label), h]


def _liquid_window(ctx, ins):
    xg = as_node(ins[0], ctx.label)  # [B, T, 4H]
    R = _weight(ctx, ins[1], "R")
    H = R.shape[1]
    h = _state_or(ctx, ins[2] if len(ins) > 2 else None, (xg.shape[0], H))
    ys = []
    for t in range(xg.shape[1]):
        g = _step_ew(ctx, "add", _position(xg, 1, t, ctx.label), ir.Dot(h, R, ctx.label))
        g1, g2, ga, gb = (_gate(g, k, H, ctx.label) for k in range(4))
        h = _step_ew(ctx, "liquid_hidden", g1, g2, ga, gb, params=(float(ctx.attr("ts", 1.0)),))
        ys.append(_unsq(h, [1], ctx.label))
    return [ir.concat(ys, 1, ctx.label), h]


def _recur_outputs(ctx, out: Node, hidden: int) -> list[Node]:
    """A Recur's [T, B, S·H] as the op's outputs: Y [T, B, H], then the last h (and c) [B, H]."""
    steps = out.shape[0]
    parts = [ir.slice_axis(out, -1, s * hidden, 1, hidden, ctx.label) for s in range(out.shape[-1] // hidden)]
    return [parts[0]] + [_position(p, 0, steps - 1, ctx.label) for p in parts]


def _lstm_recur(ctx, ins):
    X, W, R, wb, rb, h, H = _rnn_inputs(ctx, ins, 4, window=True)
    c = _state_or(ctx, ins[5] if len(ins) > 5 else None, h.shape)
    xg = _step_ew(ctx, "add", ir.Dot(X, W, ctx.label), ir.constant(wb + rb))  # [T, B, 4H]
    return _recur_outputs(ctx, ir.Recur("lstm", xg, h, c, R, label=ctx.label), H)


def _gru_recur(ctx, ins):
    X, W, R, wb, rb, h, H = _rnn_inputs(ctx, ins, 3, window=True)
    xg = _step_ew(ctx, "add", ir.Dot(X, W, ctx.label), ir.constant(wb))  # [T, B, 3H]
    return _recur_outputs(ctx, ir.Recur("gru", xg, h, None, R, rb, label=ctx.label), H)


def _liquid_recur(ctx, ins):
    xg = as_node(ins[0], ctx.label)  # [B, T, 4H]
    R = _weight(ctx, ins[1], "R")
    H = R.shape[1]
    h = _state_or(ctx, ins[2] if len(ins) > 2 else None, (xg.shape[0], H))
    out = ir.Recur(
        "liquid",
        ir.transpose(xg, [1, 0, 2], ctx.label),
        h,
        None,
        R,
        params=(float(ctx.attr("ts", 1.0)),),
        label=ctx.label,
    )
    y, last = _recur_outputs(ctx, out, H)
    return [ir.transpose(y, [1, 0, 2], ctx.label), last]


def _window_steps(ctx, value, axis: int) -> int:
    return as_node(value, ctx.label).shape[axis]


def _lstm(ctx, ins):
    if RECUR_WINDOWS and _window_steps(ctx, ins[0], 0) > 1:
        return _lstm_recur(ctx, ins)
    if UNROLL_NONLINEAR and _unrolled_steps(ctx, ins[0], 0, "X") > 1:
        return _lstm_window(ctx, ins)
    x, W, R, wb, rb, h0, H = _rnn_inputs(ctx, ins, 4)
    c0 = _state_or(ctx, ins[5] if len(ins) > 5 else None, h0.shape)
    pre = _step_ew(
        ctx, "add", _step_ew(ctx, "add", ir.Dot(x, W, ctx.label), ir.Dot(h0, R, ctx.label)), ir.constant(wb + rb)
    )
    i, o, f, g = (_gate(pre, k, H, ctx.label) for k in range(4))
    c = _step_ew(ctx, "lstm_cell", i, f, g, c0)
    h = _step_ew(ctx, "lstm_hidden", o, c)
    return [_unsq(h, [0], ctx.label), h, c]


def _gru(ctx, ins):
    if int(ctx.attr("linear_before_reset", 1)) != 1:
        raise ctx.fail("GRUSeq with linear_before_reset = 0")
    if RECUR_WINDOWS and _window_steps(ctx, ins[0], 0) > 1:
        return _gru_recur(ctx, ins)
    if UNROLL_NONLINEAR and _unrolled_steps(ctx, ins[0], 0, "X") > 1:
        return _gru_window(ctx, ins)
    x, W, R, wb, rb, h0, H = _rnn_inputs(ctx, ins, 3)
    gx = _step_ew(ctx, "add", ir.Dot(x, W, ctx.label), ir.constant(wb))
    gh = _step_ew(ctx, "add", ir.Dot(h0, R, ctx.label), ir.constant(rb))
    parts = [_gate(gx, k, H, ctx.label) for k in range(3)] + [_gate(gh, k, H, ctx.label) for k in range(3)]
    xz, xr, xh, hz, hr, hh = parts
    h = _step_ew(ctx, "gru_hidden", xz, hz, xr, hr, xh, hh, h0)
    return [_unsq(h, [0], ctx.label), h]


def _liquid(ctx, ins):
    if RECUR_WINDOWS and _window_steps(ctx, ins[0], 1) > 1:
        return _liquid_recur(ctx, ins)
    if UNROLL_NONLINEAR and _unrolled_steps(ctx, ins[0], 1, "xg") > 1:
        return _liquid_window(ctx, ins)
    xg = _one_step(ctx, ins[0], 1, "xg")  # [B, 4H]
    R = _weight(ctx, ins[1], "R")
    H = R.shape[1]
    h0 = _state_or(ctx, ins[2] if len(ins) > 2 else None, (xg.shape[0], H))
    g = _step_ew(ctx, "add", xg, ir.Dot(h0, R, ctx.label))
    g1, g2, ga, gb = (_gate(g, k, H, ctx.label) for k in range(4))
    h = _step_ew(ctx, "liquid_hidden", g1, g2, ga, gb, params=(float(ctx.attr("ts", 1.0)),))
    return [_unsq(h, [1], ctx.label), h]


def _wkv(ctx, ins):
    ins = list(ins) + [None] * (7 - len(ins))
    k, v = _one_step(ctx, ins[0], 1, "k"), _one_step(ctx, ins[1], 1, "v")
    w, u = as_node(ins[2], ctx.label), as_node(ins[3], ctx.label)
    num = _state_or(ctx, ins[4], k.shape)
    den = _state_or(ctx, ins[5], k.shape)
    p = _state_or(ctx, ins[6], k.shape, WKV_MAX_INIT)
    y = ir.ew("wkv_output", num, den, p, k, v, u, label=ctx.label)
    p_next = ir.ew("wkv_max", p, w, k, label=ctx.label)
    num_next = ir.ew("wkv_carry", num, p, w, k, v, p_next, label=ctx.label)
    den_next = ir.ew("wkv_carry", den, p, w, k, ir.constant(1.0), p_next, label=ctx.label)
    return [_unsq(y, [1], ctx.label), num_next, den_next, p_next]


def _delta_window(ctx, ins, op: str, n_gates: int):
    """A delta-rule window: q, k [B, H, T, Dk], v [B, H, T, Dv], the gates [B, H, T], the state
    [B, H, Dk, Dv] (carried here transposed, so a row is Dk long): one DeltaScan; returns
    [o [B, H, T, Dv], S_T]."""
    label = ctx.label
    q, k, v = (as_node(ins[i], label) for i in range(3))
    gates = [as_node(ins[3 + g], label) for g in range(n_gates)]
    batch, heads, steps, dk = k.shape
    dv = v.shape[-1]
    given = ins[3 + n_gates] if len(ins) > 3 + n_gates else None
    out = ir.DeltaScan(op, q, k, v, gates, _state_as_rows(ctx, given, (batch, heads, dk, dv)), label)
    o = ir.transpose(ir.slice_axis(out, -1, 0, 1, steps, label), [0, 1, 3, 2], label)
    S = ir.slice_axis(out, -1, steps, 1, dk, label)
    return [o, ir.transpose(S, [0, 1, 3, 2], label)]


def _delta_rule(ctx, ins):
    if DELTA_WINDOWS and _window_steps(ctx, ins[0], 2) > 1:
        return _delta_window(ctx, ins, "delta_rule_state", 1)
    q, k, v = (_one_step(ctx, ins[i], 2, name) for i, name in enumerate(("q", "k", "v")))  # [B, H, D]
    beta = _one_step(ctx, ins[3], 2, "beta")  # [B, H]
    # carried transposed, [B, H, Dv, Dk], as the window form does: the reductions then run along the
    # state's last axis, and a model that keeps S as [Dv, Dk] (the zoo's DeltaNet, whose rewrite
    # puts a Transpose on each side of the op) lowers to the IR it had before the op took [Dk, Dv]
    given = ins[4] if len(ins) > 4 else None
    S = _state_as_rows(ctx, given, (k.shape[0], k.shape[1], k.shape[-1], v.shape[-1]))
    o, S_t = _delta_update(ctx, "delta_rule_state", S, q, k, v, [beta], k_last=True)
    return [o, ir.transpose(S_t, [0, 1, 3, 2], ctx.label)]


def _state_as_rows(ctx, given, shape):
    """A delta-rule state given as [B, H, Dk, Dv] (``shape``), as [B, H, Dv, Dk]: one row of Dk a
    value index (zeros made in that layout when it is absent)."""
    batch, heads, dk, dv = shape
    if given is None:
        return _state_or(ctx, None, (batch, heads, dv, dk))
    return ir.transpose(as_node(given, ctx.label), [0, 1, 3, 2], ctx.label)


def _gated_delta_rule(ctx, ins):
    if DELTA_WINDOWS and _window_steps(ctx, ins[0], 2) > 1:
        return _delta_window(ctx, ins, "gated_delta_state", 2)
    q, k, v = (_one_step(ctx, ins[i], 2, name) for i, name in enumerate(("q", "k", "v")))
    g, beta = _one_step(ctx, ins[3], 2, "g"), _one_step(ctx, ins[4], 2, "beta")  # [B, H]
    S = _state_or(ctx, ins[5] if len(ins) > 5 else None, (k.shape[0], k.shape[1], k.shape[-1], v.shape[-1]))
    return _delta_update(ctx, "gated_delta_state", S, q, k, v, [g, beta], k_last=False)


def _delta_update(ctx, op: str, S, q, k, v, gates: list, *, k_last: bool):
    """One delta-rule step on a state S [B, H, Dv, Dk] (``k_last``) or [B, H, Dk, Dv]: s = S·k
    along Dk, S' = op(S, *gates, k, v, s) (the op's step function, elementwise), o = S'·q along Dk;
    returns [o as [B, H, 1, Dv], S'] (S' laid out as S)."""
    label = ctx.label
    k_axis, v_axis = (2, 3) if k_last else (3, 2)  # where k and v are broadcast into the state
    along_k = -1 if k_last else -2
    sk = ir.reduce("sum", ir.ew("mul", S, _unsq(k, [k_axis], label), label=label), [along_k], False, label)
    S_new = ir.ew(
        op,
        S,
        *[_unsq(gate, [2, 3], label) for gate in gates],
        _unsq(k, [k_axis], label),
        _unsq(v, [v_axis], label),
        _unsq(sk, [v_axis], label),
        label=label,
    )
    o = ir.reduce("sum", ir.ew("mul", S_new, _unsq(q, [k_axis], label), label=label), [along_k], False, label)
    return [_unsq(o, [2], label), S_new]


def _mlstm_window(ctx, ins):
    """Three scans over the window: the stabiliser m (a max-plus recurrence), then C and n, each
    linear in its state given the gates that m sets."""
    label = ctx.label
    q, k, v = (as_node(ins[i], label) for i in range(3))  # [B, H, T, D]
    i_pre, f_pre = as_node(ins[3], label), as_node(ins[4], label)  # [B, H, T]
    batch, heads, steps, dk = k.shape
    dv = v.shape[-1]
    C0 = _state_or(ctx, ins[5], (batch, heads, dv, dk))
    n0 = _state_or(ctx, ins[6], (batch, heads, dk))
    m0 = _state_or(ctx, ins[7], (batch, heads))
    eps = float(ctx.attr("eps", 0.0))
    m_all, m_last = _scan_window(ctx, "mlstm_m", [f_pre, i_pre], m0, 1, axis=2)
    m_prev = ir.concat([_unsq(m0, [2], label), ir.slice_axis(m_all, 2, 0, 1, steps - 1, label)], 2, label)
    fg = ir.ew("mlstm_fgate", f_pre, m_prev, m_all, label=label)
    ig = ir.ew("mlstm_igate", i_pre, m_all, label=label)
    full = (batch, heads, steps, dv, dk)
    vk = ir.ew("mul", _unsq(v, [4], label), _unsq(k, [3], label), label=label)
    C_all, C_last = _scan_window(
        ctx,
        "linear_scan_step",
        [
            ir.broadcast_to(_unsq(fg, [3, 4], label), full, label),
            ir.ew("mul", _unsq(ig, [3, 4], label), vk, label=label),
        ],
        C0,
        2,
        axis=2,
    )
    n_all, n_last = _scan_window(
        ctx,
        "linear_scan_step",
        [ir.broadcast_to(_unsq(fg, [3], label), k.shape, label), ir.ew("mul", _unsq(ig, [3], label), k, label=label)],
        n0,
        2,
        axis=2,
    )
    numerator = ir.reduce("sum", ir.ew("mul", C_all, _unsq(q, [3], label), label=label), [-1], False, label)
    nq = ir.reduce("sum", ir.ew("mul", n_all, q, label=label), [-1], False, label)
    denominator = ir.ew("mlstm_denominator", nq, m_all, params=(eps,), label=label)
    h = ir.ew("div", numerator, _unsq(denominator, [3], label), label=label)
    return [h, C_last, n_last, m_last]


def _mlstm(ctx, ins):
    ins = list(ins) + [None] * (8 - len(ins))
    if as_node(ins[0], ctx.label).shape[2] > 1:
        return _mlstm_window(ctx, ins)
    q, k, v = (_one_step(ctx, ins[i], 2, name) for i, name in enumerate(("q", "k", "v")))
    i_pre, f_pre = _one_step(ctx, ins[3], 2, "i_pre"), _one_step(ctx, ins[4], 2, "f_pre")  # [B, H]
    batch, heads, dk = k.shape
    dv = v.shape[-1]
    label = ctx.label
    C = _state_or(ctx, ins[5], (batch, heads, dv, dk))
    n = _state_or(ctx, ins[6], (batch, heads, dk))
    m = _state_or(ctx, ins[7], (batch, heads))
    eps = float(ctx.attr("eps", 0.0))
    m_new = ir.ew("mlstm_m", f_pre, m, i_pre, label=label)
    fg = ir.ew("mlstm_fgate", f_pre, m, m_new, label=label)
    ig = ir.ew("mlstm_igate", i_pre, m_new, label=label)
    vk = ir.ew("mul", _unsq(v, [3], label), _unsq(k, [2], label), label=label)
    C_new = ir.ew(
        "add",
        ir.ew("mul", _unsq(fg, [2, 3], label), C, label=label),
        ir.ew("mul", _unsq(ig, [2, 3], label), vk, label=label),
        label=label,
    )
    n_new = ir.ew(
        "add",
        ir.ew("mul", _unsq(fg, [2], label), n, label=label),
        ir.ew("mul", _unsq(ig, [2], label), k, label=label),
        label=label,
    )
    numerator = ir.reduce("sum", ir.ew("mul", C_new, _unsq(q, [2], label), label=label), [-1], False, label)
    nq = ir.reduce("sum", ir.ew("mul", n_new, q, label=label), [-1], False, label)
    denominator = ir.ew("mlstm_denominator", nq, m_new, params=(eps,), label=label)
    h = ir.ew("div", numerator, _unsq(denominator, [2], label), label=label)
    return [_unsq(h, [2], label), C_new, n_new, m_new]


def _attention(ctx, ins):
    label = ctx.label
    q, k, v = (as_node(ins[i], label) for i in range(3))
    mask = ins[3] if len(ins) > 3 else None
    batch, hq, tq, dh = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if hq % hkv:
        raise ctx.fail(f"{hq} query heads do not group over {hkv} KV heads")
    groups = hq // hkv
    scale = ctx.attr("scale")
    scale = 1.0 / math.sqrt(dh) if scale is None else float(scale)
    from framefuse.compiler import iexpr as ix

    def by_query_head(node: Node) -> Node:  # [B, Hkv, Tk, Dh] -> [B, Hq, Tk, Dh], head h reads h // groups
        if groups == 1:
            return node
        return ir.Map(
            node,
            (batch, hq, tk, dh),
            lambda index: [index[0], ix.floordiv(index[1], groups), index[2], index[3]],
            f"kv head of query head (groups {groups})",
            label=label,
        )

    kq, vq = by_query_head(k), by_query_head(v)
    shape5 = (batch, hq, tq, tk, dh)
    prod = ir.ew(
        "mul",
        ir.broadcast_to(_unsq(q, [3], label), shape5, label),
        ir.broadcast_to(_unsq(kq, [2], label), shape5, label),
        label=label,
    )
    scores = ir.ew("mul", ir.reduce("sum", prod, [-1], False, label), ir.constant(scale), label=label)
    if mask is not None:
        scores = ir.ew("add", scores, as_node(mask, label), label=label)
    if int(ctx.attr("causal", 0)):
        visible = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
        scores = ir.ew("where", ir.constant(visible.astype(np.float32)), scores, ir.constant(-np.inf), label=label)
    row_max = ir.reduce("max", scores, [-1], True, label)
    p = ir.ew("attention_weight", scores, row_max, label=label)
    pv = ir.ew(
        "mul",
        ir.broadcast_to(_unsq(p, [-1], label), shape5, label),
        ir.broadcast_to(_unsq(vq, [2], label), shape5, label),
        label=label,
    )
    acc = ir.reduce("sum", pv, [3], False, label)  # [B, Hq, Tq, Dh]
    total = ir.reduce("sum", p, [-1], True, label)
    # a fully masked row is the one whose weights sum to 0 (a finite max weighs its own score 1), so
    # the finish needs no row_max: a consumer that reads it would recompute every score for it
    return [ir.ew("attention_finish", acc, total, label=label)]


FRAMEFUSE: dict[str, Callable] = {
    "LinearScan": _linear_scan,
    "SelectiveScan": _selective_scan,
    "LSTMSeq": _lstm,
    "GRUSeq": _gru,
    "LiquidScan": _liquid,
    "WKVScan": _wkv,
    "DeltaRuleScan": _delta_rule,
    "GatedDeltaRuleScan": _gated_delta_rule,
    "MLSTMScan": _mlstm,
    "Attention": _attention,
}


# -- the ONNX RNN op (Elman): no fused op exists for it, so it is lowered as it stands -------------

ONNX_RNN_ACTIVATIONS = {"Tanh": "tanh", "Relu": "relu", "Sigmoid": "sigmoid"}


def _onnx_rnn(ctx, ins):
    """ONNX RNN (torch.nn.RNN's export): per direction ``h = act(x_t·Wᵀ + h·Rᵀ + Wb + Rb)``. A
    window of T > 1 positions is one ir.Recur a direction (a loop over the positions inside one
    task, R on chip, as LSTMSeq's); T = 1 is the cell itself. Y [T, D, B, H], Y_h [D, B, H]."""
    if int(ctx.attr("layout", 0)):
        raise ctx.fail("layout = 1 (batch-major) is not supported")
    if ctx.attr("clip") is not None:
        raise ctx.fail("clip is not supported")
    direction = ctx.attr("direction", "forward")
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if reverse is None:
        raise ctx.fail(f"direction {direction!r}")
    given = ctx.attr("activations") or ["Tanh"] * len(reverse)
    if len(given) == 1:
        given = given * len(reverse)
    unknown = [a for a in given if a not in ONNX_RNN_ACTIVATIONS]
    if unknown or len(given) != len(reverse):
        raise ctx.fail(f"activations {given}: the step compiler takes {sorted(ONNX_RNN_ACTIVATIONS)}, one a direction")
    X = as_node(ins[0], ctx.label)  # [T, B, I]
    W, R = _weight(ctx, ins[1], "W"), _weight(ctx, ins[2], "R")  # [D, H, I], [D, H, H]
    steps, batch = X.shape[0], X.shape[1]
    H = R.shape[-1]
    bias = ins[3] if len(ins) > 3 and ins[3] is not None else None
    bias = np.zeros((len(reverse), 2 * H), np.float32) if bias is None else _weight(ctx, bias, "B")
    if len(ins) > 4 and ins[4] is not None:
        lens = const_of(ctx, ins[4], "sequence_lens").reshape(-1)
        if (lens != steps).any():
            raise ctx.fail(f"sequence_lens {lens.tolist()} shorter than the window's {steps} positions")
    h0 = ins[5] if len(ins) > 5 and ins[5] is not None else None
    ys, lasts = [], []
    for d, backwards in enumerate(reverse):
        act = ONNX_RNN_ACTIVATIONS[given[d]]
        h = _state_or(ctx, None if h0 is None else _position(as_node(h0, ctx.label), 0, d, ctx.label), (batch, H))
        x = ir.take(X, 0, np.arange(steps - 1, -1, -1), ctx.label) if backwards and steps > 1 else X
        xg = _step_ew(ctx, "add", ir.Dot(x, W[d], ctx.label), ir.constant(bias[d, :H] + bias[d, H:]))  # [T, B, H]
        if steps > 1 and RECUR_WINDOWS:
            y, last = _recur_outputs(ctx, ir.Recur(f"rnn_{act}", xg, h, None, R[d], label=ctx.label), H)
        else:
            outs = []
            for t in range(_unrolled_steps(ctx, X, 0, "X") if steps > 1 else 1):
                h = _step_ew(ctx, act, _step_ew(ctx, "add", _position(xg, 0, t, ctx.label), ir.Dot(h, R[d], ctx.label)))
                outs.append(_unsq(h, [0], ctx.label))
            y, last = ir.concat(outs, 0, ctx.label), h
        if backwards and steps > 1:
            y = ir.take(y, 0, np.arange(steps - 1, -1, -1), ctx.label)
        ys.append(_unsq(y, [1], ctx.label))
        lasts.append(_unsq(last, [0], ctx.label))
    return [ir.concat(ys, 1, ctx.label), ir.concat(lasts, 0, ctx.label)]


# -- control flow: ONNX Loop and Scan, unrolled --------------------------------------------------------
#
# A recurrence no rewrite pattern matched (an Elman cell, an MLP over [x, h], a custom gate) may
# reach the compiler as a Loop or Scan node (TorchScript exports, tf2onnx, hand-built graphs). Its
# trip count is known at compile time (static shapes), so its body is lowered once per iteration
# into the one program, as torch.onnx's dynamo export unrolls a Python loop: the whole window is
# still one kernel. The most body nodes lowered for one Loop / Scan (iterations x body nodes):
CONTROL_FLOW_MAX_NODES = 1 << 16


def _body_of(ctx: Ctx, inputs: int, outputs: int | None = None) -> onnx.GraphProto:
    body = ctx.attr("body")
    if not isinstance(body, onnx.GraphProto):
        raise ctx.fail("has no body graph")
    if len(body.input) != inputs or (outputs is not None and len(body.output) != outputs):
        raise ctx.fail(
            f"body takes {len(body.input)} inputs and gives {len(body.output)} outputs, "
            f"the node passes {inputs}" + ("" if outputs is None else f" and expects {outputs}")
        )
    return body


def _body_constants(body: onnx.GraphProto) -> dict:
    """The body's initializers (onnx-graphsurgeon moves a constant only the body reads into it),
    converted once for all the iterations: name -> (array, elem type)."""
    return {i.name: stored(numpy_helper.to_array(i), i.data_type) for i in body.initializer}


def _iteration(ctx: Ctx, body, constants: dict, values: dict, types: dict, feeds: list, trip: int) -> list:
    """The body's outputs for one iteration: its inputs bound to ``feeds`` ((value, type) pairs),
    its ``constants`` and the enclosing graph's values visible by name (ONNX's outer scope)."""
    scope, scope_types = ChainMap({}, values), ChainMap({}, types)
    for name, (array, elem) in constants.items():
        scope[name] = array
        scope_types[name] = elem
    for vi, (value, elem) in zip(body.input, feeds):
        scope[vi.name] = value
        scope_types[vi.name] = elem if elem is not None else (vi.type.tensor_type.elem_type or FLOAT)
    _lower_nodes(body.node, scope, scope_types, where=f"{ctx.label} iteration {trip}: ")
    outs = []
    for vi in body.output:
        if vi.name not in scope:
            raise ctx.fail(f"body output '{vi.name}' is produced by no body node")
        outs.append((scope[vi.name], scope_types.get(vi.name)))
    return outs


def _stack(elements: list, axis: int, label: str) -> Value:
    """The elements stacked along a new ``axis`` (negative: from the end of the stacked rank)."""
    rank = np.ndim(elements[0]) if isinstance(elements[0], np.ndarray) else elements[0].rank
    axis %= rank + 1
    if all(isinstance(e, np.ndarray) for e in elements):
        return np.stack(elements, axis=axis)
    return ir.concat([_unsq(as_node(e, label), [axis], label) for e in elements], axis, label)


def _unroll_budget(ctx: Ctx, body, trips: int) -> None:
    if trips * max(len(body.node), 1) > CONTROL_FLOW_MAX_NODES:
        raise ctx.fail(
            f"{trips} iterations of a {len(body.node)}-node body: unrolled past the step compiler's "
            f"{CONTROL_FLOW_MAX_NODES} nodes (CONTROL_FLOW_MAX_NODES)"
        )


def _loop(ctx, ins, values, types):
    """ONNX Loop with a trip count and a condition known at compile time."""
    trip_count, cond, carried = ins[0], ins[1] if len(ins) > 1 else None, list(ins[2:])
    carried_types = list(ctx.types[2:])
    body = _body_of(ctx, 2 + len(carried))
    scans = len(body.output) - 1 - len(carried)
    if scans < 0:
        raise ctx.fail(f"body gives {len(body.output)} outputs for {len(carried)} loop-carried values")
    if trip_count is None:
        raise ctx.fail("has no trip count M: the step compiler unrolls a loop a number of times known at compile time")
    trips = int(const_of(ctx, trip_count, "the trip count M").reshape(-1)[0])
    if cond is not None and not bool(const_of(ctx, cond, "the initial condition").reshape(-1)[0]):
        trips = 0
    _unroll_budget(ctx, body, trips)
    constants = _body_constants(body)
    collected: list[list] = [[] for _ in range(scans)]
    scan_types: list = [None] * scans
    for trip in range(trips):
        feeds = [(np.array(trip, dtype=np.int64), 7), (np.array(True), BOOL), *zip(carried, carried_types)]
        outs = _iteration(ctx, body, constants, values, types, feeds, trip)
        go_on = outs[0][0]
        if isinstance(go_on, Node):
            raise ctx.fail(
                f"iteration {trip}: the loop's condition depends on the data: the step compiler unrolls a "
                "loop a number of times known at compile time"
            )
        carried = [v for v, _ in outs[1 : 1 + len(carried)]]
        carried_types = [t for _, t in outs[1 : 1 + len(carried)]]
        for k, (value, elem) in enumerate(outs[1 + len(carried) :]):
            collected[k].append(value)
            scan_types[k] = elem
        if not bool(np.asarray(go_on).reshape(-1)[0]):
            break
    if scans and not collected[0]:
        raise ctx.fail("runs no iteration, so the shapes of its scan outputs are unknown")
    ctx.out_types = carried_types + scan_types
    return carried + [_stack(c, 0, ctx.label) for c in collected]


def _scan(ctx, ins, values, types):
    """ONNX Scan (opset 9 and later): the positions of the scan inputs along their axes, unrolled."""
    m = int(ctx.attr("num_scan_inputs", 0))
    n = len(ins) - m
    if m <= 0 or n < 0:
        raise ctx.fail(f"num_scan_inputs {m} for {len(ins)} inputs")
    states, xs = list(ins[:n]), ins[n:]
    state_types, x_types = list(ctx.types[:n]), ctx.types[n:]
    body = _body_of(ctx, n + m)
    k = len(body.output) - n
    if k < 0:
        raise ctx.fail(f"body gives {len(body.output)} outputs for {n} state variables")
    in_axes = [int(a) for a in ctx.attr("scan_input_axes", [0] * m)]
    in_dirs = [int(d) for d in ctx.attr("scan_input_directions", [0] * m)]
    out_axes = [int(a) for a in ctx.attr("scan_output_axes", [0] * k)]
    out_dirs = [int(d) for d in ctx.attr("scan_output_directions", [0] * k)]
    if any(x is None for x in xs):
        raise ctx.fail("a scan input is missing")
    in_axes = [a % np.ndim(x) if isinstance(x, np.ndarray) else a % x.rank for a, x in zip(in_axes, xs)]
    lengths = {int(np.shape(x)[a]) if isinstance(x, np.ndarray) else x.shape[a] for a, x in zip(in_axes, xs)}
    if len(lengths) != 1:
        raise ctx.fail(f"scan inputs of different lengths {sorted(lengths)}")
    (steps,) = lengths
    _unroll_budget(ctx, body, steps)
    constants = _body_constants(body)
    collected: list[list] = [[] for _ in range(k)]
    scan_types: list = [None] * k
    for t in range(steps):
        slices = [
            (_position(x, a, steps - 1 - t if d else t, ctx.label), et)
            for x, a, d, et in zip(xs, in_axes, in_dirs, x_types)
        ]
        outs = _iteration(ctx, body, constants, values, types, [*zip(states, state_types), *slices], t)
        states = [v for v, _ in outs[:n]]
        state_types = [et for _, et in outs[:n]]
        for j, (value, elem) in enumerate(outs[n:]):
            collected[j].append(value)
            scan_types[j] = elem
    if k and not steps:
        raise ctx.fail("scans no position, so the shapes of its scan outputs are unknown")
    stacked = [_stack(c[::-1] if d else c, a, ctx.label) for c, a, d in zip(collected, out_axes, out_dirs)]
    ctx.out_types = state_types + scan_types
    return states + stacked


CONTROL_FLOW: dict[str, Callable] = {"Loop": _loop, "Scan": _scan}
STANDARD["RNN"] = _onnx_rnn  # defined here, beside the recurrences it shares helpers with


# -- the driver -----------------------------------------------------------------------------------------


def _label(node: onnx.NodeProto, index: int) -> str:
    domain = f"{node.domain}::" if node.domain not in ("", "ai.onnx") else ""
    return f"node '{node.name or f'#{index}'}' ({domain}{node.op_type})"


def _static_shape(vi: onnx.ValueInfoProto, what: str) -> tuple[int, ...]:
    dims = vi.type.tensor_type.shape.dim
    shape = []
    for d in dims:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            raise CompileError(f"{what} '{vi.name}' has a dynamic shape: the step compiler needs static shapes")
        shape.append(int(d.dim_value))
    return tuple(shape)


def _lower_nodes(nodes, values: dict, types: dict, where: str = "") -> None:
    """Lower ``nodes`` in order into ``values`` (name -> IR node or constant) and ``types`` (name ->
    ONNX elem type). ``where`` prefixes the labels (a Loop or Scan body's iteration)."""
    for index, node in enumerate(nodes):
        label = where + _label(node, index)
        attrs = {a.name: _decode(helper.get_attribute_value(a)) for a in node.attribute}
        if node.domain in ("", "ai.onnx") and node.op_type in CONTROL_FLOW:
            fn = CONTROL_FLOW[node.op_type]
        elif node.domain in ("", "ai.onnx"):
            fn = STANDARD.get(node.op_type)
        elif node.domain == "framefuse":
            fn = FRAMEFUSE.get(node.op_type)
        else:
            fn = None
        if fn is None:
            raise CompileError(f"{label}: op {node.op_type} has no lowering in the step compiler")
        ins: list = []
        in_types: list = []
        for name in node.input:
            if not name:
                ins.append(None)
                in_types.append(None)
                continue
            if name not in values:
                raise CompileError(f"{label}: input '{name}' is produced by no earlier node")
            ins.append(values[name])
            in_types.append(types.get(name))
        ctx = Ctx(node, label, attrs, in_types)
        try:
            outs = fn(ctx, ins, values, types) if fn in CONTROL_FLOW.values() else fn(ctx, ins)
        except CompileError as exc:
            if str(exc).startswith(label):
                raise
            raise CompileError(f"{label}: {exc}") from exc
        for i, (name, value) in enumerate(zip(node.output, outs)):
            if not name:
                continue
            values[name] = value
            if i < len(ctx.out_types) and ctx.out_types[i] is not None:
                types[name] = ctx.out_types[i]
            elif node.op_type in BOOL_OUTPUT:
                types[name] = BOOL
            elif node.op_type == "Cast":
                types[name] = int(attrs["to"])
            elif isinstance(value, np.ndarray) and value.dtype.kind in "iu":
                types[name] = 7
            else:
                types[name] = in_types[0] if in_types and in_types[0] is not None else FLOAT


def lower_model(model: onnx.ModelProto, *, source: str = "", widen_storage: bool = False) -> Program:
    """The step IR of ``model`` (a step-form graph: ``x`` + ``state.*`` in, ``y`` + ``next_state.*``
    out, fp32, static shapes). Raises CompileError naming the first node that cannot be lowered.
    ``widen_storage``: an fp16 / bf16 build's graph as weight-only low precision (its constants as
    stored, its computed values in float32; see _WIDEN_STORAGE)."""
    token = _WIDEN_STORAGE.set(bool(widen_storage))
    try:
        return _lower_model(model, source)
    finally:
        _WIDEN_STORAGE.reset(token)


def _lower_model(model: onnx.ModelProto, source: str) -> Program:
    graph = model.graph
    values: dict[str, Value] = {}
    types: dict[str, int] = {}
    for init in graph.initializer:
        values[init.name], types[init.name] = stored(numpy_helper.to_array(init), init.data_type)
    inputs: dict[str, Leaf] = {}
    states: dict[str, Leaf] = {}
    for vi in graph.input:
        if vi.name in values:
            continue
        elem = vi.type.tensor_type.elem_type
        if elem != FLOAT:
            raise CompileError(
                f"graph input '{vi.name}' is {helper.tensor_dtype_to_string(elem)}: the step compiler takes float32 inputs"
            )
        shape = _static_shape(vi, "graph input")
        role = "state" if vi.name.startswith(STATE_PREFIX) else "input"
        leaf = Leaf(role, vi.name, shape)
        (states if role == "state" else inputs)[vi.name] = leaf
        values[vi.name] = leaf
        types[vi.name] = elem
    _lower_nodes(graph.node, values, types)
    outputs: dict[str, Node] = {}
    for vi in graph.output:
        value = values.get(vi.name)
        if value is None:
            raise CompileError(f"graph output '{vi.name}' is produced by no node")
        node = as_node(value, vi.name)
        declared = vi.type.tensor_type
        if declared.elem_type not in (FLOAT, 0):
            raise CompileError(
                f"graph output '{vi.name}' is {helper.tensor_dtype_to_string(declared.elem_type)}: "
                "the step compiler writes float32 outputs"
            )
        if node.kind == "leaf" and node.role == "const":
            node = ir.Leaf("weight", vi.name, node.shape, node.array, label=vi.name)
        outputs[vi.name] = node
    state_of: dict[str, str] = {}
    for name, leaf in states.items():
        out = NEXT_STATE_PREFIX + name[len(STATE_PREFIX) :]
        if out not in outputs:
            raise CompileError(f"state input '{name}' has no output '{out}' (a step graph needs both)")
        if outputs[out].shape != leaf.shape:
            raise CompileError(f"'{out}' is {list(outputs[out].shape)}, '{name}' is {list(leaf.shape)}")
        state_of[name] = out
    return Program(inputs, states, outputs, state_of, source=source)


def lower_onnx(path_or_model, *, widen_storage: bool = False) -> Program:
    """Load (a path or a ModelProto) and lower. Shape computations and constant subgraphs
    (Shape/Gather/Concat chains, a Loop's or Scan's body constants) are folded by the lowering
    itself, op by op in numpy, so it needs no executor: folding with the engines' executor first
    (as before session 36) generated the same kernels for every zoo architecture and real model,
    both forms, up to the IR's node numbering. ``widen_storage``: see lower_model."""
    if isinstance(path_or_model, onnx.ModelProto):
        return lower_model(path_or_model, source="<ModelProto>", widen_storage=widen_storage)
    path = Path(os.fspath(path_or_model))
    model = read_onnx(path, error=CompileError)
    if not model.graph.output:
        raise CompileError(f"{path}: the graph has no outputs: there is nothing to compile (an empty export?)")
    return lower_model(model, source=str(path), widen_storage=widen_storage)


__all__ = ["FRAMEFUSE", "STANDARD", "lower_model", "lower_onnx", "matmul", "stored"]
