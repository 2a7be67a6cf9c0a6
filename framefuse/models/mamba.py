"""Mamba-1 block (Gu & Dao 2023), written as ``mamba_simple.Mamba`` without the fused kernels:
its reference path (``selective_scan_ref``) for the sequence form and its ``step`` for frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from framefuse.models.base import Mixer, ModelConfigError, StackedModel, State, register, require_positive_int

MAMBA_DEFAULTS = {"d_state": 16, "d_conv": 4, "expand": 2, "dt_rank": "auto"}


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, h0=None):
    """``mamba_ssm.ops.selective_scan_interface.selective_scan_ref`` (real A, B/C [B,N,L]).

    u, delta, z: [B, D, L]; A: [D, N]; B, C: [B, N, L]; D: [D]; h0: [B, D, N].
    Returns (y [B, D, L], last state [B, D, N]). ``delta`` is already softplus-ed.
    """
    batch, dim, length = u.shape
    dstate = A.shape[1]
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    x = A.new_zeros((batch, dim, dstate)) if h0 is None else h0
    ys = []
    for i in range(length):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        y = torch.einsum("bdn,bn->bd", x, C[:, :, i])
        ys.append(y)
    y = torch.stack(ys, dim=2)  # (batch dim L)
    out = y if D is None else y + u * D.unsqueeze(-1)
    if z is not None:
        out = out * F.silu(z)
    return out, x


class MambaMixer(Mixer):
    def __init__(
        self,
        embed: int,
        d_state: int,
        d_conv: int,
        expand: int,
        dt_rank,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
    ):
        super().__init__()
        self.embed = embed
        self.d_state = d_state
        self.d_conv = d_conv
        self.d_inner = expand * embed
        self.dt_rank = math.ceil(embed / 16) if dt_rank == "auto" else dt_rank

        self.in_proj = nn.Linear(embed, self.d_inner * 2, bias=False)
        self.conv1d = nn.Conv1d(
            self.d_inner, self.d_inner, kernel_size=d_conv, groups=self.d_inner, padding=d_conv - 1, bias=True
        )
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.out_proj = nn.Linear(self.d_inner, embed, bias=False)

        # Initialisation as mamba_simple.Mamba: dt_proj so that softplus(bias) ∈ [dt_min, dt_max],
        # S4D-real A, D = 1.
        dt_init_std = self.dt_rank**-0.5
        nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
        dt = torch.exp(torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        inv_dt = dt + torch.log(-torch.expm1(-dt))  # inverse of softplus
        with torch.no_grad():
            self.dt_proj.bias.copy_(inv_dt)
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(self.d_inner))

    def state_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {"conv": (batch, self.d_inner, self.d_conv - 1), "ssm": (batch, self.d_inner, self.d_state)}

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        seqlen = hidden_states.shape[1]
        xz = self.in_proj(hidden_states).transpose(1, 2)  # [B, 2·d_inner, L]
        x, z = xz.chunk(2, dim=1)
        x = F.silu(self.conv1d(x)[..., :seqlen])
        x_dbl = self.x_proj(x.transpose(1, 2))  # [B, L, dt_rank + 2N]
        dt, B, C = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(dt)).transpose(1, 2)  # [B, d_inner, L]
        B = B.transpose(1, 2)  # [B, N, L]
        C = C.transpose(1, 2)
        A = -torch.exp(self.A_log.float())
        y, _ = selective_scan_ref(x, dt, A, B, C, self.D.float(), z=z)
        return self.out_proj(y.transpose(1, 2))

    def step(self, hidden_states: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        conv_state, ssm_state = state
        xz = self.in_proj(hidden_states)  # [B, 2·d_inner]
        x, z = xz.chunk(2, dim=-1)
        # Conv step: the window is the last d_conv−1 inputs and this one.
        window = torch.cat([conv_state, x.unsqueeze(-1)], dim=-1)  # [B, d_inner, d_conv]
        x = torch.sum(window * self.conv1d.weight.squeeze(1), dim=-1) + self.conv1d.bias
        x = F.silu(x)
        conv_state = window[:, :, 1:]
        x_db = self.x_proj(x)
        dt, B, C = torch.split(x_db, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(dt))  # [B, d_inner]
        A = -torch.exp(self.A_log.float())
        # SSM step (mamba_simple.step's non-fused path).
        dA = torch.exp(torch.einsum("bd,dn->bdn", dt, A))
        dB = torch.einsum("bd,bn->bdn", dt, B)
        ssm_state = ssm_state * dA + x.unsqueeze(-1) * dB
        y = torch.einsum("bdn,bn->bd", ssm_state, C)
        y = y + self.D * x
        y = y * F.silu(z)
        return self.out_proj(y), (conv_state, ssm_state)


def make_mamba_mixer(arch: str, config: dict) -> MambaMixer:
    for key in ("d_state", "d_conv", "expand"):
        require_positive_int(arch, config, key)
    if config["d_conv"] < 2:
        raise ModelConfigError(
            f"model '{arch}': config 'd_conv' must be >= 2 (causal conv with a window), got {config['d_conv']}"
        )
    dt_rank = config["dt_rank"]
    if dt_rank != "auto":
        require_positive_int(arch, config, "dt_rank")
    return MambaMixer(config["embed"], config["d_state"], config["d_conv"], config["expand"], dt_rank)


@register("mamba")
class Mamba(StackedModel):
    category = "ssm"
    ARCH_DEFAULTS = dict(MAMBA_DEFAULTS)

    def make_mixer(self, layer: int, config: dict) -> Mixer:
        return make_mamba_mixer(self.arch, config)
