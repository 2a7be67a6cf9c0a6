"""IR simplification before scheduling: the same values, fewer and smaller nodes.

- **Map chains** compose into one Map (a Gather of a Transpose of a Reshape is one index function),
  and a Map that moves nothing is dropped.
- **Slices sink** into what they slice when every reader of it is a slice: a slice of an
  elementwise op is the op of the slices, and a slice along the last axis of a product is the
  product by those weight rows only. So an LSTM's four gate slices of ``W·x + R·h + b`` become four
  products of H rows each, and every block computes only the gate rows of its own elements.
- **Common subexpressions** merge: two nodes with the same op, the same inputs and the same
  parameters are one node (Maps compare by their index functions evaluated on every element;
  weights by their bytes). Exported and rewritten graphs often carry the same chain twice.

- **Normalizations fold into the products that read them**: ``W·((x − m)·r·g + b)`` with per-row
  scalars m, r (a LayerNorm's mean and 1/σ) and constant g, b is ``r·((W∘g)·x − m·Σ(W∘g)) + W·b``.
  The product then reads x, which the normalization's own sums read too: the block computes the
  sums and the products in one phase, and never writes the normalized row (measured on the H100:
  a LayerNorm before its products took two phases, ~0.5 µs of every level that had one).

- **Unrolled Elman cells roll into loops** (first): the copies of ``h = act(a_t + h·Rᵀ)`` a position
  (a Python loop over nn.RNNCell exported by torch) become one ``Recur``, the ONNX RNN op's loop.

- **Products of constants fold**: a product whose input is a constant is computed here, once, into
  a constant (a weight array, or a scalar when it holds one value). nn.LSTM / nn.GRU exported
  without an initial state multiply their recurrent weights by a zero state: a product per gate
  that every block computing the layer would run, for zeros.

- **Products of a recurrence's output may split** (``split=True``, the stepkernel-split tactics):
  into partial sums over slices of their contraction axis, computed where the recurrence is and
  summed by their readers (SplitProducts; the slices' weights are float32 leaves whatever the
  build's weight rows).

Each pass keeps the program's meaning exactly (the normalization fold up to fp32 rounding: the
products sum ``(W∘g)·x`` before subtracting ``m·Σ(W∘g)``); the tests run the reference interpreter
on the program before and after (a split product up to fp32 rounding too: its sum in another order).
"""

from __future__ import annotations

import hashlib

import numpy as np

from framefuse.compiler import iexpr as ix
from framefuse.compiler import ir
from framefuse.compiler.ir import (
    Concat,
    Dot,
    Ew,
    FrameConcat,
    Leaf,
    Map,
    Node,
    PartialSums,
    Program,
    Reduce,
    Scan,
    broadcast_to,
    reshape,
    slice_axis,
)
from framefuse.compiler.naive import evaluate_node, index_grid
from framefuse.compiler.ops import EW

MAP_EVAL_LIMIT = 1 << 22
# Compute products of constants at compile time (FoldConstants); off only to measure it.
FOLD_CONSTANTS = True
# ... up to this many elements (a folded value that is not one value becomes a weight array)
CONST_FOLD_LIMIT = 1 << 16
# Fold each normalization into the products that read it (FoldNorms); off only to measure it.
FOLD_NORMS = True


def source_flat(node: Map) -> np.ndarray | None:
    """The flat source index of every element of a Map (None when too large to evaluate)."""
    if node.size > MAP_EVAL_LIMIT:
        return None
    variables, env = index_grid(node.shape)
    index = node.source_index(variables)
    flat = ix.flatten(index, node.src.shape)
    return np.broadcast_to(ix.evaluate(flat, env), (node.size,)).astype(np.int64)


class Rebuilder:
    """Rebuild a program bottom-up through ``transform(node, new_inputs) -> node``."""

    def __init__(self, program: Program):
        self.program = program
        self.done: dict[int, Node] = {}

    def run(self) -> Program:
        for node in self.program.nodes():
            self.done[node.id] = self.transform(node, [self.done[c.id] for c in node.inputs()])
        outputs = {name: self.done[node.id] for name, node in self.program.outputs.items()}
        return Program(
            self.program.inputs,
            self.program.states,
            outputs,
            self.program.state_of,
            self.program.source,
            list(self.program.notes),
        )

    def transform(self, node: Node, inputs: list[Node]) -> Node:
        raise NotImplementedError


def with_inputs(node: Node, inputs: list[Node]) -> Node:
    """``node`` over new inputs (the node itself when they are unchanged)."""
    if all(a is b for a, b in zip(node.inputs(), inputs)):
        return node
    if isinstance(node, Map):
        return Map(inputs[0], node.shape, node.fn, node.what, node.label, slice=node.slice)
    if isinstance(node, Concat):
        return type(node)(inputs, node.axis, node.label)  # a FrameConcat stays one
    if isinstance(node, Ew):
        return Ew(node.op, inputs, node.params, node.label)
    if isinstance(node, Reduce):
        return type(node)(node.op, inputs[0], node.axes, node.label)  # PartialSums stays one
    if isinstance(node, Dot):
        return Dot(inputs[0], node.rows, node.label)
    if isinstance(node, Scan):
        return Scan(node.op, inputs[:-1], inputs[-1], node.axis, node.carry, node.params, node.label)
    if isinstance(node, (ir.Recur, ir.DeltaScan, ir.BodyLoop)):
        return node.with_inputs(inputs)
    raise ir.CompileError(f"{node}: the simplifier cannot rebuild a {type(node).__name__} over new inputs")


# A window's recurrence with its positions along the last axis: the schedule gives it a task of its
# own whose threads each own a column and run the recurrence over the positions once, O(T)
# (schedule.column_scan, codegen's column loop). Along any other axis an element ran its prefix
# itself, O(T^2) over the window, inside the task of whatever read it (min_gru's T = 32: every
# block of the out-projection staged both whole [32, 256] inputs, ~11 us a layer on the H100).
SCAN_COLUMNS = True
# ...also a scan with an input broadcast along its columns (mamba's Δ over the state's N, xlstm's
# gates over its matrix memory). At embed 64, T = 8 the columns' tasks staged more over the grid
# (mamba 213K floats against 125K), but at embed 256, T = 32 the H100 runs the windows far faster
# than the row form (device time, session 24: mamba 544 -> 72 us, jamba 61, xlstm 112; 63 / 53 /
# 94 with 384 threads), and they no longer hit lower.SCAN_MAX_ELEMENTS.
SCAN_COLUMNS_BROADCAST = True


def _unbroadcast_size(node: Node) -> int:
    """The size of what ``node`` reads through data movement (smaller where it broadcasts)."""
    while isinstance(node, Map):
        node = node.src
    return node.size


def runs_in_columns(node: Scan) -> bool:
    """Whether ScanColumns gives ``node`` a task of its own that runs it column by column (else
    each element runs its prefix where it is read, and lower.SCAN_MAX_ELEMENTS bounds it)."""
    if not SCAN_COLUMNS or node.steps < 2:
        return False
    return SCAN_COLUMNS_BROADCAST or all(_unbroadcast_size(x) >= node.size for x in node.xs)


class ScanColumns(Rebuilder):
    def transform(self, node, inputs):
        node = with_inputs(node, inputs)
        if not isinstance(node, Scan) or node.axis == node.rank - 1 or not runs_in_columns(node):
            return node
        order = [i for i in range(node.rank) if i != node.axis] + [node.axis]
        xs = [ir.transpose(x, order, label=x.label) for x in node.xs]
        # the initial value has the shape without the axis, which moving the axis leaves as it is
        scan = Scan(node.op, xs, node.init, node.rank - 1, node.carry, node.params, node.label)
        return ir.transpose(scan, [order.index(i) for i in range(node.rank)], label=node.label)


class ComposeMaps(Rebuilder):
    def transform(self, node, inputs):
        node = with_inputs(node, inputs)
        if not isinstance(node, Map):
            return node
        src = node.src
        if isinstance(src, Map):
            outer, inner = node, src
            node = Map(
                inner.src,
                outer.shape,
                lambda index, outer=outer, inner=inner: inner.source_index(outer.source_index(index)),
                f"{inner.what} then {outer.what}",
                outer.label,
            )
        flat = source_flat(node)
        if flat is not None and node.size == node.src.size and np.array_equal(flat, np.arange(node.size)):
            if node.shape == node.src.shape:
                return node.src
            return reshape(node.src, node.shape, node.label)  # a plain reshape: kept recognisable
        return node


def _last_axis_slice(node: Node) -> tuple[int, int, int] | None:
    if isinstance(node, Map) and node.slice is not None:
        axis, start, step = node.slice
        if axis == node.src.rank - 1:
            return start, step, node.shape[axis]
    return None


