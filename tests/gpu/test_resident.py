"""Resident mode on the GPU (Session(resident=True), engines.stepkernel.ResidentStepBinding): the
step kernel launched once and rung per frame gives what the launched kernel gives, frame for
frame and bit for bit, over every zoo architecture; the state calls, run() and device frames stop
it and the next frame starts it again; it starts and stops 1,000 times without a leak or a hang;
a frame that does not answer raises and stops it; a process killed while it runs leaves the GPU
usable.

The protocol itself (bell, go, idle and done words; state halves; counters) is also run on the
CPU under emulation and ThreadSanitizer: tests/test_compiler.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached

pytestmark = pytest.mark.gpu

SMALL = {"model": {"embed": 64, "layers": 2}, "seq": 4, "seed": 0}
FULL = {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0}  # the benchmark's zoo size


def _engine(prepared, select="stepkernel"):
    from framefuse.engines import cuda_graph

    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": select})
    assert engine.metadata["selection"]["chosen"] == select
    return engine


def _frames(prepared, n, seed=0):
    shape = prepared.manifest["inputs"][0]["shape"]
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def _stepped_with_a_restart(resident, frames):
    """A resident session's outputs over ``frames``, its kernel stopped half way (get_state) and
    started again by the next frame."""
    got = []
    for i, frame in enumerate(frames):
        if i == len(frames) // 2:
            resident.get_state()  # stops the kernel; the next frame starts it again
        got.append(resident.step(frame).copy())
    return np.stack(got)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_resident_matches_onnxruntime_over_chained_frames(arch):
    """Small and short (the sanitizers' target): 64 chained frames, then the state."""
    from test_stepkernel import _close, _rollout  # tests/gpu is on sys.path (pytest prepend mode)

    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, SMALL)["step"]
    frames = _frames(prepared, 64, seed=1)
    ref_y, ref_state = _rollout(prepared, frames)
    with Session(_engine(prepared), budget_ms=None, resident=True) as session:
        for i, frame in enumerate(frames):
            _close(session.step(frame), ref_y[i], f"y at frame {i}")
        state = session.get_state()
    for name, value in ref_state.items():
        _close(state[name], value, name)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_resident_equals_launched_bit_for_bit_over_10000_frames(arch):
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, FULL)["step"]
    engine = _engine(prepared)
    frames = _frames(prepared, 10_000)
    launched = Session(engine, budget_ms=None)
    expected = np.stack([launched.step(f).copy() for f in frames])
    expected_state = launched.get_state()
    with Session(engine, budget_ms=None, resident=True) as resident:
        got = np.stack([resident.step(f).copy() for f in frames])
        assert resident._host_step.running and resident._host_step.starts == 1  # one launch for every frame
        state = resident.get_state()  # stops the kernel
        assert not resident._host_step.running
    assert np.array_equal(got, expected, equal_nan=True), f"{arch}: max diff {np.nanmax(np.abs(got - expected))}"
    for name, value in expected_state.items():
        assert np.array_equal(state[name], value, equal_nan=True), name


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("arch", ["gru", "mamba"])
def test_write_combined_frames_equal_the_launched_step_bit_for_bit(monkeypatch, arch, path):
    """stepkernel.RESIDENT_WRITE_COMBINED_FRAMES: the frame's words and the bell in write-combined
    memory, fenced, on the native frame call and on the Python one (64-bit words, tag_words):
    2,000 chained frames bit for bit the launched kernel's, with a stop and a start half way (the
    bell's 0 and its stop go through the fence too)."""
    from framefuse.engines import stepkernel
    from framefuse.runtime.session import Session

    monkeypatch.setattr(stepkernel, "RESIDENT_WRITE_COMBINED_FRAMES", True)
    prepared = prepare_cached(arch, FULL)["step"]
    engine = _engine(prepared)
    frames = _frames(prepared, 2000)
    launched = Session(engine, budget_ms=None)
    expected = np.stack([launched.step(f).copy() for f in frames])
    with Session(engine, budget_ms=None, resident=True) as resident:
        binding = resident._host_step
        assert binding.write_combined and binding._tagged
        assert all(buffer.write_combined for buffer in [*binding._tagged.values(), binding._bell])
        if path == "python":
            resident._hot = None
        got = _stepped_with_a_restart(resident, frames)
        assert binding.starts == 2
    assert np.array_equal(got, expected, equal_nan=True), f"{arch}: max diff {np.nanmax(np.abs(got - expected))}"


