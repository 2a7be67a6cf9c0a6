"""The engine's plan-time rewrites (executor.PLAN_REWRITES): same outputs, fewer kernels.

Kernels are counted on the CPU with a TorchDispatchMode, which sees the aten ops each step really
runs (composite ops such as reshape/matmul/linear already decomposed). An op counts as one GPU
kernel unless it is a view or an allocation; a framefuse node counts as its one launch plus one
copy per non-contiguous input (the kernel path makes inputs contiguous); an ``addmm`` whose
first matrix has one row counts as two, because torch on CUDA copies the bias into the output
and then runs the GEMM onto it (cuBLASLt's bias epilogue needs more than one row).
"""

from __future__ import annotations

import collections
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from framefuse.engines.executor import GraphExecutor, optimization_enabled
from framefuse.models import ARCHITECTURES

# Ops that launch no kernel: allocations and metadata-only ops (views are recognised by schema).
_NO_KERNEL = {
    "empty",
    "empty_strided",
    "empty_like",
    "detach",
    "lift_fresh",
    "alias",
    "_unsafe_view",
    "view",
    "as_strided",
    "expand",
    "permute",
    "t",
    "transpose",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "split",
    "split_with_sizes",
    "narrow",
    "unbind",
    "_reshape_alias",
    "resize_",
}


class _KernelCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels: collections.Counter = collections.Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.paused and not func.is_view and name not in _NO_KERNEL:
            if name == "addmm" and args[1].shape[0] == 1:
                self.kernels["addmm(bias copy)"] += 1
            self.kernels[name] += 1
        return func(*args, **(kwargs or {}))


def gpu_kernel_count(plan, feeds) -> tuple[int, collections.Counter]:
    """Kernels one ``plan.execute(feeds)`` would launch on a GPU (see the module docstring)."""
    counter = _KernelCounter()
    saved = [step.fn for step in plan.steps]

    def framefuse_launch(fn):
        def run(args):
            counter.kernels["<framefuse launch>"] += 1
            counter.kernels["<contiguous copy>"] += sum(
                1 for a in args if isinstance(a, torch.Tensor) and not a.is_contiguous()
            )
            counter.paused += 1
            try:
                return fn(args)
            finally:
                counter.paused -= 1

        return run

    for step in plan.steps:
        if not step.standard:
            step.fn = framefuse_launch(step.fn)
    try:
        with torch.no_grad(), counter:
            plan.execute(feeds)
    finally:
        for step, fn in zip(plan.steps, saved):
            step.fn = fn
    return sum(counter.kernels.values()), counter.kernels


@pytest.fixture(scope="module")
def fused_models():
    import onnx

    from framefuse.runtime.pipeline import prepare_cached

    def load(arch: str, form: str):
        prepared = prepare_cached(arch, {"seq": 32, "seed": 0})[form]
        assert prepared.fused is not None, prepared.fused_error
        return onnx.load(str(prepared.fused))

    return load


def _feeds(plan, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (
            torch.randn(spec.shape, generator=generator) if spec.dtype.is_floating_point else torch.zeros(spec.shape)
        ).to(spec.dtype)
        for name, spec in plan.input_specs.items()
    }


def _plans(model):
    return GraphExecutor(model, "cpu", optimize=False).plan(), GraphExecutor(model, "cpu", optimize=True).plan()


