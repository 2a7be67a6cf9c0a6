"""Jamba-style hybrid (Lieber et al. 2024), minimal: Mamba blocks at even layers, sliding-window
GQA attention blocks at odd layers (no MoE). The state is each layer's state in layer order."""

from __future__ import annotations

from framefuse.models.attention import ATTENTION_DEFAULTS, make_attention_mixer
from framefuse.models.base import Mixer, StackedModel, register
from framefuse.models.mamba import MAMBA_DEFAULTS, make_mamba_mixer


@register("jamba")
class Jamba(StackedModel):
    category = "hybrid"
    ARCH_DEFAULTS = {**MAMBA_DEFAULTS, **ATTENTION_DEFAULTS}

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        if layer % 2 == 0:
            return make_mamba_mixer(self.arch, config)
        return make_attention_mixer(self.arch, config)
