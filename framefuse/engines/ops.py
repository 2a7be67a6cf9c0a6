"""The standard ONNX ops the cuda-graph engine executes, each mapped to torch with ONNX semantics.

One entry per op type (default domain, opsets 13..20 as the TorchScript exporter writes them).
An entry is an :class:`OpDef`: ``fn(inputs, attrs, n_outputs) -> list[Tensor]`` plus the input
positions whose *values* the op needs on the host (a Reshape's shape, a Slice's starts ...).
Those must be build-time constants: the executor folds every shape computation of a static-shape
graph, resolves them to numpy arrays before the first run, and refuses a graph where one is
data-dependent. So nothing here ever reads a device value back to the host, and every op can be
captured in a CUDA graph.

Conventions, all from the ONNX operator spec:
- numpy broadcasting for elementwise ops (torch's rules are the same);
- negative axes count from the end; attributes of older opsets (``axes``, ``split``, ``min`` ...)
  are accepted as well as the opset-13/18 inputs that replaced them;
- integer Div truncates toward zero (as ONNX Runtime does), Mod follows ``fmod``.

An op that is not here is an error at build time (the executor names the node and the op), and
so is an attribute value an entry cannot honour (``check``): nothing is silently approximated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from framefuse.errors import FrameFuseError
from framefuse.onnx_spec import slice_bounds


class UnsupportedOpError(FrameFuseError):
    """A node whose op type or attribute values the engine does not implement."""


OpFn = Callable[[list, dict, int], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class OpDef:
    """How one ONNX op runs.

    fn: ``(inputs, attrs, n_outputs) -> outputs``; ``inputs`` are torch tensors (``None`` for an
        absent optional input), except at ``host_inputs`` positions, which hold numpy arrays.
    host_inputs: positions whose values must be known when the engine is built.
    check: ``(attrs, n_inputs) -> reason | None``; a reason makes the build fail for that node.
    """

    fn: OpFn
    host_inputs: tuple[int, ...] = ()
    check: Callable[[dict, int], str | None] | None = None


# ONNX TensorProto element type -> torch dtype
ONNX_TO_TORCH: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.uint8,
    3: torch.int8,
    5: torch.int16,
    6: torch.int32,
    7: torch.int64,
    9: torch.bool,
    10: torch.float16,
    11: torch.float64,
    16: torch.bfloat16,
}
TORCH_TO_ONNX: dict[torch.dtype, int] = {v: k for k, v in ONNX_TO_TORCH.items()}


def torch_dtype(elem_type: int, what: str = "tensor") -> torch.dtype:
    try:
        return ONNX_TO_TORCH[int(elem_type)]
    except KeyError:
        raise UnsupportedOpError(f"{what}: ONNX element type {elem_type} is not supported by the engine") from None


OPS: dict[str, OpDef] = {}


def _op(*names: str, host_inputs: tuple[int, ...] = (), check=None):
    def deco(fn: OpFn) -> OpFn:
        for name in names:
            OPS[name] = OpDef(fn, host_inputs, check)
        return fn

    return deco


def _axis(axis: int, rank: int) -> int:
    axis = int(axis)
    return axis + rank if axis < 0 else axis


def _ints(values) -> list[int]:
    if values is None:
        return []
    return [int(v) for v in np.asarray(values).reshape(-1)]


# ---------------------------------------------------------------------------------------------
# elementwise


def _unary(name: str, fn: Callable[[torch.Tensor], torch.Tensor]):
    OPS[name] = OpDef(lambda ins, attrs, n: [fn(ins[0])])


_unary("Identity", lambda x: x)
_unary("Neg", torch.neg)
_unary("Abs", torch.abs)
_unary("Sqrt", torch.sqrt)
_unary("Exp", torch.exp)
_unary("Log", torch.log)
_unary("Sigmoid", torch.sigmoid)
_unary("Tanh", torch.tanh)
_unary("Relu", torch.relu)
_unary("Erf", torch.erf)
_unary("Reciprocal", torch.reciprocal)
_unary("Floor", torch.floor)
_unary("Ceil", torch.ceil)
_unary("Round", torch.round)  # round half to even, as ONNX
_unary("Sin", torch.sin)
_unary("Cos", torch.cos)
_unary("Sign", torch.sign)
_unary("Not", torch.logical_not)
_unary("IsNaN", torch.isnan)
_unary("Softsign", lambda x: x / (1 + x.abs()))
_unary("Mish", lambda x: x * torch.tanh(F.softplus(x)))
_unary("HardSwish", lambda x: x * torch.clamp(x / 6 + 0.5, 0, 1))


@_op("Softplus")
def _softplus(ins, attrs, n):
    # log(1 + exp(x)) without overflow: torch's threshold of 20 returns x where exp(x) would
    # overflow; the difference from the exact value there is below 3e-9.
    return [F.softplus(ins[0])]


@_op("Dropout")
def _dropout(ins, attrs, n):
    # Inference: identity; the optional mask output is all true.
    x = ins[0]
    return [x, torch.ones_like(x, dtype=torch.bool)][:n]


@_op("LeakyRelu")
def _leaky_relu(ins, attrs, n):
    return [F.leaky_relu(ins[0], float(attrs.get("alpha", 0.01)))]


@_op("Elu")
def _elu(ins, attrs, n):
    return [F.elu(ins[0], float(attrs.get("alpha", 1.0)))]


@_op("Selu")
def _selu(ins, attrs, n):
    alpha = float(attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(attrs.get("gamma", 1.05070102214813232421875))
    x = ins[0]
    return [gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))]


@_op("HardSigmoid")
def _hard_sigmoid(ins, attrs, n):
    alpha = float(attrs.get("alpha", 0.2))
    beta = float(attrs.get("beta", 0.5))
    return [torch.clamp(alpha * ins[0] + beta, 0, 1)]


@_op(
    "Gelu",
    check=lambda a, n: None if a.get("approximate", "none") in ("none", "tanh") else "approximate must be none|tanh",
)
def _gelu(ins, attrs, n):
    return [F.gelu(ins[0], approximate=attrs.get("approximate", "none"))]


@_op("IsInf")
def _isinf(ins, attrs, n):
    x = ins[0]
    pos, neg = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    if pos and neg:
        return [torch.isinf(x)]
    if pos:
        return [torch.isposinf(x)]
    if neg:
        return [torch.isneginf(x)]
    return [torch.zeros_like(x, dtype=torch.bool)]


def _binary(name: str, fn):
    OPS[name] = OpDef(lambda ins, attrs, n: [fn(ins[0], ins[1])])


_binary("Add", torch.add)
_binary("Sub", torch.sub)
_binary("Mul", torch.mul)
_binary("Equal", torch.eq)
_binary("Greater", torch.gt)
_binary("Less", torch.lt)
_binary("GreaterOrEqual", torch.ge)
_binary("LessOrEqual", torch.le)
_binary("And", torch.logical_and)
_binary("Or", torch.logical_or)
_binary("Xor", torch.logical_xor)


@_op("Div")
def _div(ins, attrs, n):
    a, b = ins
    if a.dtype.is_floating_point:
        return [torch.div(a, b)]
    return [torch.div(a, b, rounding_mode="trunc")]


@_op("Mod")
def _mod(ins, attrs, n):
    a, b = ins
    if int(attrs.get("fmod", 0)) or a.dtype.is_floating_point:
        return [torch.fmod(a, b)]
    return [torch.remainder(a, b)]  # integer Mod with fmod=0 takes the divisor's sign, like Python


@_op("Pow")
def _pow(ins, attrs, n):
    base, exponent = ins
    # ONNX: the result has the base's type (the exponent may be an int tensor).
    return [torch.pow(base, exponent).to(base.dtype)]


def _variadic(name: str, fn):
    def run(ins, attrs, n):
        result = ins[0]
        for other in ins[1:]:
            result = fn(result, other)
        return [result]

    OPS[name] = OpDef(run)


_variadic("Max", torch.maximum)  # NaN propagates, as in ONNX Runtime
_variadic("Min", torch.minimum)
_variadic("Sum", torch.add)


@_op("Mean")
def _mean(ins, attrs, n):
    total = ins[0]
    for other in ins[1:]:
        total = total + other
    return [total / len(ins)]


@_op("Where")
def _where(ins, attrs, n):
    return [torch.where(ins[0], ins[1], ins[2])]


@_op("Clip")
def _clip(ins, attrs, n):
    x = ins[0]
    lo = ins[1] if len(ins) > 1 and ins[1] is not None else attrs.get("min")
    hi = ins[2] if len(ins) > 2 and ins[2] is not None else attrs.get("max")
    if lo is not None:
        x = torch.maximum(x, lo) if isinstance(lo, torch.Tensor) else torch.clamp(x, min=float(lo))
    if hi is not None:
        x = torch.minimum(x, hi) if isinstance(hi, torch.Tensor) else torch.clamp(x, max=float(hi))
    return [x]


@_op("Cast")
def _cast(ins, attrs, n):
    return [ins[0].to(torch_dtype(attrs["to"], "Cast 'to'"))]


@_op("CastLike")
def _cast_like(ins, attrs, n):
    return [ins[0].to(ins[1].dtype)]


# ---------------------------------------------------------------------------------------------
# linear algebra


@_op("Gemm")
def _gemm(ins, attrs, n):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha = float(attrs.get("alpha", 1.0))
    beta = float(attrs.get("beta", 1.0))
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    if trans_a:
        a = a.t()
    if trans_b and alpha == 1.0 and (c is None or (beta == 1.0 and c.dim() <= 1)):
        # y = a bᵀ + c in one cuBLAS call with the bias fused (the usual nn.Linear export).
        return [F.linear(a, b, c)]
    if trans_b:
        b = b.t()
    y = a @ b
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + (c if beta == 1.0 else beta * c)
    return [y]


@_op("MatMul")
def _matmul(ins, attrs, n):
    return [torch.matmul(ins[0], ins[1])]


@_op("Einsum")
def _einsum(ins, attrs, n):
    return [torch.einsum(attrs["equation"], *ins)]


def _conv_check(attrs, n_inputs):
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"auto_pad={attrs['auto_pad']} is not supported (export with explicit pads)"
    if len(attrs.get("kernel_shape", [0])) not in (1, 2, 3):
        return "only 1-D, 2-D and 3-D convolutions are supported"
    return None


@_op("Conv", check=_conv_check)
def _conv(ins, attrs, n):
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    dims = w.dim() - 2
    strides = attrs.get("strides") or [1] * dims
    dilations = attrs.get("dilations") or [1] * dims
    pads = attrs.get("pads") or [0] * (2 * dims)
    groups = int(attrs.get("group", 1))
    begin, end = list(pads[:dims]), list(pads[dims:])
    if begin != end:
        # torch pads symmetrically; pad explicitly first (F.pad takes the last dim first).
        flat = []
        for b_, e_ in zip(reversed(begin), reversed(end)):
            flat += [int(b_), int(e_)]
        x = F.pad(x, flat)
        padding = [0] * dims
    else:
        padding = [int(p) for p in begin]
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
    return [
        conv(
            x,
            w,
            bias,
            stride=[int(s) for s in strides],
            padding=padding,
            dilation=[int(d) for d in dilations],
            groups=groups,
        )
    ]


# ---------------------------------------------------------------------------------------------
# normalisation and softmax


@_op("Softmax")
def _softmax(ins, attrs, n):
    return [torch.softmax(ins[0], dim=int(attrs.get("axis", -1)))]


@_op("LogSoftmax")
def _log_softmax(ins, attrs, n):
    return [torch.log_softmax(ins[0], dim=int(attrs.get("axis", -1)))]


@_op("LayerNormalization")
def _layer_norm(ins, attrs, n):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    axis = _axis(attrs.get("axis", -1), x.dim())
    eps = float(attrs.get("epsilon", 1e-5))
    normalized = tuple(x.shape[axis:])
    if n == 1:
        return [F.layer_norm(x, normalized, scale, bias, eps)]
    dims = tuple(range(axis, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    inv_std = torch.rsqrt((x - mean).pow(2).mean(dim=dims, keepdim=True) + eps)
    y = (x - mean) * inv_std * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv_std][:n]


def _reduce(name: str, fn):
    def run(ins, attrs, n):
        x = ins[0]
        if "axes" in attrs:
            axes = _ints(attrs["axes"])
        else:
            axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else []
        keepdims = bool(int(attrs.get("keepdims", 1)))
        if not axes:
            if int(attrs.get("noop_with_empty_axes", 0)):
                return [x]
            axes = list(range(x.dim()))
        axes = sorted(_axis(a, x.dim()) for a in axes)
        if x.dim() == 0:
            return [fn(x, None, keepdims)]
        return [fn(x, axes, keepdims)]

    OPS[name] = OpDef(run, host_inputs=(1,))


def _amax(x, axes, keepdim):
    return x if axes is None else torch.amax(x, dim=axes, keepdim=keepdim)


def _amin(x, axes, keepdim):
    return x if axes is None else torch.amin(x, dim=axes, keepdim=keepdim)


def _prod(x, axes, keepdim):
    if axes is None:
        return x
    for axis in sorted(axes, reverse=True):
        x = torch.prod(x, dim=axis, keepdim=keepdim)
    return x


_reduce("ReduceSum", lambda x, axes, k: x if axes is None else torch.sum(x, dim=axes, keepdim=k))
_reduce("ReduceMean", lambda x, axes, k: x if axes is None else torch.mean(x, dim=axes, keepdim=k))
_reduce("ReduceMax", _amax)
_reduce("ReduceMin", _amin)
_reduce("ReduceProd", _prod)
_reduce("ReduceL2", lambda x, axes, k: x.abs() if axes is None else torch.sqrt(torch.sum(x * x, dim=axes, keepdim=k)))
_reduce("ReduceL1", lambda x, axes, k: x.abs() if axes is None else torch.sum(x.abs(), dim=axes, keepdim=k))
_reduce("ReduceSumSquare", lambda x, axes, k: x * x if axes is None else torch.sum(x * x, dim=axes, keepdim=k))
_reduce("ReduceLogSumExp", lambda x, axes, k: x if axes is None else torch.logsumexp(x, dim=axes, keepdim=k))


def _arg(fn):
    def run(ins, attrs, n):
        x = ins[0]
        axis = _axis(attrs.get("axis", 0), x.dim())
        keepdims = bool(int(attrs.get("keepdims", 1)))
        if int(attrs.get("select_last_index", 0)):
            flipped = torch.flip(x, dims=[axis])
            index = fn(flipped, dim=axis, keepdim=keepdims)
            return [x.shape[axis] - 1 - index]
        return [fn(x, dim=axis, keepdim=keepdims)]

    return run


OPS["ArgMax"] = OpDef(_arg(torch.argmax))
OPS["ArgMin"] = OpDef(_arg(torch.argmin))


@_op("CumSum", host_inputs=(1,))
def _cumsum(ins, attrs, n):
    x = ins[0]
    axis = _axis(_ints(ins[1])[0], x.dim())
    if int(attrs.get("reverse", 0)):
        x = torch.flip(x, dims=[axis])
    y = torch.cumsum(x, dim=axis)
    if int(attrs.get("exclusive", 0)):
        y = y - x
    if int(attrs.get("reverse", 0)):
        y = torch.flip(y, dims=[axis])
    return [y]


# ---------------------------------------------------------------------------------------------
# shapes, indexing and data movement


@_op("Shape")
def _shape(ins, attrs, n):
    dims = list(ins[0].shape)
    rank = len(dims)
    start = attrs.get("start", 0)
    end = attrs.get("end", rank)
    start = min(max(_axis(start, rank), 0), rank)
    end = min(max(_axis(end, rank), 0), rank)
    return [torch.tensor(dims[start:end], dtype=torch.int64, device=ins[0].device)]


@_op("Size")
def _size(ins, attrs, n):
    return [torch.tensor(ins[0].numel(), dtype=torch.int64, device=ins[0].device)]


def _constant_value(attrs) -> Any:
    from onnx import numpy_helper

    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    if "value_float" in attrs:
        return np.array(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(attrs["value_floats"], dtype=np.float32)
    if "value_int" in attrs:
        return np.array(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64)
    raise UnsupportedOpError(f"Constant with attributes {sorted(attrs)} is not supported (sparse/string values)")


def _constant_check(attrs, n_inputs):
    if not any(k in attrs for k in ("value", "value_float", "value_floats", "value_int", "value_ints")):
        return f"Constant with attributes {sorted(attrs)} is not supported (sparse/string values)"
    return None


@_op("Constant", check=_constant_check)
def _constant(ins, attrs, n):
    # Evaluated once at build time (a node without inputs is folded); the executor moves the
    # result to the engine's device.
    return [tensor_from_numpy(_constant_value(attrs))]


@_op("ConstantOfShape", host_inputs=(0,))
def _constant_of_shape(ins, attrs, n):
    from onnx import numpy_helper

    shape = _ints(ins[0])
    if "value" in attrs:
        value = numpy_helper.to_array(attrs["value"]).reshape(-1)
        dtype = torch.from_numpy(np.array(value)).dtype
        fill = value[0].item()
    else:
        dtype, fill = torch.float32, 0.0
    return [torch.full(shape, fill, dtype=dtype)]


@_op("Range", host_inputs=(0, 1, 2))
def _range(ins, attrs, n):
    start, limit, delta = (np.asarray(v).reshape(()) for v in ins)
    dtype = torch.from_numpy(np.array(start)).dtype
    count = max(int(math.ceil((limit.item() - start.item()) / delta.item())), 0)
    return [torch.arange(count, dtype=torch.float64).mul(delta.item()).add(start.item()).to(dtype)]


@_op("Reshape", host_inputs=(1,))
def _reshape(ins, attrs, n):
    x, shape = ins[0], _ints(ins[1])
    allow_zero = int(attrs.get("allowzero", 0))
    if not allow_zero:
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@_op("Flatten")
def _flatten(ins, attrs, n):
    x = ins[0]
    axis = _axis(attrs.get("axis", 1), x.dim())
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [x.reshape(outer, -1) if x.numel() else x.reshape(outer, int(np.prod(x.shape[axis:], dtype=np.int64)))]


@_op("Transpose")
def _transpose(ins, attrs, n):
    x = ins[0]
    perm = attrs.get("perm") or list(reversed(range(x.dim())))
    return [x.permute([int(p) for p in perm])]


@_op("Squeeze", host_inputs=(1,))
def _squeeze(ins, attrs, n):
    x = ins[0]
    if "axes" in attrs:
        axes = _ints(attrs["axes"])
    else:
        axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else []
    if not axes:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = sorted(_axis(a, x.dim()) for a in axes)
    for axis in axes:
        if x.shape[axis] != 1:
            raise UnsupportedOpError(f"Squeeze: axis {axis} of shape {list(x.shape)} is not 1")
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return [x.reshape(shape)]


@_op("Unsqueeze", host_inputs=(1,))
def _unsqueeze(ins, attrs, n):
    x = ins[0]
    axes = _ints(attrs["axes"]) if "axes" in attrs else _ints(ins[1])
    rank = x.dim() + len(axes)
    axes = sorted(_axis(a, rank) for a in axes)
    shape = list(x.shape)
    for axis in axes:
        shape.insert(axis, 1)
    return [x.reshape(shape)]


@_op("Concat")
def _concat(ins, attrs, n):
    tensors = [t for t in ins if t is not None]
    axis = _axis(attrs["axis"], tensors[0].dim())
    return [torch.cat(tensors, dim=axis)]


@_op("Split", host_inputs=(1,))
def _split(ins, attrs, n):
    x = ins[0]
    axis = _axis(attrs.get("axis", 0), x.dim())
    if len(ins) > 1 and ins[1] is not None:
        sizes = _ints(ins[1])
    elif "split" in attrs:
        sizes = _ints(attrs["split"])
    else:
        parts = int(attrs.get("num_outputs", n))
        chunk = -(-x.shape[axis] // parts)  # ceil: the last part may be smaller (opset 18)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
    return list(torch.split(x, sizes, dim=axis))


@_op("Slice", host_inputs=(1, 2, 3, 4))
def _slice(ins, attrs, n):
    x = ins[0]
    if "starts" in attrs:  # opset 1
        starts, ends, axes, steps = _ints(attrs["starts"]), _ints(attrs["ends"]), _ints(attrs.get("axes")), []
    else:
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else []
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else []
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index: list = [slice(None)] * x.dim()
    flips = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, x.dim())
        dim = x.shape[axis]
        if step == 0:
            raise UnsupportedOpError("Slice: step 0")
        start, end = slice_bounds(start, end, step, dim)
        if step > 0:
            index[axis] = slice(start, end, step)
        else:
            # torch has no negative-step slicing: take the mirrored positive slice then flip.
            if start <= end:
                index[axis] = slice(0, 0)
            else:
                count = (start - end - 1) // (-step) + 1
                first = start - (count - 1) * (-step)
                index[axis] = slice(first, start + 1, -step)
                flips.append(axis)
    y = x[tuple(index)]
    if flips:
        y = torch.flip(y, dims=flips)
    return [y]


@_op("Gather")
def _gather(ins, attrs, n):
    data, indices = ins
    axis = _axis(attrs.get("axis", 0), data.dim())
    dim = data.shape[axis]
    indices = indices.long()
    indices = torch.where(indices < 0, indices + dim, indices)  # negative indices count from the end
    flat = torch.index_select(data, axis, indices.reshape(-1))
    shape = list(data.shape[:axis]) + list(indices.shape) + list(data.shape[axis + 1 :])
    return [flat.reshape(shape)]


@_op("GatherElements")
def _gather_elements(ins, attrs, n):
    data, indices = ins
    axis = _axis(attrs.get("axis", 0), data.dim())
    indices = indices.long()
    indices = torch.where(indices < 0, indices + data.shape[axis], indices)
    return [torch.gather(data, axis, indices)]


def _scatter_nd_check(attrs, n_inputs):
    reduction = attrs.get("reduction", "none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("none", "add"):
        return f"ScatterND reduction={reduction} is not supported (none, add are)"
    return None


@_op("ScatterND", check=_scatter_nd_check)
def _scatter_nd(ins, attrs, n):
    # Output-stacking writes (`out[:, t] = h`) reach the engine as ScatterND; index_put_ keeps
    # them inside the captured graph (no host round trip for the indices).
    data, indices, updates = ins
    indices = indices.long()
    k = indices.shape[-1]
    # negative indices count from the end; each axis's size goes in as a scalar (a tensor made from
    # the shape would be a host-to-device copy, which a CUDA graph capture refuses)
    index = tuple(torch.where(indices[..., j] < 0, indices[..., j] + data.shape[j], indices[..., j]) for j in range(k))
    reduction = attrs.get("reduction", "none")
    accumulate = (reduction.decode() if isinstance(reduction, bytes) else reduction) == "add"
    out = data.clone()
    out.index_put_(index, updates.to(out.dtype), accumulate=accumulate)
    return [out]


@_op("Expand", host_inputs=(1,))
def _expand(ins, attrs, n):
    x, shape = ins[0], _ints(ins[1])
    # ONNX Expand broadcasts both ways (a 1 in `shape` keeps x's dim).
    out = np.broadcast_shapes(tuple(x.shape), tuple(shape))
    return [x.expand(out)]


@_op("Tile", host_inputs=(1,))
def _tile(ins, attrs, n):
    return [ins[0].repeat(_ints(ins[1]))]


def _pad_check(attrs, n_inputs):
    mode = attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return f"Pad mode={mode} is not supported"
    return None


@_op("Pad", host_inputs=(1, 2, 3), check=_pad_check)
def _pad(ins, attrs, n):
    x = ins[0]
    rank = x.dim()
    pads = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else _ints(attrs.get("pads"))
    value = 0.0
    if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size:
        value = np.asarray(ins[2]).reshape(-1)[0].item()
    elif "value" in attrs:
        value = float(attrs["value"])
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(rank))
    axes = [_axis(a, rank) for a in axes]
    begin, end = pads[: len(axes)], pads[len(axes) :]
    per_axis = {axis: (b, e) for axis, b, e in zip(axes, begin, end)}
    flat: list[int] = []
    for axis in range(rank - 1, -1, -1):  # F.pad takes the last dim first
        flat += list(per_axis.get(axis, (0, 0)))
    while flat and flat[-2:] == [0, 0]:  # leading axes without padding need no entry
        flat = flat[:-2]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[attrs.get("mode", "constant")]
    if not any(flat):
        return [x]
    if mode == "constant":
        return [F.pad(x, flat, mode="constant", value=value)]
    return [F.pad(x, flat, mode=mode)]


@_op("Trilu", host_inputs=(1,))
def _trilu(ins, attrs, n):
    x = ins[0]
    k = _ints(ins[1])[0] if len(ins) > 1 and ins[1] is not None else 0
    return [torch.triu(x, k) if int(attrs.get("upper", 1)) else torch.tril(x, k)]


# ---------------------------------------------------------------------------------------------
# ONNX LSTM / GRU / RNN (forward, reverse, bidirectional; default activations, RNN's also Relu and
# Sigmoid): a plain loop over time,
# so the engine also runs graphs the rewrite left unfused.


def _rnn_check(gates: int):
    def check(attrs, n_inputs):
        if attrs.get("activations") not in (None, []):
            default = ["Sigmoid", "Tanh", "Tanh"] if gates == 4 else ["Sigmoid", "Tanh"]
            given = [a.decode() if isinstance(a, bytes) else a for a in attrs["activations"]]
            if given not in (default, default * 2):
                return f"activations {given} are not supported (only the defaults {default})"
        if attrs.get("clip") is not None:
            return "clip is not supported"
        if int(attrs.get("input_forget", 0)):
            return "input_forget=1 is not supported"
        if int(attrs.get("layout", 0)):
            return "layout=1 is not supported"
        if gates == 4 and n_inputs > 7:
            return "peephole weights (input P) are not supported"
        return None

    return check


def _directions(attrs) -> list[bool]:
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]


def _rnn_common(ins, hidden: int, gates: int):
    x, w, r = ins[0], ins[1], ins[2]
    b = ins[3] if len(ins) > 3 else None
    seq_lens = ins[4] if len(ins) > 4 else None
    if seq_lens is not None:
        lens = np.asarray(seq_lens).reshape(-1)
        if (lens != x.shape[0]).any():
            raise UnsupportedOpError(f"sequence_lens {lens.tolist()} shorter than T={x.shape[0]} are not supported")
    return x, w, r, b


_ELMAN_ACTIVATIONS = {"Tanh": torch.tanh, "Relu": torch.relu, "Sigmoid": torch.sigmoid}


def _elman_check(attrs, n_inputs):
    given = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations") or []]
    unknown = [a for a in given if a not in _ELMAN_ACTIVATIONS]
    if unknown:
        return f"activations {given} are not supported (only {sorted(_ELMAN_ACTIVATIONS)})"
    if given and len(given) not in (1, len(_directions(attrs))):
        return f"activations {given}: one, or one a direction"
    if attrs.get("clip") is not None:
        return "clip is not supported"
    if int(attrs.get("layout", 0)):
        return "layout=1 is not supported"
    return None


@_op("RNN", host_inputs=(4,), check=_elman_check)
def _elman(ins, attrs, n):
    """ONNX RNN (nn.RNN's export): h = act(x·Wᵀ + h·Rᵀ + Wb + Rb) per direction."""
    x, w, r, b = _rnn_common(ins, int(attrs["hidden_size"]), 1)
    h0 = ins[5] if len(ins) > 5 else None
    hidden = int(attrs["hidden_size"])
    steps, batch = x.shape[0], x.shape[1]
    directions = _directions(attrs)
    given = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations") or ["Tanh"]]
    given = given * len(directions) if len(given) == 1 else given
    ys, hs = [], []
    for d, reverse in enumerate(directions):
        act = _ELMAN_ACTIVATIONS[given[d]]
        xw = torch.matmul(x, w[d].t())  # [T, B, H], all frames at once
        if b is not None:
            xw = xw + b[d, :hidden] + b[d, hidden:]
        h = h0[d] if h0 is not None else x.new_zeros(batch, hidden)
        outs = [None] * steps
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            h = act(xw[t] + h @ r[d].t())
            outs[t] = h
        ys.append(torch.stack(outs, dim=0))
        hs.append(h)
    return [torch.stack(ys, dim=1), torch.stack(hs, 0)][:n]


@_op("LSTM", host_inputs=(4,), check=_rnn_check(4))
def _lstm(ins, attrs, n):
    x, w, r, b = _rnn_common(ins, int(attrs["hidden_size"]), 4)
    h0 = ins[5] if len(ins) > 5 else None
    c0 = ins[6] if len(ins) > 6 else None
    hidden = int(attrs["hidden_size"])
    steps, batch = x.shape[0], x.shape[1]
    ys, hs, cs = [], [], []
    for d, reverse in enumerate(_directions(attrs)):
        xw = torch.matmul(x, w[d].t())  # [T, B, 4H], all frames at once
        if b is not None:
            xw = xw + b[d, : 4 * hidden] + b[d, 4 * hidden :]
        h = h0[d] if h0 is not None else x.new_zeros(batch, hidden)
        c = c0[d] if c0 is not None else x.new_zeros(batch, hidden)
        outs = [None] * steps
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            g = xw[t] + h @ r[d].t()
            i, o, f, cc = g.split(hidden, dim=-1)  # ONNX gate order i, o, f, c
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cc)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs[t] = h
        ys.append(torch.stack(outs, dim=0))
        hs.append(h)
        cs.append(c)
    y = torch.stack(ys, dim=1)  # [T, D, B, H]
    return [y, torch.stack(hs, 0), torch.stack(cs, 0)][:n]