@pytest.mark.parametrize("form", ["step", "sequence"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_optimised_plan_gives_the_same_outputs(fused_models, arch, form):
    plain, optimised = _plans(fused_models(arch, form))
    feeds = _feeds(plain)
    with torch.no_grad():
        expected = plain.execute(feeds)
        got = optimised.execute(feeds)
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].shape == expected[name].shape and got[name].dtype == expected[name].dtype, name
        scale = max(1.0, expected[name].abs().max().item())
        diff = (got[name] - expected[name]).abs().max().item()
        assert diff <= 1e-6 * scale, f"{arch} {form} output {name}: max abs diff {diff:.3g}"
    # Never more kernels than the plain plan.
    assert gpu_kernel_count(optimised, feeds)[0] <= gpu_kernel_count(plain, feeds)[0]


# Kernel counts measured with gpu_kernel_count (plain -> optimised) at embed 256, 2 layers.
MEASURED = {
    ("lstm", "step"): (27, 11),  # 4 Gathers of a layer's state: 4 kernels each -> a view
    ("mamba", "step"): (67, 59),
    ("min_gru", "step"): (29, 27),  # the two gate projections: one GEMM
    ("min_gru", "sequence"): (29, 21),  # MatMul + bias -> addmm (bias in the epilogue)
    ("xlstm", "step"): (78, 47),
}


@pytest.mark.parametrize("arch, form", sorted(MEASURED))
def test_optimised_plan_launches_fewer_kernels(fused_models, arch, form):
    plain, optimised = _plans(fused_models(arch, form))
    feeds = _feeds(plain)
    before, _ = gpu_kernel_count(plain, feeds)
    after, kinds = gpu_kernel_count(optimised, feeds)
    assert (before, after) == MEASURED[(arch, form)], dict(kinds)


def test_escape_hatch(monkeypatch, fused_models):
    monkeypatch.setenv("FRAMEFUSE_ENGINE_OPT", "0")
    assert not optimization_enabled()
    model = fused_models("lstm", "step")
    default = GraphExecutor(model, "cpu")
    assert not default.optimize
    assert [s.op_type for s in default.plan().steps] == [s.op_type for s in _plans(model)[0].steps]
    monkeypatch.delenv("FRAMEFUSE_ENGINE_OPT")
    assert optimization_enabled() and GraphExecutor(model, "cpu").optimize
    assert not optimization_enabled(False)


def test_folded_model_keeps_merged_nodes(fused_models):
    # Rewritten steps still stand for their nodes: the stored (folded) graph is unchanged.
    model = fused_models("min_gru", "sequence")
    executor = GraphExecutor(model, "cpu", optimize=True)
    assert any(step.op_type == "MatMul+Add" for step in executor.plan().steps)
    assert len(executor.plan().steps) == len(GraphExecutor(model, "cpu", optimize=False).plan().steps)
    folded = executor.folded_model()
    plain_folded = GraphExecutor(model, "cpu", optimize=False).folded_model()
    assert [n.op_type for n in folded.graph.node] == [n.op_type for n in plain_folded.graph.node]


def test_plan_rewrites_are_a_list_a_new_one_is_one_entry(monkeypatch, fused_models):
    """Issue 22: the executor's peepholes are rewrite classes run in the order of one list; a new
    rewrite is a class with ``name`` and ``run`` and one more entry (here a recorder, after them)."""
    from framefuse.engines import executor

    assert [r.name for r in executor.PLAN_REWRITES] == ["gather-constant-indices", "matmul-bias", "sibling-matmuls"]
    seen = []

    class Recorder:
        name = "recorder"

        def run(self, steps, env, graph_outputs, device):
            seen.append([s.op_type for s in steps])
            return steps

    monkeypatch.setattr(executor, "PLAN_REWRITES", (*executor.PLAN_REWRITES, Recorder()))
    model = fused_models("min_gru", "sequence")
    plan = GraphExecutor(model, "cpu", optimize=True).plan()
    assert len(seen) == 1 and seen[0] == [s.op_type for s in plan.steps]
    assert "MatMul+Add" in seen[0]  # it ran after the rewrites before it in the list
    monkeypatch.setattr(executor, "PLAN_REWRITES", (Recorder(),))
    GraphExecutor(model, "cpu", optimize=True).plan()
    assert "MatMul+Add" not in seen[1]  # alone in the list: nothing else rewrote the plan


# -- compiled segments (framefuse.engines.fusion) -------------------------------------------------
# On the CPU the segments go through the same make_fx tracing and torch.compile with the
# "aot_eager" backend (no code generation: inductor's CPU build is slow on a shared machine and
# says nothing about the GPU's kernels); the GPU tests run inductor itself.


@pytest.mark.parametrize("form", ["step", "sequence"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_compiled_segments_match_onnxruntime(arch, form):
    import numpy as np
    import onnx
    import onnxruntime as ort

    from framefuse.engines import fusion
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached(arch, {"seq": 32, "seed": 0})[form]
    assert prepared.fused is not None, prepared.fused_error
    plan = GraphExecutor(onnx.load(str(prepared.fused)), "cpu").plan()
    compiled, report = fusion.compile_plan(plan, backend="aot_eager")
    standard = sum(1 for s in plan.steps if s.standard)
    assert report["segments"] and len(compiled.steps) < len(plan.steps)
    # Every framefuse step is kept as it was, in order; each segment replaces a run of standard steps.
    assert [s.label for s in compiled.steps if not s.standard] == [s.label for s in plan.steps if not s.standard]
    assert sum(seg["steps"] for seg in report["segments"]) <= standard
    feeds = _feeds(plan, seed=4)
    with torch.no_grad():
        got = compiled.execute({k: v.clone() for k, v in feeds.items()})
    session = ort.InferenceSession(str(prepared.onnx), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    expected = session.run(None, {n: feeds[n].numpy() for n in names})
    for meta, want in zip(session.get_outputs(), expected):
        have = got[meta.name].numpy()
        assert have.shape == want.shape, meta.name
        diff = float(np.max(np.abs(have - want))) if want.size else 0.0
        assert diff <= 1e-4 * max(1.0, float(np.max(np.abs(want)))), f"{arch} {form} {meta.name}: {diff:.3g}"


def test_segments_are_maximal_runs_of_standard_steps(fused_models):
    from framefuse.engines import fusion

    plan = GraphExecutor(fused_models("mamba", "step"), "cpu").plan()
    segments = fusion.find_segments(plan)
    assert segments
    for seg in segments:
        assert all(plan.steps[i].standard for i in range(seg.first, seg.last + 1))
        assert seg.first == 0 or not plan.steps[seg.first - 1].standard
        assert seg.last == len(plan.steps) - 1 or not plan.steps[seg.last + 1].standard
        produced = {n for i in range(seg.first, seg.last + 1) for n in plan.steps[i].outputs if n}
        assert not set(seg.inputs) & produced and set(seg.outputs) <= produced
    # An output nobody reads later is not an output of its segment (it dies inside).
    read_later = {n for s in plan.steps for _, n in s.env_args} | set(plan.output_specs)
    assert all(set(seg.outputs) <= read_later for seg in segments)


def test_selection_is_skipped_without_a_gpu_and_recorded(tmp_path, fused_models):
    from framefuse.engines import cuda_graph, fusion
    from framefuse.engines.base import EngineBuildError

    model = fused_models("min_gru", "step")
    executor = GraphExecutor(model, "cpu")
    plan = executor.plan()
    chosen, report = fusion.apply_selection(executor, plan, "time")
    assert chosen is plan and report["chosen"] == "plan" and "no CUDA device" in report["skipped"]
    with pytest.raises(EngineBuildError, match="select must be one of"):
        fusion.apply_selection(executor, plan, "fastest")
    lines = []
    engine = cuda_graph.build(model, device="cpu", log=lines.append)
    assert any("selection skipped" in line for line in lines), lines
    assert engine.metadata["selection"]["chosen"] == "plan"
    unoptimized, report = fusion.apply_selection(executor, plan, "unoptimized")
    assert report["chosen"] == "unoptimized" and len(unoptimized.steps) == len(plan.steps)


def test_cli_offers_the_unfused_graph_to_the_selection(tmp_path, monkeypatch):
    """`framefuse build model.fused.onnx --engine cuda-graph` hands model.onnx beside it to the
    build as the unfused candidate (timed on a GPU; on the CPU the selection is skipped)."""
    import shutil

    from framefuse.build import cli
    from framefuse.engines import cuda_graph
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached("min_gru", {"seq": 32, "seed": 0})["step"]
    shutil.copy(prepared.onnx, tmp_path / "model.onnx")
    shutil.copy(prepared.fused, tmp_path / "model.fused.onnx")
    seen = {}
    real_build = cuda_graph.build

    def spy(source, **kwargs):
        seen.update(kwargs["options"])
        return real_build(source, **kwargs)

    monkeypatch.setattr(cuda_graph, "build", spy)
    parser = __import__("argparse").ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(["build", str(tmp_path), "--engine", "cuda-graph", "--device", "cpu"])
    assert args.func(args) == 0
    assert seen["unfused"] == tmp_path / "model.onnx"
    assert (tmp_path / "engine.ffe").is_file()
    args = parser.parse_args(["build", str(tmp_path), "--engine", "onnxruntime", "--select", "plan"])
    with pytest.raises(Exception, match="--select is an option of the cuda-graph engine"):
        args.func(args)


def test_host_timing_binds_each_candidate_as_the_session_does(fused_models):
    """Selection times candidates host to host through the session's own binding: the frame from
    host buffers, the state handed off on the device. The mechanics (not the times) run on the CPU:
    each candidate gets its timed calls, a candidate that fails is reported and the others still
    timed, and the state a candidate carries advances with every call as in a game loop."""
    from framefuse.engines import fusion

    model = fused_models("min_gru", "step")
    plain, plan = _plans(model)
    host_inputs, host_outputs, pairs = fusion.session_io(plan)
    assert pairs and all(o.startswith("next_state.") and i.startswith("state.") for o, i in pairs.items())
    assert not set(host_inputs) & set(pairs.values()) and not set(host_outputs) & set(pairs)
    assert host_inputs and host_outputs

    class Broken:  # a candidate whose run raises: reported, never fatal to the timing of the others
        device = plan.device
        input_specs, output_specs = plan.input_specs, plan.output_specs

        def execute(self, feeds):
            raise RuntimeError("this candidate cannot run")

    feeds = _feeds(plan, seed=3)
    results = fusion.time_plans_host(
        {"plan": plan, "broken": Broken(), "unoptimized": plain}, feeds, rounds=2, calls=4, warmup=1
    )
    assert results["plan"]["calls"] == results["unoptimized"]["calls"] == 8
    assert 0 < results["plan"]["us_per_step"] <= results["plan"]["p99_us"]
    assert "cannot run" in results["broken"]["error"]

    # the binding timed is the session's: 3 calls advance the state 3 steps from zero
    binding = fusion._session_binding(plan)
    (frame_name,) = host_inputs
    for _ in range(3):
        binding.host_in[frame_name][...] = feeds[frame_name].numpy()
        binding.launch()
        binding.sync()
    state = {n: torch.zeros(s.shape) for n, s in plan.input_specs.items() if n in pairs.values()}
    with torch.no_grad():
        for _ in range(3):
            out = plan.execute({frame_name: feeds[frame_name], **state})
            state = {i: out[o].clone() for o, i in pairs.items()}
    for name, value in state.items():
        torch.testing.assert_close(binding.dev_in[name], value, rtol=0, atol=0)


def test_cli_select_choices_are_the_selection_choices():
    """`framefuse build --select` offers exactly what apply_selection accepts (the CLI keeps its
    own list so that parsing arguments does not import torch)."""
    import argparse

    from framefuse.build import cli as build_cli
    from framefuse.engines.fusion import SELECT_CHOICES

    parser = argparse.ArgumentParser()
    build = build_cli.register(parser.add_subparsers())
    (action,) = [a for a in build._actions if "--select" in a.option_strings]
    assert tuple(action.choices) == SELECT_CHOICES


def test_exact_math_reaches_the_step_kernel_and_the_artifact(tmp_path, monkeypatch):
    """`framefuse build --exact-math` (cuda-graph): the build passes it to the selection, which
    compiles every step-kernel candidate with exact IEEE math; the artifact records it and a load
    compiles the same way. Another engine refuses the flag in one line."""
    import shutil

    from framefuse.build import cli
    from framefuse.engines import cuda_graph, fusion
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached("min_gru", {"seq": 32, "seed": 0})["step"]
    shutil.copy(prepared.onnx, tmp_path / "model.onnx")
    shutil.copy(prepared.fused, tmp_path / "model.fused.onnx")
    asked = []
    real_apply = fusion.apply_selection

    def spy(*args, **kwargs):
        asked.append(kwargs.get("exact_math"))
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(fusion, "apply_selection", spy)
    parser = __import__("argparse").ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["build", str(tmp_path), "--engine", "cuda-graph", "--device", "cpu", "--exact-math"])
    assert args.func(args) == 0
    assert asked == [True]
    engine = cuda_graph.load(tmp_path / "engine.ffe", device="cpu")
    assert engine.exact_math and engine.metadata["exact_math"] is True
    assert asked == [True, True]  # the load re-applied the recorded choice with the recorded math
    args = parser.parse_args(["build", str(tmp_path), "--engine", "onnxruntime", "--exact-math"])
    with pytest.raises(Exception, match="--exact-math is an option of the cuda-graph engine"):
        args.func(args)


def test_a_tactic_within_the_timing_noise_of_the_plain_kernel_is_not_kept():
    """The timed selection keeps a step-kernel tactic only when it is measurably faster than the
    plain kernel (engines.fusion.TACTIC_MARGIN): the H100 benchmark of 2026-11-26 had kept
    stepkernel-fewer-blocks for gated_ssm at 19.64 against 19.79 us and stepkernel-pieces for xlstm
    at 27.70 against 27.71."""
    from framefuse.engines.fusion import TACTIC_MARGIN, plain_kernel_within_margin

    assert TACTIC_MARGIN == 0.01
    gated_ssm = {"stepkernel": 19.79, "stepkernel-pieces": 19.73, "stepkernel-fewer-blocks": 19.64, "plan": 60.0}
    assert plain_kernel_within_margin("stepkernel-fewer-blocks", gated_ssm)
    assert plain_kernel_within_margin("stepkernel-pieces", {"stepkernel": 27.71, "stepkernel-pieces": 27.70})
    lstm = {"stepkernel": 17.81, "stepkernel-pieces": 17.37, "stepkernel-fewer-blocks": 20.07}
    assert not plain_kernel_within_margin("stepkernel-pieces", lstm)  # 2.5 % faster: kept
    assert not plain_kernel_within_margin("stepkernel", gated_ssm)
    assert not plain_kernel_within_margin("inductor", {"stepkernel": 20.0, "inductor": 19.9})  # not a tactic
    assert not plain_kernel_within_margin("stepkernel-pieces", {"stepkernel-pieces": 19.0})  # plain not timed


@pytest.mark.parametrize("exact_math", [False, True])
def test_stepkernel_candidate_calls_the_compiler_with_each_tactic_and_the_math(monkeypatch, exact_math, tmp_path):
    """The build's step-kernel candidate reaches the compiler with every tactic's arguments and the
    math asked for, and prepare_step (what CompiledStep does with them first) takes them. The GPU
    path is the only other caller, so a signature drift between the two (2726c76 passed
    ``fast_math`` that compile_step did not take: every build on a GPU lost the step kernel) fails
    here, on the CPU."""
    from types import SimpleNamespace

    from framefuse.compiler import engine as compiler_engine
    from framefuse.engines.fusion import STEPKERNELS, stepkernel_candidate
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached("min_gru", {"seq": 32, "seed": 0})["step"]
    seen = []

    class Recorder:
        def __init__(self, program, *, device, log=None, **kwargs):
            seen.append(kwargs)
            compiler_engine.prepare_step(program, H100_PROPS, **kwargs)  # an argument it does not take raises
            raise RuntimeError("compiled here")

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))

    monkeypatch.setattr(compiler_engine, "CompiledStep", Recorder)
    for name, tactic in STEPKERNELS.items():
        log = []
        candidate = stepkernel_candidate(
            SimpleNamespace(model=str(prepared.fused)),
            SimpleNamespace(device="cpu"),
            log.append,
            name=name,
            exact_math=exact_math,
        )
        assert candidate is None
        assert log == [f"selection: {name} not a candidate (RuntimeError: compiled here)"]
        assert seen[-1]["fast_math"] is (not exact_math)
        # (compose_input, roll_recurrences and split are the lowering's: compile_step passes them to lower_program)
        lowering = ("compose_input", "roll_recurrences", "split")
        assert {k: seen[-1][k] for k in tactic if k not in lowering} == {
            k: v for k, v in tactic.items() if k not in lowering
        }
    assert len(seen) == len(STEPKERNELS)


H100_PROPS = {"cc": (9, 0), "sm_count": 132, "max_shared_per_block_optin": 227 * 1024, "name": "H100"}


def _min_gru_step():
    from framefuse.runtime.pipeline import prepare_cached

    return str(prepare_cached("min_gru", {"seq": 32, "seed": 0})["step"].fused)


def test_prepare_tactics_generates_every_tactic_and_compiles_each_source_once(monkeypatch, tmp_path):
    """The build's tactics, generated for an H100's properties without a GPU: each maps to its own
    settings' source, written to the kernel cache, and a source two tactics share (the skewed ones
    of a step form with no skewed sum) goes to NVRTC once; the compiles run beside the generation."""
    import threading

    from framefuse.compiler.engine import StepSource, prepare_tactics
    from framefuse.engines.fusion import STEPKERNELS, WIDE_THREADS

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    compiled, threads = [], set()

    def compile_image(source):
        compiled.append(source.kernel.digest)
        threads.add(threading.get_ident())
        return 0.25

    log: list[str] = []
    sources = prepare_tactics(_min_gru_step(), H100_PROPS, STEPKERNELS, compile_image=compile_image, log=log.append)
    assert list(sources) == list(STEPKERNELS)
    assert all(isinstance(s, StepSource) for s in sources.values()), sources
    assert threading.get_ident() not in threads  # NVRTC ran on the pool's threads
    digests = {name: s.kernel.digest for name, s in sources.items()}
    assert sorted(compiled) == sorted(set(digests.values()))  # each distinct source once
    assert digests["stepkernel-skewed"] == digests["stepkernel"]  # no skewed sum in a step form
    assert digests["stepkernel-384-threads-skewed"] == digests["stepkernel-384-threads"]
    # nothing to roll: the same program (not lowered nor scheduled again) and the same kernel
    assert sources["stepkernel-unrolled"].program is sources["stepkernel"].program
    assert sources["stepkernel-unrolled"].schedule is sources["stepkernel"].schedule
    assert digests["stepkernel-unrolled"] == digests["stepkernel"]
    # no task copies the same values whole over more than the cap: the plain schedule and kernel
    assert sources["stepkernel-replica-cap"].schedule is sources["stepkernel"].schedule
    assert digests["stepkernel-replica-cap"] == digests["stepkernel"]
    assert digests["stepkernel-384-threads-replica-cap"] == digests["stepkernel-384-threads"]
    # no recurrence whose inputs a ring could load ahead: the 384-thread kernel
    assert digests["stepkernel-384-threads-ahead-4"] == digests["stepkernel-384-threads"]
    assert digests["stepkernel-384-threads-ahead-8"] == digests["stepkernel-384-threads"]
    assert len(set(digests.values())) == len(compiled) >= 5
    assert sources["stepkernel-fewer-blocks"].grid == round(132 * 0.75)
    assert sources["stepkernel-384-threads"].threads == WIDE_THREADS
    assert sources["stepkernel"].grid == 132 and sources["stepkernel"].threads == 256
    assert sources["stepkernel-unframed"].program is not sources["stepkernel"].program  # compose_input off
    assert sources["stepkernel-pieces"].program is sources["stepkernel"].program  # the memo's one lowering
    for s in sources.values():
        assert s.path.parent == tmp_path and s.path.read_text() == s.kernel.source
        assert s.fast_math and s.cc == 90 and s.nvrtc_options == ("-ftz=true", "-prec-div=false", "-prec-sqrt=false")
    assert len(log) == 1 and log[0].startswith(f"stepkernel: {len(compiled)} tactic source(s) generated and compiled")
    assert f"({0.25 * len(compiled):.1f} s of NVRTC compiles" in log[0]


def test_the_split_tactics_are_built_only_where_they_save_levels(monkeypatch, tmp_path):
    """stepkernel-split / -384-threads-split (simplify.SplitProducts): min_gru's out-projections as
    partial sums, 6 -> 4 levels on an H100's grid, the recurrence's state stored by its slices'
    array loop; nn.GRU-style and LSTM cells split nothing that saves a level (their products read
    the state as it came in, or are read row by row), and attention's new K / V rows keep their
    level: declined, each with its reason."""
    from framefuse.compiler.engine import StepSource, prepare_tactics
    from framefuse.compiler.simplify import split_products
    from framefuse.engines.fusion import STEPKERNEL_FEWER_PHASES, STEPKERNEL_SPLIT, STEPKERNEL_WIDE_SPLIT, STEPKERNELS
    from framefuse.runtime.pipeline import prepare_cached

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    names = (STEPKERNEL_FEWER_PHASES, STEPKERNEL_SPLIT, STEPKERNEL_WIDE_SPLIT)
    tactics = {k: STEPKERNELS[k] for k in names}
    full = {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0}
    sources = prepare_tactics(_min_gru_step(), H100_PROPS, tactics, compile_image=lambda s: 0.0)
    assert all(isinstance(s, StepSource) for s in sources.values()), sources
    plain, split = sources[STEPKERNEL_FEWER_PHASES], sources[STEPKERNEL_SPLIT]
    assert (plain.schedule.levels(), split.schedule.levels()) == (6, 4)
    assert split_products(split.program) == 2 and split_products(plain.program) == 0
    assert "stored by the task of node '/linear_out/Gemm'" in split.kernel.source
    assert sources[STEPKERNEL_WIDE_SPLIT].threads == 384
    for arch in ("gru", "lstm", "attention"):
        fused = str(prepare_cached(arch, full)["step"].fused)
        found = prepare_tactics(fused, H100_PROPS, tactics, compile_image=lambda s: 0.0)
        assert isinstance(found[STEPKERNEL_FEWER_PHASES], StepSource), arch
        for name in (STEPKERNEL_SPLIT, STEPKERNEL_WIDE_SPLIT):
            assert isinstance(found[name], Exception), (arch, name)
            assert "not fewer than" in str(found[name]) or "no product" in str(found[name]), found[name]


def test_the_ahead_tactics_unroll_a_one_block_recurrences_loop(bench_script, monkeypatch, tmp_path):
    """stepkernel-384-threads-ahead-4 / -8 (codegen.RECUR_INPUTS_AHEAD at 384 threads): for an
    nn.GRU window whose recurrence is on one block, its inputs taken by the threads past the cells
    (codegen.RECUR_INPUT_HELPERS), sources of their own with the loop unrolled by 4 and by the
    window (7 < 8); the same schedule as stepkernel-384-threads."""
    from framefuse.compiler.engine import prepare_tactics
    from framefuse.engines.fusion import STEPKERNELS

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path / "cache"))
    fused = bench_script("rnn_sizes").export_window("GRU", 64, 7, 1, tmp_path / "window")["fused"]
    names = ("stepkernel-384-threads", "stepkernel-384-threads-ahead-4", "stepkernel-384-threads-ahead-8")
    sources = prepare_tactics(str(fused), H100_PROPS, {k: STEPKERNELS[k] for k in names}, compile_image=lambda s: 0.0)
    plain, four, eight = (sources[k] for k in names)
    assert len({plain.kernel.digest, four.kernel.digest, eight.kernel.digest}) == 3
    assert four.schedule is plain.schedule and eight.schedule is plain.schedule
    assert four.threads == eight.threads == 384
    # the block's threads past the cells take the inputs (codegen.RECUR_INPUT_HELPERS, on): the
    # tactics unroll their loop by 4 and by the window's 7 (of 8)
    assert all("threads past the cells take" in s.kernel.source for s in (plain, four, eight))
    assert "for (int rcd = 0; rcd <" not in plain.kernel.source
    assert "for (int rcd = 0; rcd < 4; ++rcd)" in four.kernel.source and four.kernel.settings.inputs_ahead == 4
    assert "for (int rcd = 0; rcd < 7; ++rcd)" in eight.kernel.source and eight.kernel.settings.inputs_ahead == 8


