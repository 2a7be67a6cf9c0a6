"""The step IR compiled for the CPU (framefuse/compiler/cstep.py) against the IR's reference
interpreter (naive.py) and ONNX Runtime, without a GPU: every zoo architecture's step form, batch 3,
odd sizes, NaN and Inf frames, a zero state, a real model's length-1 window, the decline of a
sequence form's recurrence, and the function run as hostpath.c's launch (Session.step's frame call)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from framefuse.compiler import CompileError, cstep, lower_program, naive
from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached

SMALL = {"model": {"embed": 32, "layers": 2}, "seq": 4, "seed": 0}  # tests/test_compiler.py's: one export
TOL = 1e-5

pytestmark = pytest.mark.skipif(cstep.compiler() is None, reason="no C++ compiler: the CPU step is not built")


def _program(arch, config=SMALL, form="step"):
    prepared = prepare_cached(arch, config)[form]
    assert prepared.fused is not None, prepared.fused_error
    return lower_program(prepared.fused)


def _state(program, rng, scale=0.5):
    state = {}
    for name, leaf in program.states.items():
        value = (scale * rng.standard_normal(leaf.shape)).astype(np.float32)
        if "valid" in name:  # the attention window's 0/1 mask
            value = (rng.random(leaf.shape) > 0.3).astype(np.float32)
        state[name] = value
    return state


def _close(actual, expected, what, tol=TOL):
    """Within ``tol`` relative to 1 + |expected|; NaN and Inf exactly where the reference has them."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    finite = np.isfinite(expected)
    assert np.array_equal(actual[~finite], expected[~finite], equal_nan=True), f"{what}: NaN / Inf differ"
    err = np.abs(actual[finite] - expected[finite]) / (1 + np.abs(expected[finite]))
    assert err.size == 0 or err.max() <= tol, f"{what}: max rel diff {err.max():.3g}"


def _chain(program, frames, state, runner=None):
    """Chained steps of the C step and of the interpreter from the same frames and state, each
    carrying its own state; every output compared."""
    runner = runner or cstep.Runner(cstep.generate(program))
    x = next(iter(program.inputs))
    mine, ref = dict(state), dict(state)
    for i, frame in enumerate(frames):
        got = runner.run({x: frame}, mine)
        want = naive.run(program, {x: frame, **ref})
        for name in want:
            _close(got[name], want[name], f"step {i}: {name}")
        mine = {n: got[program.state_of[n]] for n in program.states}
        ref = {n: want[program.state_of[n]] for n in program.states}
    return runner


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cpu_step_matches_the_interpreter_over_chained_steps(arch):
    program = _program(arch)
    rng = np.random.default_rng(0)
    x = next(iter(program.inputs))
    frames = rng.standard_normal((4, *program.inputs[x].shape)).astype(np.float32)
    _chain(program, frames, _state(program, rng))


@pytest.mark.parametrize("arch", ["lstm", "attention"])
def test_cpu_step_batch_of_three_and_odd_sizes(arch):
    rng = np.random.default_rng(1)
    for config in (
        {**SMALL, "batch": 3},
        {"model": {"embed": 48, "layers": 3}, "in_features": 17, "out_features": 5, "seq": 4, "seed": 3},
    ):
        program = _program(arch, config)
        x = next(iter(program.inputs))
        frames = rng.standard_normal((3, *program.inputs[x].shape)).astype(np.float32)
        _chain(program, frames, _state(program, rng))


@pytest.mark.parametrize("arch", ["gru", "mamba"])
def test_cpu_step_nan_and_inf_frames_and_a_zero_state(arch):
    program = _program(arch)
    rng = np.random.default_rng(2)
    x = next(iter(program.inputs))
    frames = rng.standard_normal((4, *program.inputs[x].shape)).astype(np.float32)
    frames[1].reshape(-1)[0] = np.nan
    frames[2].reshape(-1)[-1] = np.inf
    frames[3].reshape(-1)[1] = -np.inf
    zero = {n: np.zeros(leaf.shape, np.float32) for n, leaf in program.states.items()}
    _chain(program, frames, zero)


