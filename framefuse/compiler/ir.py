"""The step program IR: a graph of a few kinds of nodes over static shapes, all float32.

    Leaf    a graph input (host, mapped), a recurrent state (device), a weight or a constant
    Map     data movement: out[i] = src[f(i)], f an index function (Reshape, Transpose, Slice,
            Expand, Squeeze, Gather with constant indices ... all become one of these)
    Concat  out[..., i, ...] = the source that holds position i along ``axis``
    Ew      an elementwise op over inputs of its own shape (:mod:`framefuse.compiler.ops`)
    Reduce  sum / max / min / prod over some axes (the output drops them)
    Dot     out[..., n] = Σ_k src[..., k] · rows[n, k] with ``rows`` a constant matrix (a GEMV /
            small GEMM by a weight; the weight kept as [N, K] so a row is contiguous)

    Scan    out[..., t, ...] = h = op(xs[..., t, ...], h): a first-order recurrence along one axis
    Recur   out[t, b] = h_t = cell(xg[t, b], R·h_{t-1}, ...): a nonlinear recurrence (LSTM, GRU,
            liquid cell) over a window's positions, its carried value multiplied by constant rows
    DeltaScan  a delta-rule recurrence over a window: each row of a matrix state carried through
            the positions, read against the position's key and query

Everything a model does at one step — LayerNorm, softmax, attention over the KV window, the
single-step body of every framefuse op — is built from the first six; a window of T steps adds
Scan for the linear recurrences and Recur for the nonlinear ones. The reference interpreter
(:mod:`framefuse.compiler.naive`) gives each its meaning, and the code generator
(:mod:`framefuse.compiler.codegen`) turns a whole program into one CUDA kernel.

A :class:`Program` is the lowered graph: its inputs, states and outputs by ONNX name, and for
each state the output that carries its next value.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from framefuse.compiler import iexpr as ix
from framefuse.errors import FrameFuseError


class CompileError(FrameFuseError):
    """A graph the step compiler cannot lower or schedule (the message names the node)."""


_ids = itertools.count()


class Node:
    """A value with a static shape. ``label`` says where it came from (an ONNX node / value)."""

    __slots__ = ("shape", "id", "label")
    kind = "node"

    def __init__(self, shape: Sequence[int], label: str = ""):
        self.shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in self.shape):
            raise CompileError(f"{label}: negative dimension in shape {list(self.shape)}")
        self.id = next(_ids)
        self.label = label

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def inputs(self) -> tuple[Node, ...]:
        return ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}#{self.id}{list(self.shape)}({self.label})"


class Leaf(Node):
    """``role``: "input" (graph input, host), "state" (recurrent state input, device),
    "weight" (a constant array kept in device memory), "const" (a scalar, inlined) or "slot"
    (inside a BodyLoop's body only: the carried value or a position's input, bound per position)."""

    __slots__ = ("role", "name", "array")
    kind = "leaf"

    def __init__(self, role: str, name: str, shape, array: np.ndarray | None = None, label: str = ""):
        super().__init__(shape, label or name)
        assert role in ("input", "state", "weight", "const", "slot"), role
        self.role = role
        self.name = name
        if array is None:
            self.array = None
        elif role == "const":  # one value, broadcast to the shape (kept as a scalar)
            values = np.asarray(array, dtype=np.float32).reshape(-1)
            if values.size == 0 or not (values == values[0]).all() and not np.isnan(values).all():
                raise CompileError(f"{label or name}: a const leaf holds one value, not {values.size} different ones")
            self.array = np.asarray(values[0], dtype=np.float32)
        else:
            self.array = np.ascontiguousarray(array, dtype=np.float32).reshape(self.shape)


class Map(Node):
    """out[index] = src[fn(index)]; ``fn`` maps a multi-index of ``shape`` (IExprs) to one of
    ``src.shape``. ``what`` names the op for printing."""

    __slots__ = ("src", "fn", "what", "slice")
    kind = "map"

    def __init__(self, src: Node, shape, fn: Callable[[list], list], what: str, label: str = "", slice=None):
        super().__init__(shape, label)
        self.src = src
        self.fn = fn
        self.what = what
        self.slice = slice  # (axis, start, step) when this is a slice along one axis

    def inputs(self):
        return (self.src,)

    def source_index(self, index: list) -> list:
        result = self.fn(list(index))
        if len(result) != self.src.rank:
            raise CompileError(f"{self.label}: {self.what} gave a rank-{len(result)} index for {self.src}")
        return result


class Concat(Node):
    __slots__ = ("srcs", "axis", "offsets")
    kind = "concat"

    def __init__(self, srcs: Sequence[Node], axis: int, label: str = ""):
        srcs = list(srcs)
        shape = list(srcs[0].shape)
        shape[axis] = sum(s.shape[axis] for s in srcs)
        super().__init__(shape, label)
        self.srcs = tuple(srcs)
        self.axis = axis
        self.offsets = tuple(int(v) for v in np.cumsum([0] + [s.shape[axis] for s in srcs]))

    def inputs(self):
        return self.srcs


class FrameConcat(Concat):
    """``[x, s1, s2, ...]``: a graph input and small values computed from it alone, published
    together by the one block that reads x from host memory (simplify.PublishFrameScalars,
    schedule.framed_inputs)."""

    __slots__ = ()


class Ew(Node):
    """An elementwise op of :data:`framefuse.compiler.ops.EW` over inputs of this node's shape."""

    __slots__ = ("op", "args", "params")
    kind = "ew"

    def __init__(self, op: str, args: Sequence[Node], params: tuple = (), label: str = ""):
        from framefuse.compiler.ops import EW

        spec = EW.get(op)
        if spec is None:
            raise CompileError(f"{label}: elementwise op {op!r} is not in the compiler's table")
        args = tuple(args)
        if len(args) != spec.arity:
            raise CompileError(f"{label}: {op} takes {spec.arity} inputs, got {len(args)}")
        shape = args[0].shape
        for a in args[1:]:
            if a.shape != shape:
                raise CompileError(f"{label}: {op} inputs have shapes {[list(x.shape) for x in args]}")
        super().__init__(shape, label)
        self.op = op
        self.args = args
        self.params = tuple(params)

    def inputs(self):
        return self.args


