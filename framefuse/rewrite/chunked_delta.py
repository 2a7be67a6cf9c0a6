"""The delta rule in its chunked (WY) form → framefuse ``DeltaRuleScan``, and the gated delta rule
in its chunked form → ``GatedDeltaRuleScan``.

flash-linear-attention's reference ``chunk_delta_rule`` (and code copied from it) computes

    S_t = S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,      o_t = S_t q_t

without a loop over t: k and v are scaled by β (``k * beta[..., None]``, ``v * beta[..., None]``),
a triangular system inside each chunk is solved row by row, and the chunk states are chained by a
loop over the chunks. Its gated twin ``chunk_gated_delta_rule`` adds log-decays g [B, H, T]
(S_t = exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ in the [Dk, Dv] layout): their cumulative
sums inside each chunk weight the same solve and the chunk-to-chunk products. The pass anchors on
β: a [B, H, T] tensor read, through an Unsqueeze, by the two products k·β and v·β
([B, H, T, D]). q is the one other [B, H, T, Dk] tensor the output is computed from, and g, when
there is one, the one [B, H, T] (or [B, H, T, 1]) tensor besides β; the output is the latest
tensor of o's shape after β that is computed from q, k, v, β, g and constants alone. The graph's
own nodes (a cut copy, ONNX Runtime) are run on random inputs against the recurrence — k and v
both ways round, a scale of q (the reference code's d_k^−½) read off the first trial and checked
on the second — before the region is replaced by ``DeltaRuleScan(s·q, k, v, β)`` or
``GatedDeltaRuleScan(s·q, k, v, g, β)``. Anything else is declined naming β's reader and the
reason.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Match, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.graphutil import descendants

CHECK_TOLERANCE = 1e-4
MAX_EVALUATIONS = 4  # candidate outputs run through ONNX Runtime per assignment of k and v


def _reference(q, k, v, beta, g=None):
    """o [B, H, T, Dv] of the delta rule (gated by exp(g) when g is given), float64, from S = 0."""
    b, h, steps, dk = q.shape
    state = np.zeros((b, h, v.shape[-1], dk))
    out = np.empty((b, h, steps, v.shape[-1]))
    for t in range(steps):
        if g is not None:
            state = state * np.exp(g[:, :, t, None, None])
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None]
        sk = np.einsum("bhvk,bhk->bhv", state, kt)
        state = state + np.einsum("bhv,bhk->bhvk", bt * (vt - sk), kt)
        out[:, :, t] = np.einsum("bhvk,bhk->bhv", state, q[:, :, t])
    return out


class ChunkedDeltaRulePass(AnchoredPass):
    name = "chunked-delta-rule"
    reason_prefix = "chunked delta rule: "
    tidy = "attempt"
    sort_first = True

    def anchors(self, graph: gs.Graph):
        """(β, its two scaled products k·β and v·β) for each float32 [B, H, T] tensor β."""
        for beta in [t for t in graph.tensors().values() if isinstance(t, gs.Variable)]:
            shape = U.static_shape(beta)
            if shape is None or len(shape) != 3 or U.np_dtype(beta) != np.float32 or not beta.outputs:
                continue
            scaled = U.unsqueezed_products(beta)
            if len({t.name for t, _ in scaled}) != 2:
                continue
            live = {id(n) for n in graph.nodes}
            if not all(id(mul) in live for _, mul in scaled):
                continue  # a region an earlier match of this pass replaced
            yield beta, scaled

    def where(self, anchor) -> str:
        return U.node_label(anchor[1][0][1])

    def rewrite(self, graph, ctx, anchor) -> Match:
        gb = GraphBuilder(graph, ctx)
        beta, scaled = anchor
        batch, heads, steps = U.static_shape(beta)
        first, second = {t.name: t for t, _ in scaled}.values()
        order = {o.name: i for i, node in enumerate(graph.nodes) for o in node.outputs}
        # the region: everything computed from k, v or β (q is what the output reads besides)
        after_beta = descendants(beta)
        inside = after_beta | descendants(first) | descendants(second)
        chosen, problems = None, []
        rng = np.random.default_rng(0)
        for k_t, v_t in ((first, second), (second, first)):
            dk, dv = U.static_shape(k_t)[3], U.static_shape(v_t)[3]
            after = [
                t
                for name, t in graph.tensors().items()
                if name in after_beta
                if U.static_shape(t) == (batch, heads, steps, dv) and U.np_dtype(t) == np.float32
            ]
            # the latest tensor of o's shape computed from q, k, v, β alone (a cheap walk up from
            # each; at most MAX_EVALUATIONS of them are run)
            after.sort(key=lambda t: order.get(t.name, -1), reverse=True)
            evaluated = 0
            for out in after:
                lead = (batch, heads, steps)
                given = {k_t.name, v_t.name, beta.name}
                others = U.drop_derived(U.inputs_outside(out, given, inside, lead, lead_too=True), given, inside, lead)
                queries = [t for t in others if U.static_shape(t) == (*lead, dk) and dk != 1]
                gates = [t for t in others if U.static_shape(t) in (lead, (*lead, 1))]
                if len(queries) != 1 or len(gates) > 1 or len(queries) + len(gates) != len(others):
                    continue
                if evaluated == MAX_EVALUATIONS:
                    break
                evaluated += 1
                q_t, g_t = queries[0], (gates[0] if gates else None)
                trials = []
                for trial_index in range(2):
                    kk = rng.standard_normal((batch, heads, steps, dk))
                    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)  # unit keys: a contraction, as the rule wants
                    trial = {
                        q_t.name: rng.standard_normal((batch, heads, steps, dk)),
                        k_t.name: kk,
                        v_t.name: rng.standard_normal((batch, heads, steps, dv)),
                        beta.name: rng.uniform(0.05, 0.95, (batch, heads, steps)),
                    }
                    if g_t is not None:  # log-decays, the second trial's stronger
                        decays = rng.uniform(-0.5 * (1 + 3 * trial_index), -0.01, lead)
                        trial[g_t.name] = decays.reshape(U.static_shape(g_t))
                    trials.append(trial)
                what = "q, k, v, β and g" if g_t is not None else "q, k, v and β"
                try:
                    got = [U.evaluate_cut(graph, trial, [out])[0] for trial in trials]
                except Exception as exc:  # noqa: BLE001 - a candidate that does not cut here
                    problems.append(f"{out.name} is not computed from {what} alone ({type(exc).__name__})")
                    continue

                expected = []
                for trial in trials:
                    args = [trial[t.name].astype(np.float32).astype(np.float64) for t in (q_t, k_t, v_t, beta)]
                    gate = None if g_t is None else trial[g_t.name].astype(np.float32).astype(np.float64).reshape(lead)
                    expected.append(_reference(*args, gate))
                scale, error = U.fitted_scale(got, expected)
                if error <= CHECK_TOLERANCE:
                    chosen = (out, q_t, k_t, v_t, g_t, scale, error)
                    break
                problems.append(f"{out.name} with k = {k_t.name}: differs by {error:.3g}")
            if chosen:
                break
        if chosen is None:
            raise Decline(
                "no output agrees with the delta rule (gated or not) on random inputs"
                + (
                    f" ({'; '.join(problems[:3])})"
                    if problems
                    else " (no tensor of o's shape is computed from q, k, v, β alone)"
                )
            )
        out, q_t, k_t, v_t, g_t, scale, error = chosen
        f32 = np.float32
        q_in = gb.scaled(q_t, scale, name="delta_q_scale")
        dk, dv = U.static_shape(k_t)[3], U.static_shape(v_t)[3]
        o = gb.var("DeltaRuleScan_o", f32, (batch, heads, steps, dv))
        if g_t is None:
            op, inputs = "DeltaRuleScan", [q_in, k_t, v_t, beta]
            s_last = gb.var("DeltaRuleScan_S_last", f32, (batch, heads, dk, dv))
        else:
            g_in = g_t
            if U.static_shape(g_t) != (batch, heads, steps):  # [B, H, T, 1]
                g_in = gb.node(
                    "Reshape",
                    [g_t, gb.const(np.array([batch, heads, steps], np.int64), name="gated_delta_g_shape")],
                    shape=(batch, heads, steps),
                    dtype=f32,
                )
            op, inputs = "GatedDeltaRuleScan", [q_in, k_t, v_t, g_in, beta]
            s_last = gb.var("GatedDeltaRuleScan_S_last", f32, (batch, heads, dk, dv))
        node = make_framefuse_node(graph, ctx, op, inputs, [o, s_last], {})
        U.replace_tensor(graph, out, o)
        return Match(
            self.name,
            op,
            node.name,
            [U.node_label(scaled[0][1])],
            {
                "steps": int(steps),
                "heads": int(heads),
                "q_scale": scale,
                "form": "chunked (WY)",
                "gated": g_t is not None,
                "check_max_rel_diff": error,
            },
        )
