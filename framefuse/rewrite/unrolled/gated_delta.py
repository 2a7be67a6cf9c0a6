"""GatedDeltaRuleScan from an unrolled gated delta rule (gated DeltaNet, as transformers' Qwen3-Next
`torch_recurrent_gated_delta_rule` and flash-linear-attention's naive recurrent form write it).

The step must be, with S [B, H, Dk, Dv], α_t = exp(g_t) broadcast to [B, H, 1, 1], k_t, q_t
[B, H, Dk], v_t [B, H, Dv], β_t [B, H, 1] (commutative operand orders accepted):

    S' = S·α_t;   kv = Σ_{Dk} S'·k_t[..., None];   δ = (v_t − kv)·β_t;   S_t = S' + k_t[..., None]·δ[..., None, :]

(the two uses of S' may be one tensor or the same computation written twice), and each state
may be read, besides by the next step, only by o_t = Σ_{Dk} S_t·q_t[..., None] (a Mul and a ReduceSum,
or Einsum('bhd,bhdm->bhm', q_t, S_t) as flash-linear-attention writes it). The read-outs become
the op's o, the last state its S_last. Anything else is declined with what did not match.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, make_framefuse_node
from framefuse.rewrite.unrolled.chains import Chain, Tmpl
from framefuse.rewrite.unrolled.common import UnrolledPass, lift_leaf
from framefuse.rewrite.unrolled.graphutil import const_value, producer, replace_producer
from framefuse.rewrite.unrolled.match import args, depends_on_hole, op, pairs

F32 = np.float32
_BCAST = ("Unsqueeze", "Reshape")


def _strip(t: gs.Tensor) -> gs.Tensor:
    """``t`` before the Unsqueeze/Reshape that broadcast it (x[..., None] → x)."""
    node = producer(t)
    while node is not None and node.op in _BCAST:
        t = node.inputs[0]
        node = producer(t)
    return t


def _unsqueezed_at(t: gs.Tensor, axis: int, rank: int) -> gs.Tensor | None:
    """x when ``t`` = Unsqueeze(x, axis) with ``axis`` given as a negative axis of the output rank."""
    node = producer(t)
    if node is None or node.op != "Unsqueeze" or len(node.inputs) < 2:
        return None
    axes = const_value(node.inputs[1])
    if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) % rank != axis % rank:
        return None
    return node.inputs[0]


def _reduce_axis(node: gs.Node, rank: int) -> int | None:
    """The single axis a ReduceSum without keepdims reduces (axes input or attribute)."""
    if node.op != "ReduceSum" or int(node.attrs.get("keepdims", 1)) != 0:
        return None
    axes = const_value(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1].name else None
    if axes is None and "axes" in node.attrs:
        axes = np.asarray(node.attrs["axes"])
    if axes is None or axes.size != 1:
        return None
    return int(axes.reshape(-1)[0]) % rank


def _einsum_readout_query(node: gs.Node, state: gs.Tensor) -> gs.Tensor | None:
    """q_t when ``node`` is Einsum('bhd,bhdm->bhm') of q_t and the state (either operand order,
    any letters): Σ over the key axis of q_t[..., None]·S."""
    if node.op != "Einsum" or len(node.inputs) != 2 or state not in node.inputs:
        return None
    equation = str(node.attrs.get("equation", "")).replace(" ", "")
    if "->" not in equation or "..." in equation:
        return None
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        return None
    s_index = 1 if node.inputs[1] is state else 0
    s_term, q_term = terms[s_index], terms[1 - s_index]
    if len(s_term) != 4 or len(q_term) != 3 or len(set(s_term)) != 4:
        return None
    if q_term != s_term[:3] or out != s_term[:2] + s_term[3]:
        return None
    return node.inputs[1 - s_index]


def _same_tmpl(a: Tmpl, b: Tmpl) -> bool:
    """Same sub-template: one tensor, or the same op on the same operands (S·α written twice)."""
    if a is b or a.tensor.name == b.tensor.name:
        return True
    if a.kind != b.kind:
        return False
    if a.kind == "hole":
        return True
    if a.kind == "leaf":
        return False
    if a.node.op != b.node.op or len(a.children) != len(b.children):
        return False
    return all(_same_tmpl(x, y) for x, y in zip(a.children, b.children)) or (
        a.node.op in ("Mul", "Add") and all(_same_tmpl(x, y) for x, y in zip(a.children, b.children[::-1]))
    )


def match_gated_delta(root: Tmpl, same_leaf=lambda a, b: a.name == b.name):
    """(α leaf, k column leaf, v leaf, β leaf) of S_t = S·α + k_col·(δ)[.., None, :], or a reason."""
    for decayed, correction in pairs(root, "Add"):
        dec = None
        for hole, alpha in pairs(decayed, "Mul"):
            if hole.kind == "hole" and alpha.kind == "leaf":
                dec = alpha
        if dec is None:
            continue
        for k_col, delta_row in pairs(correction, "Mul"):
            if k_col.kind != "leaf" or not depends_on_hole(delta_row) or op(delta_row) != "Unsqueeze":
                continue
            delta = delta_row.children[0]
            for err, beta in pairs(delta, "Mul"):
                if beta.kind != "leaf":
                    continue
                diff = args(err, "Sub", 2)
                if diff is None or diff[0].kind != "leaf" or op(diff[1]) != "ReduceSum":
                    continue
                v_t, red = diff
                prods = red.children[0]
                for s_dec, k_col2 in pairs(prods, "Mul"):
                    if k_col2.kind == "leaf" and same_leaf(k_col2.tensor, k_col.tensor) and _same_tmpl(s_dec, decayed):
                        return dec.tensor, k_col.tensor, v_t.tensor, beta.tensor, red.node, delta_row.node
            return "the correction is not k_t ⊗ ((v_t − Σ S'·k_t) · β_t)"
    return "the step is not S·α_t + k_t ⊗ δ_t with S·α_t the decayed state"


class GatedDeltaRuleScanPass(UnrolledPass):
    name = "unrolled-gated-delta-rule-scan"
    op_type = "GatedDeltaRuleScan"

    def accepts(self, chain: Chain, tl) -> bool:
        link = chain.structural_links[0]
        return op(link) == "Add" and any(n.op == "ReduceSum" for n in link.nodes())

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:
        shapes = lifter.shapes
        tl = lifter.tl

        def same_leaf(x, y):  # one tensor, or k_t[..., None] written twice (axis 3 or −1)
            if x.name == y.name:
                return True
            try:
                if lifter.key(x) == lifter.key(y):
                    return True
            except Decline:
                return False
            inner_x, inner_y = _unsqueezed_at(x, -1, 4), _unsqueezed_at(y, -1, 4)
            return inner_x is not None and inner_y is not None and same_leaf(inner_x, inner_y)

        found = match_gated_delta(chain.structural_links[0], same_leaf)
        if isinstance(found, str):
            raise Decline(found)
        alpha, k_col, v_t, beta, red, delta_row = found
        state_shape = shapes.need_shape(chain.states[-1])
        if len(state_shape) != 4 or shapes.dtype(chain.states[-1]) != F32:
            raise Decline(f"gated delta-rule state must be float32 [B, H, Dk, Dv], got {list(state_shape)}")
        b, h, dk, dv = state_shape
        if _reduce_axis(red, 4) != 2:
            raise Decline("Σ S'·k_t does not sum over the key axis (−2) of the state")
        delta_axes = const_value(delta_row.inputs[1]) if len(delta_row.inputs) > 1 else None
        if delta_axes is None or delta_axes.size != 1 or int(delta_axes.reshape(-1)[0]) % 4 != 2:
            raise Decline("δ is not unsqueezed at axis −2 (the outer product is not k_t ⊗ δ_t)")
        k_t = _unsqueezed_at(k_col, -1, 4)
        if k_t is None or shapes.shape(k_t) != (b, h, dk):
            raise Decline(f"the key {k_col.name!r} is not k_t[..., None] with k_t [{b}, {h}, {dk}]")
        if shapes.shape(v_t) != (b, h, dv):
            raise Decline(f"v_t has shape {shapes.shape(v_t)}, expected [{b}, {h}, {dv}]")
        beta_t = _strip(beta)
        if int(np.prod(shapes.need_shape(beta))) != b * h or int(np.prod(shapes.need_shape(beta_t))) != b * h:
            raise Decline(f"β has shape {shapes.shape(beta)}, not one value per (batch, head)")
        if int(np.prod(shapes.need_shape(alpha))) != b * h:
            raise Decline(f"the decay {alpha.name!r} has shape {shapes.shape(alpha)}, not one value per (batch, head)")
        exp_node = producer(_strip(alpha))
        log_needed = exp_node is None or exp_node.op != "Exp"
        g_t = _strip(alpha) if log_needed else exp_node.inputs[0]
        if int(np.prod(shapes.need_shape(g_t))) != b * h:
            raise Decline(f"the log decay {g_t.name!r} is not one value per (batch, head)")

        link_nodes = {id(n) for link in chain.links for n in link.nodes()}
        readouts, q_ts = [], []
        for i, state in enumerate(chain.states[1:], start=1):
            found_readout = None
            for node in state.outputs:
                if id(node) in link_nodes:
                    continue
                q_t = _einsum_readout_query(node, state)
                if q_t is not None:  # flash-linear-attention's einsum('bhd,bhdm->bhm', q_t, S)
                    if (
                        found_readout is not None
                        or shapes.shape(q_t) != (b, h, dk)
                        or tl.time_of(q_t) - {chain.first_frame + i - 1}
                    ):
                        raise Decline(f"state {state.name!r} is read by more than one read-out")
                    found_readout = node.outputs[0]
                    q_ts.append(q_t)
                    continue
                if node.op == "Mul" and len(node.inputs) == 2:
                    other = node.inputs[1] if node.inputs[0] is state else node.inputs[0]
                    q_t = _unsqueezed_at(other, -1, 4)
                sums = [n for n in node.outputs[0].outputs if _reduce_axis(n, 4) == 2] if q_t is not None else []
                if (
                    q_t is None
                    or len(sums) != 1
                    or len(node.outputs[0].outputs) != 1
                    or found_readout is not None
                    or shapes.shape(q_t) != (b, h, dk)
                    or tl.time_of(q_t) - {chain.first_frame + i - 1}
                ):
                    raise Decline(
                        f"state {state.name!r} is read by {node.op} node {node.name!r}, not only by the "
                        "next step and the read-out Σ S_t·q_t[..., None]"
                    )
                found_readout = sums[0].outputs[0]
                q_ts.append(q_t)
            if i < len(chain.states) - 1 and state in graph.outputs:
                raise Decline(f"intermediate state {state.name!r} is a graph output")
            readouts.append(found_readout)
        if any(r is None for r in readouts) and any(r is not None for r in readouts):
            raise Decline("some steps read out Σ S_t·q_t and others do not")
        if q_ts and len({lifter.key(q) for q in q_ts}) != 1:
            raise Decline("the read-outs use different queries at different steps")
        steps = chain.steps

        def heads_major(leaf, tail):  # [T, B, H, *tail] -> [B, H, T, *tail]
            lifted, _ = lift_leaf(lifter, emit, leaf)
            flat = emit.reshape(lifted, (steps, b, h, *tail), F32)
            return emit.transpose(flat, [1, 2, 0, *range(3, 3 + len(tail))], (b, h, steps, *tail), F32)

        for t in (k_t, v_t, beta_t, g_t):
            if shapes.dtype(t) != F32:
                raise Decline(f"{t.name!r} is {shapes.dtype(t)}, not float32 (lower the precision after the rewrite)")
        q = heads_major(q_ts[0], (dk,)) if q_ts else emit.const(np.zeros((b, h, steps, dk), F32))
        k = heads_major(k_t, (dk,))
        v = heads_major(v_t, (dv,))
        beta_in = heads_major(beta_t, ())
        g_in = heads_major(g_t, ())
        if log_needed:
            g_in = emit.node("Log", [g_in], (b, h, steps), F32)
        s0 = chain.states[0]
        s0_value = const_value(s0)
        s0_in = None if s0_value is not None and not np.any(s0_value) else s0
        if s0_in is not None and shapes.shape(s0) != state_shape:
            s0_in = emit.expand(s0_in, state_shape, F32)
        o = gs.Variable(ctx.unique_name("gated_delta_o"), dtype=F32, shape=[b, h, steps, dv])
        s_last = gs.Variable(ctx.unique_name("gated_delta_S_last"), dtype=F32, shape=list(state_shape))
        node = make_framefuse_node(graph, ctx, "GatedDeltaRuleScan", [q, k, v, g_in, beta_in, s0_in], [o, s_last])
        emit.new_nodes.append(node)
        for i, readout in enumerate(readouts):
            if readout is not None:
                replace_producer(readout, emit.gather(o, i, 2, (b, h, dv), F32), graph, emit)
        replace_producer(chain.states[-1], s_last, graph, emit)
        return {"node": node, "steps": steps, "state_shape": list(state_shape)}
