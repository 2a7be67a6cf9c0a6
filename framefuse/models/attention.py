"""Causal sliding-window multi-head attention with grouped KV heads (GQA), no positional encoding.

Query i sees keys j with i − W < j ≤ i. The sequence form calls
``F.scaled_dot_product_attention`` with an explicit boolean mask [T, T];
the step form keeps a KV cache of the last W frames and a ``valid`` mask [B, W] (1.0 where the
slot holds a real frame), shifts it left by one each frame and attends over all W slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from framefuse.models.base import (
    Mixer,
    ModelConfigError,
    StackedModel,
    State,
    register,
    require_positive_int,
    split_heads,
)

ATTENTION_DEFAULTS = {"heads": 4, "kv_heads": 2, "window": 32}


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hkv, L, D] → [B, Hkv·groups, L, D]: KV head h serves query heads h·groups … h·groups+groups−1.

    (The TorchScript ONNX exporter has no SDPA with ``enable_gqa``, so GQA is written out as in
    Hugging Face's ``repeat_kv``.)"""
    if groups == 1:
        return x
    b, hkv, length, d = x.shape
    return x[:, :, None].expand(b, hkv, groups, length, d).reshape(b, hkv * groups, length, d)


def sliding_window_causal_mask(length: int, window: int, device=None) -> torch.Tensor:
    """Boolean [L, L], True where query i may attend key j: i − window < j ≤ i."""
    i = torch.arange(length, device=device).unsqueeze(1)
    j = torch.arange(length, device=device).unsqueeze(0)
    return (j <= i) & (j > i - window)


class AttentionMixer(Mixer):
    def __init__(self, embed: int, heads: int, kv_heads: int, head_dim: int, window: int):
        super().__init__()
        self.embed = embed
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.window = window
        self.groups = heads // kv_heads
        self.q_proj = nn.Linear(embed, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(embed, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(embed, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, embed, bias=False)

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        cache = (batch, self.kv_heads, self.window, self.head_dim)
        return {"k_cache": cache, "v_cache": cache, "valid": (batch, self.window)}

    def project(self, x: torch.Tensor):
        b, length, _ = x.shape
        q = self.q_proj(x).reshape(b, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).reshape(b, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(b, length, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def output(self, o: torch.Tensor) -> torch.Tensor:
        b, _, length, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, length, self.heads * self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        q, k, v = self.project(x)
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)
        # One explicit mask for every T (for T ≤ W it is the plain causal mask); no branch on T,
        # so the traced graph has no shape-dependent Python control flow.
        mask = sliding_window_causal_mask(length, self.window, device=x.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.output(o)

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        k_cache, v_cache, valid = state
        q, k, v = self.project(x_t.unsqueeze(1))  # q [B, Hq, 1, D], k/v [B, Hkv, 1, D]
        # Drop the oldest frame, append this one: the cache holds the last W frames in order.
        k_cache = torch.cat([k_cache[:, :, 1:], k], dim=2)
        v_cache = torch.cat([v_cache[:, :, 1:], v], dim=2)
        valid = torch.cat([valid[:, 1:], torch.ones_like(valid[:, :1])], dim=1)
        # Additive mask [B, 1, 1, W]: 0 for real frames, −inf for empty slots. The newest slot is
        # always valid, so no row is fully masked.
        mask = torch.where(valid > 0.5, torch.zeros_like(valid), torch.full_like(valid, float("-inf")))
        o = F.scaled_dot_product_attention(
            q, repeat_kv(k_cache, self.groups), repeat_kv(v_cache, self.groups), attn_mask=mask[:, None, None, :]
        )
        return self.output(o).squeeze(1), (k_cache, v_cache, valid)


def make_attention_mixer(arch: str, config: dict) -> AttentionMixer:
    heads = require_positive_int(arch, config, "heads")
    kv_heads = require_positive_int(arch, config, "kv_heads")
    window = require_positive_int(arch, config, "window")
    if heads % kv_heads != 0:
        raise ModelConfigError(
            f"model '{arch}': heads={heads} is not a multiple of kv_heads={kv_heads} (each KV head serves a whole group of query heads)"
        )
    head_dim = split_heads(arch, config["embed"], heads)
    return AttentionMixer(config["embed"], heads, kv_heads, head_dim, window)


@register("attention")
class Attention(StackedModel):
    category = "attention"
    ARCH_DEFAULTS = dict(ATTENTION_DEFAULTS)

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        return make_attention_mixer(self.arch, config)
