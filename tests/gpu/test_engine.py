"""The cuda-graph engine on a GPU: every zoo architecture, both forms, fused (framefuse kernels) and
unfused, against ONNX Runtime on the original graph; capture and replay actually used; the
artifact's GPU metadata; Polygraphy composition. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from framefuse.engines.cuda_graph import build_engine
from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached

pytestmark = pytest.mark.gpu

# The benchmark's configuration: each config file's defaults (embed 256, 2 layers), T = 32.
CONFIG = {"seq": 32, "seed": 0}
TOL = 1e-4
STEPS = 3


def _ort(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _check_against_ort(engine, prepared):
    """ORT on the original graph vs the engine; the step form runs STEPS frames, each side
    feeding its own next_state back. Returns the number of engine runs."""
    rng = np.random.default_rng(7)
    session = _ort(prepared.onnx)
    names = [o.name for o in session.get_outputs()]
    shapes = prepared.input_shapes()
    feeds = {
        n: rng.standard_normal(s).astype(np.float32) if n == "x" else np.zeros(s, np.float32) for n, s in shapes.items()
    }
    ours = dict(feeds)
    runs = STEPS if prepared.form == "step" else 1
    for _ in range(runs):
        expected = dict(zip(names, session.run(names, feeds)))
        actual = engine.run(ours)
        for name in names:
            np.testing.assert_allclose(
                actual[name], expected[name], rtol=TOL, atol=TOL, err_msg=f"{prepared.arch} {prepared.form} {name}"
            )
            assert np.isfinite(actual[name]).all()
        x = rng.standard_normal(shapes["x"]).astype(np.float32)
        feeds = {"x": x, **{f"state.{n}": expected[f"next_state.{n}"] for n in prepared.state_names}}
        ours = {"x": x, **{f"state.{n}": actual[f"next_state.{n}"] for n in prepared.state_names}}
    return runs


@pytest.mark.parametrize("graph", ["fused", "original"])
@pytest.mark.parametrize("form", ["sequence", "step"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_engine_matches_onnxruntime(arch, form, graph):
    prepared = prepare_cached(arch, CONFIG)[form]
    if graph == "fused":
        assert prepared.fused is not None, f"rewrite failed: {prepared.fused_error}"
        source = prepared.fused
    else:
        source = prepared.onnx
    engine = build_engine(source, device="cuda")
    if graph == "fused":
        assert engine.framefuse_impl == "kernel"
    runs = _check_against_ort(engine, prepared)
    # Every run was a replay of the one captured graph; nothing ran eagerly after planning.
    assert engine.captures == 1
    assert engine.replays == runs
    assert engine.eager_runs == 0


def test_fused_graphs_contain_framefuse_nodes():
    """The rewrite actually fused something for the recurrent architectures (otherwise the
    engine test above would only measure torch ops)."""
    fused = {arch: prepare_cached(arch, CONFIG)["sequence"].fused_ops for arch in ARCHITECTURES}
    for arch in ("lstm", "gru", "min_gru", "min_lstm", "mamba", "attention"):
        assert fused[arch], f"{arch}: no framefuse node in the fused sequence graph"


def test_replays_use_the_captured_graph_and_fixed_buffers():
    prepared = prepare_cached("mamba", CONFIG)["sequence"]
    engine = build_engine(prepared.fused, device="cuda")
    binding = engine.binding()
    assert binding.graph is not None
    assert all(t.is_pinned() for t in binding.host_in_t.values())
    assert all(t.is_pinned() for t in binding.host_out_t.values())
    x = np.random.default_rng(0).standard_normal(engine.input_specs["x"].shape).astype(np.float32)
    first = engine.run({"x": x})["y"]
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for _ in range(20):
        again = engine.run({"x": x})["y"]
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated
    np.testing.assert_array_equal(again, first)  # deterministic replays
    assert engine.replays == 21 and engine.captures == 1 and engine.eager_runs == 0
    # a new input changes the output (the H2D copy is inside the graph, not baked in)
    other = engine.run({"x": x + 1})["y"]
    assert not np.array_equal(other, first)


def test_artifact_records_this_gpu_and_reloads(tmp_path):
    from framefuse.engines.cuda_graph import load_engine, read_artifact

    prepared = prepare_cached("lstm", CONFIG)["step"]
    engine = build_engine(prepared.fused, device="cuda", out=tmp_path)
    metadata, _ = read_artifact(tmp_path / "engine.ffe")
    major, minor = torch.cuda.get_device_capability()
    assert metadata["device"] == "cuda"
    assert metadata["gpu_name"] == torch.cuda.get_device_name()
    assert metadata["compute_capability"] == f"{major}.{minor}"
    assert metadata["framefuse_impl"] == "kernel"
    loaded = load_engine(tmp_path / "engine.ffe")
    assert loaded.device.type == "cuda"
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in prepared.input_shapes().items()}
    for name, value in engine.run(feeds).items():
        np.testing.assert_allclose(loaded.run(feeds)[name], value, rtol=1e-6, atol=1e-6)


def test_polygraphy_comparator_on_gpu():
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, DataLoader, SimpleCompareFunc

    prepared = prepare_cached("min_gru", CONFIG)["step"]
    runners = [
        OnnxrtRunner(SessionFromOnnx(str(prepared.onnx), providers=["CPUExecutionProvider"])),
        build_engine(prepared.fused, device="cuda"),
    ]
    results = Comparator.run(runners, data_loader=DataLoader(iterations=3, seed=1))
    assert bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=TOL, rtol=TOL)))


def test_registry_build_load_and_check_on_gpu(tmp_path):
    from framefuse.engines.registry import get_backend, unavailable_reason
    from framefuse.parity import compare

    prepared = prepare_cached("gated_ssm", CONFIG)["step"]
    assert unavailable_reason("cuda-graph", device="cuda") is None
    backend = get_backend("cuda-graph")
    lines = []
    built = backend.build(prepared.fused, out=tmp_path, log=lines.append)
    assert built.device.type == "cuda" and built.artifact_path == tmp_path / "engine.ffe"
    assert any("planned" in line for line in lines) and any("wrote" in line for line in lines)
    loaded = backend.load(tmp_path)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in prepared.input_shapes().items()}
    for name, value in built.run(feeds).items():
        np.testing.assert_array_equal(loaded.run(feeds)[name], value)
    report = compare(prepared.onnx, loaded, tolerance=TOL)
    assert report.passed, report.summary()
