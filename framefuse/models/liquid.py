"""Liquid network: the closed-form continuous-time cell (CfC, Hasani et al. 2022), no backbone.

As ncps' ``CfCCell`` (mode "default", backbone_layers=0): every head acts on
``cat([x_t, h_{t−1}])``; ff1 = tanh(W1·), ff2 = tanh(W2·), t_a = Wa·, t_b = Wb·,
τ = σ(t_a·ts + t_b), h_t = ff1 ⊙ (1 − τ) + τ ⊙ ff2. The block's output is W_out h.
"""

from __future__ import annotations

import torch
from torch import nn

from framefuse.models.base import Mixer, ModelConfigError, StackedModel, State, register


class CfCMixer(Mixer):
    def __init__(self, embed: int, timespan: float):
        super().__init__()
        self.embed = embed
        self.hidden = embed
        self.timespan = float(timespan)
        cat = embed + self.hidden
        self.ff1 = nn.Linear(cat, self.hidden)
        self.ff2 = nn.Linear(cat, self.hidden)
        self.time_a = nn.Linear(cat, self.hidden)
        self.time_b = nn.Linear(cat, self.hidden)
        self.linear_out = nn.Linear(self.hidden, embed)
        # ncps initialises every weight matrix with Xavier-uniform.
        for lin in (self.ff1, self.ff2, self.time_a, self.time_b):
            nn.init.xavier_uniform_(lin.weight)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"h": (batch, self.hidden)}

    def cell(self, x_t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        xh = torch.cat([x_t, h], dim=1)
        ff1 = torch.tanh(self.ff1(xh))
        ff2 = torch.tanh(self.ff2(xh))
        t_a = self.time_a(xh)
        t_b = self.time_b(xh)
        t_interp = torch.sigmoid(t_a * self.timespan + t_b)
        return ff1 * (1.0 - t_interp) + t_interp * ff2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.hidden)
        hs = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            hs.append(h)
        return self.linear_out(torch.stack(hs, dim=1))

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        (h,) = state
        h = self.cell(x_t, h)
        return self.linear_out(h), (h,)


@register("liquid")
class Liquid(StackedModel):
    category = "liquid"
    ARCH_DEFAULTS = {"timespan": 1.0}

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        ts = config["timespan"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not ts > 0:
            raise ModelConfigError(f"model 'liquid': config 'timespan' must be a positive number, got {ts!r}")
        return CfCMixer(config["embed"], ts)
