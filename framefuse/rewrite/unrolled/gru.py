"""GRUSeq from a GRU cell stepped in a Python loop (``nn.GRUCell``, or its equations by hand).

The step must be a GRU update with the reset gate applied after the recurrent product (torch's
convention, ONNX ``linear_before_reset = 1``, the only one GRUSeq implements):

    z = σ(x·W_zᵀ + b_z + h·U_zᵀ + c_z),  r = σ(x·W_rᵀ + b_r + h·U_rᵀ + c_r)
    n = tanh(x·W_nᵀ + b_n + r ⊙ (h·U_nᵀ + c_n))
    h' = (1 − z) ⊙ n + z ⊙ h          written  z ⊙ (h − n) + n,  (1 − z) ⊙ n + z ⊙ h,
                                                or with z and 1 − z swapped (the other convention)

Each product is a linear layer with constant weights (Gemm, or MatMul [+ Add]) of the frame x_t or
of h, one per gate or one for all three gates split along the features (Split): the x products'
weights and biases are read from the graph behind the step's leaves, the h products' from the
step template. The gates are matched structurally (commutative operand orders accepted), the
parameters assembled in GRUSeq's layout (gates z, r, h), and then the template itself is
evaluated on random h and x against the GRU step of the assembled parameters: a cell that is not
this GRU is declined, never mis-fused.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, make_framefuse_node
from framefuse.rewrite.unrolled.chains import Chain, Tmpl, evaluate_template
from framefuse.rewrite.unrolled.common import UnrolledPass, emit_state_outputs, lift_leaf
from framefuse.rewrite.unrolled.graphutil import const_value
from framefuse.rewrite.unrolled.match import (
    args,
    gate_preactivation,
    graph_linear,
    hole_linear,
    op,
    pairs,
    scalar,
)

CHECK_TOLERANCE = 1e-5  # the template against the assembled GRU step, random inputs (float64)


def _sigmoid_gate(tm: Tmpl):
    return gate_preactivation(tm.children[0]) if op(tm) == "Sigmoid" else None


def _candidate(tm: Tmpl):
    """n = tanh(x·W_nᵀ + b_n + r ⊙ (h·U_nᵀ + c_n)): (the n gate, the r gate) or None."""
    if op(tm) != "Tanh":
        return None
    for leaf, product in pairs(tm.children[0], "Add"):
        if leaf.kind != "leaf":
            continue
        xside = graph_linear(leaf.tensor)
        for hpart, rpart in pairs(product, "Mul"):
            hside, r = hole_linear(hpart), _sigmoid_gate(rpart)
            if xside is not None and hside is not None and r is not None:
                return (xside[0], xside[1], xside[2], hside[0], hside[1]), r
    return None


def _one_minus(tm: Tmpl) -> Tmpl | None:
    sub = args(tm, "Sub", 2)
    return sub[1] if sub is not None and scalar(sub[0]) == 1.0 else None


def match_gru(root: Tmpl):
    """(z gate, r gate, n gate, flipped) or a reason string. ``flipped``: the cell keeps h where
    torch's keeps n (h' = z ⊙ n + (1 − z) ⊙ h), so its z is torch's 1 − z."""
    reason = "the step is not a GRU update (1 − z) ⊙ n + z ⊙ h with n = tanh(x·W + r ⊙ (h·U + c))"
    if op(root) != "Add":
        return f"the step ends in {op(root) or 'a leaf'}, not in a GRU update"
    for p, q in pairs(root, "Add"):
        # z ⊙ (h − n) + n  (torch's GRUCell), or z ⊙ (n − h) + h (the other convention)
        for gate, diff in pairs(p, "Mul"):
            sub = args(diff, "Sub", 2)
            z = _sigmoid_gate(gate)
            if sub is None or z is None:
                continue
            if sub[0].kind == "hole" and q.tensor.name == sub[1].tensor.name:
                n = _candidate(q)
                if n is not None:
                    return z, n[1], n[0], False
            if q.kind == "hole" and sub[1].kind == "hole":
                n = _candidate(sub[0])
                if n is not None:
                    return z, n[1], n[0], True
        # (1 − z) ⊙ n + z ⊙ h, or z ⊙ n + (1 − z) ⊙ h
        for a, b in pairs(p, "Mul"):
            for c, d in pairs(q, "Mul"):
                if d.kind != "hole":
                    continue
                inner = _one_minus(a)
                if inner is not None and inner.tensor.name == c.tensor.name:  # (1 − z) ⊙ n + z ⊙ h
                    z, n = _sigmoid_gate(c), _candidate(b)
                    if z is not None and n is not None:
                        return z, n[1], n[0], False
                inner = _one_minus(c)
                if inner is not None and inner.tensor.name == a.tensor.name:  # z ⊙ n + (1 − z) ⊙ h
                    z, n = _sigmoid_gate(a), _candidate(b)
                    if z is not None and n is not None:
                        return z, n[1], n[0], True
    return reason


# -- the check: the template evaluated on random inputs against the assembled GRU step ---------------


def _x_leaves(tm: Tmpl) -> list[gs.Tensor]:
    return [t.tensor for t in tm.walk() if t.kind == "leaf" and const_value(t.tensor) is None]