class SinkSlices(Rebuilder):
    def __init__(self, program: Program):
        super().__init__(program)
        users: dict[int, list[Node]] = {}
        for node in program.nodes():
            for child in node.inputs():
                users.setdefault(child.id, []).append(node)
        self.users = users
        self.memo: dict = {}

    def only_sliced(self, node: Node, seen: dict | None = None) -> bool:
        """Every reader of ``node`` is a last-axis slice, or an elementwise op of the same shape
        whose readers are all slices in turn."""
        seen = {} if seen is None else seen
        if node.id in seen:
            return seen[node.id]
        readers = self.users.get(node.id, [])
        ok = bool(readers) and node.id not in {n.id for n in self.program.outputs.values()}
        for reader in readers:
            if _last_axis_slice(reader) is not None:
                continue
            if isinstance(reader, Ew) and reader.shape == node.shape and self.only_sliced(reader, seen):
                continue
            ok = False
            break
        seen[node.id] = ok
        return ok

    def transform(self, node, inputs):
        rebuilt = with_inputs(node, inputs)
        cut = _last_axis_slice(node)
        if cut is None:
            return rebuilt
        src = node.src  # the original source: its readers are known
        if not self.only_sliced(src):
            return rebuilt
        return self.sink(self.done[src.id], src, *cut, label=node.label) or rebuilt

    def sink(self, value: Node, original: Node, start: int, step: int, length: int, label: str) -> Node | None:
        key = (value.id, start, step, length)
        if key in self.memo:
            return self.memo[key]
        out = None
        if isinstance(value, Dot):
            rows = value.rows[start : start + step * (length - 1) + 1 : step]
            out = Dot(value.src, rows, value.label)
        elif isinstance(value, Ew) and all(a.shape == value.shape for a in value.args):
            args = []
            for arg in value.args:
                if isinstance(arg, Leaf) and arg.role == "const":
                    args.append(Leaf("const", arg.name, value.shape[:-1] + (length,), arg.array, label=arg.label))
                    continue
                sunk = self.sink(arg, arg, start, step, length, label)
                args.append(sunk if sunk is not None else _slice_last(arg, start, step, length, label))
            out = Ew(value.op, args, value.params, value.label)
        self.memo[key] = out
        return out


def _slice_last(node: Node, start: int, step: int, length: int, label: str) -> Node:
    from framefuse.compiler.ir import slice_axis

    return slice_axis(node, node.rank - 1, start, step, length, label)


class MergeCommon(Rebuilder):
    """Hash-consing. Keys see through reshapes (same elements, same order), so a chain computed
    once on [1, 256] and again on [1, 1, 256] is one chain: the second becomes a reshape of the
    first."""

    def __init__(self, program: Program):
        super().__init__(program)
        self.table: dict = {}
        self.digests: dict[int, str] = {}

    def digest(self, array: np.ndarray) -> str:
        key = id(array)
        if key not in self.digests:
            data = np.ascontiguousarray(array)
            self.digests[key] = hashlib.sha1(data.tobytes() + str(data.shape).encode()).hexdigest()
        return self.digests[key]

    @staticmethod
    def base(node: Node) -> Node:
        while isinstance(node, Map) and node.size == node.src.size:
            flat = source_flat(node)
            if flat is None or not np.array_equal(flat, np.arange(node.size)):
                break
            node = node.src
        return node

    def arg_key(self, node: Node):
        if isinstance(node, Leaf) and node.role == "const":  # a broadcast scalar: its value is its identity
            return ("const", float(node.array))
        return self.base(node).id

    def key(self, node: Node):
        if isinstance(node, Leaf):
            if node.role in ("input", "state"):
                return ("leaf", node.role, node.name)
            return ("leaf", node.role, node.size, self.digest(node.array))
        if isinstance(node, Map):
            flat = source_flat(node)
            if flat is None:
                return None
            return ("map", self.base(node.src).id, node.src.size, hashlib.sha1(flat.tobytes()).hexdigest())
        ids = tuple(self.arg_key(c) for c in node.inputs())
        if isinstance(node, Concat):
            return self.concat_key(node)
        if isinstance(node, Ew):
            return ("ew", node.op, node.params, node.size, ids)
        if isinstance(node, Reduce):
            if node.src.size > MAP_EVAL_LIMIT:
                return None
            variables, env = index_grid(node.src.shape)
            kept = [v for i, v in enumerate(variables) if i not in node.axes]
            out = ix.flatten(kept, node.shape) if kept else ix.const(0)
            groups = np.broadcast_to(ix.evaluate(out, env), (node.src.size,)).astype(np.int64)
            return ("reduce", node.op, ids, node.size, hashlib.sha1(groups.tobytes()).hexdigest())
        if isinstance(node, Dot):
            return ("dot", ids, node.size, self.digest(node.rows))
        return None

    def concat_key(self, node: Concat):
        # Keyed by where each element comes from in its inputs' reshape-free bases, as a Map is: the
        # same window concatenated once as [1, 512, 4] and once as [1, 1, 512, 4] is one Concat, so
        # the products and sums over it merge too (mamba's second convolution sum was computed twice).
        bases = tuple(self.base(c).id for c in node.inputs())
        if node.size > MAP_EVAL_LIMIT:
            return (type(node).__name__, node.axis, node.shape, bases)
        which = np.concatenate(
            [np.full(c.shape, k, np.int64) for k, c in enumerate(node.inputs())], axis=node.axis
        ).ravel()
        flat = np.concatenate(
            [np.arange(c.size, dtype=np.int64).reshape(c.shape) for c in node.inputs()], axis=node.axis
        ).ravel()
        return (type(node).__name__, bases, node.size, hashlib.sha1(which.tobytes() + flat.tobytes()).hexdigest())

    def transform(self, node, inputs):
        node = with_inputs(node, inputs)
        key = self.key(node)
        if key is None:
            return node
        found = self.table.get(key)
        if found is None:
            self.table[key] = node
            return node
        if found.shape == node.shape:
            return found
        return reshape(found, node.shape, node.label)


def row_scalar(node: Node) -> Node | None:
    """The per-row value ``node`` broadcasts along its last axis (a LayerNorm's mean read by every
    element of its row), or None when ``node`` is not such a broadcast."""
    if not isinstance(node, Map) or node.rank < 1 or node.shape[-1] < 2:
        return None
    rows = node.size // node.shape[-1]
    if node.src.size != rows:
        return None
    flat = source_flat(node)
    if flat is None or not np.array_equal(flat, np.repeat(np.arange(rows), node.shape[-1])):
        return None
    return node.src


def constant_row(node: Node) -> np.ndarray | None:
    """A constant's values when they vary along the last axis only (a LayerNorm's scale): [K]."""
    width = node.shape[-1] if node.rank else 1
    if isinstance(node, Leaf) and node.role == "const":
        return np.full(width, float(node.array), dtype=np.float32)
    if isinstance(node, Leaf) and node.role == "weight":
        values = node.array.reshape(-1)
    elif isinstance(node, Map) and isinstance(node.src, Leaf) and node.src.role == "weight":
        flat = source_flat(node)
        if flat is None:
            return None
        values = node.src.array.reshape(-1)[flat]
    else:
        return None
    table = values.reshape(-1, width)
    if not (table == table[0]).all():
        return None
    return np.array(table[0], dtype=np.float32)


def same_rows(node: Node) -> Node:
    """``node`` without the reshapes on top of it that keep its rows as they are (an Unsqueeze
    before a product)."""
    while isinstance(node, Map) and node.shape[-1:] == node.src.shape[-1:] and node.size == node.src.size:
        flat = source_flat(node)
        if flat is None or not np.array_equal(flat, np.arange(node.size)):
            break
        node = node.src
    return node


def _split(node: Ew, test) -> tuple | None:
    """(what ``test`` found in one argument of a two-argument ``node``, the other argument)."""
    for i in (0, 1):
        found = test(node.args[i])
        if found is not None:
            return found, node.args[1 - i]
    return None


class FoldNorms(Rebuilder):
    """Dot(((x − m)·r)·g (+ b)) → r·(Dot(x, W∘g) − m·Σ(W∘g)) (+ W·b); m, r per-row values, g, b
    constant rows. What a LayerNorm lowers to (lower._layer_norm) and RMSNorm-style chains whose
    shift is absent are matched; anything else is left as it is."""

    def transform(self, node, inputs):
        node = with_inputs(node, inputs)
        if not isinstance(node, Dot):
            return node
        return self.fold(node) or node

    @staticmethod
    def fold(dot: Dot) -> Node | None:
        y = same_rows(dot.src)
        shift = None
        if isinstance(y, Ew) and y.op == "add":
            found = _split(y, constant_row)
            if found is None:
                return None
            shift, y = found
        if not (isinstance(y, Ew) and y.op == "mul"):
            return None
        found = _split(y, constant_row)
        if found is None:
            return None
        scale, scaled = found
        if not (isinstance(scaled, Ew) and scaled.op in ("mul", "div")):
            return None
        if scaled.op == "mul":
            found = _split(scaled, row_scalar)
            if found is None:
                return None
            inv, centred = found
        else:  # x / σ (an RMSNorm written with a division)
            divisor = row_scalar(scaled.args[1])
            if divisor is None:
                return None
            inv, centred = Ew("reciprocal", [divisor], label=scaled.label), scaled.args[0]
        mean = None  # absent for an RMSNorm
        if isinstance(centred, Ew) and centred.op == "sub":
            mean = row_scalar(centred.args[1])
        x = centred.args[0] if mean is not None else centred
        if x.shape != y.shape or row_scalar(x) is not None:
            return None
        x = same_rows(x)
        rows = dot.rows.astype(np.float64)
        folded = (rows * scale.astype(np.float64)[None, :]).astype(np.float32)
        label = dot.label
        product = Dot(x, folded, label)
        shape = product.shape
        per_row = shape[:-1] + (1,)
        r = broadcast_to(reshape(inv, per_row, label), shape, label)
        if mean is None:
            out = Ew("mul", [product, r], label=label)
        else:
            m = broadcast_to(reshape(mean, per_row, label), shape, label)
            total = folded.astype(np.float64).sum(axis=1).astype(np.float32)
            sums = broadcast_to(
                Leaf("weight", f"{label}.row_sums", total.shape, total, label=f"{label}.row_sums"), shape
            )
            out = Ew("mul", [Ew("sub", [product, Ew("mul", [m, sums], label=label)], label=label), r], label=label)
        if shift is not None and shift.any():
            bias = (rows @ shift.astype(np.float64)).astype(np.float32)
            out = Ew(
                "add",
                [out, broadcast_to(Leaf("weight", f"{label}.shift", bias.shape, bias, label=label), shape)],
                label=label,
            )
        # the product reads x as it is and the result takes the product's shape: a reshape of the
        # source would be a copy of x into shared memory (a phase of its own before the products)
        return reshape(out, dot.shape, label)