@pytest.mark.parametrize("arch", ["gru", "mamba", "attention"])
def test_tagged_outputs_equal_the_plain_kernel_bit_for_bit(monkeypatch, arch):
    """codegen.TAGGED_OUTPUTS (session 61, off by default): the kernel writes each output as a word
    (epoch << 32) | bits and the host takes it once it carries the step's epoch, with no system
    fence and no done word for the blocks that only write outputs. 2,000 chained frames, launched
    and resident (a stop and a start half way), on the native frame call and on the Python one, bit
    for bit the plain kernel's launched outputs; the check_finite path (launch, then the stream
    sync), device frames (the words' floats copied out inside the graph) and the plan (device
    tensors: the words' low halves) too."""
    import torch

    from framefuse.compiler import codegen
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, FULL)["step"]
    frames = _frames(prepared, 2000)
    plain = Session(_engine(prepared), budget_ms=None)
    expected = np.stack([plain.step(f).copy() for f in frames])
    monkeypatch.setattr(codegen, "TAGGED_OUTPUTS", True)
    engine = _engine(prepared)
    kernel = engine.default_plan.compiled.kernel
    assert kernel.tagged_outputs and kernel.done_words >= 1
    for path in ("native", "python"):
        launched = Session(engine, budget_ms=None)
        assert launched._host_step.tagged_outputs
        if path == "python":
            launched._hot = None
        got = np.stack([launched.step(f).copy() for f in frames])
        diff = np.nanmax(np.abs(got - expected))
        assert np.array_equal(got, expected, equal_nan=True), f"{arch} launched, {path} path: max diff {diff}"
        with Session(engine, budget_ms=None, resident=True) as resident:
            if path == "python":
                resident._hot = None
            got = _stepped_with_a_restart(resident, frames)
            assert resident._host_step.starts == 2
        diff = np.nanmax(np.abs(got - expected))
        assert np.array_equal(got, expected, equal_nan=True), f"{arch} resident, {path} path: max diff {diff}"
    checked = Session(engine, budget_ms=None, check_finite=True)
    got = np.stack([checked.step(f).copy() for f in frames[:20]])
    assert np.array_equal(got, expected[:20], equal_nan=True), f"{arch} check_finite"
    on_device = Session(engine, budget_ms=None)  # device frames: the words unpacked by a graph node
    got = np.stack([on_device.step(torch.from_numpy(f).cuda()).cpu().numpy() for f in frames[:20]])
    assert np.array_equal(got.reshape(expected[:20].shape), expected[:20], equal_nan=True), f"{arch} device frames"
    # the plan over device tensors, from the zero state as a fresh session starts: its first step
    plan = engine.default_plan
    frame_name = prepared.manifest["inputs"][0]["name"]
    feeds = {n: torch.zeros(spec.shape, device="cuda") for n, spec in plan.input_specs.items()}
    feeds[frame_name] = torch.from_numpy(frames[0]).cuda()
    out = plan.execute(feeds)
    torch.cuda.synchronize()
    assert np.array_equal(out[kernel.output_names[0]].cpu().numpy().reshape(expected[0].shape), expected[0]), arch


@pytest.mark.parametrize("arch", ["gru", "attention"])
def test_tagged_outputs_small(monkeypatch, arch):
    """The sanitizers' target for tagged outputs (small, short): 20 frames launched and resident,
    with a stop half way, bit for bit the plain kernel's launched outputs."""
    from framefuse.compiler import codegen
    from framefuse.engines import stepkernel
    from framefuse.runtime.session import Session

    monkeypatch.setattr(stepkernel, "RESIDENT_TIMEOUT_S", 120.0)  # under compute-sanitizer
    prepared = prepare_cached(arch, SMALL)["step"]
    frames = _frames(prepared, 20)
    plain = Session(_engine(prepared), budget_ms=None)
    expected = np.stack([plain.step(f).copy() for f in frames])
    monkeypatch.setattr(codegen, "TAGGED_OUTPUTS", True)
    engine = _engine(prepared)
    assert engine.default_plan.compiled.kernel.tagged_outputs
    launched = Session(engine, budget_ms=None)
    got = np.stack([launched.step(f).copy() for f in frames])
    assert np.array_equal(got, expected, equal_nan=True), arch
    with Session(engine, budget_ms=None, resident=True) as resident:
        got = _stepped_with_a_restart(resident, frames)
    assert np.array_equal(got, expected, equal_nan=True), arch


