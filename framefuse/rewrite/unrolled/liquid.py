"""LiquidScan from an unrolled CfC (closed-form liquid) cell.

The step must be exactly the CfC update on ``xh = cat([x_t, h_{t−1}])`` (either order):
four linear heads g1, g2, ga, gb of xh (Gemm, or MatMul + Add, with constant weights),
ff1 = tanh(g1), ff2 = tanh(g2), τ = σ(ga·ts + gb), h_t = ff1 ⊙ (1 − τ) + τ ⊙ ff2 (commutative
operand orders accepted). Each head's weight is split into its x columns and its h columns: the x
parts become one projection of the whole sequence (xg = x·Wxᵀ + b for all t, one MatMul) and the
h parts, stacked, become R. Anything else is declined with what did not match.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, make_framefuse_node
from framefuse.rewrite.unrolled.chains import Chain, Tmpl
from framefuse.rewrite.unrolled.common import UnrolledPass, emit_state_outputs, lift_leaf
from framefuse.rewrite.unrolled.graphutil import const_value
from framefuse.rewrite.unrolled.match import args, depends_on_hole, linear_head, op, pairs, scalar


def match_cfc(root: Tmpl):
    """(g1, g2, ga, gb, ts) templates of the heads and the timespan, or a reason string."""
    if op(root) != "Add":
        return f"the step ends in {op(root) or 'a leaf'}, not in the CfC sum ff1⊙(1−τ) + τ⊙ff2"
    for p, q in pairs(root, "Add"):
        for ff1, one_minus in pairs(p, "Mul"):
            sub = args(one_minus, "Sub", 2)
            if op(ff1) != "Tanh" or sub is None or scalar(sub[0]) != 1.0 or op(sub[1]) != "Sigmoid":
                continue
            tau = sub[1]
            for tau2, ff2 in pairs(q, "Mul"):
                if tau2.tensor.name != tau.tensor.name or op(ff2) != "Tanh":
                    continue
                pre = tau.children[0]
                for left, gb in pairs(pre, "Add"):
                    for ga, ts_leaf in pairs(left, "Mul"):
                        ts = scalar(ts_leaf)
                        if ts is not None and depends_on_hole(ga):
                            return ff1.children[0], ff2.children[0], ga, gb, ts
                    if depends_on_hole(left) and op(left) != "Mul":
                        return ff1.children[0], ff2.children[0], left, gb, 1.0
    return "the step is not the CfC update ff1⊙(1−τ) + τ⊙ff2 with ff = tanh(head), τ = σ(head·ts + head)"


class LiquidScanPass(UnrolledPass):
    name = "unrolled-liquid-scan"
    op_type = "LiquidScan"

    def accepts(self, chain: Chain, tl) -> bool:
        return op(chain.structural_links[0]) == "Add" and any(
            n.op == "Concat" for n in chain.structural_links[0].nodes()
        )

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:
        shapes = lifter.shapes
        link = chain.structural_links[0]
        found = match_cfc(link)
        if isinstance(found, str):
            raise Decline(found)
        g1, g2, ga, gb, ts = found
        heads = [linear_head(g) for g in (g1, g2, ga, gb)]
        if any(h is None for h in heads):
            raise Decline("a CfC head is not a linear layer with constant weights on cat([x_t, h])")
        xh = {h[0].tensor.name for h in heads}
        if len(xh) != 1:
            raise Decline("the CfC heads read different inputs (expected one cat([x_t, h]))")
        concat = args(heads[0][0], "Concat", 2)
        if concat is None:
            raise Decline("the CfC heads do not read a Concat of the frame and the state")
        state_shape = shapes.need_shape(chain.states[-1])
        if len(state_shape) != 2 or shapes.dtype(chain.states[-1]) != np.float32:
            raise Decline(f"CfC state must be float32 [B, H], got {state_shape}")
        batch, hidden = state_shape
        axis = int(heads[0][0].node.attrs.get("axis", 0)) % 2
        if axis != 1:
            raise Decline("the CfC Concat is not along the feature axis")
        hole_first = concat[0].kind == "hole"
        x_part = concat[1] if hole_first else concat[0]
        if x_part.kind != "leaf" or (concat[0] if hole_first else concat[1]).kind != "hole":
            raise Decline("the CfC Concat must join the frame and h_(t-1) directly")
        in_features = shapes.need_shape(x_part.tensor)[1]
        w_x, w_h, bias = [], [], []
        for _, w, b in heads:
            if w.shape != (hidden, in_features + hidden):
                raise Decline(
                    f"a CfC head weight has shape {list(w.shape)}, expected [{hidden}, {in_features + hidden}]"
                )
            w_h.append(w[:, :hidden] if hole_first else w[:, in_features:])
            w_x.append(w[:, hidden:] if hole_first else w[:, :in_features])
            bias.append(b)
        steps = chain.steps
        x_tm, _ = lift_leaf(lifter, emit, x_part.tensor)  # [T, B, I]
        w_x_all = emit.const(np.ascontiguousarray(np.concatenate(w_x, 0).T.astype(np.float32)))  # [I, 4H]
        xg = emit.node("MatMul", [x_tm, w_x_all], (steps, batch, 4 * hidden), np.float32)
        xg = emit.node(
            "Add", [xg, emit.const(np.concatenate(bias).astype(np.float32))], (steps, batch, 4 * hidden), np.float32
        )
        xg = emit.transpose(xg, [1, 0, 2], (batch, steps, 4 * hidden), np.float32)
        recurrent = emit.const(np.ascontiguousarray(np.concatenate(w_h, 0).astype(np.float32)))  # [4H, H]
        h0 = chain.states[0]
        h0_value = const_value(h0)
        h0_in = None if h0_value is not None and not np.any(h0_value) else h0
        if h0_in is not None and shapes.shape(h0) != state_shape:
            h0_in = emit.expand(h0_in, state_shape, np.float32)
        h_all = gs.Variable(ctx.unique_name("liquid_scan_h"), dtype=np.float32, shape=[batch, steps, hidden])
        h_last = gs.Variable(ctx.unique_name("liquid_scan_h_last"), dtype=np.float32, shape=[batch, hidden])
        node = make_framefuse_node(graph, ctx, "LiquidScan", [xg, recurrent, h0_in], [h_all, h_last], {"ts": float(ts)})
        emit.new_nodes.append(node)
        h_tm = emit.transpose(h_all, [1, 0, 2], (steps, batch, hidden), np.float32) if steps > 1 else None
        emit_state_outputs(graph, emit, chain, h_tm, h_last, state_shape)
        return {"node": node, "steps": steps, "state_shape": list(state_shape), "ts": float(ts)}
