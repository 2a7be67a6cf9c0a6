"""Session on a GPU: step() equals the torch model's own step loop for every architecture, the
step path allocates nothing and replays the captured graph, device inputs (torch CUDA, cupy) skip
host staging, both replay modes agree. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached, torch_model
from framefuse.runtime.session import Session

pytestmark = pytest.mark.gpu

CONFIG = {"seq": 32, "seed": 0}
TOL = 1e-4
FRAMES = 16


@pytest.fixture(autouse=True)
def _fp32_torch():
    """The torch reference in full fp32 (no TF32 convolutions), as the engine computes."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _frames(session, count=FRAMES, seed=0):
    shape = session.engine.input_specs["x"].shape
    return np.random.default_rng(seed).standard_normal((count, *shape)).astype(np.float32)


def _session(arch, **kwargs) -> Session:
    prepared = prepare_cached(arch, CONFIG)["step"]
    assert prepared.fused is not None, f"rewrite failed: {prepared.fused_error}"
    return Session.load(prepared.fused, device="cuda", **kwargs)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_step_equals_torch_step_loop(arch):
    prepared = prepare_cached(arch, CONFIG)["step"]
    session = _session(arch)
    model = torch_model(prepared, "cuda")
    frames = _frames(session)
    state = model.init_state(1, device="cuda")
    with torch.no_grad():
        for t, frame in enumerate(frames):
            expected, state = model.step(torch.from_numpy(frame).cuda(), state)
            got = session.step(frame)
            np.testing.assert_allclose(got, expected.cpu().numpy(), rtol=TOL, atol=TOL, err_msg=f"{arch} frame {t}")
    # the session's state is the model's state
    ours = session.get_state()
    for name, value in zip(prepared.state_names, state):
        np.testing.assert_allclose(ours[f"state.{name}"], value.cpu().numpy(), rtol=TOL, atol=TOL, err_msg=name)


@pytest.mark.parametrize("arch", ["mamba", "attention", "lstm"])
def test_step_allocates_nothing_and_replays(arch):
    """Whatever the build chose (the CPU step counts its calls as replays too)."""
    session = _session(arch)
    frames = _frames(session, 100)
    session.step(frames[0])  # first call: nothing lazy should remain, but be fair
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    replays = session.replays
    eager = session.engine.eager_runs
    for frame in frames:
        session.step(frame)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated, "step() allocated device memory"
    assert session.replays == replays + 100, "step() did not replay the captured graph once per frame"
    assert session.engine.eager_runs == eager
    # torch CUDA frames (device-to-device copy into the graph's input buffer) allocate nothing either
    cuda_frames = torch.from_numpy(frames).cuda()
    session.step(cuda_frames[0])
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for frame in cuda_frames:
        session.step(frame)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated, "step() with CUDA frames allocated device memory"


@pytest.mark.parametrize("select", ["time", "plan", "stepkernel", "cpustep"])
def test_device_frames_match_host_frames(select):
    """Host and device frames mixed in any order step one sequence, whichever candidate the build
    runs (the build's own timing, the plan, the step kernel, the CPU step): the state follows the
    frames from one binding to the other, and a device frame's output is on the device."""
    options = None if select == "time" else {"select": select}
    session = _session("mamba", engine_options=options)
    if select != "time":
        assert session.engine.metadata["selection"]["chosen"] == select
    frames = _frames(session, 9)
    host = [session.step(f).copy() for f in frames]
    expected_state = session.get_state()
    session.reset()
    # odd runs on each side, so a binding's two state halves are never in step by chance
    sides = ["host"] * 3 + ["device"] * 3 + ["host"] * 2 + ["device"]
    for t, (side, frame) in enumerate(zip(sides, frames)):
        if side == "device":
            y = session.step(torch.from_numpy(frame).cuda())
            assert isinstance(y, torch.Tensor) and y.is_cuda, f"frame {t}: a device frame answered {type(y)}"
            y = y.cpu().numpy()
        else:
            y = session.step(frame).copy()
        np.testing.assert_allclose(y, host[t], rtol=1e-6, atol=1e-6, err_msg=f"frame {t} ({side})")
    for name, value in session.get_state().items():  # read after a device frame
        np.testing.assert_allclose(value, expected_state[name], rtol=1e-6, atol=1e-6, err_msg=name)
    session.reset()
    cpu_torch = session.step(torch.from_numpy(frames[0]))
    assert isinstance(cpu_torch, torch.Tensor) and not cpu_torch.is_cuda
    np.testing.assert_allclose(cpu_torch.numpy(), host[0], rtol=1e-6, atol=1e-6)


