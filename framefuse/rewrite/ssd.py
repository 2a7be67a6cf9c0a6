"""Mamba2's chunked scan (SSD) → framefuse ``SelectiveScan``.

transformers' Mamba2 (and the reference ``ssd_chunk_scan`` several ports copy) computes the
per-head recurrence

    S_t = exp(dt_t·A_h)·S_{t−1} + dt_t·x_t ⊗ B_t        y_t = S_t·C_t + D_h·x_t

(S [P, N] per head h, dt [B, T, H], x [B, T, H, P], B and C [B, T, G·N], A and D constants per
head) without a loop: the sequence is cut into chunks, the decays inside a chunk are exp of
*segment sums* of a CumSum of A·dt, and the chunk states are chained by a second, short scan.
That is the same recurrence as Mamba's selective scan with one channel per (h, p), Δ = dt of the
head, A repeated over p and n, and B, C shared by the heads of a group.

The pass anchors on the CumSum of A·dt (through reshapes, pads and transposes), takes dt and A
from that product, x from the product x·dt[..., None] beside it, and B and C from the einsums of
the chunk machinery (the two remaining tensors they read, [B, T, G·N]); the output is the latest
tensor computed from x, dt, B, C and constants alone that has y's shape. Then it runs the graph's
own nodes from x, dt, B, C to that output (ONNX Runtime, a cut copy) on random inputs against the
recurrence — B and C both ways round, D read off the first trial and checked on the second — and
replaces the region only when they agree. With G groups of B and C (head h reads group
h // (H / G)), each group of heads becomes its own SelectiveScan (the op shares one B and C across
its channels) and their outputs are concatenated. Anything else is declined naming the CumSum and
the reason.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Match, NotACandidate, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.graphutil import descendants

MAX_EVALUATIONS = 4  # candidate outputs run through ONNX Runtime per scan
CHECK_TOLERANCE = 1e-4  # the graph's chunked form (float32, ONNX Runtime) against the recurrence (float64)
# ops that only move or repeat data between the scan's inputs and the chunk machinery
_MOVES = {"Reshape", "Pad", "Transpose", "Slice", "Cast", "Identity", "Unsqueeze", "Squeeze", "Expand", "Tile"}


def _source(t: gs.Tensor) -> gs.Tensor:
    """``t`` before the data movement that produced it."""
    while True:
        node = U.producer(t)
        if node is None or node.op not in _MOVES or not node.inputs:
            return t
        t = node.inputs[0]


def _product(t: gs.Tensor):
    """(constant, variable) operands of the Mul behind ``t``'s data movement, or None."""
    mul = U.producer_op(_source(t), "Mul")
    if mul is None or len(mul.inputs) != 2:
        return None
    for a, b in (mul.inputs, mul.inputs[::-1]):
        if U.const_value(a) is not None and U.const_value(b) is None:
            return a, b
    return None


def _anchor(cumsum: gs.Node):
    """(A [H], dt [B, T, H]) when ``cumsum`` sums A·dt, else None."""
    found = _product(cumsum.inputs[0])
    if found is None:
        return None
    a, dt = found
    a_value, dt_shape = U.const_value(a), U.static_shape(dt)
    if dt_shape is None or len(dt_shape) != 3 or a_value.size != dt_shape[2]:
        return None
    return a_value.reshape(-1).astype(np.float64), dt


def _reference(x, dt, a, b, c, d, groups: int):
    """y [B, T, H, P] of the per-head recurrence, float64 (B, C [B, T, G, N], head h in group
    h // (H / G))."""
    batch, steps, heads, p = x.shape
    n = b.shape[-1]
    group = np.arange(heads) // (heads // groups)
    state = np.zeros((batch, heads, p, n))
    y = np.empty_like(x)
    for t in range(steps):
        decay = np.exp(dt[:, t] * a)  # [B, H]
        bt, ct = b[:, t][:, group], c[:, t][:, group]  # [B, H, N]
        state = decay[..., None, None] * state + (dt[:, t, :, None] * x[:, t])[..., None] * bt[:, :, None, :]
        y[:, t] = np.einsum("bhpn,bhn->bhp", state, ct) + d[None, :, None] * x[:, t]
    return y