@pytest.mark.parametrize("arch,sms", [("gru", None), ("mamba", None), ("attention", None), ("min_gru", 66)])
def test_resident_tagged_twin_equals_the_untagged_step_bit_for_bit(monkeypatch, arch, sms):
    """stepkernel.RESIDENT_TAGGED_OUTPUTS: the resident binding compiles the engine's schedule again
    with tagged outputs (its own CompiledStep, made once for the engine's and shared by its
    sessions; on fewer SMs, the rescheduled one with them) beside the engine's untagged launched
    kernel. 2,000 chained frames, a stop and a start half way, native and Python frame paths, two
    sessions one after the other on the same twin: bit for bit the untagged kernel's outputs
    (launched over the whole grid; resident untagged on fewer SMs, whose sums run in another
    order than the launched kernel's)."""
    from framefuse.engines import stepkernel
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, FULL)["step"]
    frames = _frames(prepared, 2000)
    engine = _engine(prepared)
    assert not engine.default_plan.compiled.kernel.tagged_outputs
    monkeypatch.setattr(stepkernel, "RESIDENT_TAGGED_OUTPUTS", False)
    if sms is None:
        plain = Session(engine, budget_ms=None)
        expected = np.stack([plain.step(f).copy() for f in frames])
    else:
        with Session(engine, budget_ms=None, resident=True, resident_sms=sms) as plain:
            assert not plain._host_step.tagged_outputs
            expected = np.stack([plain.step(f).copy() for f in frames])
    monkeypatch.setattr(stepkernel, "RESIDENT_TAGGED_OUTPUTS", True)
    twins = []
    for path in ("native", "python"):
        with Session(engine, budget_ms=None, resident=True, resident_sms=sms) as resident:
            binding = resident._host_step
            assert binding.tagged_outputs and binding.resident_kernel.tagged_outputs
            assert binding.compiled is not engine.default_plan.compiled and binding.plan is engine.default_plan
            twins.append(binding.compiled)
            if path == "python":
                resident._hot = None
            got = _stepped_with_a_restart(resident, frames)
        diff = np.nanmax(np.abs(got - expected))
        assert np.array_equal(got, expected, equal_nan=True), f"{arch} sms={sms}, {path} path: max diff {diff}"
    # one twin for the engine's compiled step; a rescheduled one per session (as before)
    assert (twins[0] is twins[1]) == (sms is None)


@pytest.mark.parametrize("arch,seq", [("gru", 1), ("lstm", 1), ("attention", 8), ("mamba", 32), ("lstm", 32)])
def test_resident_graph_without_state_matches_launched_and_onnxruntime(arch, seq):
    """A sequence-form window (no state: a length-1 window is what the real models are at T = 1)
    kept resident: each step is the whole graph on that frame. 2,000 frames (zeros, a NaN among
    them) bit for bit against the launched kernel, one launch for all; the first 16 but the NaN
    frame against ONNX Runtime on the original graph (its LSTM zeroes the state after a NaN)."""
    from test_stepkernel import _close, _rollout

    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, {**SMALL, "seq": seq})["sequence"]
    assert not prepared.state_names
    engine = _engine(prepared)
    frames = _frames(prepared, 2000, seed=3)
    frames[5] = 0.0
    frames[9].reshape(-1)[7] = np.nan
    launched = Session(engine, budget_ms=None, nonfinite="propagate")
    expected = np.stack([launched.step(f).copy() for f in frames])
    ref_y, _ = _rollout(prepared, frames[:16])
    with Session(engine, budget_ms=None, resident=True, nonfinite="propagate") as resident:
        got = np.stack([resident.step(f).copy() for f in frames])
        assert resident._host_step.running and resident._host_step.starts == 1
    for i in (i for i in range(16) if i != 9):
        _close(got[i], ref_y[i], f"{arch} T={seq} y at frame {i}")
    assert np.isnan(got[9]).any() and np.isfinite(got[10]).all()  # nothing carried past the NaN frame
    assert np.array_equal(got, expected, equal_nan=True), f"max diff {np.nanmax(np.abs(got - expected))}"