class Scan(Node):
    """A first-order recurrence along ``axis``: with ``h`` = ``init`` before the first position,
    out[..., t, ...] = h = op(xs[..., t, ...] with h as its argument number ``carry``) for each
    t in order. ``op`` is an elementwise op of :data:`framefuse.compiler.ops.EW` (a framefuse op's
    single-step body: ``linear_scan_step(a, b, h)``); ``init`` has the shape without ``axis``.

    The sequence form of a scan op: every other instruction of a T-step window already runs over
    all positions at once; this one carries a value from one position to the next."""

    __slots__ = ("op", "xs", "init", "axis", "carry", "params")
    kind = "scan"

    def __init__(
        self, op: str, xs: Sequence[Node], init: Node, axis: int, carry: int, params: tuple = (), label: str = ""
    ):
        from framefuse.compiler.ops import EW

        spec = EW.get(op)
        if spec is None:
            raise CompileError(f"{label}: elementwise op {op!r} is not in the compiler's table")
        xs = tuple(xs)
        if not xs or len(xs) + 1 != spec.arity or not 0 <= carry <= len(xs):
            raise CompileError(f"{label}: a scan of {op} takes {spec.arity - 1} inputs and the carried value")
        shape = xs[0].shape
        axis %= len(shape)
        for x in xs[1:]:
            if x.shape != shape:
                raise CompileError(f"{label}: scan inputs have shapes {[list(x.shape) for x in xs]}")
        carried = shape[:axis] + shape[axis + 1 :]
        if init.shape != carried:
            raise CompileError(f"{label}: the scan's initial value is {list(init.shape)}, not {list(carried)}")
        super().__init__(shape, label)
        self.op = op
        self.xs = xs
        self.init = init
        self.axis = axis
        self.carry = carry
        self.params = tuple(params)

    def inputs(self):
        return self.xs + (self.init,)

    @property
    def steps(self) -> int:
        return self.shape[self.axis]

    def step_args(self, items: list, carried):
        """The op's arguments: ``items`` (one per x) with the carried value at its place."""
        return list(items[: self.carry]) + [carried] + list(items[self.carry :])

    def init_index(self, index: list) -> list:
        return list(index[: self.axis]) + list(index[self.axis + 1 :])

    def at(self, index: list, position) -> list:
        """``index`` with its position along the scanned axis replaced by ``position``."""
        out = list(index)
        out[self.axis] = position
        return out


