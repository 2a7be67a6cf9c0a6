"""Plain-loop reference of LinearScan (ground truth for the kernel and the rewrite)."""

from __future__ import annotations

import torch


def reference(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = a_t * h_{t-1} + b_t for t = 0..T-1, with h_{-1} = h0 (zeros if None).

    a, b: [B, T, D] in any float dtype; h0: [B, D]. Computes in float32 (float64 if a is float64).
    Returns (h [B,T,D] in a's dtype, h_last [B,D] float32, or float64 for float64 input).
    """
    compute = torch.float64 if a.dtype == torch.float64 else torch.float32
    batch, steps, channels = a.shape
    a32 = a.to(compute)
    b32 = b.to(compute)
    h = torch.zeros(batch, channels, dtype=compute, device=a.device) if h0 is None else h0.to(compute).clone()
    hs = []
    for t in range(steps):
        h = a32[:, t] * h + b32[:, t]
        hs.append(h)
    out = torch.stack(hs, dim=1) if hs else torch.zeros(batch, 0, channels, dtype=compute, device=a.device)
    return out.to(a.dtype), h.to(compute if compute == torch.float64 else torch.float32)