def check_gru(root: Tmpl, frame: gs.Tensor, w, u, bias, batch: int, hidden: int, in_features: int) -> float:
    """Max |template − GRU step| over random h and x (float64): the leaves of the template that
    are not constants are the x products, computed here from the frame by their own graph nodes'
    weights (``graph_linear``)."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(3):
        h = rng.standard_normal((batch, hidden))
        x = rng.standard_normal((batch, in_features))
        leaves = {}
        for t in _x_leaves(root):
            lin = graph_linear(t)
            if lin is None or lin[0].name != frame.name:
                raise Decline(f"the step input {t.name} is not a linear layer of the frame")
            leaves[t.name] = x @ lin[1].T.astype(np.float64) + lin[2]
        actual = evaluate_template(root, h, leaves)
        if actual is None:
            raise Decline("the GRU check cannot evaluate the step on random inputs")
        wb, rb = bias[: 3 * hidden].astype(np.float64), bias[3 * hidden :].astype(np.float64)
        gx = x @ w.T.astype(np.float64) + wb
        gh = h @ u.T.astype(np.float64) + rb
        z = 1 / (1 + np.exp(-(gx[:, :hidden] + gh[:, :hidden])))
        r = 1 / (1 + np.exp(-(gx[:, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden])))
        n = np.tanh(gx[:, 2 * hidden :] + r * gh[:, 2 * hidden :])
        expected = (1 - z) * n + z * h
        worst = max(worst, float(np.abs(np.broadcast_to(actual, expected.shape) - expected).max()))
    return worst


class GRUCellPass(UnrolledPass):
    name = "unrolled-gru-cell"
    op_type = "GRUSeq"

    @staticmethod
    def reference(chain: Chain) -> Tmpl:
        # the last step: a loop from a constant h_0 (torch.zeros in forward) has its first step's
        # recurrent products folded into constants, so the first link is not the cell's template
        return chain.structural_links[-1]

    def accepts(self, chain: Chain, tl) -> bool:
        if not chain.structural_links:  # a single step folded from a constant state: no cell left to read
            return False
        link = self.reference(chain)
        ops_in = {n.op for n in link.nodes()}
        return op(link) == "Add" and {"Sigmoid", "Tanh"} <= ops_in

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:
        shapes = lifter.shapes
        link = self.reference(chain)
        found = match_gru(link)
        if isinstance(found, str):
            raise Decline(found)
        z, r, n, flipped = found
        frames = {g[0].name for g in (z, r, n)}
        if len(frames) != 1:
            raise Decline("the GRU gates read different inputs (expected one frame x_t)")
        frame = z[0]
        state_shape = shapes.need_shape(chain.states[-1])
        if len(state_shape) != 2 or shapes.dtype(chain.states[-1]) != np.float32:
            raise Decline(f"GRU state must be float32 [B, H], got {state_shape}")
        batch, hidden = state_shape
        frame_shape = shapes.need_shape(frame)
        if len(frame_shape) != 2 or frame_shape[0] != batch:
            raise Decline(f"the GRU frame must be [B, I] with B = {batch}, got {list(frame_shape)}")
        in_features = frame_shape[1]
        for label, (_, w, b, u, c) in zip("zrn", (z, r, n)):
            if w.shape != (hidden, in_features) or u.shape != (hidden, hidden) or {b.shape, c.shape} != {(hidden,)}:
                raise Decline(
                    f"the GRU {label} gate's weights are {list(w.shape)} and {list(u.shape)}, expected "
                    f"[{hidden}, {in_features}] and [{hidden}, {hidden}]"
                )
        sign = -1.0 if flipped else 1.0  # σ(−a) = 1 − σ(a): the other convention's z is torch's 1 − z
        w = np.concatenate([sign * z[1], r[1], n[1]]).astype(np.float32)
        u = np.concatenate([sign * z[3], r[3], n[3]]).astype(np.float32)
        bias = np.concatenate([sign * z[2], r[2], n[2], sign * z[4], r[4], n[4]]).astype(np.float32)
        error = check_gru(link, frame, w, u, bias, batch, hidden, in_features)
        if not error <= CHECK_TOLERANCE:
            raise Decline(f"the step differs from the GRU it matched by {error:.3g} on random inputs")
        steps = chain.steps
        x_tm, _ = lift_leaf(lifter, emit, frame)  # [T, B, I]
        h0 = chain.states[0]
        h0_value = const_value(h0)
        h0_in = None if h0_value is not None and not np.any(h0_value) else h0
        if h0_in is not None and shapes.shape(h0) != state_shape:
            h0_in = emit.expand(h0_in, state_shape, np.float32)
        inputs = [x_tm, emit.const(w), emit.const(u), emit.const(bias)] + ([h0_in] if h0_in is not None else [])
        y = gs.Variable(ctx.unique_name("gru_cell_y"), dtype=np.float32, shape=[steps, batch, hidden])
        h_last = gs.Variable(ctx.unique_name("gru_cell_h_last"), dtype=np.float32, shape=[batch, hidden])
        node = make_framefuse_node(graph, ctx, "GRUSeq", inputs, [y, h_last], {})
        emit.new_nodes.append(node)
        emit_state_outputs(graph, emit, chain, y if steps > 1 else None, h_last, state_shape)
        return {
            "node": node,
            "steps": steps,
            "state_shape": list(state_shape),
            "convention": "z keeps n" if flipped else "z keeps h",
            "check_max_abs_diff": error,
        }