def _script(session, prepared, frames):
    """The same calls on a session; what each returned, and whether a resident kernel ran after it
    (two sessions of one engine share its flag and counter buffers: they run one after the other)."""
    import torch

    out, running = [], []
    binding = session._host_step

    def note(value):
        out.append(np.array(value.cpu().numpy() if hasattr(value, "cpu") else value, copy=True))
        running.append(getattr(binding, "running", None))

    for f in frames[:10]:
        note(session.step(f))
    snapshot = session.get_state()
    running.append(getattr(binding, "running", None))
    for f in frames[10:20]:
        note(session.step(f))
    session.set_state(snapshot)
    for f in frames[20:25]:
        note(session.step(f))
    session.reset()
    for f in frames[25:30]:
        note(session.step(f))
    note(session.step(torch.from_numpy(frames[30]).cuda()))  # a device frame: the launched kernel
    for f in frames[31:35]:
        note(session.step(f))
    result = session.run({prepared.manifest["inputs"][0]["name"]: frames[35]})  # a whole graph, zero state
    for name in sorted(result):
        note(result[name])
    for f in frames[35:40]:
        note(session.step(f))
    return out, running


def test_state_calls_run_and_device_frames_stop_it_and_the_next_frame_starts_it():
    from framefuse.runtime.session import Session

    prepared = prepare_cached("lstm", SMALL)["step"]
    engine = _engine(prepared)
    frames = _frames(prepared, 40)
    expected, _ = _script(Session(engine, budget_ms=None), prepared, frames)
    resident = Session(engine, budget_ms=None, resident=True)
    got, running = _script(resident, prepared, frames)
    resident.close()
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert np.array_equal(a, b), f"call {i}: resident and launched differ"
    # running after: 10 frames; get_state (stopped); 10 + 5 + 5 frames (set_state and reset stop it
    # before them); the device frame (stopped); 4 frames; run()'s outputs (stopped); 5 frames
    runs = len(running) - 41
    assert runs >= 1
    assert running == [True] * 10 + [False] + [True] * 20 + [False] + [True] * 4 + [False] * runs + [True] * 5
    assert resident._host_step.starts == 6
    # with the checks on, each frame stops it (the checks read the state on the device)
    launched = Session(engine, budget_ms=None)
    a = launched.step(frames[0]).copy()
    with Session(engine, budget_ms=None, resident=True, check_finite=True) as checked:
        assert np.array_equal(checked.step(frames[0]), a)
        assert not checked._host_step.running


def test_starts_and_stops_1000_times_without_a_leak_or_a_hang():
    import torch

    from framefuse.runtime.session import Session

    prepared = prepare_cached("min_gru", SMALL)["step"]
    engine = _engine(prepared)
    frames = _frames(prepared, 8)
    launched = Session(engine, budget_ms=None)
    resident = Session(engine, budget_ms=None, resident=True)
    for f in frames:  # the kernels are loaded, the allocator warm
        resident.step(f)
    resident.close()
    resident.reset()
    torch.cuda.synchronize()
    memory = torch.cuda.memory_allocated()
    for i in range(1000):
        a = launched.step(frames[i % 8]).copy()
        b = resident.step(frames[i % 8]).copy()
        assert np.array_equal(a, b), f"start {i}"
        resident.close()
    assert resident._host_step.starts == 1001
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == memory


