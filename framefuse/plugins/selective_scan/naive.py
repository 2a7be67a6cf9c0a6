"""Plain-loop reference of SelectiveScan (Mamba S6), the ground truth for its kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
    *,
    delta_softplus: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loop over t of
        Δ = softplus(dt + dt_bias) if delta_softplus else dt + dt_bias          [B,D]
        h = exp(Δ[...,None] * A) * h + (Δ * x)[..., None] * B_t[:, None, :]     [B,D,N]
        y = (h * C_t[:, None, :]).sum(-1) + D * x;  y *= silu(z) if z given     [B,D]
    Computes in float32 (float64 if x is float64). Returns (y [B,T,D] in x's dtype, h_last [B,D,N]
    float32, or float64 for float64 input).
    """
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    batch, steps, channels = x.shape
    state = A.shape[1]
    xs, dts, bs, cs = (t.to(compute) for t in (x, dt, B, C))
    a = A.to(compute)
    zs = z.to(compute) if z is not None else None
    h = torch.zeros(batch, channels, state, dtype=compute, device=x.device) if h0 is None else h0.to(compute).clone()
    ys = []
    for t in range(steps):
        delta = dts[:, t]
        if dt_bias is not None:
            delta = delta + dt_bias.to(compute)
        if delta_softplus:
            delta = F.softplus(delta)
        h = torch.exp(delta[:, :, None] * a) * h + (delta * xs[:, t])[:, :, None] * bs[:, t, None, :]
        y = (h * cs[:, t, None, :]).sum(-1)
        if D is not None:
            y = y + D.to(compute) * xs[:, t]
        if zs is not None:
            y = y * F.silu(zs[:, t])
        ys.append(y)
    out = torch.stack(ys, dim=1) if ys else torch.zeros(batch, 0, channels, dtype=compute, device=x.device)
    return out.to(x.dtype), h.to(compute if compute == torch.float64 else torch.float32)