def test_cupy_frames():
    cupy = pytest.importorskip("cupy")
    session = _session("min_gru")
    frames = _frames(session, 4)
    host = [session.step(f).copy() for f in frames]
    session.reset()
    for t, frame in enumerate(frames):
        out = session.step(cupy.asarray(frame))
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(out), host[t], rtol=1e-6, atol=1e-6)


def test_driver_replay_matches_torch_replay():
    # one kernel for both: two timed builds may each keep another tactic (session 62 on the H100: a
    # 1-ulp difference at the first frame), and this compares the replays, not the selections
    fixed = {"engine_options": {"select": "stepkernel"}}
    torch_mode = _session("lstm", **fixed)
    driver_mode = _session("lstm", replay="driver", **fixed)
    frames = _frames(torch_mode, 12)
    for t, frame in enumerate(frames):
        a = torch_mode.step(frame).copy()
        b = driver_mode.step(frame).copy()
        np.testing.assert_array_equal(a, b, err_msg=f"frame {t}")
    # device frames and reset in driver mode (ordering across streams)
    driver_mode.reset()
    torch_mode.reset()
    for frame in frames[:4]:
        np.testing.assert_array_equal(
            driver_mode.step(torch.from_numpy(frame).cuda()).cpu().numpy(), torch_mode.step(frame)
        )


def test_sequence_run_equals_step_loop_on_gpu():
    forms = prepare_cached("xlstm", CONFIG)
    seq = Session.load(forms["sequence"].fused, device="cuda")
    step = Session.load(forms["step"].fused, device="cuda")
    x = np.random.default_rng(0).standard_normal(seq.engine.input_specs["x"].shape).astype(np.float32)
    expected = seq.run(x)["y"]
    got = np.stack([step.step(x[:, t]).copy() for t in range(x.shape[1])], axis=1)
    np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)
    # run() with a CUDA tensor returns CUDA tensors, equal to the host run
    on_device = seq.run({"x": torch.from_numpy(x).cuda()})["y"]
    assert isinstance(on_device, torch.Tensor) and on_device.is_cuda
    np.testing.assert_allclose(on_device.cpu().numpy(), expected, rtol=1e-6, atol=1e-6)


def test_stats_and_budget():
    session = _session("gated_ssm")
    for frame in _frames(session, 200):
        session.step(frame)
    s = session.stats.summary()
    assert s["count"] == 200
    assert 0 < s["p50_us"] <= s["p99_us"] <= s["max_us"]
    assert s["p50_us"] < 16_670, "a 2-layer model should step well inside a 60 FPS frame"


def test_default_engine_on_a_gpu_is_cuda_graph(tmp_path):
    prepared = prepare_cached("min_gru", CONFIG)["step"]
    folder = tmp_path / "min_gru-step"
    folder.mkdir()
    for name in ("model.onnx", "model.fused.onnx", "manifest.json"):
        (folder / name).write_bytes((prepared.directory / name).read_bytes())
    session = Session.load(folder)
    assert session.engine_name == "cuda-graph" and session.device.type == "cuda"
    assert session.engine.framefuse_impl == "kernel"


