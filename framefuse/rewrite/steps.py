"""Per-step structure left in a graph, found without the rewrite passes' own machinery.

The report's "per-timestep ops left" must not depend on what the passes recognised (a loop they
never saw would otherwise count as 0). This module looks at the graph alone: an unrolled loop is
the same step subgraph written T times, each copy reading what the previous one computed. So:

- every node gets a structural hash of its neighbourhood ``ROUNDS`` producers deep
  (Weisfeiler–Lehman style): op, attributes, and for each input either the producer's hash or a
  leaf key. Parameters (initialisers, large constants) are keyed by *identity*: the steps of one
  loop read the same weight tensors, the layers of a stack read different ones. Small constants
  are keyed by value (the exporter writes one per use), and integer scalars and one-element index
  vectors are wildcards (the Gather/Slice index is the one thing that differs between steps);
- nodes with equal hashes are copies of one computation; a group counts as per-step when at
  least ``MIN_CHAINED`` of its copies are *chained*: one is computed from another (a carried
  value flows from copy to copy). Copies that do not feed each other (a read-out applied to every
  frame, lifted or not) are not a loop.

Data movement (slices, reshapes, concats, casts) is not counted: it is what stays around a fused
op, and a KV-cache append is no recurrence.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.plugins.registry import DOMAIN
from framefuse.rewrite.unrolled.chains import DATA_MOVEMENT as CHAIN_DATA_MOVEMENT
from framefuse.rewrite.util import const_value

ROUNDS = 2
MIN_CHAINED = 3
SMALL_CONSTANT = 16  # elements; larger constants are parameters, keyed by identity
# What only moves data, as the passes see it, plus the shape and indexing plumbing of stacked
# outputs: none of it is a per-step computation.
DATA_MOVEMENT = CHAIN_DATA_MOVEMENT | {
    "Shape",
    "Size",
    "ScatterND",
    "ScatterElements",
    "GatherElements",
    "GatherND",
    "Tile",
}


# A stack's Concat reads step t at position t: the position must not tell the steps apart.
_VARIADIC = {"Concat", "Sum", "Max", "Min", "Mean"}


def _digest(*parts) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:20]


def _attr_repr(value) -> str:
    if isinstance(value, gs.Graph):
        return f"graph:{len(value.nodes)}"
    if isinstance(value, gs.Constant):
        return _digest(np.asarray(value.values).tobytes(), str(value.dtype))
    if isinstance(value, np.ndarray):
        return _digest(value.tobytes(), str(value.dtype), value.shape)
    return repr(value)


def _leaf_key(t: gs.Tensor, graph_inputs: set[str]) -> str:
    value = const_value(t)
    if value is not None:
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.integer) and value.size <= 1:
            return "index"
        if value.size <= SMALL_CONSTANT or not isinstance(t, gs.Constant):  # a Constant node: one per use
            return "c:" + _digest(value.tobytes(), str(value.dtype), value.shape)
        return "p:" + t.name
    if t.name in graph_inputs:
        return "in:" + t.name
    return "t:" + t.name


def chained_step_nodes(graph: gs.Graph) -> list[gs.Node]:
    """Non-framefuse, non-data-movement nodes that are chained copies of one step (see module doc)."""
    graph.toposort()
    nodes = [n for n in graph.nodes]
    if not nodes:
        return []

    graph_inputs = {t.name for t in graph.inputs}
    producer_of: dict[str, tuple[int, int]] = {}
    consumers: list[list[tuple[int, int, int]]] = [[] for _ in nodes]  # (consumer, output, input position)
    for i, node in enumerate(nodes):
        if node.op == "Constant":
            continue  # its value is the leaf key: one Constant per use must not tell steps apart
        for k, out in enumerate(node.outputs):
            producer_of[out.name] = (i, k)
    for i, node in enumerate(nodes):
        for pos, t in enumerate(node.inputs):
            found = producer_of.get(t.name)
            if found is not None:
                consumers[found[0]].append((i, found[1], pos))

    base, leaf_parts = [], []
    for node in nodes:
        attrs = tuple(sorted((k, _attr_repr(v)) for k, v in node.attrs.items()))
        base.append(_digest(node.op, node.domain or "", attrs))
        leaf_parts.append(
            [
                None if (t.name in producer_of) else ("" if not t.name else _leaf_key(t, graph_inputs))
                for t in node.inputs
            ]
        )
    hashes = [_digest(b, tuple(lp)) for b, lp in zip(base, leaf_parts)]
    for _ in range(ROUNDS):
        new = []
        for i, node in enumerate(nodes):
            parts = []
            for t, leaf in zip(node.inputs, leaf_parts[i]):
                if leaf is not None:
                    parts.append(leaf)
                else:
                    j, k = producer_of[t.name]
                    parts.append((hashes[j], k))
            # Consumers too: two norms of a layer stack read no parameter upstream for many nodes,
            # but the weights they feed differ; the copies of a loop step feed equal copies.
            down = sorted((hashes[c], k, -1 if nodes[c].op in _VARIADIC else pos) for c, k, pos in consumers[i])
            new.append(_digest(base[i], tuple(parts), tuple(down)))
        hashes = new

    groups: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        if node.domain == DOMAIN or node.op in DATA_MOVEMENT:
            continue
        groups.setdefault(hashes[i], []).append(i)
    groups = {h: m for h, m in groups.items() if len(m) >= MIN_CHAINED}
    if not groups:
        return []

    # ancestors[i]: bitset of the nodes node i is computed from.
    ancestors = [0] * len(nodes)
    for i, node in enumerate(nodes):
        acc = 0
        for t in node.inputs:
            found = producer_of.get(t.name)
            if found is not None:
                j = found[0]
                acc |= ancestors[j] | (1 << j)
        ancestors[i] = acc

    # descendants[i]: bitset of the nodes computed from node i.
    descendants = [0] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        acc = 0
        for c, _, _ in consumers[i]:
            acc |= descendants[c] | (1 << c)
        descendants[i] = acc
    params = [frozenset(t.name for t in node.inputs if _leaf_key(t, graph_inputs).startswith("p:")) for node in nodes]

    counted = 0
    for members in groups.values():
        members = sorted(members)
        # Link each copy to the nearest later copy computed from it: a step of the loop.
        links: dict[frozenset, list[int]] = {}
        for a in members:
            later = [b for b in members if b > a and descendants[a] >> b & 1]
            if not later:
                continue
            b = later[0]
            between = (descendants[a] & ancestors[b]) | (1 << b)
            used = frozenset().union(*(params[k] for k in _bits(between)))
            # The steps of one loop read the same parameters; the layers of a stack, other ones.
            links.setdefault(used, []).append((a, b, between))
        for same in links.values():
            # Steps follow one another: copy a → b → c …; two copies that both feed a third are
            # no loop (the q and k halves of a rotary embedding feeding the next layer).
            nxt = {a: (b, between) for a, b, between in same}
            targets = {b for _, b, _ in same}
            for a in nxt:
                if a in targets:
                    continue
                path, cur = [], a
                while cur in nxt:
                    cur, between = nxt[cur]
                    path.append(between)
                if len(path) + 1 >= MIN_CHAINED:
                    for between in path:
                        counted |= between
    return [nodes[k] for k in _bits(counted) if nodes[k].domain != DOMAIN and nodes[k].op not in DATA_MOVEMENT]


def _bits(mask: int):
    k = 0
    while mask:
        if mask & 1:
            yield k
        mask >>= 1
        k += 1


def chained_step_ops(graph: gs.Graph) -> int:
    return len(chained_step_nodes(graph))