@_op("GRU", host_inputs=(4,), check=_rnn_check(3))
def _gru(ins, attrs, n):
    x, w, r, b = _rnn_common(ins, int(attrs["hidden_size"]), 3)
    h0 = ins[5] if len(ins) > 5 else None
    hidden = int(attrs["hidden_size"])
    linear_before_reset = int(attrs.get("linear_before_reset", 0))
    steps, batch = x.shape[0], x.shape[1]
    ys, hs = [], []
    for d, reverse in enumerate(_directions(attrs)):
        xw = torch.matmul(x, w[d].t())  # [T, B, 3H]
        wb = b[d, : 3 * hidden] if b is not None else None
        rb = b[d, 3 * hidden :] if b is not None else None
        if wb is not None:
            xw = xw + wb
        r_z, r_r, r_h = r[d].split(hidden, dim=0)  # ONNX gate order z, r, h
        rb_z, rb_r, rb_h = rb.split(hidden) if rb is not None else (0.0, 0.0, 0.0)
        h = h0[d] if h0 is not None else x.new_zeros(batch, hidden)
        outs = [None] * steps
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            xz, xr, xh = xw[t].split(hidden, dim=-1)
            z = torch.sigmoid(xz + h @ r_z.t() + rb_z)
            rr = torch.sigmoid(xr + h @ r_r.t() + rb_r)
            if linear_before_reset:
                hh = torch.tanh(xh + rr * (h @ r_h.t() + rb_h))
            else:
                hh = torch.tanh(xh + (rr * h) @ r_h.t() + rb_h)
            h = (1 - z) * hh + z * h
            outs[t] = h
        ys.append(torch.stack(outs, dim=0))
        hs.append(h)
    y = torch.stack(ys, dim=1)
    return [y, torch.stack(hs, 0)][:n]