def test_copy_and_check_finite_on_gpu():
    from framefuse.runtime.session import SessionError

    session = _session("min_gru", check_finite=True)
    frames = _frames(session, 3)
    shared = session.step(frames[0])
    fresh = session.step(frames[1], copy=True)
    assert fresh is not shared and not np.shares_memory(fresh, shared)
    bad = frames[2].copy()
    bad[..., 0] = np.nan
    with pytest.raises(SessionError, match=r"frame 2: frame input 'x' has 1 NaN/Inf"):
        session.step(bad)
    with pytest.raises(SessionError, match=r"frame 2: frame input 'x'"):
        session.step(torch.from_numpy(bad).cuda())  # the device-frame path checks too
    session.reset()
    state = session.get_state()
    for value in state.values():
        value[...] = np.inf
    session.set_state(state)
    with pytest.raises(SessionError, match=r"frame 0: (output 'y'|state 'state\.)"):
        session.step(frames[0])


@pytest.mark.parametrize("select", ["plan", "stepkernel"])
def test_nonfinite_frames_are_refused_on_the_gpu_engines(select):
    """The default policy on the CUDA engines: a NaN/Inf frame, host or device, is refused before
    the launch and the state stays as it was; nonfinite="propagate" launches it."""
    from framefuse.engines import cuda_graph
    from framefuse.runtime.session import SessionError

    prepared = prepare_cached("lstm", CONFIG)["step"]

    def make(**kwargs):
        engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": select})
        assert engine.metadata["selection"]["chosen"] == select
        return Session(engine, budget_ms=None, **kwargs)

    session, clean = make(), make()
    frames = _frames(session, 3)
    for s in (session, clean):
        s.step(frames[0])
    before = {k: np.array(v, copy=True) for k, v in session.get_state().items()}
    for bad_value in (np.nan, np.inf, -np.inf):
        bad = frames[1].copy()
        bad[..., -1] = bad_value
        with pytest.raises(SessionError, match=r"^frame 1: frame input 'x' has 1 NaN/Inf value\(s\).*unchanged"):
            session.step(bad)
        with pytest.raises(SessionError, match=r"^frame 1: frame input 'x' has 1 NaN/Inf value\(s\).*unchanged"):
            session.step(torch.from_numpy(bad).cuda())  # the device-frame path
    assert session.frame_index == 1
    for name, value in session.get_state().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    np.testing.assert_array_equal(session.step(frames[2]), clean.step(frames[2]))
    relaxed = make(nonfinite="propagate")
    bad = frames[1].copy()
    bad[..., 0] = np.nan
    assert np.isnan(relaxed.step(bad)).any()
    assert np.isnan(relaxed.step(frames[2])).any()  # the CUDA engines carry the NaN in the state


