"""The interface every zoo model (and every user model that wants a step form) follows."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from framefuse.errors import FrameFuseError

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


# ---------------------------------------------------------------------------------------------
# Helpers shared by the zoo: config validation, the mixer interface and the stacked network.
# ---------------------------------------------------------------------------------------------


#: Keys every zoo architecture has; each architecture adds its own (``ARCH_DEFAULTS``).
BASE_DEFAULTS: dict = {"embed": 256, "layers": 2, "in_features": 64, "out_features": 32}


class ModelConfigError(FrameFuseError):
    """A zoo model was asked for with an unknown architecture or an invalid config value."""


def require_positive_int(arch: str, config: dict, key: str) -> int:
    """``config[key]`` as an int > 0, or a ModelConfigError naming the arch and the key."""
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"model '{arch}': config '{key}' must be a positive integer, got {value!r}")
    return value


def split_heads(arch: str, embed: int, heads: int, key: str = "heads") -> int:
    """Head dim ``embed // heads``; a clear error when ``embed`` is not a multiple of ``heads``."""
    if embed % heads != 0:
        raise ModelConfigError(
            f"model '{arch}': embed={embed} is not a multiple of {key}={heads} "
            f"(the head dim must be a whole number; e.g. embed={heads * max(1, embed // heads)})"
        )
    return embed // heads


class Mixer(nn.Module):
    """The sequence-mixing part of one residual block (the recurrence or the attention).

    - ``forward(x)``: ``[B, T, E] -> [B, T, E]`` from the zero state.
    - ``state_shapes(batch)``: ordered ``{short_name: shape}`` of the recurrent state
      (all float32, zeros initially).
    - ``step(x_t, state)``: ``[B, E]`` and a tuple in ``state_shapes`` order
      → ``([B, E], new_state)``.
    """

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        raise NotImplementedError


class Block(nn.Module):
    """Pre-norm residual block: ``x + mixer(LayerNorm(x))``."""

    def __init__(self, embed: int, mixer: Mixer):
        super().__init__()
        self.norm = nn.LayerNorm(embed)
        self.mixer = mixer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x))

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        y_t, new_state = self.mixer.step(self.norm(x_t), state)
        return x_t + y_t, new_state


class StackedModel(FrameModel):
    """in-projection → ``layers`` pre-norm residual blocks → LayerNorm → head.

    Subclasses set ``ARCH_DEFAULTS`` (their own config keys) and implement ``make_mixer``.
    The config given is completed from ``BASE_DEFAULTS`` and ``ARCH_DEFAULTS``; unknown keys
    and invalid values are errors.
    """

    ARCH_DEFAULTS: dict = {}

    @classmethod
    def default_config(cls) -> dict:
        return {**BASE_DEFAULTS, **cls.ARCH_DEFAULTS}

    @classmethod
    def complete_config(cls, config: dict | None) -> dict:
        defaults = cls.default_config()
        given = dict(config or {})
        if "arch" in given:  # tolerated so a whole config file (with its arch) can be passed
            if given["arch"] != cls.arch:
                raise ModelConfigError(f"config says arch '{given['arch']}' but model '{cls.arch}' was built")
            del given["arch"]
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ModelConfigError(
                f"model '{cls.arch}': unknown config key(s) {unknown}; valid keys: {sorted(defaults)}"
            )
        merged = {**defaults, **given}
        for key in BASE_DEFAULTS:
            require_positive_int(cls.arch, merged, key)
        return merged

    def __init__(self, config: dict | None = None):
        config = self.complete_config(config)
        super().__init__(config)
        self.embed = config["embed"]
        self.num_layers = config["layers"]
        self.in_proj = nn.Linear(self.in_features, self.embed)
        self.blocks = nn.ModuleList(Block(self.embed, self.make_mixer(i, config)) for i in range(self.num_layers))
        self.norm_f = nn.LayerNorm(self.embed)
        self.head = nn.Linear(self.embed, self.out_features)

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        raise NotImplementedError

    # -- sequence form ------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Shape checks run eagerly only: under ONNX tracing shapes are traced values, and the
        # exporter checks its example inputs itself.
        if not torch.jit.is_tracing() and (x.dim() != 3 or x.shape[-1] != self.in_features):
            raise ModelConfigError(
                f"model '{self.arch}': forward expects x of shape [B, T, {self.in_features}], got {tuple(x.shape)}"
            )
        h = self.in_proj(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm_f(h))

    # -- step form ----------------------------------------------------------------------------
    def state_shapes(self, batch: int) -> list[tuple[int, ...]]:
        """Shapes of the state tensors, in ``init_state`` / ``state_names`` order."""
        return [shape for block in self.blocks for shape in block.mixer.state_shapes(batch).values()]

    def state_names(self) -> list[str]:
        return [f"l{i}_{name}" for i, block in enumerate(self.blocks) for name in block.mixer.state_shapes(1)]

    def init_state(self, batch: int, device=None, dtype=torch.float32) -> State:
        # Recurrent state is float32 whatever the storage dtype (OPS.md conventions).
        return tuple(torch.zeros(shape, device=device, dtype=torch.float32) for shape in self.state_shapes(batch))

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        if not torch.jit.is_tracing() and (x_t.dim() != 2 or x_t.shape[-1] != self.in_features):
            raise ModelConfigError(
                f"model '{self.arch}': step expects x_t of shape [B, {self.in_features}], got {tuple(x_t.shape)}"
            )
        state = tuple(state)
        counts = [len(block.mixer.state_shapes(1)) for block in self.blocks]
        if len(state) != sum(counts):
            raise ModelConfigError(
                f"model '{self.arch}': step expects {sum(counts)} state tensors {self.state_names()}, got {len(state)}"
            )
        h = self.in_proj(x_t)
        new_state: list[torch.Tensor] = []
        offset = 0
        for block, count in zip(self.blocks, counts):
            h, block_state = block.step(h, state[offset : offset + count])
            new_state.extend(block_state)
            offset += count
        return self.head(self.norm_f(h)), tuple(new_state)


class StepModule(nn.Module):
    """Exportable wrapper of a FrameModel's step form: ``forward(x_t, *state) -> (y_t, *new_state)``."""

    def __init__(self, model: FrameModel):
        super().__init__()
        self.model = model

    def forward(self, x_t: torch.Tensor, *state: torch.Tensor):
        y_t, new_state = self.model.step(x_t, tuple(state))
        return (y_t, *new_state)


class RMSNorm(nn.Module):
    """RMS norm over the last dim (written out so the TorchScript ONNX exporter sees plain ops)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
