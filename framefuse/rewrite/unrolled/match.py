"""Small structural matchers over step templates (``chains.Tmpl``), shared by the non-linear
recurrence passes. Each returns None when the template does not have the form (no exceptions),
and accepts the operand orders of commutative ops."""

from __future__ import annotations

import numpy as np

from framefuse.rewrite.unrolled.chains import Tmpl
from framefuse.rewrite.unrolled.graphutil import const_value


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