# Recur's cells: (gates G, carried values S a position: LSTM carries its cell value beside h)
# cell -> (gates, carried values); rnn_<act>: the ONNX RNN op's (Elman) cell h = act(x·Wᵀ + h·Rᵀ + b)
RECUR_CELLS = {
    "lstm": (4, 2),
    "gru": (3, 1),
    "liquid": (4, 1),
    "rnn_tanh": (1, 1),
    "rnn_relu": (1, 1),
    "rnn_sigmoid": (1, 1),
}


class Recur(Node):
    """A nonlinear recurrence over the positions of a window (the sequence form of LSTMSeq, GRUSeq,
    LiquidScan and the ONNX RNN op): for each batch row b and each position t in order, with h (and c) carried,

        r = R·h + rbias                        (R [G·H, H] constant rows, rbias [G·H] or none)
        lstm:   i, o, f, g = xg[t, b] + r      c = lstm_cell(i, f, g, c)   h = lstm_hidden(o, c)
        gru:    h = gru_hidden(xz, rz, xr, rr, xh, rh, h)   (xg's and r's three gate slices)
        liquid: g1, g2, ga, gb = xg[t, b] + r  h = liquid_hidden(g1, g2, ga, gb; ts)
        rnn_<act>:                             h = act(xg[t, b] + r)   (tanh, relu or sigmoid)

    ``xg`` [T, B, G·H] is each position's input part (the window's input products, computed for
    every position at once outside); out [T, B, S·H] holds h_t (LSTM: h_t then c_t). No position
    starts before the one before it ends, so the code generator runs it as a loop over the positions
    inside one task, R held on chip (codegen's _recur); everything around it runs over the window.
    """

    __slots__ = ("cell", "xg", "h0", "c0", "rows", "rbias", "params", "weight", "bias_weight")
    kind = "recur"

    def __init__(
        self,
        cell: str,
        xg: Node,
        h0: Node,
        c0: Node | None,
        rows: np.ndarray,
        rbias: np.ndarray | None = None,
        params: tuple = (),
        label: str = "",
    ):
        if cell not in RECUR_CELLS:
            raise CompileError(f"{label}: no recurrent cell {cell!r} (known: {sorted(RECUR_CELLS)})")
        gates, carried = RECUR_CELLS[cell]
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[0] != gates * rows.shape[1]:
            raise CompileError(f"{label}: {cell} recurrent rows of {list(rows.shape)} are not [{gates}·H, H]")
        hidden = rows.shape[1]
        if xg.rank != 3 or xg.shape[2] != gates * hidden:
            raise CompileError(f"{label}: {cell} inputs of {list(xg.shape)} are not [T, B, {gates * hidden}]")
        steps, batch = xg.shape[0], xg.shape[1]
        if h0.shape != (batch, hidden):
            raise CompileError(f"{label}: initial hidden value {list(h0.shape)} is not [{batch}, {hidden}]")
        if (c0 is None) != (carried == 1) or (c0 is not None and c0.shape != (batch, hidden)):
            raise CompileError(f"{label}: {cell} takes {'an' if carried == 2 else 'no'} initial cell value [B, H]")
        if rbias is not None:
            rbias = np.ascontiguousarray(rbias, dtype=np.float32).reshape(-1)
            if rbias.size != gates * hidden:
                raise CompileError(f"{label}: recurrent bias of {rbias.size} values, not {gates * hidden}")
        super().__init__((steps, batch, carried * hidden), label)
        self.cell = cell
        self.xg, self.h0, self.c0 = xg, h0, c0
        self.rows, self.rbias, self.params = rows, rbias, tuple(params)
        self.weight = Leaf("weight", f"{label or 'recur'}.R", rows.shape, rows, label=f"{label}.R")
        self.bias_weight = (
            None if rbias is None else Leaf("weight", f"{label or 'recur'}.rb", rbias.shape, rbias, label=f"{label}.rb")
        )

    def inputs(self):
        return (self.xg, self.h0) + (() if self.c0 is None else (self.c0,))

    def with_inputs(self, inputs: Sequence[Node]) -> Recur:
        xg, h0, *rest = inputs
        return Recur(self.cell, xg, h0, rest[0] if rest else None, self.rows, self.rbias, self.params, self.label)

    @property
    def gates(self) -> int:
        return RECUR_CELLS[self.cell][0]

    @property
    def carried(self) -> int:
        return RECUR_CELLS[self.cell][1]

    @property
    def hidden(self) -> int:
        return self.rows.shape[1]

    @property
    def steps(self) -> int:
        return self.shape[0]

    @property
    def batch(self) -> int:
        return self.shape[1]


