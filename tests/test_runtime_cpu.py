"""Session, latency statistics, the game loop and the run/build/bench commands, on the CPU executor
(the same code paths as on a GPU except the capture itself)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from framefuse.cli import main as cli_main
from framefuse.engines.base import EngineBuildError
from framefuse.runtime.game_loop import run_game_loop
from framefuse.runtime.pipeline import prepare_cached
from framefuse.runtime.session import Session, SessionError, resolve_artifact
from framefuse.runtime.stats import LatencyStats

SMALL = {"model": {"embed": 32, "layers": 2}, "seq": 6, "seed": 0}
# One of each state kind: a vector state, (h, c), conv window + SSM state, a KV window with a mask.
STEP_ARCHS = ["min_gru", "lstm", "mamba", "attention"]


def _frames(session_seq: Session, seed=0) -> np.ndarray:
    shape = session_seq.engine.input_specs["x"].shape  # [1, T, F]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("arch", STEP_ARCHS)
@pytest.mark.parametrize("graph", ["fused", "original"])
def test_step_loop_equals_sequence_run(arch, graph):
    forms = prepare_cached(arch, SMALL)
    if graph == "fused":
        assert forms["step"].fused is not None, forms["step"].fused_error
        seq_src, step_src = forms["sequence"].fused, forms["step"].fused
    else:
        seq_src, step_src = forms["sequence"].onnx, forms["step"].onnx
    seq = Session.load(seq_src, device="cpu")
    step = Session.load(step_src, device="cpu")
    assert not seq.is_step_form and step.is_step_form
    x = _frames(seq)
    expected = seq.run(x)["y"]
    got = np.stack([step.step(x[:, t]).copy() for t in range(x.shape[1])], axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # reset() starts a new sequence: the first frames again give the first outputs.
    step.reset()
    assert all(not v.any() for v in step.get_state().values())
    again = np.stack([step.step(x[:, t]).copy() for t in range(3)], axis=1)
    np.testing.assert_allclose(again, expected[:, :3], rtol=1e-5, atol=1e-5)
    assert step.stats.count == x.shape[1] + 3


def test_state_stays_in_the_session_and_run_does_not_touch_it():
    step = Session.load(prepare_cached("min_gru", SMALL)["step"].fused, device="cpu")
    x = np.random.default_rng(0).standard_normal((4, 1, step.engine.input_specs["x"].shape[-1])).astype(np.float32)
    step.step(x[0])
    before = step.get_state()
    assert any(v.any() for v in before.values())
    out = step.run({"x": x[1]})  # zero state, a separate evaluation
    assert set(out) == set(step.output_names)
    for name, value in step.get_state().items():
        np.testing.assert_array_equal(value, before[name])
    # set_state / get_state round trip, and stepping from a set state is deterministic
    y1 = step.step(x[2]).copy()
    step.set_state(before)
    y2 = step.step(x[2]).copy()
    np.testing.assert_array_equal(y1, y2)
    with pytest.raises(SessionError, match="missing"):
        step.set_state({})


def test_frame_kinds_and_shapes():
    step = Session.load(prepare_cached("lstm", SMALL)["step"].fused, device="cpu")
    features = step.engine.input_specs["x"].shape[-1]
    frame = np.random.default_rng(0).standard_normal((1, features)).astype(np.float32)
    y_np = step.step(frame).copy()
    assert isinstance(y_np, np.ndarray) and y_np.shape == tuple(step.engine.output_specs["y"].shape)
    step.reset()
    y_torch = step.step(torch.from_numpy(frame))
    assert isinstance(y_torch, torch.Tensor)
    np.testing.assert_array_equal(y_torch.numpy(), y_np)
    step.reset()
    y_flat = step.step(frame[0].astype(np.float64))  # [F] for [1, F], float64 cast on copy
    np.testing.assert_allclose(y_flat, y_np, rtol=1e-6, atol=1e-6)
    step.reset()
    y_dict = step.step({"x": frame.tolist()})  # a dict by name, a nested list
    np.testing.assert_allclose(y_dict, y_np, rtol=1e-6, atol=1e-6)
    with pytest.raises(SessionError, match=r"frame 'x' has shape \[1, 3\]"):
        step.step(np.zeros((1, 3), np.float32))
    with pytest.raises(SessionError, match="unexpected"):
        step.step({"x": frame, "z": frame})


def test_step_on_a_sequence_graph_takes_a_whole_window():
    """A sequence-form graph has no state: its step is the whole graph on one window, so a frame
    of one position is refused with the shape the graph takes."""
    seq = Session.load(prepare_cached("min_gru", SMALL)["sequence"].onnx, device="cpu")
    with pytest.raises(SessionError, match=r"frame 'x' has shape \[1, 64\], the graph takes \[1, 6, 64\]"):
        seq.step(np.zeros((1, 64), np.float32))
    with pytest.raises(SessionError, match="unknown input"):
        seq.run({"x": np.zeros((1, 6, 64), np.float32), "h": 0})


def test_step_path_reuses_its_buffers():
    """The hot path writes into the same pinned/host buffers every frame: no new arrays."""
    step = Session.load(prepare_cached("min_gru", SMALL)["step"].fused, device="cpu")
    frame = np.zeros(step.engine.input_specs["x"].shape, np.float32)
    first = step.step(frame)
    second = step.step(frame + 1)
    assert first is second  # the session's output buffer, overwritten by each step
    assert step.engine.eager_runs == 2 and step.engine.replays == 0  # CPU: no capture


def test_latency_stats_ring_and_budget():
    stats = LatencyStats(capacity=4, budget_ms=1.0)
    for ns in (100_000, 2_000_000, 300_000, 400_000, 500_000, 3_000_000):
        stats.record(ns)
    s = stats.summary()
    assert s["count"] == 6 and s["window"] == 4
    assert s["overruns"] == 2  # 2 ms and 3 ms exceed the 1 ms budget
    assert s["max_us"] == 3000.0
    np.testing.assert_array_equal(stats.window(), [300_000, 400_000, 500_000, 3_000_000])  # oldest first
    assert s["p50_us"] == pytest.approx(450.0)
    stats.reset()
    assert stats.summary()["count"] == 0 and np.isnan(stats.summary()["p50_us"])


def test_session_budget_overruns_are_counted():
    step = Session.load(prepare_cached("min_gru", SMALL)["step"].fused, device="cpu", budget_ms=1e-6)
    frame = np.zeros(step.engine.input_specs["x"].shape, np.float32)
    for _ in range(5):
        step.step(frame)
    s = step.stats.summary()
    assert s["count"] == 5 and s["overruns"] == 5 and s["p50_us"] > 0


def test_load_resolution_prefers_the_built_engine(tmp_path, monkeypatch):
    from framefuse.engines import onnxruntime as ort_engine
    from framefuse.engines import registry
    from framefuse.engines.cuda_graph import build_engine

    # As on a machine without a usable GPU, whatever this one has.
    monkeypatch.setattr(registry, "cuda_graph_usable", lambda: False)
    prepared = prepare_cached("gated_ssm", SMALL)["step"]
    folder = tmp_path / "gated_ssm-step"
    folder.mkdir()
    (folder / "model.fused.onnx").write_bytes(prepared.fused.read_bytes())
    (folder / "manifest.json").write_text(json.dumps(prepared.manifest))
    # Only the fused graph: ONNX Runtime would run its framefuse nodes through Python, so the
    # default is the cuda-graph engine's CPU executor; ONNX Runtime takes it only when asked.
    r = resolve_artifact(folder)
    assert (r.engine, r.kind, r.file) == ("cuda-graph", "onnx", folder / "model.fused.onnx")
    with pytest.raises(SessionError, match="no model.onnx"):
        resolve_artifact(folder, engine="onnxruntime")
    assert resolve_artifact(folder, engine="onnxruntime", fused=True).file == folder / "model.fused.onnx"
    (folder / "model.onnx").write_bytes(prepared.onnx.read_bytes())
    r = resolve_artifact(folder)
    assert (r.engine, r.kind, r.file) == ("onnxruntime", "onnx", folder / "model.onnx")
    r = resolve_artifact(folder, engine="cuda-graph")
    assert (r.engine, r.file) == ("cuda-graph", folder / "model.fused.onnx")
    # A named fused file without a GPU: the CPU executor, unless an engine is named.
    assert resolve_artifact(folder / "model.fused.onnx").engine == "cuda-graph"
    assert resolve_artifact(folder / "model.onnx").engine == "onnxruntime"
    # An artifact present is used; the default engine's artifact first.
    build_engine(folder / "model.fused.onnx", device="cpu", out=folder)
    r = resolve_artifact(folder)
    assert (r.engine, r.kind, r.file, r.manifest) == (
        "cuda-graph",
        "artifact",
        folder / "engine.ffe",
        folder / "manifest.json",
    )
    ort_engine.build(folder / "model.onnx", out=folder)
    r = resolve_artifact(folder)
    assert (r.engine, r.kind, r.file) == ("onnxruntime", "artifact", folder / "engine.ort")
    assert resolve_artifact(folder, engine="cuda-graph").file == folder / "engine.ffe"
    with pytest.raises(SessionError, match="is a cuda-graph artifact, not onnxruntime"):
        resolve_artifact(folder / "engine.ffe", engine="onnxruntime")
    session = Session.load(folder)
    assert session.engine_name == "onnxruntime" and session.engine.artifact_path == folder / "engine.ort"
    assert session.manifest["arch"] == "gated_ssm" and session.is_step_form
    assert Session.load(folder, engine="cuda-graph", device="cpu").engine_name == "cuda-graph"
    with pytest.raises(SessionError, match=r"no engine artifact \(engine.ffe, engine.ort, engine.plan\)"):
        Session.load(tmp_path, device="cpu")


def test_game_loop_reports_latency():
    step = Session.load(prepare_cached("mamba", SMALL)["step"].fused, device="cpu")
    seen = []
    report = run_game_loop(step, frames=12, hz=0, warmup=2, on_frame=lambda i, y: seen.append(i))
    data = report.as_dict()
    assert seen == list(range(12))
    assert data["latency"]["count"] == 12 and data["output_finite"]
    assert data["latency"]["p99_us"] >= data["latency"]["p50_us"] > 0
    assert data["gpu_name"] is None and data["device"] == "cpu"
    paced = run_game_loop(step, frames=6, hz=200, warmup=0)  # 5 ms ticks: the loop waits for them
    assert paced.wall_s >= 5 * 0.005 * 0.9


def test_cli_build_and_run(tmp_path, capsys):
    prepared = prepare_cached("min_lstm", SMALL)["step"]
    folder = tmp_path / "min_lstm-step"
    folder.mkdir()
    (folder / "model.fused.onnx").write_bytes(prepared.fused.read_bytes())
    assert cli_main(["build", str(folder), "--engine", "cuda-graph", "--device", "cpu"]) == 0
    assert (folder / "engine.ffe").is_file()
    report = tmp_path / "loop.json"
    assert cli_main(["run", str(folder), "--device", "cpu", "--frames", "8", "--hz", "0", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["frames"] == 8 and data["latency"]["count"] == 8
    out = capsys.readouterr().out
    assert "p50" in out and "overruns" in out
    # The sequence form framefuse export wrote cannot drive a game loop (its step form is the one
    # to run): a clear error, exit code 2.
    sequence = prepare_cached("min_lstm", SMALL)["sequence"]
    seq_folder = tmp_path / "min_lstm"
    seq_folder.mkdir()
    (seq_folder / "model.onnx").write_bytes(sequence.onnx.read_bytes())
    (seq_folder / "manifest.json").write_text(json.dumps(sequence.manifest))
    assert cli_main(["run", str(seq_folder), "--device", "cpu", "--frames", "2"]) == 2
    assert "step form" in capsys.readouterr().err
    # Any other graph without state (a policy of one frame): each frame runs the whole graph, said once.
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "model.onnx").write_bytes(sequence.onnx.read_bytes())
    report = tmp_path / "policy.json"
    assert cli_main(["run", str(policy), "--device", "cpu", "--frames", "5", "--hz", "0", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["frames"] == 5
    assert "has no state" in capsys.readouterr().err


def test_cli_bench_smoke(tmp_path):
    """`framefuse bench` end to end on the CPU executor (one arch, a few calls): the JSON, the
    markdown table in the seed's shape, and every engine either measured or explained."""
    out = tmp_path / "bench"
    status = cli_main(
        [
            "bench",
            "--device",
            "cpu",
            "--archs",
            "min_gru",
            "--embed",
            "16",
            "--seq",
            "3",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ]
    )
    assert status == 0
    results = json.loads((out / "e2e.json").read_text())
    assert results["environment"]["device"] == "cpu"
    rows = {r["T"]: r for r in results["rows"]}
    assert set(rows) == {1, 3}
    for row in rows.values():
        for name in ("framefuse", "framefuse_unfused", "torch_eager", "ort_cpu"):
            engine = row["engines"][name]
            assert "p50_us" in engine, f"{name}: {engine}"
            assert engine["max_abs_err_vs_ort"] < 1e-4
        assert row["engines"]["torch_cuda_graph"] == {"skipped": "no GPU"}
        assert row["best_peer"] in ("torch_eager", "ort_cpu")
    table = (out / "e2e.md").read_text()
    assert "| rank | architecture | category | ms |" in table and "viable at 60 FPS" in table
    assert "no GPU (CPU executor)" in table


