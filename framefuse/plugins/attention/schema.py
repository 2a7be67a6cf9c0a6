"""Attention (domain `framefuse`): o = softmax(scale · q kᵀ + mask) v per head, GQA, causal.

See OPS.md. Shapes: q [B,Hq,Tq,Dh], k/v [B,Hkv,Tk,Dh] (Hq a multiple of Hkv; query head h reads
KV head h // (Hq/Hkv)), mask additive [Tq,Tk] or [B,1,Tq,Tk] or [B,Hq,Tq,Tk] (a batch dim of 1 is
broadcast too), o [B,Hq,Tq,Dh].
"""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

OP = "Attention"
# Head dims with a CUDA kernel; other head dims run the reference on the GPU (OPS.md).
KERNEL_HEAD_DIMS = (32, 64, 128)


def mask_layout(mask_shape, B: int, Hq: int, Tq: int, Tk: int) -> tuple[int, int]:
    """(batch stride, head stride) in elements of an additive mask of `mask_shape`, with 0 for a
    broadcast dim. Accepts [Tq,Tk], [B|1, 1|Hq, Tq, Tk]; anything else raises SchemaError."""
    shape = tuple(mask_shape)
    if len(shape) == 2:
        if shape != (Tq, Tk):
            raise SchemaError(f"{OP}: input mask of shape {list(shape)} must be [Tq, Tk] = [{Tq}, {Tk}]")
        return 0, 0
    if len(shape) == 4:
        mb, mh, mq, mk = shape
        if (mq, mk) != (Tq, Tk) or mb not in (1, B) or mh not in (1, Hq):
            raise SchemaError(
                f"{OP}: input mask of shape {list(shape)} must be [B or 1, 1 or Hq, Tq, Tk] = "
                f"[{B} or 1, 1 or {Hq}, {Tq}, {Tk}]"
            )
        head_stride = Tq * Tk if mh == Hq and Hq > 1 else 0
        batch_stride = mh * Tq * Tk if mb == B and B > 1 else 0
        return batch_stride, head_stride
    raise SchemaError(f"{OP}: input mask must have rank 2 ([Tq, Tk]) or 4 ([B, 1|Hq, Tq, Tk]), got shape {list(shape)}")


def check_shapes(shapes) -> dict:
    """Validate input shapes (q, k, v, mask-or-None); returns the sizes B, Hq, Hkv, Tq, Tk, Dh."""
    shapes = list(shapes) + [None] * (4 - len(shapes))
    if len(shapes) != 4:
        raise SchemaError(f"{OP}: expected 3 or 4 inputs (q, k, v[, mask]), got {len(shapes)}")
    B, Hq, Tq, Dh = require_rank(OP, "q", shapes[0], 4)
    Bk, Hkv, Tk, Dhk = require_rank(OP, "k", shapes[1], 4)
    Bv, Hv, Tv, Dhv = require_rank(OP, "v", shapes[2], 4)
    require_equal(OP, "batch sizes of q, k, v", ("q", B), ("k", Bk), ("v", Bv))
    require_equal(OP, "KV head counts of k, v", ("k", Hkv), ("v", Hv))
    require_equal(OP, "key lengths of k, v", ("k", Tk), ("v", Tv))
    require_equal(OP, "head dims of q, k, v", ("q", Dh), ("k", Dhk), ("v", Dhv))
    if min(B, Hq, Hkv, Tq, Tk, Dh) < 1:
        raise SchemaError(f"{OP}: every dim must be ≥ 1, got q {list(shapes[0])}, k {list(shapes[1])}")
    if Hq % Hkv != 0:
        raise SchemaError(f"{OP}: query heads Hq={Hq} must be a multiple of KV heads Hkv={Hkv} (GQA)")
    if shapes[3] is not None:
        mask_layout(shapes[3], B, Hq, Tq, Tk)
    return dict(B=B, Hq=Hq, Hkv=Hkv, Tq=Tq, Tk=Tk, Dh=Dh)


def infer_shapes(shapes, attrs) -> list[tuple[int, ...]]:
    sizes = check_shapes(shapes)
    return [(sizes["B"], sizes["Hq"], sizes["Tq"], sizes["Dh"])]


SCHEMA = OpSchema(
    name=OP,
    inputs=(
        TensorSpec("q", 4, "T", dims=("B", "Hq", "Tq", "Dh"), doc="queries"),
        TensorSpec("k", 4, "T", dims=("B", "Hkv", "Tk", "Dh"), doc="keys"),
        TensorSpec("v", 4, "T", dims=("B", "Hkv", "Tk", "Dh"), doc="values"),
        TensorSpec(
            "mask",
            4,
            "T",
            optional=True,
            doc="additive mask (−inf masks out): [Tq, Tk] (rank 2), [B, 1, Tq, Tk] or [B, Hq, Tq, Tk]; "
            "storage dtype or float32",
        ),
    ),
    outputs=(TensorSpec("o", 4, "T", dims=("B", "Hq", "Tq", "Dh")),),
    attributes={"scale": (float, None), "causal": (int, 0)},
    infer_shapes=infer_shapes,
    doc="o = softmax(scale·q kᵀ + mask) v; scale defaults to 1/√Dh; causal aligns bottom-right "
    "(query i sees keys j ≤ i + Tk − Tq); a fully masked row gives 0.",
)