def test_cpu_step_of_a_real_models_length_one_window_matches_onnxruntime():
    """transformers-free and small: the LayerNorm-LSTM loop of tests/real_models at T = 1 (its
    frame concatenated with scalars of it, layer norms, LSTM cells), against ONNX Runtime on the
    original graph over chained frames."""
    import tempfile
    from pathlib import Path

    import onnxruntime as ort

    from tests.real_models.flow import fuse_real_model

    fused = fuse_real_model("torch_lnlstm_loop", 1, Path(tempfile.mkdtemp(prefix="ff-cstep-")))
    program = lower_program(fused.fused)
    runner = cstep.Runner(cstep.generate(program))
    sess = ort.InferenceSession(str(fused.source), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    x = next(iter(program.inputs))
    assert x in names and not program.states  # a window: no state carried between calls
    out = next(iter(program.outputs))
    rng = np.random.default_rng(4)
    for _ in range(5):
        frame = rng.standard_normal(program.inputs[x].shape).astype(np.float32)
        want = sess.run([out], {x: frame})[0]
        _close(runner.run({x: frame})[out], want, out, tol=1e-5)


def test_a_sequence_forms_recurrence_is_declined_naming_the_node():
    program = _program("lstm", form="sequence")
    with pytest.raises(CompileError, match=r"Recur|Scan|BodyLoop|DeltaScan") as caught:
        cstep.generate(program)
    assert "CPU step" in str(caught.value)


def test_the_cpu_step_runs_as_hostpaths_launch_with_alternating_state_halves():
    """hostpath.c's frame call with the generated function as its launch and the runner's two
    argument blocks as its graphs: the done word raised, the parity flipping, the outputs and
    state those of direct calls."""
    from framefuse.engines import hostpath

    lib = hostpath.load()
    if lib is None:
        pytest.skip(f"hostpath.c not built here: {hostpath.status()}")
    frame_call, _ = lib
    program = _program("min_gru")
    rng = np.random.default_rng(5)
    x = next(iter(program.inputs))
    frames = rng.standard_normal((4, *program.inputs[x].shape)).astype(np.float32)
    direct = cstep.Runner(cstep.generate(program))
    native = cstep.Runner(direct.step)
    state = hostpath.FrameState()
    state.launch = native.function
    state.exec[0], state.exec[1] = native.io_address(0), native.io_address(1)
    state.done, state.n_done, state.n_execs, state.spin_limit = native.done.ctypes.data, 1, 2, 1000
    pointer = ctypes.pointer(state)
    out = next(n for n in program.outputs if n not in set(program.state_of.values()))
    for i, frame in enumerate(frames):
        direct.inputs[x][...] = frame
        direct.call(i % 2)
        native.inputs[x][...] = frame
        assert frame_call(pointer) == hostpath.DONE
        assert native.done[0] == 1 and state.parity == (i + 1) % 2
        np.testing.assert_array_equal(native.outputs[out], direct.outputs[out])
    for name in program.states:
        np.testing.assert_array_equal(native.halves[name][0], direct.halves[name][0])


def test_the_cpu_step_as_the_engines_recorded_choice_runs_session_step(tmp_path):
    """``select="cpustep"``: the cuda-graph engine's plan is the CPU step, Session.step runs it
    through the native frame call, chained frames match ONNX Runtime on the original graph, the
    state API reads and writes its halves, and a saved engine loads with the same choice."""
    import onnxruntime as ort

    from framefuse.engines import cuda_graph
    from framefuse.engines.cpustep import CpuStepPlan
    from framefuse.runtime.session import Session

    prepared = prepare_cached("lstm", SMALL)["step"]
    engine = cuda_graph.build(prepared.fused, device="cpu", options={"select": "cpustep"})
    assert engine.metadata["selection"]["chosen"] == "cpustep"
    assert isinstance(engine.default_plan, CpuStepPlan) and engine.summary()["cpustep"]["nodes"] > 0
    session = Session(engine, budget_ms=None)
    manifest = prepared.manifest
    x, y = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    names = [f"state.{n}" for n in manifest["state_names"]]
    ref = ort.InferenceSession(str(prepared.onnx), providers=["CPUExecutionProvider"])
    shapes = {i.name: [int(d) for d in i.shape] for i in ref.get_inputs()}
    state = {n: np.zeros(shapes[n], np.float32) for n in names}
    rng = np.random.default_rng(6)
    for i in range(20):
        frame = rng.standard_normal(shapes[x]).astype(np.float32)
        got = session.step(frame).copy()
        results = ref.run([y] + ["next_" + n for n in names], {x: frame, **state})
        state = dict(zip(names, results[1:]))
        _close(got, results[0], f"frame {i}")
    assert session.frame_index == 20
    for name, value in session.get_state().items():
        _close(value, state[name], name)
    session.reset()
    assert all(not v.any() for v in session.get_state().values())
    session.set_state(state)
    for name, value in session.get_state().items():
        np.testing.assert_array_equal(value, state[name])
    engine.save(tmp_path)
    loaded = cuda_graph.load(tmp_path, device="cpu")
    assert loaded.metadata["selection"]["chosen"] == "cpustep" and isinstance(loaded.default_plan, CpuStepPlan)
    again = Session(loaded, budget_ms=None)
    again.set_state(state)
    frame = rng.standard_normal(shapes[x]).astype(np.float32)
    session.set_state(state)
    np.testing.assert_array_equal(again.step(frame), session.step(frame))


@pytest.fixture(scope="module")
def sanitizers(tmp_path_factory):
    """Skip where g++ has no AddressSanitizer / UBSan runtime (the check needs both)."""
    import subprocess

    folder = tmp_path_factory.mktemp("san")
    (folder / "probe.cpp").write_text("int main() { return 0; }\n")
    probe = subprocess.run(
        [*cstep.compiler(), "-fsanitize=address,undefined", "-o", str(folder / "probe"), str(folder / "probe.cpp")],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"g++ cannot build with -fsanitize=address,undefined here: {probe.stderr.strip()[:200]}")


@pytest.mark.usefixtures("sanitizers")
@pytest.mark.parametrize("arch", ["attention", "mamba"])  # every node kind, the step.cuh bodies of both
def test_the_cpu_step_is_clean_under_address_and_undefined_behaviour_sanitizers(arch):
    """The CPU step's memcheck: its own process built with -fsanitize=address,undefined, every
    buffer a heap block of exactly its size, chained steps with the state halves alternating."""
    step = cstep.generate(_program(arch))
    assert cstep.sanitize(step) == ""


@pytest.mark.usefixtures("sanitizers")
def test_the_sanitizer_run_catches_a_buffer_too_small():
    """The check above can fail: the same step with its scratch cut to 16 floats overflows it."""
    import dataclasses

    step = cstep.generate(_program("gru"))
    report = cstep.sanitize(dataclasses.replace(step, scratch_floats=16))
    assert "heap-buffer-overflow" in report


def _cpu_sessions(arch="lstm"):
    from framefuse.engines import cuda_graph
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, SMALL)["step"]
    engine = cuda_graph.build(prepared.fused, device="cpu", options={"select": "cpustep"})
    return Session(engine, budget_ms=None), Session(engine, budget_ms=None, resident=True)


