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


def test_two_groups_of_b_and_c_are_declined_naming_the_cumsum(tmp_path):
    """n_groups = 2: heads read different B and C; the one-group recurrence does not reproduce the
    graph on random inputs, so the scan stays as exported and the decline names the CumSum."""
    source = _export(_mamba2(groups=2), 8, tmp_path)
    fused, report = rewrite_model(source)
    assert not [n for n in fused.graph.node if n.domain == "framefuse"]
    declined = [d for d in report.declined if d.pass_name == "chunked-ssd"]
    assert declined and "CumSum" in declined[0].where
    assert "one group" in declined[0].reason or "B and C" in declined[0].reason
    parity = compare(source, fused, tolerance=1e-5)
    assert parity.passed, parity.summary()