def test_a_prepared_source_rescheduled_over_fewer_blocks_keeps_its_tactic(monkeypatch, tmp_path):
    """StepSource.rescheduled, the resident kernel limited to ``resident_sms`` SMs: the tactic's
    schedule arguments, code settings and math over the new grid, the source prepare_step gives
    for that tactic there (until session 56 the resident path rebuilt the kernel with the copy
    pieces alone: a fewer-phases or paced or narrow-row candidate lost its settings)."""
    from framefuse.compiler.engine import prepare_step
    from framefuse.compiler.memo import cached_program
    from framefuse.engines.fusion import STEPKERNEL_WIDE_FEWER_PHASES, STEPKERNELS

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    program = cached_program(_min_gru_step())
    tactic = dict(STEPKERNELS[STEPKERNEL_WIDE_FEWER_PHASES], paced_copies=True)
    source = prepare_step(program, H100_PROPS, fast_math=False, **tactic)
    fewer = source.rescheduled(40)
    assert (fewer.grid, fewer.threads, fewer.fast_math, fewer.prefetch) == (40, 384, False, True)
    assert fewer.kernel.settings == source.kernel.settings
    assert fewer.kernel.settings.one_pass and fewer.kernel.settings.paced_copies
    assert fewer.schedule.describe()["recomputed_scalars"] == source.schedule.describe()["recomputed_scalars"]
    direct = prepare_step(program, H100_PROPS, fast_math=False, **dict(tactic, grid=40))
    assert fewer.kernel.identity == direct.kernel.identity
    assert fewer.kernel.identity != prepare_step(program, H100_PROPS, grid=40, threads=384).kernel.identity
    assert fewer.rescheduled(132).kernel.identity == source.kernel.identity


