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
