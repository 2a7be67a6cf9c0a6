"""GatedDeltaRuleScan (domain `framefuse`, gated DeltaNet), per (batch, head), S [Dk, Dv]:

    S_t = α_t · (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   α_t = exp(g_t),   o_t = S_tᵀ q_t

i.e. the recurrent form of transformers' `torch_recurrent_gated_delta_rule` (Qwen3-Next) and
flash-linear-attention's `fused_recurrent_gated_delta_rule`: decay the state, then the delta
update S += k_t (β_t (v_t − (α_t S)ᵀ k_t))ᵀ, then read out. g is the log decay (≤ 0 in those
models); q scaling, q/k L2 normalisation and β = σ(·) happen before the op, in the graph.

Shapes: q, k [B,H,T,Dk], v [B,H,T,Dv], g, beta [B,H,T], S0 [B,H,Dk,Dv] f32 (optional: zeros);
outputs o [B,H,T,Dv], S_last [B,H,Dk,Dv] f32.
"""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

OP = "GatedDeltaRuleScan"
# The kernel keeps Dk entries of each value column of S in registers: Dk ≤ MAX_DK (any Dv).
MAX_DK = 128


def check_shapes(shapes) -> dict:
    """Validate input shapes (q, k, v, g, beta, S0-or-None); returns B, H, T, Dk, Dv."""
    shapes = list(shapes) + [None] * (6 - len(shapes))
    if len(shapes) != 6:
        raise SchemaError(f"{OP}: expected 5 or 6 inputs (q, k, v, g, beta[, S0]), got {len(shapes)}")
    B, H, T, Dk = require_rank(OP, "q", shapes[0], 4)
    Bk, Hk, Tk, Dkk = require_rank(OP, "k", shapes[1], 4)
    Bv, Hv, Tv, Dv = require_rank(OP, "v", shapes[2], 4)
    Bg, Hg, Tg = require_rank(OP, "g", shapes[3], 3)
    Bb, Hb, Tb = require_rank(OP, "beta", shapes[4], 3)
    require_equal(OP, "batch sizes", ("q", B), ("k", Bk), ("v", Bv), ("g", Bg), ("beta", Bb))
    require_equal(OP, "head counts", ("q", H), ("k", Hk), ("v", Hv), ("g", Hg), ("beta", Hb))
    require_equal(OP, "sequence lengths", ("q", T), ("k", Tk), ("v", Tv), ("g", Tg), ("beta", Tb))
    require_equal(OP, "key dims of q and k", ("q", Dk), ("k", Dkk))
    if min(B, H, T, Dk, Dv) < 1:
        raise SchemaError(f"{OP}: every dim must be ≥ 1, got q {list(shapes[0])}, v {list(shapes[2])}")
    if shapes[5] is not None:
        s0 = tuple(shapes[5])
        if s0 != (B, H, Dk, Dv):
            raise SchemaError(f"{OP}: input S0 must have shape [B, H, Dk, Dv] = {[B, H, Dk, Dv]}, got {list(s0)}")
    return dict(B=B, H=H, T=T, Dk=Dk, Dv=Dv)


def infer_shapes(shapes, attrs) -> list[tuple[int, ...]]:
    s = check_shapes(shapes)
    return [(s["B"], s["H"], s["T"], s["Dv"]), (s["B"], s["H"], s["Dk"], s["Dv"])]


SCHEMA = OpSchema(
    name=OP,
    inputs=(
        TensorSpec("q", 4, "T", dims=("B", "H", "T", "Dk"), doc="scaled/normalised before the op"),
        TensorSpec("k", 4, "T", dims=("B", "H", "T", "Dk"), doc="normalised before the op"),
        TensorSpec("v", 4, "T", dims=("B", "H", "T", "Dv")),
        TensorSpec("g", 3, "T", dims=("B", "H", "T"), doc="log decay: α = exp(g)"),
        TensorSpec("beta", 3, "T", dims=("B", "H", "T"), doc="σ applied before the op"),
        TensorSpec("S0", 4, "float32", optional=True, dims=("B", "H", "Dk", "Dv"), doc="initial state (zeros)"),
    ),
    outputs=(
        TensorSpec("o", 4, "T", dims=("B", "H", "T", "Dv")),
        TensorSpec("S_last", 4, "float32", dims=("B", "H", "Dk", "Dv")),
    ),
    attributes={},
    infer_shapes=infer_shapes,
    doc="S_t = exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ; o_t = S_tᵀ q_t (fp32 state).",
)