def test_the_resident_cpu_step_answers_as_the_callers_thread_does():
    """Session(resident=True) on the CPU step: a worker thread of its own (hostpath.c's
    ff_cpu_worker) answers each frame rung through the bell, bit for bit the frames the caller's
    thread runs, through the native frame call and the Python one (a float64 frame), across state
    reads, set_state, reset and close; the next frame after close starts the worker again. A
    resident_sms= is refused in one line (it limits a GPU kernel)."""
    from framefuse.engines.base import EngineBuildError
    from framefuse.engines.cpustep import CpuResidentBinding, CpuStepBinding
    from framefuse.engines.hostpath import worker

    if worker() is None:
        pytest.skip("hostpath.c is not built here")
    plain, resident = _cpu_sessions()
    assert type(plain._host_step) is CpuStepBinding and isinstance(resident._host_step, CpuResidentBinding)
    assert resident._hot is not None  # the native frame call rings the worker
    binding = resident._host_step
    rng = np.random.default_rng(11)
    shape = binding.host_in[resident._single_in].shape
    for i in range(60):
        frame = rng.standard_normal(shape).astype(np.float32)
        if i % 3 == 2:
            frame = frame.astype(np.float64)  # not the hot path's dtype: the Python frame path
        np.testing.assert_array_equal(resident.step(frame), plain.step(frame), err_msg=f"frame {i}")
        if i == 20:
            state = plain.get_state()
            for name, value in resident.get_state().items():
                np.testing.assert_array_equal(value, state[name])
        if i == 30:
            scrambled = {n: rng.standard_normal(v.shape).astype(np.float32) for n, v in state.items()}
            plain.set_state(scrambled)
            resident.set_state(scrambled)
        if i == 40:
            plain.reset()
            resident.reset()
        if i == 50:
            resident.close()
            assert not binding.running
    assert binding.running and binding.starts == 2 and resident.frame_index == plain.frame_index == 19  # since reset
    resident.close()
    assert not binding.running
    from framefuse.runtime.session import Session

    with pytest.raises(EngineBuildError, match=r"resident_sms=4 limits a resident GPU kernel"):
        Session(plain.engine, budget_ms=None, resident=True, resident_sms=4)