def test_a_prepared_source_with_tagged_outputs_keeps_its_schedule_and_tactic(monkeypatch, tmp_path):
    """StepSource.with_settings, the resident binding's kernel with outputs as tagged words
    (stepkernel.RESIDENT_TAGGED_OUTPUTS) beside a launched kernel without them: the same schedule,
    grid, threads, math and every other code setting, the same shared memory layout and range
    table (resident_fn refuses another), over the full grid and over fewer blocks."""
    import numpy as np

    from framefuse.compiler.codegen import CodeSettings
    from framefuse.compiler.engine import prepare_step
    from framefuse.compiler.memo import cached_program
    from framefuse.engines.fusion import STEPKERNEL_WIDE_FEWER_PHASES, STEPKERNELS

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    program = cached_program(_min_gru_step())
    tactic = dict(STEPKERNELS[STEPKERNEL_WIDE_FEWER_PHASES], paced_copies=True)
    source = prepare_step(program, H100_PROPS, fast_math=False, **tactic)
    assert not source.kernel.tagged_outputs
    for plain in (source, source.rescheduled(40)):
        tagged = plain.with_settings(tagged_outputs=True)
        assert tagged.kernel.tagged_outputs and "ffk_store_host_word" in tagged.kernel.source
        assert (tagged.grid, tagged.threads, tagged.fast_math, tagged.prefetch) == (
            plain.grid,
            plain.threads,
            plain.fast_math,
            plain.prefetch,
        )
        assert tagged.kernel.settings == CodeSettings.of(plain.kernel.settings, tagged_outputs=True)
        assert tagged.kernel.settings.one_pass and tagged.kernel.settings.paced_copies
        assert tagged.kernel.smem_bytes == plain.kernel.smem_bytes
        assert np.array_equal(tagged.kernel.ranges(), plain.kernel.ranges())
        assert tagged.schedule.describe() == plain.schedule.describe()
        # fewer done words: the blocks that only write outputs raise none
        assert 1 <= tagged.kernel.done_words <= plain.kernel.done_words
        assert tagged.with_settings(tagged_outputs=False).kernel.identity == plain.kernel.identity


def test_replica_cap_tactics_put_attentions_output_projections_on_fewer_blocks(monkeypatch, tmp_path):
    """At the benchmark's size (embed 256) every block of attention's output projection copies both
    KV caches (8159 floats a layer) on up to 128 blocks; the replica-cap tactics schedule those
    tasks on REPLICA_CAP_FLOATS / 8159 = 32 blocks and nothing else (same levels), each with its
    own source."""
    from framefuse.compiler import schedule as scheduling
    from framefuse.compiler.engine import prepare_tactics
    from framefuse.engines.fusion import REPLICA_CAP_FLOATS, STEPKERNELS
    from framefuse.runtime.pipeline import prepare_cached

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    model = str(prepare_cached("attention", {"model": {"embed": 256, "layers": 2}, "seed": 0})["step"].fused)
    names = ("stepkernel", "stepkernel-replica-cap", "stepkernel-384-threads", "stepkernel-384-threads-replica-cap")
    sources = prepare_tactics(model, H100_PROPS, {k: STEPKERNELS[k] for k in names}, compile_image=lambda s: 0.0)
    for plain, capped in ((names[0], names[1]), (names[2], names[3])):
        before, after = sources[plain].schedule, sources[capped].schedule
        assert scheduling.replica_capped(before, REPLICA_CAP_FLOATS)
        assert not scheduling.replica_capped(after, REPLICA_CAP_FLOATS)
        heavy = {i: t.blocks for i, t in enumerate(before.tasks) if scheduling.replicated_floats(t) > 4096}
        assert len(heavy) == 2 and max(heavy.values()) > 32, heavy  # the two layers' output projections
        for i in heavy:
            per_block = scheduling.replicated_floats(after.tasks[i])
            assert after.tasks[i].blocks <= REPLICA_CAP_FLOATS // per_block == 32
        assert after.levels() == before.levels() and len(after.tasks) == len(before.tasks)
        assert sources[capped].kernel.digest != sources[plain].kernel.digest
        assert sources[capped].threads == sources[plain].threads


