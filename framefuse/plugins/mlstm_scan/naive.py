"""Reference MLSTMScan (ground truth for the kernel): the stabilised recurrence of OPS.md, looped
over time. With f̃ = logsigmoid(f_pre), per (batch, head):

  m_t = max(f̃_t + m_{t−1}, i_pre_t)
  i'  = exp(i_pre_t − m_t);   f' = exp(f̃_t + m_{t−1} − m_t)
  C_t = f'·C_{t−1} + i'·v_t k_tᵀ   ([Dv, Dk]);   n_t = f'·n_{t−1} + i'·k_t   ([Dk])
  h_t = C_t q_t / (max(|n_tᵀ q_t|, exp(−m_t)) + eps)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from framefuse.plugins.mlstm_scan.schema import check_shapes


def reference(q, k, v, i_pre, f_pre, C0=None, n0=None, m0=None, eps=0.0):
    """Computes in float32 (float64 if q is float64); returns (h in q's dtype, C_last, n_last,
    m_last float32). eps: the attribute, added to the read-out's denominator after the max."""
    sizes = check_shapes([tuple(x.shape) if x is not None else None for x in (q, k, v, i_pre, f_pre, C0, n0, m0)])
    B, H, T, Dk, Dv = sizes["B"], sizes["H"], sizes["T"], sizes["Dk"], sizes["Dv"]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    dev = q.device
    C = torch.zeros(B, H, Dv, Dk, dtype=compute, device=dev) if C0 is None else C0.to(compute)
    n = torch.zeros(B, H, Dk, dtype=compute, device=dev) if n0 is None else n0.to(compute)
    m = torch.zeros(B, H, dtype=compute, device=dev) if m0 is None else m0.to(compute)
    outputs = []
    for t in range(T):
        q_t = q[:, :, t].to(compute)  # [B, H, Dk]
        k_t = k[:, :, t].to(compute)  # [B, H, Dk]
        v_t = v[:, :, t].to(compute)  # [B, H, Dv]
        i_t = i_pre[:, :, t].to(compute)  # [B, H]
        log_f = F.logsigmoid(f_pre[:, :, t].to(compute))  # [B, H]
        m_new = torch.maximum(log_f + m, i_t)  # NaN-propagating max
        i_gate = torch.exp(i_t - m_new)
        f_gate = torch.exp(log_f + m - m_new)
        vkT = v_t.unsqueeze(-1) * k_t.unsqueeze(-2)  # [B, H, Dv, Dk]
        C = f_gate[..., None, None] * C + i_gate[..., None, None] * vkT
        n = f_gate[..., None] * n + i_gate[..., None] * k_t
        m = m_new
        numerator = torch.matmul(C, q_t.unsqueeze(-1)).squeeze(-1)  # [B, H, Dv]
        denominator = torch.maximum((n * q_t).sum(-1).abs(), torch.exp(-m)) + float(eps)  # [B, H]
        outputs.append(numerator / denominator.unsqueeze(-1))
    h = torch.stack(outputs, dim=2)
    return h.to(q.dtype), C.to(torch.float32), n.to(torch.float32), m.to(torch.float32)