# Split each product of a recurrence's output (an out-projection: every block of the next layer
# needs its whole result) into partial sums over slices of its contraction axis, computed where
# the recurrence is and summed by the readers (SplitProducts). Off: slower on the H100 as first
# built (session 62; see compiler/README.md's "Split products"); the stepkernel-split tactics use it.
SPLIT_PRODUCTS = False
# ... into at most this many slices (each reader stages slices x N words) of at least this many
# columns (a block's share of the recurrence and of the product)
SPLIT_MAX_SLICES = 16
SPLIT_MIN_COLUMNS = 16
# ... for a contraction over at least this many columns
SPLIT_MIN_K = 64
# ... of a value each of whose elements reads at most this many elements of the state (the
# product of the reductions' extents on its way from the state, _state_fanin): min_gru's,
# min_lstm's and gated_ssm's recurrence outputs read 1, mamba's gated SSM output 64. Attention's
# output (65,536: its window of keys and values), delta_net's (262,144) and xLSTM's (4,096) are
# computed by tasks of their own that the partial sums do not absorb, so splitting their output
# projections never saved a level (engine._split_saves_levels declined them all), while scheduling
# their partial sums took 12-134 s on a 2-core CPU (session 63)
SPLIT_MAX_FANIN = 256


def split_columns(k: int, max_slices: int | None = None, min_columns: int | None = None) -> int | None:
    """The columns a slice of a split product over ``k`` takes: the least divisor of ``k`` that is
    at least ``min_columns`` and leaves at most ``max_slices`` slices (None: none does, or k is
    one slice)."""
    max_slices = SPLIT_MAX_SLICES if max_slices is None else max_slices
    min_columns = SPLIT_MIN_COLUMNS if min_columns is None else min_columns
    for c in range(max(1, min_columns), k):
        if k % c == 0 and k // c <= max_slices:
            return c
    return None


def _state_fanin(node: Node, memo: dict) -> int:
    """How many state elements an element of ``node`` reads at most (the product of the
    reductions' extents on a path from the state), for a value computed element by element from
    this step's state through elementwise ops, data movement and reductions (a recurrence's
    output, an SSM's gated output): such a value is spread over the blocks that compute the
    recurrence, and a product of it is a level of its own unless it is split. 0 for a value
    computed through a product, partial sums or a loop, or not from the state."""
    found = memo.get(node.id)
    if found is not None:
        return found
    if isinstance(node, Leaf):
        found = 1 if node.role == "state" else 0
    elif isinstance(node, (Dot, PartialSums, ir.Recur, ir.DeltaScan, ir.BodyLoop, Scan)):
        found = 0
    else:
        found = max((_state_fanin(i, memo) for i in node.inputs()), default=0)
        if found and isinstance(node, Reduce):
            found *= int(np.prod([node.src.shape[a] for a in node.axes]))
    memo[node.id] = found
    return found


class SplitProducts(Rebuilder):
    """Dot(h, W) over K → Σ_p PartialSums(h[p-th c columns] · W[:, p-th c columns]) for h computed
    from this step's state (see _state_fanin). A product that every block of the next layer needs
    whole waits for all of h: published by its own task it is a dependency level (~1 us on the
    H100, level_cost.cu). Split, each block of the recurrence also computes its slice's
    partial sums of all N outputs, and the readers sum the P slices as they stage them: the
    product costs no level. Exact up to fp32 rounding (the sum over K in another order)."""

    def __init__(self, program: Program, max_slices: int | None = None, min_columns: int | None = None):
        super().__init__(program)
        self.max_slices = max_slices
        self.min_columns = min_columns
        self.memo: dict = {}

    def transform(self, node, inputs):
        node = with_inputs(node, inputs)
        if not isinstance(node, Dot) or node.k < SPLIT_MIN_K:
            return node
        if not 0 < _state_fanin(node.src, self.memo) <= SPLIT_MAX_FANIN:
            return node
        source = node.src
        while isinstance(source, Map):
            source = source.src
        if isinstance(source, Leaf):
            return node  # the state as it came in (an LSTM's R·h): every block reads it anyway
        c = split_columns(node.k, self.max_slices, self.min_columns)
        if c is None:
            return node
        k, n, label = node.k, node.n, node.label
        slices = k // c
        lead = node.src.shape[:-1]
        sliced = broadcast_to(reshape(node.src, lead + (slices, 1, c), label), lead + (slices, n, c), label)
        rows = np.ascontiguousarray(node.rows.reshape(n, slices, c).transpose(1, 0, 2))
        weight = Leaf("weight", f"{label}.slices", rows.shape, rows, label=f"{label}.slices")
        terms = Ew("mul", [sliced, broadcast_to(weight, lead + (slices, n, c), label)], label=label)
        partial = PartialSums("sum", terms, [len(lead) + 2], label=label)
        return Reduce("sum", partial, [len(lead)], label=label)


def split_products(program: Program) -> int:
    """How many products ``program`` holds as partial sums (SplitProducts)."""
    return sum(1 for node in program.nodes() if isinstance(node, PartialSums))


