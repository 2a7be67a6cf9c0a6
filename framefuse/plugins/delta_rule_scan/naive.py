"""Reference DeltaRuleScan (ground truth for the kernel): the recurrence of OPS.md, looped over time.

S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t   (S is [Dk, Dv]).
"""

from __future__ import annotations

import torch

from framefuse.plugins.delta_rule_scan.schema import check_shapes


def reference(q, k, v, beta, S0=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Computes in float32 (float64 if q is float64); returns (o in q's dtype, S_last float32)."""
    sizes = check_shapes(
        [tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(beta.shape), None if S0 is None else tuple(S0.shape)]
    )
    B, H, T, Dk, Dv = sizes["B"], sizes["H"], sizes["T"], sizes["Dk"], sizes["Dv"]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    S = torch.zeros(B, H, Dk, Dv, dtype=compute, device=q.device) if S0 is None else S0.to(compute)
    identity = torch.eye(Dk, dtype=compute, device=q.device)
    outputs = []
    for t in range(T):
        q_t = q[:, :, t].to(compute)  # [B, H, Dk]
        k_t = k[:, :, t].to(compute)  # [B, H, Dk]
        v_t = v[:, :, t].to(compute)  # [B, H, Dv]
        beta_t = beta[:, :, t].to(compute)[..., None, None]  # [B, H, 1, 1]
        kkT = k_t.unsqueeze(-1) * k_t.unsqueeze(-2)  # [B, H, Dk, Dk]
        kvT = k_t.unsqueeze(-1) * v_t.unsqueeze(-2)  # [B, H, Dk, Dv]
        S = torch.matmul(identity - beta_t * kkT, S) + beta_t * kvT
        outputs.append(torch.matmul(q_t.unsqueeze(-2), S).squeeze(-2))  # qᵀS = (Sᵀq)ᵀ: [B, H, Dv]
    o = torch.stack(outputs, dim=2)
    return o.to(q.dtype), S.to(torch.float32)