class ChunkedSSDPass(AnchoredPass):
    name = "chunked-ssd"
    reason_prefix = "Mamba2 chunked scan (SSD): "
    tidy = "attempt"
    sort_first = True

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.op == "CumSum" and node.inputs and node.name in {n.name for n in graph.nodes}:
                yield node

    def rewrite(self, graph, ctx, cumsum: gs.Node) -> Match:
        anchor = _anchor(cumsum)
        if anchor is None:
            raise NotACandidate
        a, dt = anchor
        found = U.unsqueezed_products(dt)
        if not found:
            raise Decline(f"no product x·dt[..., None] of {dt.name} [B, T, H] with an x of [B, T, H, P]")
        x, _ = found[0]
        batch, steps, heads, p = U.static_shape(x)
        order = {o.name: i for i, node in enumerate(graph.nodes) for o in node.outputs}
        inside = descendants(dt) | descendants(x)  # A·dt, x·dt and all after them
        # y: the latest tensor of its shape after the CumSum that reads x, dt and two [B, T, K]
        # tensors (B and C) only — a cheap walk up from each; at most MAX_EVALUATIONS are run
        shapes = {(batch, steps, heads, p), (batch, steps, heads * p)}
        after = descendants(cumsum.outputs[0])
        candidates = sorted(
            (
                t
                for name, t in graph.tensors().items()
                if name in after and U.static_shape(t) in shapes and U.np_dtype(t) == np.float32
            ),
            key=lambda t: order.get(t.name, -1),
            reverse=True,
        )
        if not candidates:
            raise Decline(f"no tensor of y's shape [B, T, H, P] after {cumsum.name}")
        rng = np.random.default_rng(0)
        chosen, problems = None, []
        evaluated = 0
        for out in candidates:
            sources = U.inputs_outside(out, {x.name, dt.name}, inside, (batch, steps))
            if len(sources) != 2 or U.static_shape(sources[0]) != U.static_shape(sources[1]):
                continue
            if evaluated == MAX_EVALUATIONS:
                break
            evaluated += 1
            first, second = sources
            width = U.static_shape(first)[2]  # B and C are [B, T, G·N]
            # the second trial's steps are large (dt up to 3): a clamp of dt inside the region, which
            # the recurrence does not have, shows there
            trials = [
                {
                    x.name: rng.standard_normal((batch, steps, heads, p)),
                    dt.name: rng.uniform(low, high, (batch, steps, heads)),
                    first.name: rng.standard_normal((batch, steps, width)),
                    second.name: rng.standard_normal((batch, steps, width)),
                }
                for low, high in ((0.01, 0.3), (0.3, 3.0))
            ]
            try:
                actual = [U.evaluate_cut(graph, trial, [out])[0].reshape(batch, steps, heads, p) for trial in trials]
            except Exception as exc:  # noqa: BLE001 - a candidate that does not cut here
                problems.append(f"{out.name} is not computed from x, dt, B and C alone ({type(exc).__name__})")
                continue
            # G groups of heads (head h reads group h // (H / G)): G = 1 first, then every G that
            # divides both the heads and the width
            for groups in [g for g in range(1, heads + 1) if heads % g == 0 and width % g == 0]:
                for b_t, c_t in ((first, second), (second, first)):
                    error, d = self._check(trials, actual, x, dt, b_t, c_t, a, groups)
                    if error <= CHECK_TOLERANCE:
                        chosen = (out, b_t, c_t, d, error, width // groups, groups)
                        break
                    if groups == 1:
                        problems.append(f"{out.name} with B = {b_t.name}: differs by {error:.3g}")
                if chosen:
                    break
            if chosen:
                break
        if chosen is None:
            raise Decline(
                "no output agrees with the recurrence on random inputs, with any number of groups of B and C"
                + (f" ({'; '.join(problems[:3])})" if problems else " (no tensor of y's shape reads x, dt, B, C alone)")
            )
        out, b_t, c_t, d, error, n, groups = chosen
        return self._replace(graph, ctx, cumsum, out, x, dt, b_t, c_t, a, d, n, groups, error)

    @staticmethod
    def _check(trials, actual, x, dt, b_t, c_t, a, groups):
        """(max relative difference, D) of the recurrence with ``groups`` groups of B and C: D per
        head fitted on the first trial (least squares of the residual against x), the difference
        taken over both."""
        batch, steps, heads, p = trials[0][x.name].shape
        n = trials[0][b_t.name].shape[-1] // groups
        worst, d = 0.0, np.zeros(heads)
        for k, (trial, got) in enumerate(zip(trials, actual)):
            xs = trial[x.name].astype(np.float32).astype(np.float64)
            args = [trial[t.name].astype(np.float32).astype(np.float64) for t in (dt, b_t, c_t)]
            bs, cs = (v.reshape(batch, steps, groups, n) for v in args[1:])
            if k == 0:
                free = _reference(xs, args[0], a, bs, cs, np.zeros(heads), groups)
                residual = got - free
                d = (residual * xs).sum(axis=(0, 1, 3)) / np.maximum((xs * xs).sum(axis=(0, 1, 3)), 1e-30)
            expected = _reference(xs, args[0], a, bs, cs, d, groups)
            worst = max(worst, float((np.abs(got - expected) / (1 + np.abs(expected))).max()))
        return worst, d

    def _replace(self, graph, ctx, cumsum, out, x, dt, b_t, c_t, a, d, n, groups, error) -> Match:
        """One SelectiveScan a group of heads (the op shares one B and C across its channels),
        their outputs concatenated over the channels."""
        gb = GraphBuilder(graph, ctx)
        batch, steps, heads, p = U.static_shape(x)
        channels = heads * p
        f32 = np.float32
        x_in = gb.reshape(x, (batch, steps, channels))
        dt_wide = gb.node(
            "Expand",
            [
                gb.unsqueeze(dt, 3),
                gb.const(np.array([batch, steps, heads, p], np.int64), name="ssd_dt_shape"),
            ],
            shape=(batch, steps, heads, p),
            dtype=f32,
        )
        dt_in = gb.reshape(dt_wide, (batch, steps, channels))
        a_full = np.repeat(a, p)[:, None].repeat(n, axis=1).astype(f32)
        d_full = np.repeat(d, p).astype(f32)
        width = channels // groups

        def part(t, lo, hi, size):
            if (lo, hi) == (0, size):
                return t
            ints = lambda v: gb.const(np.array([v], np.int64), name="ssd_slice")  # noqa: E731
            shape = (batch, steps, hi - lo)
            return gb.node("Slice", [t, ints(lo), ints(hi), ints(2)], shape=shape, dtype=f32)

        b_all = gb.reshape(b_t, (batch, steps, groups * n))
        c_all = gb.reshape(c_t, (batch, steps, groups * n))
        ys, nodes = [], []
        for g in range(groups):
            lo, hi = g * width, (g + 1) * width
            inputs = [
                part(x_in, lo, hi, channels),
                part(dt_in, lo, hi, channels),
                gb.const(a_full[lo:hi], name="ssd_A"),
                part(b_all, g * n, (g + 1) * n, groups * n),
                part(c_all, g * n, (g + 1) * n, groups * n),
                gb.const(d_full[lo:hi], name="ssd_D"),
            ]
            y_g = gb.var("SelectiveScan_y", f32, (batch, steps, width))
            h_last = gb.var("SelectiveScan_h_last", f32, (batch, width, n))
            nodes.append(make_framefuse_node(graph, ctx, "SelectiveScan", inputs, [y_g, h_last], {"delta_softplus": 0}))
            ys.append(y_g)
        y = (
            ys[0]
            if groups == 1
            else gb.node("Concat", ys, shape=(batch, steps, channels), dtype=f32, attrs={"axis": 2})
        )
        node = nodes[0]
        result = y if U.static_shape(out) == (batch, steps, channels) else gb.reshape(y, U.static_shape(out))
        U.replace_tensor(graph, out, result)
        return Match(
            self.name,
            "SelectiveScan",
            node.name,
            [U.node_label(cumsum)],
            {
                "steps": int(steps),
                "heads": int(heads),
                "head_dim": int(p),
                "state": int(n),
                "groups": int(groups),
                "form": "chunked (SSD)",
                "check_max_rel_diff": error,
            },
        )