def test_prepare_tactics_reports_each_declined_tactic_with_its_own_error(monkeypatch, tmp_path):
    """NVRTC failing on one source declines the tactics of that source only; a GPU the kernel cannot
    run on declines the first tactic, and the others are not tried (one error, no compile)."""
    from framefuse.compiler.engine import StepSource, prepare_tactics
    from framefuse.compiler.ir import CompileError
    from framefuse.engines.fusion import STEPKERNELS
    from framefuse.plugins.cuda import KernelCompileError

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    model = _min_gru_step()
    tactics = {k: STEPKERNELS[k] for k in ("stepkernel", "stepkernel-384-threads", "stepkernel-384-threads-skewed")}

    def compile_image(source):
        if source.threads == 384:
            raise KernelCompileError(f"NVRTC could not compile {source.path.name}: too many resources")
        return 0.0

    sources = prepare_tactics(model, H100_PROPS, tactics, compile_image=compile_image)
    assert isinstance(sources["stepkernel"], StepSource)
    for name in ("stepkernel-384-threads", "stepkernel-384-threads-skewed"):
        assert isinstance(sources[name], KernelCompileError) and "too many resources" in str(sources[name])

    calls = []
    turing = dict(H100_PROPS, cc=(7, 5), name="T4")
    sources = prepare_tactics(model, turing, tactics, compile_image=lambda s: calls.append(s) or 0.0)
    errors = set(map(id, sources.values()))
    assert len(errors) == 1 and not calls
    assert isinstance(sources["stepkernel"], CompileError) and "compute capability 8.0+" in str(sources["stepkernel"])


def test_the_unrolled_tactic_compiles_the_copies_unless_there_are_too_many(control_flow_graphs, monkeypatch, tmp_path):
    """An MLP cell's loop: the plain tactic compiles it rolled (one BodyLoop), stepkernel-unrolled the
    copies, for the build to time both; past UNROLLED_TACTIC_MAX_NODES nodes the unrolled program is
    not scheduled (minutes at T = 32) and the tactic is declined with its node count."""
    import onnx

    from framefuse.compiler import engine as compiler_engine
    from framefuse.compiler import memo
    from framefuse.compiler.engine import StepSource, prepare_tactics
    from framefuse.compiler.ir import CompileError
    from framefuse.engines.fusion import STEPKERNELS
    from framefuse.rewrite import rewrite_model

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    fused, _ = rewrite_model(control_flow_graphs.mlp_cell_loop())
    path = tmp_path / "model.fused.onnx"
    onnx.save(fused, str(path))
    tactics = {k: STEPKERNELS[k] for k in ("stepkernel", "stepkernel-unrolled")}
    sources = prepare_tactics(str(path), H100_PROPS, tactics, compile_image=lambda s: 0.0)
    assert sources["stepkernel"].program.counts()["bodyloop"] == 1
    unrolled = sources["stepkernel-unrolled"]
    assert isinstance(unrolled, StepSource) and "bodyloop" not in unrolled.program.counts()
    nodes = len(unrolled.program.nodes())
    memo.clear()
    monkeypatch.setattr(compiler_engine, "UNROLLED_TACTIC_MAX_NODES", nodes - 1)
    sources = prepare_tactics(str(path), H100_PROPS, tactics, compile_image=lambda s: 0.0)
    assert isinstance(sources["stepkernel"], StepSource)
    declined = sources["stepkernel-unrolled"]
    assert isinstance(declined, CompileError) and f"the unrolled program has {nodes} nodes" in str(declined)


def test_stepkernel_candidates_load_each_distinct_tactic_from_its_prepared_source(monkeypatch, tmp_path):
    """The timed build's step-kernel candidates: every tactic's prepared source reaches CompiledStep
    (the math asked for in it), a tactic whose kernel another already has is dropped, and the plain
    kernel declined at load stops the rest, each decline logged on one line."""
    from types import SimpleNamespace

    from framefuse.compiler import engine as compiler_engine
    from framefuse.engines import stepkernel as stepkernel_engine
    from framefuse.engines.fusion import STEPKERNELS, UNTIMED_TACTICS, stepkernel_candidates

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    monkeypatch.setattr(compiler_engine, "device_properties", lambda device: dict(H100_PROPS))
    monkeypatch.setattr(compiler_engine, "_compile_image", lambda source: 0.0)
    loaded = []

    class Loaded:
        def __init__(self, program, *, device, source, log):
            loaded.append(source)
            self.kernel = source.kernel

    class Plan:
        def __init__(self, compiled, inputs, outputs):
            self.compiled = compiled

    monkeypatch.setattr(compiler_engine, "CompiledStep", Loaded)
    monkeypatch.setattr(stepkernel_engine, "StepKernelPlan", Plan)
    executor = SimpleNamespace(model=_min_gru_step())
    plan = SimpleNamespace(device="cuda", input_specs={}, output_specs={})
    for exact_math in (False, True):
        log: list[str] = []
        loaded.clear()
        candidates = stepkernel_candidates(executor, plan, log.append, exact_math=exact_math)
        same = {  # kernels here: nothing skewed, rolled, copied whole over the cap or held in registers
            "stepkernel-skewed",  # and shared memory (no recurrence) in min_gru's step
            "stepkernel-384-threads-skewed",
            "stepkernel-unrolled",
            "stepkernel-replica-cap",
            "stepkernel-384-threads-replica-cap",
            "stepkernel-512-threads",
            "stepkernel-lanes",
            "stepkernel-384-threads-ahead-4",  # no one-block recurrence: stepkernel-384-threads
            "stepkernel-384-threads-ahead-8",
        }
        assert list(candidates) == [k for k in STEPKERNELS if k not in same and k not in UNTIMED_TACTICS]
        assert [c.compiled.kernel.identity for c in candidates.values()] == [s.kernel.identity for s in loaded]
        assert all(s.fast_math is (not exact_math) for s in loaded)
        assert len(log) == 1 and "tactic source(s) generated and compiled" in log[0]

    class Declined(Loaded):
        def __init__(self, program, *, device, source, log):
            raise compiler_engine.CompileError("the step kernel's 132 blocks cannot all be resident")

    monkeypatch.setenv("FRAMEFUSE_NVRTC_WORKERS", "none")
    with pytest.raises(compiler_engine.CompileError, match="FRAMEFUSE_NVRTC_WORKERS='none'"):
        stepkernel_candidates(executor, plan, [].append)
    monkeypatch.delenv("FRAMEFUSE_NVRTC_WORKERS")
    monkeypatch.setattr(compiler_engine, "CompiledStep", Declined)
    log = []
    assert stepkernel_candidates(executor, plan, log.append) == {}
    assert log[-1] == (
        "selection: stepkernel not a candidate (CompileError: the step kernel's 132 blocks cannot all be resident)"
    )


def test_nvrtc_workers_come_from_the_environment_or_refuse_a_bad_value(monkeypatch):
    from framefuse.compiler.engine import NVRTC_WORKERS, nvrtc_workers
    from framefuse.compiler.ir import CompileError

    monkeypatch.delenv("FRAMEFUSE_NVRTC_WORKERS", raising=False)
    assert nvrtc_workers() == NVRTC_WORKERS
    monkeypatch.setenv("FRAMEFUSE_NVRTC_WORKERS", "3")
    assert nvrtc_workers() == 3
    for bad in ("0", "-2", "eight", "1.5"):
        monkeypatch.setenv("FRAMEFUSE_NVRTC_WORKERS", bad)
        with pytest.raises(CompileError, match=rf"FRAMEFUSE_NVRTC_WORKERS='{re.escape(bad)}': give a whole number"):
            nvrtc_workers()


def test_the_unrolled_tactic_keeps_the_copies_the_other_tactics_roll(monkeypatch, tmp_path, control_flow_graphs):
    """An Elman cell's copies (an ONNX Scan the lowering unrolled): every tactic but
    stepkernel-unrolled gets one ir.Recur; that one lowers the program again with the copies kept,
    a source of its own for the build to time against the loop."""
    from framefuse.compiler.engine import prepare_tactics
    from framefuse.compiler.simplify import rolled_recurrences
    from framefuse.engines.fusion import STEPKERNELS

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    tactics = {k: STEPKERNELS[k] for k in ("stepkernel", "stepkernel-unrolled")}
    sources = prepare_tactics(
        control_flow_graphs.elman_scan(state=True), H100_PROPS, tactics, compile_image=lambda s: 0.0
    )
    rolled, unrolled = sources["stepkernel"], sources["stepkernel-unrolled"]
    assert rolled_recurrences(rolled.program) == 1 and rolled_recurrences(unrolled.program) == 0
    assert rolled.program.counts()["recur"] == 1
    assert unrolled.program.counts()["tanh"] == control_flow_graphs.STEPS
    assert rolled.kernel.digest != unrolled.kernel.digest


# -- a precision build's step kernels (issue 19 item 4) -----------------------------------------------------


def _converted_min_gru(precision, tmp_path):
    import onnx

    from framefuse.precision import convert_model
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached("min_gru", {"model": {"embed": 32, "layers": 2}, "seq": 4, "seed": 0})["step"]
    model = convert_model(onnx.load(str(prepared.fused)), precision, config=prepared.manifest["config"])
    path = tmp_path / f"model.fused.{precision}.onnx"
    onnx.save(model, str(path))
    return prepared, path