DELTA_OPS = {"delta_rule_state": 1, "gated_delta_state": 2}  # the step function -> its gates


class DeltaScan(Node):
    """A delta-rule recurrence over the positions of a window (the sequence form of DeltaRuleScan
    and GatedDeltaRuleScan), one state row at a time: for each row i of S (b, h) [Dv rows of Dk]
    and each position t in order, with the row s carried,

        sk = Σ_j s[j]·k[b, h, t, j]
        s[j] = op(s[j], *gates[b, h, t], k[b, h, t, j], v[b, h, t, i], sk)
        o[t] = Σ_j s[j]·q[b, h, t, j]

    ``op`` is the op's elementwise step function (delta_rule_state: gates β; gated_delta_state:
    g, β), ``init`` [B, H, Dv, Dk]. out [B, H, Dv, T + Dk]: a row's T outputs, then its final
    state. Rows are independent: the code generator runs each as a loop over the positions (a warp
    a row, its Dk values in the lanes' registers)."""

    __slots__ = ("op", "q", "k", "v", "gates", "init")
    kind = "deltascan"

    def __init__(self, op: str, q: Node, k: Node, v: Node, gates: Sequence[Node], init: Node, label: str = ""):
        if op not in DELTA_OPS:
            raise CompileError(f"{label}: no delta-rule step {op!r}")
        gates = tuple(gates)
        if len(gates) != DELTA_OPS[op]:
            raise CompileError(f"{label}: {op} takes {DELTA_OPS[op]} gates")
        if q.rank != 4 or k.shape != q.shape or v.rank != 4 or v.shape[:3] != q.shape[:3]:
            raise CompileError(f"{label}: q, k {list(q.shape)} and v {list(v.shape)} are not [B, H, T, D]")
        batch, heads, steps, dk = k.shape
        dv = v.shape[3]
        for gate in gates:
            if gate.shape != (batch, heads, steps):
                raise CompileError(f"{label}: a gate of {list(gate.shape)} is not [{batch}, {heads}, {steps}]")
        if init.shape != (batch, heads, dv, dk):
            raise CompileError(f"{label}: the initial state {list(init.shape)} is not [{batch}, {heads}, {dv}, {dk}]")
        super().__init__((batch, heads, dv, steps + dk), label)
        self.op, self.q, self.k, self.v, self.gates, self.init = op, q, k, v, gates, init

    def inputs(self):
        return (self.q, self.k, self.v) + self.gates + (self.init,)

    def with_inputs(self, inputs: Sequence[Node]) -> DeltaScan:
        q, k, v, *rest = inputs
        return DeltaScan(self.op, q, k, v, rest[:-1], rest[-1], self.label)

    @property
    def steps(self) -> int:
        return self.k.shape[2]


