"""DeltaRuleScan (domain `framefuse`, DeltaNet): S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,
o_t = S_tᵀ q_t, with S [Dk, Dv] per (batch, head), the layout of flash-linear-attention and of
GatedDeltaRuleScan. See OPS.md.

Shapes: q, k [B,H,T,Dk], v [B,H,T,Dv], beta [B,H,T], S0 [B,H,Dk,Dv] f32 (optional: zeros);
outputs o [B,H,T,Dv], S_last [B,H,Dk,Dv] f32.
"""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

OP = "DeltaRuleScan"
# The kernel keeps a row of S in registers: Dk ≤ MAX_DK (any Dv).
MAX_DK = 128


def check_shapes(shapes) -> dict:
    """Validate input shapes (q, k, v, beta, S0-or-None); returns B, H, T, Dk, Dv."""
    shapes = list(shapes) + [None] * (5 - len(shapes))
    if len(shapes) != 5:
        raise SchemaError(f"{OP}: expected 4 or 5 inputs (q, k, v, beta[, S0]), got {len(shapes)}")
    B, H, T, Dk = require_rank(OP, "q", shapes[0], 4)
    Bk, Hk, Tk, Dkk = require_rank(OP, "k", shapes[1], 4)
    Bv, Hv, Tv, Dv = require_rank(OP, "v", shapes[2], 4)
    Bb, Hb, Tb = require_rank(OP, "beta", shapes[3], 3)
    require_equal(OP, "batch sizes", ("q", B), ("k", Bk), ("v", Bv), ("beta", Bb))
    require_equal(OP, "head counts", ("q", H), ("k", Hk), ("v", Hv), ("beta", Hb))
    require_equal(OP, "sequence lengths", ("q", T), ("k", Tk), ("v", Tv), ("beta", Tb))
    require_equal(OP, "key dims of q and k", ("q", Dk), ("k", Dkk))
    if min(B, H, T, Dk, Dv) < 1:
        raise SchemaError(f"{OP}: every dim must be ≥ 1, got q {list(shapes[0])}, v {list(shapes[2])}")
    if shapes[4] is not None:
        s0 = tuple(shapes[4])
        if s0 != (B, H, Dk, Dv):
            raise SchemaError(f"{OP}: input S0 must have shape [B, H, Dk, Dv] = {[B, H, Dk, Dv]}, got {list(s0)}")
    return dict(B=B, H=H, T=T, Dk=Dk, Dv=Dv)


def infer_shapes(shapes, attrs) -> list[tuple[int, ...]]:
    s = check_shapes(shapes)
    return [(s["B"], s["H"], s["T"], s["Dv"]), (s["B"], s["H"], s["Dk"], s["Dv"])]


SCHEMA = OpSchema(
    name=OP,
    inputs=(
        TensorSpec("q", 4, "T", dims=("B", "H", "T", "Dk")),
        TensorSpec("k", 4, "T", dims=("B", "H", "T", "Dk"), doc="normalised before the op"),
        TensorSpec("v", 4, "T", dims=("B", "H", "T", "Dv")),
        TensorSpec("beta", 3, "T", dims=("B", "H", "T"), doc="σ applied before the op"),
        TensorSpec("S0", 4, "float32", optional=True, dims=("B", "H", "Dk", "Dv"), doc="initial state (zeros)"),
    ),
    outputs=(
        TensorSpec("o", 4, "T", dims=("B", "H", "T", "Dv")),
        TensorSpec("S_last", 4, "float32", dims=("B", "H", "Dk", "Dv")),
    ),
    attributes={},
    infer_shapes=infer_shapes,
    doc="S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ; o_t = S_tᵀ q_t (fp32 state [Dk, Dv]).",
)