def supported_op_types() -> list[str]:
    return sorted(OPS)


# ---------------------------------------------------------------------------------------------
# quantization (framefuse.precision int8 graphs). A DequantizeLinear of a constant int8 weight is
# all-constant, so the executor folds it at planning time: the weight is dequantised once at load and
# the GEMM runs in the activation dtype. Activation QuantizeLinear → DequantizeLinear pairs run for
# real every frame (round, saturate, rescale: fake quantisation in torch), so the engine sees the
# same rounding error ONNX Runtime and TensorRT do.

_QRANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int16: (-32768, 32767)}


def _q_check(attrs, n_inputs):
    if int(attrs.get("block_size", 0) or 0) != 0:
        return "blocked quantization (block_size) is not supported"
    if int(attrs.get("saturate", 1)) != 1:
        return "saturate=0 is for float8 types, which the engine does not run"
    return None


def _q_broadcast(param: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    """A per-tensor parameter as is; a per-axis one shaped to broadcast along ``axis``."""
    if param.dim() == 0:
        return param
    shape = [1] * x.dim()
    shape[_axis(axis, x.dim())] = param.numel()
    return param.reshape(shape)


@_op("QuantizeLinear", check=_q_check)
def _quantize_linear(ins, attrs, n):
    x, scale = ins[0], ins[1]
    zero = ins[2] if len(ins) > 2 and ins[2] is not None else None
    out_dtype = zero.dtype if zero is not None else torch.uint8
    if out_dtype not in _QRANGE:
        raise UnsupportedOpError(f"QuantizeLinear to {out_dtype} is not supported (int8, uint8, int16)")
    axis = int(attrs.get("axis", 1))
    compute = torch.float32
    s = _q_broadcast(scale.to(compute), x, axis)
    q = torch.round(x.to(compute) / s)  # round half to even, as ONNX
    if zero is not None:
        q = q + _q_broadcast(zero.to(compute), x, axis)
    lo, hi = _QRANGE[out_dtype]
    return [q.clamp(lo, hi).to(out_dtype)]


@_op("DequantizeLinear", check=_q_check)
def _dequantize_linear(ins, attrs, n):
    x, scale = ins[0], ins[1]
    zero = ins[2] if len(ins) > 2 and ins[2] is not None else None
    axis = int(attrs.get("axis", 1))
    y = x.to(torch.float32)
    if zero is not None:
        y = y - _q_broadcast(zero.to(torch.float32), x, axis)
    y = y * _q_broadcast(scale.to(torch.float32), x, axis)
    return [y.to(scale.dtype)]


# ---------------------------------------------------------------------------------------------
# bfloat16 constants: numpy has no bfloat16 (onnx reads one as ml_dtypes.bfloat16, which torch
# cannot wrap), so bf16 values cross between numpy and torch as their 16-bit patterns.


def tensor_from_numpy(value: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` that also takes ml_dtypes.bfloat16 arrays (a copy, never a view)."""
    value = np.array(value, copy=True)
    if value.dtype.name == "bfloat16":
        return torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(value)


def tensor_to_proto(tensor: torch.Tensor, name: str):
    """An ONNX initializer from a torch tensor, bfloat16 included."""
    from onnx import TensorProto, numpy_helper

    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype != torch.bfloat16:
        return numpy_helper.from_array(tensor.numpy(), name)
    proto = TensorProto()
    proto.name = name
    proto.data_type = TensorProto.BFLOAT16
    proto.dims.extend(tensor.shape)
    proto.raw_data = tensor.view(torch.int16).numpy().tobytes()
    return proto
