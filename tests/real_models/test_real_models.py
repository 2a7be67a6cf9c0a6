"""Models written by others fuse with nothing per-step left (issue 8, item 5).

For each model: export (auto exporter) → rewrite → (a) the expected framefuse ops appear, (b) the
fused graph has the same node count at T=8 and T=16, (c) ONNX Runtime parity of the fused graph
against the export holds, (d) the report counts no per-timestep op left. A model that does not
fully fuse yet is a strict xfail whose reason is what the rewrite report says: it turns into a
failure the moment the model fuses, so the marker gets removed.
"""

from __future__ import annotations

import pytest

from .flow import SEQS, fuse_real_model
from .models import BY_NAME, MODELS

#: model -> why it does not fully fuse today (from the rewrite report; re-checked by strict xfail).
XFAIL: dict[str, str] = {
    "torch_rnn_bidir": (
        "nn.RNN exports ONNX RNN (Elman) nodes, for which framefuse has no fused op: they stay per-timestep "
        "ops (the cuda-graph engine runs them as a loop over time, the step compiler as a loop in its kernel)"
    ),
    "torch_rnncell_loop": (
        "nn.RNNCell (Elman) stepped in a Python loop: no fused op, so the export's copies of each cell stay "
        "per-timestep ops in the fused graph (the step compiler rolls them back into one loop a layer: "
        "compiler/simplify.RollRecurrences)"
    ),
    "torch_mlpcell_loop": (
        "an MLP cell over [x, h] with a gate on h, stepped in a Python loop: no fused op, so the export's copies "
        "of the cell stay per-timestep ops in the fused graph (the step compiler's interpreter rolls them into one "
        "loop over the body: compiler/simplify.RollBodies, compiled as one task: codegen._body_loop)"
    ),
    "torch_lnlstm_loop": (
        "a LayerNorm LSTM cell written by hand, stepped in a Python loop: no fused op, so the export's copies "
        "stay per-timestep ops in the fused graph (the step compiler rolls them into one loop carrying h and c: "
        "compiler/simplify.RollBodies)"
    ),
}


def _param(name: str):
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(m.name) for m in MODELS])
def test_real_model_fuses_with_nothing_per_step_left(name, export_root):
    spec = BY_NAME[name]
    runs = [fuse_real_model(name, seq, export_root) for seq in SEQS]
    for run in runs:
        where = f"{name} T={run.seq} (exporter {run.manifest['exporter']['used']})"
        missing = {op: n for op, n in spec.expected_ops.items() if run.framefuse_ops[op] < n}
        assert not missing, (
            f"{where}: expected framefuse ops {missing}, fused graph has {dict(run.framefuse_ops)}; "
            f"declines: {run.declines()}"
        )
        assert run.parity.passed, f"{where}: fused graph differs from the export: {run.parity.summary()}"
        left = {op: n for op, n in run.report.remaining_per_timestep_ops.items() if n}
        assert not left, f"{where}: per-timestep ops left {left}; declines: {run.declines()}"
    short, long = (len(run.fused.graph.node) for run in runs)
    assert short == long, (
        f"{name}: fused graph has {short} nodes at T={SEQS[0]} but {long} at T={SEQS[1]} (per-step nodes left); "
        f"declines: {runs[1].declines()}"
    )
