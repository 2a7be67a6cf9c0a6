"""xLSTM's mLSTM (Beck et al. 2024): matrix memory with stabilised exponential gating.

The recurrence is ``mlstm_recurrent_step_stabilized_simple`` looped over time, in OPS.md's
MLSTMScan layout and without its ε (C is [Dv, Dk]; m0 = 0, C0 = 0, n0 = 0):

  f̃ = logsigmoid(f_pre);  m_t = max(f̃_t + m_{t−1}, i_pre_t)
  i' = exp(i_pre_t − m_t);  f' = exp(f̃_t + m_{t−1} − m_t)
  C_t = f' C_{t−1} + i' v_t k_tᵀ;  n_t = f' n_{t−1} + i' k_t
  h_t = C_t q_t / max(|n_tᵀ q_t|, exp(−m_t))

with k already scaled by 1/√Dk. Block output: out_proj(head-wise LayerNorm(h) ⊙ silu(W_z x)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from framefuse.models.base import Mixer, StackedModel, State, register, require_positive_int, split_heads


class MLSTMMixer(Mixer):
    def __init__(self, embed: int, heads: int, head_dim: int):
        super().__init__()
        self.embed = embed
        self.heads = heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(embed, embed, bias=False)
        self.k_proj = nn.Linear(embed, embed, bias=False)
        self.v_proj = nn.Linear(embed, embed, bias=False)
        self.igate = nn.Linear(embed, heads)
        self.fgate = nn.Linear(embed, heads)
        self.z_proj = nn.Linear(embed, embed, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(embed))  # per-channel scale of the head norm
        self.out_proj = nn.Linear(embed, embed, bias=False)
        # xLSTM's gate biases: forget gate biased open (linspace 3..6), input gate ~ N(0, 0.1).
        # (xLSTM also zeroes the gate weights; we keep them random so the gates depend on x.)
        with torch.no_grad():
            self.fgate.bias.copy_(torch.linspace(3.0, 6.0, heads))
            nn.init.normal_(self.igate.bias, std=0.1)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        h, d = self.heads, self.head_dim
        return {"C": (batch, h, d, d), "n": (batch, h, d), "m": (batch, h)}

    def project(self, x: torch.Tensor):
        b, length, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, length, self.heads, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(x))
        k = heads(self.k_proj(x)) / math.sqrt(self.head_dim)
        v = heads(self.v_proj(x))
        i_pre = self.igate(x).transpose(1, 2)  # [B, H, L]
        f_pre = self.fgate(x).transpose(1, 2)
        return q, k, v, i_pre, f_pre

    @staticmethod
    def mlstm_scan(q, k, v, i_pre, f_pre, C, n, m):
        """Stabilised mLSTM recurrence. q, k, v [B, H, L, D]; i_pre, f_pre [B, H, L];
        C [B, H, Dv, Dk], n [B, H, Dk], m [B, H]."""
        log_f = F.logsigmoid(f_pre)
        hs = []
        for t in range(q.shape[2]):
            m_new = torch.maximum(log_f[:, :, t] + m, i_pre[:, :, t])
            i_act = torch.exp(i_pre[:, :, t] - m_new)
            f_act = torch.exp(log_f[:, :, t] + m - m_new)
            k_t, v_t, q_t = k[:, :, t], v[:, :, t], q[:, :, t]
            C = f_act[..., None, None] * C + i_act[..., None, None] * (v_t.unsqueeze(-1) * k_t.unsqueeze(-2))
            n = f_act[..., None] * n + i_act[..., None] * k_t
            m = m_new
            h_num = torch.matmul(C, q_t.unsqueeze(-1)).squeeze(-1)  # [B, H, Dv]
            qn = (n * q_t).sum(-1)  # [B, H]
            h_den = torch.maximum(qn.abs(), torch.exp(-m))
            hs.append(h_num / h_den.unsqueeze(-1))
        return torch.stack(hs, dim=2), C, n, m

    def output(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, _, length, _ = h.shape
        h = F.layer_norm(h, (self.head_dim,))  # per head, no affine; scale below per channel
        h = h.transpose(1, 2).reshape(b, length, self.embed) * self.norm_weight
        return self.out_proj(h * F.silu(self.z_proj(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        C = x.new_zeros(b, self.heads, self.head_dim, self.head_dim)
        n = x.new_zeros(b, self.heads, self.head_dim)
        m = x.new_zeros(b, self.heads)
        h, _, _, _ = self.mlstm_scan(*self.project(x), C, n, m)
        return self.output(h, x)

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        C, n, m = state
        x = x_t.unsqueeze(1)
        h, C, n, m = self.mlstm_scan(*self.project(x), C, n, m)
        return self.output(h, x).squeeze(1), (C, n, m)


@register("xlstm")
class XLSTM(StackedModel):
    category = "linear-rnn"
    ARCH_DEFAULTS = {"heads": 4}

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        heads = require_positive_int(self.arch, config, "heads")
        return MLSTMMixer(config["embed"], heads, split_heads(self.arch, config["embed"], heads))
