"""A linear recurrence computed all at once in log space → framefuse ``LinearScan``.

Several minGRU implementations (the "heinsen" parallel scan) compute h_t = a_t ⊙ h_{t−1} + b_t
over a whole sequence from the logs of its coefficients, with no loop in the graph:

    A = cumsum(log a, t)        h = exp(A + logcumsumexp(log b − A, t))

which is Σ_{s≤t} b_s Π_{s<r≤t} a_r, the recurrence from h_{−1} = 0. ``logcumsumexp`` has no ONNX
op: torch's dynamo exporter writes it as ``Log(CumSum(Exp(v − M))) + M`` with M = ReduceMax(v)
over the time axis (the TorchScript exporter refuses ``aten::logcumsumexp``); a plain
``Log(CumSum(Exp(v)))`` is accepted too. The form with an initial state (the paper's code:
``pad(A)`` with a zero in front, ``cat([log h_0, log b])`` and the first step sliced off) is
declined naming the node: only h_{−1} = 0 is mapped.

The pass matches the expression structurally (every CumSum and ReduceMax over one axis, forward,
inclusive, the same A in both places), runs the graph's own nodes between log a, log b and h
(ONNX Runtime, a cut copy) on random log-coefficients against the recurrence, and replaces it with ``LinearScan(exp(log a), exp(log b))`` ([B, T, D], time
axis 1); anything else is declined naming the node and the reason.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import Declined, Match, PassResult, RewriteContext, make_framefuse_node

CHECK_TOLERANCE = 1e-5  # the graph's expression (float32, ONNX Runtime) against the recurrence


class _Decline(Exception):
    pass


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


def match(exp: gs.Node):
    """(log a, log b, axis) for exp(A + logcumsumexp(log b − A)), A = cumsum(log a); a reason when
    it is that expression but for A; None when it is not."""
    for a_t, l_t in _binary(U.producer_op(exp.inputs[0], "Add"), "Add"):
        cum = _cumsum_of(a_t)
        lcse = _logcumsumexp_of(l_t)
        if lcse is None:
            continue
        if cum is None:
            made = U.producer(a_t)
            return (
                f"the cumulative sum beside logcumsumexp is {made.op if made is not None else 'an input'} "
                f"{a_t.name}, not cumsum(log a): only the recurrence from h_(-1) = 0 is mapped (an initial "
                "state written as a padded cumulative sum and a concatenated log h_0 is not)"
            )
        log_a, axis = cum
        v, lcse_axis = lcse
        sub = U.producer_op(v, "Sub")
        if sub is None or sub.inputs[1] is not a_t:
            return f"logcumsumexp of {v.name}, which is not (log b − the same cumulative sum {a_t.name})"
        shape = U.static_shape(exp.outputs[0])
        if shape is None:
            return f"{exp.outputs[0].name} has no static shape"
        if axis % len(shape) != lcse_axis % len(shape):
            return f"the cumulative sums run over axes {axis} and {lcse_axis}"
        return sub.inputs[0], log_a, axis % len(shape)
    return None


def _reference(log_a: np.ndarray, log_b: np.ndarray, axis: int) -> np.ndarray:
    a, b = np.exp(np.moveaxis(log_a, axis, 0)), np.exp(np.moveaxis(log_b, axis, 0))
    h, out = np.zeros(b.shape[1:]), []
    for t in range(b.shape[0]):
        h = a[t] * h + b[t]
        out.append(h)
    return np.moveaxis(np.stack(out), 0, axis)


def _evaluate(graph: gs.Graph, log_a: gs.Tensor, log_b: gs.Tensor, out: gs.Tensor, values: dict) -> np.ndarray:
    """The graph's own nodes from log a and log b to ``out`` (a cut copy), run by ONNX Runtime."""
    import onnx
    import onnxruntime as ort

    sub = graph.copy()
    tensors = sub.tensors()
    inputs = [tensors[log_a.name], tensors[log_b.name]]
    for t in inputs:
        t.inputs.clear()
    sub.inputs, sub.outputs = inputs, [tensors[out.name]]
    sub.cleanup()
    model = gs.export_onnx(sub)
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {log_a.name: values["a"].astype(np.float32), log_b.name: values["b"].astype(np.float32)}
    return session.run(None, feeds)[0].astype(np.float64)


class LogSpaceScanPass:
    name = "log-space-scan"

    def run(self, graph: gs.Graph, ctx: RewriteContext) -> PassResult:
        result = PassResult()
        for node in list(graph.nodes):
            if node.op != "Exp" or node.domain not in ("", "ai.onnx", None) or not node.outputs:
                continue
            found = match(node)
            if found is None:
                continue
            where = U.node_label(node)
            try:
                if isinstance(found, str):
                    raise _Decline(found)
                result.matches.append(self._rewrite(graph, ctx, node, *found))
            except _Decline as exc:
                result.declined.append(Declined(self.name, where, f"log-space linear scan: {exc}"))
        if result.matches:
            graph.cleanup().toposort()
        return result

    def _rewrite(self, graph, ctx, exp: gs.Node, log_b: gs.Tensor, log_a: gs.Tensor, axis: int) -> Match:
        out = exp.outputs[0]
        shape = U.static_shape(out)
        dtype = U.np_dtype(out)
        if len(shape) != 3 or axis != 1:
            raise _Decline(f"{out.name} {list(shape)} scans over axis {axis}; LinearScan takes [B, T, D], time axis 1")
        for t in (log_a, log_b):
            if U.static_shape(t) != shape:
                raise _Decline(f"{t.name} has shape {U.static_shape(t)}, not the scan's {list(shape)}")
        if dtype != np.float32:
            raise _Decline(f"{out.name} is {np.dtype(dtype).name}, LinearScan here is float32")
        rng = np.random.default_rng(0)
        worst = 0.0
        for _ in range(2):
            la = np.log(rng.uniform(0.05, 0.95, shape)).astype(np.float32)  # log(1 − z): a forget factor
            lb = rng.standard_normal(shape).astype(np.float32)
            expected = _reference(la.astype(np.float64), lb.astype(np.float64), axis)
            try:
                actual = _evaluate(graph, log_a, log_b, out, {"a": la, "b": lb})
            except Exception as exc:  # noqa: BLE001 - a subgraph that does not cut at log a, log b
                raise _Decline(
                    f"the expression cannot be evaluated from {log_a.name} and {log_b.name} alone ({exc})"
                ) from exc
            worst = max(worst, float((np.abs(actual - expected) / (1 + np.abs(expected))).max()))
        if not worst <= CHECK_TOLERANCE:
            raise _Decline(f"the expression differs from the recurrence by {worst:.3g} on random inputs")
        a = U.add_op(graph, ctx, "Exp", [log_a], dtype=dtype, shape=shape, prefix="log_scan_a")
        b = U.add_op(graph, ctx, "Exp", [log_b], dtype=dtype, shape=shape, prefix="log_scan_b")
        h = U.new_var(ctx, "LinearScan_h", dtype, shape)
        h_last = U.new_var(ctx, "LinearScan_h_last", np.float32, (shape[0], shape[2]))
        node = make_framefuse_node(graph, ctx, "LinearScan", [a, b], [h, h_last], {})
        U.replace_tensor(graph, out, h)
        return Match(
            self.name,
            "LinearScan",
            node.name,
            [U.node_label(exp)],
            {"steps": int(shape[1]), "form": "log-space", "check_max_rel_diff": worst},
        )