class BodyLoop(Node):
    """A recurrence whose step is any body of nodes (a cell no fused op or Recur cell expresses:
    an MLP over [x, h], a gate multiplying h, a norm inside the cell): for each position t in order,

        h_t = body(h_{t-1}, u_1[t], …, u_k[t], f_1, …, f_m)        h_{-1} = h0

    ``body`` is a node over slot leaves: ``carried`` (h_{t-1}, the shape of h0 and of the body),
    ``slots`` (position t of each ``windows`` node [T, *slot shape]) and ``fixed_slots`` (each
    ``fixed`` node, the same every position); everything else it reads is a weight or a constant.
    out [T, *h shape] holds h_t. Made by simplify.RollBodies from a recurrence's unrolled copies."""

    __slots__ = ("body", "carried", "slots", "windows", "fixed_slots", "fixed", "h0")
    kind = "bodyloop"

    def __init__(
        self,
        body: Node,
        carried: Leaf,
        slots: Sequence[Leaf],
        windows: Sequence[Node],
        fixed_slots: Sequence[Leaf],
        fixed: Sequence[Node],
        h0: Node,
        label: str = "",
    ):
        slots, windows, fixed_slots, fixed = tuple(slots), tuple(windows), tuple(fixed_slots), tuple(fixed)
        if not windows or len(slots) != len(windows) or len(fixed_slots) != len(fixed):
            raise CompileError(f"{label}: a body loop takes one window a slot (at least one) and one node a fixed slot")
        steps = windows[0].shape[0] if windows[0].rank else 0
        for leaf in (carried, *slots, *fixed_slots):
            if not isinstance(leaf, Leaf) or leaf.role != "slot":
                raise CompileError(f"{label}: {leaf} is not a slot leaf")
        if body.shape != carried.shape or h0.shape != carried.shape:
            raise CompileError(
                f"{label}: the body {list(body.shape)}, the carried value {list(carried.shape)} and the initial "
                f"value {list(h0.shape)} differ"
            )
        for slot, window in zip(slots, windows):
            if window.shape != (steps, *slot.shape):
                raise CompileError(f"{label}: a window of {list(window.shape)} is not [{steps}, *{list(slot.shape)}]")
        for slot, node in zip(fixed_slots, fixed):
            if node.shape != slot.shape:
                raise CompileError(f"{label}: a fixed input of {list(node.shape)} is not {list(slot.shape)}")
        if steps < 1:
            raise CompileError(f"{label}: a body loop over no positions")
        super().__init__((steps, *carried.shape), label)
        self.body, self.carried, self.h0 = body, carried, h0
        self.slots, self.windows, self.fixed_slots, self.fixed = slots, windows, fixed_slots, fixed
        bound = {leaf.id for leaf in (carried, *slots, *fixed_slots)}
        for node in self.body_nodes():
            if isinstance(node, Leaf) and node.role not in ("weight", "const") and node.id not in bound:
                raise CompileError(f"{label}: the body reads {node}, which no slot binds")
            if isinstance(node, (Scan, Recur, DeltaScan, BodyLoop)):
                raise CompileError(f"{label}: a recurrence inside a body loop's body ({node})")

    @property
    def steps(self) -> int:
        return self.shape[0]

    def inputs(self):
        return self.windows + self.fixed + (self.h0,)

    def with_inputs(self, inputs: Sequence[Node]) -> BodyLoop:
        k, m = len(self.windows), len(self.fixed)
        return BodyLoop(
            self.body, self.carried, self.slots, inputs[:k], self.fixed_slots, inputs[k : k + m], inputs[-1], self.label
        )

    def body_nodes(self) -> list[Node]:
        """The body's nodes in topological order (inputs before users, the body last)."""
        return Program({}, {}, {"body": self.body}, {}).nodes()


