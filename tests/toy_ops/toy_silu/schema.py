"""ToySilu: y = x · sigmoid(x) elementwise over x [B, T, D] (storage fp32/fp16/bf16)."""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, TensorSpec, require_rank

OP = "ToySilu"


def infer_shapes(shapes, attrs) -> list[tuple[int, ...]]:
    return [require_rank(OP, "x", shapes[0], 3)]


SCHEMA = OpSchema(
    name=OP,
    inputs=(TensorSpec("x", 3, "T", dims=("B", "T", "D")),),
    outputs=(TensorSpec("y", 3, "T", dims=("B", "T", "D")),),
    infer_shapes=infer_shapes,
    doc="x · sigmoid(x)",
)
