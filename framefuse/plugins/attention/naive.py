"""Reference Attention (ground truth for the kernel): the explicit formula, one matmul at a time.

o = softmax(scale · q kᵀ + mask) v, with
- GQA: query head h reads KV head h // (Hq / Hkv);
- causal: query i sees key j iff j ≤ i + (Tk − Tq) (aligned bottom-right, so a step-form query
  against a window of W keys sees all of them);
- a row whose scores are all −inf (fully masked) gives 0, not NaN;
- NaN/Inf propagate through the formula as IEEE arithmetic does (a NaN score makes its row NaN).
Keys hidden by `causal` do not enter the row at all (their values are never read).
"""

from __future__ import annotations

import math

import torch

from framefuse.plugins.attention.schema import SCHEMA, check_shapes


def causal_visibility(Tq: int, Tk: int, device=None) -> torch.Tensor:
    """Boolean [Tq, Tk]: True where query i may see key j, i.e. j ≤ i + (Tk − Tq)."""
    i = torch.arange(Tq, device=device).unsqueeze(1)
    j = torch.arange(Tk, device=device).unsqueeze(0)
    return j <= i + (Tk - Tq)


def reference(q, k, v, mask=None, **attrs) -> tuple[torch.Tensor]:
    """Attention in float32 (float64 if q is float64); returns (o,) in q's dtype."""
    attrs = SCHEMA.attrs_with_defaults(attrs)
    sizes = check_shapes([tuple(q.shape), tuple(k.shape), tuple(v.shape), None if mask is None else tuple(mask.shape)])
    Hq, Hkv, Tq, Tk, Dh = sizes["Hq"], sizes["Hkv"], sizes["Tq"], sizes["Tk"], sizes["Dh"]
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(Dh)
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32

    groups = Hq // Hkv
    qf = q.to(compute)
    # Query head h reads KV head h // groups: repeat each KV head `groups` times, in order.
    kf = k.to(compute).repeat_interleave(groups, dim=1)
    vf = v.to(compute).repeat_interleave(groups, dim=1)

    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # [B, Hq, Tq, Tk]
    if mask is not None:
        scores = scores + mask.to(compute)  # [Tq,Tk] / [B|1,1|Hq,Tq,Tk] broadcast
    if attrs["causal"]:
        scores = scores.masked_fill(~causal_visibility(Tq, Tk, q.device), float("-inf"))

    row_max = scores.amax(dim=-1, keepdim=True)  # NaN if the row has a NaN
    fully_masked = row_max == float("-inf")
    p = torch.exp(scores - torch.where(fully_masked, torch.zeros_like(row_max), row_max))
    o = torch.matmul(p, vf) / p.sum(dim=-1, keepdim=True)
    o = torch.where(fully_masked, torch.zeros_like(o), o)
    return (o.to(q.dtype),)
