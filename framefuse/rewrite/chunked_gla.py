"""Gated linear attention in its chunked form → framefuse ``LinearScan`` over Dk·Dv channels a head.

Gated linear attention (GLA) keeps a state S [Dk, Dv] a head with a log-gate a key dimension:

    S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,      o_t = S_tᵀ q_t.

The op set has no op of its own for it, and needs none: every entry S[i, j] decays by
exp(g_t[i]) and gains k_t[i]·v_t[j], an elementwise linear recurrence, so S is a LinearScan over
the H·Dk·Dv channels and o_t a sum over Dk of q_t[i]·S_t[i, j] after it (what the step-at-a-time
form fuses into through the unrolled passes). Research code computes it chunk by chunk instead:
cumulative sums of g inside each chunk weight an intra-chunk attention, and a loop over the
chunks carries the decayed state.

The pass anchors on a CumSum whose input comes, through shape-only nodes, from a float [B, H, T,
Dk] tensor g. The output is the latest [B, H, T, Dv] tensor computed from g whose other inputs
(walking up outside everything computed from g) are three [B, H, T, ·] tensors q, k, v; the
graph's own nodes (a cut copy, ONNX Runtime) are run on two random trials against the recurrence
— every assignment of the three to q, k and v, a scale of q read off the first trial and checked
on the second — before the region is replaced. A structure that matches but computes something
else is declined naming the CumSum and the difference; a CumSum without that structure is left
to the other passes (``unrolled-chunked-scan`` reports any chunked scan nobody mapped).
"""

from __future__ import annotations

from itertools import permutations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Match, RewriteContext, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.graphutil import descendants

CHECK_TOLERANCE = 1e-4
MAX_EVALUATIONS = 4  # candidate outputs run through ONNX Runtime per CumSum
_SHAPE_ONLY = {"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Identity"}


def _reference(q, k, v, g):
    """o [B, H, T, Dv] of gated linear attention, float64, from S = 0."""
    b, h, steps, dk = q.shape
    state = np.zeros((b, h, dk, v.shape[-1]))
    out = np.empty((b, h, steps, v.shape[-1]))
    for t in range(steps):
        state = state * np.exp(g[:, :, t, :, None]) + k[:, :, t, :, None] * v[:, :, t, None, :]
        out[:, :, t] = np.einsum("bhkv,bhk->bhv", state, q[:, :, t])
    return out


def _as64(trial: dict, t: gs.Tensor) -> np.ndarray:
    """A trial's value of ``t`` as the graph saw it (float32), in float64."""
    return trial[t.name].astype(np.float32).astype(np.float64)


def _gate_source(cumsum: gs.Node) -> gs.Tensor | None:
    """The first float32 rank-4 tensor above the CumSum's input through shape-only nodes."""
    t = cumsum.inputs[0] if cumsum.inputs else None
    while t is not None:
        shape = U.static_shape(t)
        if shape is not None and len(shape) == 4 and U.np_dtype(t) == np.float32 and not isinstance(t, gs.Constant):
            return t
        node = U.producer(t)
        if node is None or node.op not in _SHAPE_ONLY or not node.inputs:
            return None
        t = node.inputs[0]
    return None


