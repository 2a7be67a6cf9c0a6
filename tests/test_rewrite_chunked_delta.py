"""The delta rule in its chunked (WY) form, as flash-linear-attention's reference code writes it →
DeltaRuleScan, and its gated twin → GatedDeltaRuleScan (framefuse/rewrite/chunked_delta.py): the
chunk machinery (a per-row solve inside each chunk, a loop over chunks) becomes one op with ONNX
Runtime parity; the same code with the solve's sign flipped is not the delta rule and is
declined, never fused. Gated linear attention's chunked form is declined, its recurrent form fuses."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from framefuse.parity import compare
from framefuse.rewrite import rewrite_model


class ChunkDeltaRule(nn.Module):
    """fla's ``chunk_delta_rule`` reference: WY form with a row-by-row solve inside each chunk of
    ``chunk`` steps, then a loop over the chunks; ``flip`` negates the solve's matrix (not the
    delta rule)."""

    def __init__(self, chunk: int = 4, flip: bool = False):
        super().__init__()
        self.chunk, self.flip = chunk, flip

    def forward(self, q, k, v, beta):
        b, h, length, d_k = q.shape
        c = self.chunk
        q = q * (d_k**-0.5)
        v = v * beta[..., None]
        k_beta = k * beta[..., None]
        q, k, v, k_beta = [x.reshape(b, h, length // c, c, x.shape[-1]) for x in (q, k, v, k_beta)]
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=0)
        attn = (k_beta @ k.transpose(-1, -2)).masked_fill(mask, 0)
        attn = attn if self.flip else -attn
        for i in range(1, c):
            attn[..., i, :i] = attn[..., i, :i] + (attn[..., i, :, None].clone() * attn[..., :, :i].clone()).sum(-2)
        attn = attn + torch.eye(c, dtype=torch.float)
        u, w = attn @ v, attn @ k_beta
        state = k.new_zeros(b, h, d_k, v.shape[-1])
        o = torch.zeros_like(v)
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=1)
        for i in range(length // c):
            q_i, k_i = q[:, :, i], k[:, :, i]
            u_i = u[:, :, i] - w[:, :, i] @ state
            o[:, :, i] = q_i @ state + (q_i @ k_i.transpose(-1, -2)).masked_fill(mask, 0) @ u_i
            state = state + k_i.transpose(-1, -2) @ u_i
        return o.reshape(b, h, length, -1)


def _export(module: nn.Module, steps: int) -> onnx.ModelProto:
    torch.manual_seed(0)
    shape = (2, 2, steps)
    q, v = torch.randn(*shape, 4), torch.randn(*shape, 3)
    k = nn.functional.normalize(torch.randn(*shape, 4), dim=-1)
    buffer = io.BytesIO()
    torch.onnx.export(
        module.eval(),
        (q, k, v, torch.rand(*shape)),
        buffer,
        input_names=["q", "k", "v", "beta"],
        output_names=["o"],
        dynamo=False,
    )
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("steps", [8, 12])
def test_fla_chunked_delta_rule_fuses_into_one_delta_rule_scan(steps):
    model = _export(ChunkDeltaRule(), steps)
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["DeltaRuleScan"]
    assert len(fused.graph.node) < 10 < len(model.graph.node)  # the chunk machinery is gone
    (match,) = [m for m in report.matches if m.pass_name == "chunked-delta-rule"]
    # the cut is at q·d_k^−½ (the first [B, H, T, Dk] tensor above the output), so no scale is left
    assert match.detail["steps"] == steps and abs(match.detail["q_scale"] - 1.0) < 1e-5
    parity = compare(model, fused, tolerance=1e-4)
    assert parity.passed, parity.summary()


def test_a_chunked_form_that_is_not_the_delta_rule_is_declined():
    model = _export(ChunkDeltaRule(flip=True), 8)
    fused, report = rewrite_model(model)
    assert not [n for n in fused.graph.node if n.domain == "framefuse"]
    (declined,) = [d for d in report.declined if d.pass_name == "chunked-delta-rule"]
    assert "differs by" in declined.reason and declined.where
    parity = compare(model, fused, tolerance=1e-5)
    assert parity.passed, parity.summary()


class ChunkGatedDeltaRule(nn.Module):
    """The gated delta rule in its chunked form, as fla's ``chunk_gated_delta_rule`` reference
    computes it: log-decays g summed inside each chunk weight the solve's matrix, the chunk's
    keys and the state carried between chunks. ``fla_layout``: g arrives [B, T, H] and goes in
    through a transpose and an unsqueeze, as the reference takes it; ``flip`` negates the solve's
    matrix (not the gated delta rule)."""

    def __init__(self, chunk: int = 4, flip: bool = False, fla_layout: bool = False):
        super().__init__()
        self.chunk, self.flip, self.fla_layout = chunk, flip, fla_layout

    def forward(self, q, k, v, g, beta):
        b, h, length, d_k = q.shape
        c = self.chunk
        if self.fla_layout:
            g = g.transpose(1, 2).unsqueeze(-1).reshape(b, h, length // c, c, 1).squeeze(-1)
        else:
            g = g.reshape(b, h, length // c, c)
        q = q * (d_k**-0.5)
        v = v * beta[..., None]
        k_beta = k * beta[..., None]
        q, k, v, k_beta = [x.reshape(b, h, length // c, c, x.shape[-1]) for x in (q, k, v, k_beta)]
        decay = g.cumsum(-1)
        decay_mask = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).tril().exp().tril()
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=0)
        attn = ((k_beta @ k.transpose(-1, -2)) * decay_mask).masked_fill(mask, 0)
        attn = attn if self.flip else -attn
        for i in range(1, c):
            attn[..., i, :i] = attn[..., i, :i] + (attn[..., i, :, None].clone() * attn[..., :, :i].clone()).sum(-2)
        attn = attn + torch.eye(c, dtype=torch.float)
        u = attn @ v
        w = attn @ (k_beta * decay.exp().unsqueeze(-1))
        state = k.new_zeros(b, h, d_k, v.shape[-1])
        o = torch.zeros_like(v)
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=1)
        for i in range(length // c):
            q_i, k_i, g_i = q[:, :, i], k[:, :, i], decay[:, :, i]
            v_new = u[:, :, i] - w[:, :, i] @ state
            inner = (q_i @ k_i.transpose(-1, -2) * decay_mask[:, :, i]).masked_fill(mask, 0)
            o[:, :, i] = (q_i * g_i[..., None].exp()) @ state + inner @ v_new
            last = g_i[..., -1, None]
            state = state * last[..., None].exp() + (k_i * (last - g_i).exp()[..., None]).transpose(-1, -2) @ v_new
        return o.reshape(b, h, length, -1)


def _export_gated(module: ChunkGatedDeltaRule, steps: int) -> onnx.ModelProto:
    torch.manual_seed(0)
    shape = (2, 2, steps)
    q, v = torch.randn(*shape, 4), torch.randn(*shape, 3)
    k = nn.functional.normalize(torch.randn(*shape, 4), dim=-1)
    g = -torch.rand(*shape)
    if module.fla_layout:
        g = g.transpose(1, 2).contiguous()
    buffer = io.BytesIO()
    torch.onnx.export(
        module.eval(),
        (q, k, v, g, torch.rand(*shape)),
        buffer,
        input_names=["q", "k", "v", "g", "beta"],
        output_names=["o"],
        dynamo=False,
    )
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("steps,fla_layout", [(8, False), (12, False), (8, True)])
def test_chunked_gated_delta_rule_fuses_into_one_gated_delta_rule_scan(steps, fla_layout):
    model = _export_gated(ChunkGatedDeltaRule(fla_layout=fla_layout), steps)
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["GatedDeltaRuleScan"]
    assert len(fused.graph.node) < 12 < len(model.graph.node)  # the chunk machinery is gone
    (match,) = [m for m in report.matches if m.pass_name == "chunked-delta-rule"]
    assert match.op_type == "GatedDeltaRuleScan" and match.detail["gated"] and match.detail["steps"] == steps
    parity = compare(model, fused, tolerance=1e-4)
    assert parity.passed, parity.summary()


def test_a_chunked_gated_form_that_is_not_the_gated_delta_rule_is_declined():
    model = _export_gated(ChunkGatedDeltaRule(flip=True), 8)
    fused, report = rewrite_model(model)
    assert not [n for n in fused.graph.node if n.domain == "framefuse"]
    (declined,) = [d for d in report.declined if d.pass_name == "chunked-delta-rule"]
    assert "differs by" in declined.reason and declined.where
    parity = compare(model, fused, tolerance=1e-5)
    assert parity.passed, parity.summary()


class ChunkGLA(nn.Module):
    """Gated linear attention (S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ q_t, a vector
    gate g_t [Dk]) in its chunked form: cumulative log-gates inside each chunk, a loop over the
    chunks. ``recurrent``: the same rule a step at a time, as its naive reference writes it;
    ``off_diagonal``: the intra-chunk attention without its diagonal (not GLA: o_t misses k_t v_tᵀ)."""

    def __init__(self, chunk: int = 4, recurrent: bool = False, off_diagonal: bool = False):
        super().__init__()
        self.chunk, self.recurrent, self.off_diagonal = chunk, recurrent, off_diagonal

    def forward(self, q, k, v, g):
        b, h, length, d_k = q.shape
        q = q * d_k**-0.5
        if self.recurrent:
            state = torch.zeros(b, h, d_k, v.shape[-1])
            out = []
            for t in range(length):
                state = state * g[:, :, t, :, None].exp() + k[:, :, t, :, None] * v[:, :, t, None, :]
                out.append((q[:, :, t, :, None] * state).sum(-2))
            return torch.stack(out, 2)
        c = self.chunk
        q, k, v, g = [x.reshape(b, h, length // c, c, x.shape[-1]) for x in (q, k, v, g)]
        g = g.cumsum(-2)
        state = k.new_zeros(b, h, d_k, v.shape[-1])
        o = torch.zeros_like(v)
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=0 if self.off_diagonal else 1)
        for i in range(length // c):
            g_i = g[:, :, i]
            last = g_i[:, :, -1:]
            q_i = q[:, :, i] * g_i.exp()
            attn = (q_i @ (k[:, :, i] * (-g_i).exp()).transpose(-1, -2)).masked_fill(mask, 0)
            o[:, :, i] = q_i @ state + attn @ v[:, :, i]
            decayed = (k[:, :, i] * (last - g_i).exp()).transpose(-1, -2) @ v[:, :, i]
            state = state * last.transpose(-1, -2).exp() + decayed
        return o.reshape(b, h, length, -1)


def _dims(value_info) -> list[int]:
    return [d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _export_gla(module: ChunkGLA, steps: int, dk: int = 4, dv: int = 3) -> onnx.ModelProto:
    torch.manual_seed(0)
    shape = (2, 2, steps)
    args = (torch.randn(*shape, dk), torch.randn(*shape, dk), torch.randn(*shape, dv), -torch.rand(*shape, dk))
    buffer = io.BytesIO()
    torch.onnx.export(module.eval(), args, buffer, input_names=["q", "k", "v", "g"], output_names=["o"], dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("steps,dk,dv", [(8, 4, 3), (12, 4, 4), (16, 16, 16)])
def test_chunked_gated_linear_attention_fuses_into_one_linear_scan(steps, dk, dv):
    """GLA has no op of its own: its state is a LinearScan over Dk·Dv channels a head
    (framefuse/rewrite/chunked_gla.py). The chunked form becomes that LinearScan with ONNX
    Runtime parity and a node count that does not grow with T, as its step-at-a-time form does;
    q, k and v are told apart by the check (Dk = Dv, and T = Dk, included)."""
    for module in (ChunkGLA(), ChunkGLA(recurrent=True)):
        counts = []
        for length in (steps, 2 * steps):
            model = _export_gla(module, length, dk, dv)
            fused, report = rewrite_model(model)
            assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["LinearScan"]
            # log-gates ≤ 0, as GLA's logsigmoid gives: positive ones grow the state as exp(Σg)
            # (|o| ~ 500 at T = 32), and both forms' float32 rounding (1-2e-4 against float64 each)
            # then exceeds 1e-4 on the small outputs
            rng = np.random.default_rng(3)
            feeds = {i.name: rng.uniform(-1, 1, _dims(i)).astype(np.float32) for i in model.graph.input}
            feeds["g"] = -np.abs(feeds["g"])
            parity = compare(model, fused, inputs=feeds, tolerance=1e-4)
            assert parity.passed, parity.summary()
            assert not any(report.remaining_per_timestep_ops.values())
            counts.append(len(fused.graph.node))
            if not module.recurrent:
                (match,) = [m for m in report.matches if m.pass_name == "chunked-gla"]
                assert match.detail["channels"] == 2 * dk * dv and match.detail["steps"] == length
        assert counts[0] == counts[1], f"{counts}: per-step nodes left"


def test_a_chunked_form_that_is_not_gated_linear_attention_is_declined_naming_the_cumsum():
    model = _export_gla(ChunkGLA(off_diagonal=True), 8)
    fused, report = rewrite_model(model)
    assert not [n for n in fused.graph.node if n.domain == "framefuse"]
    (declined,) = [d for d in report.declined if d.pass_name == "chunked-gla"]
    assert "CumSum" in declined.where and "differs by" in declined.reason
    assert compare(model, fused, tolerance=1e-5).passed
