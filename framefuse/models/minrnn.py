"""minGRU and minLSTM ("Were RNNs All We Needed?", Feng et al. 2024), sequential mode.

Both are linear recurrences h_t = a_t ⊙ h_{t-1} + b_t whose gates depend on x_t only, which is
what the LinearScan rewrite looks for. The gates are projected for all frames at once; the
recurrence itself is the authors' plain loop over time.
"""

from __future__ import annotations

import torch
from torch import nn

from framefuse.models.base import Mixer, StackedModel, State, register


class MinGRUMixer(Mixer):
    """z_t = σ(W_z x_t), h̃_t = W_h x_t, h_t = (1 − z_t) ⊙ h_{t−1} + z_t ⊙ h̃_t; output W_out h."""

    def __init__(self, embed: int):
        super().__init__()
        self.embed = embed
        self.linear_z = nn.Linear(embed, embed)
        self.linear_h = nn.Linear(embed, embed)
        self.linear_out = nn.Linear(embed, embed)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"h": (batch, self.embed)}

    def scan(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.sigmoid(self.linear_z(x))
        h_tilde = self.linear_h(x)
        hs = []
        for t in range(x.shape[1]):
            h = (1 - z[:, t]) * h + z[:, t] * h_tilde[:, t]
            hs.append(h)
        return torch.stack(hs, dim=1), h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hs, _ = self.scan(x, x.new_zeros(x.shape[0], self.embed))
        return self.linear_out(hs)

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        (h,) = state
        _, h = self.scan(x_t.unsqueeze(1), h)
        return self.linear_out(h), (h,)


class MinLSTMMixer(Mixer):
    """f, i = σ(W_f x), σ(W_i x); f' = f/(f+i), i' = i/(f+i); h_t = f' ⊙ h_{t−1} + i' ⊙ W_h x_t."""

    def __init__(self, embed: int):
        super().__init__()
        self.embed = embed
        self.linear_f = nn.Linear(embed, embed)
        self.linear_i = nn.Linear(embed, embed)
        self.linear_h = nn.Linear(embed, embed)
        self.linear_out = nn.Linear(embed, embed)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"h": (batch, self.embed)}

    def scan(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = torch.sigmoid(self.linear_f(x))
        i = torch.sigmoid(self.linear_i(x))
        h_tilde = self.linear_h(x)
        # The paper's length-independence normalisation of the two gates.
        f_norm = f / (f + i)
        i_norm = i / (f + i)
        hs = []
        for t in range(x.shape[1]):
            h = f_norm[:, t] * h + i_norm[:, t] * h_tilde[:, t]
            hs.append(h)
        return torch.stack(hs, dim=1), h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hs, _ = self.scan(x, x.new_zeros(x.shape[0], self.embed))
        return self.linear_out(hs)

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        (h,) = state
        _, h = self.scan(x_t.unsqueeze(1), h)
        return self.linear_out(h), (h,)


@register("min_gru")
class MinGRU(StackedModel):
    category = "linear-rnn"

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        return MinGRUMixer(config["embed"])


@register("min_lstm")
class MinLSTM(StackedModel):
    category = "linear-rnn"

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        return MinLSTMMixer(config["embed"])
