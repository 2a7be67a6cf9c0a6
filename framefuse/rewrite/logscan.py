"""A linear recurrence computed all at once in log space → framefuse ``LinearScan``.

Several minGRU implementations (the "heinsen" parallel scan) compute h_t = a_t ⊙ h_{t−1} + b_t
over a whole sequence from the logs of its coefficients, with no loop in the graph:

    A = cumsum(log a, t)        h = exp(A + logcumsumexp(log b − A, t))

which is Σ_{s≤t} b_s Π_{s<r≤t} a_r, the recurrence from h_{−1} = 0. ``logcumsumexp`` has no ONNX
op: torch's dynamo exporter writes it as ``Log(CumSum(Exp(v − M))) + M`` with M = ReduceMax(v)
over the time axis (the TorchScript exporter refuses ``aten::logcumsumexp``); a plain
``Log(CumSum(Exp(v)))`` is accepted too. The paper's form with an initial state,

    A' = pad(A, one zero in front)   h = exp(A' + logcumsumexp(cat([log h_0, log b]) − A'))[1:]

(``Pad`` or a ``Concat`` of zeros; every reader of the exp slices its first step off) is the
recurrence from h_{−1} = h_0: ``LinearScan(exp(log a), exp(log b), exp(log h_0))``.

The pass matches the expression structurally (every CumSum and ReduceMax over one axis, forward,
inclusive, the same A in both places), runs the graph's own nodes between log a, log b (log h_0)
and h (ONNX Runtime, a cut copy) on random log-coefficients against the recurrence, and replaces
it with ``LinearScan`` ([B, T, D], time axis 1); anything else is declined naming the node and
the reason.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Match, NotACandidate, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder

CHECK_TOLERANCE = 1e-5  # the graph's expression (float32, ONNX Runtime) against the recurrence


def _binary(node: gs.Node | None, op: str):
    """Both operand orders of a binary ``op`` node, or none."""
    if node is None or node.op != op or len(node.inputs) != 2:
        return []
    a, b = node.inputs
    return [(a, b), (b, a)]


def _cumsum_of(t: gs.Tensor):
    """(input, axis) when ``t`` is a forward, inclusive CumSum over a constant axis, else None."""
    node = U.producer_op(t, "CumSum")
    if node is None or int(node.attrs.get("reverse", 0)) or int(node.attrs.get("exclusive", 0)):
        return None
    axis = U.scalar_value(node.inputs[1])
    return None if axis is None else (node.inputs[0], int(axis))


def _logcumsumexp_of(t: gs.Tensor):
    """(v, axis) when ``t`` = logcumsumexp(v) over ``axis``: Log(CumSum(Exp(v − M))) + M with
    M = ReduceMax(v) over that axis, keeping it (dynamo's form), or Log(CumSum(Exp(v)))."""
    log = U.producer_op(t, "Log")
    if log is not None:
        found = _cumsum_of(log.inputs[0])
        exp = U.producer_op(found[0], "Exp") if found else None
        return (exp.inputs[0], found[1]) if exp is not None else None
    for log_t, m in _binary(U.producer_op(t, "Add"), "Add"):
        log = U.producer_op(log_t, "Log")
        reduce = U.producer_op(m, "ReduceMax")
        if log is None or reduce is None:
            continue
        found = _cumsum_of(log.inputs[0])
        exp = U.producer_op(found[0], "Exp") if found else None
        sub = U.producer_op(exp.inputs[0], "Sub") if exp is not None else None
        if sub is None or sub.inputs[1] is not m:
            continue
        v = sub.inputs[0]
        if reduce.inputs[0] is not v or not int(reduce.attrs.get("keepdims", 1)):
            continue
        axes = reduce.attrs.get("axes")
        if axes is None and len(reduce.inputs) > 1:
            axes = U.const_value(reduce.inputs[1])
        if axes is None or np.asarray(axes).size != 1:
            continue
        return v, int(np.asarray(axes).reshape(()))
    return None


def _front_padded_cumsum(t: gs.Tensor, rank: int):
    """(log a, axis) when ``t`` is cumsum(log a) with one zero in front along its axis: a constant
    ``Pad`` of zero (pads 1 before that axis, 0 elsewhere) or ``Concat([zeros of length 1, A])``."""
    pad = U.producer_op(t, "Pad")
    if pad is not None:
        found = _cumsum_of(pad.inputs[0])
        pads = U.const_value(pad.inputs[1]) if len(pad.inputs) > 1 else None
        value = U.const_value(pad.inputs[2]) if len(pad.inputs) > 2 and not U.is_empty(pad.inputs[2]) else 0.0
        axes_given = len(pad.inputs) > 3 and not U.is_empty(pad.inputs[3])
        mode = pad.attrs.get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if found is None or pads is None or value is None or axes_given or mode != "constant":
            return None
        if np.any(np.asarray(value) != 0) or pads.size != 2 * rank:
            return None
        axis = found[1] % rank
        expected = np.zeros(2 * rank, dtype=np.int64)
        expected[axis] = 1
        return found if np.array_equal(pads.astype(np.int64), expected) else None
    cat = U.producer_op(t, "Concat")
    if cat is None or len(cat.inputs) != 2:
        return None
    zeros, rest = cat.inputs
    found = _cumsum_of(rest)
    value = U.const_value(zeros)
    shape = U.static_shape(zeros)
    axis = int(cat.attrs.get("axis", 0)) % rank
    if found is None or value is None or np.any(value != 0) or shape is None or found[1] % rank != axis:
        return None
    return found if shape[axis] == 1 else None


def _step_one_slices(exp: gs.Node, axis: int, length: int) -> list[gs.Node] | None:
    """The readers of ``exp`` when every one is a Slice that drops the first step along ``axis``
    (start 1, to the end, step 1)."""
    slices = U.consumers(exp.outputs[0])
    for node in slices:
        if node.op != "Slice" or node.inputs[0] is not exp.outputs[0] or len(node.inputs) < 3:
            return None
        starts, ends = U.const_value(node.inputs[1]), U.const_value(node.inputs[2])
        axes = U.const_value(node.inputs[3]) if len(node.inputs) > 3 and not U.is_empty(node.inputs[3]) else None
        steps = U.const_value(node.inputs[4]) if len(node.inputs) > 4 and not U.is_empty(node.inputs[4]) else None
        if starts is None or ends is None or starts.size != 1 or ends.size != 1:
            return None
        rank = len(U.static_shape(exp.outputs[0]) or ())
        slice_axis = int(axes.reshape(-1)[0]) % rank if axes is not None else 0
        if slice_axis != axis or int(starts.reshape(())) != 1 or int(ends.reshape(())) < length:
            return None
        if steps is not None and int(steps.reshape(())) != 1:
            return None
    return slices or None


def match(exp: gs.Node):
    """(log a, log b, axis, initial) for exp(A + logcumsumexp(log b − A)), A = cumsum(log a)
    (initial None), or for the padded form with log h_0 (initial (log h_0, the slices)); a reason
    when it is nearly that expression; None when it is not."""
    shape = U.static_shape(exp.outputs[0])
    for a_t, l_t in _binary(U.producer_op(exp.inputs[0], "Add"), "Add"):
        lcse = _logcumsumexp_of(l_t)
        if lcse is None:
            continue
        if shape is None:
            return f"{exp.outputs[0].name} has no static shape"
        rank = len(shape)
        cum = _cumsum_of(a_t)
        padded = None if cum is not None else _front_padded_cumsum(a_t, rank)
        if cum is None and padded is None:
            made = U.producer(a_t)
            return (
                f"the cumulative sum beside logcumsumexp is {made.op if made is not None else 'an input'} "
                f"{a_t.name}, not cumsum(log a) (or it padded with one zero in front)"
            )
        log_a, axis = cum or padded
        v, lcse_axis = lcse
        sub = U.producer_op(v, "Sub")
        if sub is None or sub.inputs[1] is not a_t:
            return f"logcumsumexp of {v.name}, which is not (log b − the same cumulative sum {a_t.name})"
        if axis % rank != lcse_axis % rank:
            return f"the cumulative sums run over axes {axis} and {lcse_axis}"
        axis %= rank
        if cum is not None:
            return sub.inputs[0], log_a, axis, None
        cat = U.producer_op(sub.inputs[0], "Concat")
        if cat is None or len(cat.inputs) != 2 or int(cat.attrs.get("axis", 0)) % rank != axis:
            return (
                f"the padded cumulative sum {a_t.name} is subtracted from {sub.inputs[0].name}, not from "
                "a concatenation of log h_0 and log b along the time axis"
            )
        log_h0, log_b = cat.inputs
        h0_shape = U.static_shape(log_h0)
        if h0_shape is None or h0_shape[axis] != 1:
            return f"{log_h0.name} (log h_0) is {h0_shape}, not one step long"
        slices = _step_one_slices(exp, axis, shape[axis])
        if slices is None:
            return (
                f"{exp.outputs[0].name} holds h_0 and every step; only readers that slice h_0 off (h[:, 1:]) are mapped"
            )
        return log_b, log_a, axis, (log_h0, slices)
    return None


def _reference(log_a: np.ndarray, log_b: np.ndarray, axis: int, log_h0: np.ndarray | None = None) -> np.ndarray:
    a, b = np.exp(np.moveaxis(log_a, axis, 0)), np.exp(np.moveaxis(log_b, axis, 0))
    h = np.zeros(b.shape[1:]) if log_h0 is None else np.exp(np.moveaxis(log_h0, axis, 0)[0])
    out = []
    for t in range(b.shape[0]):
        h = a[t] * h + b[t]
        out.append(h)
    return np.moveaxis(np.stack(out), 0, axis)


class LogSpaceScanPass(AnchoredPass):
    name = "log-space-scan"
    reason_prefix = "log-space linear scan: "
    tidy = "end"

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.op == "Exp" and node.domain in ("", "ai.onnx", None) and node.outputs:
                yield node

    def rewrite(self, graph, ctx, node: gs.Node) -> Match:
        found = match(node)
        if found is None:
            raise NotACandidate
        if isinstance(found, str):
            raise Decline(found)
        return self._rewrite(graph, ctx, node, *found)

    def _rewrite(self, graph, ctx, exp: gs.Node, log_b, log_a, axis: int, initial) -> Match:
        gb = GraphBuilder(graph, ctx)
        log_h0, slices = initial if initial is not None else (None, None)
        out = slices[0].outputs[0] if slices else exp.outputs[0]
        shape = U.static_shape(out)
        dtype = U.np_dtype(out)
        if shape is None or len(shape) != 3 or axis != 1:
            raise Decline(f"{out.name} {shape} scans over axis {axis}; LinearScan takes [B, T, D], time axis 1")
        for t in (log_a, log_b):
            if U.static_shape(t) != shape:
                raise Decline(f"{t.name} has shape {U.static_shape(t)}, not the scan's {list(shape)}")
        if slices and U.is_graph_output(graph, exp.outputs[0]):
            raise Decline(f"{exp.outputs[0].name}, h_0 and every step, is a graph output")
        h0_shape = (shape[0], 1, shape[2])
        if log_h0 is not None and U.static_shape(log_h0) != h0_shape:
            raise Decline(f"{log_h0.name} (log h_0) has shape {U.static_shape(log_h0)}, not {list(h0_shape)}")
        for t in [out] + [s.outputs[0] for s in slices or []]:
            if U.static_shape(t) != shape or U.np_dtype(t) != np.float32:
                raise Decline(
                    f"{t.name} is {U.static_shape(t)} {np.dtype(U.np_dtype(t)).name}, LinearScan here is float32 {list(shape)}"
                )
        # a constant log h_0 (an initializer, as torch.full exports) keeps its value in the check
        h0_value = U.const_value(log_h0) if log_h0 is not None else None
        rng = np.random.default_rng(0)
        worst = 0.0
        for _ in range(2):
            cut = {
                log_a.name: np.log(rng.uniform(0.05, 0.95, shape)),  # log(1 − z): a forget factor
                log_b.name: rng.standard_normal(shape),
            }
            if log_h0 is not None and h0_value is None:
                cut[log_h0.name] = rng.standard_normal(h0_shape)
            h0 = None if log_h0 is None else (h0_value if h0_value is not None else cut[log_h0.name])
            cut = {k: v.astype(np.float32) for k, v in cut.items()}
            expected = _reference(
                cut[log_a.name].astype(np.float64),
                cut[log_b.name].astype(np.float64),
                axis,
                None if h0 is None else np.asarray(h0, dtype=np.float32).astype(np.float64),
            )
            try:
                actual = U.evaluate_cut(graph, cut, [out])[0]
            except Exception as exc:  # noqa: BLE001 - a subgraph that does not cut at these tensors
                raise Decline(f"the expression cannot be evaluated from {', '.join(cut)} alone ({exc})") from exc
            worst = max(worst, float((np.abs(actual - expected) / (1 + np.abs(expected))).max()))
        if not worst <= CHECK_TOLERANCE:
            raise Decline(f"the expression differs from the recurrence by {worst:.3g} on random inputs")
        a = gb.node("Exp", [log_a], shape=shape, dtype=dtype, name="log_scan_a")
        b = gb.node("Exp", [log_b], shape=shape, dtype=dtype, name="log_scan_b")
        inputs = [a, b]
        if log_h0 is not None:
            h0_exp = gb.node("Exp", [log_h0], shape=h0_shape, dtype=dtype, name="log_scan_h0")
            inputs.append(gb.squeeze(h0_exp, 1))
        h = gb.var("LinearScan_h", dtype, shape)
        h_last = gb.var("LinearScan_h_last", np.float32, (shape[0], shape[2]))
        node = make_framefuse_node(graph, ctx, "LinearScan", inputs, [h, h_last], {})
        for t in [s.outputs[0] for s in slices] if slices else [out]:
            U.replace_tensor(graph, t, h)
        return Match(
            self.name,
            "LinearScan",
            node.name,
            [U.node_label(exp)],
            {
                "steps": int(shape[1]),
                "form": "log-space" if log_h0 is None else "log-space, initial state",
                "check_max_rel_diff": worst,
            },
        )
