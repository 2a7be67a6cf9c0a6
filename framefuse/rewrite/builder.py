"""GraphBuilder: the one way a rewrite pass adds nodes to an onnx-graphsurgeon graph.

Every pass (the graph passes in ``framefuse.rewrite`` and the unrolled-recurrence passes in
``framefuse.rewrite.unrolled``) holds a builder for the graph it edits and adds its glue nodes
through it, so that every new tensor carries a shape and a dtype (later passes and the engines
read static shapes without re-running inference) and every new node is recorded in
``new_nodes`` (the unrolled passes take the nodes of a declined candidate back out of the graph,
and ``graphutil.replace_producer`` lets a node it built write a kept tensor directly).

What the helpers do, and why:

* Output shapes and dtypes are inferred from the inputs' static shapes when the caller does not
  give them (an explicit ``shape``/``dtype`` wins: the unrolled passes know shapes from ONNX
  shape inference that the gs tensors do not carry). Unknown stays ``None``.
* ``squeeze``, ``transpose``, ``reshape``, ``gather`` and ``cast`` of a constant are folded into
  a new constant rather than a node: the graph passes relied on this (a weight sliced per
  direction, a constant mask reshaped), and the fused graph has no node that only moves a
  constant around.
* No-ops add no node: an identity ``transpose`` permutation, a ``reshape`` to the shape the
  tensor already has and a ``cast`` to its own dtype return the input itself. Of the two
  builders this one replaces, the unrolled passes' skipped identity transposes and the graph
  passes' skipped same-shape reshapes and same-dtype casts; both skips are kept, for every pass
  (a skipped no-op changes no fused op and no value). ``expand`` always adds its node, as the
  unrolled passes' builder did (skipping it would drop Expand nodes from the Mamba graphs).
* Constant folding was the graph passes' builder's; the unrolled passes' did not fold, and now
  do (a constant weight reshaped for a fused op becomes a reshaped constant, not a Reshape node).
* Names: a node is ``<prefix>/<op>_<n>`` (``<op>_<n>`` without a prefix), its outputs
  ``<node name>_out<i>``, a constant ``<prefix>/<name>_<n>``; the counter is the context's
  ``unique_name``, so names are unique within a rewrite. No test or pass reads these names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import RewriteContext
from framefuse.rewrite.util import const_value, np_dtype, static_shape

# Ops whose output has the first input's shape and dtype.
_UNARY = frozenset(
    "Identity Neg Abs Exp Log Sqrt Reciprocal Sigmoid Tanh Relu Softplus Erf Sin Cos Floor Ceil Softmax".split()
)
# Ops whose output is the broadcast of the inputs, with the first input's dtype.
_BROADCAST = frozenset("Add Sub Mul Div Pow Max Min".split())


def _i64(values) -> np.ndarray:
    return np.asarray(list(values) if not np.isscalar(values) else [values], dtype=np.int64)


def _or(given, inferred):
    """``given`` unless it is None (not ``or``: a numpy dtype has len() 0, so is falsy)."""
    return inferred if given is None else given


def _axes(axes, rank: int | None) -> list[int] | None:
    """``axes`` (an int or a sequence) as a sorted list of non-negative axes of a tensor of
    ``rank`` (left as given when a negative axis meets an unknown rank)."""
    axes = [int(a) for a in ([axes] if np.isscalar(axes) else axes)]
    if any(a < 0 for a in axes) and rank is not None:
        axes = [a % rank for a in axes]
    return sorted(axes)


def _broadcast(shapes) -> tuple[int, ...] | None:
    if any(s is None for s in shapes):
        return None
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _reshape_target(shape: tuple[int, ...] | None, target: Sequence[int]) -> tuple[int, ...] | None:
    """The output shape of ONNX Reshape(``shape`` → ``target``): 0 copies the input's dim, -1
    takes the rest (None when that needs an unknown input shape)."""
    target = [int(d) for d in target]
    if all(d > 0 for d in target):
        return tuple(target)
    if shape is None:
        return None
    out = [shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(shape)) // max(known, 1)
    return tuple(out)


class GraphBuilder:
    """Adds nodes and constants to ``graph`` (names from ``ctx``, under ``prefix`` when given) and
    records the nodes it adds in ``new_nodes``. See the module docstring for what the shape-aware
    helpers infer, fold and skip."""

    def __init__(self, graph: gs.Graph, ctx: RewriteContext, prefix: str | None = None):
        self.graph = graph
        self.ctx = ctx
        self.prefix = prefix
        self.new_nodes: list[gs.Node] = []

    def unique_name(self, base: str) -> str:
        """A name for a new node or tensor: ``<prefix>/<base>_<n>``."""
        return self.ctx.unique_name(f"{self.prefix}/{base}" if self.prefix else base)

    # -- tensors ---------------------------------------------------------------------------

    def const(self, value, dtype=None, name: str = "const") -> gs.Constant:
        """A constant of ``value`` (a 0-d value stays 0-d)."""
        return gs.Constant(self.unique_name(name), np.array(value, dtype=dtype, order="C"))

    def ints(self, values, name: str = "ints") -> gs.Constant:
        """A 1-d int64 constant (axes, shapes, slice bounds)."""
        return self.const(_i64(values), name=name)

    def var(self, name: str, dtype, shape) -> gs.Variable:
        """A new Variable (a fused node's output, before the node exists)."""
        return gs.Variable(self.unique_name(name), dtype=dtype, shape=None if shape is None else list(shape))

    # -- the general node ------------------------------------------------------------------

    def node(
        self,
        op: str,
        inputs: list,
        shape=None,
        dtype=None,
        attrs=None,
        n_out: int = 1,
        out_shapes=None,
        domain: str | None = None,
        name: str | None = None,
        out_dtypes=None,
    ) -> gs.Variable | list[gs.Variable]:
        """Append a node ``op`` reading ``inputs`` and return its output (a list when ``n_out`` >
        1). Output shapes: ``out_shapes`` (one per output), else ``shape`` for every output,
        else, for one output of a default-domain elementwise op, inferred from the inputs;
        dtypes likewise (``out_dtypes``, ``dtype``, else the first input's for those ops)."""
        node_name = self.unique_name(name or op)
        if out_shapes is None:
            if shape is None and n_out == 1 and domain in (None, "") and inputs:
                if op in _UNARY:
                    shape = static_shape(inputs[0])
                elif op in _BROADCAST:
                    shape = _broadcast([static_shape(t) for t in inputs])
            out_shapes = [shape] * n_out
        if out_dtypes is None:
            if dtype is None and domain in (None, "") and inputs and op in _UNARY | _BROADCAST:
                dtype = np_dtype(inputs[0])
            out_dtypes = [dtype] * len(out_shapes)
        outs = [
            gs.Variable(f"{node_name}_out{i}", dtype=d, shape=None if s is None else list(s))
            for i, (s, d) in enumerate(zip(out_shapes, out_dtypes))
        ]
        node = gs.Node(op=op, name=node_name, attrs=dict(attrs or {}), inputs=list(inputs), outputs=outs)
        if domain is not None:
            node.domain = domain
        self.graph.nodes.append(node)
        self.new_nodes.append(node)
        return outs[0] if len(outs) == 1 else outs

    # -- shape-aware helpers ---------------------------------------------------------------

    def squeeze(self, t: gs.Tensor, axes, shape=None, dtype=None) -> gs.Tensor:
        """``t`` without the (size-1) ``axes``; folded for constants."""
        in_shape = static_shape(t)
        axes = _axes(axes, None if in_shape is None else len(in_shape))
        value = const_value(t)
        if value is not None:
            return self.const(np.squeeze(value, axis=tuple(axes)), name="squeezed")
        if shape is None and in_shape is not None:
            shape = tuple(d for i, d in enumerate(in_shape) if i not in axes)
        return self.node("Squeeze", [t, self.ints(axes, "axes")], shape, _or(dtype, np_dtype(t)))

    def unsqueeze(self, t: gs.Tensor, axes, shape=None, dtype=None) -> gs.Tensor:
        """``t`` with new size-1 ``axes`` (positions in the output)."""
        in_shape = static_shape(t)
        n_axes = 1 if np.isscalar(axes) else len(axes)
        out_axes = _axes(axes, None if in_shape is None else len(in_shape) + n_axes)
        if shape is None and in_shape is not None:
            rest = iter(in_shape)
            shape = tuple(1 if i in out_axes else next(rest) for i in range(len(in_shape) + n_axes))
        return self.node("Unsqueeze", [t, self.ints(out_axes, "axes")], shape, _or(dtype, np_dtype(t)))

    def transpose(self, t: gs.Tensor, perm, shape=None, dtype=None) -> gs.Tensor:
        """``t`` with its axes permuted; ``t`` itself for the identity, folded for constants."""
        perm = [int(p) for p in perm]
        if perm == list(range(len(perm))):
            return t
        value = const_value(t)
        if value is not None:
            return self.const(np.transpose(value, perm), name="transposed")
        in_shape = static_shape(t)
        if shape is None and in_shape is not None:
            shape = tuple(in_shape[p] for p in perm)
        return self.node("Transpose", [t], shape, _or(dtype, np_dtype(t)), attrs={"perm": perm})

    def reshape(self, t: gs.Tensor, target, dtype=None) -> gs.Tensor:
        """``t`` reshaped to ``target`` (ONNX Reshape's 0 and -1 allowed); ``t`` itself when it
        has that shape already, folded for constants."""
        target = [int(d) for d in target]
        in_shape = static_shape(t)
        shape = _reshape_target(in_shape, target)
        if in_shape is not None and in_shape == shape:
            return t
        value = const_value(t)
        if value is not None and shape is not None:
            return self.const(value.reshape(shape), name="reshaped")
        return self.node("Reshape", [t, self.ints(target, "shape")], shape, _or(dtype, np_dtype(t)))

    def expand(self, t: gs.Tensor, target, dtype=None) -> gs.Tensor:
        """``t`` broadcast to ``target`` (always a node, even to the shape ``t`` has: neither old
        builder skipped it, and the fused graphs keep their op counts)."""
        target = tuple(int(d) for d in target)
        in_shape = static_shape(t)
        shape = target if in_shape is None else _broadcast([in_shape, target])
        return self.node("Expand", [t, self.ints(target, "shape")], shape, _or(dtype, np_dtype(t)))

    def gather(self, t: gs.Tensor, index: int, axis: int = 0, shape=None, dtype=None) -> gs.Tensor:
        """``t[index]`` along ``axis`` (the axis disappears); folded for constants."""
        value = const_value(t)
        if value is not None:
            return self.const(np.take(value, index, axis=axis), name="taken")
        in_shape = static_shape(t)
        if shape is None and in_shape is not None:
            axis_ = axis % len(in_shape)
            shape = in_shape[:axis_] + in_shape[axis_ + 1 :]
        index_t = self.const(np.asarray(index, dtype=np.int64), name="index")
        return self.node("Gather", [t, index_t], shape, _or(dtype, np_dtype(t)), attrs={"axis": int(axis)})

    def reverse(self, t: gs.Tensor, axis: int, length: int | None = None) -> gs.Tensor:
        """``t`` reversed along ``axis`` (of static size ``length``), via Slice with step -1."""
        in_shape = static_shape(t)
        if length is None:
            length = in_shape[axis]
        inputs = [t, self.ints([length - 1]), self.ints([-length - 1]), self.ints([axis]), self.ints([-1])]
        return self.node("Slice", inputs, in_shape, np_dtype(t))

    def concat(self, tensors: list[gs.Tensor], axis: int, shape=None, dtype=None) -> gs.Tensor:
        """``tensors`` joined along ``axis``."""
        shapes = [static_shape(t) for t in tensors]
        if shape is None and all(s is not None for s in shapes):
            a = axis % len(shapes[0])
            shape = list(shapes[0])
            shape[a] = sum(s[a] for s in shapes)
        return self.node("Concat", list(tensors), shape, _or(dtype, np_dtype(tensors[0])), attrs={"axis": int(axis)})

    def cast(self, t: gs.Tensor, dtype) -> gs.Tensor:
        """``t`` as ``dtype`` (a numpy dtype); ``t`` itself when it already is, folded for
        constants."""
        dtype = np.dtype(dtype)
        if np_dtype(t) == dtype:
            return t
        value = const_value(t)
        if value is not None:
            return self.const(value.astype(dtype), name="cast")
        to = int(onnx.helper.np_dtype_to_tensor_dtype(dtype))
        return self.node("Cast", [t], static_shape(t), dtype, attrs={"to": to})

    def where(self, cond: gs.Tensor, x: gs.Tensor, y: gs.Tensor, *, shape=None, dtype=None) -> gs.Tensor:
        """``x`` where ``cond`` else ``y`` (shape: the broadcast of the three)."""
        if shape is None:
            shape = _broadcast([static_shape(t) for t in (cond, x, y)])
        return self.node("Where", [cond, x, y], shape, _or(dtype, np_dtype(x)))

    def scaled(self, t: gs.Tensor, scale: float, name: str = "scale") -> gs.Tensor:
        """``t`` · scale (a Mul with a float32 scalar constant), or ``t`` itself when the scale
        is 1."""
        if abs(scale - 1.0) <= 1e-6:
            return t
        return self.node("Mul", [t, self.const(np.array(scale, np.float32), name=name)], static_shape(t), np.float32)
