"""The step compiler's kernel on the GPU against ONNX Runtime on the original graph: every zoo
architecture over chained steps, batch > 1, odd sizes, NaN frames, zero state, and the Session
API (reset / get_state / set_state) over the double-buffered state.

bench/stepkernel.py runs the benchmark configuration (embed 256, 1000 chained steps) and times it.
"""

from __future__ import annotations

import numpy as np
import pytest

from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached

pytestmark = pytest.mark.gpu

ARCHS = ARCHITECTURES  # every zoo architecture
SMALL = {"model": {"embed": 64, "layers": 2}, "seq": 4, "seed": 0}
TOL = 1e-4


def _session(prepared, select="stepkernel", **kwargs):
    from framefuse.engines import cuda_graph
    from framefuse.runtime.session import Session

    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": select})
    assert engine.metadata["selection"]["chosen"] == select
    return Session(engine, budget_ms=None, **kwargs)


def _ort(prepared):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(prepared.onnx), providers=["CPUExecutionProvider"])
    return sess


def _rollout(prepared, frames, state=None):
    sess = _ort(prepared)
    manifest = prepared.manifest
    shapes = {i["name"]: i["shape"] for i in manifest["inputs"]}
    names = prepared.state_names
    state = dict(state) if state is not None else {}
    for n in names:
        state.setdefault(f"state.{n}", np.zeros(shapes[f"state.{n}"], dtype=np.float32))
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    ys = []
    for frame in frames:
        result = sess.run([out_name] + [f"next_state.{n}" for n in names], {in_name: frame, **state})
        ys.append(result[0])
        state = {f"state.{n}": v for n, v in zip(names, result[1:])}
    return np.stack(ys), state


def _close(actual, expected, what):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, what
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), f"{what}: NaN positions differ"
    finite = np.isfinite(expected)
    assert np.array_equal(actual[~finite], expected[~finite], equal_nan=True), f"{what}: Inf differs"
    err = np.abs(actual[finite] - expected[finite]) / (1 + np.abs(expected[finite]))
    assert err.size == 0 or err.max() <= TOL, f"{what}: max rel diff {err.max():.3g}"


def _check(prepared, frames, select="stepkernel"):
    session = _session(prepared, select)
    ref_y, ref_state = _rollout(prepared, frames)
    for i, frame in enumerate(frames):
        _close(session.step(frame), ref_y[i], f"y at step {i}")
    state = session.get_state()
    for name, value in ref_state.items():
        _close(state[name], value, name)
    return session


@pytest.mark.parametrize("arch", ARCHS)
def test_stepkernel_matches_onnxruntime_over_chained_steps(arch):
    prepared = prepare_cached(arch, SMALL)["step"]
    frames = np.random.default_rng(1).standard_normal((200, *prepared.input_shapes()["x"])).astype(np.float32)
    _check(prepared, frames)


@pytest.mark.parametrize(
    "arch,tactic",
    [(a, "stepkernel-pieces") for a in ARCHS]
    + [(a, "stepkernel-fewer-blocks") for a in ("attention", "lstm", "mamba", "xlstm", "delta_net")]
    + [(a, "stepkernel-384-threads") for a in ARCHS]
    + [(a, "stepkernel-paced") for a in ARCHS]
    + [(a, "stepkernel-unframed") for a in ARCHS]
    + [(a, "stepkernel-views") for a in ARCHS]
    + [(a, t) for a in ARCHS for t in ("stepkernel-fewer-phases", "stepkernel-384-threads-fewer-phases")]
    + [
        (a, t)
        for a in ("attention", "delta_net", "gated_ssm", "jamba", "mamba", "xlstm")  # where the schedule changes
        for t in ("stepkernel-fewer-levels",)
    ]
    + [
        (a, t) for a in ("attention", "jamba") for t in ("stepkernel-replica-cap", "stepkernel-384-threads-replica-cap")
    ],
)
def test_stepkernel_tactics_match_onnxruntime(arch, tactic):
    """The build's step-kernel tactics at the benchmark's size (where copies are long enough to be
    cut): stepkernel-pieces (long prefetch copies in pieces, one a warp) and
    stepkernel-fewer-blocks (3/4 of the SMs), stepkernel-384-threads (blocks of 384 threads: 12
    warps, not a power of two), 200 chained steps against ONNX Runtime."""
    import torch

    from framefuse.engines.fusion import STEPKERNELS

    prepared = prepare_cached(arch, {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0})["step"]
    frames = np.random.default_rng(4).standard_normal((200, *prepared.input_shapes()["x"])).astype(np.float32)
    session = _check(prepared, frames, select=tactic)
    kernel = session.engine.metadata["selection"]["stepkernel"]
    assert kernel["copy_pieces"] == STEPKERNELS[tactic]["copy_pieces"]
    assert kernel["paced_copies"] == STEPKERNELS[tactic].get("paced_copies", False)
    assert kernel["alias_views"] == STEPKERNELS[tactic].get("alias_views", False)
    assert kernel["one_pass"] == STEPKERNELS[tactic].get("one_pass", False)
    assert kernel["recomputed_scalars"] == STEPKERNELS[tactic].get("recomputed_scalars", 1)
    assert kernel["replicated_dot_macs"] == STEPKERNELS[tactic].get("replicated_dot_macs", 0)
    assert kernel["x_in_registers"] == STEPKERNELS[tactic].get("x_in_registers", False)
    if not STEPKERNELS[tactic].get("compose_input", True):
        assert not kernel["framed"]  # the frame's in-projection a task of its own
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert kernel["grid"] == round(sms * STEPKERNELS[tactic].get("grid_fraction", 1.0))


FULL = {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0}  # the benchmark's zoo size


