"""LinearScan: h_t = a_t ⊙ h_{t-1} + b_t, elementwise over D (see plugins/OPS.md)."""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, TensorSpec, require_equal, require_rank

OP = "LinearScan"


def _first_known(*values):
    for v in values:
        if isinstance(v, int) and v >= 0:
            return v
    return values[0]


def infer_shapes(shapes, attrs):
    """[a [B,T,D], b [B,T,D], h0 [B,D] or None] → [h [B,T,D], h_last [B,D]]."""
    a = require_rank(OP, "a", shapes[0], 3)
    b = require_rank(OP, "b", shapes[1] if len(shapes) > 1 else None, 3)
    h0 = require_rank(OP, "h0", shapes[2], 2) if len(shapes) > 2 and shapes[2] is not None else (None, None)
    require_equal(OP, "batch sizes (dim 0)", ("a", a[0]), ("b", b[0]), ("h0", h0[0]))
    require_equal(OP, "sequence lengths (dim 1)", ("a", a[1]), ("b", b[1]))
    require_equal(OP, "channel counts (last dim)", ("a", a[2]), ("b", b[2]), ("h0", h0[1]))
    batch = _first_known(a[0], b[0], h0[0])
    time = _first_known(a[1], b[1])
    channels = _first_known(a[2], b[2], h0[1])
    return [(batch, time, channels), (batch, channels)]


SCHEMA = OpSchema(
    name=OP,
    inputs=(
        TensorSpec("a", 3, "T", dims=("B", "T", "D"), doc="decay/gate per step"),
        TensorSpec("b", 3, "T", dims=("B", "T", "D"), doc="input per step"),
        TensorSpec("h0", 2, "float32", optional=True, dims=("B", "D"), doc="initial state (default zeros)"),
    ),
    outputs=(
        TensorSpec("h", 3, "T", dims=("B", "T", "D"), doc="every h_t"),
        TensorSpec("h_last", 2, "float32", dims=("B", "D"), doc="final state"),
    ),
    attributes={},
    infer_shapes=infer_shapes,
    doc="h_t = a_t * h_{t-1} + b_t over time, elementwise over channels",
)
