"""WKVScan (domain `framefuse`, RWKV-4 WKV): per batch b and channel c, with w = −exp(time_decay)
(the per-step log decay, computed before the op) and u = time_first:

    y_t   = (e^{p−q}·num + e^{k_t+u−q}·v_t) / (e^{p−q}·den + e^{k_t+u−q}),   q = max(p, k_t + u)
    num' = e^{p+w−p'}·num + e^{k_t−p'}·v_t,  den' = e^{p+w−p'}·den + e^{k_t−p'},  p' = max(p + w, k_t)

(num, den, p) is the state; p is the running max that keeps the exponentials finite.

Shapes: k, v [B,T,C]; w, u [C] f32; num0, den0, max0 [B,C] f32 (optional: 0, 0, −1e38 as
transformers starts); outputs y [B,T,C], num_last, den_last, max_last [B,C] f32.
"""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

OP = "WKVScan"
# transformers' initial max state (not −inf: e^{p−q} of two −inf would be NaN).
MAX_INIT = -1e38


def check_shapes(shapes) -> dict:
    """Validate input shapes (k, v, w, u, num0, den0, max0 — states may be None); returns B, T, C."""
    shapes = list(shapes) + [None] * (7 - len(shapes))
    if len(shapes) != 7:
        raise SchemaError(f"{OP}: expected 4 to 7 inputs (k, v, w, u[, num0, den0, max0]), got {len(shapes)}")
    B, T, C = require_rank(OP, "k", shapes[0], 3)
    Bv, Tv, Cv = require_rank(OP, "v", shapes[1], 3)
    (Cw,) = require_rank(OP, "w", shapes[2], 1)
    (Cu,) = require_rank(OP, "u", shapes[3], 1)
    require_equal(OP, "batch sizes", ("k", B), ("v", Bv))
    require_equal(OP, "sequence lengths", ("k", T), ("v", Tv))
    require_equal(OP, "channel counts", ("k", C), ("v", Cv), ("w", Cw), ("u", Cu))
    if min(B, T, C) < 1:
        raise SchemaError(f"{OP}: every dim must be ≥ 1, got k {list(shapes[0])}")
    for name, shape in zip(("num0", "den0", "max0"), shapes[4:]):
        if shape is not None and tuple(shape) != (B, C):
            raise SchemaError(f"{OP}: input {name} must have shape [B, C] = {[B, C]}, got {list(shape)}")
    return dict(B=B, T=T, C=C)


def infer_shapes(shapes, attrs) -> list[tuple[int, ...]]:
    s = check_shapes(shapes)
    B, T, C = s["B"], s["T"], s["C"]
    return [(B, T, C), (B, C), (B, C), (B, C)]


SCHEMA = OpSchema(
    name=OP,
    inputs=(
        TensorSpec("k", 3, "T", dims=("B", "T", "C"), doc="keys"),
        TensorSpec("v", 3, "T", dims=("B", "T", "C"), doc="values"),
        TensorSpec("w", 1, "float32", dims=("C",), doc="per-step log decay, −exp(time_decay)"),
        TensorSpec("u", 1, "float32", dims=("C",), doc="time_first bonus of the current token"),
        TensorSpec("num0", 2, "float32", optional=True, dims=("B", "C"), doc="numerator state (zeros)"),
        TensorSpec("den0", 2, "float32", optional=True, dims=("B", "C"), doc="denominator state (zeros)"),
        TensorSpec("max0", 2, "float32", optional=True, dims=("B", "C"), doc="running max (−1e38)"),
    ),
    outputs=(
        TensorSpec("y", 3, "T", dims=("B", "T", "C")),
        TensorSpec("num_last", 2, "float32", dims=("B", "C")),
        TensorSpec("den_last", 2, "float32", dims=("B", "C")),
        TensorSpec("max_last", 2, "float32", dims=("B", "C")),
    ),
    attributes={},
    infer_shapes=infer_shapes,
    doc="RWKV-4 WKV: numerator/denominator state with a running max (fp32 state).",
)
