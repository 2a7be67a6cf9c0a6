"""Whole-segment code generation for the cuda-graph engine, and build-time plan selection.

Why torch inductor (option (b) of issue 9) rather than hand-written NVRTC chains: at batch 1 a
replayed CUDA graph costs ~1.3-1.8 us per kernel node, so what matters is how many kernels the
standard ops between framefuse nodes launch. Inductor already fuses elementwise/reduction chains
and GEMM epilogues, picks GEMM kernels by timing (``max-autotune-no-cudagraphs``) and is
maintained; a hand-written generator would re-implement a subset of it. It works from the plan,
i.e. from the fused ONNX graph, with no knowledge of the zoo.

How: the plan's run list is cut into *segments*, maximal runs of consecutive standard-op steps.
framefuse nodes stay outside (they launch their own NVRTC kernels and are opaque to tracing).
Each segment is traced once with ``make_fx`` on the planning run's real tensors — shapes are
static and host inputs (Reshape shapes, Gather indices) are concrete, so every Python decision in
the op implementations is taken at trace time and the result is a plain aten graph — and that
graph is compiled by ``torch.compile``. The compiled segments run inside the engine's own CUDA
graph exactly like the eager steps did (``mode`` never includes inductor's own cudagraphs).

Compilation is not always a win (a segment of views gains nothing, a GEMM may be slower than
cuBLAS's), so :func:`select_plan` times every candidate plan captured in a CUDA graph on the
device and keeps the fastest; the choice and the timings go in the engine's metadata. Without a
GPU the selection is skipped with a note (timings on the CPU say nothing about the GPU engine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from framefuse.engines.base import EngineBuildError
from framefuse.engines.executor import Plan, Step, fp32_math

# Candidate name -> torch.compile mode (None: no compilation, the executor's plan as planned).
COMPILE_MODES = {
    "inductor": "default",
    "inductor-autotune": "max-autotune-no-cudagraphs",
}
# A compiled candidate must agree with the plan it was made from (fp32: reductions may be
# reordered by fusion; the engine's contract vs ONNX Runtime is 1e-4).
PARITY_TOLERANCE = 2e-5


@dataclass
class Segment:
    """A run of consecutive standard steps compiled as one function."""

    first: int
    last: int  # inclusive, indices in the plan's steps
    inputs: list[str]
    outputs: list[str]
    labels: list[str] = field(default_factory=list)


def find_segments(plan: Plan) -> list[Segment]:
    """Maximal runs of standard steps with at least one env input and one live output."""
    steps = plan.steps
    graph_outputs = {src for kind, src in plan.output_sources.values() if kind == "env"}
    read_after: list[set[str]] = [set() for _ in range(len(steps) + 1)]
    for i in range(len(steps) - 1, -1, -1):
        read_after[i] = read_after[i + 1] | {name for _, name in steps[i].env_args}
    segments: list[Segment] = []
    i = 0
    while i < len(steps):
        if not steps[i].standard:
            i += 1
            continue
        j = i
        while j + 1 < len(steps) and steps[j + 1].standard:
            j += 1
        produced: set[str] = set()
        inputs: list[str] = []
        for step in steps[i : j + 1]:
            for _, name in step.env_args:
                if name not in produced and name not in inputs:
                    inputs.append(name)
            produced.update(n for n in step.outputs if n)
        later = read_after[j + 1] | graph_outputs
        outputs = [n for step in steps[i : j + 1] for n in step.outputs if n and n in later]
        outputs = list(dict.fromkeys(outputs))
        if outputs and inputs:
            segments.append(Segment(i, j, inputs, outputs, [s.label for s in steps[i : j + 1]]))
        i = j + 1
    return segments


def _run_steps(steps: list[Step], env: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plan.execute's loop without freeing: every value stays in ``env`` (tracing needs them all)."""
    for step in steps:
        args = list(step.template)
        for position, name in step.env_args:
            args[position] = env[name]
        for name, value in zip(step.outputs, step.fn(args)):
            if name:
                env[name] = value
    return env


def _segment_runner(steps: list[Step], inputs: list[str], outputs: list[str]) -> Callable:
    def run(*tensors):
        env = _run_steps(steps, dict(zip(inputs, tensors)))
        return tuple(env[name] for name in outputs)

    return run