def test_onnxruntime_sessions_on_a_gpu_machine():
    """ONNX Runtime on the original graph (CPU EP; the CUDA EP when onnxruntime-gpu is
    installed) agrees with the cuda-graph engine frame by frame."""
    import onnxruntime as ort

    prepared = prepare_cached("mamba", CONFIG)["step"]
    reference = _session("mamba")
    frames = _frames(reference, 8)
    expected = [reference.step(f).copy() for f in frames]
    cpu = Session.load(prepared.onnx, engine="onnxruntime", device="cpu")
    assert cpu.engine_name == "onnxruntime" and cpu.device.type == "cpu"
    for t, frame in enumerate(frames):
        np.testing.assert_allclose(cpu.step(frame), expected[t], rtol=TOL, atol=TOL, err_msg=f"cpu EP frame {t}")
    cpu.reset()
    staged = cpu.step(torch.from_numpy(frames[0]).cuda())  # CUDA frame through the host buffers
    np.testing.assert_allclose(staged, expected[0], rtol=TOL, atol=TOL)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed: the CUDA EP part was not run")
    gpu = Session.load(prepared.onnx, engine="onnxruntime", device="cuda")
    assert gpu.engine.providers[0] == "CUDAExecutionProvider" and gpu.device.type == "cuda"
    for t, frame in enumerate(frames):
        np.testing.assert_allclose(gpu.step(frame), expected[t], rtol=TOL, atol=TOL, err_msg=f"CUDA EP frame {t}")
    gpu.reset()
    np.testing.assert_allclose(gpu.step(torch.from_numpy(frames[0]).cuda()), expected[0], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("resident", [False, True], ids=["launched", "resident"])
@pytest.mark.parametrize("arch", ["lstm", "attention"])
def test_native_host_path_equals_the_python_path(arch, resident):
    """engines/hostpath.c's frame in one call (the NaN check, the launch or the resident bell, the
    wait on the done words), through its extension module's step and through ctypes, is built on
    the GPU machine and gives the Python path's outputs and state bit for bit over 300 chained
    frames; each frame counts as one replay and one latency record."""
    from framefuse.engines import cuda_graph, hostpath

    prepared = prepare_cached(arch, CONFIG)["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
    frames = np.random.default_rng(3).standard_normal((300, *engine.input_specs["x"].shape)).astype(np.float32)
    results = {}
    for path in ("extension", "ctypes", "python"):
        session = Session(engine, budget_ms=None, resident=resident)
        try:
            if path == "extension":
                assert session._hot is not None and session._hot[5] is not None, hostpath.status()
                assert session.host_path == "native (engines/hostpath.c)"
            elif path == "ctypes":
                session._hot = session._hot_path = session._hot[:5] + (None, None)
                assert session.host_path.startswith("native through ctypes")
            else:
                session._hot = session._hot_path = None
            before = session.replays
            outs = [session.step(f).copy() for f in frames]
            assert session.replays == before + len(frames)
            assert session.stats.count == len(frames) and 0 < session.stats.percentile_us(50) < 1e4
            results[path] = outs, session.get_state()
        finally:
            session.close()
    python_outs, python_state = results["python"]
    for path in ("extension", "ctypes"):
        outs, state = results[path]
        for t, (a, b) in enumerate(zip(outs, python_outs)):
            np.testing.assert_array_equal(a, b, err_msg=f"{arch} {path} frame {t}")
        for name in python_state:
            np.testing.assert_array_equal(state[name], python_state[name], err_msg=f"{path} {name}")


@pytest.mark.parametrize("gap", ["0", "32M"])
def test_the_cpu_step_is_timed_again_with_a_frame_gap_before_it_is_kept(gap, monkeypatch):
    """The timed build on a GPU (engines.fusion.select_plan): where the CPU step answers first back
    to back, it and the fastest GPU candidate are timed again with FRAMEFUSE_FRAME_GAP_BYTES
    written before every call and the calls paced at FRAMEFUSE_FRAME_HZ, and the faster kept (the
    selection records both); with both 0, back to back decides. Every build records its seconds by
    phase."""
    from framefuse.engines import cuda_graph, fusion

    monkeypatch.setenv("FRAMEFUSE_FRAME_GAP_BYTES", gap)
    monkeypatch.setenv("FRAMEFUSE_FRAME_HZ", "0" if gap == "0" else "60")
    prepared = prepare_cached("min_gru", {"model": {"embed": 16, "layers": 1}, "seq": 4, "seed": 0})["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "time"})
    selection = engine.metadata["selection"]
    assert {"step kernels", "CPU step", "torch.compile", "host timing"} <= set(selection["phase_s"])
    timings = {n: c["us_per_step"] for n, c in selection["candidates"].items() if "us_per_step" in c}
    fastest = min((n for n in timings if not selection["candidates"][n].get("reference")), key=timings.get)
    if fastest != fusion.CPUSTEP:
        pytest.skip(f"the CPU step did not answer first back to back here ({fastest}: {timings})")
    if gap == "0":
        assert selection["chosen"] == fusion.CPUSTEP and "frame_gap" not in selection
        return
    checked = selection["frame_gap"]
    assert checked["bytes"] == 32 << 20 and selection["frame_gap_bytes"] == 32 << 20
    assert checked["hz"] == selection["frame_hz"] == 60.0
    assert fusion.CPUSTEP in checked["candidates"] and len(checked["candidates"]) == 2
    assert all(c["calls"] == fusion.FRAME_GAP_ROUNDS * fusion.FRAME_GAP_CALLS for c in checked["candidates"].values())
    assert selection["chosen"] == checked["kept"] or selection["chosen"].startswith("stepkernel")
    faster = min(checked["candidates"], key=lambda n: checked["candidates"][n]["us_per_step"])
    assert checked["kept"] == faster
