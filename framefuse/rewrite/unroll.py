"""ONNX ``Loop`` / ``Scan`` that no pass fused → their body repeated T times in the graph.

A recurrence left as a Loop or Scan node (an Elman cell, an MLP over ``[x, h]``, an LSTM-like cell
written by hand; ``LoopScanPass`` fuses only linear bodies) is something the cuda-graph engine cannot
plan and the step compiler can only take through its own API. Its trip count is static here
(static shapes), so the body is copied once per iteration into the graph, as torch's dynamo
export unrolls a Python loop: every engine then runs it, the step compiler runs the window as one
kernel, and the passes after this one see the copies like any unrolled export (the unrolled-cell
patterns fuse the copies they recognise).

Declined with the reason: a trip count that is not a constant, a condition the body computes, a
nested Loop / Scan / If in the body, more than ``UNROLL_MAX_NODES`` body nodes in all.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Declined, RewriteContext
from framefuse.rewrite.builder import GraphBuilder

# The most body nodes one Loop / Scan becomes (iterations x body nodes): past it the node is left
# as it is (ONNX Runtime and TensorRT run Loop / Scan themselves).
UNROLL_MAX_NODES = 1 << 13


def _graph_attrs(node: gs.Node) -> bool:
    return any(isinstance(v, gs.Graph) for v in node.attrs.values())


class UnrollLoopsPass(AnchoredPass):
    name = "unroll-loops"

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.op in ("Scan", "Loop") and node.domain in ("", "ai.onnx", None) and node.outputs:
                yield node

    def rewrite(self, graph: gs.Graph, ctx: RewriteContext, node: gs.Node) -> Declined:
        try:
            steps, size = self._scan(graph, ctx, node) if node.op == "Scan" else self._loop(graph, ctx, node)
        except Decline as exc:
            raise Decline(f"{node.op} left as it is: {exc}") from exc
        # copied, not fused (the unrolled-recurrence passes after this one may fuse the copies)
        return Declined(
            self.name, U.node_label(node), f"{node.op} not fused: unrolled into {steps} copies of its {size}-node body"
        )

    # -- the two node kinds ---------------------------------------------------------------

    def _check_body(self, body: gs.Graph, steps: int) -> None:
        if any(_graph_attrs(n) for n in body.nodes):
            raise Decline("its body holds a nested Loop / Scan / If")
        if steps * max(len(body.nodes), 1) > UNROLL_MAX_NODES:
            raise Decline(
                f"{steps} iterations of a {len(body.nodes)}-node body are more than {UNROLL_MAX_NODES} nodes unrolled"
            )

    def _scan(self, graph, ctx, node: gs.Node) -> tuple[int, int]:
        gb = GraphBuilder(graph, ctx)
        body: gs.Graph = node.attrs["body"]
        m = int(node.attrs["num_scan_inputs"])
        n = len(node.inputs) - m
        k = len(body.outputs) - n
        states, xs = list(node.inputs[:n]), node.inputs[n:]
        in_axes = [int(a) for a in node.attrs.get("scan_input_axes") or [0] * m]
        in_dirs = [int(d) for d in node.attrs.get("scan_input_directions") or [0] * m]
        out_axes = [int(a) for a in node.attrs.get("scan_output_axes") or [0] * k]
        out_dirs = [int(d) for d in node.attrs.get("scan_output_directions") or [0] * k]
        shapes = [U.static_shape(x) for x in xs]
        if any(s is None for s in shapes):
            raise Decline("a scanned input without a static shape")
        in_axes = [a % len(s) for a, s in zip(in_axes, shapes)]
        lengths = {s[a] for a, s in zip(in_axes, shapes)}
        if len(lengths) != 1:
            raise Decline(f"scanned inputs of lengths {sorted(lengths)}")
        (steps,) = lengths
        self._check_body(body, steps)
        out_axes = self._output_axes(body.outputs[n:], out_axes)
        collected: list[list] = [[] for _ in range(k)]
        for t in range(steps):
            feeds = states + [gb.gather(x, steps - 1 - t if d else t, a) for x, a, d in zip(xs, in_axes, in_dirs)]
            outs = self._copy_body(graph, ctx, node, body, feeds, t)
            states = outs[:n]
            for j, value in enumerate(outs[n:]):
                collected[j].append(value)
        self._finish(graph, ctx, node, states, collected, out_axes, out_dirs)
        return steps, len(body.nodes)

    def _loop(self, graph, ctx, node: gs.Node) -> tuple[int, int]:
        gb = GraphBuilder(graph, ctx)
        body: gs.Graph = node.attrs["body"]
        trip, cond = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        carried = list(node.inputs[2:])
        trip_value = None if U.is_empty(trip) else U.const_value(trip)
        if trip_value is None:
            raise Decline("its trip count M is not a constant")
        steps = int(np.ravel(trip_value)[0])
        if not U.is_empty(cond):
            value = U.const_value(cond)
            if value is None or not bool(np.ravel(value)[0]):
                raise Decline("its initial condition is not a constant true")
        cond_in, cond_out = body.inputs[1], U.strip_identity(body.outputs[0])
        value = U.const_value(cond_out)
        if not (cond_out is cond_in or (value is not None and bool(np.ravel(value)[0]))):
            raise Decline("its body computes its own stop condition (a trip count known only at run time)")
        self._check_body(body, steps)
        k = len(body.outputs) - 1 - len(carried)
        if k and not steps:
            raise Decline("it runs no iteration, so its scan outputs have no shape")
        axes = self._output_axes(body.outputs[1 + len(carried) :], [0] * k)
        collected: list[list] = [[] for _ in range(k)]
        for t in range(steps):
            iteration = gb.const(np.array(t, dtype=np.int64), name="iteration")
            keep_going = gb.const(np.array(True), name="condition")
            outs = self._copy_body(graph, ctx, node, body, [iteration, keep_going, *carried], t)[1:]
            carried = outs[: len(carried)]
            for j, value in enumerate(outs[len(carried) :]):
                collected[j].append(value)
        self._finish(graph, ctx, node, carried, collected, axes, [0] * k)
        return steps, len(body.nodes)

    # -- shared -----------------------------------------------------------------------------

    @staticmethod
    def _output_axes(elements: list, axes: list) -> list:
        """The scan outputs' stacking axes, non-negative (before anything is added to the graph)."""
        out = []
        for element, axis in zip(elements, axes):
            if axis < 0:
                shape = U.static_shape(element)
                if shape is None:
                    raise Decline(f"scan output {element.name} has no static rank for axis {axis}")
                axis %= len(shape) + 1
            out.append(axis)
        return out

    def _copy_body(self, graph, ctx, node, body: gs.Graph, feeds: list, t: int) -> list:
        """The body's nodes once more in ``graph``, its inputs bound to ``feeds``; returns the
        tensors that hold its outputs for this iteration."""
        mapping = {id(b): f for b, f in zip(body.inputs, feeds)}
        prefix = f"{U.node_label(node)}_t{t}"
        for bnode in body.nodes:
            outputs = []
            for out in bnode.outputs:
                copy = gs.Variable(ctx.unique_name(f"{prefix}_{out.name}"), dtype=out.dtype, shape=out.shape)
                mapping[id(out)] = copy
                outputs.append(copy)
            inputs = [mapping.get(id(i), i) for i in bnode.inputs]
            graph.nodes.append(
                gs.Node(
                    op=bnode.op,
                    name=ctx.unique_name(f"{prefix}_{bnode.name or bnode.op}"),
                    attrs=dict(bnode.attrs),
                    inputs=inputs,
                    outputs=outputs,
                    domain=bnode.domain,
                )
            )
        return [mapping.get(id(o), o) for o in body.outputs]

    def _finish(self, graph, ctx, node, finals: list, collected: list, axes: list, directions: list) -> None:
        gb = GraphBuilder(graph, ctx)
        # a copy: replacing a graph output takes it out of node.outputs (onnx-graphsurgeon keeps a
        # tensor's writer and the node's outputs in step), which would shift the list under the loop
        outputs = list(node.outputs)
        for old, new in zip(outputs, finals):
            if not U.is_empty(old):
                U.replace_tensor(graph, old, new)
        for old, values, axis, backwards in zip(outputs[len(finals) :], collected, axes, directions):
            if U.is_empty(old) or not (old.outputs or U.is_graph_output(graph, old)):
                continue
            values = values[::-1] if backwards else values
            stacked = gb.concat([gb.unsqueeze(v, axis) for v in values], axis)
            U.replace_tensor(graph, old, stacked)
        U.detach_outputs(node)