def _planning_env(plan: Plan, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every env value of one eager run of the plan (the example inputs of each segment)."""
    return _run_steps(plan.steps, dict(feeds))


def example_feeds(plan: Plan, seed: int = 0) -> dict[str, torch.Tensor]:
    """Small random inputs of the plan's shapes (floating inputs in [-0.5, 0.5), others zero)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    feeds = {}
    for name, spec in plan.input_specs.items():
        if spec.dtype.is_floating_point:
            value = torch.rand(spec.shape, generator=generator, dtype=torch.float32) - 0.5
            feeds[name] = value.to(spec.dtype).to(plan.device)
        else:
            feeds[name] = torch.zeros(spec.shape, dtype=spec.dtype, device=plan.device)
    return feeds


def compile_plan(plan: Plan, *, mode: str = "default", backend: str = "inductor") -> tuple[Plan, dict]:
    """A copy of ``plan`` whose standard-op segments run as compiled functions.

    Returns (plan, report); report lists the segments (step labels, inputs, outputs) and the
    compile seconds. ``backend="aot_eager"`` runs the same tracing without code generation
    (the CPU tests' way to check segmentation and tracing quickly)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    segments = find_segments(plan)
    start = time.perf_counter()
    with fp32_math(), torch.no_grad():
        env = _planning_env(plan, example_feeds(plan))
        new_steps: list[Step] = []
        position = 0
        report_segments = []
        for seg in segments:
            new_steps.extend(plan.steps[position : seg.first])
            run = _segment_runner(plan.steps[seg.first : seg.last + 1], seg.inputs, seg.outputs)
            examples = [env[name] for name in seg.inputs]
            try:
                graph_module = make_fx(run, tracing_mode="real")(*examples)
            except Exception as exc:
                raise EngineBuildError(
                    f"segment {seg.labels[0]} .. {seg.labels[-1]}: tracing for code generation failed "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            compile_kwargs = {"backend": backend, "dynamic": False, "fullgraph": True}
            if backend == "inductor":
                compile_kwargs["mode"] = mode
            compiled = torch.compile(graph_module, **compile_kwargs)
            compiled(*examples)  # compile now (build time), not at the first capture
            fn = _as_step_fn(compiled)
            label = f"{seg.labels[0]}..{seg.labels[-1]}" if len(seg.labels) > 1 else seg.labels[0]
            new_steps.append(
                Step(
                    label,
                    f"Compiled[{len(seg.labels)}]",
                    fn,
                    [None] * len(seg.inputs),
                    list(enumerate(seg.inputs)),
                    list(seg.outputs),
                    standard=True,
                )
            )
            report_segments.append(
                {
                    "steps": len(seg.labels),
                    "first": seg.labels[0],
                    "last": seg.labels[-1],
                    "inputs": len(seg.inputs),
                    "outputs": len(seg.outputs),
                    "graph_nodes": sum(1 for n in graph_module.graph.nodes if n.op == "call_function"),
                }
            )
            position = seg.last + 1
        new_steps.extend(plan.steps[position:])
    compiled_plan = _with_steps(plan, new_steps)
    return compiled_plan, {
        "mode": mode,
        "backend": backend,
        "segments": report_segments,
        "compile_s": round(time.perf_counter() - start, 3),
    }


def _as_step_fn(compiled: Callable) -> Callable[[list], list]:
    def run(args):
        return list(compiled(*args))

    return run


def _with_steps(plan: Plan, steps: list[Step]) -> Plan:
    """The plan with another run list; liveness (frees) recomputed for it."""
    fresh = [
        Step(s.label, s.op_type, s.fn, s.template, s.env_args, s.outputs, attrs=s.attrs, standard=s.standard)
        for s in steps
    ]
    last_use: dict[str, int] = {}
    for i, step in enumerate(fresh):
        for _, name in step.env_args:
            last_use[name] = i
    keep = {src for kind, src in plan.output_sources.values() if kind == "env"}
    for name, i in last_use.items():
        if name not in keep:
            fresh[i].frees.append(name)
    return Plan(
        plan.input_specs, plan.output_specs, fresh, plan.constants, plan.output_sources, plan.folded, plan.device
    )


def max_difference(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    worst = 0.0
    for name, value in a.items():
        other = b[name]
        if value.shape != other.shape:
            return float("inf")
        if value.numel():
            diff = (value.double() - other.double()).abs().max().item()
            worst = max(worst, diff if diff == diff else float("inf"))
    return worst


def time_plan_graph(plan: Plan, feeds: Mapping[str, torch.Tensor], *, replays: int = 200, repeats: int = 5) -> dict:
    """Median microseconds per replay of ``plan.execute`` captured in a CUDA graph (device time,
    cuda events around ``replays`` back-to-back replays, ``repeats`` times)."""
    device = plan.device
    static = {name: value.clone() for name, value in feeds.items()}
    stream = torch.cuda.Stream(device)
    with fp32_math(), torch.no_grad():
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                plan.execute(static)
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            plan.execute(static)
    samples = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1000.0 / replays)
    del graph
    return {"us_per_step": round(statistics.median(samples), 2), "samples_us": [round(s, 2) for s in samples]}


def select_plan(
    plan: Plan,
    *,
    alternatives: Mapping[str, Plan] | None = None,
    modes: Mapping[str, str] | None = None,
    compile_also: tuple[str, ...] = (),
    log: Callable[[str], None] | None = None,
) -> tuple[Plan, dict]:
    """Build-time selection (TensorRT-style tactic timing) among ``plan`` (named "plan"), the given
    ``alternatives`` (e.g. the unoptimised plan) and one compiled copy of ``plan`` per entry of
    ``modes`` (candidate name -> torch.compile mode; default :data:`COMPILE_MODES`); the
    alternatives named in ``compile_also`` get compiled copies too ("<alternative>+<mode name>").

    Each candidate is checked against ``plan`` on random inputs (max |diff| <= PARITY_TOLERANCE,
    else rejected) and timed captured in a CUDA graph; the fastest is returned with a report
    {"chosen", "candidates": {name: {us_per_step | error, ...}}}. On a CPU device nothing is timed:
    ``plan`` is returned with a note."""
    say = log or (lambda message: None)
    if plan.device.type != "cuda":
        note = "build-time selection skipped: no CUDA device (the plan is used as planned)"
        say(note)
        return plan, {"chosen": "plan", "skipped": note}
    modes = COMPILE_MODES if modes is None else modes
    feeds = example_feeds(plan, seed=1)
    with fp32_math(), torch.no_grad():
        reference = {k: v.clone() for k, v in plan.execute({k: v.clone() for k, v in feeds.items()}).items()}
    candidates: dict[str, Plan] = {"plan": plan}
    report: dict[str, dict] = {}
    for name, other in (alternatives or {}).items():
        candidates[name] = other
    bases = {"plan": plan, **{name: candidates[name] for name in compile_also if name in candidates}}
    for base_name, base in bases.items():
        for mode_name, mode in modes.items():
            name = mode_name if base_name == "plan" else f"{base_name}+{mode_name}"
            try:
                candidates[name], info = compile_plan(base, mode=mode)
                report[name] = {"compile_s": info["compile_s"], "segments": len(info["segments"])}
            except Exception as exc:  # a candidate that cannot be built is reported, never fatal
                report[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    timings: dict[str, float] = {}
    for name, candidate in candidates.items():
        entry = report.setdefault(name, {})
        entry["steps"] = len(candidate.steps)
        try:
            if name != "plan":
                with fp32_math(), torch.no_grad():
                    got = candidate.execute({k: v.clone() for k, v in feeds.items()})
                diff = max_difference(reference, got)
                entry["max_abs_diff"] = diff
                if not diff <= PARITY_TOLERANCE:
                    entry["error"] = f"rejected: max |diff| {diff:.3g} vs the plan > {PARITY_TOLERANCE}"
                    continue
            entry.update(time_plan_graph(candidate, feeds))
            timings[name] = entry["us_per_step"]
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    chosen = min(timings, key=timings.get) if timings else "plan"
    for name, entry in report.items():
        detail = f"{entry['us_per_step']:.1f} us/step" if "us_per_step" in entry else entry.get("error", "not timed")
        say(
            f"selection: {name:<18} {entry.get('steps', '?'):>4} steps  {detail}"
            + ("  <- chosen" if name == chosen else "")
        )
    return candidates[chosen], {"chosen": chosen, "candidates": report}


STEPKERNEL = "stepkernel"  # the whole step as one generated kernel (framefuse/compiler)
SELECT_CHOICES = ("time", "time-autotune", "plan", "unoptimized", STEPKERNEL, *COMPILE_MODES)


def stepkernel_candidate(executor, plan: Plan, say: Callable[[str], None], *, required: bool = False):
    """The step compiler's kernel for the engine's graph, as a Plan-like candidate; None (with the
    reason logged) when the graph cannot be compiled, or EngineBuildError when ``required``."""
    from framefuse.compiler.engine import StepKernelPlan, compile_step

    try:
        compiled = compile_step(executor.model, device=plan.device, log=say)
        return StepKernelPlan(compiled, plan.input_specs, plan.output_specs)
    except Exception as exc:  # a graph the compiler declines is reported, never fatal to the build
        reason = f"{type(exc).__name__}: {str(exc)[:400]}"
        if required:
            raise EngineBuildError(
                f"--select {STEPKERNEL}: the step compiler cannot build this graph ({reason})"
            ) from exc
        say(f"selection: {STEPKERNEL} not a candidate ({reason})")
        return None


UNFUSED = "unfused"  # the candidates made from the graph before the rewrite ("unfused", "unfused+inductor")


def apply_selection(
    executor,
    plan: Plan,
    select: str,
    *,
    unfused_executor=None,
    log: Callable[[str], None] | None = None,
) -> tuple[Plan, dict]:
    """The engine's hook: ``select`` is "time" (time the plan, the unoptimised plan and the
    inductor-compiled plan; "time-autotune" adds ``max-autotune-no-cudagraphs``) or a candidate
    name recorded by an earlier build (the artifact's metadata), applied without timing again.

    With ``unfused_executor`` (a GraphExecutor of the graph before the rewrite, same inputs and
    outputs), timing also runs that graph, plain and compiled: a fused op that makes the model
    slower is never kept. When one of those wins, report["graph"] is "unfused" (the caller then
    runs that executor) and report["apply"] is the choice to re-apply to it at load.
    Returns (plan, report); report["log"] holds the lines logged."""
    from framefuse.engines.executor import GraphExecutor

    lines: list[str] = []

    def say(message: str) -> None:
        lines.append(message)
        if log is not None:
            log(message)

    if select not in SELECT_CHOICES:
        raise EngineBuildError(f"select must be one of {SELECT_CHOICES}, got {select!r}")

    def unoptimized() -> Plan:
        other = GraphExecutor(executor.model, executor.device, executor.framefuse_impl, optimize=False)
        shapes = {name: spec.shape for name, spec in plan.input_specs.items()}
        return other.plan(shapes)

    if select.startswith("time") and plan.device.type != "cuda":
        chosen, report = select_plan(plan, log=say)  # skipped with a note
    elif select.startswith("time"):
        alternatives = {"unoptimized": unoptimized()} if executor.optimize else {}
        step = stepkernel_candidate(executor, plan, say)
        if step is not None:
            alternatives[STEPKERNEL] = step
        if unfused_executor is not None:
            shapes = {name: spec.shape for name, spec in plan.input_specs.items()}
            try:
                alternatives[UNFUSED] = unfused_executor.plan(shapes)
            except Exception as exc:  # e.g. an op outside the table: reported, the fused plans still compete
                say(f"selection: {UNFUSED} graph not a candidate ({type(exc).__name__}: {str(exc)[:200]})")
        modes = dict(COMPILE_MODES) if select == "time-autotune" else {"inductor": COMPILE_MODES["inductor"]}
        chosen, report = select_plan(
            plan,
            alternatives=alternatives,
            modes=modes,
            compile_also=(UNFUSED,) if UNFUSED in alternatives else (),
            log=say,
        )
        name = report["chosen"]
        if step is not None:
            report.setdefault("candidates", {}).setdefault(STEPKERNEL, {})["kernel"] = step.compiled.describe()
        if name == UNFUSED or name.startswith(UNFUSED + "+"):
            report["graph"] = UNFUSED
            report["apply"] = name.partition("+")[2] or "plan"
            say(f"selection: the unfused graph is faster than the fused one here: the engine runs it ({name})")
    elif select == "plan":
        chosen, report = plan, {"chosen": "plan"}
    elif select == "unoptimized":
        chosen, report = unoptimized(), {"chosen": "unoptimized"}
    elif select == STEPKERNEL and plan.device.type == "cuda":
        chosen = stepkernel_candidate(executor, plan, say, required=True)
        report = {"chosen": STEPKERNEL}
    elif plan.device.type != "cuda":
        note = f"recorded choice {select!r} needs a CUDA device: the plan is used as planned"
        say(note)
        chosen, report = plan, {"chosen": "plan", "skipped": note}
    else:
        chosen, info = compile_plan(plan, mode=COMPILE_MODES[select])
        report = {"chosen": select, "compile_s": info["compile_s"]}
        say(f"selection: {select} (recorded at build) compiled in {info['compile_s']:.1f} s")
    if getattr(chosen, "compiled", None) is not None:
        report["stepkernel"] = chosen.compiled.describe()
    report["log"] = lines
    return chosen, report


__all__ = [
    "COMPILE_MODES",
    "SELECT_CHOICES",
    "STEPKERNEL",
    "UNFUSED",
    "apply_selection",
    "Segment",
    "compile_plan",
    "example_feeds",
    "find_segments",
    "select_plan",
    "stepkernel_candidate",
    "time_plan_graph",
]
