"""The framefuse model zoo: PyTorch reference implementations of the seed architectures.

Every model is a :class:`~framefuse.models.base.FrameModel` with a sequence form (``forward``)
and a per-frame step form (``init_state`` / ``state_names`` / ``step``).

>>> model = build_model("mamba", embed=64)
>>> y = model(torch.randn(1, 32, model.in_features))
"""

from __future__ import annotations

import torch

# Importing the modules registers their architectures.
from framefuse.models import attention, delta_net, gated_ssm, jamba, liquid, mamba, minrnn, rnn, xlstm  # noqa: F401
from framefuse.models.base import (
    BASE_DEFAULTS,
    FrameModel,
    ModelConfigError,
    StackedModel,
    StepModule,
    registry,
)

ARCHITECTURES: list[str] = sorted(registry())


def model_class(arch: str) -> type[StackedModel]:
    try:
        return registry()[arch]
    except KeyError:
        raise ModelConfigError(
            f"unknown architecture '{arch}'; valid architectures: {', '.join(ARCHITECTURES)}"
        ) from None


def default_config(arch: str) -> dict:
    """The full default config of ``arch``: embed, layers, in_features, out_features and its own keys."""
    return model_class(arch).default_config()


def build_model(arch: str, config: dict | None = None, **overrides) -> FrameModel:
    """Build ``arch`` from its default config updated by ``config`` then ``overrides``, in eval mode, fp32.

    Weights come from torch's global RNG: call ``torch.manual_seed`` first for reproducible models.
    Unknown keys and invalid values raise :class:`ModelConfigError` (a ``FrameFuseError``).
    """
    cls = model_class(arch)
    merged = {**(config or {}), **overrides}
    model = cls(merged)
    return model.to(torch.float32).eval()


__all__ = [
    "ARCHITECTURES",
    "BASE_DEFAULTS",
    "FrameModel",
    "ModelConfigError",
    "StepModule",
    "build_model",
    "default_config",
    "model_class",
]
