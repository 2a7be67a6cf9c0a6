"""DeltaRuleScan from an unrolled delta-rule recurrence (DeltaNet).

The step must be S_t = S_{t−1} − β_t (S_{t−1} k_t − v_t) k_tᵀ (or S + β (v − S k) kᵀ), with
k_t, v_t columns [B, H, D, 1], k_tᵀ their transpose, β_t [B, H, 1, 1], the outer product written
as a broadcast Mul or a MatMul; every per-step state must be read only by the next step and by
the read-out o_t = S_t q_t (a MatMul with a column q_t). The read-outs become the op's output o,
the last state its S_last. The op keeps S as [Dk, Dv] (flash-linear-attention's layout, shared with
GatedDeltaRuleScan): this form's [Dv, Dk] state is transposed on the way in and out. Anything else
is declined with what did not match.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, make_framefuse_node
from framefuse.rewrite.unrolled.chains import Chain, Tmpl
from framefuse.rewrite.unrolled.common import UnrolledPass, lift_leaf
from framefuse.rewrite.unrolled.graphutil import const_value, producer, replace_producer
from framefuse.rewrite.unrolled.match import args, depends_on_hole, op


def _factors(tm: Tmpl, shapes) -> list[Tmpl]:
    """The factors of a product of Muls (an outer-product MatMul [..,D,1]@[..,1,K] counts as Mul)."""
    if op(tm) == "Mul":
        return [f for c in tm.children for f in _factors(c, shapes)]
    if op(tm) == "MatMul":
        a, b = tm.children
        sa, sb = shapes.shape(a.tensor), shapes.shape(b.tensor)
        if sa and sb and sa[-1] == 1 and sb[-2] == 1:
            return _factors(a, shapes) + _factors(b, shapes)
    return [tm]


def match_delta_rule(root: Tmpl, shapes):
    """(k column, v column, β, kᵀ) leaves, or a reason string."""
    if op(root) not in ("Sub", "Add") or root.children[0].kind != "hole":
        return "the step is not S − β(S k − v)kᵀ nor S + β(v − S k)kᵀ"
    factors = _factors(root.children[1], shapes)
    dependent = [f for f in factors if depends_on_hole(f)]
    leaves = [f for f in factors if not depends_on_hole(f)]
    if len(dependent) != 1 or len(leaves) != 2 or any(f.kind != "leaf" for f in leaves):
        return "the correction term is not β · (error) · kᵀ"
    diff = args(dependent[0], "Sub", 2)
    if diff is None:
        return "the error term is not a difference S k − v"
    sk, v = (diff[0], diff[1]) if op(root) == "Sub" else (diff[1], diff[0])
    mm = args(sk, "MatMul", 2)
    if mm is None or mm[0].kind != "hole" or mm[1].kind != "leaf" or v.kind != "leaf":
        return "the error term is not S k − v with S k a MatMul of the state and a key column"
    k_col = mm[1]
    # Which leaf is kᵀ: the Transpose of the key column (last two axes swapped).
    for k_t, beta in (leaves, leaves[::-1]):
        node = producer(k_t.tensor)
        if node is not None and node.op == "Transpose":
            perm = list(node.attrs.get("perm", []))
            rank = len(perm)
            if rank >= 2 and perm == [*range(rank - 2), rank - 1, rank - 2]:
                return k_col.tensor, v.tensor, beta.tensor, node.inputs[0]
    return "no kᵀ (a Transpose of the key column) in the correction term"


class DeltaRuleScanPass(UnrolledPass):
    name = "unrolled-delta-rule-scan"
    op_type = "DeltaRuleScan"

    def accepts(self, chain: Chain, tl) -> bool:
        link = chain.structural_links[0]
        return op(link) in ("Sub", "Add") and any(n.op == "MatMul" for n in link.nodes())

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:
        shapes = lifter.shapes
        tl = lifter.tl
        found = match_delta_rule(chain.structural_links[0], shapes)
        if isinstance(found, str):
            raise Decline(found)
        k_col, v_col, beta, k_src = found
        if lifter.key(k_src) != lifter.key(k_col):
            raise Decline("kᵀ is not the transpose of the key column used in S k")
        state_shape = shapes.need_shape(chain.states[-1])
        if len(state_shape) != 4 or shapes.dtype(chain.states[-1]) != np.float32:
            raise Decline(f"delta-rule state must be float32 [B, H, Dv, Dk], got {state_shape}")
        b, h, dv, dk = state_shape
        if shapes.need_shape(k_col) != (b, h, dk, 1) or shapes.need_shape(v_col) != (b, h, dv, 1):
            raise Decline(
                f"key/value columns {shapes.shape(k_col)}, {shapes.shape(v_col)} are not "
                f"[{b}, {h}, {dk}, 1] / [{b}, {h}, {dv}, 1]"
            )
        if shapes.need_shape(beta) != (b, h, 1, 1):
            raise Decline(f"β has shape {shapes.shape(beta)}, expected [{b}, {h}, 1, 1]")
        link_nodes = {id(n) for link in chain.links for n in link.nodes()}
        # The read-out o_t = S_t q_t of every state.
        readouts, q_cols = [], []
        for i, state in enumerate(chain.states[1:], start=1):
            found_readout = None
            for node in state.outputs:
                if id(node) in link_nodes:
                    continue
                q = node.inputs[1] if node.op == "MatMul" and node.inputs[0] is state else None
                if (
                    q is None
                    or found_readout is not None
                    or shapes.shape(q) != (b, h, dk, 1)
                    or tl.time_of(q) - {chain.first_frame + i - 1}
                ):
                    raise Decline(
                        f"state {state.name!r} is read by {node.op} node {node.name!r}, "
                        "not only by the next step and the read-out S_t q_t"
                    )
                found_readout = node.outputs[0]
                q_cols.append(q)
            if i < len(chain.states) - 1 and state in graph.outputs:
                raise Decline(f"intermediate state {state.name!r} is a graph output")
            readouts.append(found_readout)
        if any(r is None for r in readouts) and any(r is not None for r in readouts):
            raise Decline("some steps read out S_t q_t and others do not")
        if q_cols and len({lifter.key(q) for q in q_cols}) != 1:
            raise Decline("the read-outs use different queries at different steps")
        steps = chain.steps

        def heads_major(leaf, width):  # [T, B, H, width(, 1)] -> [B, H, T, width]
            lifted, _ = lift_leaf(lifter, emit, leaf)
            flat = emit.reshape(lifted, (steps, b, h, width), np.float32)
            return emit.transpose(flat, [1, 2, 0, 3], (b, h, steps, width), np.float32)

        k = heads_major(k_col, dk)
        v = heads_major(v_col, dv)
        q = heads_major(q_cols[0], dk) if q_cols else emit.const(np.zeros((b, h, steps, dk), np.float32))
        beta_lifted, _ = lift_leaf(lifter, emit, beta)
        beta_bht = emit.transpose(
            emit.reshape(beta_lifted, (steps, b, h), np.float32), [1, 2, 0], (b, h, steps), np.float32
        )
        s0 = chain.states[0]
        s0_value = const_value(s0)
        s0_in = None if s0_value is not None and not np.any(s0_value) else s0
        if s0_in is not None and shapes.shape(s0) != state_shape:
            s0_in = emit.expand(s0_in, state_shape, np.float32)
        if s0_in is not None:  # [B, H, Dv, Dk] -> the op's [B, H, Dk, Dv]
            s0_in = emit.transpose(s0_in, [0, 1, 3, 2], (b, h, dk, dv), np.float32)
        o = gs.Variable(ctx.unique_name("delta_rule_o"), dtype=np.float32, shape=[b, h, steps, dv])
        s_last = gs.Variable(ctx.unique_name("delta_rule_S_last"), dtype=np.float32, shape=[b, h, dk, dv])
        node = make_framefuse_node(graph, ctx, "DeltaRuleScan", [q, k, v, beta_bht, s0_in], [o, s_last])
        emit.new_nodes.append(node)
        for i, readout in enumerate(readouts):
            if readout is not None:
                o_t = emit.gather(o, i, 2, (b, h, dv), np.float32)
                replace_producer(readout, emit.unsqueeze(o_t, [3], (b, h, dv, 1), np.float32), graph, emit)
        replace_producer(chain.states[-1], emit.transpose(s_last, [0, 1, 3, 2], state_shape, np.float32), graph, emit)
        return {"node": node, "steps": steps, "state_shape": list(state_shape)}
