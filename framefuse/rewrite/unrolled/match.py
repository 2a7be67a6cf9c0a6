"""Small structural matchers over step templates (``chains.Tmpl``), shared by the non-linear
recurrence passes. Each returns None when the template does not have the form (no exceptions),
and accepts the operand orders of commutative ops."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.unrolled.chains import Tmpl
from framefuse.rewrite.unrolled.graphutil import const_value, producer, split_span


def op(tm: Tmpl | None) -> str | None:
    return tm.node.op if tm is not None and tm.kind == "node" else None


def args(tm: Tmpl, op_type: str, n: int | None = None) -> list[Tmpl] | None:
    if op(tm) != op_type or (n is not None and len(tm.children) != n):
        return None
    return tm.children


def pairs(tm: Tmpl, op_type: str):
    """Both operand orders of a binary commutative op (Add, Mul, Max)."""
    children = args(tm, op_type, 2)
    if children is None:
        return []
    return [(children[0], children[1]), (children[1], children[0])]


def scalar(tm: Tmpl) -> float | None:
    """The value of a constant scalar leaf (any shape with one element)."""
    if tm.kind != "leaf":
        return None
    value = const_value(tm.tensor)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(-1)[0])


def depends_on_hole(tm: Tmpl) -> bool:
    return any(t.kind == "hole" for t in tm.walk())


def gemm_rows(attrs: dict, w: np.ndarray | None, bias: np.ndarray | None):
    """(W [out, in], b [out]) of a Gemm with constant weight ``w`` and bias (None: none) as a
    torch Linear (no transA, alpha = beta = 1), or None."""
    if int(attrs.get("transA", 0)) or float(attrs.get("alpha", 1.0)) != 1.0 or float(attrs.get("beta", 1.0)) != 1.0:
        return None
    if w is None or w.ndim != 2:
        return None
    w = w if int(attrs.get("transB", 0)) else w.T
    b = np.zeros(w.shape[0], w.dtype)
    if bias is not None:
        if bias.size not in (1, w.shape[0]):
            return None
        b = np.broadcast_to(bias.reshape(-1), (w.shape[0],)).astype(w.dtype)
    return np.ascontiguousarray(w), b


def linear_head(tm: Tmpl):
    """``tm`` = input @ Wᵀ + b (a torch Linear: Gemm, or MatMul [+ Add]). Returns
    (input template, W [out, in] numpy, b [out] numpy) with constant weights, or None."""
    children = args(tm, "Gemm")
    if children is not None:
        w = const_value(children[1].tensor) if children[1].kind == "leaf" else None
        bias = None
        if len(children) > 2 and children[2].tensor.name:
            bias = const_value(children[2].tensor) if children[2].kind == "leaf" else None
            if bias is None:
                return None
        rows = gemm_rows(tm.node.attrs, w, bias)
        return None if rows is None else (children[0], *rows)
    for left, right in pairs(tm, "Add"):
        bias = const_value(right.tensor) if right.kind == "leaf" else None
        inner = _matmul_head(left)
        if bias is not None and inner is not None:
            x, w = inner
            if bias.size not in (1, w.shape[0]):
                return None
            return x, w, np.broadcast_to(bias.reshape(-1), (w.shape[0],)).astype(w.dtype)
    inner = _matmul_head(tm)
    if inner is not None:
        x, w = inner
        return x, w, np.zeros(w.shape[0], w.dtype)
    return None


def _matmul_head(tm: Tmpl):
    children = args(tm, "MatMul", 2)
    if children is None or children[1].kind != "leaf":
        return None
    w = const_value(children[1].tensor)
    if w is None or w.ndim != 2:
        return None
    return children[0], np.ascontiguousarray(w.T)


# -- linear layers of a cell's gates (the GRU and LSTM cell passes) ------------------------------


def last_axis_span(node: gs.Node, output: gs.Tensor, length: int, sizes) -> tuple[int, int] | None:
    """[start, stop) of the features a Split's ``output`` takes (the split must be along them)."""
    span = split_span(node, output, length, sizes)
    return None if span is None or span[0] not in (-1, 1) else span[1:]


def hole_linear(tm: Tmpl):
    """(U [n, H], c [n]) when ``tm`` is a linear layer of the hole (h_{t−1}), or rows of one taken
    by a Split along the features; else None."""
    head = linear_head(tm)
    if head is not None:
        source, w, b = head
        return (w, b) if source.kind == "hole" else None
    if op(tm) == "Split" and tm.children:
        inner = hole_linear(tm.children[0])
        if inner is None:
            return None
        sizes = const_value(tm.children[1].tensor) if len(tm.children) > 1 and tm.children[1].kind == "leaf" else None
        span = last_axis_span(tm.node, tm.tensor, inner[0].shape[0], sizes)
        if span is None:
            return None
        return inner[0][span[0] : span[1]], inner[1][span[0] : span[1]]
    return None


def graph_linear(t: gs.Tensor):
    """(input tensor, W [n, I], b [n]) when ``t`` is computed by a linear layer with constant
    weights (Gemm, or MatMul [+ Add]) in the graph, or rows of one taken by a Split."""
    node = producer(t)
    if node is None:
        return None
    if node.op == "Split":
        inner = graph_linear(node.inputs[0])
        if inner is None:
            return None
        sizes = const_value(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1].name else None
        span = last_axis_span(node, t, inner[1].shape[0], sizes)
        if span is None:
            return None
        return inner[0], inner[1][span[0] : span[1]], inner[2][span[0] : span[1]]
    if node.op == "Gemm":
        bias = None
        if len(node.inputs) > 2 and node.inputs[2].name:
            bias = const_value(node.inputs[2])
            if bias is None:
                return None
        rows = gemm_rows(node.attrs, const_value(node.inputs[1]), bias)
        return None if rows is None else (node.inputs[0], *rows)
    if node.op == "MatMul":
        w = const_value(node.inputs[1])
        if w is None or w.ndim != 2:
            return None
        return node.inputs[0], np.ascontiguousarray(w.T), np.zeros(w.shape[1], np.float32)
    if node.op == "Add":
        for x, c in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            bias = const_value(c)
            inner = graph_linear(x) if bias is not None else None
            if inner is not None and producer(x) is not None and producer(x).op in ("MatMul", "Gemm"):
                if bias.size not in (1, inner[1].shape[0]):
                    return None
                return inner[0], inner[1], inner[2] + np.broadcast_to(bias.reshape(-1), inner[2].shape)
    return None


def gate_preactivation(tm: Tmpl):
    """A gate's pre-activation x·Wᵀ + b + h·Uᵀ + c: (frame tensor, W, b, U, c) or None."""
    for p, q in pairs(tm, "Add"):
        hside = hole_linear(p)
        if hside is None or q.kind != "leaf":
            continue
        xside = graph_linear(q.tensor)
        if xside is not None:
            return xside[0], xside[1], xside[2], hside[0], hside[1]
    return None
