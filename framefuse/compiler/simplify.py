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

Each pass keeps the program's meaning exactly; the tests run the reference interpreter on the
program before and after.
"""

from __future__ import annotations

import hashlib

import numpy as np

from framefuse.compiler import iexpr as ix
from framefuse.compiler.ir import Concat, Dot, Ew, Leaf, Map, Node, Program, Reduce, reshape
from framefuse.compiler.naive import index_grid

MAP_EVAL_LIMIT = 1 << 22


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
        return Concat(inputs, node.axis, node.label)
    if isinstance(node, Ew):
        return Ew(node.op, inputs, node.params, node.label)
    if isinstance(node, Reduce):
        return Reduce(node.op, inputs[0], node.axes, node.label)
    if isinstance(node, Dot):
        return Dot(inputs[0], node.rows, node.label)
    return node


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
            return ("concat", node.axis, node.shape, tuple(c.id for c in node.inputs()))
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


def simplify(program: Program) -> Program:
    """The passes in order: slices sink first (composing would hide them inside longer index
    functions), then maps compose, which exposes chains to merge."""
    program = SinkSlices(program).run()
    program = ComposeMaps(program).run()
    program = MergeCommon(program).run()
    return program


__all__ = ["simplify"]