class ChunkedGLAPass(AnchoredPass):
    name = "chunked-gla"
    reason_prefix = "chunked gated linear attention: "
    tidy = "match"
    sort_first = True

    def anchors(self, graph: gs.Graph):
        """(the CumSum, its gate g) for each CumSum over a gate's logs."""
        for cumsum in [n for n in graph.nodes if n.op == "CumSum"]:
            if id(cumsum) not in {id(n) for n in graph.nodes}:
                continue  # a region an earlier match of this pass replaced
            g = _gate_source(cumsum)
            if g is not None:
                yield cumsum, g

    def where(self, anchor) -> str:
        return U.node_label(anchor[0])

    def rewrite(self, graph, ctx, anchor) -> Match | None:
        cumsum, g = anchor
        return self._rewrite(graph, ctx, g, U.node_label(cumsum))

    def _rewrite(self, graph: gs.Graph, ctx: RewriteContext, g: gs.Tensor, where: str) -> Match | None:
        batch, heads, steps, dk = U.static_shape(g)
        lead = (batch, heads, steps)
        inside = descendants(g)
        order = {o.name: i for i, node in enumerate(graph.nodes) for o in node.outputs}
        outputs = [
            t
            for name, t in graph.tensors().items()
            if name in inside
            and isinstance(t, gs.Variable)
            and U.static_shape(t) is not None
            and len(U.static_shape(t)) == 4
            and tuple(U.static_shape(t)[:3]) == lead
            and U.np_dtype(t) == np.float32
        ]
        outputs.sort(key=lambda t: order.get(t.name, -1), reverse=True)  # the latest first
        rng = np.random.default_rng(0)
        problems, evaluated, chosen = [], 0, None
        for out in outputs:
            dv = U.static_shape(out)[3]
            others = U.drop_derived(U.inputs_outside(out, {g.name}, inside, lead), {g.name}, inside, lead)
            if len(others) != 3:
                continue
            assignments = [
                (q, k, v)
                for q, k, v in permutations(others)
                if U.static_shape(q)[3] == dk and U.static_shape(k)[3] == dk and U.static_shape(v)[3] == dv
            ]
            if not assignments:
                continue
            if evaluated == MAX_EVALUATIONS:
                break
            evaluated += 1
            trials = []
            for index in range(2):  # the second trial's gates stronger
                trial = {t.name: rng.standard_normal(U.static_shape(t)) for t in others}
                trial[g.name] = rng.uniform(-0.5 * (1 + 3 * index), -0.01, (batch, heads, steps, dk))
                trials.append(trial)
            try:
                got = [U.evaluate_cut(graph, trial, [out])[0] for trial in trials]
            except Exception as exc:  # noqa: BLE001 - a candidate that does not cut here
                problems.append(f"{out.name} is not computed from g and three other inputs ({type(exc).__name__})")
                continue
            for q, k, v in assignments:
                expected = [_reference(*(_as64(trial, t) for t in (q, k, v, g))) for trial in trials]
                scale, error = U.fitted_scale(got, expected)
                if error <= CHECK_TOLERANCE:
                    chosen = (out, q, k, v, scale, error)
                    break
                problems.append(f"{out.name} with q = {q.name}, k = {k.name}, v = {v.name}: differs by {error:.3g}")
            if chosen:
                break
        if chosen is None:
            if not problems:
                return None  # not this structure: nothing to say (other passes may know the CumSum)
            raise Decline(f"no output agrees with the recurrence on random inputs ({'; '.join(problems[:3])})")
        return self._replace(graph, ctx, g, where, *chosen)

    def _replace(self, graph, ctx, g, where, out, q, k, v, scale, error) -> Match:
        gb = GraphBuilder(graph, ctx)
        f32 = np.float32
        batch, heads, steps, dk = U.static_shape(g)
        dv = U.static_shape(v)[3]
        channels = heads * dk * dv
        full = (batch, heads, steps, dk, dv)
        moved = (batch, steps, heads, dk, dv)

        def op(name, inputs, shape, **attrs):
            return gb.node(name, inputs, shape=shape, dtype=f32, attrs=attrs)

        def const(prefix, values):
            return gb.const(np.array(values, np.int64), name=prefix)

        def to_channels(t):  # [B, H, T, Dk, Dv] -> [B, T, H·Dk·Dv]
            return op(
                "Reshape",
                [op("Transpose", [t], moved, perm=[0, 2, 1, 3, 4]), const("gla_bt_c", [batch, steps, channels])],
                (batch, steps, channels),
            )

        decay = op("Exp", [g], (batch, heads, steps, dk))
        decay = op(
            "Expand",
            [op("Unsqueeze", [decay, const("gla_axis", [4])], (*decay.shape, 1)), const("gla_full", list(full))],
            full,
        )
        update = op(
            "Mul",
            [
                op("Unsqueeze", [k, const("gla_axis", [4])], (batch, heads, steps, dk, 1)),
                op("Unsqueeze", [v, const("gla_axis", [3])], (batch, heads, steps, 1, dv)),
            ],
            full,
        )
        states = gb.var("LinearScan_h", f32, (batch, steps, channels))
        last = gb.var("LinearScan_h_last", f32, (batch, channels))
        node = make_framefuse_node(
            graph, ctx, "LinearScan", [to_channels(decay), to_channels(update)], [states, last], {}
        )
        states = op("Reshape", [states, const("gla_moved", list(moved))], moved)
        states = op("Transpose", [states], full, perm=[0, 2, 1, 3, 4])
        query = gb.scaled(q, scale, name="gla_q_scale")
        product = op(
            "Mul", [op("Unsqueeze", [query, const("gla_axis", [4])], (batch, heads, steps, dk, 1)), states], full
        )
        reduced = (batch, heads, steps, dv)
        if ctx.opset >= 13:
            o = op("ReduceSum", [product, const("gla_sum_axis", [3])], reduced, keepdims=0)
        else:
            o = op("ReduceSum", [product], reduced, keepdims=0, axes=[3])
        U.replace_tensor(graph, out, o)
        return Match(
            self.name,
            "LinearScan",
            node.name,
            [where],
            {
                "steps": int(steps),
                "heads": int(heads),
                "channels": int(channels),
                "q_scale": scale,
                "form": "chunked gated linear attention",
                "check_max_rel_diff": error,
            },
        )