@pytest.mark.parametrize("weight_format", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("arch", [*ARCHS, "lstm/sequence", "mamba/sequence", "attention/sequence"])
def test_narrow_weight_kernel_matches_the_interpreter_on_the_rows_it_reads(arch, weight_format):
    """The products' weight rows stored as fp16 / bf16 and widened as they are read, or as int8
    with a scale a row (codegen.WEIGHT_FORMATS), at the benchmark's size (embed 256, 2 layers, a block per SM; three
    windows of 4 frames too): from
    zero state a random, a random, an all-zero and a NaN frame, each against the float64
    interpreter computing with the rows the kernel reads (Kernel.dot_rows), and, before the NaN,
    within the format's tolerance (config.PRECISION_TOLERANCE) of the fp32 interpreter."""
    import torch

    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.engine import CompiledStep
    from framefuse.config import PRECISION_TOLERANCE
    from framefuse.engines.stepkernel import StepKernelPlan

    arch, _, form = arch.partition("/")
    program = lower_program(prepare_cached(arch, FULL)[form or "step"].fused)
    compiled = CompiledStep(program, device=torch.device("cuda"), weight_format=weight_format)
    assert compiled.kernel.layout.narrow, "no product reads narrow rows"
    rows = compiled.kernel.dot_rows()
    plan = StepKernelPlan.of(compiled)
    for step, feeds, expected in _edge_frames_from_zero_state(plan, program, 3, weight_format, dot_rows=rows):
        if step < 3:  # before the NaN frame
            wide = naive.run(program, feeds)
            for name, value in wide.items():
                err = np.abs(expected[name].astype(np.float64) - value) / (1 + np.abs(value))
                assert err.max() <= PRECISION_TOLERANCE[weight_format], (step, name, err.max())


def _edge_frames_from_zero_state(plan, program, seed, label, dot_rows=None):
    """A step-kernel plan of ``program`` (one graph input) from zero state over a random, a random,
    an all-zero and a NaN frame, each step's outputs against the float64 interpreter (computing
    with ``dot_rows`` where given), the state carried from the interpreter's; yields (step, feeds,
    expected) after each step's check."""
    import torch

    from framefuse.compiler import naive

    rng = np.random.default_rng(seed)
    (x_name,) = program.inputs
    shape = program.inputs[x_name].shape
    nan = rng.standard_normal(shape).astype(np.float32)
    nan.reshape(-1)[nan.size // 3] = np.nan
    frames = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)] + [np.zeros(shape, np.float32), nan]
    state = {n: np.zeros(leaf.shape, np.float32) for n, leaf in program.states.items()}
    for step, frame in enumerate(frames):
        feeds = {x_name: frame, **state}
        expected = naive.run(program, feeds, dot_rows=dot_rows)
        outputs = plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
        torch.cuda.synchronize()
        for name, value in expected.items():
            _close(outputs[name].cpu().numpy(), value, f"{label} step {step} {name}")
        yield step, feeds, expected
        state = {n: expected[program.state_of[n]] for n in program.states}


@pytest.mark.parametrize(
    "arch,grid,levels",
    [(a, 16, False) for a in ("min_gru", "lstm", "attention", "mamba", "jamba", "delta_net")]
    + [(a, 132, True) for a in ("mamba", "jamba", "delta_net")],
)
def test_products_with_x_in_registers_match_the_interpreter(arch, grid, levels):
    """A warp's rows of a long product that all read one x row, x held in registers
    (codegen.DOT_X_IN_REGISTERS, off: measured slower, session 58; ffk_load_x / ffk_warp_dot_x), at
    the benchmark's size (embed 256): on 16 blocks (a small GPU's share of rows: every product of
    256 or more has several rows a warp) and on the H100's 132 blocks scheduled as
    stepkernel-fewer-levels (the replicated x_proj, 48 rows of 512 a block); from zero state a
    random, a random, an all-zero and a NaN frame against the float64 interpreter. (Session 58 ran
    it for every zoo architecture on 16 blocks: all passed.)"""
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.fusion import FEWER_LEVELS
    from framefuse.engines.stepkernel import StepKernelPlan

    program = lower_program(prepare_cached(arch, FULL)["step"].fused)
    tactic = {**FEWER_LEVELS, "x_in_registers": True} if levels else {"x_in_registers": True}
    compiled = CompiledStep(program, device=torch.device("cuda"), grid=grid, **tactic)
    assert "ffk_warp_dot_x<" in compiled.kernel.source, f"{arch}: no product with its x in registers on {grid} blocks"
    plan = StepKernelPlan.of(compiled)
    assert len(list(_edge_frames_from_zero_state(plan, program, 5, f"{arch} {grid} blocks"))) == 4


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("arch", ["min_gru", "lstm", "gru", "liquid", "mamba", "attention"])
def test_a_precision_graphs_kernel_with_lossless_rows_matches_the_interpreter(arch, precision):
    """A precision build's step kernel (engines.fusion.PRECISION_ROWS) at the benchmark's size:
    the converted graph lowered with its weights as stored (widened storage for fp16 / bf16), the
    rows the format stores exactly read narrow: over a random, an all-zero and a NaN frame it
    matches the float64 interpreter on the program's own rows (the rows it reads are those)."""
    import onnx
    import torch

    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.precision import convert_model

    prepared = prepare_cached(arch, FULL)["step"]
    model = convert_model(onnx.load(str(prepared.fused)), precision, config=prepared.manifest["config"])
    program = lower_program(model, widen_storage=precision != "int8")
    compiled = CompiledStep(program, device=torch.device("cuda"), weight_format=precision, lossless_rows=True)
    assert compiled.kernel.layout.narrow, "no product reads narrow rows"
    plan = StepKernelPlan.of(compiled)
    rng = np.random.default_rng(7)
    (x_name,) = program.inputs
    shape = program.inputs[x_name].shape
    nan = rng.standard_normal(shape).astype(np.float32)
    nan.reshape(-1)[nan.size // 2] = np.nan
    state = {n: np.zeros(leaf.shape, np.float32) for n, leaf in program.states.items()}
    for step, frame in enumerate([rng.standard_normal(shape).astype(np.float32), np.zeros(shape, np.float32), nan]):
        feeds = {x_name: frame, **state}
        expected = naive.run(program, feeds)
        outputs = plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
        torch.cuda.synchronize()
        for name, value in expected.items():
            _close(outputs[name].cpu().numpy(), value, f"{precision} step {step} {name}")
        state = {n: expected[program.state_of[n]] for n in program.states}


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("arch", ["min_gru", "mamba"])
def test_a_precision_build_on_the_gpu(arch, precision, tmp_path):
    """`framefuse build --precision P` of the cuda-graph engine on a GPU (issue 19 item 4): the
    selection times the converted graph's step kernels with float32 and with P rows ("@P") and
    the fp32 graph's as references, reports how the choice compares with them (vs_fp32), passes
    the parity gate against ONNX Runtime on the original graph at P's tolerance, and a load
    compiles the same kernel; the session's steps stay within P's tolerance of ONNX Runtime."""
    import shutil

    from framefuse.build import build_engine
    from framefuse.config import PRECISION_TOLERANCE
    from framefuse.engines import cuda_graph, fusion
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, FULL)["step"]
    folder = tmp_path / f"{arch}-step"
    folder.mkdir()
    for name in ("model.onnx", "model.fused.onnx", "manifest.json"):
        shutil.copy(prepared.directory / name, folder / name)
    built = build_engine(folder, engine="cuda-graph", precision=precision, device="cuda", out=folder, check=True)
    selection = built.runner.metadata["selection"]
    candidates = selection["candidates"]
    assert any(name.endswith(f"@{precision}") and "us_per_step" in entry for name, entry in candidates.items()), (
        candidates
    )
    assert candidates[fusion.FP32_REFERENCE + "stepkernel"]["reference"]
    assert "us_per_step" in candidates[fusion.FP32_REFERENCE + "stepkernel"]
    assert set(selection["vs_fp32"]) == {
        "precision",
        "chosen",
        "us_per_step",
        "fp32_reference",
        "fp32_us_per_step",
        "slower",
    }
    tactic, rows = fusion.split_candidate(selection["chosen"])
    if tactic in fusion.STEPKERNELS:
        assert selection["stepkernel"]["weight_format"] == rows and rows in ("fp32", precision)
    loaded = cuda_graph.load(folder / "engine.ffe")
    assert loaded.precision == precision and loaded.metadata["selection"]["chosen"] == selection["chosen"]
    if tactic in fusion.STEPKERNELS:
        assert loaded.default_plan.compiled.kernel.digest == built.runner.default_plan.compiled.kernel.digest
    # every step from ONNX Runtime's state (as the accuracy gate steps): within P's tolerance, norm-wise
    session = Session(loaded, budget_ms=None)
    frames = np.random.default_rng(8).standard_normal((50, *prepared.input_shapes()["x"])).astype(np.float32)
    state = None
    tol = PRECISION_TOLERANCE[precision]
    for i, frame in enumerate(frames):
        ref_y, next_state = _rollout(prepared, frame[None], state)
        if state is not None:
            session.set_state(state)
        y = np.asarray(session.step(frame), np.float64)
        err = np.abs(y - ref_y[0]).max() / (1 + np.abs(ref_y[0]).max())
        assert err <= tol, (i, err)
        state = next_state