REDUCE_OPS = ("sum", "max", "min", "prod")


class Reduce(Node):
    __slots__ = ("op", "src", "axes")
    kind = "reduce"

    def __init__(self, op: str, src: Node, axes: Sequence[int], label: str = ""):
        if op not in REDUCE_OPS:
            raise CompileError(f"{label}: reduction {op!r} is not supported (only {REDUCE_OPS})")
        axes = tuple(sorted({a % src.rank for a in axes})) if src.rank else ()
        shape = [d for i, d in enumerate(src.shape) if i not in axes]
        super().__init__(shape, label)
        self.op = op
        self.src = src
        self.axes = axes

    def inputs(self):
        return (self.src,)

    @property
    def extent(self) -> int:
        return int(np.prod([self.src.shape[a] for a in self.axes], dtype=np.int64))

    def source_index(self, out_index: list, r: ix.IExpr) -> list:
        """The source multi-index for output index ``out_index`` and reduction counter ``r``
        (``r`` runs over the reduced axes' row-major positions)."""
        reduced = ix.unflatten(r, [self.src.shape[a] for a in self.axes])
        out_iter = iter(out_index)
        red_iter = iter(reduced)
        return [next(red_iter) if i in self.axes else next(out_iter) for i in range(self.src.rank)]


class PartialSums(Reduce):
    """``[..., P, N, c] -> [..., P, N]``: a product's sums over ``P`` slices of its contraction
    axis, ``c`` columns each (simplify.SplitProducts). The schedule publishes it from the blocks
    that compute its input (a block a slice), and each reader sums its ``P`` rows itself: the
    product costs its readers no level of its own."""

    __slots__ = ()


class Dot(Node):
    """out[..., n] = Σ_k src[..., k] · rows[n, k]."""

    __slots__ = ("src", "rows", "weight")
    kind = "dot"

    def __init__(self, src: Node, rows: np.ndarray, label: str = ""):
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.ndim != 2 or src.rank < 1 or rows.shape[1] != src.shape[-1]:
            raise CompileError(
                f"{label}: a product of {list(src.shape)} by a weight of {list(rows.shape)} (as [N, K]) does not fit"
            )
        super().__init__(src.shape[:-1] + (rows.shape[0],), label)
        self.src = src
        self.rows = rows
        self.weight = Leaf("weight", f"{label or 'dot'}.rows", rows.shape, rows, label=f"{label}.rows")

    def inputs(self):
        return (self.src,)

    @property
    def k(self) -> int:
        return self.rows.shape[1]

    @property
    def n(self) -> int:
        return self.rows.shape[0]


# -- builders ---------------------------------------------------------------------------------------


def constant(value, label: str = "") -> Leaf:
    array = np.asarray(value, dtype=np.float32)
    if array.size == 1:
        return Leaf("const", label or "const", array.shape, array, label=label)
    return Leaf("weight", label or "weight", array.shape, array, label=label)


def broadcast_to(node: Node, shape: Sequence[int], label: str = "") -> Node:
    shape = tuple(int(d) for d in shape)
    if node.shape == shape:
        return node
    src_shape = node.shape
    if len(src_shape) > len(shape):
        raise CompileError(f"{label}: cannot broadcast {list(src_shape)} to {list(shape)}")
    pad = len(shape) - len(src_shape)
    for d_src, d_out in zip(src_shape, shape[pad:]):
        if d_src not in (1, d_out):
            raise CompileError(f"{label}: cannot broadcast {list(src_shape)} to {list(shape)}")
    if node.kind == "leaf" and node.role == "const":
        return Leaf("const", node.name, shape, node.array, label=node.label)

    def fn(index, src_shape=src_shape, pad=pad):
        return [ix.const(0) if d == 1 else i for i, d in zip(index[pad:], src_shape)]

    return Map(node, shape, fn, f"broadcast{list(src_shape)}->{list(shape)}", label=label)


