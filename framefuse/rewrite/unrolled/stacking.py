"""Output stacking written as in-place writes or growing concatenations, turned into one stack.

``out[:, t] = h`` in a Python loop exports as a chain of T ``ScatterND`` nodes (each writes one
frame into the buffer the previous one returned); ``out = torch.cat([out, h[:, None]], 1)`` as a
chain of T ``Concat`` nodes. Both carry the buffer from step to step, so they look like a
recurrence that is not one. This pass rewrites them, exactly, into one node over all steps:

- a ScatterND chain whose indices are constants and whose writes never overlap becomes
  ``ScatterND(base, stack(indices), stack(updates))``: ONNX applies all updates of one
  ScatterND, and with disjoint indices the order of writes does not matter;
- a Concat whose input is another Concat over the same axis (read by nothing else) is merged
  into it (concatenation is associative).

``stack(updates)`` is a Concat of size-1 slices, the collector the Timeline and ``restack``
understand, so once the recurrence is fused the per-step reads are lifted as for ``torch.stack``.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import AnchoredPass, Match, PassResult, RewriteContext
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.graphutil import Shapes, const_value, is_framefuse, producer

MIN_WRITES = 2
# The pipeline's folding limit: larger tensors stay computed at run time.
FOLD_SIZE_THRESHOLD = 64 << 20


class OutputStackingPass(AnchoredPass):
    """Anchors: the last write of each ScatterND chain (the growing Concats merged before them)."""

    name = "unrolled-output-stacking"

    def run(self, graph: gs.Graph, ctx: RewriteContext) -> PassResult:
        merged = _merge_concats(graph)
        graph.cleanup().toposort()
        self._shapes: Shapes | None = None
        self._refold = False
        result = super().run(graph, ctx)
        if merged:
            result.matches.insert(0, Match(self.name, "Concat", "(merged)", [], {"merged_concats": merged}))
        graph.cleanup().toposort()
        if self._refold:
            _refold(graph)
        return result

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.op != "ScatterND" or is_framefuse(node) or node not in graph.nodes:
                continue
            if _next_scatter(graph, node) is not None:
                continue  # not the last write of a chain
            chain = _scatter_chain(graph, node)
            if len(chain) >= MIN_WRITES:
                yield chain

    def where(self, chain) -> str:
        return chain[-1].name

    def rewrite(self, graph: gs.Graph, ctx: RewriteContext, chain) -> Match | None:
        self._shapes = self._shapes or Shapes(graph)
        replaced = _replace_chain(graph, ctx, chain, self._shapes)
        if replaced is None:
            return None
        new_node, shape_reads = replaced
        self._refold = self._refold or shape_reads > 0
        detail = {"writes": len(chain), "shape_reads": shape_reads}
        return Match(self.name, "ScatterND", new_node.name, [n.name for n in chain], detail)


def _refold(graph: gs.Graph) -> None:
    """Constant-fold again once the intermediate buffers' shapes are constants: the exporter's
    index arithmetic for ``out[:, t]`` (Range/Reshape/Shape feeding each write's Expand and Reshape
    targets) read those shapes, so it was not constant when the pipeline folded first. Folded, every
    step's update is the same computation on its frame, which ``restack`` lifts once the recurrence
    is fused; left unfolded, T copies of that arithmetic would stay in the graph."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # folding runs ORT; its optimiser warnings are noise
    graph.fold_constants(fold_shapes=True, error_ok=True, size_threshold=FOLD_SIZE_THRESHOLD).cleanup().toposort()