def _one_value(array: np.ndarray) -> bool:
    """All elements the same float32 bit pattern (so -0.0 and 0.0 differ, and NaN equals NaN)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).reshape(-1).view(np.uint32)
    return bits.size > 0 and bool((bits == bits[0]).all())


class FoldConstants(Rebuilder):
    def __init__(self, program: Program):
        super().__init__(program)
        # an output stays a computed value: the kernel writes it, a constant is written by nobody
        self.outputs = {node.id for node in program.outputs.values()}

    def transform(self, node, inputs):
        is_output = node.id in self.outputs
        node = with_inputs(node, inputs)
        # Products only: folding every constant subexpression (weights of one value into scalars,
        # elementwise ops of constants) changed mamba's schedule and made it 0.3-0.5 us slower on
        # the H100, where the products of nn.LSTM's zero state are most of its kernel.
        if not isinstance(node, Dot) or is_output or node.size > CONST_FOLD_LIMIT:
            return node
        src = node.src
        if not (isinstance(src, Leaf) and src.role in ("weight", "const")):
            return node
        values = {src.id: np.broadcast_to(np.asarray(src.array, dtype=np.float64), src.shape)}
        value = np.asarray(evaluate_node(node, values), dtype=np.float32).reshape(node.shape)
        label = node.label or "folded"
        if _one_value(value):
            return Leaf("const", f"{label}.folded", node.shape, value.reshape(-1)[:1], label=label)
        return Leaf("weight", f"{label}.folded", node.shape, value, label=label)


# -- values affine in a graph input ------------------------------------------------------------------


# A graph input of at most this many floats is a source of affine forms (ComposeInputProducts):
# a block that needs a sum of squares of a value affine in it computes a k×k product of the input.
AFFINE_SOURCE_MAX = 64
# An affine form is kept for values with at most this many (k + 1) × size coefficients.
AFFINE_COEFFS_MAX = 1 << 20
# Compose the products of a small graph input into their readers (ComposeInputProducts); off only
# to measure it.
COMPOSE_INPUT_PRODUCTS = True
# ... and a LayerNorm's variance of such a value as the sum of squares of its centred form
# (ComposeInputProducts.variance); off only to measure it
CENTRED_VARIANCE = True


class ComposeInputProducts(Rebuilder):
    """Values affine in a small graph input x (k floats) computed from x directly.

    Every zoo model starts ``h = W_in·x + b`` and a LayerNorm of h feeding products. h is a level of
    its own in the kernel (every block of the next products needs all of h for the LayerNorm's
    sums), although everything before the LayerNorm's 1/σ is affine in x. Here each value's affine
    form ``A·x + c`` is computed at compile time (float64), and where a value that is affine in x
    (and went through a product at least as wide as x) is read by something that is not, that
    reader reads ``Dot(x, A) + c`` instead. So the products of the LayerNorm's output are products
    of x (``(W∘g)·C·x``, C the centring of W_in: the mean is subtracted in the weights), the mean is a
    row of 64 weights, and a sum of squares of an affine value is ``|R·x + v|² + e`` with ``A = QR``,
    ``v = Qᵀc`` and ``e = |c − Qv|²`` (a k×k product, no cancellation: each term is a square). The
    products of the first layer then read the frame itself, one level after it arrives.
    """

    def __init__(self, program: Program):
        super().__init__(program)
        # node id -> (the source leaf, None for a constant; F [k + 1, size]; the most products and
        # sums on a path from the source)
        self.forms: dict[int, tuple] = {}
        self.expanded: dict[int, Node] = {}
        for node in program.nodes():
            form = self._form(node)
            if form is not None:
                self.forms[node.id] = form

    # the forms: F[0] is the constant part, F[1 + j] the coefficients of x[j], over the flat elements
    def _form(self, node: Node):
        if isinstance(node, Leaf):
            if node.role == "input" and 0 < node.size <= AFFINE_SOURCE_MAX:
                k = node.size
                return node, np.vstack([np.zeros((1, k)), np.eye(k)]), 0
            if node.role in ("weight", "const") and node.size <= AFFINE_COEFFS_MAX:
                value = np.broadcast_to(np.asarray(node.array, dtype=np.float64).reshape(-1), (node.size,))
                return None, value.reshape(1, -1).copy(), 0
            return None
        args = [self.forms.get(a.id) for a in node.inputs()]
        if any(a is None for a in args):
            return None
        sources = {id(a[0]): a[0] for a in args if a[0] is not None}
        if len(sources) > 1:
            return None
        source = next(iter(sources.values()), None)
        rows = 1 if source is None else source.size + 1
        if rows * node.size > AFFINE_COEFFS_MAX:
            return None
        steps = max(a[2] for a in args)
        fs = [_widen(a[1], rows) for a in args]
        if isinstance(node, Map):
            flat = source_flat(node)
            if flat is None:
                return None
            return source, fs[0][:, flat], steps
        if isinstance(node, Concat):
            parts = [f.reshape((rows,) + s.shape) for f, s in zip(fs, node.srcs)]
            return source, np.concatenate(parts, axis=node.axis + 1).reshape(rows, -1), steps
        if isinstance(node, Reduce):
            if node.op != "sum":
                return None
            total = fs[0].reshape((rows,) + node.src.shape).sum(axis=tuple(a + 1 for a in node.axes))
            return source, total.reshape(rows, -1), steps + 1
        if isinstance(node, Dot):
            f = fs[0].reshape(rows, -1, node.k) @ node.rows.astype(np.float64).T
            return source, f.reshape(rows, -1), steps + 1
        if not isinstance(node, Ew):
            return None
        if source is None:  # a constant expression: its value
            with np.errstate(all="ignore"):
                value = EW[node.op].numpy(*[f[0] for f in fs], node.params)
            return None, np.broadcast_to(np.asarray(value, dtype=np.float64), (node.size,)).reshape(1, -1).copy(), 0
        constant = [a[0] is None for a in args]
        if node.op in ("add", "sub") and len(fs) == 2:
            b = fs[1] if node.op == "add" else -fs[1]
            return source, fs[0] + b, steps
        if node.op == "neg":
            return source, -fs[0], steps
        if node.op == "mul" and len(fs) == 2 and any(constant):
            scale, value = (fs[0], fs[1]) if constant[0] else (fs[1], fs[0])
            return source, value * scale[0][None, :], steps
        if node.op == "div" and constant[1]:
            return source, fs[0] / fs[1][0][None, :], steps
        return None

    def _composable(self, node: Node, steps: int = 2) -> bool:
        """Worth reading as Dot(x, A) + c: affine in a source through at least two products or
        sums (a product of h = W_in·x + b, or its mean, is; h itself is computed as it was)."""
        form = self.forms.get(node.id)
        return form is not None and form[0] is not None and not isinstance(node, Leaf) and form[2] >= steps

    def expand(self, node: Node) -> Node:
        """``node`` as ``Dot(x, A) + c`` (a data movement of a composable value stays one, over
        the expanded value: a broadcast of the mean is not 256 products)."""
        if node.id in self.expanded:
            return self.expanded[node.id]
        if isinstance(node, Map) and node.size > node.src.size and self._composable(node.src):
            out = with_inputs(node, [self.expand(node.src)])
        else:
            source, f, _ = self.forms[node.id]
            label = node.label or "affine"
            flat = reshape(source, (source.size,), label)
            out = Dot(flat, f[1:].T, f"{label} (composed)")
            if f[0].any():
                bias = Leaf("weight", f"{label}.composed_bias", (node.size,), f[0].astype(np.float32), label=label)
                out = Ew("add", [out, bias], label=label)
            out = reshape(out, node.shape, label)
        self.expanded[node.id] = out
        return out

    def sum_of_squares(self, node: Reduce) -> Node | None:
        """Σ (A·x + c)² over the reduced axes as Σ (R·x + v)² + e (see the class doc), when the
        groups are wider than x (otherwise the value itself is as cheap)."""
        if node.op != "sum" or not isinstance(node.src, Ew):
            return None
        value = _squared(node.src)
        if value is None or not self._composable(value, steps=1):
            return None
        return self._qr_sum_of_squares(value, node.axes, node.shape, node.label, centre=False)

    def variance(self, node: Ew) -> Node | None:
        """``E[d²] − E[d]²`` over the same axes (a LayerNorm's variance, lower._layer_norm) as
        ``E[(d − E[d])²]`` when d is affine in x: the centring goes into the weights, so the frame's
        task computes one sum of squares ``|R·x + v|² + e`` (R of the centred coefficients), not
        that and the mean's own product of x after it (the mean's row on one warp, after R·x:
        ~400 cycles on the H100 before the frame's scalars are out), and nothing cancels."""
        if node.op != "sub" or len(node.args) != 2:
            return None
        mean_square, square = node.args
        mean = _squared(square) if isinstance(square, Ew) else None
        if mean is None:
            return None
        first, second = _mean_of(mean_square), _mean_of(mean)
        if first is None or second is None:
            return None
        (total, count), (mean_total, mean_count) = first, second
        if count != mean_count or total.axes != mean_total.axes or total.shape != mean_total.shape:
            return None
        value = _squared(total.src) if isinstance(total.src, Ew) else None
        if value is None or value is not mean_total.src or not self._composable(value, steps=1):
            return None
        centred = self._qr_sum_of_squares(value, total.axes, total.shape, node.label, centre=True)
        if centred is None:
            return None
        return reshape(ir.ew("mul", centred, ir.constant(1.0 / count), label=node.label), node.shape, node.label)

    def _qr_sum_of_squares(self, value: Node, axes, shape, label: str, *, centre: bool) -> Node | None:
        source, f, _ = self.forms[value.id]
        k = source.size
        src_shape = value.shape
        kept = [a for a in range(len(src_shape)) if a not in axes]
        order = [0] + [a + 1 for a in kept] + [a + 1 for a in axes]
        size = int(np.prod(shape, dtype=np.int64))
        groups = f.reshape((k + 1,) + src_shape).transpose(order).reshape(k + 1, size, -1)
        if centre:  # each group's coefficients and constants less their means over the group
            groups = groups - groups.mean(axis=2, keepdims=True)
        width = groups.shape[2]
        if width <= k:
            return None
        r_rows, v_rows, e_all = [], [], []
        for g in range(size):
            a = groups[1:, g, :].T  # [width, k]
            c = groups[0, g, :]
            q, r = np.linalg.qr(a)
            v = q.T @ c
            r_rows.append(r)
            v_rows.append(v)
            e_all.append(float(np.sum((c - q @ v) ** 2)))
        rank = r_rows[0].shape[0]
        label = label or "sum of squares"
        flat = reshape(source, (k,), label)
        u = Dot(flat, np.concatenate(r_rows, axis=0), f"{label} (R·x)")
        if any(np.any(v) for v in v_rows):
            shift = np.concatenate(v_rows).astype(np.float32)
            u = Ew("add", [u, Leaf("weight", f"{label}.qr_shift", shift.shape, shift, label=label)], label=label)
        total = Reduce("sum", reshape(Ew("square", [u], label=label), (size, rank), label), [1], label)
        if any(e_all):
            rest = np.asarray(e_all, dtype=np.float32)
            total = Ew("add", [total, Leaf("weight", f"{label}.qr_rest", rest.shape, rest, label=label)], label=label)
        return reshape(total, shape, label)

    def transform(self, node, inputs):
        if node.id in self.forms:  # affine itself: its readers decide
            return with_inputs(node, inputs)
        if isinstance(node, Reduce):
            folded = self.sum_of_squares(node)
            if folded is not None:
                return folded
        if isinstance(node, Ew) and CENTRED_VARIANCE:
            folded = self.variance(node)
            if folded is not None:
                return folded
        new_inputs = [
            self.expand(original) if self._composable(original) else new for original, new in zip(node.inputs(), inputs)
        ]
        return with_inputs(node, new_inputs)


def _squared(node: Ew) -> Node | None:
    """v for ``square(v)`` or ``v * v``."""
    if node.op == "square":
        return node.args[0]
    if node.op == "mul" and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _mean_of(node: Node) -> tuple[Reduce, int] | None:
    """(the sum, n) for ``sum(v) * (1/n)`` (ir.mean), n the count of the summed elements."""
    if not (isinstance(node, Ew) and node.op == "mul" and len(node.args) == 2):
        return None
    for total, scale in (node.args, node.args[::-1]):
        if isinstance(total, Map) and isinstance(total.src, Reduce) and total.size == total.src.size:
            total = total.src  # (the kept axes of ir.reduce(keepdims=True))
        if not (isinstance(total, Reduce) and total.op == "sum" and isinstance(scale, Leaf) and scale.size == 1):
            continue
        count = int(np.prod([total.src.shape[a] for a in total.axes], dtype=np.int64))
        if count > 0 and np.isclose(float(np.asarray(scale.array).reshape(-1)[0]) * count, 1.0, rtol=1e-6):
            return total, count
    return None


def _widen(f: np.ndarray, rows: int) -> np.ndarray:
    """A constant's form [1, n] as a form over ``rows`` rows (zero coefficients)."""
    if f.shape[0] == rows:
        return f
    out = np.zeros((rows, f.shape[1]))
    out[0] = f[0]
    return out


# -- scalars of the frame, published with it ---------------------------------------------------------


# A computed value of at most this many floats that depends on a graph input alone (the first
# LayerNorm's 1/σ once ComposeInputProducts made it a function of the frame) is computed by the
# block that reads the frame and published beside it (PublishFrameScalars) ...
FRAME_SCALARS_MAX = 8
# ... when everything it takes costs that block at most this many multiply-adds (|R·x + v|² of a
# 64-float frame: 4096).
FRAME_SCALAR_MACS = 1 << 13
# ... when the frame is at most this many floats (one a thread of the block that reads it)
FRAME_INPUT_MAX = 256
# Publish the frame's scalars with the frame (PublishFrameScalars); off only to measure it.
PUBLISH_FRAME_SCALARS = True


def _closure(node: Node) -> dict[int, Node]:
    """``node`` and every computed node under it (leaves aside)."""
    found: dict[int, Node] = {}
    stack = [node]
    while stack:
        top = stack.pop()
        if top.id in found or isinstance(top, Leaf):
            continue
        found[top.id] = top
        stack.extend(top.inputs())
    return found


def _macs(nodes: dict) -> int:
    return sum(n.k * n.size for n in nodes.values() if isinstance(n, Dot))


class PublishFrameScalars(Rebuilder):
    """The frame x and the small values computed from it alone, as one published array.

    After ComposeInputProducts every product of the first layer reads the frame directly, but
    also the LayerNorm's 1/σ, a scalar of x through a k×k product (|R·x + v|²). Recomputed by each
    reading block it cost every block 16 KB of R and a phase; as a task of its own, a level (H200:
    lstm 12.1 → 12.7 µs and 11.9). Here it is part of the frame: ``F = [x, s1, s2, ...]`` is one
    value, computed by the one block that reads x from host memory (the scheduler gives a frame
    node that block, see schedule.framed_inputs), and every other reader of x or of an ``s`` reads its
    slice of F. The values inside F's own computation still read x itself.
    """

    def __init__(self, program: Program):
        super().__init__(program)
        self.inner: set[int] = set()
        self.views: dict[int, Node] = {}
        self.frame: Node | None = None
        nodes = program.nodes()
        for leaf in program.inputs.values():
            if leaf.size <= FRAME_INPUT_MAX and self._plan(leaf, nodes):
                break

    def _plan(self, leaf: Leaf, nodes: list) -> bool:
        # which nodes are functions of this input alone (weights and constants aside)
        only: dict[int, bool] = {}
        for node in nodes:
            if isinstance(node, Leaf):
                only[node.id] = node is leaf
                continue
            ins = node.inputs()
            only[node.id] = all(only[a.id] or (isinstance(a, Leaf) and a.role in ("weight", "const")) for a in ins)
            only[node.id] = only[node.id] and any(only[a.id] for a in ins)
        readers: dict[int, list] = {}
        for node in nodes:
            for a in node.inputs():
                readers.setdefault(a.id, []).append(node)
        outputs = {n.id for n in self.program.outputs.values()}

        def small(node: Node) -> bool:
            return only[node.id] and not isinstance(node, Leaf) and node.size <= FRAME_SCALARS_MAX

        scalars = [
            n for n in nodes if small(n) and not isinstance(n, Map) and any(not small(r) for r in readers.get(n.id, []))
        ]
        # the cheapest first while the block's products fit (the L2 norm of an x-only key, 16K
        # multiply-adds, is left to the key's own blocks)
        closures = {n.id: _closure(n) for n in scalars}
        inner: dict[int, Node] = {}
        kept = []
        for scalar in sorted(scalars, key=lambda n: _macs(closures[n.id])):
            own = closures[scalar.id]
            if outputs & set(own):
                continue  # a graph output stays where it is (its own task would read x from host)
            trial = {**inner, **own}
            if _macs(trial) > FRAME_SCALAR_MACS or not any(isinstance(n, (Dot, Reduce)) for n in own.values()):
                continue
            inner, kept = trial, kept + [scalar]
        scalars = [n for n in nodes if any(n is k for k in kept)]  # graph order
        if not scalars:
            return False
        label = f"frame {leaf.name} and {len(scalars)} scalar(s) of it"
        parts = [reshape(leaf, (leaf.size,), label)] + [reshape(s, (s.size,), label) for s in scalars]
        frame = FrameConcat(parts, 0, label=label)
        offset = 0
        for node in [leaf] + scalars:
            view = slice_axis(frame, 0, offset, 1, node.size, label)
            self.views[node.id] = reshape(view, node.shape, label)
            offset += node.size
        self.inner = set(inner) | {p.id for p in parts}
        self.frame = frame
        return True

    def transform(self, node, inputs):
        if node.id in self.inner or self.frame is None:
            return node
        return with_inputs(node, [self.views.get(a.id, new) for a, new in zip(node.inputs(), inputs)])


# A recurrence unrolled over its positions (torch's export of a Python loop over nn.RNNCell, an
# ONNX Loop / Scan whose body the lowering copied once a position) whose cell is
# h_t = act(a_t + h_{t-1}·Rᵀ), act tanh, relu or sigmoid and a_t a sum of terms that do not depend
# on the chain, is rolled into one ir.Recur (the ONNX RNN op's cell): a loop over the positions
# inside one task with R on chip, instead of a product and a dependency level a position.
ROLL_RECURRENCES = True
ROLL_ACTS = ("tanh", "relu", "sigmoid")
ROLL_MIN_POSITIONS = 2
ROLLED_NOTE = "rolled"  # how a program's notes begin for each rolled chain (rolled_recurrences)


COMPOSED_NOTE = "composed input products"  # a program's note where ComposeInputProducts changed it


def composed_inputs(program: Program) -> bool:
    """Whether ComposeInputProducts (or PublishFrameScalars) changed ``program`` when it was
    lowered: where they did not, it is the program lowered without them (compose_input False)."""
    return COMPOSED_NOTE in program.notes


def rolled_recurrences(program: Program) -> int:
    """How many unrolled chains RollRecurrences rolled into ``program``."""
    return sum(note.startswith(ROLLED_NOTE + " ") for note in program.notes)


class RollRecurrences:
    """Find the unrolled chains (h_0 → h_1 → … → h_T, each h_t = act(a_t + Dot(h_{t-1}, R)) with
    one R and one act along the chain, every node between the product and the act read only on the
    way) and replace h_t by position t − 1 of ``Recur("rnn_<act>", [a_1 … a_T], h_0, R)``. A chain
    whose terms or initial value read another rolled chain's positions waits for it; chains that
    would read each other are left as they are."""

    def __init__(self, program: Program):
        self.program = program
        self.nodes = program.nodes()
        self.users: dict[int, list[Node]] = {}
        for node in self.nodes:
            for child in node.inputs():
                self.users.setdefault(child.id, []).append(node)
        self.outputs = {node.id for node in program.outputs.values()}

    def _cell(self, product: Dot) -> tuple[Ew, list[Node], list[Node]] | None:
        """(the act, the terms added on the way, the nodes on the way) of the cell ``product`` feeds."""
        node, terms, path = product, [], [product]
        while True:
            readers = self.users.get(node.id, [])
            if len(readers) != 1 or node.id in self.outputs:
                return None
            user = readers[0]
            if not isinstance(user, Ew):
                return None
            if user.op in ROLL_ACTS and not user.params:
                return user, terms, path
            if user.op != "add" or user.args[0] is user.args[1]:
                return None
            terms.append(user.args[1] if user.args[0] is node else user.args[0])
            node = user
            path.append(user)

    def _chains(self) -> list[dict]:
        steps: dict[int, list] = {}  # h_{t-1} id -> [(product, act, terms, path)], one a square product of it
        for node in self.nodes:
            if isinstance(node, Dot) and node.src.rank == 2 and node.rows.shape[0] == node.rows.shape[1]:
                cell = self._cell(node)
                if cell is not None and cell[0].shape == node.src.shape:
                    steps.setdefault(node.src.id, []).append((node, *cell))
        produced: dict[int, list] = {}  # h_t id -> the steps whose cell gives it
        for found in steps.values():
            for step in found:
                produced.setdefault(step[1].id, []).append(step)

        def follow(h: Node, like) -> tuple | None:  # h's step of the same recurrence, if exactly one
            same = [step for step in steps.get(h.id, ()) if self._same(step, like)]
            return same[0] if len(same) == 1 else None

        candidates = []
        for found in steps.values():
            for first in found:
                if any(self._same(step, first) for step in produced.get(first[0].src.id, ())):
                    continue  # not the chain's first position
                links = [first]
                while (step := follow(links[-1][1], first)) is not None:
                    links.append(step)
                if len(links) >= ROLL_MIN_POSITIONS:
                    candidates.append(links)
        # a layer's input product is a square product of the layer below's h as well: with R's very
        # values it makes a chain that shares its cells with the recurrent one: the longer is kept
        chains, claimed = [], set()
        for links in sorted(candidates, key=len, reverse=True):
            cells = {link[1].id for link in links}
            if cells & claimed:
                continue
            claimed |= cells
            init, act = links[0][0].src, links[0][1].op
            if (
                isinstance(init, Ew)
                and init.op == act
                and not init.params
                and init.id not in claimed
                and np.isfinite(links[0][0].rows).all()
            ):
                # h_1 = act(a_1) with no product: a zero initial state whose product the exporter
                # folded (torch's nn.RNNCell loop from zeros). It is the loop's first position from
                # zeros, its whole argument the input part (R·0 = 0 for finite R).
                links = [(None, init, [init.args[0]], [])] + links
                claimed.add(init.id)
                init = ir.constant(np.zeros(init.shape, np.float32), label=init.label)
            chains.append({"init": init, "links": links})
        return chains

    @staticmethod
    def _same(a, b) -> bool:
        return a[1].op == b[1].op and (a[0].rows is b[0].rows or np.array_equal(a[0].rows, b[0].rows))

    @staticmethod
    def _reaches(roots: list[Node], targets: set[int]) -> bool:
        """Whether any of ``roots`` depends on a node of ``targets``."""
        memo: dict[int, bool] = {}
        for root in roots:
            stack: list[tuple[Node, bool]] = [(root, False)]
            while stack:
                node, ready = stack.pop()
                if node.id in memo:
                    continue
                if node.id in targets:
                    memo[node.id] = True
                elif ready:
                    memo[node.id] = any(memo[c.id] for c in node.inputs())
                else:
                    stack.append((node, True))
                    stack += [(c, False) for c in node.inputs() if c.id not in memo]
            if memo[root.id]:
                return True
        return False

    def run(self) -> Program:
        kept = []
        for chain in self._chains():
            chain["cells"] = {n.id for link in chain["links"] for n in (link[1], *link[3])}
            chain["reads"] = [t for link in chain["links"] for t in link[2]] + [chain["init"]]
            if not self._reaches(chain["reads"], chain["cells"]):  # a term reading the chain itself
                kept.append(chain)
        if not kept:
            return self.program
        # a chain reading another's positions needs that one rolled first: order them, drop cycles
        after = {
            i: {j for j, other in enumerate(kept) if j != i and self._reaches(chain["reads"], other["cells"])}
            for i, chain in enumerate(kept)
        }
        ordered, placed = [], set()
        while True:
            ready = [i for i in after if i not in placed and after[i] <= placed]
            if not ready:
                break
            ordered += ready
            placed |= set(ready)
        if not ordered:
            return self.program
        replace: dict[int, Node] = {}
        for i in ordered:
            chain = kept[i]
            links = chain["links"]
            act, rows = links[-1][1].op, links[-1][0].rows
            batch, hidden = chain["init"].shape
            label = links[0][1].label
            inputs = []
            for _, cell, terms, _ in links:
                total = None
                for term in terms:
                    total = term if total is None else ir.ew("add", total, term, label=cell.label)
                if total is None:
                    total = ir.constant(np.zeros((batch, hidden), np.float32), label=cell.label)
                inputs.append(reshape(total, (1, batch, hidden), label=cell.label))
            window = ir.concat(inputs, 0, label=label)
            recur = ir.Recur(f"rnn_{act}", window, chain["init"], None, rows, label=f"{label} (rolled)")
            for t, (_, cell, _, _) in enumerate(links):
                position = slice_axis(recur, 0, t, 1, 1, label=cell.label)
                replace[cell.id] = reshape(position, (batch, hidden), label=cell.label)
        notes = list(self.program.notes)
        for i in ordered:
            links = kept[i]["links"]
            notes.append(
                f"{ROLLED_NOTE} {len(links)} unrolled positions of h = {links[-1][1].op}(a + h·Rᵀ) "
                f"(R {list(links[-1][0].rows.shape)}) into one recurrence"
            )
        return _replaced(self.program, replace, notes)


# The copies of a recurrence whose cell is any body (an MLP over [x, h], a gate that multiplies h,
# a norm inside the cell: what RollRecurrences does not take) are rolled into one ir.BodyLoop, the
# body written once over slot leaves: one task on one block whose positions run out of shared memory
# (schedule.body_plan), instead of the copies' levels (and schedules superlinear in T: the MLP cell
# unrolled took 15 s at T = 8 and 90 s at T = 16 on a 2-core CPU, rolled 0.7 s at T = 32). The
# build's tactic stepkernel-unrolled compiles the unrolled copies beside it and times both.
ROLL_BODIES = True
ROLL_BODY_MAX_NODES = 256  # a body larger than this stays unrolled (bodies are compared node by node)
ROLLED_BODY_NOTE = "rolled body"  # how a program's notes begin for each rolled body loop
_SEARCH_LIMIT = 4096  # nodes visited looking for the cut before / after a chain's ends
_CONSTANT_VIEW_NODES = 16  # a value every position computes alike from constants, at most this large
ROLL_BODY_MAX_EXPORTS = 8  # values besides h a body may let out (carried with h, packed into one vector)


def rolled_bodies(program: Program) -> int:
    """How many unrolled bodies RollBodies rolled into ``program``."""
    return sum(note.startswith(ROLLED_BODY_NOTE + " ") for note in program.notes)


class RollBodies:
    """Find recurrences unrolled over their positions whatever their cell and roll each into one
    ir.BodyLoop. A chain is found from its products: the copies of one product (the same rows)
    each depending on the one before mark the positions; between two of them, a node every path
    passes through is a candidate carried value h_t (the cut); the nodes that depend on h_{t-1}
    and lead to h_t are position t's body. A chain holds while each position's body is the first's
    node for node (op, parameters, shape, rows), reads h_{t-1} where the first reads h_0 and lets
    nothing but h_t out; what a body reads from outside becomes a window (one row a position), a
    fixed input (the same node every position) or stays in the body (weights, constants)."""

    def __init__(self, program: Program):
        self.program = program
        self.nodes = program.nodes()
        self.order = {node.id: i for i, node in enumerate(self.nodes)}
        self.users: dict[int, list[Node]] = {}
        for node in self.nodes:
            for child in node.inputs():
                self.users.setdefault(child.id, []).append(node)
        self.outputs = {node.id for node in program.outputs.values()}

    # -- graph queries -----------------------------------------------------------------------------
    def _depends(self, node: Node, on: Node) -> bool:
        """Whether ``node`` depends on ``on`` (or is it)."""
        floor = self.order[on.id]
        stack, seen = [node], set()
        while stack:
            n = stack.pop()
            if n is on:
                return True
            if n.id in seen or self.order[n.id] < floor:
                continue
            seen.add(n.id)
            stack += n.inputs()
        return False

    def _body(self, prev: Node, cut: Node) -> set[int] | None:
        """The ids of the nodes that depend on ``prev`` and lead to ``cut`` (``cut`` included),
        None when ``cut`` does not depend on ``prev`` or the body is too large."""
        floor = self.order[prev.id]
        memo: dict[int, bool] = {prev.id: True}
        stack: list[tuple[Node, bool]] = [(cut, False)]
        while stack:
            node, ready = stack.pop()
            if node.id in memo:
                continue
            if ready:
                memo[node.id] = any(memo[c.id] for c in node.inputs())
                continue
            if isinstance(node, Leaf) or self.order[node.id] < floor:
                memo[node.id] = False
                continue
            stack.append((node, True))
            stack += [(c, False) for c in node.inputs() if c.id not in memo]
            if len(memo) + len(stack) > 8 * ROLL_BODY_MAX_NODES:
                return None
        body = {i for i, inside in memo.items() if inside and i != prev.id}
        return body if memo[cut.id] and len(body) <= ROLL_BODY_MAX_NODES else None

    def _dominators(self, start: Node, end: Node) -> list[Node]:
        """The nodes every path from ``start`` to ``end`` passes through (``start`` first, ``end``
        left out), in topological order."""
        top = self.order[end.id]
        forward, stack = {start.id: start}, [start]
        while stack:
            for user in self.users.get(stack.pop().id, ()):
                if user.id not in forward and self.order[user.id] <= top:
                    forward[user.id] = user
                    stack.append(user)
                    if len(forward) > 8 * ROLL_BODY_MAX_NODES:
                        return []
        segment = [n for n in forward.values() if n is not end and self._depends(end, n)]

        def reaches_without(skip: Node) -> bool:
            seen, stack = {start.id}, [start]
            while stack:
                for user in self.users.get(stack.pop().id, ()):
                    if user is end:
                        return True
                    if user is not skip and user.id in forward and user.id not in seen:
                        seen.add(user.id)
                        stack.append(user)
            return False

        found = [start] + [n for n in segment if n is not start and not reaches_without(n)]
        return sorted(found, key=lambda n: self.order[n.id])

    @staticmethod
    def _same_op(a: Node, b: Node) -> bool:
        if type(a) is not type(b) or a.shape != b.shape or len(a.inputs()) != len(b.inputs()):
            return False
        if isinstance(a, Ew):
            return a.op == b.op and a.params == b.params
        if isinstance(a, Map):
            if a.what != b.what or a.src.shape != b.src.shape:
                return False
            variables = [ix.Var(f"q{i}", max(d, 1)) for i, d in enumerate(a.shape)]
            return repr(a.source_index(variables)) == repr(b.source_index(variables))
        if isinstance(a, Concat):
            return a.axis == b.axis
        if isinstance(a, Reduce):
            return a.op == b.op and tuple(a.axes) == tuple(b.axes)
        if isinstance(a, Dot):
            return a.rows is b.rows or (a.rows.shape == b.rows.shape and np.array_equal(a.rows, b.rows))
        return False  # leaves are never inside a body; recurrences are not rolled into one

    def _match(self, a_prev: Node, a_cut: Node, b_prev: Node, b_cut: Node) -> tuple[dict, list, set[int]] | None:
        """Whether the body from ``b_prev`` to ``b_cut`` is the body from ``a_prev`` to ``a_cut``
        node for node: (the node map, the pairs of outside nodes they read, in the first body's
        order, and the first body's nodes whose value, in either body, is read outside it besides
        the cut: a second carried value such as an LSTM's c, or a value the graph reads a
        position), or None."""
        body_a, body_b = self._body(a_prev, a_cut), self._body(b_prev, b_cut)
        if body_a is None or body_b is None or len(body_a) != len(body_b):
            return None
        if body_a & body_b and a_cut is not b_cut:  # two positions' bodies share nothing
            return None
        mapping: dict[int, Node] = {}
        outside: dict[int, Node] = {}
        pairs: list[tuple[Node, Node]] = []
        stack = [(a_cut, b_cut)]
        while stack:
            x, y = stack.pop()
            if x is a_prev or y is b_prev:
                if not (x is a_prev and y is b_prev):
                    return None
                continue
            inside = x.id in body_a
            if inside != (y.id in body_b):
                return None
            if not inside:
                if x.id in outside:
                    if outside[x.id] is not y:
                        return None
                elif x.shape != y.shape:
                    return None
                else:
                    outside[x.id] = y
                    pairs.append((x, y))
                continue
            if x.id in mapping:
                if mapping[x.id] is not y:
                    return None
                continue
            if not self._same_op(x, y):
                return None
            mapping[x.id] = y
            stack += list(zip(x.inputs(), y.inputs()))
        if len(mapping) != len(body_a) or len({n.id for n in mapping.values()}) != len(mapping):
            return None
        first_of = {y.id: x for x, y in mapping.items()}
        exported = set()
        for body, cut, template in ((body_a, a_cut, None), (body_b, b_cut, first_of)):
            for i in body:
                if i != cut.id and (i in self.outputs or any(u.id not in body for u in self.users.get(i, ()))):
                    exported.add(i if template is None else template[i])
        if len(exported) > ROLL_BODY_MAX_EXPORTS:
            return None
        return mapping, pairs, exported

    # -- chains --------------------------------------------------------------------------------------
    def _families(self) -> list[list[Dot]]:
        """Copies of one product (the same rows), in order, each depending on the one before."""
        groups: dict[tuple, list[Dot]] = {}
        for node in self.nodes:
            if isinstance(node, Dot):
                key = (node.rows.shape, hashlib.sha1(np.ascontiguousarray(node.rows).tobytes()).hexdigest())
                groups.setdefault(key, []).append(node)
        families = []
        for members in groups.values():
            run = [members[0]]
            for node in members[1:]:
                if self._depends(node, run[-1]):
                    run.append(node)
                else:
                    if len(run) >= 3:
                        families.append(run)
                    run = [node]
            if len(run) >= 3:
                families.append(run)
        return sorted(families, key=len, reverse=True)

    def _chain(self, anchors: list[Dot], rank: int) -> list[Node] | None:
        """The cuts h_0 … h_n of the chain the anchors mark, taking each segment's ``rank``-th
        dominator as h_t; None when fewer than ROLL_MIN_POSITIONS positions match."""
        cuts = []
        for a, b in zip(anchors, anchors[1:]):
            dominators = self._dominators(a, b)
            if rank >= len(dominators):
                break
            cuts.append(dominators[rank])
        if len(cuts) < 3:
            return None
        chain = cuts[:2]
        for cut in cuts[2:]:  # the first body is the template; the next ones must be it
            if self._match(cuts[0], cuts[1], chain[-1], cut) is None:
                break
            chain.append(cut)
        if len(chain) < 3:
            return None
        chain = self._extend_forward(chain)
        return self._extend_backward(chain)

    def _extend_forward(self, chain: list[Node]) -> list[Node]:
        while True:
            last, seen, frontier, found = chain[-1], {chain[-1].id}, [chain[-1]], None
            while frontier and found is None and len(seen) < _SEARCH_LIMIT:
                nxt = []
                for node in frontier:
                    for user in self.users.get(node.id, ()):
                        if user.id in seen:
                            continue
                        seen.add(user.id)
                        nxt.append(user)
                        if self._same_op(user, last) and self._match(chain[0], chain[1], last, user) is not None:
                            found = user
                            break
                    if found is not None:
                        break
                frontier = nxt
            if found is None:
                return chain
            chain.append(found)

    def _extend_backward(self, chain: list[Node]) -> list[Node]:
        while True:
            first = chain[0]
            candidates = sorted(
                (n for n in self._ancestors(first) if n.shape == first.shape),
                key=lambda n: self.order[n.id],
                reverse=True,
            )
            found = next((n for n in candidates if self._match(chain[0], chain[1], n, first) is not None), None)
            if found is None:
                return chain
            chain.insert(0, found)

    def _ancestors(self, node: Node) -> list[Node]:
        seen, stack, out = {node.id}, list(node.inputs()), []
        while stack and len(out) < _SEARCH_LIMIT:
            n = stack.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            out.append(n)
            stack += n.inputs()
        return out

    def _loop(self, chain: list[Node]) -> tuple[ir.BodyLoop, set[int], list[Node], list[list[Node]]] | None:
        """The loop of a chain of cuts h_0 … h_n (positions 1 … n), the ids of its bodies' nodes,
        the nodes it reads from outside and, a position, the values it lets out (h_t first); None
        when an outside value depends on the chain.

        A body that lets out more than h (an LSTM's c_t, read by the next position's body; a value
        the graph reads every position) carries them all as one vector [1, |h| + |c| + …]: the
        body reads h_{t-1} and c_{t-1} as slices of it and writes their concatenation, so the loop
        and its code are the one-value loop's. A value let out that no body reads back starts
        at zeros."""
        first_prev, first_cut = chain[0], chain[1]
        matches = [self._match(first_prev, first_cut, a, b) for a, b in zip(chain, chain[1:])]
        if any(m is None for m in matches):
            return None
        mappings = [mapping for mapping, _, _ in matches]
        body_ids = set().union(*({n.id for n in mapping.values()} for mapping in mappings))
        exported = sorted(set().union(*(m[2] for m in matches)), key=lambda i: self.order[i])
        if len(exported) > ROLL_BODY_MAX_EXPORTS:
            return None
        let_out = [first_cut] + [mappings[0][i] for i in exported]  # the first body's values, h first
        sizes = [n.size for n in let_out]
        offsets = [int(v) for v in np.cumsum([0, *sizes[:-1]])]
        label = f"{first_cut.label} (carried)"
        if exported:
            carried = Leaf("slot", "h", (1, sum(sizes)), label=label)

            def part(k: int) -> Node:
                return reshape(slice_axis(carried, 1, offsets[k], 1, sizes[k]), let_out[k].shape, label=label)

            bound: dict[int, Node] = {first_prev.id: part(0)}
        else:
            carried = Leaf("slot", "h", first_cut.shape, label=label)
            bound = {first_prev.id: carried}
        initial: dict[int, Node] = {}  # a carried value's template node id → its value before the first position
        # per outside value of the body: (first's, second's, ...)
        columns = list(zip(*[pairs for _, pairs, _ in matches]))
        slots, windows, fixed_slots, fixed, reads = [], [], [], [], [chain[0]]
        steps = len(chain) - 1
        for k, column in enumerate(columns):
            head = column[0][0]
            values = [pair[1] for pair in column]
            update = values[1] if len(values) > 1 else None
            if (
                update is not None
                and update.id in exported
                and update.id not in initial
                and all(v is mappings[t - 1][update.id] for t, v in enumerate(values) if t)
            ):  # position t reads what position t - 1 let out: a second carried value
                initial[update.id] = head
                bound[head.id] = part(1 + exported.index(update.id))
                reads.append(head)
                continue
            if self._same_constant(values):
                continue  # read in the body as it is (the first position's copy)
            if all(v is values[0] for v in values):
                leaf = Leaf("slot", f"f{k}", head.shape, label=head.label)
                fixed_slots.append(leaf)
                fixed.append(values[0])
                reads.append(values[0])
            else:
                leaf = Leaf("slot", f"u{k}", head.shape, label=head.label)
                slots.append(leaf)
                windows.append(ir.concat([reshape(v, (1, *v.shape), label=v.label) for v in values], 0))
                reads += values
            bound[head.id] = leaf
        if not windows:  # nothing changes from one position to the next: a window of zeros keeps the loop's T
            leaf = Leaf("slot", "steps", (1,), label="positions")
            slots.append(leaf)
            windows.append(ir.constant(np.zeros((steps, 1), np.float32), label="positions"))
        if self._reaches_any(reads, body_ids | {c.id for c in chain[1:]}):
            return None
        roots = self._rebuild(let_out, set(mappings[0]), bound)  # the first matched against itself
        if exported:
            flat = [reshape(node, (1, node.size), label=label) for node in roots]
            starts = [chain[0], *(initial.get(i) for i in exported)]
            flat_starts = [
                reshape(node, (1, node.size), label=label)
                if node is not None
                else ir.constant(np.zeros((1, size), np.float32), label="zeros")
                for node, size in zip(starts, sizes)
            ]
            body, h0 = ir.concat(flat, 1, label=label), ir.concat(flat_starts, 1, label=label)
        else:
            body, h0 = roots[0], chain[0]
        loop = ir.BodyLoop(body, carried, slots, windows, fixed_slots, fixed, h0, label=f"{first_cut.label} (rolled)")
        outs = [[cut] + [mappings[t][i] for i in exported] for t, cut in enumerate(chain[1:])]
        return loop, body_ids, reads, outs

    @staticmethod
    def _same_constant(values: list[Node]) -> bool:
        """Whether every position reads the same constant: one weight or constant, or each its own
        copy of the same small computation over equal weights and constants (a bias broadcast
        to the position's rows, which the export writes once a position). Such a value is no
        window: the body reads the first copy, and nothing is staged a position."""

        def same(a: Node, b: Node, budget: list[int]) -> bool:
            budget[0] -= 1
            if budget[0] < 0:
                return False
            if isinstance(a, Leaf) or isinstance(b, Leaf):
                return (
                    isinstance(a, Leaf)
                    and isinstance(b, Leaf)
                    and a.role in ("weight", "const")
                    and b.role in ("weight", "const")
                    and (a is b or (a.shape == b.shape and np.array_equal(a.array, b.array)))
                )
            if a is not b and not RollBodies._same_op(a, b):
                return False
            return all(same(x, y, budget) for x, y in zip(a.inputs(), b.inputs()))

        return all(same(values[0], v, [_CONSTANT_VIEW_NODES]) for v in values)

    @staticmethod
    def _rebuild(roots: list[Node], body: set[int], bound: dict[int, Node]) -> list[Node]:
        done: dict[int, Node] = dict(bound)
        stack: list[tuple[Node, bool]] = [(root, False) for root in reversed(roots)]
        while stack:
            node, ready = stack.pop()
            if node.id in done:
                continue
            if node.id not in body:
                done[node.id] = node  # outside and unbound: a weight or constant read as it is
                continue
            if ready:
                done[node.id] = with_inputs(node, [done[c.id] for c in node.inputs()])
                continue
            stack.append((node, True))
            stack += [(c, False) for c in node.inputs() if c.id not in done]
        return [done[root.id] for root in roots]

    @staticmethod
    def _reaches_any(roots: list[Node], targets: set[int]) -> bool:
        return bool(targets) and RollRecurrences._reaches(roots, targets)

    def run(self) -> Program:
        found, claimed = [], set()
        for anchors in self._families():
            best, best_key = None, None
            for rank in range(len(self._dominators(anchors[0], anchors[1]))):
                chain = self._chain(anchors, rank)
                made = self._loop(chain) if chain is not None else None
                if made is None or made[1] & claimed:
                    continue
                key = (len(chain), -made[0].carried.size)  # the most positions, then the least carried
                if best_key is None or key > best_key:
                    best, best_key = (chain, *made), key
            if best is None:
                continue
            claimed |= best[2]
            found.append(best)
        if not found:
            return self.program
        # a loop reading another's positions is rolled after it; loops that would read each other are left
        after = {
            i: {j for j, other in enumerate(found) if j != i and self._reaches_any(f[3], other[2])}
            for i, f in enumerate(found)
        }
        ordered, placed = [], set()
        while ready := [i for i in after if i not in placed and after[i] <= placed]:
            ordered += ready
            placed |= set(ready)
        replace: dict[int, Node] = {}
        notes = list(self.program.notes)
        for i in ordered:
            _, loop, _, _, outs = found[i]
            for t, values in enumerate(outs):
                position = slice_axis(loop, 0, t, 1, 1, label=values[0].label)
                if len(values) == 1:
                    replace[values[0].id] = reshape(position, values[0].shape, label=values[0].label)
                    continue
                offset = 0
                for value in values:
                    part = slice_axis(position, position.rank - 1, offset, 1, value.size, label=value.label)
                    replace[value.id] = reshape(part, value.shape, label=value.label)
                    offset += value.size
            size = len(loop.body_nodes())
            carried = f"{len(outs[0])} values carried as one" if len(outs[0]) > 1 else "h"
            notes.append(
                f"{ROLLED_BODY_NOTE} {loop.steps} unrolled positions of a {size}-node body "
                f"({carried} {list(loop.carried.shape)}, {len(loop.windows)} window(s)) into one loop"
            )
        return _replaced(self.program, replace, notes) if ordered else self.program


def _replaced(program: Program, replace: dict[int, Node], notes: list[str]) -> Program:
    """``program`` with each node of ``replace`` read as its replacement (a node over the old ones),
    everything above rebuilt."""
    done: dict[int, Node] = {}
    for root in program.outputs.values():
        stack: list[tuple[Node, bool]] = [(root, False)]
        entered: set[int] = set()
        while stack:
            node, ready = stack.pop()
            if node.id in done:
                continue
            target = replace.get(node.id)
            if ready:
                if target is not None and target.id not in done:
                    raise ir.CompileError(f"{node}: a rolled recurrence reads its own positions")
                done[node.id] = (
                    done[target.id] if target is not None else with_inputs(node, [done[c.id] for c in node.inputs()])
                )
                continue
            # entered again before it is done: only a cycle, which run() rules out (a compiler bug)
            if node.id in entered:
                raise ir.CompileError(f"{node}: a rolled recurrence reads its own positions")
            entered.add(node.id)
            stack.append((node, True))
            if target is not None:
                stack.append((target, False))
            else:
                stack += [(c, False) for c in node.inputs() if c.id not in done]
    outputs = {name: done[node.id] for name, node in program.outputs.items()}
    return Program(program.inputs, program.states, outputs, program.state_of, program.source, notes)


def simplify(
    program: Program,
    *,
    compose_input: bool | None = None,
    roll_recurrences: bool | None = None,
    roll_bodies: bool | None = None,
    split: bool | None = None,
) -> Program:
    """The passes in order: slices sink first (composing would hide them inside longer index
    functions), then normalizations fold into their products (before maps compose, while a
    broadcast is still a Map of its own), then products of constants fold, then maps compose,
    which exposes chains to merge. Unrolled recurrences roll into loops before all of them: Elman
    cells into Recur, then any other cell into a BodyLoop."""
    if ROLL_RECURRENCES if roll_recurrences is None else roll_recurrences:
        program = RollRecurrences(program).run()
    if ROLL_BODIES if roll_bodies is None else roll_bodies:
        program = RollBodies(program).run()
    program = SinkSlices(program).run()
    if FOLD_NORMS:
        program = FoldNorms(program).run()
    if FOLD_CONSTANTS:
        program = FoldConstants(program).run()
    if COMPOSE_INPUT_PRODUCTS if compose_input is None else compose_input:
        before = program
        program = ComposeInputProducts(program).run()
        if PUBLISH_FRAME_SCALARS:
            program = PublishFrameScalars(program).run()
        if any(program.outputs[name] is not node for name, node in before.outputs.items()):
            program.notes.append(COMPOSED_NOTE)  # a Program of the pass's own (Rebuilder.run)
    if SCAN_COLUMNS:
        program = ScanColumns(program).run()
    if SPLIT_PRODUCTS if split is None else split:
        program = SplitProducts(program).run()
    program = ComposeMaps(program).run()
    program = MergeCommon(program).run()
    return program


__all__ = [
    "ComposeInputProducts",
    "FoldConstants",
    "FoldNorms",
    "PublishFrameScalars",
    "RollRecurrences",
    "ScanColumns",
    "SplitProducts",
    "composed_inputs",
    "rolled_recurrences",
    "runs_in_columns",
    "simplify",
    "split_products",
]