def test_the_resident_cpu_worker_starts_and_stops_a_thousand_times_without_a_leak():
    """1000 starts and stops of the worker, each joined (its OS thread gone from /proc), a frame
    answered after each tenth; a binding collected with its worker running joins it (its
    finalizer)."""
    import gc
    import os
    import time

    from framefuse.engines.hostpath import worker

    if worker() is None:
        pytest.skip("hostpath.c is not built here")
    _, resident = _cpu_sessions("min_gru")
    binding = resident._host_step
    frame = np.ones(binding.host_in[resident._single_in].shape, np.float32)
    state = binding._worker  # hostpath.CpuWorker

    def worker_thread() -> str:
        deadline = time.monotonic() + 5
        while not state.tid and time.monotonic() < deadline:
            time.sleep(0)  # the worker writes its id when it begins
        return f"/proc/{os.getpid()}/task/{state.tid}"

    seen = set()
    for i in range(1000):
        binding.start()
        assert binding.running
        if i % 10 == 0:
            resident.step(frame)
        if i % 100 == 0:
            seen.add(worker_thread())
            assert os.path.exists(worker_thread())
        binding.stop()
        assert not binding.running
    assert binding.starts == 1000 and len(seen) >= 1
    for path in seen:
        assert not os.path.exists(path)  # (a thread id is reused only after its thread is gone)
    resident.step(frame)  # running again; then the session and its binding go
    running = worker_thread()
    assert os.path.exists(running)
    del resident, binding
    gc.collect()
    assert not os.path.exists(running)


def test_a_resident_cpu_frame_left_unanswered_raises_after_the_deadline(monkeypatch):
    """A worker that cannot answer (here: stopped behind the binding's back) fails the frame after
    the binding's timeout, naming the frame, and the next frame starts the worker again."""
    from framefuse.engines import cpustep
    from framefuse.engines.base import EngineRunError
    from framefuse.engines.hostpath import worker

    if worker() is None:
        pytest.skip("hostpath.c is not built here")
    monkeypatch.setattr(cpustep, "WORKER_CHECK_POLLS", 1 << 10)
    plain, resident = _cpu_sessions("min_gru")
    binding = resident._host_step
    binding.timeout_s = 0.05
    frame = np.ones(binding.host_in[resident._single_in].shape, np.float32)
    np.testing.assert_array_equal(resident.step(frame), plain.step(frame))
    binding._stop_fn(binding._worker_ptr)  # the worker gone, the binding still thinks it runs
    with pytest.raises(EngineRunError, match=r"did not answer frame 2 within 0.05 s"):
        binding.launch()
        binding.wait_host()
    assert not binding.running
    resident.reset()
    plain.reset()
    np.testing.assert_array_equal(resident.step(frame), plain.step(frame))
    assert binding.running
    resident.close()
