"""export → rewrite for one zoo architecture, as the benchmark and the engine/session tests need it.

``prepare(arch, out_dir, config)`` exports both forms (``<out_dir>/<arch>`` and ``<arch>-step``),
rewrites each into ``model.fused.onnx`` next to it and returns what was made. A rewrite failure is
recorded (``fused_error``), not raised: the unfused graph still runs everywhere.
``prepare_cached`` does the same once per process and configuration (tests share the exports).
Both export the seeded random weights unless the config asks for ``weights: trained``.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PreparedForm:
    arch: str
    form: str  # "sequence" | "step"
    directory: Path
    onnx: Path
    manifest: dict
    fused: Path | None = None
    fused_ops: list[str] = field(default_factory=list)
    fused_error: str | None = None
    nodes_before: int = 0
    nodes_after: int = 0

    @property
    def state_names(self) -> list[str]:
        return list(self.manifest.get("state_names") or [])

    def input_shapes(self) -> dict[str, list[int]]:
        return {i["name"]: list(i["shape"]) for i in self.manifest["inputs"]}


def prepare(arch: str, out_dir, config: dict | None = None, *, rewrite: bool = True) -> dict[str, PreparedForm]:
    import onnx

    from framefuse.exporter import export_forms

    out_dir = Path(out_dir)
    # Tests and latency benchmarks compare engines on the same weights, trained or not; the seeded
    # init keeps them from training every configuration they use. {"weights": "trained"} asks.
    config = {"weights": "random", **(config or {})}
    results = export_forms(arch, forms=["sequence", "step"], config=config, out_dir=out_dir)
    prepared: dict[str, PreparedForm] = {}
    for result in results:
        entry = PreparedForm(arch, result.form, result.directory, result.model_path, result.manifest)
        entry.nodes_before = len(onnx.load(str(result.model_path), load_external_data=False).graph.node)
        if rewrite:
            try:
                from framefuse.rewrite import rewrite_model

                fused, _report = rewrite_model(result.model_path)
                path = result.directory / "model.fused.onnx"
                onnx.save(fused, str(path))
                entry.fused = path
                entry.fused_ops = sorted(n.op_type for n in fused.graph.node if n.domain == "framefuse")
                entry.nodes_after = len(fused.graph.node)
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                entry.fused_error = f"{type(exc).__name__}: {exc}"
        prepared[result.form] = entry
    return prepared


_CACHE: dict[str, dict[str, PreparedForm]] = {}
_ROOT: Path | None = None


def prepare_cached(arch: str, config: dict | None = None, *, rewrite: bool = True) -> dict[str, PreparedForm]:
    """``prepare`` once per (arch, config) in this process, under one temporary folder (removed
    when the process exits)."""
    global _ROOT
    key = json.dumps([arch, config, rewrite], sort_keys=True, default=str)
    if key not in _CACHE:
        if _ROOT is None:
            _ROOT = Path(tempfile.mkdtemp(prefix="framefuse-prepared-"))
            atexit.register(shutil.rmtree, _ROOT, True)  # the exports live as long as the process
        folder = _ROOT / f"{len(_CACHE):03d}"
        folder.mkdir()
        _CACHE[key] = prepare(arch, folder, config, rewrite=rewrite)
    return _CACHE[key]


def torch_model(prepared: PreparedForm, device="cpu"):
    """The zoo's torch model with exactly the weights that were exported (same config, same seed,
    the same training or checkpoint)."""
    from framefuse.exporter.loading import zoo_model

    return zoo_model(prepared.arch, prepared.manifest["config"]).to(device).eval()