def test_a_precision_build_times_every_tactic_twice_from_its_graph_as_stored(monkeypatch, tmp_path):
    """stepkernel_tactics: an fp32 build's are STEPKERNELS; an fp16 / bf16 build's lower its graph
    with widened storage and repeat every tactic with the precision's rows ("<tactic>@<format>",
    lossless); int8's graph lowers as it is. prepare_tactics makes them for an H100 without a GPU:
    a twin has the float32 kernel's program (lowered once) and schedule, reads narrow exactly the
    products whose rows the format stores, and those rows are the program's own, bit for bit."""
    import numpy as np

    from framefuse.compiler.codegen import stores_exactly
    from framefuse.compiler.engine import StepSource, prepare_tactics
    from framefuse.engines.fusion import (
        STEPKERNELS,
        UNTIMED_TACTICS,
        candidate_name,
        split_candidate,
        stepkernel_tactics,
    )

    timed = {k: v for k, v in STEPKERNELS.items() if k not in UNTIMED_TACTICS}
    assert UNTIMED_TACTICS and set(UNTIMED_TACTICS) <= set(STEPKERNELS)
    assert stepkernel_tactics("fp32") == timed
    int8 = stepkernel_tactics("int8")
    assert set(int8) == set(timed) | {f"{t}@int8" for t in timed}
    assert not any("widen_storage" in a for a in int8.values())
    fp16 = stepkernel_tactics("fp16")
    assert all(a["widen_storage"] for a in fp16.values())
    for tactic in timed:
        twin = fp16[candidate_name(tactic, "fp16")]
        assert split_candidate(candidate_name(tactic, "fp16")) == (tactic, "fp16")
        assert twin == {**STEPKERNELS[tactic], "widen_storage": True, "weight_format": "fp16", "lossless_rows": True}

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path / "cache"))
    _, path = _converted_min_gru("fp16", tmp_path)
    chosen = {k: fp16[k] for k in ("stepkernel", "stepkernel@fp16", "stepkernel-384-threads@fp16")}
    sources = prepare_tactics(path, H100_PROPS, chosen, compile_image=lambda source: 0.0)
    assert all(isinstance(s, StepSource) for s in sources.values()), sources
    plain, twin = sources["stepkernel"], sources["stepkernel@fp16"]
    assert twin.program is plain.program and twin.schedule is plain.schedule
    assert not plain.kernel.layout.narrow and plain.kernel.settings.weight_format == "fp32"
    dots = {u.node.id: u.node for t in twin.schedule.tasks for u in t.units.values() if u.how == "dot"}
    assert twin.kernel.layout.narrow and twin.kernel.describe()["lossless_rows"]
    assert set(twin.kernel.layout.narrow) == {i for i, d in dots.items() if stores_exactly(d.rows, "fp16")}
    for nid, rows in twin.kernel.dot_rows().items():
        assert np.array_equal(rows, dots[nid].rows)
    assert twin.kernel.describe()["weight_bytes"] < plain.kernel.describe()["weight_bytes"]
    assert sources["stepkernel-384-threads@fp16"].threads == 384


def test_a_selection_name_says_its_tactic_and_its_rows():
    """check_select: the selection choices, and a tactic with its build's narrow rows; rows of
    another precision, or rows on what is not a step kernel, are refused in one line."""
    from framefuse.engines.base import EngineBuildError
    from framefuse.engines.fusion import check_select

    assert check_select("time") == ("time", "fp32")
    assert check_select("stepkernel-384-threads", "fp16") == ("stepkernel-384-threads", "fp32")
    assert check_select("stepkernel-paced@bf16", "bf16") == ("stepkernel-paced", "bf16")
    assert check_select("stepkernel@int8", "int8") == ("stepkernel", "int8")
    with pytest.raises(
        EngineBuildError, match=r"select 'stepkernel@fp16': fp16 weight rows belong to a fp16 build, this one is bf16"
    ):
        check_select("stepkernel@fp16", "bf16")
    with pytest.raises(EngineBuildError, match="this one is fp32"):
        check_select("stepkernel@fp16")
    for bad in ("inductor@fp16", "stepkernel-fast", "stepkernel@fp8"):
        with pytest.raises(EngineBuildError, match="select must be one of|weight rows belong"):
            check_select(bad, "fp16")


def test_a_precision_build_keeps_its_narrow_rows_within_the_noise_and_says_how_it_compares_with_fp32():
    """The timed selection of a precision build: a float32-row kernel that beat its narrow twin by
    less than TACTIC_MARGIN gives way to the twin (the same numbers in the precision asked for);
    the plain-kernel rule holds within one row format; the chosen candidate is compared with the
    fastest step kernel of the fp32 graph timed in the same rounds."""
    from framefuse.engines.fusion import (
        FP32_REFERENCE,
        comparison_line,
        fp32_comparison,
        narrow_rows_within_margin,
        plain_kernel_within_margin,
    )

    timings = {"stepkernel": 20.0, "stepkernel@fp16": 20.1, "stepkernel-pieces": 19.0, "stepkernel-pieces@fp16": 19.1}
    assert narrow_rows_within_margin("stepkernel-pieces", timings, "fp16") == "stepkernel-pieces@fp16"
    assert narrow_rows_within_margin("stepkernel-pieces", {**timings, "stepkernel-pieces@fp16": 19.5}, "fp16") is None
    assert narrow_rows_within_margin("stepkernel-pieces@fp16", timings, "fp16") is None  # already narrow
    assert narrow_rows_within_margin("stepkernel-pieces", timings, "fp32") is None  # an fp32 build has no twin
    assert narrow_rows_within_margin("inductor", {"inductor": 1.0}, "fp16") is None
    assert not plain_kernel_within_margin("stepkernel-pieces@fp16", timings)  # 5 % faster than stepkernel@fp16
    assert plain_kernel_within_margin("stepkernel-pieces@fp16", {**timings, "stepkernel-pieces@fp16": 20.0})

    report = {
        "chosen": "stepkernel-pieces@fp16",
        "candidates": {
            "stepkernel-pieces@fp16": {"us_per_step": 19.1},
            "plan": {"us_per_step": 60.0},
            FP32_REFERENCE + "stepkernel": {"us_per_step": 19.6, "reference": True},
            FP32_REFERENCE + "stepkernel-pieces": {"us_per_step": 18.0, "reference": True},
            FP32_REFERENCE + "stepkernel-paced": {"error": "declined", "reference": True},
        },
    }
    comparison = fp32_comparison(report, "fp16")
    assert comparison == {
        "precision": "fp16",
        "chosen": "stepkernel-pieces@fp16",
        "us_per_step": 19.1,
        "fp32_reference": "stepkernel-pieces",
        "fp32_us_per_step": 18.0,
        "slower": True,
    }
    assert comparison_line(comparison).endswith("this fp16 build is SLOWER than the fp32 build (6.1%)")
    report["candidates"][FP32_REFERENCE + "stepkernel-pieces"]["us_per_step"] = 18.95  # within the margin
    line = comparison_line(fp32_comparison(report, "fp16"))
    assert line == (
        "the fp16 build's stepkernel-pieces@fp16 takes 19.10 us against 18.95 us for the fp32 graph's "
        "stepkernel-pieces: not slower than the fp32 build"
    )
    assert fp32_comparison({"chosen": "plan", "candidates": {"plan": {"us_per_step": 3.0}}}, "fp16") is None