def _merge_concats(graph: gs.Graph) -> int:
    merged = 0
    changed = True
    while changed:
        changed = False
        for node in graph.nodes:
            if node.op != "Concat" or is_framefuse(node):
                continue
            axis = int(node.attrs.get("axis", 0))
            # torch.cat([empty, h]) starts a growing concat from a zero-length buffer: drop it.
            empty = [
                t
                for t in node.inputs
                if t.shape is not None and len(t.shape) > 0 and isinstance(t.shape[axis], int) and t.shape[axis] == 0
            ]
            if empty and len(empty) < len(node.inputs):
                kept = [t for t in node.inputs if all(t is not e for e in empty)]
                node.inputs.clear()
                node.inputs.extend(kept)
                merged += 1
                changed = True
                break
            for k, t in enumerate(node.inputs):
                inner = producer(t)
                if (
                    inner is None
                    or inner.op != "Concat"
                    or is_framefuse(inner)
                    or len(t.outputs) != 1
                    or t in graph.outputs
                    or int(inner.attrs.get("axis", 0)) != axis
                ):
                    continue
                rank_out = len(node.outputs[0].shape or [])
                rank_in = len(t.shape or [])
                if axis < 0 and (not rank_out or rank_out != rank_in):
                    continue  # a negative axis is the same axis only at the same rank
                spliced = [*node.inputs[:k], *inner.inputs, *node.inputs[k + 1 :]]
                node.inputs.clear()
                node.inputs.extend(spliced)
                merged += 1
                changed = True
                break
    return merged


_SHAPE_PATH = {"Gather", "Slice", "Reshape", "Unsqueeze", "Squeeze", "Transpose", "Identity", "Cast"}


def _shape_readers(t: gs.Tensor, skip: gs.Node | None) -> list[gs.Node] | None:
    """The Shape nodes through which everything but ``skip`` reads ``t`` (``out[:, t].shape`` in
    the exporter's index arithmetic), or None when something reads its values."""
    found = []
    for node in t.outputs:
        if node is skip:
            continue
        if node.op == "Shape":
            found.append(node)
        elif node.op in _SHAPE_PATH and node.outputs:
            inner = _shape_readers(node.outputs[0], None)
            if inner is None:
                return None
            found += inner
        else:
            return None
    return found


def _next_scatter(graph: gs.Graph, node: gs.Node) -> gs.Node | None:
    out = node.outputs[0]
    if out in graph.outputs:
        return None
    nxt = [n for n in out.outputs if n.op == "ScatterND" and n.inputs[0] is out]
    if len(nxt) == 1 and _shape_readers(out, nxt[0]) is not None:
        return nxt[0]
    return None


def _static_value(t: gs.Tensor, shapes: Shapes):
    """The value of ``t`` when it is computed from constants and the static shapes of tensors
    only (the exporter's index arithmetic for ``out[:, t]``), by ONNX's reference evaluator."""
    value = const_value(t)
    if value is not None:
        return np.asarray(value)
    import onnx
    from onnx.reference import ReferenceEvaluator

    nodes, inits, seen = [], {}, set()

    def visit(x: gs.Tensor) -> bool:
        if not x.name or x.name in seen:
            return True
        seen.add(x.name)
        v = const_value(x)
        if v is not None:
            inits[x.name] = np.asarray(v)
            return True
        node = producer(x)
        if node is None or is_framefuse(node):
            return False
        if node.op == "Shape":
            shape = shapes.shape(node.inputs[0])
            if shape is None:  # an index tensor of data-dependent length (Range): evaluate it too
                if not visit(node.inputs[0]):
                    return False
                nodes.append(node)
                return True
            start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
            inits[x.name] = np.asarray(shape[start : None if end is None else int(end)], dtype=np.int64)
            return True
        if not all(visit(i) for i in node.inputs):
            return False
        nodes.append(node)
        return True

    if not visit(t) or len(nodes) > 64:
        return None
    try:
        onnx_nodes = [
            onnx.helper.make_node(
                n.op,
                [i.name for i in n.inputs],
                [o.name for o in n.outputs],
                **{k: v for k, v in n.attrs.items() if isinstance(v, (int, float, str, list, tuple))},
            )
            for n in nodes
        ]
        graph = onnx.helper.make_graph(
            onnx_nodes,
            "index",
            [],
            [onnx.helper.make_tensor_value_info(t.name, onnx.TensorProto.UNDEFINED, None)],
            [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()],
        )
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
        return np.asarray(ReferenceEvaluator(model).run(None, {})[0])
    except Exception:  # noqa: BLE001 - not evaluable: the chain is left alone
        return None


