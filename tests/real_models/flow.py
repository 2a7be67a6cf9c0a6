"""One flow for every real model: export (auto exporter) → rewrite → parity, cached per session.

Export dominates the suite's CPU time, so each (model, T) pair is exported and rewritten once
and shared by the CPU and GPU tests; a failure is cached too and re-raised for each caller.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from framefuse.plugins import DOMAIN

from .models import BATCH, BY_NAME

#: The two sequence lengths whose fused graphs must have the same node count.
SEQS = (8, 16)
#: The lengths the GPU test runs each fused graph at on the cuda-graph engine (issue 21: T = 8 and 32).
GPU_SEQS = (8, 32)

#: the benchmark's real models (bench/e2e.py REAL_MODELS), compiled at T = 1 (a length-1 sequence)
BENCHMARKED = [
    "gpt2_sdpa",
    "llama_gqa_sdpa",
    "mamba",
    "jamba",
    "torch_lstm_bidir",
    "torch_gru_bidir",
    "torch_rnn_bidir",
    "torch_rnncell_loop",
]
#: the step forms of models users write as loops or log-space scans, fused and compiled the same way
COMPILED = BENCHMARKED + [
    "torch_grucell_loop",
    "torch_lstmcell_loop",
    "torch_mlpcell_loop",
    "torch_lnlstm_loop",
    "mingru_log_space",
    "mingru_log_space_h0",
    "mamba2",
    "zamba2",
    "bamba",
]
#: the sequence form (issue 17): a window of T frames in one kernel — scans as the IR's Scan,
#: LSTM / GRU cells (both directions of nn.LSTM / nn.GRU) as the IR's Recur (a loop over positions)
WINDOWS = [
    (n, T) for T in (8, 32) for n in [*BENCHMARKED, "mingru_log_space", "torch_mlpcell_loop", "torch_lnlstm_loop"]
]


@dataclass
class Fused:
    name: str
    seq: int
    source: Path
    fused_path: Path
    fused: onnx.ModelProto
    report: object
    parity: object
    manifest: dict
    framefuse_ops: Counter = field(default_factory=Counter)

    def declines(self) -> str:
        reasons = [f"{d.pass_name}: {d.reason}" for d in self.report.declined] if self.report.declined else []
        return "; ".join(reasons) or "no decline reported"


_CACHE: dict[tuple[str, int], object] = {}


def fuse_real_model(name: str, seq: int, root: Path) -> Fused:
    key = (name, seq)
    if key not in _CACHE:
        try:
            _CACHE[key] = _run(name, seq, root)
        except Exception as exc:  # noqa: BLE001 - cached and re-raised for every test of this model
            _CACHE[key] = exc
    value = _CACHE[key]
    if isinstance(value, Exception):
        raise value
    return value


def _run(name: str, seq: int, root: Path) -> Fused:
    from framefuse.exporter import export_model
    from framefuse.parity import compare
    from framefuse.rewrite import rewrite_model

    spec = BY_NAME[name]
    result = export_model(
        spec.build(),
        form="sequence",
        config={"batch": BATCH, "seq": seq, "in_features": spec.features, "seed": 0},
        out_dir=root,
        name=f"{name}-T{seq}",
        exporter="auto",
    )
    manifest = json.loads(Path(result.manifest_path).read_text())
    fused, report = rewrite_model(result.model_path)
    fused_path = Path(result.directory) / "model.fused.onnx"
    onnx.save(fused, str(fused_path))
    parity = compare(result.model_path, fused, tolerance=manifest["parity"]["tolerance"])
    ops = Counter(n.op_type for n in fused.graph.node if n.domain == DOMAIN)
    return Fused(name, seq, Path(result.model_path), fused_path, fused, report, parity, manifest, ops)
