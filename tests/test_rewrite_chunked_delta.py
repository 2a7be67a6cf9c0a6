"""The delta rule in its chunked (WY) form, as flash-linear-attention's reference code writes it →
DeltaRuleScan (framefuse/rewrite/chunked_delta.py): the chunk machinery (a per-row solve inside
each chunk, a loop over chunks) becomes one op with ONNX Runtime parity; the same code with the
solve's sign flipped is not the delta rule and is declined, never fused."""

from __future__ import annotations

import io

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
