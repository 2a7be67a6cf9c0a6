"""GPU: inductor-compiled plan segments (framefuse.engines.fusion) against the plan they were made
from, and build-time selection (every candidate timed captured in a CUDA graph)."""

from __future__ import annotations

import onnx
import pytest
import torch

from framefuse.engines import fusion
from framefuse.engines.executor import GraphExecutor, fp32_math

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _model(arch: str, form: str) -> onnx.ModelProto:
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached(arch, {"seq": 32, "seed": 0})[form]
    assert prepared.fused is not None, prepared.fused_error
    return onnx.load(str(prepared.fused))


@pytest.mark.parametrize("arch, form", [("min_gru", "step"), ("mamba", "step"), ("lstm", "sequence")])
def test_compiled_plan_matches_and_captures(arch, form):
    plan = GraphExecutor(_model(arch, form), "cuda").plan()
    compiled, report = fusion.compile_plan(plan, mode="default")
    assert report["segments"], "no standard-op segment was compiled"
    assert len(compiled.steps) < len(plan.steps)
    feeds = fusion.example_feeds(plan, seed=2)
    with fp32_math(), torch.no_grad():
        expected = {k: v.clone() for k, v in plan.execute({k: v.clone() for k, v in feeds.items()}).items()}
        got = compiled.execute({k: v.clone() for k, v in feeds.items()})
    assert fusion.max_difference(expected, got) <= fusion.PARITY_TOLERANCE
    timing = fusion.time_plan_graph(compiled, feeds, replays=20, repeats=2)  # capture must succeed
    assert timing["us_per_step"] > 0


def test_selection_keeps_the_fastest_and_never_the_slower():
    model = _model("min_gru", "step")
    plan = GraphExecutor(model, "cuda", optimize=True).plan()
    plain = GraphExecutor(model, "cuda", optimize=False).plan()
    logged = []
    chosen, report = fusion.select_plan(
        plan, alternatives={"unoptimized": plain}, modes={"inductor": "default"}, log=logged.append
    )
    timed = {n: e["us_per_step"] for n, e in report["candidates"].items() if "us_per_step" in e}
    assert {"plan", "unoptimized"} <= set(timed)
    assert report["chosen"] == min(timed, key=timed.get)
    assert any("<- chosen" in line for line in logged)
    assert chosen.output_specs == plan.output_specs


@pytest.mark.parametrize("arch", ["gru", "min_gru"])
def test_build_times_the_unfused_graph_and_keeps_the_faster(arch, tmp_path):
    """`framefuse build` of model.fused.onnx with model.onnx beside: the unfused graph (plain and
    compiled) is a candidate; the engine runs whichever was fastest, saves it and loads it back."""
    import numpy as np
    import onnxruntime as ort

    from framefuse.engines import cuda_graph
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached(arch, {"seq": 32, "seed": 0})["step"]
    logged = []
    engine = cuda_graph.build(
        prepared.fused, device="cuda", options={"unfused": prepared.onnx}, out=tmp_path, log=logged.append
    )
    selection = engine.metadata["selection"]
    timed = {n: e["us_per_step"] for n, e in selection["candidates"].items() if "us_per_step" in e}
    assert {"plan", "unfused"} <= set(timed), selection["candidates"]
    assert "unfused+inductor" in selection["candidates"]
    assert selection["chosen"] == min(timed, key=timed.get)
    assert (selection.get("graph") == "unfused") == selection["chosen"].startswith("unfused")
    assert any("<- chosen" in line for line in logged)

    feeds = {
        name: np.random.default_rng(3).standard_normal(spec.shape).astype(np.float32)
        for name, spec in engine.input_specs.items()
    }
    session = ort.InferenceSession(str(prepared.onnx), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = session.run(names, feeds)
    loaded = cuda_graph.load(tmp_path)
    assert loaded.metadata["selection"]["chosen"] == selection["chosen"]
    for runner in (engine, loaded):
        got = runner.run({k: v.copy() for k, v in feeds.items()})
        for name, want in zip(names, expected):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=f"{arch} {name}")