@pytest.mark.parametrize("arch", ["min_gru", "lstm", "attention", "mamba", "delta_net"])
def test_stepkernel_batch_of_three(arch):
    prepared = prepare_cached(arch, {**SMALL, "batch": 3})["step"]
    frames = np.random.default_rng(2).standard_normal((50, *prepared.input_shapes()["x"])).astype(np.float32)
    _check(prepared, frames)


@pytest.mark.parametrize("arch", ["min_gru", "gru", "mamba", "xlstm"])
def test_stepkernel_odd_sizes(arch):
    config = {"model": {"embed": 48, "layers": 3}, "in_features": 17, "out_features": 5, "seq": 4, "seed": 3}
    if arch == "xlstm":
        config["model"]["embed"] = 64
    prepared = prepare_cached(arch, config)["step"]
    frames = np.random.default_rng(3).standard_normal((50, *prepared.input_shapes()["x"])).astype(np.float32)
    _check(prepared, frames)


@pytest.mark.parametrize("arch", ["min_gru", "gru", "lstm", "attention", "mamba", "xlstm"])
def test_stepkernel_nan_and_inf_frames_propagate_as_the_reference(arch):
    """NaN and Inf travel as the IR's reference interpreter says (torch semantics: a NaN frame
    poisons the recurrent state). ONNX Runtime's LSTM clamps NaN out of its state instead, so the
    reference here is the interpreter, checked against ONNX Runtime on finite inputs elsewhere."""
    from framefuse.compiler import lower_program, naive

    prepared = prepare_cached(arch, SMALL)["step"]
    frames = np.random.default_rng(4).standard_normal((6, *prepared.input_shapes()["x"])).astype(np.float32)
    frames[2, 0, 3] = np.nan
    frames[4, 0, 1] = np.inf
    program = lower_program(prepared.fused)
    state = {n: np.zeros(leaf.shape, np.float32) for n, leaf in program.states.items()}
    session = _session(prepared, nonfinite="propagate")  # the session refuses such frames by default
    for i, frame in enumerate(frames):
        expected = naive.run(program, {"x": frame, **state})
        state = {s: expected[program.state_of[s]] for s in program.states}
        y = session.step(frame)
        assert np.array_equal(np.isnan(y), np.isnan(expected["y"])), f"NaN pattern at step {i}"
        finite = np.isfinite(expected["y"])
        np.testing.assert_allclose(y[finite], expected["y"][finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["lstm", "gru", "attention", "mamba", "xlstm", "liquid"])
def test_fast_math_kernel_agrees_with_the_exact_math_kernel(arch):
    """The step kernel ships with approximate division, square root and exp and denormals flushed
    (engine.FAST_MATH); the same source compiled with exact IEEE math gives the same outputs within
    1e-5 over 100 chained steps at the benchmark's size, and the kernel's description names the
    options."""
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import EXACT_MATH_OPTIONS, FAST_MATH_OPTIONS, CompiledStep
    from framefuse.engines.stepkernel import StepKernelPlan

    prepared = prepare_cached(arch, {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0})["step"]
    program = lower_program(prepared.fused)
    runs = {}
    for fast in (True, False):
        compiled = CompiledStep(program, device=torch.device("cuda"), fast_math=fast)
        assert compiled.describe()["nvrtc_options"] == list(FAST_MATH_OPTIONS if fast else EXACT_MATH_OPTIONS)
        plan = StepKernelPlan.of(compiled)
        rng = np.random.default_rng(6)
        state = {n: torch.zeros(leaf.shape, device="cuda") for n, leaf in program.states.items()}
        ys = []
        for _ in range(100):
            x = torch.from_numpy(rng.standard_normal(program.inputs["x"].shape).astype(np.float32)).cuda()
            out = plan.execute({"x": x, **state})
            ys.append(out["y"].cpu().numpy().copy())
            state = {s: out[program.state_of[s]].clone() for s in program.states}
        runs[fast] = np.stack(ys)
    err = np.abs(runs[True] - runs[False]) / (1 + np.abs(runs[False]))
    assert err.max() <= 1e-5, f"{arch}: fast-math kernel differs by {err.max():.3g}"


def test_exact_math_build_compiles_the_step_kernel_with_ieee_math(tmp_path):
    """cuda_graph.build(options={"exact_math": True}) (`framefuse build --exact-math`): the chosen
    step kernel is compiled with exact IEEE math, and a load of the artifact compiles it so again."""
    from framefuse.compiler.engine import EXACT_MATH_OPTIONS
    from framefuse.engines import cuda_graph

    prepared = prepare_cached("lstm", SMALL)["step"]
    engine = cuda_graph.build(
        prepared.fused, device="cuda", out=tmp_path, options={"select": "stepkernel", "exact_math": True}
    )
    assert engine.default_plan.compiled.describe()["nvrtc_options"] == list(EXACT_MATH_OPTIONS)
    loaded = cuda_graph.load(tmp_path / "engine.ffe", check_source=False)
    assert loaded.default_plan.compiled.describe()["nvrtc_options"] == list(EXACT_MATH_OPTIONS)


def test_stepkernel_state_api_reset_get_set():
    prepared = prepare_cached("gru", SMALL)["step"]
    frames = np.random.default_rng(5).standard_normal((20, *prepared.input_shapes()["x"])).astype(np.float32)
    session = _session(prepared)
    first = [session.step(f).copy() for f in frames[:5]]
    saved = session.get_state()
    later = [session.step(f).copy() for f in frames[5:10]]
    session.reset()  # zero state: the same outputs as a fresh session
    again = [session.step(f).copy() for f in frames[:5]]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    session.set_state(saved)  # back to the saved state: the same continuation
    for a, f in zip(later, frames[5:10]):
        np.testing.assert_array_equal(session.step(f), a)


@pytest.mark.skipif(
    bool(__import__("os").environ.get("CUDA_INJECTION64_PATH")),
    reason="torch.profiler (CUPTI) cannot subscribe under compute-sanitizer",
)
def test_stepkernel_is_one_kernel_per_step():
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    prepared = prepare_cached("min_gru", SMALL)["step"]
    session = _session(prepared)
    frame = np.zeros(prepared.input_shapes()["x"], dtype=np.float32)
    session.step(frame)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            session.step(frame)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    if not events:  # CUPTI could not subscribe (another tool holds it, e.g. compute-sanitizer)
        pytest.skip("torch.profiler recorded no CUDA activity here: kernels per step not measurable")
    kernels = [e for e in events if "ffk_step" in e.name]
    others = [e.name for e in events if "ffk_step" not in e.name]
    assert len(kernels) == 10 and not others, others[:5]


def test_stepkernel_artifact_round_trip(tmp_path):
    """build --select stepkernel writes engine.ffe recording the kernel (source hash, GPU,
    schedule); a load compiles the same source again and steps the same outputs."""
    from framefuse.engines import cuda_graph
    from framefuse.runtime.session import Session

    prepared = prepare_cached("lstm", SMALL)["step"]
    built = cuda_graph.build(prepared.fused, device="cuda", out=tmp_path, options={"select": "stepkernel"})
    recorded = built.metadata["selection"]["stepkernel"]
    assert recorded["gpu"] and recorded["levels"] >= 1 and len(recorded["source_sha256"]) == 64
    loaded = cuda_graph.load(tmp_path / "engine.ffe", check_source=False)
    assert loaded.default_plan.compiled.kernel.digest == recorded["source_sha256"]
    frames = np.random.default_rng(6).standard_normal((10, *prepared.input_shapes()["x"])).astype(np.float32)
    a, b = Session(built, budget_ms=None), Session(loaded, budget_ms=None)
    for frame in frames:
        np.testing.assert_array_equal(a.step(frame), b.step(frame))


@pytest.mark.parametrize("arch", ["min_gru", "attention"])
def test_step_returns_on_the_done_words_and_the_state_stays_chained(arch):
    """Session.step returns once the host-facing blocks raised their done words, before the
    kernel retires: outputs, the chained state read between steps, and a stream-synced step
    interleaved (check_finite on) all agree with ONNX Runtime."""
    prepared = prepare_cached(arch, SMALL)["step"]
    frames = np.random.default_rng(7).standard_normal((30, *prepared.input_shapes()["x"])).astype(np.float32)
    session = _session(prepared)
    binding = session._host_step
    assert binding.plan.compiled.kernel.done_words >= 1
    assert session._wait_host == binding.wait_host
    ref_y, _ = _rollout(prepared, frames)
    for i, frame in enumerate(frames):
        session.check_finite = i % 7 == 3  # now and then the stream-synced path
        _close(session.step(frame), ref_y[i], f"y at step {i}")
        assert all(word.value for word in binding._done_words), f"step {i}: a done word is down"
        if i == 12:  # a state read in between waits for the kernel's tail
            _, ref_state = _rollout(prepared, frames[:13])
            for name, value in session.get_state().items():
                _close(value, ref_state[name], f"{name} after step 12")


def test_host_wait_falls_back_to_the_stream_sync(monkeypatch):
    """With no spinning allowed the wait goes through cuStreamSynchronize and checks the words."""
    from framefuse.engines import stepkernel as step_engine

    prepared = prepare_cached("gru", SMALL)["step"]
    frames = np.random.default_rng(8).standard_normal((10, *prepared.input_shapes()["x"])).astype(np.float32)
    monkeypatch.setattr(step_engine, "HOST_SPIN_LIMIT", -1)
    _check(prepared, frames)


def test_an_output_kept_after_its_session_is_gone_stays_valid():
    """The output is a view of the binding's mapped host buffer: the memory lives while the view
    does (reading it after the session was collected was a segfault)."""
    import gc

    prepared = prepare_cached("min_gru", SMALL)["step"]
    shape = prepared.manifest["inputs"][0]["shape"]
    frame = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    expected = _rollout(prepared, frame[None])[0][0]
    out = _session(prepared).step(frame)  # the session is gone after this line
    gc.collect()
    _close(out, expected, "y")


def test_stepkernel_of_lstm_cells_fused_from_a_step_form_export(tmp_path):
    """A policy as game code writes it: two nn.LSTMCell layers called once a frame, exported in
    the step form (h and c of each layer in and out by name), fused by the rewrite into one LSTMSeq
    a layer, compiled into the step kernel and chained over 60 frames against ONNX Runtime on the
    original export."""
    import io
    import warnings

    import onnx
    import onnxruntime as ort
    import torch
    from torch import nn

    from framefuse.rewrite import rewrite_model

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.cells = nn.ModuleList([nn.LSTMCell(24, 48), nn.LSTMCell(48, 48)])
            self.head = nn.Linear(48, 6)

        def forward(self, x, h0, c0, h1, c1):
            h0, c0 = self.cells[0](x, (h0, c0))
            h1, c1 = self.cells[1](h0, (h1, c1))
            return self.head(h1), h0, c0, h1, c1

    torch.manual_seed(0)
    states = ["l0_h", "l0_c", "l1_h", "l1_c"]
    args = (torch.randn(1, 24), *[torch.zeros(1, 48) for _ in states])
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Policy().eval(),
            args,
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x", *[f"state.{s}" for s in states]],
            output_names=["y", *[f"next_state.{s}" for s in states]],
        )
    model = onnx.load_from_string(buffer.getvalue())
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["LSTMSeq", "LSTMSeq"], report.declined
    path = tmp_path / "model.fused.onnx"
    onnx.save(fused, str(path))

    from framefuse.engines import cuda_graph
    from framefuse.runtime.session import Session

    engine = cuda_graph.build(path, device="cuda", options={"select": "stepkernel"})
    assert engine.metadata["selection"]["chosen"] == "stepkernel"
    session = Session(engine, budget_ms=None)
    reference = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    state = {f"state.{s}": np.zeros((1, 48), np.float32) for s in states}
    rng = np.random.default_rng(4)
    for i in range(60):
        frame = rng.standard_normal((1, 24)).astype(np.float32)
        y, *new = reference.run(["y", *[f"next_state.{s}" for s in states]], {"x": frame, **state})
        state = {f"state.{s}": v for s, v in zip(states, new)}
        _close(session.step(frame), y, f"y at step {i}")
    final = session.get_state()
    for name, value in state.items():
        _close(final[name], value, name)


