"""ONNX ``Scan`` / ``Loop`` whose body is a linear recurrence → framefuse ``LinearScan``.

A body qualifies when its one carried state ``h`` is updated as ``h' = A ⊙ h + Bx`` where ``A``
and ``Bx`` are computed from the per-step slices of the scanned tensors (``Scan`` inputs, or
``Gather(X, iteration, axis=0)`` of an outer tensor in a ``Loop``), constants and outer-scope
tensors only, through elementwise ops (and MatMul by a weight). Those parts do not depend on
``h``, so they are hoisted out of the loop and computed for all T steps at once; the recurrence
itself becomes one LinearScan. The per-step outputs may be ``h'`` (stacked over time) and the
final state.

Other bodies (an LSTM-like cell, a state used inside a nonlinearity, several carried states,
reverse scans, non-default axes) are recognised and declined with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Match, RewriteContext, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder

# Ops that act on each time step independently and keep their meaning when a leading time axis
# is added to their operands (numpy broadcasting aligns from the right).
ELEMENTWISE = {
    "Identity",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Neg",
    "Relu",
    "Abs",
    "Sqrt",
    "Reciprocal",
    "Softplus",
    "Erf",
    "Sin",
    "Cos",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Cast",
    "HardSigmoid",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Softsign",
}


class _Hoister:
    """Rebuilds body expressions that do not depend on the state in the outer graph, over all T."""

    def __init__(
        self,
        graph: gs.Graph,
        ctx: RewriteContext,
        body: gs.Graph,
        state: gs.Tensor,
        slices: dict[int, gs.Tensor],
        T: int,
    ):
        self.graph, self.ctx, self.body, self.state, self.slices, self.T = graph, ctx, body, state, slices, T
        self.body_inputs = {id(t) for t in body.inputs}
        self.memo: dict[int, gs.Tensor] = {}
        self.build = GraphBuilder(graph, ctx)

    def outer(self, t: gs.Tensor) -> gs.Tensor:
        key = id(t)
        if key in self.memo:
            return self.memo[key]
        if t is self.state:
            raise Decline(
                "the update is not affine in the state (the state appears inside a nonlinear term or in A / B)"
            )
        if key in self.slices:
            result = self.slices[key]
        elif isinstance(t, gs.Constant):
            result = t
        else:
            node = U.producer(t)
            value = U.const_value(t)
            if value is not None:
                result = self.build.const(value, name="hoisted_const")
            elif node is None:
                if key in self.body_inputs:
                    raise Decline(f"body input {t.name} is not a scanned slice")
                result = t  # an outer-scope tensor: the same for every step
            elif node.op in ELEMENTWISE or (
                node.op == "MatMul"
                and U.const_value(node.inputs[1]) is not None
                and U.static_shape(node.inputs[1]) is not None
                and len(U.static_shape(node.inputs[1])) == 2
            ):
                ins = [self.outer(i) for i in node.inputs]
                shape = U.static_shape(t)
                result = self.build.node(
                    node.op,
                    ins,
                    shape=(self.T,) + shape if shape is not None else None,
                    dtype=t.dtype,
                    attrs=dict(node.attrs),
                    name=f"hoisted_{node.op}",
                )
            else:
                raise Decline(f"op {node.op} ({U.node_label(node)}) in the recurrence body is not elementwise")
        self.memo[key] = result
        return result


def _affine_parts(h_out: gs.Tensor, h_in: gs.Tensor) -> tuple[gs.Tensor, gs.Tensor]:
    """(A, Bx) with h_out = A ⊙ h_in + Bx, read structurally; A/Bx are checked later by hoisting."""
    h_out = U.strip_identity(h_out)
    add = U.producer_op(h_out, "Add")
    if add is None:
        raise Decline("the new state is not an Add of A ⊙ h and B (not a linear recurrence h = a ⊙ h + b)")
    for i in (0, 1):
        mul = U.producer_op(add.inputs[i], "Mul")
        if mul is None:
            continue
        m0, m1 = mul.inputs
        if U.strip_identity(m0) is h_in:
            return m1, add.inputs[1 - i]
        if U.strip_identity(m1) is h_in:
            return m0, add.inputs[1 - i]
    raise Decline("the new state is not A ⊙ h + B with h the carried state")


def _describe_body(body) -> str:
    """What kind of recurrence a Loop/Scan body looks like, for the decline message."""
    if not isinstance(body, gs.Graph):
        return "no body"
    ops = {n.op for n in body.nodes}
    gated = "Sigmoid" in ops and "Tanh" in ops
    projects = bool(ops & {"MatMul", "Gemm"})
    carried = len(body.outputs)
    if gated and projects:
        return "LSTM/GRU-like cell body: gates through Sigmoid/Tanh of a projection of the state"
    if projects:
        return "body with a matrix product of the state"
    return f"elementwise body, {carried} outputs"


class LoopScanPass(AnchoredPass):
    name = "loops"

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.op in ("Scan", "Loop") and node.domain in ("", "ai.onnx", None):
                yield node

    def rewrite(self, graph, ctx, node: gs.Node) -> Match:
        return self._scan(graph, ctx, node) if node.op == "Scan" else self._loop(graph, ctx, node)

    def reason(self, node: gs.Node, exc: Decline) -> str:
        return f"{node.op} ({_describe_body(node.attrs.get('body'))}): {exc}"

    # -- Scan -----------------------------------------------------------------------------

    def _scan(self, graph, ctx, node: gs.Node) -> Match:
        body: gs.Graph = node.attrs["body"]
        m = int(node.attrs["num_scan_inputs"])
        n_state = len(node.inputs) - m
        if n_state != 1:
            raise Decline(f"{n_state} carried states (only one carried state h is fused)")
        for attr in ("scan_input_axes", "scan_input_directions", "scan_output_axes", "scan_output_directions"):
            values = node.attrs.get(attr)
            if values is not None and any(int(v) != 0 for v in values):
                raise Decline(f"{attr}={list(values)} (only time-major, forward scans are fused)")
        scanned = node.inputs[1:]
        shapes = [U.static_shape(t) for t in scanned]
        if not scanned or any(s is None for s in shapes):
            raise Decline("scanned inputs without static shapes")
        T = shapes[0][0]
        slices = {id(bi): outer for bi, outer in zip(body.inputs[1:], scanned)}
        h_in, h_out = body.inputs[0], body.outputs[0]
        return self._fuse(
            graph,
            ctx,
            node,
            body,
            T,
            node.inputs[0],
            h_in,
            h_out,
            slices,
            final_out=node.outputs[0],
            scan_body_outs=body.outputs[1:],
            scan_outs=node.outputs[1:],
        )

    # -- Loop -----------------------------------------------------------------------------

    def _loop(self, graph, ctx, node: gs.Node) -> Match:
        body: gs.Graph = node.attrs["body"]
        trip, cond = node.inputs[0], node.inputs[1]
        carried = node.inputs[2:]
        if len(carried) != 1:
            raise Decline(f"{len(carried)} loop-carried values (only one carried state h is fused)")
        trip_value = U.const_value(trip) if not U.is_empty(trip) else None
        if trip_value is None:
            raise Decline("trip count M is not a constant")
        T = int(np.ravel(trip_value)[0])
        if not U.is_empty(cond):
            cv = U.const_value(cond)
            if cv is None or not bool(np.ravel(cv)[0]):
                raise Decline("loop condition is not a constant true")
        iter_in, cond_in, h_in = body.inputs[:3]
        cond_out = U.strip_identity(body.outputs[0])
        cv = U.const_value(cond_out)
        if not (cond_out is cond_in or (cv is not None and bool(np.ravel(cv)[0]))):
            raise Decline("the body computes its own stop condition (data-dependent trip count)")
        # Per-step slices: Gather(X, iteration, axis=0) of an outer tensor X of length T.
        slices = {}
        for bnode in body.nodes:
            if (
                bnode.op == "Gather"
                and len(bnode.inputs) == 2
                and bnode.inputs[1] is iter_in
                and int(bnode.attrs.get("axis", 0)) == 0
            ):
                src = bnode.inputs[0]
                shape = U.static_shape(src)
                if shape is None or shape[0] != T:
                    raise Decline(f"{src.name} is indexed per iteration but has shape {shape}, not [{T}, ...]")
                slices[id(bnode.outputs[0])] = src
        if not slices:
            raise Decline("no per-iteration input (Gather(X, iteration_num, axis=0)) in the body")
        return self._fuse(
            graph,
            ctx,
            node,
            body,
            T,
            carried[0],
            h_in,
            body.outputs[1],
            slices,
            final_out=node.outputs[0],
            scan_body_outs=body.outputs[2:],
            scan_outs=node.outputs[1:],
        )

    # -- shared -------------------------------------------------------------------------

    def _fuse(self, graph, ctx, node, body, T, h0, h_in, h_out, slices, *, final_out, scan_body_outs, scan_outs):
        gb = GraphBuilder(graph, ctx)
        for bo, so in zip(scan_body_outs, scan_outs):
            if U.strip_identity(bo) is not U.strip_identity(h_out) and (so.outputs or U.is_graph_output(graph, so)):
                raise Decline(f"per-step output {bo.name} is not the new state (only h_t is stacked by LinearScan)")
        h_shape = U.static_shape(h0)
        if h_shape is None or len(h_shape) == 0:
            raise Decline(f"initial state {h0.name} has no static shape")
        dtype = U.np_dtype(h0)
        if dtype is None or dtype.kind != "f":
            raise Decline(f"state dtype {dtype} is not a float type")
        a_body, b_body = _affine_parts(h_out, h_in)
        hoister = _Hoister(graph, ctx, body, h_in, slices, T)
        a_full, b_full = hoister.outer(a_body), hoister.outer(b_body)

        # LinearScan layout: a, b [Bt, T, D]; h0 [Bt, D] (Bt = first state axis, D = the rest).
        bt = h_shape[0] if len(h_shape) >= 2 else 1
        d = int(np.prod(h_shape)) // bt
        full = (T,) + h_shape

        def to_btd(x):
            shape = U.static_shape(x)
            if shape != full:
                if shape is not None:
                    try:
                        if np.broadcast_shapes(shape, full) != full:
                            raise Decline(f"{x.name} of shape {list(shape)} does not broadcast to {list(full)}")
                    except ValueError:
                        raise Decline(f"{x.name} of shape {list(shape)} does not broadcast to {list(full)}") from None
                x = gb.node("Expand", [x, gb.const(np.asarray(full, np.int64), name="shape")], shape=full, dtype=dtype)
            x = gb.cast(x, dtype)
            return gb.transpose(gb.reshape(x, (T, bt, d)), [1, 0, 2])

        a, b = to_btd(a_full), to_btd(b_full)
        h0_2d = gb.cast(gb.reshape(h0, (bt, d)), np.float32)
        h_all = gb.var("LinearScan_h", dtype, (bt, T, d))
        h_last = gb.var("LinearScan_h_last", np.float32, (bt, d))
        fused = make_framefuse_node(graph, ctx, "LinearScan", [a, b, h0_2d], [h_all, h_last])
        if not U.is_empty(final_out) and (final_out.outputs or U.is_graph_output(graph, final_out)):
            U.replace_tensor(graph, final_out, gb.reshape(gb.cast(h_last, dtype), h_shape))
        for so in scan_outs:
            if not U.is_empty(so) and (so.outputs or U.is_graph_output(graph, so)):
                stacked = gb.reshape(gb.transpose(h_all, [1, 0, 2]), full)
                U.replace_tensor(graph, so, stacked)
        U.detach_outputs(node)
        return Match(
            self.name,
            "LinearScan",
            fused.name,
            [U.node_label(node)],
            {"source_op": node.op, "T": T, "state_shape": list(h_shape)},
        )
