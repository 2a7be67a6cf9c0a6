"""A gated diagonal linear SSM with data-dependent decay (the GLA / HGRN family, minimal form).

a_t = σ(W_a x_t), h_t = a_t ⊙ h_{t−1} + (1 − a_t) ⊙ W_b x_t, y_t = h_t ⊙ silu(W_g x_t) → W_out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from framefuse.models.base import Mixer, StackedModel, State, register


class GatedSSMMixer(Mixer):
    def __init__(self, embed: int):
        super().__init__()
        self.embed = embed
        self.linear_a = nn.Linear(embed, embed)
        self.linear_b = nn.Linear(embed, embed)
        self.linear_g = nn.Linear(embed, embed)
        self.linear_out = nn.Linear(embed, embed)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"h": (batch, self.embed)}

    def mix(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.sigmoid(self.linear_a(x))
        b = (1 - a) * self.linear_b(x)
        hs = []
        for t in range(x.shape[1]):
            h = a[:, t] * h + b[:, t]
            hs.append(h)
        y = torch.stack(hs, dim=1) * F.silu(self.linear_g(x))
        return self.linear_out(y), h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(x, x.new_zeros(x.shape[0], self.embed))[0]

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        (h,) = state
        y, h = self.mix(x_t.unsqueeze(1), h)
        return y.squeeze(1), (h,)


@register("gated_ssm")
class GatedSSM(StackedModel):
    category = "ssm"

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        return GatedSSMMixer(config["embed"])