@pytest.mark.parametrize(
    "arch,seq,batch",
    [
        (a, s, b)
        for a in ("min_gru", "min_lstm", "gated_ssm", "mamba", "jamba", "delta_net", "attention")
        for s, b in ((32, 1), (7, 2), (64, 1))
    ]
    + [(a, s, b) for a in ("lstm", "gru", "liquid", "xlstm") for s, b in ((8, 1), (5, 2))]
    + [(a, s, b) for a in ("lstm", "gru", "liquid") for s, b in ((32, 1), (64, 3))],
)
def test_stepkernel_of_a_sequence_window_matches_onnxruntime(arch, seq, batch):
    """The sequence form (T frames in, no state carried out) as one kernel: the scans run their
    recurrence inside it (compiler ir.Scan); windows of zeros, of NaN and of random frames."""
    _check_window(arch, seq, batch, "stepkernel")


@pytest.mark.parametrize(
    "arch,seq,batch,tactic",
    [
        (a, s, b, t)
        for a in ("attention", "jamba", "mamba")
        for s, b in ((32, 1), (7, 2))
        for t in ("stepkernel-skewed", "stepkernel-384-threads-skewed")
    ]
    + [("xlstm", 8, 1, "stepkernel-skewed"), ("xlstm", 5, 2, "stepkernel-384-threads-skewed")],
)
def test_skewed_sum_tactics_of_a_sequence_window_match_onnxruntime(arch, seq, batch, tactic):
    """The tactics whose sums over positions start each element at its own position
    (codegen.SKEWED_SUM_WALK: attention's window scores, Mamba's and xLSTM's readouts), with the
    skew in the source, over the window test's windows (random, zeros, NaN). Mamba's at T = 7,
    batch 2 has none: its skewed sums were the readouts over 16 states, a warp per element since
    codegen.WARP_SPLIT_MIN is 16 (session 68; tests/test_compiler.py pins it)."""
    from framefuse.engines.fusion import STEPKERNELS

    engine = _check_window(arch, seq, batch, tactic)
    assert engine.metadata["selection"]["stepkernel"]["skewed_sums"] is True
    assert engine.metadata["selection"]["stepkernel"]["threads"] == STEPKERNELS[tactic].get("threads", 256)
    skewed = "see SKEWED_SUM_WALK" in engine.default_plan.compiled.kernel.source
    assert skewed is not (arch == "mamba" and (seq, batch) == (7, 2))