def _scatter_chain(graph: gs.Graph, last: gs.Node) -> list[gs.Node]:
    """The ScatterND nodes writing into one buffer, first to ``last``."""
    chain = [last]
    while True:
        data = chain[-1].inputs[0]
        prev = producer(data)
        if (
            prev is None
            or prev.op != "ScatterND"
            or is_framefuse(prev)
            or data in graph.outputs
            or _shape_readers(data, chain[-1]) is None
        ):
            break
        chain.append(prev)
    return chain[::-1]


def _replace_chain(
    graph: gs.Graph, ctx: RewriteContext, chain: list[gs.Node], shapes: Shapes
) -> tuple[gs.Node, int] | None:
    """(the one ScatterND now writing the chain's output, how many Shape reads of the intermediate
    buffers became constants), or None when the chain is left as it was."""
    if any(n.attrs.get("reduction", "none") not in ("none", b"none") for n in chain):
        return None
    indices = [_static_value(n.inputs[1], shapes) for n in chain]
    if any(i is None for i in indices) or len({i.shape for i in indices}) != 1:
        return None
    base = chain[0].inputs[0]
    base_shape = shapes.shape(base)
    update_shapes = {shapes.shape(n.inputs[2]) for n in chain}
    if base_shape is None or len(update_shapes) != 1 or None in update_shapes:
        return None
    depth = indices[0].shape[-1]
    # Disjoint writes: every index tuple (a slice of the trailing axes each) is written once.
    flat = np.concatenate([np.asarray(i, dtype=np.int64).reshape(-1, depth) for i in indices])
    flat = np.where(flat < 0, flat + np.asarray(base_shape[:depth]), flat)
    if len({tuple(row) for row in flat.tolist()}) != len(flat):
        return None
    # Readers of the intermediate buffers only take their (static) shape: they get constants, so
    # the old writes are dead once the chain is replaced. Each intermediate buffer is also read by
    # the next write of the chain, which is skipped here. All values are found before anything is
    # changed, so a chain left alone is left as it was.
    static_shapes = []
    for node, nxt in zip(chain[:-1], chain[1:]):
        readers = _shape_readers(node.outputs[0], nxt)
        if readers is None:
            return None
        for shape_node in readers:
            value = _static_value(shape_node.outputs[0], shapes)
            if value is None:
                return None
            static_shapes.append((shape_node, value))
    emit = GraphBuilder(graph, ctx, prefix=ctx.unique_name("output_stack"))
    (update_shape,) = update_shapes
    dtype = shapes.dtype(chain[0].inputs[2])
    pieces = [emit.unsqueeze(n.inputs[2], [0], (1, *update_shape), dtype) for n in chain]
    stacked = emit.node("Concat", pieces, (len(chain), *update_shape), dtype, attrs={"axis": 0})
    all_indices = emit.const(np.stack([np.asarray(i, dtype=np.int64) for i in indices]))
    out = chain[-1].outputs[0]
    for shape_node, value in static_shapes:
        const = emit.const(value.astype(np.int64))
        for reader in list(shape_node.outputs[0].outputs):
            for k, t in enumerate(reader.inputs):
                if t is shape_node.outputs[0]:
                    reader.inputs[k] = const
    node_out = emit.node("ScatterND", [base, all_indices, stacked], tuple(base_shape), shapes.dtype(out))
    new_node = producer(node_out)
    # The fused write takes over the chain's output tensor (graph outputs and readers stay wired).
    chain[-1].outputs.clear()
    new_node.outputs[0] = out
    return new_node, len(static_shapes)
