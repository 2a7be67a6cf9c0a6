"""The delta rule in its chunked (WY) form → framefuse ``DeltaRuleScan``.

flash-linear-attention's reference ``chunk_delta_rule`` (and code copied from it) computes

    S_t = S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,      o_t = S_t q_t

without a loop over t: k and v are scaled by β (``k * beta[..., None]``, ``v * beta[..., None]``),
a triangular system inside each chunk is solved row by row, and the chunk states are chained by a
loop over the chunks. The pass anchors on β: a [B, H, T] tensor read, through an Unsqueeze, by the
two products k·β and v·β ([B, H, T, D]). q is the one other [B, H, T, Dk] tensor the output is
computed from; the output is the latest tensor of o's shape after β that is computed from q, k,
v, β and constants alone. The graph's own nodes (a cut copy, ONNX Runtime) are run on random
inputs against the recurrence — k and v both ways round, a scale of q (the reference code's
d_k^−½) read off the first trial and checked on the second — before the region is replaced by
``DeltaRuleScan(s·q, k, v, β)``. Anything else is declined naming β's reader and the reason.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import Declined, Match, PassResult, RewriteContext, make_framefuse_node
from framefuse.rewrite.unrolled.graphutil import descendants

CHECK_TOLERANCE = 1e-4
MAX_EVALUATIONS = 4  # candidate outputs run through ONNX Runtime per assignment of k and v


class _Decline(Exception):
    pass


def _reference(q, k, v, beta):
    """o [B, H, T, Dv] of the delta rule, float64, from S = 0."""
    b, h, steps, dk = q.shape
    state = np.zeros((b, h, v.shape[-1], dk))
    out = np.empty((b, h, steps, v.shape[-1]))
    for t in range(steps):
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None]
        sk = np.einsum("bhvk,bhk->bhv", state, kt)
        state = state + np.einsum("bhv,bhk->bhvk", bt * (vt - sk), kt)
        out[:, :, t] = np.einsum("bhvk,bhk->bhv", state, q[:, :, t])
    return out


class ChunkedDeltaRulePass:
    name = "chunked-delta-rule"

    def run(self, graph: gs.Graph, ctx: RewriteContext) -> PassResult:
        result = PassResult()
        graph.toposort()
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
            try:
                result.matches.append(self._rewrite(graph, ctx, beta, scaled))
            except _Decline as exc:
                where = U.node_label(scaled[0][1])
                result.declined.append(Declined(self.name, where, f"chunked delta rule: {exc}"))
            graph.cleanup().toposort()
        return result

    def _rewrite(self, graph, ctx, beta: gs.Tensor, scaled) -> Match:
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
                others = U.inputs_outside(out, {k_t.name, v_t.name, beta.name}, inside, (batch, heads, steps))
                if len(others) != 1 or U.static_shape(others[0]) != (batch, heads, steps, dk):
                    continue
                if evaluated == MAX_EVALUATIONS:
                    break
                evaluated += 1
                q_t = others[0]
                trials = []
                for _ in range(2):
                    kk = rng.standard_normal((batch, heads, steps, dk))
                    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)  # unit keys: a contraction, as the rule wants
                    trials.append(
                        {
                            q_t.name: rng.standard_normal((batch, heads, steps, dk)),
                            k_t.name: kk,
                            v_t.name: rng.standard_normal((batch, heads, steps, dv)),
                            beta.name: rng.uniform(0.05, 0.95, (batch, heads, steps)),
                        }
                    )
                try:
                    got = [U.evaluate_cut(graph, trial, [out])[0] for trial in trials]
                except Exception as exc:  # noqa: BLE001 - a candidate that does not cut here
                    problems.append(f"{out.name} is not computed from q, k, v and β alone ({type(exc).__name__})")
                    continue
                expected = [
                    _reference(*(trial[t.name].astype(np.float32).astype(np.float64) for t in (q_t, k_t, v_t, beta)))
                    for trial in trials
                ]
                scale = float((got[0] * expected[0]).sum() / max((expected[0] ** 2).sum(), 1e-30))
                error = max(
                    float((np.abs(g - scale * e) / (1 + np.abs(scale * e))).max()) for g, e in zip(got, expected)
                )
                if error <= CHECK_TOLERANCE:
                    chosen = (out, q_t, k_t, v_t, scale, error)
                    break
                problems.append(f"{out.name} with k = {k_t.name}: differs by {error:.3g}")
            if chosen:
                break
        if chosen is None:
            raise _Decline(
                "no output agrees with the delta rule on random inputs"
                + (
                    f" ({'; '.join(problems[:3])})"
                    if problems
                    else " (no tensor of o's shape is computed from q, k, v, β alone)"
                )
            )
        out, q_t, k_t, v_t, scale, error = chosen
        f32 = np.float32
        q_in = q_t
        if abs(scale - 1.0) > 1e-6:
            q_in = U.add_op(
                graph,
                ctx,
                "Mul",
                [q_t, U.new_const(ctx, "delta_q_scale", np.array(scale, f32))],
                dtype=f32,
                shape=U.static_shape(q_t),
            )
        dk, dv = U.static_shape(k_t)[3], U.static_shape(v_t)[3]
        o = U.new_var(ctx, "DeltaRuleScan_o", f32, (batch, heads, steps, dv))
        s_last = U.new_var(ctx, "DeltaRuleScan_S_last", f32, (batch, heads, dv, dk))
        node = make_framefuse_node(graph, ctx, "DeltaRuleScan", [q_in, k_t, v_t, beta], [o, s_last], {})
        U.replace_tensor(graph, out, o)
        return Match(
            self.name,
            "DeltaRuleScan",
            node.name,
            [U.node_label(scaled[0][1])],
            {
                "steps": int(steps),
                "heads": int(heads),
                "q_scale": scale,
                "form": "chunked (WY)",
                "check_max_rel_diff": error,
            },
        )