def _check_window(arch, seq, batch, select):
    from framefuse.engines import cuda_graph

    prepared = prepare_cached(arch, {"model": {"embed": 64, "layers": 2}, "seq": seq, "batch": batch, "seed": 5})[
        "sequence"
    ]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": select})
    assert engine.metadata["selection"]["chosen"] == select
    sess = _ort(prepared)
    shape = prepared.input_shapes()["x"]
    rng = np.random.default_rng(6)
    windows = [rng.standard_normal(shape).astype(np.float32) for _ in range(5)] + [np.zeros(shape, np.float32)]
    poisoned = rng.standard_normal(shape).astype(np.float32)
    poisoned[0, seq // 2, 3] = np.nan
    out_name = prepared.manifest["outputs"][0]["name"]
    for i, window in enumerate(windows):
        expected = sess.run([out_name], {"x": window})[0]
        _close(engine.run({"x": window})[out_name], expected, f"{arch} T={seq} window {i}")
    # ONNX Runtime's own LSTM / GRU ops do not carry a NaN in their state (an nn.LSTM with a NaN
    # at t = 2, exported: torch gives NaN at every t >= 2, ONNX Runtime's LSTM op none at all),
    # where the kernel, like torch, carries it: the NaN window's reference is the fused graph,
    # whose framefuse ops run their CPU reference kernels inside ONNX Runtime.
    from framefuse.plugins.ort_bridge import ort_session

    fused = ort_session(prepared.fused, fused=True)
    expected = fused.run([out_name], {"x": poisoned})[0]
    assert np.isnan(expected[0, seq // 2 :]).any(), "the NaN frame reaches the output"
    _close(engine.run({"x": poisoned})[out_name], expected, f"{arch} T={seq} NaN window vs the fused graph")
    return engine


def test_stepkernel_of_mamba_at_embed_256_reads_its_transposed_window_in_place(monkeypatch):
    """At embed 256 and T = 32 a block's copy of mamba's in-projection window (read channel-major
    by the convolution) would overflow shared memory: the kernel reads those values where they
    lie (schedule.build_task's stage_limit), and still matches ONNX Runtime. This is the row form
    (simplify.SCAN_COLUMNS off, lower.SCAN_MAX_ELEMENTS lifted, the build's form before session
    24): the GPU case of the in-place reads. Run column by column, the window fits."""
    from framefuse.compiler import lower, simplify
    from framefuse.engines import cuda_graph

    monkeypatch.setattr(lower, "SCAN_MAX_ELEMENTS", 1 << 18)
    monkeypatch.setattr(simplify, "SCAN_COLUMNS", False)

    prepared = prepare_cached("mamba", {"model": {"embed": 256, "layers": 2}, "seq": 32, "batch": 1, "seed": 5})[
        "sequence"
    ]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
    assert engine.metadata["selection"]["chosen"] == "stepkernel"
    source = engine.default_plan.compiled.kernel.source
    assert "ffk_ll_wait(" in source[source.index("ffk_step(") :]
    sess = _ort(prepared)
    rng = np.random.default_rng(8)
    out_name = prepared.manifest["outputs"][0]["name"]
    for i in range(3):
        window = rng.standard_normal(prepared.input_shapes()["x"]).astype(np.float32)
        expected = sess.run([out_name], {"x": window})[0]
        _close(engine.run({"x": window})[out_name], expected, f"mamba embed 256 T=32 window {i}")


@pytest.mark.parametrize("name", ["elman-scan", "elman-scan-reversed-axis1", "mlp-cell-loop"])
def test_stepkernel_of_an_unrolled_loop_or_scan_matches_onnxruntime(name, control_flow_graphs, tmp_path):
    """A recurrence left as an ONNX Scan / Loop (no rewrite matched its body): the node compiled
    through the compiler's API, its outputs against ONNX Runtime for random inputs, zeros and a NaN
    at one position; and the rewrite's unrolled graph built as `framefuse build` does."""
    import onnxruntime as ort
    import torch

    from framefuse.compiler.engine import compile_step
    from framefuse.engines.stepkernel import StepKernelPlan

    g = control_flow_graphs
    model = {
        "elman-scan": g.elman_scan,
        "elman-scan-reversed-axis1": lambda: g.elman_scan(reverse=True, axis=1),
        "mlp-cell-loop": g.mlp_cell_loop,
    }[name]()
    compiled = compile_step(model, device="cuda")
    plan = StepKernelPlan.of(compiled)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    for case in ("random", "zeros", "nan"):
        feeds = {}
        for spec in session.get_inputs():
            value = rng.standard_normal(spec.shape).astype(np.float32)
            if case == "zeros":
                value[:] = 0
            if case == "nan" and spec.name in ("x", "X"):
                value.reshape(-1)[value.size // 2] = np.nan
            feeds[spec.name] = value
        expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        outputs = plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
        torch.cuda.synchronize()
        for out, value in expected.items():
            _close(outputs[out].cpu().numpy(), value, f"{name} {case} {out}")
    # what `framefuse build` does: the rewrite copies the body T times, the engine compiles that
    import onnx

    from framefuse.engines import cuda_graph
    from framefuse.rewrite import rewrite_model

    fused, _ = rewrite_model(model)
    path = tmp_path / "model.fused.onnx"
    onnx.save(fused, str(path))
    # the copies rolled into a loop (simplify.RollRecurrences / RollBodies) and kept (the tactic)
    for select in ("stepkernel", "stepkernel-unrolled"):
        engine = cuda_graph.build(path, device="cuda", options={"select": select})
        assert engine.metadata["selection"]["chosen"] == select
        counts = engine.default_plan.compiled.program.counts()
        # the Elman cell rolled into a Recur, the MLP cell into a BodyLoop; the unrolled tactic neither
        loops = counts.get("recur" if name.startswith("elman") else "bodyloop", 0)
        assert loops == (1 if select == "stepkernel" else 0), (select, counts)
        built = engine.run(feeds)
        for out, value in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
            _close(built[out], value, f"{name} built {out} ({select})")


@pytest.mark.parametrize(
    "steps,batch,hidden,zero_start",
    [(32, 1, 64, True), (7, 3, 33, False), (64, 2, 256, True), (2, 1, 5, False)],
    ids=lambda v: str(v),
)
def test_rolled_elman_cells_match_the_interpreter(steps, batch, hidden, zero_start, control_flow_graphs):
    """Unrolled Elman cells (tanh then relu layers, as torch exports a loop over nn.RNNCell) rolled
    into one Recur a layer (simplify.RollRecurrences) and kept unrolled (roll_recurrences off, the
    stepkernel-unrolled tactic's program): both kernels against the float64 interpreter, for random,
    zero and NaN windows, two launches each."""
    import torch

    from framefuse.compiler import naive
    from framefuse.compiler.engine import CompiledStep
    from framefuse.compiler.simplify import simplify
    from framefuse.engines.stepkernel import StepKernelPlan

    raw = control_flow_graphs.unrolled_cells(
        steps=steps,
        batch=batch,
        features=24,
        hidden=hidden,
        layers=(("tanh", True), ("relu", True)),
        zero_start=zero_start,
    )
    rng = np.random.default_rng(steps)
    for roll in (True, False):
        program = simplify(raw, roll_recurrences=roll)
        assert (program.counts().get("recur", 0) == 2) is roll
        compiled = CompiledStep(program, device=torch.device("cuda"))
        plan = StepKernelPlan.of(compiled)
        for case in ("random", "zeros", "nan"):
            feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
            if case == "zeros":
                feeds = {n: np.zeros_like(v) for n, v in feeds.items()}
            if case == "nan":
                feeds["x"].reshape(-1)[feeds["x"].size // 2] = np.nan
            expected = naive.run(program, feeds)
            for _ in range(2):
                outputs = plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
            torch.cuda.synchronize()
            for name, value in expected.items():
                _close(outputs[name].cpu().numpy(), value, f"{'rolled' if roll else 'unrolled'} {case} {name}")


@pytest.mark.parametrize(
    "steps,batch,width,hidden,product_body",
    [(1, 1, 3, 5, False), (7, 3, 5, 33, False), (4, 2, 40, 7, True), (64, 1, 64, 256, False), (33, 4, 6, 4, True)],
    ids=lambda v: str(v),
)
def test_body_loops_match_the_interpreter(steps, batch, width, hidden, product_body, control_flow_graphs):
    """Loops over a general body (ir.BodyLoop, codegen's _body_loop) built by hand: two windows, a
    fixed input, a reduction of h and a product of [u_t, h] inside the body, a body ending in a
    product; T 1 to 64, batch 1 to 4, hidden 4 to 256; random, zero and NaN frames, two launches
    each, against the float64 interpreter."""
    program = control_flow_graphs.hand_body_loop(steps, batch, width, hidden, product_body=product_body)
    _check_body_loop_kernel(program, program, np.random.default_rng(steps), "body loop")


def _check_body_loop_kernel(program, reference, rng, what):
    """``program``'s step kernel (a body loop in it) on random, zero and NaN frames (NaN in the
    middle of x), two launches each, against the float64 interpreter on ``reference``."""
    import torch

    from framefuse.compiler import naive
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.stepkernel import StepKernelPlan

    compiled = CompiledStep(program, device=torch.device("cuda"))
    assert "body loop over" in compiled.kernel.source
    plan = StepKernelPlan.of(compiled)
    for case in ("random", "zeros", "nan"):
        feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in reference.inputs.items()}
        if case == "zeros":
            feeds = {n: np.zeros_like(v) for n, v in feeds.items()}
        if case == "nan":
            feeds["x"].reshape(-1)[feeds["x"].size // 2] = np.nan
        expected = naive.run(reference, feeds)
        for _ in range(2):
            outputs = plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
        torch.cuda.synchronize()
        for name, value in expected.items():
            _close(outputs[name].cpu().numpy(), value, f"{what} {case} {name}")


@pytest.mark.parametrize(
    "steps,batch,hidden,variant",
    [
        (4, 1, 5, {}),
        (9, 3, 7, {"gate_out": True}),
        (32, 1, 32, {"normed": True}),
        (64, 2, 64, {"normed": True, "gate_out": True}),
        (32, 1, 32, {"layers": 2}),
    ],
    ids=["T4-b1-h5", "T9-b3-h7-gate", "T32-b1-h32-norm", "T64-b2-h64-norm-gate", "T32-b1-h32-two-layers"],
)
def test_body_loops_carrying_h_and_c_match_the_interpreter(steps, batch, hidden, variant, control_flow_graphs):
    """Hand-written LSTM cells (h and c carried, optionally a LayerNorm over the gates and the forget
    gate read every position, or two layers: the second loop reading the first's positions) rolled
    by simplify.RollBodies into one loop a layer carrying [h, c] as one vector: T 4 to 64, batch 1
    to 3, odd and round sizes; random, zero and NaN frames, two launches each, against the float64
    interpreter on the unrolled program."""
    from framefuse.compiler.simplify import simplify

    unrolled = control_flow_graphs.unrolled_lstm_cells(steps, batch, features=6, hidden=hidden, **variant)
    program = simplify(unrolled)
    assert [n.kind for n in program.nodes()].count("bodyloop") == variant.get("layers", 1)
    _check_body_loop_kernel(program, unrolled, np.random.default_rng(steps), "(h, c) loop")


@pytest.mark.parametrize(
    "kind,hidden,seq,dirs", [("LSTM", 1024, 64, 2), ("GRU", 256, 256, 1), ("LSTM", 64, 256, 2), ("RNN", 256, 64, 2)]
)
def test_stepkernel_of_a_wide_or_long_rnn_window_matches_onnxruntime(kind, hidden, seq, dirs, bench_script, tmp_path):
    """nn.LSTM / nn.GRU / nn.RNN windows at the sizes bench/rnn_sizes.py covers, past the zoo's: R
    read from global memory each position (hidden 1024), the input product's blocks staging only
    their rows (schedule.bounding_pairs), 256 positions in the loop, the Elman cell."""
    import onnxruntime as ort

    from framefuse.engines import cuda_graph

    # the benchmark's own export (one torch.nn layer, exported, rewritten, saved)
    entry = bench_script("rnn_sizes").export_window(kind, hidden, seq, dirs, tmp_path)
    # nn.RNN has no fused op: its ONNX RNN nodes stay, and the compiler lowers them as they are
    assert entry["ops"] == ([] if kind == "RNN" else [f"{kind}Seq"])
    engine = cuda_graph.build(entry["fused"], device="cuda", options={"select": "stepkernel"})
    assert engine.metadata["selection"]["chosen"] == "stepkernel"
    manifest = entry["manifest"]
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    session = ort.InferenceSession(str(entry["onnx"]), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(12)
    for i in range(3):
        window = rng.standard_normal(manifest["inputs"][0]["shape"]).astype(np.float32)
        expected = session.run([out_name], {in_name: window})[0]
        _close(engine.run({in_name: window})[out_name], expected, f"{kind} {hidden} T={seq} window {i}")


@pytest.mark.parametrize(
    "arch,seq,batch", [("lstm", 32, 1), ("gru", 5, 2), ("liquid", 64, 1), ("lstm", 2, 1), ("liquid", 3, 2)]
)
def test_the_lanes_tactic_of_a_sequence_window_matches_onnxruntime(arch, seq, batch):
    """stepkernel-lanes (codegen.recur_lanes: a one-block recurrence with each unit over lanes of a
    warp, the sums met by shuffles) over the window test's windows (random, zeros, NaN), short
    windows included (at T = 1 there is no loop: the tactic's source is the plain kernel's); the
    source must have the lane loop, or the test would check the plain kernel again."""
    engine = _check_window(arch, seq, batch, "stepkernel-lanes")
    assert engine.metadata["selection"]["stepkernel"]["lane_cells"] is True
    assert "lanes a unit" in engine.default_plan.compiled.kernel.source


@pytest.mark.parametrize(
    "ahead,together,helpers",
    [(4, False, False), (1, True, False), (4, True, False), (1, False, True), (4, False, True)],
)
@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize(
    "arch,seq,batch", [("lstm", 32, 1), ("gru", 5, 2), ("liquid", 64, 1), ("lstm", 2, 1), ("liquid", 3, 2)]
)
def test_inputs_loaded_several_positions_ahead_match_onnxruntime(
    arch, seq, batch, lanes, ahead, together, helpers, monkeypatch
):
    """codegen.RECUR_INPUTS_AHEAD = 4 (a one-block recurrence keeps four positions' input words in
    flight, the position loop unrolled by four; fewer where the window is shorter) and / or
    codegen.RECUR_TAKE_TOGETHER (a position's words checked with one branch) or
    codegen.RECUR_INPUT_HELPERS (taken by the threads past the cells; the lanes loop keeps its own
    loads) over the window test's windows, in the thread-per-row loop and in the lanes loop; the
    source must have them, or the test would check the plain loop again."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RECUR_INPUTS_AHEAD", ahead)
    monkeypatch.setattr(codegen, "RECUR_TAKE_TOGETHER", together)
    monkeypatch.setattr(codegen, "RECUR_INPUT_HELPERS", helpers)
    engine = _check_window(arch, seq, batch, "stepkernel-lanes" if lanes else "stepkernel")
    source = engine.default_plan.compiled.kernel.source
    if ahead > 1 and not (helpers and not lanes):  # (with helpers, ahead only unrolls the loop)
        assert f"loaded {min(ahead, seq)} positions ahead" in source
    assert ("// one branch for the position's words" in source) is together
    assert ("threads past the cells take" in source) is (helpers and not lanes)
    assert ("lanes a unit" in source) is lanes


@pytest.mark.parametrize(
    "kind,hidden,seq,dirs,tactic",
    [
        ("LSTM", 64, 256, 1, "stepkernel-lanes"),
        ("GRU", 64, 256, 1, "stepkernel-lanes"),
        ("LSTM", 64, 8, 2, "stepkernel-lanes"),  # two directions, each its own block
        ("GRU", 64, 3, 1, "stepkernel-lanes"),
        ("LSTM", 1024, 32, 2, "stepkernel-512-threads"),
        ("GRU", 1024, 4, 2, "stepkernel-512-threads"),
        ("LSTM", 64, 256, 1, "stepkernel-384-threads-ahead-4"),
        ("GRU", 64, 256, 1, "stepkernel-384-threads-ahead-8"),
        ("LSTM", 64, 8, 2, "stepkernel-384-threads-ahead-8"),  # the ring as long as the window
        ("GRU", 64, 5, 1, "stepkernel-384-threads-ahead-8"),  # shorter: as many as it has
    ],
)
def test_the_rnn_size_tactics_match_onnxruntime(kind, hidden, seq, dirs, tactic, bench_script, tmp_path):
    """The tactics built for bench/rnn_sizes.py's ties with cuDNN, on its own exports:
    stepkernel-lanes where one block holds a direction's recurrence (hidden 64),
    stepkernel-512-threads where R is held partly in registers and partly in shared memory
    (hidden 1024, schedule.hybrid_recurrences), stepkernel-384-threads-ahead-4 / -8 (a one-block
    recurrence's loop unrolled by 4 / 8, its inputs taken by the threads past the cells,
    codegen.RECUR_INPUTS_AHEAD and RECUR_INPUT_HELPERS); windows of random frames, zeros and a NaN frame
    (the fused graph's reference: ONNX Runtime's own RNN ops drop a NaN from their state)."""
    import onnxruntime as ort

    from framefuse.engines import cuda_graph
    from framefuse.plugins.ort_bridge import ort_session

    entry = bench_script("rnn_sizes").export_window(kind, hidden, seq, dirs, tmp_path)
    engine = cuda_graph.build(entry["fused"], device="cuda", options={"select": tactic})
    selection = engine.metadata["selection"]
    assert selection["chosen"] == tactic
    source = engine.default_plan.compiled.kernel.source
    if tactic == "stepkernel-lanes":
        assert selection["stepkernel"]["lane_cells"] is True
        assert "lanes a unit" in source
    elif "-ahead-" in tactic:
        # the block's threads past the cells take the inputs (codegen.RECUR_INPUT_HELPERS, on): the
        # tactic unrolls their loop by ahead (at most the window)
        ahead = int(tactic.rsplit("-", 1)[1])
        assert selection["stepkernel"]["threads"] == 384 and selection["stepkernel"]["inputs_ahead"] == ahead
        assert "threads past the cells take" in source
        assert f"for (int rcd = 0; rcd < {min(ahead, seq)}; ++rcd)" in source
    else:
        assert selection["stepkernel"]["threads"] == 512
    manifest = entry["manifest"]
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    shape = manifest["inputs"][0]["shape"]
    session = ort.InferenceSession(str(entry["onnx"]), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(13)
    for i, window in enumerate(
        [rng.standard_normal(shape).astype(np.float32) for _ in range(3)] + [np.zeros(shape, np.float32)]
    ):
        expected = session.run([out_name], {in_name: window})[0]
        _close(engine.run({in_name: window})[out_name], expected, f"{kind} {hidden} T={seq} {tactic} window {i}")
    poisoned = rng.standard_normal(shape).astype(np.float32)
    poisoned.reshape(-1)[poisoned.size // 2] = np.nan
    expected = ort_session(entry["fused"], fused=True).run([out_name], {in_name: poisoned})[0]
    assert np.isnan(expected).any(), "the NaN frame reaches the output"
    _close(engine.run({in_name: poisoned})[out_name], expected, f"{kind} {hidden} T={seq} {tactic} NaN window")


@pytest.mark.parametrize("tactic", ["stepkernel-views", "stepkernel-fewer-phases", "stepkernel-fewer-levels"])
@pytest.mark.parametrize("arch", ARCHS)
def test_the_views_tactic_small_and_short_launched_and_resident(arch, tactic):
    """stepkernel-views (codegen.ALIAS_VIEWS: a task's views of its own arrays read where those
    lie, a phase less), stepkernel-fewer-phases (those views, codegen.PHASE_ONE_PASS and
    ROOT_IN_ARRAY_WARP) and stepkernel-fewer-levels (those, scheduled with products recomputed by
    the blocks that read them: schedule.REPLICATED_DOT_MACS; mamba 8 -> 6 levels at this size) at
    embed 64 over 40 chained steps against ONNX Runtime, then a resident session of the same
    engine bit for bit equal to the launched one (the sanitizers' target: small and short)."""
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, SMALL)["step"]
    frames = np.random.default_rng(7).standard_normal((40, *prepared.input_shapes()["x"])).astype(np.float32)
    launched = _check(prepared, frames, select=tactic)
    from framefuse.compiler.codegen import generate

    kernel = launched.engine.metadata["selection"]["stepkernel"]
    plain = generate(launched.engine.default_plan.compiled.schedule)  # the same schedule, views copied
    assert kernel["alias_views"] is True and kernel["kernel_phases"] < plain.kernel_phases
    assert kernel["one_pass"] is (tactic != "stepkernel-views")
    assert kernel["replicated_dot_macs"] == (1 << 15 if tactic == "stepkernel-fewer-levels" else 0)
    launched.reset()
    expected = np.stack([launched.step(f).copy() for f in frames])
    with Session(launched.engine, budget_ms=None, resident=True) as resident:
        got = np.stack([resident.step(f).copy() for f in frames])
    assert np.array_equal(got, expected, equal_nan=True), f"{arch}: max diff {np.nanmax(np.abs(got - expected))}"


SPLIT_ARCHS = ("min_gru", "min_lstm", "gated_ssm", "mamba", "jamba")  # where splitting saves levels


@pytest.mark.parametrize(
    "arch,threads,batch",
    [(a, 384, 1) for a in SPLIT_ARCHS] + [("min_gru", 256, 3), ("mamba", 256, 3)],
)
def test_split_products_match_the_interpreter(arch, threads, batch):
    """Products of a recurrence's output split into partial sums (simplify.SplitProducts, the
    stepkernel-split tactics: the recurrence's blocks compute a slice of the product each, its
    readers sum the slices; the state stored by the slice's array loop), at the benchmark's size
    (embed 256) on the GPU's whole grid with the tactic's settings: from zero state a random, a
    random, an all-zero and a NaN frame against the float64 interpreter of the split program, then
    the tactic's build against ONNX Runtime over 100 chained steps (batch 1)."""
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.compiler.simplify import split_products
    from framefuse.engines.fusion import FEWER_PHASES
    from framefuse.engines.stepkernel import StepKernelPlan

    config = {**FULL, "batch": batch} if batch > 1 else FULL
    prepared = prepare_cached(arch, config)["step"]
    program = lower_program(prepared.fused, split=True)
    assert split_products(program) > 0, arch
    compiled = CompiledStep(program, device=torch.device("cuda"), threads=threads, **FEWER_PHASES)
    plan = StepKernelPlan.of(compiled)
    assert len(list(_edge_frames_from_zero_state(plan, program, 6, f"{arch} split x{batch}"))) == 4
    if batch == 1:
        tactic = "stepkernel-384-threads-split" if threads == 384 else "stepkernel-split"
        frames = np.random.default_rng(8).standard_normal((100, *prepared.input_shapes()["x"])).astype(np.float32)
        session = _check(prepared, frames, select=tactic)
        assert session.engine.metadata["selection"]["stepkernel"]["levels"] < _unsplit_levels(prepared, threads)


def _unsplit_levels(prepared, threads: int) -> int:
    """The levels of the fewer-phases tactic's schedule (no split) on this GPU's grid."""
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.schedule import schedule

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return schedule(
        lower_program(prepared.fused, split=False), grid=sms, threads=threads, recomputed_scalars=64
    ).levels()


@pytest.mark.parametrize("arch", ["min_gru", "mamba"])
def test_split_products_small(monkeypatch, arch):
    """The sanitizers' target for split products (small, short): embed 64 (a contraction of 64 in
    8 slices of 8 columns), 16 blocks of 64 threads, so the readers stage 8 x 64 partial sums 8
    words a thread in flight (runtime.cuh's ffk_ll_stage_wide); edge frames from zero state against
    the interpreter."""
    import torch

    from framefuse.compiler import lower_program, simplify
    from framefuse.compiler.engine import CompiledStep
    from framefuse.compiler.simplify import split_products
    from framefuse.engines.stepkernel import StepKernelPlan

    monkeypatch.setattr(simplify, "SPLIT_MIN_COLUMNS", 8)
    program = lower_program(prepare_cached(arch, SMALL)["step"].fused, split=True)
    assert split_products(program) > 0, arch
    compiled = CompiledStep(program, device=torch.device("cuda"), grid=16, threads=64)
    assert "ffk_ll_stage_wide<NT, " in compiled.kernel.source
    plan = StepKernelPlan.of(compiled)
    assert len(list(_edge_frames_from_zero_state(plan, program, 7, f"{arch} split small"))) == 4


@pytest.mark.parametrize(
    "arch,size,grid,threads",
    [
        (a, "small", 16, 64)
        for a in ("min_gru", "lstm", "attention", "xlstm")  # the sanitizers' targets: `-k "early_frame and small"`
    ]
    + [(a, "full", None, 256) for a in ("min_gru", "gru", "attention", "mamba", "jamba", "xlstm")],
)
def test_early_frame_words_match_the_interpreter_and_the_plain_kernel(arch, size, grid, threads):
    """codegen.EARLY_FRAME_WORDS (the tactic stepkernel-fewer-phases-early-frame): the frame task
    publishes x at entry, before the scalars of x. From zero state a random, a random, an all-zero and a NaN frame against the float64
    interpreter, and every step's outputs bit for bit those of the same schedule without it (the
    same arithmetic, only the waits move). ``small`` (embed 64, 16 blocks of 64 threads): the
    sanitizers' targets; ``full``: the benchmark's size on this GPU's grid."""
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.stepkernel import StepKernelPlan

    config = SMALL if size == "small" else {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0}
    program = lower_program(prepare_cached(arch, config)["step"].fused)
    kwargs = {"grid": grid, "threads": threads, "recomputed_scalars": 64, "alias_views": True, "one_pass": True}
    early = CompiledStep(program, device=torch.device("cuda"), early_frame=True, **kwargs)
    plain = CompiledStep(program, device=torch.device("cuda"), early_frame=False, **kwargs)
    assert "frame x words, published now" in early.kernel.source
    assert "frame x words, published now" not in plain.kernel.source
    early_plan, plain_plan = StepKernelPlan.of(early), StepKernelPlan.of(plain)
    steps = _edge_frames_from_zero_state(early_plan, program, 11, f"{arch} early frame {size}")
    for step, feeds, _ in steps:
        got = early_plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
        want = plain_plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
        torch.cuda.synchronize()
        for name in want:
            a, b = got[name].cpu().numpy(), want[name].cpu().numpy()
            assert np.array_equal(a, b, equal_nan=True), f"{arch} {size} step {step} {name}: not bit for bit"
