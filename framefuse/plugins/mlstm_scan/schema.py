"""MLSTMScan (domain `framefuse`, xLSTM mLSTM with stabilised exponential gating). See OPS.md.

Per head, with f̃ = logsigmoid(f_pre):
  m_t = max(f̃_t + m_{t−1}, i_pre_t);  i' = exp(i_pre_t − m_t);  f' = exp(f̃_t + m_{t−1} − m_t)
  C_t = f'·C_{t−1} + i'·v_t k_tᵀ;  n_t = f'·n_{t−1} + i'·k_t;  h_t = C_t q_t / (max(|n_tᵀ q_t|, exp(−m_t)) + eps)
Shapes: q, k [B,H,T,Dk], v [B,H,T,Dv], i_pre, f_pre [B,H,T], C0 [B,H,Dv,Dk], n0 [B,H,Dk], m0 [B,H]
(states f32, optional: zeros); outputs h [B,H,T,Dv], C_last, n_last, m_last (f32). Attribute eps
(float, default 0: the plain xLSTM read-out; transformers' xLSTM uses 1e-6).
"""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

OP = "MLSTMScan"
# The kernel keeps a row of C (and n) in registers: Dk ≤ MAX_DK (any Dv).
MAX_DK = 128


def check_shapes(shapes) -> dict:
    """Validate input shapes (q, k, v, i_pre, f_pre, C0, n0, m0; states may be None); returns
    B, H, T, Dk, Dv."""
    shapes = list(shapes) + [None] * (8 - len(shapes))
    if len(shapes) != 8:
        raise SchemaError(f"{OP}: expected 5 to 8 inputs (q, k, v, i_pre, f_pre[, C0, n0, m0]), got {len(shapes)}")
    B, H, T, Dk = require_rank(OP, "q", shapes[0], 4)
    Bk, Hk, Tk, Dkk = require_rank(OP, "k", shapes[1], 4)
    Bv, Hv, Tv, Dv = require_rank(OP, "v", shapes[2], 4)
    Bi, Hi, Ti = require_rank(OP, "i_pre", shapes[3], 3)
    Bf, Hf, Tf = require_rank(OP, "f_pre", shapes[4], 3)
    require_equal(OP, "batch sizes", ("q", B), ("k", Bk), ("v", Bv), ("i_pre", Bi), ("f_pre", Bf))
    require_equal(OP, "head counts", ("q", H), ("k", Hk), ("v", Hv), ("i_pre", Hi), ("f_pre", Hf))
    require_equal(OP, "sequence lengths", ("q", T), ("k", Tk), ("v", Tv), ("i_pre", Ti), ("f_pre", Tf))
    require_equal(OP, "key dims of q and k", ("q", Dk), ("k", Dkk))
    if min(B, H, T, Dk, Dv) < 1:
        raise SchemaError(f"{OP}: every dim must be ≥ 1, got q {list(shapes[0])}, v {list(shapes[2])}")
    for name, shape, expected in (
        ("C0", shapes[5], (B, H, Dv, Dk)),
        ("n0", shapes[6], (B, H, Dk)),
        ("m0", shapes[7], (B, H)),
    ):
        if shape is not None and tuple(shape) != expected:
            raise SchemaError(f"{OP}: input {name} must have shape {list(expected)}, got {list(shape)}")
    return dict(B=B, H=H, T=T, Dk=Dk, Dv=Dv)


def infer_shapes(shapes, attrs) -> list[tuple[int, ...]]:
    s = check_shapes(shapes)
    B, H, T, Dk, Dv = s["B"], s["H"], s["T"], s["Dk"], s["Dv"]
    return [(B, H, T, Dv), (B, H, Dv, Dk), (B, H, Dk), (B, H)]


SCHEMA = OpSchema(
    name=OP,
    inputs=(
        TensorSpec("q", 4, "T", dims=("B", "H", "T", "Dk")),
        TensorSpec("k", 4, "T", dims=("B", "H", "T", "Dk"), doc="already scaled by 1/√Dk"),
        TensorSpec("v", 4, "T", dims=("B", "H", "T", "Dv")),
        TensorSpec("i_pre", 3, "T", dims=("B", "H", "T"), doc="input-gate pre-activation", exponentiated=True),
        TensorSpec("f_pre", 3, "T", dims=("B", "H", "T"), doc="forget-gate pre-activation", exponentiated=True),
        TensorSpec("C0", 4, "float32", optional=True, dims=("B", "H", "Dv", "Dk"), doc="zeros"),
        TensorSpec("n0", 3, "float32", optional=True, dims=("B", "H", "Dk"), doc="zeros"),
        TensorSpec("m0", 2, "float32", optional=True, dims=("B", "H"), doc="zeros"),
    ),
    outputs=(
        TensorSpec("h", 4, "T", dims=("B", "H", "T", "Dv")),
        TensorSpec("C_last", 4, "float32", dims=("B", "H", "Dv", "Dk")),
        TensorSpec("n_last", 3, "float32", dims=("B", "H", "Dk")),
        TensorSpec("m_last", 2, "float32", dims=("B", "H")),
    ),
    # eps is added after the max (transformers' mlstm_recurrent_step_native); 0 keeps graphs fused
    # before the attribute existed bitwise unchanged.
    attributes={"eps": (float, 0.0)},
    infer_shapes=infer_shapes,
    doc="Stabilised mLSTM recurrence (fp32 state C, n, m).",
)
