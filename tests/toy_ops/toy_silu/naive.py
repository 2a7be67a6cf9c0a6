"""Reference ToySilu: the ground truth for the kernel and what ONNX Runtime and the CPU executor run."""

from __future__ import annotations

import torch


def reference(x):
    """Computes in float32 (float64 if x is float64); returns (y,) in x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    wide = x.to(compute)
    return ((wide * torch.sigmoid(wide)).to(x.dtype),)
