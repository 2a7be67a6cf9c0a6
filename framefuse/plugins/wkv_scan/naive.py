"""Reference WKVScan (ground truth for the kernel): the recurrence of OPS.md, looped over time, in
the order of operations of transformers' `rwkv_linear_attention_cpu`."""

from __future__ import annotations

import torch

from framefuse.plugins.wkv_scan.schema import MAX_INIT, check_shapes


def reference(k, v, w, u, num0=None, den0=None, max0=None):
    """Computes in float32 (float64 if k is float64); returns (y in k's dtype, num_last, den_last,
    max_last float32)."""
    sizes = check_shapes([tuple(x.shape) if x is not None else None for x in (k, v, w, u, num0, den0, max0)])
    B, T, C = sizes["B"], sizes["T"], sizes["C"]
    compute = torch.float64 if k.dtype == torch.float64 else torch.float32

    def state(x, fill):
        return torch.full((B, C), fill, dtype=compute, device=k.device) if x is None else x.to(compute)

    num, den, p = state(num0, 0.0), state(den0, 0.0), state(max0, MAX_INIT)
    w = w.to(compute)
    u = u.to(compute)
    outputs = []
    for t in range(T):
        k_t = k[:, t].to(compute)
        v_t = v[:, t].to(compute)
        q = torch.maximum(p, k_t + u)
        e1 = torch.exp(p - q)
        e2 = torch.exp(k_t + u - q)
        outputs.append((e1 * num + e2 * v_t) / (e1 * den + e2))
        p_next = torch.maximum(p + w, k_t)
        e1 = torch.exp(p + w - p_next)
        e2 = torch.exp(k_t - p_next)
        num = e1 * num + e2 * v_t
        den = e1 * den + e2
        p = p_next
    y = torch.stack(outputs, dim=1)
    return y.to(k.dtype), num.to(torch.float32), den.to(torch.float32), p.to(torch.float32)
