"""Small algorithms of the ONNX operator specification that more than one stage follows.

The engines' executor (``engines/ops.py``) and the step compiler's lowering (``compiler/lower.py``)
must agree on them to the element, so there is one copy, below both.
"""

from __future__ import annotations


def slice_bounds(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX Slice clamping for one axis of length ``dim`` (the spec's algorithm): negative starts
    and ends count from the end, then both are clamped to [0, dim] (step > 0) or [-1, dim - 1]
    (step < 0)."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
    else:
        start = min(max(start, 0), dim - 1)
        end = min(max(end, -1), dim - 1)
    return start, end