@pytest.mark.parametrize("path", ["native", "python"])
def test_a_frame_that_never_answers_raises_and_stops_the_kernel(path):
    """The watchdog, on the frame path Session.step takes (engines/hostpath.c's call, which hands
    a long wait back to wait_host) and on the Python one. The answer is lost on its way: the host
    watches done words the kernel never writes (the kernel computes the frame and goes idle). An
    answer the host waits for under another epoch would also tag the frame with it, and with
    tagged frames (codegen.RESIDENT_TAGGED_FRAMES) the kernel would wait for that frame instead."""
    import ctypes

    from framefuse.engines.base import EngineRunError
    from framefuse.runtime.session import Session

    prepared = prepare_cached("gru", SMALL)["step"]
    engine = _engine(prepared)
    frames = _frames(prepared, 4)
    resident = Session(engine, budget_ms=None, resident=True)
    binding = resident._host_step
    resident.step(frames[0])
    binding.timeout_s = 0.2
    if path == "native":
        assert resident._hot is not None
    else:
        resident._hot = None
    real = binding._done_addr, binding._done_words
    lost = np.zeros(len(real[1]), dtype=np.uint32)
    binding._done_addr = lost.ctypes.data
    binding._done_words = [ctypes.c_uint32.from_address(lost.ctypes.data + 4 * i) for i in range(lost.size)]
    binding._point_done_words()
    with pytest.raises(EngineRunError, match="did not answer frame 2 within 0.2 s"):
        resident.step(frames[1])
    binding._done_addr, binding._done_words = real
    binding._point_done_words()
    assert not binding.running  # the watchdog rang the stop and the kernel left
    launched = Session(engine, budget_ms=None)
    launched.set_state(resident.get_state())
    assert np.array_equal(resident.step(frames[2]), launched.step(frames[2]))  # it starts again
    resident.close()


