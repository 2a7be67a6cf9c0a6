"""Lift the T per-step copies of a state-independent subgraph into one subgraph over all steps.

A per-step tensor v_t (it depends on the slice sources of step t only) is the t-th slice of one
*lifted* tensor L = stack_t(v_t), laid out time-major: ``L.shape == [T, *v.shape]``. Two per-step
tensors are copies of the same computation when their *keys* are equal: the key is the
expression tree of the tensor with each slice source replaced by (whole tensor, axis) and each
constant by its value — the time index is left out. Lifting rewrites the expression once, op by
op, over the lifted inputs (``Gather(x, t, axis=1)`` becomes x with axis 1 moved to the front,
``Gemm`` becomes ``MatMul + Add``, axis attributes shift by one, ...). An op without a safe rule
raises ``Decline`` naming the op.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.graphutil import const_key, const_value, producer
from framefuse.rewrite.unrolled.timeline import Timeline

ELEMENTWISE = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Where",
    "Mod",
    "Sum",
    "Mean",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Neg",
    "Abs",
    "Relu",
    "Softplus",
    "Sqrt",
    "Reciprocal",
    "Erf",
    "Cast",
    "Identity",
    "LeakyRelu",
    "Elu",
    "Selu",
    "HardSigmoid",
    "HardSwish",
    "Softsign",
    "Sin",
    "Cos",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Not",
    "And",
    "Or",
    "Xor",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "IsNaN",
    "IsInf",
    "Gelu",
    "Mish",
    "Celu",
    "ThresholdedRelu",
}
# Elementwise in input 0 only; the other inputs must be static (Clip bounds, PRelu slope).
ELEMENTWISE_FIRST = {"Clip", "PRelu", "Dropout"}
REDUCE = {
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ReduceLogSum",
}


def _attr_key(value):
    if isinstance(value, gs.Constant):
        return const_key(np.asarray(value.values))
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, np.ndarray):
        return const_key(value)
    if isinstance(value, gs.Graph):
        raise Decline("node with a subgraph attribute")
    return repr(value)


def node_key(node: gs.Node) -> tuple:
    return (node.op, node.domain or "", tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())))


class Lifter:
    """Keys and lifted (time-major) versions of the per-step tensors of one Timeline."""

    def __init__(self, timeline: Timeline, emit: GraphBuilder, steps: int, first_frame: int = 0):
        self.first_frame = first_frame
        self.tl = timeline
        self.shapes = timeline.shapes
        self.emit = emit
        self.steps = steps
        self._keys: dict[str, tuple] = {}
        self._lifted: dict[tuple, gs.Tensor] = {}

    # -- keys -----------------------------------------------------------------------------------
    def static_key(self, t: gs.Tensor) -> tuple:
        value = const_value(t)
        if value is not None:
            return const_key(value)
        return ("tensor", t.name)

    def key(self, t: gs.Tensor) -> tuple:
        """Time-free identity of the computation of ``t``; raises if ``t`` is not per-step."""
        if t.name in self._keys:
            return self._keys[t.name]
        times = self.tl.time_of(t)
        if not times:
            key = ("static", self.static_key(t))
        elif len(times) > 1:
            raise Decline(
                f"tensor {t.name!r} depends on several time steps {sorted(times)}: "
                "it is state of a recurrence, not a per-step input"
            )
        elif t.name in self.tl.slices:
            src = self.tl.slices[t.name]
            key = ("slice", self.static_key(src.source), src.axis, src.keepdim)
        elif self._is_noop(producer(t)):
            key = self.key(producer(t).inputs[0])
        else:
            node = producer(t)
            index = node.outputs.index(t)
            key = (node_key(node), index, tuple(self.key(i) if i.name else None for i in node.inputs))
        self._keys[t.name] = key
        return key

    # -- lifting --------------------------------------------------------------------------------
    def lift(self, t: gs.Tensor) -> gs.Tensor:
        """The time-major lifted tensor [T, *shape(t)] of the per-step tensor ``t``."""
        key = self.key(t)
        if key[0] == "static":
            raise Decline(f"tensor {t.name!r} does not depend on a time step")
        if key in self._lifted:
            return self._lifted[key]
        if t.name in self.tl.slices:
            lifted = self._lift_slice(t)
        elif self._is_noop(producer(t)):
            lifted = self.lift(producer(t).inputs[0])
        else:
            node = producer(t)
            outs = self._lift_node(node)
            for out, lifted_out in zip(node.outputs, outs):
                if lifted_out is not None and self.tl.time_of(out):
                    self._lifted[self.key(out)] = lifted_out
            lifted = self._lifted.get(key)
            if lifted is None:
                raise Decline(f"output {t.name!r} of {node.op} node {node.name!r} could not be lifted")
        self._lifted[key] = lifted
        return lifted

    def _is_noop(self, node: gs.Node) -> bool:
        """Identity, or a Cast to the type its input already has (``.to(dtype)`` in transformers):
        copies of one computation with and without it are the same computation."""
        if node.op == "Identity":
            return True
        if node.op != "Cast" or not node.inputs:
            return False
        src, dst = self.dtype(node.inputs[0]), self.dtype(node.outputs[0])
        return src is not None and src == dst

    def shape(self, t) -> tuple[int, ...]:
        return self.shapes.need_shape(t)

    def dtype(self, t):
        return self.shapes.dtype(t)

    def _lifted_shape(self, t) -> tuple[int, ...]:
        return (self.steps, *self.shape(t))

    def _lift_slice(self, t: gs.Tensor) -> gs.Tensor:
        src = self.tl.slices[t.name]
        shape = self.shape(src.source)
        if shape[src.axis] < self.first_frame + self.steps:
            raise Decline(
                f"{t.name!r} slices a time axis of length {shape[src.axis]} of {src.source.name!r} "
                f"but the recurrence reads frames {self.first_frame}..{self.first_frame + self.steps - 1}"
            )
        rank = len(shape)
        data = src.source
        if self.tl.reverse:  # time i is frame size − 1 − i: the frames read backwards
            size = shape[src.axis]
            start = size - 1 - self.first_frame
            end = start - self.steps
            shape = tuple(self.steps if a == src.axis else d for a, d in enumerate(shape))
            data = self.emit.node(
                "Slice",
                [
                    data,
                    self.emit.ints([start]),
                    self.emit.ints([end if end >= 0 else -(1 << 62)]),  # through frame 0
                    self.emit.ints([src.axis]),
                    self.emit.ints([-1]),
                ],
                shape,
                self.dtype(t),
            )
        elif shape[src.axis] != self.steps:  # the recurrence covers part of the frames
            shape = tuple(self.steps if a == src.axis else d for a, d in enumerate(shape))
            data = self.emit.node(
                "Slice",
                [
                    data,
                    self.emit.ints([self.first_frame]),
                    self.emit.ints([self.first_frame + self.steps]),
                    self.emit.ints([src.axis]),
                ],
                shape,
                self.dtype(t),
            )
        perm = [src.axis] + [a for a in range(rank) if a != src.axis]
        moved = self.emit.transpose(data, perm, [shape[p] for p in perm], self.dtype(t))
        if src.keepdim:  # x[:, t:t+1] keeps a size-1 axis where the time axis was
            out_shape = self._lifted_shape(t)
            moved = self.emit.unsqueeze(moved, [src.axis + 1], out_shape, self.dtype(t))
        return moved

    def _align(self, t: gs.Tensor, out_rank: int) -> gs.Tensor:
        """Lifted ``t`` with size-1 axes after the time axis so it broadcasts against an output of
        rank ``out_rank`` (numpy broadcasting aligns from the right; the time axis must not)."""
        lifted = self.lift(t)
        rank = len(self.shape(t))
        if rank < out_rank:
            pad = out_rank - rank
            lifted = self.emit.unsqueeze(
                lifted, list(range(1, pad + 1)), (self.steps,) + (1,) * pad + self.shape(t), self.dtype(t)
            )
        return lifted

    def _const_ints(self, t: gs.Tensor | None, what: str, node: gs.Node) -> list[int] | None:
        if t is None or not t.name:
            return None
        value = const_value(t)
        if value is None:
            raise Decline(f"{node.op} node {node.name!r}: {what} is not a constant")
        return [int(v) for v in value.reshape(-1)]

    def _lift_node(self, node: gs.Node) -> list[gs.Tensor | None]:
        op = node.op
        per_step = [bool(i.name) and bool(self.tl.time_of(i)) for i in node.inputs]
        outs = node.outputs
        out_shapes = [self._lifted_shape(o) for o in outs]
        dtype = self.dtype(outs[0])
        attrs = dict(node.attrs)

        def emit_same(inputs, new_attrs=None):
            result = self.emit.node(
                op,
                inputs,
                dtype=dtype,
                attrs=attrs if new_attrs is None else new_attrs,
                n_out=len(outs),
                out_shapes=out_shapes,
                domain=node.domain or None,
            )
            return result if isinstance(result, list) else [result]

        if op in ELEMENTWISE or op in ELEMENTWISE_FIRST:
            if op in ELEMENTWISE_FIRST and any(per_step[1:]):
                raise Decline(f"{op} node {node.name!r} has a per-step parameter input")
            rank = len(self.shape(outs[0]))
            inputs = [self._align(i, rank) if p else i for i, p in zip(node.inputs, per_step)]
            return emit_same(inputs)

        if op == "MatMul":
            return [self._lift_matmul(node, per_step)]

        if op == "Einsum":
            equation = attrs.get("equation", "")
            equation = equation.decode() if isinstance(equation, bytes) else equation
            equation = equation.replace(" ", "")
            if "->" not in equation or "..." in equation:
                raise Decline(f"Einsum node {node.name!r}: equation {equation!r} without explicit output")
            lhs, rhs = equation.split("->")
            free = next(c for c in "tTzZyYxXwWqQ" if c not in equation)
            terms = lhs.split(",")
            new_terms = [free + term if p else term for term, p in zip(terms, per_step)]
            inputs = [self.lift(i) if p else i for i, p in zip(node.inputs, per_step)]
            return emit_same(inputs, {"equation": ",".join(new_terms) + "->" + free + rhs})

        if op == "Gemm":
            a, b = node.inputs[0], node.inputs[1]
            c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
            if not per_step[0] or per_step[1] or (c is not None and per_step[2]):
                raise Decline(f"Gemm node {node.name!r}: only the A input may be per-step")
            if int(attrs.get("transA", 0)):
                raise Decline(f"Gemm node {node.name!r} with transA=1")
            alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
            lifted_a = self.lift(a)
            w = b
            if int(attrs.get("transB", 0)):
                w_shape = self.shape(b)
                value = const_value(b)
                if value is not None:
                    w = self.emit.const(np.ascontiguousarray(value.T))
                else:
                    w = self.emit.transpose(b, [1, 0], (w_shape[1], w_shape[0]), self.dtype(b))
            y = self.emit.node("MatMul", [lifted_a, w], out_shapes[0], dtype)
            if alpha != 1.0:
                y = self.emit.node("Mul", [y, self.emit.const(np.asarray(alpha, dtype=dtype))], out_shapes[0], dtype)
            if c is not None:
                if beta != 1.0:
                    c = self.emit.node("Mul", [c, self.emit.const(np.asarray(beta, dtype=dtype))], self.shape(c), dtype)
                y = self.emit.node("Add", [y, c], out_shapes[0], dtype)
            return [y]

        if any(per_step[1:]) and op not in ("Concat",):
            raise Decline(f"{op} node {node.name!r}: a per-step tensor in a parameter input")
        in_rank = len(self.shape(node.inputs[0]))
        out_rank = len(self.shape(outs[0]))
        data = self.lift(node.inputs[0]) if per_step[0] else None

        if op in ("Unsqueeze", "Squeeze"):
            axes = self._const_ints(node.inputs[1], "axes", node) if len(node.inputs) > 1 else attrs.get("axes")
            if axes is None:
                raise Decline(f"{op} node {node.name!r} without explicit axes")
            rank = out_rank if op == "Unsqueeze" else in_rank
            axes = [a % rank + 1 for a in axes]
            return emit_same([data, self.emit.ints(axes)], {})

        if op == "Transpose":
            perm = attrs.get("perm", list(reversed(range(in_rank))))
            return emit_same([data], {"perm": [0] + [int(p) + 1 for p in perm]})

        if op == "Reshape":
            return emit_same([data, self.emit.ints(out_shapes[0])], {})

        if op == "Expand":
            pad = out_rank - in_rank
            if pad:
                data = self._align(node.inputs[0], out_rank)
            return emit_same([data, self.emit.ints(out_shapes[0])], {})

        if op == "Flatten":
            return [self.emit.node("Reshape", [data, self.emit.ints(out_shapes[0])], out_shapes[0], dtype)]

        if op in (
            "Softmax",
            "LogSoftmax",
            "Hardmax",
            "LayerNormalization",
            "Gather",
            "Split",
            "Concat",
            "ArgMax",
            "ArgMin",
        ):
            axis = int(attrs.get("axis", -1 if op in ("Softmax", "LogSoftmax", "Hardmax", "LayerNormalization") else 0))
            new_attrs = dict(attrs)
            new_attrs["axis"] = axis % (in_rank if op != "Concat" else out_rank) + 1
            if op == "Concat":
                inputs = []
                for t, p in zip(node.inputs, per_step):
                    if p:
                        inputs.append(self.lift(t))
                    else:
                        shape = self.shape(t)
                        expanded = self.emit.expand(
                            self.emit.unsqueeze(t, [0], (1, *shape), self.dtype(t)), (self.steps, *shape), self.dtype(t)
                        )
                        inputs.append(expanded)
                return emit_same(inputs, new_attrs)
            return emit_same([data, *node.inputs[1:]], new_attrs)

        if op == "Slice":
            starts = self._const_ints(node.inputs[1], "starts", node)
            ends = self._const_ints(node.inputs[2], "ends", node)
            axes = self._const_ints(node.inputs[3], "axes", node) if len(node.inputs) > 3 else None
            steps = self._const_ints(node.inputs[4], "steps", node) if len(node.inputs) > 4 else None
            axes = list(range(len(starts))) if axes is None else axes
            inputs = [
                data,
                self.emit.ints(starts),
                self.emit.ints(ends),
                self.emit.ints([a % in_rank + 1 for a in axes]),
            ]
            if steps is not None:
                inputs.append(self.emit.ints(steps))
            return emit_same(inputs, {})

        if op in REDUCE:
            if len(node.inputs) > 1 and node.inputs[1].name:
                axes = self._const_ints(node.inputs[1], "axes", node)
            else:
                axes = attrs.get("axes")
            if not axes:
                if int(attrs.get("noop_with_empty_axes", 0)):
                    return emit_same([data], attrs)
                axes = list(range(in_rank))
            axes = [int(a) % in_rank + 1 for a in axes]
            new_attrs = {k: v for k, v in attrs.items() if k != "axes"}
            opset = int(self.tl.graph.opset or 17)
            if op == "ReduceSum" and opset >= 13 or opset >= 18:  # axes are an input there
                return emit_same([data, self.emit.ints(axes)], new_attrs)
            new_attrs["axes"] = axes
            return emit_same([data], new_attrs)

        raise Decline(f"no lifting rule for {op} node {node.name!r}")

    def _lift_matmul(self, node: gs.Node, per_step: list[bool]) -> gs.Tensor:
        a, b = node.inputs
        out = node.outputs[0]
        out_shape = self._lifted_shape(out)
        dtype = self.dtype(out)
        ra, rb = len(self.shape(a)), len(self.shape(b))
        if per_step[0] and not per_step[1]:
            if ra == 1 and rb != 2 or ra >= 2 and rb > ra:
                raise Decline(f"MatMul node {node.name!r}: static operand of rank {rb} would broadcast over time")
            return self.emit.node("MatMul", [self.lift(a), b], out_shape, dtype)
        if per_step[1] and not per_step[0]:
            if rb == 1:  # A @ v_t == v_t @ A^T, lifted: [T, K] @ [K, M]
                if ra != 2:
                    raise Decline(f"MatMul node {node.name!r}: matrix-vector product with a rank-{ra} matrix")
                a_t = self.emit.transpose(a, [1, 0], tuple(reversed(self.shape(a))), self.dtype(a))
                return self.emit.node("MatMul", [self.lift(b), a_t], out_shape, dtype)
            if ra > rb:
                raise Decline(f"MatMul node {node.name!r}: static operand of rank {ra} would broadcast over time")
            return self.emit.node("MatMul", [a, self.lift(b)], out_shape, dtype)
        if ra < 2 or rb < 2:
            raise Decline(f"MatMul node {node.name!r}: vector product of two per-step tensors")
        rank = max(ra, rb)
        return self.emit.node("MatMul", [self._align(a, rank), self._align(b, rank)], out_shape, dtype)
