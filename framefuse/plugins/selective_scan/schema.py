"""SelectiveScan (Mamba S6) — see plugins/OPS.md.

Δ = softplus(dt + dt_bias) if delta_softplus else dt + dt_bias
h_t[d,n] = exp(Δ_t[d]·A[d,n])·h_{t-1}[d,n] + Δ_t[d]·B_t[n]·x_t[d]
y_t[d]   = Σ_n C_t[n]·h_t[d,n] + D[d]·x_t[d];   y_t[d] *= silu(z_t[d]) when z is given
"""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

OP = "SelectiveScan"
MAX_STATE = 256  # N ≤ 256: the state of one channel lives in registers


def _first_known(*values):
    for v in values:
        if isinstance(v, int) and v >= 0:
            return v
    return values[0]


def infer_shapes(shapes, attrs):
    """[x, dt, A, B, C, D?, z?, dt_bias?, h0?] → [y [B,T,D], h_last [B,D,N]]."""
    shapes = list(shapes) + [None] * (9 - len(shapes))
    x = require_rank(OP, "x", shapes[0], 3)
    dt = require_rank(OP, "dt", shapes[1], 3)
    a = require_rank(OP, "A", shapes[2], 2)
    bm = require_rank(OP, "B", shapes[3], 3)
    cm = require_rank(OP, "C", shapes[4], 3)
    dskip = require_rank(OP, "D", shapes[5], 1) if shapes[5] is not None else (None,)
    z = require_rank(OP, "z", shapes[6], 3) if shapes[6] is not None else (None, None, None)
    bias = require_rank(OP, "dt_bias", shapes[7], 1) if shapes[7] is not None else (None,)
    h0 = require_rank(OP, "h0", shapes[8], 3) if shapes[8] is not None else (None, None, None)
    require_equal(OP, "batch sizes", ("x", x[0]), ("dt", dt[0]), ("B", bm[0]), ("C", cm[0]), ("z", z[0]), ("h0", h0[0]))
    require_equal(OP, "sequence lengths", ("x", x[1]), ("dt", dt[1]), ("B", bm[1]), ("C", cm[1]), ("z", z[1]))
    require_equal(
        OP,
        "channel counts",
        ("x", x[2]),
        ("dt", dt[2]),
        ("A", a[0]),
        ("D", dskip[0]),
        ("z", z[2]),
        ("dt_bias", bias[0]),
        ("h0", h0[1]),
    )
    require_equal(OP, "state sizes", ("A", a[1]), ("B", bm[2]), ("C", cm[2]), ("h0", h0[2]))
    state = _first_known(a[1], bm[2], cm[2], h0[2])
    if isinstance(state, int) and state > MAX_STATE:
        raise SchemaError(f"{OP}: state size N={state} exceeds the maximum {MAX_STATE}")
    batch = _first_known(x[0], dt[0], bm[0], cm[0])
    steps = _first_known(x[1], dt[1], bm[1], cm[1])
    channels = _first_known(x[2], dt[2], a[0])
    return [(batch, steps, channels), (batch, channels, state)]


SCHEMA = OpSchema(
    name=OP,
    inputs=(
        TensorSpec("x", 3, "T", dims=("B", "T", "D"), doc="input u"),
        TensorSpec("dt", 3, "T", dims=("B", "T", "D"), doc="step size before bias/softplus"),
        TensorSpec("A", 2, "float32", dims=("D", "N"), doc="state matrix (negative for a stable scan)"),
        TensorSpec("B", 3, "T", dims=("B", "T", "N"), doc="input projection per step"),
        TensorSpec("C", 3, "T", dims=("B", "T", "N"), doc="output projection per step"),
        TensorSpec("D", 1, "float32", optional=True, dims=("D",), doc="skip (default 0)"),
        TensorSpec("z", 3, "T", optional=True, dims=("B", "T", "D"), doc="gate: y *= silu(z)"),
        TensorSpec("dt_bias", 1, "float32", optional=True, dims=("D",), doc="added to dt (default 0)"),
        TensorSpec("h0", 3, "float32", optional=True, dims=("B", "D", "N"), doc="initial state (default zeros)"),
    ),
    outputs=(
        TensorSpec("y", 3, "T", dims=("B", "T", "D")),
        TensorSpec("h_last", 3, "float32", dims=("B", "D", "N"), doc="final state"),
    ),
    attributes={"delta_softplus": (int, 1)},
    infer_shapes=infer_shapes,
    doc="Mamba selective scan with fused discretisation, C contraction, D skip and silu(z) gate",
)
