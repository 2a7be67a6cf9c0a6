"""The interface every zoo model (and every user model that wants a step form) follows."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

State = tuple[torch.Tensor, ...]


class FrameModel(nn.Module):
    """A sequence model with a sequence form and a per-frame step form.

    - ``forward(x)``: ``x`` is ``[B, T, in_features]``, returns ``[B, T, out_features]``.
    - ``init_state(batch)``: the zero recurrent state, a tuple of tensors.
    - ``state_names()``: one name per state tensor (ONNX input/output names of the step form).
    - ``step(x_t, state)``: ``x_t`` is ``[B, in_features]``; returns ``(y_t [B, out_features], new_state)``.

    Running ``step`` over T frames from ``init_state`` gives the same outputs as ``forward``.
    """

    arch: str = "base"
    category: str = "other"

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        self.in_features = int(config["in_features"])
        self.out_features = int(config["out_features"])

    def init_state(self, batch: int, device=None, dtype=torch.float32) -> State:
        raise NotImplementedError

    def state_names(self) -> list[str]:
        raise NotImplementedError

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        raise NotImplementedError


_REGISTRY: dict[str, Callable[[dict], FrameModel]] = {}


def register(name: str):
    def deco(cls):
        cls.arch = name
        _REGISTRY[name] = cls
        return cls

    return deco


def registry() -> dict[str, Callable[[dict], FrameModel]]:
    return _REGISTRY
