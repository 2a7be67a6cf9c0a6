"""Mamba2's chunked scan (SSD) → SelectiveScan (framefuse/rewrite/ssd.py), on transformers' own
Mamba2 exported as a user would: a sequence that is not a multiple of the chunk (padded inside
the graph) fuses with ONNX Runtime parity and nothing of the chunk machinery left; several groups
of B and C (which SelectiveScan does not share out) are declined naming the CumSum, never fused.
The real models (mamba2, zamba2, bamba at T = 8 and 16) are in tests/real_models."""

from __future__ import annotations

import pytest
import torch

from framefuse.exporter import export_model
from framefuse.parity import compare
from framefuse.rewrite import rewrite_model

transformers = pytest.importorskip("transformers")

HIDDEN = 32


class LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model.eval()

    def forward(self, x):
        return self.model(inputs_embeds=x, use_cache=False).last_hidden_state


def _mamba2(groups: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.Mamba2Config(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        vocab_size=32,
        state_size=8,
        expand=2,
        num_heads=4,
        head_dim=16,
        n_groups=groups,
        chunk_size=4,
    )
    return LastHidden(transformers.Mamba2Model(config))


def _export(module, seq: int, tmp_path):
    result = export_model(
        module,
        form="sequence",
        config={"batch": 2, "seq": seq, "in_features": HIDDEN, "seed": 0},
        out_dir=tmp_path,
        name=f"mamba2-T{seq}",
        exporter="auto",
    )
    return result.model_path


def test_mamba2_chunked_scan_fuses_into_selective_scan_with_parity(tmp_path):
    """T = 6 over chunks of 4: the graph pads to 8, and the fused op runs the 6 steps."""
    source = _export(_mamba2(groups=1), 6, tmp_path)
    fused, report = rewrite_model(source)
    ops = [n.op_type for n in fused.graph.node]
    assert [op for n, op in zip(fused.graph.node, ops) if n.domain == "framefuse"] == ["SelectiveScan"]
    assert not {"CumSum", "Einsum", "Trilu"} & set(ops), "the chunk machinery is left in the graph"
    (match,) = [m for m in report.matches if m.pass_name == "chunked-ssd"]
    assert match.detail["steps"] == 6 and match.detail["heads"] == 4 and match.detail["head_dim"] == 16
    assert match.detail["check_max_rel_diff"] < 1e-5
    assert not [d for d in report.declined if d.pass_name in ("chunked-ssd", "unrolled-chunked-scan")]
    parity = compare(source, fused, tolerance=1e-4)
    assert parity.passed, parity.summary()


def test_two_groups_of_b_and_c_fuse_into_a_selective_scan_a_group(tmp_path):
    """n_groups = 2: heads 0-1 read B, C of group 0 and heads 2-3 those of group 1 — one
    SelectiveScan a group of heads, their outputs concatenated."""
    source = _export(_mamba2(groups=2), 8, tmp_path)
    fused, report = rewrite_model(source)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["SelectiveScan"] * 2
    (match,) = [m for m in report.matches if m.pass_name == "chunked-ssd"]
    assert match.detail["groups"] == 2 and match.detail["state"] == 8
    parity = compare(source, fused, tolerance=1e-4)
    assert parity.passed, parity.summary()


class OneChunkSSD(torch.nn.Module):
    """The SSD of one chunk written from its definition (not transformers'): y_t = Σ_(s ≤ t)
    (C_t·B_s) exp(Σ_(s<u≤t) A dt_u) dt_s x_s + D x_t; ``anti_causal`` masks s ≥ t instead, which
    is not a recurrence over t."""

    def __init__(self, anti_causal: bool = False):
        super().__init__()
        self.a = torch.nn.Parameter(-torch.rand(4) - 0.1)
        self.d = torch.nn.Parameter(torch.randn(4))
        self.anti_causal = anti_causal

    def forward(self, x, dt, b, c):
        cs = torch.cumsum((self.a * dt).transpose(1, 2), dim=-1)  # [B, H, T]
        seg = cs[..., :, None] - cs[..., None, :]
        steps = x.shape[1]
        ones = torch.ones(steps, steps, dtype=torch.bool)
        mask = torch.triu(ones) if self.anti_causal else torch.tril(ones)
        decay = torch.exp(seg.masked_fill(~mask, float("-inf")))
        y = torch.einsum("btn,bsn,bhts,bshp->bthp", c, b, decay, x * dt[..., None])
        return y + self.d[:, None] * x


def _one_chunk(anti_causal: bool):
    import io

    import onnx

    torch.manual_seed(0)
    args = (torch.randn(2, 6, 4, 3), torch.rand(2, 6, 4) * 0.3, torch.randn(2, 6, 5), torch.randn(2, 6, 5))
    buffer = io.BytesIO()
    torch.onnx.export(
        OneChunkSSD(anti_causal).eval(),
        args,
        buffer,
        input_names=["x", "dt", "b", "c"],
        output_names=["y"],
        dynamo=False,
    )
    return onnx.load_from_string(buffer.getvalue())


def test_an_ssd_written_from_its_definition_fuses():
    model = _one_chunk(anti_causal=False)
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["SelectiveScan"]
    parity = compare(model, fused, tolerance=1e-4)
    assert parity.passed, parity.summary()


def test_a_segment_sum_scan_that_is_not_the_recurrence_is_declined_naming_the_cumsum():
    """The same expression masked to s ≥ t: the anchors are all there (A·dt under a CumSum, x·dt,
    B and C), but the graph does not compute the recurrence on random inputs, so nothing is fused
    and the decline names the CumSum."""
    model = _one_chunk(anti_causal=True)
    fused, report = rewrite_model(model)
    assert not [n for n in fused.graph.node if n.domain == "framefuse"]
    (declined,) = [d for d in report.declined if d.pass_name == "chunked-ssd"]
    assert "CumSum" in declined.where and "differs by" in declined.reason
    parity = compare(model, fused, tolerance=1e-5)
    assert parity.passed, parity.summary()
