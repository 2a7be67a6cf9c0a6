"""DeltaNet (Schlag et al. 2021; Yang et al. 2024), the recurrent form of flash-linear-attention's
``naive_recurrent_delta_rule``, with the state laid out as [Dv, Dk] (the transpose of fla's layout,
which OPS.md's DeltaRuleScan takes: the rewrite puts a Transpose on each side of the op, and the step
compiler, which carries the state as [Dv, Dk] rows, lowers the pair away):

S_t = S_{t−1} − β_t (S_{t−1} k_t − v_t) k_tᵀ  (= S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ),  o_t = S_t q_t.

q, k = l2norm(silu(W x)), v = silu(W_v x), β = σ(W_β x) per head; per-head RMSNorm of o, then o_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from framefuse.models.base import Mixer, RMSNorm, StackedModel, State, register, require_positive_int, split_heads


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's l2norm: x / sqrt(Σx² + eps) over the last dim."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class DeltaNetMixer(Mixer):
    def __init__(self, embed: int, heads: int, head_dim: int):
        super().__init__()
        self.embed = embed
        self.heads = heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(embed, embed, bias=False)
        self.k_proj = nn.Linear(embed, embed, bias=False)
        self.v_proj = nn.Linear(embed, embed, bias=False)
        self.b_proj = nn.Linear(embed, heads, bias=False)
        self.o_norm = RMSNorm(head_dim)
        self.o_proj = nn.Linear(embed, embed, bias=False)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"S": (batch, self.heads, self.head_dim, self.head_dim)}

    def project(self, x: torch.Tensor):
        """x [B, L, E] → q, k, v [B, H, L, D] and beta [B, H, L]."""
        b, length, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, length, self.heads, self.head_dim).transpose(1, 2)

        q = l2norm(heads(F.silu(self.q_proj(x))))
        k = l2norm(heads(F.silu(self.k_proj(x))))
        v = heads(F.silu(self.v_proj(x)))
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)
        return q, k, v, beta

    @staticmethod
    def delta_rule(q, k, v, beta, S):
        """The plain recurrence over time. q, k, v [B, H, L, D], beta [B, H, L], S [B, H, Dv, Dk]."""
        outs = []
        for t in range(q.shape[2]):
            k_t = k[:, :, t].unsqueeze(-1)  # [B, H, Dk, 1]
            v_t = v[:, :, t].unsqueeze(-1)  # [B, H, Dv, 1]
            beta_t = beta[:, :, t].unsqueeze(-1).unsqueeze(-1)  # [B, H, 1, 1]
            # Correct the value S stores under key k_t towards v_t by the fraction β_t.
            S = S - (beta_t * (torch.matmul(S, k_t) - v_t)) * k_t.transpose(-1, -2)
            outs.append(torch.matmul(S, q[:, :, t].unsqueeze(-1)).squeeze(-1))  # [B, H, Dv]
        return torch.stack(outs, dim=2), S

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, H, L, Dv] → [B, L, E]."""
        b, _, length, _ = o.shape
        o = self.o_norm(o).transpose(1, 2).reshape(b, length, self.embed)
        return self.o_proj(o)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, beta = self.project(x)
        S0 = x.new_zeros(x.shape[0], self.heads, self.head_dim, self.head_dim)
        o, _ = self.delta_rule(q, k, v, beta, S0)
        return self.output(o)

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        (S,) = state
        q, k, v, beta = self.project(x_t.unsqueeze(1))
        o, S = self.delta_rule(q, k, v, beta, S)
        return self.output(o).squeeze(1), (S,)


@register("delta_net")
class DeltaNet(StackedModel):
    category = "linear-attention"
    ARCH_DEFAULTS = {"heads": 4}

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        heads = require_positive_int(self.arch, config, "heads")
        return DeltaNetMixer(config["embed"], heads, split_heads(self.arch, config["embed"], heads))