def test_the_timed_selection_of_a_precision_build_on_a_gpu_end_to_end_of_its_logic(monkeypatch):
    """apply_selection's timed path for an fp16 build, with the compiler and the timing replaced
    (the GPU run is tests/gpu/test_stepkernel.py::test_a_precision_build_on_the_gpu): the build's
    step kernels are asked for with the precision, the fp32 graph's as references, every candidate
    is checked within the precision's tolerance relative to the outputs, the narrow twin is kept
    within the noise, and the report says how the choice compares with fp32."""
    from types import SimpleNamespace

    import torch

    from framefuse.config import PRECISION_TOLERANCE
    from framefuse.engines import fusion

    asked, seen = [], {}

    class Compiled:
        def __init__(self, name):
            self.name = name

        def describe(self):
            return {"weight_format": fusion.split_candidate(self.name)[1], "name": self.name}

    def candidates(executor, plan, say, *, exact_math=False, precision="fp32"):
        asked.append((executor.model, precision))
        names = ["stepkernel", "stepkernel-pieces"]
        if precision != "fp32":
            names += [fusion.candidate_name(n, precision) for n in names]
        return {n: SimpleNamespace(compiled=Compiled(n)) for n in names}

    times = {
        "plan": 80.0,
        "inductor": 70.0,
        "stepkernel": 20.0,
        "stepkernel-pieces": 18.0,
        "stepkernel@fp16": 20.2,
        "stepkernel-pieces@fp16": 18.1,
    }

    def select(plan, *, alternatives, modes, compile_also, references, tolerance, relative, log):
        seen.update(
            tolerance=tolerance, relative=relative, references=sorted(references), alternatives=sorted(alternatives)
        )
        report = {name: {"us_per_step": t} for name, t in times.items()}
        report.update({name: {"us_per_step": 17.5, "reference": True} for name in references})
        chosen = min(times, key=times.get)
        return alternatives.get(chosen, plan), {"chosen": chosen, "candidates": report}

    monkeypatch.setattr(fusion, "stepkernel_candidates", candidates)
    monkeypatch.setattr(fusion, "select_plan", select)
    executor = SimpleNamespace(model="model.fused.fp16.onnx", optimize=False)
    plan = SimpleNamespace(device=torch.device("cuda"), input_specs={}, output_specs={})
    lines = []
    chosen, report = fusion.apply_selection(
        executor, plan, "time", precision="fp16", fp32_graph="model.fused.onnx", log=lines.append
    )
    assert asked == [("model.fused.fp16.onnx", "fp16"), ("model.fused.onnx", "fp32")]
    assert seen["tolerance"] == PRECISION_TOLERANCE["fp16"] and seen["relative"]
    assert seen["references"] == [fusion.FP32_REFERENCE + "stepkernel", fusion.FP32_REFERENCE + "stepkernel-pieces"]
    assert report["chosen"] == "stepkernel-pieces@fp16" and chosen.compiled.name == "stepkernel-pieces@fp16"
    assert report["stepkernel"] == {"weight_format": "fp16", "name": "stepkernel-pieces@fp16"}
    assert report["vs_fp32"]["slower"] and report["vs_fp32"]["fp32_us_per_step"] == 17.5
    assert any("the fp16 rows are kept" in line for line in lines)
    assert lines[-1].startswith("selection: the fp16 build's stepkernel-pieces@fp16 takes 18.10 us")
    assert report["candidates"][fusion.FP32_REFERENCE + "stepkernel"]["kernel"]["name"] == "stepkernel"
    # where the build's time went, logged and recorded (select_plan adds its own phases on a GPU)
    assert list(report["phase_s"]) == ["unoptimized plan", "step kernels", "references and the unfused plan"]
    assert all(seconds >= 0 for seconds in report["phase_s"].values())
    assert any(line.startswith("selection: seconds by phase, unoptimized plan ") for line in lines)

    asked.clear()
    chosen, report = fusion.apply_selection(executor, plan, "time")  # an fp32 build: as before
    assert asked == [("model.fused.fp16.onnx", "fp32")]
    assert seen["tolerance"] == fusion.PARITY_TOLERANCE and not seen["relative"] and not seen["references"]
    assert report["chosen"] == "stepkernel-pieces" and "vs_fp32" not in report


def test_a_precision_build_hands_the_cuda_graph_engine_its_fp32_graph(tmp_path, monkeypatch):
    """framefuse.build: an fp16 build of the cuda-graph engine names the fp32 graph (the engine's
    fp32_graph option: on a GPU its step kernels are timed beside); the converted graph is what
    the engine runs and records, its precision set before the selection, and a load keeps it."""
    import shutil

    from framefuse.build import build_engine
    from framefuse.engines import cuda_graph

    prepared, _ = _converted_min_gru("fp16", tmp_path)
    folder = tmp_path / "min_gru-step"
    folder.mkdir()
    for path in prepared.onnx.parent.iterdir():
        if path.is_file():
            shutil.copy(path, folder / path.name)
    seen = {}
    real = cuda_graph.CudaGraphEngine.__init__

    def spy(self, source, **kwargs):
        seen.update(kwargs)
        real(self, source, **kwargs)

    monkeypatch.setattr(cuda_graph.CudaGraphEngine, "__init__", spy)
    built = build_engine(folder, engine="cuda-graph", precision="fp16", device="cpu", out=folder, gate=(50, None))
    assert seen["precision"] == "fp16" and seen["fp32_graph"] == folder / "model.fused.onnx"
    assert built.source == folder / "model.fused.fp16.onnx" and built.runner.precision == "fp16"
    seen.clear()
    loaded = cuda_graph.load(folder / "engine.ffe", device="cpu")
    assert loaded.precision == "fp16" and seen["precision"] == "fp16" and seen.get("fp32_graph") is None


@pytest.mark.parametrize("arch,precision", [("lstm", "fp16"), ("gru", "bf16"), ("mamba", "int8")])
def test_a_precision_artifacts_graph_generates_the_kernel_its_build_compiled(arch, precision):
    """A load compiles the recorded step kernel from the artifact's graph (the engine's folded
    model: the converted graph's Casts of constants folded into fp16 / bf16 initializers), which
    generates the very kernel the build compiled from the converted graph: source, range table
    and weight buffer, the narrow rows included."""
    import hashlib

    import onnx

    from framefuse.compiler import generate_source
    from framefuse.engines.cuda_graph import CudaGraphEngine
    from framefuse.precision import convert_model
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached(arch, {"model": {"embed": 32, "layers": 2}, "seq": 4, "seed": 0})["step"]
    converted = convert_model(onnx.load(str(prepared.fused)), precision, config=prepared.manifest["config"])
    engine = CudaGraphEngine(converted, device="cpu", precision=precision)
    folded = engine.executor.folded_model(engine.default_shapes)

    def identity(model):
        kernel = generate_source(
            model, grid=8, threads=128, widen_storage=precision != "int8", weight_format=precision, lossless_rows=True
        )
        assert kernel.layout.narrow
        return hashlib.sha256(kernel.source.encode() + kernel.ranges().tobytes() + kernel.weights().tobytes()).digest()

    assert identity(folded) == identity(converted)


def test_the_frame_gap_is_a_byte_count_the_environment_can_replace(monkeypatch):
    """framegap: FRAMEFUSE_FRAME_GAP_BYTES takes a byte count with K/M/G (powers of two), 0 means
    back to back (no sweep), anything else is refused in one line naming the variable; the sweep
    writes every cache line of its buffer on every call and allocates nothing per call."""
    import tracemalloc

    from framefuse.engines import framegap

    monkeypatch.delenv(framegap.FRAME_GAP_ENV, raising=False)
    assert framegap.frame_gap_bytes() == framegap.FRAME_GAP_BYTES == 32 << 20
    for text, value in (("0", 0), ("4096", 4096), ("8M", 8 << 20), ("512 KiB", 512 << 10), ("1g", 1 << 30)):
        monkeypatch.setenv(framegap.FRAME_GAP_ENV, text)
        assert framegap.frame_gap_bytes() == value
    monkeypatch.setenv(framegap.FRAME_GAP_ENV, "0")
    assert framegap.frame_gap(hz=0) is None
    for bad in ("-1", "32 parsecs", "lots", "1.5M"):
        monkeypatch.setenv(framegap.FRAME_GAP_ENV, bad)
        with pytest.raises(ValueError, match=f"{framegap.FRAME_GAP_ENV}='{re.escape(bad)}'"):
            framegap.frame_gap_bytes()
    assert framegap.describe(32 << 20) == "32 MiB" and framegap.describe(1000) == "1000 bytes"

    # the pace: FRAMEFUSE_FRAME_HZ (default 60, 0: none), the wait for the next tick of that clock
    monkeypatch.delenv(framegap.FRAME_HZ_ENV, raising=False)
    assert framegap.frame_hz() == framegap.FRAME_HZ == 60.0
    for bad in ("-5", "fast", "nan", "inf"):
        monkeypatch.setenv(framegap.FRAME_HZ_ENV, bad)
        with pytest.raises(ValueError, match=f"{framegap.FRAME_HZ_ENV}='{bad}'"):
            framegap.frame_hz()
    monkeypatch.setenv(framegap.FRAME_HZ_ENV, "0")
    assert framegap.frame_gap(0) is None and framegap.frame_gap(0, 0) is None
    gap = framegap.frame_gap(1 << 20)
    assert gap.pacer is None and gap.describe() == "1 MiB written between frames"
    gap = framegap.frame_gap(0, 200.0)
    assert gap.sweep is None and gap.describe() == "frames paced at 200 Hz"
    import time

    gap()  # the first tick
    start = time.perf_counter()
    for _ in range(4):
        gap()
    assert time.perf_counter() - start >= 4 * 0.005 * 0.9  # four more ticks of a 200 Hz clock
    time.sleep(0.02)  # behind the clock: no wait, the ticks start again from now
    start = time.perf_counter()
    gap()
    assert time.perf_counter() - start < 0.005
    both = framegap.frame_gap(4096, 60.0)
    assert both.describe() == "4 KiB written between frames and frames paced at 60 Hz"
    assert (both.nbytes, both.hz) == (4096, 60.0)

    sweep = framegap.frame_gap(1 << 20, hz=0).sweep
    assert sweep.nbytes == 1 << 20 and sweep._buffer.nbytes == 1 << 20
    sweep()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            sweep()
        assert tracemalloc.get_traced_memory()[0] == before
    finally:
        tracemalloc.stop()
    assert (sweep._buffer == 4).all()  # every element written on every call
    with pytest.raises(ValueError, match="positive"):
        framegap.CacheSweep(0)