def broadcast_shape(*shapes: Sequence[int], label: str = "") -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError as exc:
        raise CompileError(f"{label}: shapes {[list(s) for s in shapes]} do not broadcast") from exc


def ew(op: str, *args: Node, params: tuple = (), label: str = "") -> Node:
    shape = broadcast_shape(*[a.shape for a in args], label=label)
    return Ew(op, [broadcast_to(a, shape, label) for a in args], params, label=label)


def reshape(node: Node, shape: Sequence[int], label: str = "") -> Node:
    shape = tuple(int(d) for d in shape)
    if int(np.prod(shape, dtype=np.int64)) != node.size:
        raise CompileError(f"{label}: cannot reshape {list(node.shape)} to {list(shape)}")
    if shape == node.shape:
        return node
    src_shape = node.shape
    if node.kind == "leaf" and node.role == "const":
        return Leaf("const", node.name, shape, node.array, label=node.label)

    def fn(index, shape=shape, src_shape=src_shape):
        return ix.unflatten(ix.flatten(index, shape), src_shape)

    return Map(node, shape, fn, f"reshape{list(src_shape)}->{list(shape)}", label=label)


def transpose(node: Node, perm: Sequence[int], label: str = "") -> Node:
    perm = [int(p) % node.rank for p in perm]
    if sorted(perm) != list(range(node.rank)):
        raise CompileError(f"{label}: {perm} is not a permutation of {node.rank} axes")
    if perm == list(range(node.rank)):
        return node
    shape = [node.shape[p] for p in perm]
    kept = [p for p in perm if node.shape[p] != 1]
    if kept == sorted(kept):  # the axes longer than 1 keep their order: so does every element
        return reshape(node, shape, label)
    inverse = [perm.index(i) for i in range(node.rank)]

    def fn(index, inverse=inverse):
        return [index[j] for j in inverse]

    return Map(node, shape, fn, f"transpose{perm}", label=label)


def slice_axis(node: Node, axis: int, start: int, step: int, length: int, label: str = "") -> Node:
    axis %= node.rank
    if length == node.shape[axis] and step == 1 and start == 0:
        return node
    shape = list(node.shape)
    shape[axis] = length
    last = start + step * (length - 1) if length else start
    if length and not (0 <= start < node.shape[axis] and 0 <= last < node.shape[axis]):
        raise CompileError(f"{label}: slice {start}:{last}:{step} outside axis {axis} of {list(node.shape)}")

    def fn(index, axis=axis, start=start, step=step):
        out = list(index)
        out[axis] = ix.add(ix.mul(index[axis], step), ix.const(start))
        return out

    return Map(
        node, shape, fn, f"slice(axis {axis}, {start}::{step}, {length})", label=label, slice=(axis, start, step)
    )


def take(node: Node, axis: int, indices: np.ndarray, label: str = "") -> Node:
    """Gather with constant indices (already non-negative): an arithmetic progression is a Map
    of affine indices; anything else is refused (no data-dependent or table indexing)."""
    axis %= node.rank
    idx = np.asarray(indices, dtype=np.int64)
    flat = idx.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= node.shape[axis]):
        raise CompileError(f"{label}: gather index outside axis {axis} of {list(node.shape)}")
    if flat.size > 1:
        steps = np.diff(flat)
        if not (steps == steps[0]).all():
            raise CompileError(f"{label}: gather with indices {flat.tolist()[:8]}... that are not a progression")
        step = int(steps[0])
    else:
        step = 1
    start = int(flat[0]) if flat.size else 0
    shape = list(node.shape[:axis]) + list(idx.shape) + list(node.shape[axis + 1 :])
    nidx = idx.ndim
    counts = list(idx.shape)

    def fn(index, axis=axis, start=start, step=step, nidx=nidx, counts=counts):
        position = ix.flatten(index[axis : axis + nidx], counts) if nidx else ix.const(0)
        src = list(index[:axis]) + [ix.add(ix.mul(position, step), ix.const(start))] + list(index[axis + nidx :])
        return src

    return Map(node, shape, fn, f"gather(axis {axis}, {start}::{step})", label=label)


