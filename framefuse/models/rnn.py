"""Classic recurrent blocks: torch's own nn.LSTM / nn.GRU (exported as ONNX LSTM / GRU nodes)."""

from __future__ import annotations

import torch
from torch import nn

from framefuse.models.base import Mixer, StackedModel, State, register


class LSTMMixer(Mixer):
    def __init__(self, embed: int):
        super().__init__()
        self.embed = embed
        self.rnn = nn.LSTM(embed, embed, batch_first=True)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"h": (1, batch, self.embed), "c": (1, batch, self.embed)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return y

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        h, c = state
        y, (h, c) = self.rnn(x_t.unsqueeze(1), (h, c))
        return y.squeeze(1), (h, c)


class GRUMixer(Mixer):
    def __init__(self, embed: int):
        super().__init__()
        self.embed = embed
        self.rnn = nn.GRU(embed, embed, batch_first=True)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"h": (1, batch, self.embed)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return y

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        (h,) = state
        y, h = self.rnn(x_t.unsqueeze(1), h)
        return y.squeeze(1), (h,)


@register("lstm")
class LSTM(StackedModel):
    category = "rnn"

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        return LSTMMixer(config["embed"])


@register("gru")
class GRU(StackedModel):
    category = "rnn"

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        return GRUMixer(config["embed"])
