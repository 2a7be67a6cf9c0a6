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
    assert report["metric"].startswith("host to host")
    for name in timed:  # host to host (the choice) and the device time of back-to-back replays beside it
        entry = report["candidates"][name]
        assert entry["calls"] == fusion.HOST_TIMING_ROUNDS * fusion.HOST_TIMING_CALLS
        assert 0 < entry["device_us_per_step"] and entry["us_per_step"] <= entry["p99_us"]
    assert any("<- chosen" in line and "host to host" in line for line in logged)
    assert chosen.output_specs == plan.output_specs


def test_selection_times_the_step_kernel_as_the_session_runs_it():
    """The step kernel reads the frame from and writes the output to mapped host memory itself: the
    selection times it through the session's binding (mapped buffers, done words), host to host,
    and the figure is the one a Session.step of the chosen engine then shows (within host noise)."""
    from framefuse.engines.executor import GraphExecutor as Executor
    from framefuse.runtime.session import Session

    model = _model("min_gru", "step")
    executor = Executor(model, "cuda", optimize=True)
    plan = executor.plan()
    chosen, report = fusion.apply_selection(executor, plan, "time")
    step = report["candidates"][fusion.STEPKERNEL]
    assert step["calls"] == fusion.HOST_TIMING_ROUNDS * fusion.HOST_TIMING_CALLS, step
    # the kernel's own device time is below its host-to-host time (the mapped frame and output, the launch)
    assert step["device_us_per_step"] < step["us_per_step"], step
    if report["chosen"] == fusion.STEPKERNEL:
        import numpy as np

        from framefuse.engines import cuda_graph

        engine = cuda_graph.build(model, device="cuda", options={"select": fusion.STEPKERNEL})
        with Session(engine, budget_ms=None) as session:
            (name,) = session.frame_inputs
            frame = np.random.default_rng(0).standard_normal(engine.input_specs[name].shape).astype(np.float32)
            for _ in range(1000):
                session.step(frame)
            p50 = session.stats.summary()["p50_us"]
        assert p50 < 3 * step["us_per_step"] + 20, (p50, step)


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
    fastest = min(timed, key=timed.get)
    # a step-kernel tactic within fusion.TACTIC_MARGIN of the plain kernel leaves the plain one chosen
    expected = fusion.STEPKERNEL if fusion.plain_kernel_within_margin(fastest, timed) else fastest
    assert selection["chosen"] == expected, timed
    if expected != fastest:
        assert any("the plain kernel is kept" in line for line in logged)
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


def test_device_timing_gives_a_slow_candidate_fewer_replays():
    """time_plan_graph within its budget: a plan that spins ~20 ms on the GPU a step gets about
    1 s / (5 x 20 ms) = 10 replays a repeat of the 200 asked, and its time still reads ~20 ms; a
    fast one keeps all 200."""

    class Sleeper:
        device = torch.device("cuda")

        def __init__(self, cycles: int):
            self.cycles = cycles

        def execute(self, feeds):
            torch.cuda._sleep(self.cycles)
            return {}

    slow = fusion.time_plan_graph(Sleeper(40_000_000), {}, replays=200, repeats=5, budget_s=1.0)
    assert fusion.DEVICE_TIMING_MIN_REPLAYS <= slow["replays"] < 200, slow
    assert slow["us_per_step"] > 10_000, slow  # 40M cycles: 20-25 ms at an H100's / H200's clocks
    fast = fusion.time_plan_graph(Sleeper(1000), {}, replays=200, repeats=5, budget_s=1.0)
    assert fast["replays"] == 200, fast