def concat(nodes: Sequence[Node], axis: int, label: str = "") -> Node:
    nodes = [n for n in nodes if n.shape[axis % n.rank] != 0] or list(nodes[:1])
    if len(nodes) == 1:
        return nodes[0]
    axis %= nodes[0].rank
    for n in nodes:
        if n.rank != nodes[0].rank or any(a != b for i, (a, b) in enumerate(zip(n.shape, nodes[0].shape)) if i != axis):
            raise CompileError(f"{label}: concat of shapes {[list(x.shape) for x in nodes]} along axis {axis}")
    return Concat(nodes, axis, label=label)


def reduce(op: str, node: Node, axes: Sequence[int], keepdims: bool, label: str = "") -> Node:
    axes = sorted({int(a) % node.rank for a in axes}) if node.rank else []
    if not axes:
        return node
    out = Reduce(op, node, axes, label=label)
    if keepdims:
        kept = [1 if i in axes else d for i, d in enumerate(node.shape)]
        return reshape(out, kept, label)
    return out


def mean(node: Node, axes: Sequence[int], keepdims: bool, label: str = "") -> Node:
    total = reduce("sum", node, axes, keepdims, label)
    count = int(np.prod([node.shape[a % node.rank] for a in axes], dtype=np.int64))
    return ew("mul", total, constant(1.0 / count), label=label)


# -- the program ---------------------------------------------------------------------------------------


@dataclass
class Program:
    """A lowered step graph. ``outputs`` holds every graph output by ONNX name (``next_state.*``
    included); ``state_of`` maps a state input name to the output holding its next value."""

    inputs: dict[str, Leaf]
    states: dict[str, Leaf]
    outputs: dict[str, Node]
    state_of: dict[str, str]
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def nodes(self) -> list[Node]:
        """Every node the outputs depend on, in topological order (inputs before users)."""
        order: list[Node] = []
        seen: set[int] = set()
        stack: list[tuple[Node, bool]] = [(n, False) for n in reversed(list(self.outputs.values()))]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if node.id in seen:
                continue
            seen.add(node.id)
            stack.append((node, True))
            for child in reversed(node.inputs()):
                if child.id not in seen:
                    stack.append((child, False))
        return order

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes():
            key = node.op if isinstance(node, Ew) else node.kind
            counts[key] = counts.get(key, 0) + 1
        return counts

    def weights(self) -> list[Leaf]:
        seen: dict[int, Leaf] = {}
        for node in self.nodes():
            if isinstance(node, Dot):
                seen[node.weight.id] = node.weight
            elif isinstance(node, Recur):
                for leaf in (node.weight, node.bias_weight):
                    if leaf is not None:
                        seen[leaf.id] = leaf
            elif isinstance(node, BodyLoop):
                for inner in node.body_nodes():
                    if isinstance(inner, Dot):
                        seen[inner.weight.id] = inner.weight
                    elif isinstance(inner, Leaf) and inner.role == "weight":
                        seen[inner.id] = inner
            elif isinstance(node, Leaf) and node.role == "weight":
                seen[node.id] = node
        return list(seen.values())


__all__ = [
    "BodyLoop",
    "CompileError",
    "Concat",
    "Dot",
    "Ew",
    "Leaf",
    "Map",
    "Node",
    "PartialSums",
    "Program",
    "DELTA_OPS",
    "DeltaScan",
    "RECUR_CELLS",
    "REDUCE_OPS",
    "Recur",
    "Reduce",
    "Scan",
    "broadcast_shape",
    "broadcast_to",
    "concat",
    "constant",
    "ew",
    "mean",
    "reduce",
    "reshape",
    "slice_axis",
    "take",
    "transpose",
]