def test_a_process_killed_while_the_kernel_is_resident_leaves_the_gpu_usable(tmp_path):
    prepared = prepare_cached("min_gru", SMALL)["step"]
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from framefuse.engines import cuda_graph
        from framefuse.runtime.session import Session
        engine = cuda_graph.build({str(prepared.fused)!r}, device="cuda", options={{"select": "stepkernel"}})
        s = Session(engine, budget_ms=None, resident=True)
        shape = s.engine.input_specs[s.frame_inputs[0]].shape
        for _ in range(10):
            s.step(np.ones(shape, dtype=np.float32))
        print("resident", s._host_step.running, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "resident True" in result.stdout, result.stderr[-2000:]
    assert result.returncode == -9
    # the GPU is usable: a new process builds and steps a launched and a resident session
    check = textwrap.dedent(
        f"""
        import numpy as np
        from framefuse.engines import cuda_graph
        from framefuse.runtime.session import Session
        engine = cuda_graph.build({str(prepared.fused)!r}, device="cuda", options={{"select": "stepkernel"}})
        shape = engine.input_specs[[n for n in engine.input_specs if not n.startswith("state.")][0]].shape
        frame = np.ones(shape, dtype=np.float32)
        a = Session(engine, budget_ms=None).step(frame).copy()
        with Session(engine, budget_ms=None, resident=True) as s:
            b = s.step(frame).copy()
        print("same", bool(np.array_equal(a, b)), flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert "same True" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("case", ["item-warm", "new-kernel-no-alloc", "cummax", "alloc"])
def test_gpu_work_beside_a_resident_kernel_on_fewer_sms_finishes(case):
    """What session 58 measured to finish beside a resident kernel on 16 SMs under
    CUDA_MODULE_LOADING=EAGER, each in a process of its own (bench/microbench/resident_first_kernel.py
    --case): a sum read back with .item() that ran once before the session started (the warning's
    remedy), a torch kernel never run before into memory allocated before, torch.cummax, a new
    256 MB allocation. (The process's first torch.sum waits until the session stops, under eager
    loading too, and under the default lazy loading any kernel's first launch may: the session
    warns.)"""
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "microbench" / "resident_first_kernel.py"
    env = {**os.environ, "CUDA_MODULE_LOADING": "EAGER"}  # as measured
    result = subprocess.run(
        [sys.executable, str(script), "--wait", "30", "--case", case],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert f"case {case}:" in result.stdout and "finished in" in result.stdout, result.stdout + result.stderr[-2000:]
    assert result.returncode == 0


def test_resident_blocks_report_the_sm_each_ran_on():
    """Every block writes %smid into the control words at launch (ResidentStepBinding.block_sms,
    read once the kernel has stopped): one block a distinct SM (the ids need not be contiguous,
    PTX's %nsmid may exceed the SM count), and block_sms() refuses while the kernel runs."""
    from framefuse.engines.base import EngineRunError
    from framefuse.runtime.session import Session

    prepared = prepare_cached("min_gru", SMALL)["step"]
    frames = _frames(prepared, 4)
    with Session(_engine(prepared), budget_ms=None, resident=True) as session:
        session.step(frames[0])
        binding = session._host_step
        with pytest.raises(EngineRunError, match="once it has stopped"):
            binding.block_sms()
        session.close()
        sms = binding.block_sms()
    grid = binding.compiled.grid
    assert len(sms) == grid and len(set(sms)) == grid and min(sms) >= 0


def test_resident_frame_reads_count_every_frame(monkeypatch):
    """codegen.RESIDENT_POLL_COUNTS: the frame blocks' thread 0 count each frame into one bin of the
    control words by the reads of host memory it took (ResidentStepBinding.frame_reads, after the
    stop): 50 frames, every one counted (a positive multiple of 50: one count a frame block), at
    least one read each; a kernel generated without the setting refuses to report."""
    from framefuse.compiler import codegen
    from framefuse.engines.base import EngineRunError
    from framefuse.runtime.session import Session

    prepared = prepare_cached("min_gru", SMALL)["step"]
    frames = _frames(prepared, 50)
    monkeypatch.setattr(codegen, "RESIDENT_POLL_COUNTS", True)
    engine = _engine(prepared)
    # (a compiled step may be shared through the build's cache: its resident kernel generated anew)
    engine.default_plan.compiled.forget_resident()
    with Session(engine, budget_ms=None, resident=True) as session:
        for frame in frames:
            session.step(frame)
        binding = session._host_step
        with pytest.raises(EngineRunError, match="once it has stopped"):
            binding.frame_reads()
        session.close()
        reads = binding.frame_reads()
    assert len(reads) == 8 and sum(reads) > 0 and sum(reads) % len(frames) == 0, reads
    monkeypatch.setattr(codegen, "RESIDENT_POLL_COUNTS", False)
    engine.default_plan.compiled.forget_resident()
    with Session(engine, budget_ms=None, resident=True) as session:
        session.step(frames[0])
        session.close()
        with pytest.raises(EngineRunError, match="without codegen.RESIDENT_POLL_COUNTS"):
            session._host_step.frame_reads()


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize(
    "arch,size,each",
    [
        ("min_gru", "full", 1),
        ("gru", "full", 1),
        ("mamba", "full", 1),
        ("min_gru", "small", 1),
        ("mamba", "small", 1),
        ("min_gru", "full", 2),
        ("min_gru", "small", 2),
    ],
)
def test_framer_replicas_equal_the_launched_step_bit_for_bit(monkeypatch, arch, size, each, path):
    """codegen.RESIDENT_FRAMER_REPLICAS (on since session 72): the frame block and its replica on a free block, each
    polling its own copy of the frame's words, the words double-buffered by frame (the native frame
    call's tag_flip, the Python path's tag_words into the frame's half): chained frames bit for bit
    the launched kernel's, with a stop and a start after an odd number of frames (the host's and the
    kernel's frame parity both start again at 0), and the state after them. Small: 43 frames, the
    sanitizers' case; full: 1,999 at the benchmark's size. ``each``: replicas a frame block
    (codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK; 2: three copies of the words)."""
    from framefuse.compiler import codegen
    from framefuse.runtime.session import Session

    monkeypatch.setattr(codegen, "RESIDENT_FRAMER_REPLICAS", True)
    monkeypatch.setattr(codegen, "RESIDENT_REPLICAS_PER_FRAME_BLOCK", each)
    prepared = prepare_cached(arch, FULL if size == "full" else SMALL)["step"]
    engine = _engine(prepared)
    compiled = engine.default_plan.compiled
    frames = _frames(prepared, 1999 if size == "full" else 43)
    launched = Session(engine, budget_ms=None)
    expected = np.stack([launched.step(f).copy() for f in frames])
    expected_state = launched.get_state()
    # (a compiled step may be shared through the build's cache: its resident kernel generated anew,
    # and again after the test so that no other test gets this one)
    compiled.forget_resident()
    try:
        with Session(engine, budget_ms=None, resident=True) as resident:
            binding = resident._host_step
            assert binding.resident_kernel.frame_copies == 1 + each and binding._hs.tag_flip == 1
            assert binding._hs.tag_inputs == (1 + each) * len(binding.resident_kernel.input_names)
            if path == "python":
                resident._hot = None
            got = _stepped_with_a_restart(resident, frames)
            assert binding.starts == 2
            state = resident.get_state()
    finally:
        compiled.forget_resident()
    assert np.array_equal(got, expected, equal_nan=True), f"{arch}: max diff {np.nanmax(np.abs(got - expected))}"
    for name, value in expected_state.items():
        assert np.array_equal(state[name], value, equal_nan=True), name


def test_resident_needs_the_step_kernel():
    from framefuse.engines import cuda_graph
    from framefuse.engines.base import EngineBuildError
    from framefuse.runtime.session import Session, SessionError

    prepared = prepare_cached("gru", SMALL)["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "plan"})
    with pytest.raises((EngineBuildError, SessionError), match="step compiler's kernel"):
        Session(engine, budget_ms=None, resident=True)


@pytest.mark.parametrize(
    "arch, select",
    [("min_gru", "stepkernel"), ("attention", "stepkernel-384-threads-fewer-phases"), ("xlstm", "stepkernel-paced")],
)
def test_resident_on_fewer_sms_matches_onnxruntime_and_leaves_the_rest_free(arch, select):
    """resident_sms=16: the program scheduled again over 16 blocks with the build's tactic (its
    threads and code settings; its own kernel and buffers, the session's state); torch's kernels
    run on the other SMs while it is resident."""
    import torch
    from test_stepkernel import _close, _rollout

    from framefuse.compiler.codegen import CodeSettings
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, SMALL)["step"]
    frames = _frames(prepared, 64, seed=2)
    ref_y, ref_state = _rollout(prepared, frames)
    # the torch work run beside it, run once first: the process's first torch.sum waits for a
    # resident kernel until the session stops (this test hung when run alone in a fresh process,
    # session 57; measured in session 58), and the session warns
    assert float(torch.ones(1 << 20, device="cuda").sum().item()) == float(1 << 20)
    engine = _engine(prepared, select)
    with pytest.warns(RuntimeWarning, match="resident_sms=16: .*first time beside a resident step kernel"):
        session = Session(engine, budget_ms=None, resident=True, resident_sms=16)
    with session:
        binding = session._host_step
        assert binding.compiled.grid == 16 and binding.compiled is not binding.plan.compiled
        assert binding.compiled.threads == binding.plan.compiled.threads
        # the same code settings, but for tagged outputs (stepkernel.RESIDENT_TAGGED_OUTPUTS)
        same = CodeSettings.of(binding.compiled.settings, tagged_outputs=binding.plan.compiled.settings.tagged_outputs)
        assert same == binding.plan.compiled.settings
        for i, frame in enumerate(frames):
            _close(session.step(frame), ref_y[i], f"y at frame {i}")
            if i == 10:  # resident now: a torch kernel on the default stream finishes beside it
                assert binding.running
                assert float(torch.ones(1 << 20, device="cuda").sum().item()) == float(1 << 20)
                assert binding.running
        state = session.get_state()
    for name, value in ref_state.items():
        _close(state[name], value, name)


def test_sessions_created_and_dropped_leave_no_kernel_running():
    """A resident session dropped without close(): its finalizer rings the stop and releases its
    stream, so a hundred of them leave the GPU free (a launched step then runs)."""
    import gc

    from framefuse.runtime.session import Session

    prepared = prepare_cached("min_gru", SMALL)["step"]
    engine = _engine(prepared)
    frames = _frames(prepared, 2)
    expected = Session(engine, budget_ms=None).step(frames[0]).copy()
    for _ in range(100):
        session = Session(engine, budget_ms=None, resident=True)
        assert np.array_equal(session.step(frames[0]), expected)
        session = None
        gc.collect()
    assert np.array_equal(Session(engine, budget_ms=None).step(frames[0]), expected)