class _OnTheCpu:  # a candidate that runs on the CPU (as engines.cpustep.CpuStepPlan says of itself)
    host_only = True


class _OnTheGpu:
    host_only = False


def _gap_timing(results, calls):
    """A time_plans_host stand-in that answers ``results`` and records what it was asked."""

    def time_host(plans, feeds, **kwargs):
        calls.append((sorted(plans), kwargs))
        return {name: results[name] for name in plans}

    return time_host


def test_a_cpu_step_is_kept_only_when_it_also_answers_first_between_frames(monkeypatch):
    """The CPU step answers first back to back from caches that hold its weights; it is kept only
    when it also answers first with a cache sweep between frames, timed against the fastest GPU
    candidate in the same rounds, the sweep before every call. The decision and its report."""
    from framefuse.engines import framegap, fusion

    monkeypatch.delenv(framegap.FRAME_HZ_ENV, raising=False)
    timed = {"cpustep": _OnTheCpu(), "stepkernel": _OnTheGpu(), "plan": _OnTheGpu()}
    timings = {"cpustep": 20.0, "stepkernel": 22.0, "plan": 60.0}
    calls = []
    cold = {
        "cpustep": {"us_per_step": 45.0, "p99_us": 80.0, "calls": 120},
        "stepkernel": {"us_per_step": 24.0, "p99_us": 30.0, "calls": 120},
    }
    kept, gap = fusion.keep_host_step_between_frames(
        "cpustep", timed, timings, {}, nbytes=1 << 20, time_host=_gap_timing(cold, calls)
    )
    assert kept == "stepkernel" and gap["kept"] == "stepkernel" and gap["bytes"] == 1 << 20
    ((names, kwargs),) = calls
    assert names == ["cpustep", "stepkernel"]  # the fastest GPU candidate, not every one
    between = kwargs["between_frames"]
    assert isinstance(between, framegap.FrameGap) and (between.nbytes, between.hz) == (1 << 20, 60.0)
    assert gap["hz"] == 60.0
    assert (kwargs["rounds"], kwargs["calls"]) == (fusion.FRAME_GAP_ROUNDS, fusion.FRAME_GAP_CALLS)
    assert "not with 1 MiB written between frames and frames paced at 60 Hz" in gap["log"][-1]
    assert "45.0 us against 24.0" in gap["log"][-1]

    cold["cpustep"]["us_per_step"] = 23.0  # faster both ways: kept
    kept, gap = fusion.keep_host_step_between_frames(
        "cpustep", timed, timings, {}, nbytes=1 << 20, time_host=_gap_timing(cold, calls)
    )
    assert kept == "cpustep" and "kept" in gap["log"][-1]

    failed = {**cold, "cpustep": {"error": "host timing: RuntimeError: boom"}}
    kept, gap = fusion.keep_host_step_between_frames(
        "cpustep", timed, timings, {}, nbytes=1 << 20, time_host=_gap_timing(failed, calls)
    )
    assert kept == "stepkernel" and "boom" in gap["log"][0]
    failed = {**cold, "stepkernel": {"error": "host timing: RuntimeError: boom"}}
    kept, _ = fusion.keep_host_step_between_frames(
        "cpustep", timed, timings, {}, nbytes=1 << 20, time_host=_gap_timing(failed, calls)
    )
    assert kept == "cpustep"

    # nothing to compare: nothing timed again
    calls.clear()
    assert fusion.keep_host_step_between_frames(
        "stepkernel", timed, timings, {}, time_host=_gap_timing(cold, calls)
    ) == (
        "stepkernel",
        None,
    )
    assert fusion.keep_host_step_between_frames(
        "cpustep", timed, timings, {}, nbytes=0, hz=0, time_host=_gap_timing(cold, calls)
    ) == ("cpustep", None)
    only_cpu = {"cpustep": timed["cpustep"]}
    assert fusion.keep_host_step_between_frames(
        "cpustep", only_cpu, {"cpustep": 20.0}, {}, nbytes=1 << 20, time_host=_gap_timing(cold, calls)
    ) == ("cpustep", None)
    assert calls == []


def test_a_candidate_within_the_timing_budget_gets_every_call_and_a_slow_one_fewer():
    from framefuse.engines import fusion

    budget = fusion.calls_within_budget
    assert budget(200, 5, 0.002, 2.0, 10) == 200  # 2 ms a call: 1,000 calls fit 2 s exactly
    assert budget(200, 5, 0.017, 2.0, 10) == 23  # nn.LSTM 1024 / 32 / 2's plan: 23 a round, 2 s
    assert budget(200, 5, 10.0, 2.0, 10) == 10  # never below the floor
    assert budget(4, 5, 10.0, 2.0, 10) == 4  # nor above what was asked
    assert budget(200, 5, 10.0, None, 10) == 200  # no budget
    assert budget(200, 5, 0.0, 2.0, 10) == 200  # nothing measured (no warm-up)


def test_host_timing_gives_a_slow_candidate_fewer_calls_and_a_shorter_warm_up(fused_models, monkeypatch):
    """time_plans_host sizes a candidate's calls by the fastest of its first warm-up calls: one that
    takes 50 ms a call (a clock moved 50 ms by each call) gets 2 s / (2 rounds x 50 ms) = 20 calls a
    round of the 100 asked and a warm-up of 0.2 s (4 calls: the 3 probes and one); the game between
    frames runs before each of them."""
    from framefuse.engines import fusion

    model = fused_models("min_gru", "step")
    _, plan = _plans(model)
    feeds = _feeds(plan, seed=3)
    ran = []
    now = [0]

    def clock():
        now[0] += 50_000_000  # a call is the time between its two reads: 50 ms
        return now[0]

    monkeypatch.setattr(fusion.time, "perf_counter_ns", clock)
    results = fusion.time_plans_host(
        {"plan": plan}, feeds, rounds=2, calls=100, warmup=5, between_frames=lambda: ran.append(1), budget_s=2.0
    )
    monkeypatch.undo()
    assert results["plan"]["calls"] == 40 and results["plan"]["us_per_step"] == 50_000.0
    assert len(ran) == 4 + 40


def test_host_timing_runs_the_game_between_frames_outside_the_clock(fused_models, monkeypatch):
    """time_plans_host's between_frames runs once before every call (warm-up included), outside
    the call's clock; the frame-gap check runs through it on real candidates (the CPU step and a
    plan, both on this machine's CPU): each is timed FRAME_GAP_ROUNDS x FRAME_GAP_CALLS times."""
    from framefuse.engines import framegap, fusion
    from framefuse.engines.cpustep import CpuStepPlan

    model = fused_models("min_gru", "step")
    plain, plan = _plans(model)
    feeds = _feeds(plan, seed=3)
    ran = []
    now = [0]

    def clock():  # a clock that the game between frames moves by an hour
        now[0] += 1000
        return now[0]

    def between():
        ran.append(1)
        now[0] += 3600 * 10**9

    monkeypatch.setattr(fusion.time, "perf_counter_ns", clock)
    results = fusion.time_plans_host({"plan": plan}, feeds, rounds=2, calls=3, warmup=2, between_frames=between)
    monkeypatch.undo()
    assert len(ran) == 2 * 3 + 2 and results["plan"]["calls"] == 6
    assert results["plan"]["p99_us"] == 1.0  # the two reads around each call, 1000 ns apart

    cpu = CpuStepPlan.build(model, plan.input_specs, plan.output_specs, "cpu")
    timed = {"cpustep": cpu, "plan": plan}
    kept, gap = fusion.keep_host_step_between_frames(
        "cpustep", timed, {"cpustep": 1.0, "plan": 2.0}, feeds, nbytes=1 << 20, hz=0
    )
    assert kept in timed and gap["kept"] == kept and gap["bytes"] == 1 << 20
    for name in timed:
        assert gap["candidates"][name]["calls"] == fusion.FRAME_GAP_ROUNDS * fusion.FRAME_GAP_CALLS
    assert len(gap["log"]) == 3 and all("1 MiB written between frames" in line for line in gap["log"])
    assert isinstance(framegap.frame_gap(1 << 20, hz=0).sweep, framegap.CacheSweep) and gap["hz"] == 0