def test_load_a_modelproto_picks_an_engine_that_runs_it(monkeypatch):
    import onnx

    from framefuse.engines import registry

    monkeypatch.setattr(registry, "cuda_graph_usable", lambda: False)
    forms = prepare_cached("min_gru", SMALL)["step"]
    original = Session.load(onnx.load(str(forms.onnx)))
    fused = Session.load(onnx.load(str(forms.fused)))
    assert original.engine_name == "onnxruntime" and fused.engine_name == "cuda-graph"
    frame = np.ones(original.engine.input_specs["x"].shape, np.float32)
    np.testing.assert_allclose(original.step(frame), fused.step(frame), rtol=1e-5, atol=1e-5)


def test_prepare_cached_removes_its_folder_at_exit(tmp_path):
    import subprocess
    import sys

    code = (
        "from framefuse.runtime.pipeline import prepare_cached\n"
        "p = prepare_cached('min_gru', {'seq': 4, 'seed': 0}, rewrite=False)['step']\n"
        "print(p.onnx.parent.parent.parent)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    root = out.stdout.strip().splitlines()[-1]
    assert "framefuse-prepared-" in root and not __import__("os").path.exists(root), root


@pytest.mark.parametrize("engine", ["onnxruntime", "cuda-graph"])
def test_step_of_a_graph_without_state_is_a_run_on_the_frame(engine):
    """A graph without state steps too: each step is the graph on that frame (nothing carried),
    into the session's own output buffer, over buffers made on the first step."""
    source = prepare_cached("gru", SMALL)["sequence"].fused
    session = Session.load(source, engine=engine, device="cpu", fused=True if engine == "onnxruntime" else None)
    assert not session.is_step_form and session._host_step is None  # nothing made until a step
    frames = np.stack([_frames(session, seed) for seed in range(3)])
    outputs = []
    for frame in frames:
        out = session.step(frame)
        expected = session.run(frame)["y"]
        assert np.array_equal(out, expected), np.abs(out - expected).max()
        outputs.append(out)
    assert all(out is outputs[0] for out in outputs)  # one buffer, overwritten by each step
    assert session.frame_index == 3
    assert np.array_equal(session.step(frames[0], copy=True), session.run(frames[0])["y"])
    assert session.get_state() == {}
    with pytest.raises(SessionError, match="frame 'x' has shape"):
        session.step(frames[0][:, :2])


def test_resident_is_refused_where_there_is_no_step_kernel():
    """resident=True needs the step compiler's kernel on a GPU: an engine on the CPU and an ONNX
    Runtime session are refused with one line, for a graph with state or without; close() is
    harmless."""
    forms = prepare_cached("min_gru", SMALL)
    step = forms["step"].fused
    with pytest.raises(SessionError, match="resident=True needs the cuda-graph engine"):
        Session.load(step, engine="onnxruntime", device="cpu", fused=True, resident=True)
    with pytest.raises((SessionError, EngineBuildError), match="step compiler's kernel"):
        Session.load(step, engine="cuda-graph", device="cpu", resident=True)
    with pytest.raises(SessionError, match="resident=True needs the cuda-graph engine"):
        Session.load(forms["sequence"].onnx, device="cpu", resident=True)
    with pytest.raises((SessionError, EngineBuildError), match="step compiler's kernel"):
        Session.load(forms["sequence"].fused, engine="cuda-graph", device="cpu", resident=True)
    with Session.load(step, device="cpu") as session:  # not resident: close() does nothing
        session.step(np.zeros(session.engine.input_specs["x"].shape, dtype=np.float32))
    session.close()


def test_resident_refuses_a_gpu_that_cannot_host_a_kernel_that_never_ends(monkeypatch):
    from framefuse.engines.stepkernel import _check_resident_host

    ok = {"name": "GPU", "kernel_exec_timeout": 0, "compute_preemption": 1}
    _check_resident_host(ok)
    with pytest.raises(EngineBuildError, match="run-time limit on kernels"):
        _check_resident_host({**ok, "kernel_exec_timeout": 1})
    with pytest.raises(EngineBuildError, match="cannot preempt"):
        _check_resident_host({**ok, "compute_preemption": 0})
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    with pytest.raises(EngineBuildError, match="MPS client limited"):
        _check_resident_host(ok)
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")
    _check_resident_host(ok)


def test_a_resident_kernel_on_fewer_sms_warns_that_first_work_beside_it_can_wait():
    """warn_beside_resident (ResidentStepBinding with resident_sms): one RuntimeWarning naming the
    SMs, what was measured to wait (the process's first torch.sum, a device-wide synchronize) and
    the remedy, attributed to the caller's line outside framefuse, not the engine's."""
    from framefuse.engines import stepkernel

    with pytest.warns(
        RuntimeWarning, match=r"resident_sms=16: .*first torch.sum.*once before the session starts"
    ) as seen:
        stepkernel.warn_beside_resident(16)
    assert len(seen) == 1 and seen[0].filename == __file__


def test_the_python_wait_on_a_resident_answer_spins_checks_and_gives_up(monkeypatch):
    """spin_until_answered (ResidentStepBinding's and CpuResidentBinding's Python path): every
    word waited for; check() called every `polls` spins; False once the deadline, started at the
    first look at the clock, has passed."""
    from framefuse.engines import stepkernel

    class Word:  # holds `final` from its `after`-th read on
        def __init__(self, final, after):
            self.final, self.after, self.reads = final, after, 0

        @property
        def value(self):
            self.reads += 1
            return self.final if self.reads > self.after else 0

    checks = []
    words = [Word(7, 0), Word(7, 25)]
    assert stepkernel.spin_until_answered(words, 7, polls=10, timeout_s=60.0, check=lambda: checks.append(1))
    assert words[1].reads == 26 and len(checks) == 2  # at spins 10 and 20 of the second word
    clock = iter(range(100))
    monkeypatch.setattr(stepkernel.time, "perf_counter", lambda: float(next(clock)))
    never = Word(7, 10**9)
    assert not stepkernel.spin_until_answered([never], 7, polls=4, timeout_s=2.5)
    assert never.reads == 4 * 4  # the deadline set at the first look (t = 0), passed at the fourth (t = 3)

    def dead():
        raise RuntimeError("the answerer died")

    with pytest.raises(RuntimeError, match="answerer died"):
        stepkernel.spin_until_answered([Word(7, 10**9)], 7, polls=3, timeout_s=60.0, check=dead)


def test_resident_options_from_the_command_line_are_refused_with_one_line(capsys):
    step = prepare_cached("min_gru", SMALL)["step"].fused
    assert cli_main(["run", str(step), "--device", "cpu", "--frames", "2", "--resident"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "resident=True needs" in err[-1]
    with pytest.raises(SessionError, match="resident_sms= limits a resident kernel"):
        Session.load(step, device="cpu", resident_sms=4)
    with pytest.raises(SessionError, match="resident_sms= limits a resident kernel"):
        Session.load(prepare_cached("min_gru", SMALL)["sequence"].onnx, device="cpu", resident_sms=4)
