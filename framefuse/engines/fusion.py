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
cuBLAS's), so :func:`select_plan` times every candidate and keeps the fastest; the choice and the
timings go in the engine's metadata. A candidate is timed as the session runs it
(:func:`time_plans_host`: the binding ``Session`` makes, frames written into its host buffers,
launched and waited on, host clock around each call), because the candidates move their frames
differently: the CUDA-graph plans copy them in and out around the graph, the step compiler's
kernel reads and writes mapped host memory itself, where a badly placed read costs more than the
whole device time (a real model's kernel took 1590 us host to host on 21 us of device time). The
device time of back-to-back replays (:func:`time_plan_graph`) is reported beside it. Without a GPU
the selection is skipped with a note (timings on the CPU say nothing about the GPU engine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
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


# A candidate's timing within a budget: one whose step is slow gets fewer replays / calls (never
# fewer than the floors), so that a candidate far off the fastest costs the build seconds, not
# minutes. Why: nn.LSTM hidden 1024, T = 32, two directions (H100, session 55's --select time
# build, 127 s): its plan, unoptimized and inductor candidates run the fused op's own path at ~17
# ms a step, so 1,000 replays and 1,030 host calls each took ~35 s of the build for numbers 45x the
# step kernel's; at T = 256 they would take minutes. A candidate within the budget (host: 2 ms a
# call or less at the default 5 x 200 calls; device: 1 ms a replay or less at 5 x 200) is timed
# exactly as before, so the fast candidates the choice is made among keep every sample.
DEVICE_TIMING_BUDGET_S, DEVICE_TIMING_MIN_REPLAYS = 1.0, 5
HOST_TIMING_BUDGET_S, HOST_TIMING_MIN_CALLS, HOST_TIMING_PROBE_CALLS = 2.0, 10, 3


def calls_within_budget(wanted: int, repeats: int, per_call_s: float, budget_s: float | None, floor: int) -> int:
    """Calls a repeat (or round): ``wanted`` where ``repeats`` x ``wanted`` calls of ``per_call_s``
    fit ``budget_s`` (None: no budget), else as many as fit, at least ``floor`` (and at most
    ``wanted``)."""
    if budget_s is None or per_call_s <= 0 or repeats * wanted * per_call_s <= budget_s:
        return wanted
    return min(wanted, max(floor, int(budget_s / (repeats * per_call_s))))


def time_plan_graph(
    plan: Plan,
    feeds: Mapping[str, torch.Tensor],
    *,
    replays: int = 200,
    repeats: int = 5,
    budget_s: float | None = DEVICE_TIMING_BUDGET_S,
) -> dict:
    """Median microseconds per replay of ``plan.execute`` captured in a CUDA graph (device time,
    cuda events around ``replays`` back-to-back replays, ``repeats`` times; fewer replays where
    they would take longer than ``budget_s``: :func:`calls_within_budget`, two untimed replays
    first say how long one takes). The replays a repeat are in the answer."""
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
    probe_ms = []
    for _ in range(2):  # the first replay of a graph may upload it: the faster of two
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        probe_ms.append(begin.elapsed_time(end))
    replays = calls_within_budget(replays, repeats, min(probe_ms) / 1000.0, budget_s, DEVICE_TIMING_MIN_REPLAYS)
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
    return {
        "us_per_step": round(statistics.median(samples), 2),
        "samples_us": [round(s, 2) for s in samples],
        "replays": replays,
    }


# The session's naming of a step graph's state (runtime/session.py): state.<name> in, next_state.<name> out
STATE_PREFIX, NEXT_STATE_PREFIX = "state.", "next_state."
# Host-timed selection: rounds over every candidate in turn (host noise drifts; interleaving
# spreads it over all of them), calls timed per candidate a round, calls run untimed first.
HOST_TIMING_ROUNDS, HOST_TIMING_CALLS, HOST_TIMING_WARMUP = 5, 200, 30


def session_io(plan: Plan) -> tuple[list[str], list[str], dict[str, str]]:
    """The binding ``Session`` makes for a plan: (host inputs, host outputs, state hand-offs).
    A step graph's state stays on the device, handed from next_state.<n> to state.<n>."""
    pairs = {}
    for name in plan.input_specs:
        if name.startswith(STATE_PREFIX):
            out = NEXT_STATE_PREFIX + name[len(STATE_PREFIX) :]
            if out in plan.output_specs:
                pairs[out] = name
    host_inputs = [n for n in plan.input_specs if n not in pairs.values()]
    host_outputs = [n for n in plan.output_specs if n not in pairs]
    return host_inputs, host_outputs, pairs


class _TimingHost:
    """What a cuda-graph Binding needs of its engine, for one candidate while it is timed: its
    own streams and its own graph memory pool (candidates' graphs never share memory)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.graph_pool = None
        self.captures = self.replays = self.eager_runs = 0
        on_gpu = device.type == "cuda"
        self.capture_stream = torch.cuda.Stream(device) if on_gpu else None
        self.replay_stream = torch.cuda.Stream(device) if on_gpu else None


def _session_binding(plan: Plan):
    from framefuse.engines.cuda_graph import Binding

    host_inputs, host_outputs, pairs = session_io(plan)
    if hasattr(plan, "create_binding"):  # the step compiler's kernel: mapped host memory, as the session binds it
        return plan.create_binding(None, host_inputs=host_inputs, host_outputs=host_outputs, state_pairs=pairs)
    return Binding(_TimingHost(plan.device), plan, host_inputs, host_outputs, pairs)


def time_plans_host(
    plans: Mapping[str, Plan],
    feeds: Mapping[str, torch.Tensor],
    *,
    rounds: int = HOST_TIMING_ROUNDS,
    calls: int = HOST_TIMING_CALLS,
    warmup: int = HOST_TIMING_WARMUP,
    between_frames: Callable[[], None] | None = None,
    budget_s: float | None = HOST_TIMING_BUDGET_S,
) -> dict[str, dict]:
    """Each plan timed as ``Session.step`` / ``Session.run`` runs it: the session's binding
    (:func:`session_io`), the frame written into its host input buffers, one launch, the wait the
    session uses (the step kernel's done words, else the stream), host clock around each call.
    ``rounds`` rounds of ``calls`` calls per plan, the plans in turn within a round, after
    ``warmup`` untimed calls in the first; a plan whose rounds would take longer than ``budget_s``
    (None: no budget) gets fewer calls a round (:func:`calls_within_budget`, at least
    HOST_TIMING_MIN_CALLS) and a warm-up of at most a tenth of the budget, sized by the fastest of
    its first HOST_TIMING_PROBE_CALLS warm-up calls. ``between_frames`` (e.g. a
    framegap.CacheSweep) runs before every call, outside its clock: the game's own work between
    two frames. Returns {name: {"us_per_step": median, "p99_us", "calls"} | {"error"}}."""
    bindings, results = {}, {}
    for name, plan in plans.items():
        try:
            bindings[name] = _session_binding(plan)
        except Exception as exc:  # reported; the other candidates are still timed
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    samples: dict[str, list[int]] = {name: [] for name in bindings}
    per_round: dict[str, int] = {}  # calls a round, sized in the first round's warm-up
    clock = time.perf_counter_ns
    try:
        for round_index in range(rounds):
            for name in list(bindings):
                binding = bindings[name]
                try:
                    frames = [(binding.host_in[n], feeds[n].detach().cpu().numpy()) for n in binding.host_input_names]
                    launch, wait = binding.launch, getattr(binding, "wait_host", binding.sync)
                    times = samples[name]
                    binding.wait_idle()

                    def one_call(frames=frames, launch=launch, wait=wait) -> int:
                        if between_frames is not None:
                            between_frames()
                        start = clock()
                        for buffer, frame in frames:
                            np.copyto(buffer, frame)
                        launch()
                        wait()
                        return clock() - start

                    warm = 0
                    if round_index == 0:
                        probes = [one_call() for _ in range(min(HOST_TIMING_PROBE_CALLS, warmup))]
                        per_call_s = min(probes) / 1e9 if probes else 0.0
                        per_round[name] = calls_within_budget(
                            calls, rounds, per_call_s, budget_s, min(calls, HOST_TIMING_MIN_CALLS)
                        )
                        budget_warm = None if budget_s is None else budget_s / 10
                        warm = calls_within_budget(warmup, 1, per_call_s, budget_warm, len(probes)) - len(probes)
                    for _ in range(warm):
                        one_call()
                    for _ in range(per_round[name]):
                        times.append(one_call())
                    binding.wait_idle()
                except Exception as exc:  # this candidate is out; the others are still timed
                    results[name] = {"error": f"host timing: {type(exc).__name__}: {str(exc)[:300]}"}
                    del bindings[name], samples[name]
    finally:
        for binding in bindings.values():
            getattr(binding, "close", lambda: None)()
        bindings.clear()
    for name, times in samples.items():
        ordered = sorted(times)
        results[name] = {
            "us_per_step": round(statistics.median(ordered) / 1000.0, 2),
            "p99_us": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] / 1000.0, 2),
            "calls": len(ordered),
        }
    return results


def _phase(phases: dict, name: str, started: float) -> float:
    """Record the seconds since ``started`` as phase ``name``; the clock now (the next phase's start)."""
    now = time.perf_counter()
    phases[name] = phases.get(name, 0.0) + (now - started)
    return now


def select_plan(
    plan: Plan,
    *,
    alternatives: Mapping[str, Plan] | None = None,
    modes: Mapping[str, str] | None = None,
    compile_also: tuple[str, ...] = (),
    references: Mapping[str, Plan] | None = None,
    tolerance: float = PARITY_TOLERANCE,
    relative: bool = False,
    frame_gap: int | None = None,
    frame_hz: float | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Plan, dict]:
    """Build-time selection (TensorRT-style tactic timing) among ``plan`` (named "plan"), the given
    ``alternatives`` (e.g. the unoptimised plan) and one compiled copy of ``plan`` per entry of
    ``modes`` (candidate name -> torch.compile mode; default :data:`COMPILE_MODES`); the
    alternatives named in ``compile_also`` get compiled copies too ("<alternative>+<mode name>").

    Each candidate is checked against ``plan`` on random inputs (max |diff| <= ``tolerance``, or
    with ``relative`` <= tolerance x (1 + max |plan's output|), else rejected), its device time
    measured captured in a CUDA graph (``device_us_per_step``) and then every one timed host to
    host as the session runs it (``us_per_step``, the median, and ``p99_us``:
    :func:`time_plans_host`); the fastest host to host is returned with a report {"chosen",
    "metric", "candidates": {name: {us_per_step | error, ...}}}. ``references`` are timed in the
    same rounds for comparison (marked "reference": true), never checked against ``plan`` and
    never chosen. A candidate that runs on the CPU (the CPU step) is kept only when it also answers
    first with ``frame_gap`` bytes written between frames and the frames paced at ``frame_hz``
    (:func:`keep_host_step_between_frames`; defaults framegap.frame_gap_bytes() and
    framegap.frame_hz(), both 0: back to back only). On a CPU device nothing is timed: ``plan`` is
    returned with a note."""
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
    phases: dict[str, float] = {}
    started = time.perf_counter()
    for base_name, base in bases.items():
        for mode_name, mode in modes.items():
            name = mode_name if base_name == "plan" else f"{base_name}+{mode_name}"
            try:
                candidates[name], info = compile_plan(base, mode=mode)
                report[name] = {"compile_s": info["compile_s"], "segments": len(info["segments"])}
            except Exception as exc:  # a candidate that cannot be built is reported, never fatal
                report[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    timings: dict[str, float] = {}
    timed: dict[str, Plan] = {}
    bound = tolerance
    if relative:
        bound = tolerance * (1.0 + max((v.abs().max().item() for v in reference.values() if v.numel()), default=0.0))
    for name, other in (references or {}).items():
        candidates[name] = other
        report[name] = {"reference": True}
    started = _phase(phases, "torch.compile", started)
    for name, candidate in candidates.items():
        entry = report.setdefault(name, {})
        entry["steps"] = len(candidate.steps)
        try:
            if name != "plan" and not entry.get("reference"):
                with fp32_math(), torch.no_grad():
                    got = candidate.execute({k: v.clone() for k, v in feeds.items()})
                diff = max_difference(reference, got)
                entry["max_abs_diff"] = diff
                if not diff <= bound:
                    entry["error"] = f"rejected: max |diff| {diff:.3g} vs the plan > {bound:.3g}"
                    continue
            if getattr(candidate, "host_only", False):  # runs on the CPU: no graph to time on the GPU
                entry["device_us_per_step"] = None
            else:
                device = time_plan_graph(candidate, feeds)
                entry["device_us_per_step"] = device["us_per_step"]
                entry["device_samples_us"] = device["samples_us"]
                entry["device_replays"] = device["replays"]  # a repeat's (fewer for a slow candidate)
            timed[name] = candidate
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    started = _phase(phases, "checks and device timing", started)
    for name, result in time_plans_host(timed, feeds).items():
        report[name].update(result)
        if "us_per_step" in result and not report[name].get("reference"):
            timings[name] = result["us_per_step"]
    chosen = min(timings, key=timings.get) if timings else "plan"
    fastest_back_to_back = chosen
    started = _phase(phases, "host timing", started)
    chosen, gap = keep_host_step_between_frames(chosen, timed, timings, feeds, nbytes=frame_gap, hz=frame_hz)
    if gap is not None:
        _phase(phases, "frame-gap timing", started)
    for name, entry in report.items():
        if "us_per_step" in entry:
            device = entry["device_us_per_step"]
            detail = f"{entry['us_per_step']:.1f} us/step host to host (p99 {entry['p99_us']:.1f}), " + (
                f"device {device:.1f}" if device is not None else "on the CPU"
            )
        else:
            detail = entry.get("error", "not timed")
        say(
            f"selection: {name:<18} {entry.get('steps', '?'):>4} steps  {detail}"
            + ("  <- chosen" if name == chosen else "")
            + ("  (reference, not a candidate)" if entry.get("reference") else "")
        )
    result = {
        "chosen": chosen,
        "metric": "host to host, as the session runs it",
        "candidates": report,
        "phase_s": {key: round(value, 2) for key, value in phases.items()},
    }
    if any(getattr(timed[name], "host_only", False) for name in timings):
        from framefuse.engines import framegap

        result["frame_gap_bytes"] = framegap.frame_gap_bytes() if frame_gap is None else int(frame_gap)
        result["frame_hz"] = framegap.frame_hz() if frame_hz is None else float(frame_hz)
    if gap is not None:
        result["frame_gap"] = {key: value for key, value in gap.items() if key != "log"}
        for line in gap["log"]:
            say(line)
        if chosen != fastest_back_to_back:
            say(
                f"selection: {chosen} is chosen (the fastest back to back, {fastest_back_to_back}, is not in a game loop)"
            )
    return candidates[chosen], result


# The CPU step's frame-gap timing (keep_host_step_between_frames): fewer calls than the back-to-back
# timing, each after a sweep (~1.5 ms for 32 MiB on the CI machine) and the wait for the next tick
# (16.7 ms at 60 Hz): 2 candidates x (3 x 40 + 5) calls, ~4.2 s at 60 Hz.
FRAME_GAP_ROUNDS, FRAME_GAP_CALLS, FRAME_GAP_WARMUP = 3, 40, 5


def keep_host_step_between_frames(
    chosen: str,
    timed: Mapping[str, Plan],
    timings: Mapping[str, float],
    feeds: Mapping[str, torch.Tensor],
    *,
    nbytes: int | None = None,
    hz: float | None = None,
    time_host: Callable[..., dict] | None = None,
) -> tuple[str, dict | None]:
    """Whether the fastest candidate back to back, when it runs on the CPU (``host_only``: the CPU
    step), also answers first in a game loop. Back to back its weights and code stay in the CPU's
    caches from one call to the next; a game's own work between two frames evicts them, and a
    bot's thread that sleeps until the next frame leaves its core idle (framegap.py: the GPT-2 test
    model's CPU step 19.5 us back to back, 48.9 after 32 MiB written, 102.6 paced at 60 Hz). So it
    and the fastest candidate that runs on the GPU are
    timed again in the same rounds, a framegap.FrameGap before every call (a sweep of ``nbytes``,
    then the wait for the next tick of ``hz``; defaults framegap.frame_gap_bytes() and
    framegap.frame_hz()), and the faster of the two by that median is kept. Returns (the name kept,
    the report's "frame_gap" entry: {"bytes", "hz", "candidates": {name: timing}, "kept", "log":
    lines}; None when nothing was compared: the chosen candidate runs on the GPU, no GPU candidate
    was timed, or nbytes and hz are both 0)."""
    from framefuse.engines import framegap

    if not getattr(timed.get(chosen), "host_only", False):
        return chosen, None
    rivals = [name for name in timings if name in timed and not getattr(timed[name], "host_only", False)]
    sweep = framegap.frame_gap(nbytes, hz)
    if sweep is None or not rivals:
        return chosen, None
    rival = min(rivals, key=timings.get)
    time_host = time_host or time_plans_host
    results = time_host(
        {chosen: timed[chosen], rival: timed[rival]},
        feeds,
        rounds=FRAME_GAP_ROUNDS,
        calls=FRAME_GAP_CALLS,
        warmup=FRAME_GAP_WARMUP,
        between_frames=sweep,
        budget_s=None,  # two candidates sized already, each call within a frame
    )
    mine = results.get(chosen, {}).get("us_per_step")
    theirs = results.get(rival, {}).get("us_per_step")
    gap = sweep.describe()
    lines = [
        f"selection: {name:<18} {res['us_per_step']:.1f} us/step host to host (p99 {res['p99_us']:.1f}) with {gap}"
        if "us_per_step" in res
        else f"selection: {name:<18} with {gap}: {res.get('error', 'not timed')}"
        for name, res in ((chosen, results.get(chosen, {})), (rival, results.get(rival, {})))
    ]
    if mine is not None and (theirs is None or mine < theirs):
        kept = chosen
        lines.append(f"selection: {chosen} answers first back to back and with {gap}: kept")
    else:
        kept = rival
        lines.append(
            f"selection: {chosen} answers first back to back ({timings[chosen]:.1f} us against "
            f"{timings[rival]:.1f}) but not with {gap}, as in a game loop "
            f"({'failed' if mine is None else f'{mine:.1f} us'} against {theirs:.1f}): {rival} is kept"
        )
    return kept, {"bytes": sweep.nbytes, "hz": sweep.hz, "candidates": results, "kept": kept, "log": lines}


STEPKERNEL = "stepkernel"  # the whole step as one generated kernel (framefuse/compiler)
# Tactics of the step kernel, timed by the build beside the plain kernel (the name kept is the
# recorded choice, and a load compiles that one again). Each is faster for some models and slower
# for others (H200, bench/h200/2026-11-26-experiments/): its long prefetch copies cut into pieces
# of 1024 floats, one a warp (attention, lstm, liquid, jamba, mamba 0.3-1.0 us faster; gru,
# min_lstm, gated_ssm 0.2-0.6 slower; on the H100, bench/h100/2026-11-26-session/: lstm, attention,
# mamba, liquid 1.0-1.2 faster, min_gru, gru 0.4-0.5 slower); or 3/4 of the SMs (attention 17.7 ->
# 15.8 us: fewer blocks copy the KV cache; every recurrent zoo model slower); or blocks of 384
# threads instead of 256 (H100, bench/h100/2026-11-26-s16/sweep.json, device time at 132 blocks:
# gru 10.86 -> 10.31 us, lstm 12.14 -> 11.71, mamba 19.98 -> 19.66, min_gru and attention within
# 0.05: more warps a block hide more of each phase's latency; 512 was no better); or each block
# issuing a task's copies a task ahead in its own task order instead of the kernel's (H100,
# bench/h100/2026-11-26-s18/, device time: attention 16.07-16.08 -> 15.45-15.59 us, transformers
# Llama 14.25-14.32 -> 14.01, GPT-2 13.76-13.87 -> 13.61, gru 10.1-10.2 -> 9.9; xlstm 21.0 -> 21.8-22.1,
# delta_net 16.4 -> 16.7, jamba 18.0-18.4 -> 18.6-18.7: a block that skips tasks then issues a late
# task's copies just before its next task instead of during an earlier wait).
STEPKERNEL_PIECES = "stepkernel-pieces"
STEPKERNEL_FEWER_BLOCKS = "stepkernel-fewer-blocks"
STEPKERNEL_WIDE = "stepkernel-384-threads"
STEPKERNEL_PACED = "stepkernel-paced"
# Every other tactic computes the first layer's products from the frame, the first LayerNorm's 1/σ
# published with it (compiler/simplify.ComposeInputProducts, PublishFrameScalars: a level less);
# this one keeps the frame's in-projection a level of its own, as before session 19 (H100,
# bench/h100/2026-11-26-s19/, device time composed / not: lstm 11.1 / 12.1 us, attention 14.7 /
# 16.1, jamba 17.1 / 18.1, liquid 14.0 / 14.8, mamba 19.6 / 20.1; but min_gru 10.5 / 10.1, min_lstm
# 11.3 / 10.8, gru 10.6 / 10.3, gated_ssm 12.0 / 11.6, delta_net 16.75 / 16.4, xlstm 22.0 / 21.4).
STEPKERNEL_UNFRAMED = "stepkernel-unframed"
# A thread's own sum whose reads put a warp's lanes on one shared-memory bank starts each element
# at its own position (compiler/codegen.SKEWED_SUM_WALK): attention's scores over a window, Mamba's
# and xLSTM's readouts. H100, bench/h100/2026-11-27-s30/, device time a T = 32 window, plain /
# skewed / 384 threads / 384 threads skewed: attention 46.1 / 42.7 / 41.1 / 37.6 us, Jamba
# 51.6 / 49.9 / 46.6 / 45.2, transformers GPT-2 40.7 / 39.7 / 35.0 / 35.0; but Llama 28.5 / 29.1.
# A model none of whose sums is skewed gets the plain kernel's source: no candidate to time.
STEPKERNEL_SKEWED = "stepkernel-skewed"
STEPKERNEL_WIDE_SKEWED = "stepkernel-384-threads-skewed"
# Every other tactic rolls an unrolled Elman cell's copies back into one loop (compiler/simplify.
# RollRecurrences): fewer dependency levels at long windows (nn.RNNCell loop, T = 32: 6 instead of
# 29), but at T = 8 the unrolled copies schedule into 5 levels against the loop's 6, and which is
# faster is the GPU's to say (not measured yet). This one keeps the copies. A model with nothing to
# roll gets the plain kernel's source: no candidate to time (nor a second lowering).
STEPKERNEL_UNROLLED = "stepkernel-unrolled"
# A task whose blocks each copy the same values whole (attention's output projection: every block
# recomputes the attention over the window, so every one copies both KV caches, 8159 floats a
# layer, on 128 of 132 blocks) goes on at most REPLICA_CAP_FLOATS / those floats blocks (32
# here): fewer blocks issue those copies and poll the new K / V rows. H200, session 43
# (bench/h200/2026-12-02-s43/), device time plain / capped: attention 13.87-14.14 / 13.38-13.46 us,
# with 384 threads 13.87 / 13.16; but Jamba 16.06-16.16 / 16.41-16.54, and the T = 32 windows
# unchanged (attention 45.8 / 45.7, Jamba 50.1 / 49.8-50.5); host to host in a build on another H200,
# attention 20.05 / 20.09 us (19.60 / 19.87 with 384 threads): not chosen there. Built only where the cap takes blocks
# from some task of the plain schedule (no other zoo model has one): no candidate to time elsewhere.
STEPKERNEL_REPLICA_CAP = "stepkernel-replica-cap"
STEPKERNEL_WIDE_REPLICA_CAP = "stepkernel-384-threads-replica-cap"
REPLICA_CAP_FLOATS = 256 * 1024
# Blocks of 512 threads where a recurrence's R is held split between registers and shared memory
# (schedule.hybrid_recurrences: hidden 1024). H200, session 49 (bench/h200/2026-12-05-s49/sweep/,
# device time in a CUDA graph, nn.LSTM hidden 1024, T = 32, two directions): 256 threads 320.5 us,
# 512 288.5, 1024 337.9, where cuDNN answered host to host in 346.1 against the plain kernel's
# 348.6 (at 512 threads ptxas caps a thread at 128 registers and spills 296 bytes, nvcc 13 for
# sm_90: faster all the same); nn.LSTM hidden 64 (R wholly in registers) 132.7 / 134.7 / 136.8: slower. Built only where
# such a recurrence is (no zoo model at embed 256 has one): no candidate to time elsewhere.
STEPKERNEL_HYBRID_WIDE = "stepkernel-512-threads"
HYBRID_THREADS = 512
# A recurrence on one block (nn.LSTM / nn.GRU hidden 64, one direction) with each unit split over
# a few lanes of one warp (codegen.recur_lanes: each lane its K split of the unit's gate rows in
# registers, the sums met by shuffles, one barrier a position instead of two; emulated under
# ThreadSanitizer, session 49), for nn.LSTM hidden 64, T = 256, one direction, where the plain
# kernel ties cuDNN (146.4 against 145.9 us, H200, session 49). Slower on the H100 (session 54,
# bench/h100/2026-12-05-s54/, device time plain / lanes at 256 threads: that LSTM 132.9 / 152.0 us,
# the GRU 126.7 / 132.8): kept a candidate, never kept where slower. Built only where such a
# recurrence is: no candidate to time elsewhere.
STEPKERNEL_LANES = "stepkernel-lanes"
# A one-block recurrence's input words loaded 4 or 8 positions ahead (codegen.RECUR_INPUTS_AHEAD), at
# 384 threads. H100, session 55 (bench/h100/2026-12-05-s55/), device time against the 384-thread
# kernel: nn.GRU hidden 64, T = 256, one direction 123.5 -> 118.2 / 111.1 us, nn.LSTM the same size
# 131.7 -> 129.9 / 162.2 (its depth-8 kernel spills): no depth wins at both, so tactics the build
# times. Since session 57 a one-block recurrence with threads past its cells has them take its
# inputs (codegen.RECUR_INPUT_HELPERS, on), and these tactics are that loop unrolled by 4 / 8:
# H100 (bench/h100/2026-12-06-s57/gpu8/), device time at 384 threads, nn.LSTM 64 / 256 / 1
# 112.1 us unrolled by 1, 106.0 by 4; nn.GRU 107.3 by 1, 97.3 by 8. Built only where such a
# recurrence is: no candidate to time elsewhere.
STEPKERNEL_WIDE_AHEAD_4 = "stepkernel-384-threads-ahead-4"
STEPKERNEL_WIDE_AHEAD_8 = "stepkernel-384-threads-ahead-8"
# A task's array that is a view of another of its arrays at a constant offset (a product's input
# rows cut out of the staged frame) read where that array lies, not copied: a phase and a barrier
# less in each such task (compiler/codegen.ALIAS_VIEWS; the zoo's step kernels at embed 256 run
# 436 phases in all, 399 with it). Not timed alone on a GPU yet (inside stepkernel-fewer-phases,
# below, it was). Built only where a task has such a
# view (every zoo step form and no zoo sequence form; real models' steps, the rolled cell loops'
# windows): no candidate to time elsewhere.
STEPKERNEL_VIEWS = "stepkernel-views"
# The views above, and a phase's products and reductions taken in one pass of the block's warps
# (fewer lanes an element where the warps would otherwise go round twice: the zoo LSTM's second
# layer, eight products of 256 and a LayerNorm's two sums a block on eight warps) and a root that
# only publishes its one product computed by the lanes that computed it
# (compiler/codegen.PHASE_ONE_PASS, ROOT_IN_ARRAY_WARP): the zoo's step
# kernels at embed 256 run 436 phases in all at 256 threads, 364 with both (mamba 53 -> 42, xlstm
# 77 -> 61), and 17 phases of two passes or more, 2; the windows at T = 32, 384 threads: 589 -> 548.
# At 256 and at 384 threads (the tactic the build chose most often). Device time in a CUDA graph,
# H100, session 53 (bench/h100/2026-12-05-s53/), baseline / this tactic at 256 threads: faster in
# each of the ten zoo step kernels timed, 3.4-6.6 %: min_gru 9.65 / 9.29 us, min_lstm 10.30 / 9.67,
# gru 9.95 / 9.57, lstm 10.01 / 9.35, gated_ssm 11.15 / 10.69, attention 14.33 / 13.84, liquid 14.12 /
# 13.52, jamba 16.37 / 15.58, delta_net 16.26 / 15.67, mamba 18.92 / 18.08; session 54
# (bench/h100/2026-12-05-s54/): xlstm 20.6 / 19.8, transformers Mamba, Jamba, GPT-2 at T = 1 and
# GPT-2 at T = 32 1-10 % faster, but Llama at T = 1 14.04 / 14.68 and the lstm window at T = 32
# 61.3 / 62.3 slower (mamba, xlstm, nn.LSTM bidirectional windows within +0.5 %): so a tactic the
# build times per model, not the default.
STEPKERNEL_FEWER_PHASES = "stepkernel-fewer-phases"
STEPKERNEL_WIDE_FEWER_PHASES = "stepkernel-384-threads-fewer-phases"
# ... and scheduled with a head's or a row's few scalars (xLSTM's and delta_net's per-head norms'
# σ and 1 / σ) recomputed by their readers, not two phases of a few threads (schedule's
# recomputed_scalars, RECOMPUTED_SCALARS): 364 -> 354 phases (delta_net 49 -> 43, xlstm 61 -> 57)
FEWER_PHASES = {"alias_views": True, "one_pass": True, "recomputed_scalars": 64}
# The fewer phases above, and the frame's x words published by the frame's block before it
# computes the scalars of x (compiler/codegen.EARLY_FRAME_WORDS): the tasks that read x alone no
# longer wait for the scalars' dot, sum and root phases. H100, session 66
# (bench/h100/2026-12-07-s66/g27/), device time fewer-phases / this: delta_net 15.68, 15.54 / 14.55,
# 14.62 us, liquid 13.42, 14.08 / 13.26, 13.52; gru 9.30, 9.32 / 9.75, 9.47, lstm, attention, mamba
# 0.1 us slower: a tactic the build times per model. Built only where a frame task publishes x
# early (every zoo step form): no candidate elsewhere.
STEPKERNEL_FEWER_PHASES_EARLY_FRAME = "stepkernel-fewer-phases-early-frame"
# The fewer phases above, and scheduled with a product that every block of its reader needs whole
# computed by each of those blocks where a block's share is at most REPLICATED_DOT_MACS
# multiply-adds, instead of published by a task of its own a level earlier
# (compiler/schedule.REPLICATED_DOT_MACS): mamba's x_proj (48 rows of 512 read whole by each
# block of the SSM update), delta_net's and Jamba's. Levels of the zoo's step kernels at embed
# 256 on the H100's grid: mamba 10 -> 8, delta_net 8 -> 6, jamba 8 -> 7; the price is each
# reader block's multiply-adds and weight rows (x_proj: 24,576 and 96 KB a block; a launch's copies
# 6.0 -> 20.1 MB). H100, session 53 (bench/h100/2026-12-05-s53/), device time, fewer-phases / this:
# slower wherever the schedule changes, gated_ssm 10.69 / 13.59 us, attention 13.84 / 17.87, jamba
# 15.58 / 20.20, delta_net 15.67 / 20.43, mamba 18.08 / 19.42 (its trace: the update task's x_proj
# phase, 48 products of 512 on 8 warps, 2757-3337 cycles, more than the level it saves), the
# transformers Mamba / Jamba / GPT-2 at T = 1 (against the plain kernel: 13.79 / 14.05, 17.14 /
# 19.01, 13.56 / 15.60) but faster for Llama (14.17 / 13.61); resident Session.step p50, mamba
# 17.9 / 18.0, delta_net 15.2 / 16.4. Kept as a candidate (the selection never keeps a slower
# one), at 256 threads only. Built only where the schedule changes (attention, delta_net,
# gated_ssm, jamba, mamba, xlstm of the zoo; the transformers models): no candidate elsewhere.
# Session 58 tried it with x in registers (compiler/codegen.DOT_X_IN_REGISTERS) and measured it
# slower but for mamba (H200, device time, fewer-levels without / with: mamba 18.85 / 18.53 us,
# jamba 19.42 / 21.14, delta_net 19.10 / 20.25), so the tactic is as it was; fewer-levels itself
# stayed slower than fewer-phases launched and resident (bench/h200/2026-12-06-s58/).
STEPKERNEL_FEWER_LEVELS = "stepkernel-fewer-levels"
# The fewer phases above, and each product of a recurrence's output that every block of its reader
# needs whole (an out-projection before the next LayerNorm, mamba's x_proj) split into partial sums
# over slices of its contraction axis, computed by the blocks that compute the recurrence, a slice
# a block, and summed by its readers (compiler/simplify.SplitProducts): no level of its own. Levels
# of the zoo's step kernels at embed 256 on the H100's grid: min_gru, min_lstm, gated_ssm 6 -> 4,
# jamba 8 -> 6, mamba 10 -> 8 (attention, delta_net, liquid, xlstm, gru, lstm unchanged: declined).
# The price: the recurrence and its slice of the product on 16 blocks instead of 128, and each
# reader block staging P x N partial sums (16 x 256) instead of N. Built only where the split
# schedule has fewer levels: no candidate elsewhere. H100, 384 threads, device time fewer-phases /
# split: session 62 (bench/h100/2026-12-06-s62/g14/) min_gru 9.52 / 15.66 us, mamba 18.14 / 38.18;
# session 63 (bench/h100/2026-12-06-s63/g17/, the readers' staging rewritten, the partial sums'
# walks skewed) min_gru 9.41 / 10.10, min_lstm 9.62 / 11.30, gated_ssm 10.49 / 11.08, jamba
# 15.78 / 16.80, mamba 17.58 / 27.17, resident p50 slower too (min_gru 10.92 / 12.06): still
# slower, so not timed by a build (UNTIMED_TACTICS) until a GPU shows otherwise.
STEPKERNEL_SPLIT = "stepkernel-split"
STEPKERNEL_WIDE_SPLIT = "stepkernel-384-threads-split"
# Named by select= (bench/microbench/split_products.py), but not among the tactics a timed build
# tries: measured slower (above)
UNTIMED_TACTICS = (STEPKERNEL_SPLIT, STEPKERNEL_WIDE_SPLIT)
# ... with the partial sums' walks skewed (codegen.SKEWED_SUM_WALK): thread e of a slice reads
# weight 16 e + r, which puts a warp's lanes on 2 banks 16 deep; starting each element at its own
# column, min_gru's split kernel 18.81 -> 17.90 us (session 63, bench/h100/2026-12-06-s63/g16/)
SPLIT = {"split": True, "skewed_sums": True}
REPLICATED_DOT_MACS = 1 << 15
FEWER_LEVELS = {**FEWER_PHASES, "replicated_dot_macs": REPLICATED_DOT_MACS}
WIDE_THREADS = 384
COPY_PIECES_TACTIC = 1024  # floats a piece
# A tactic replaces the plain kernel only when its host-to-host median is this much lower (the
# H100 benchmark of 2026-11-26 kept tactics 0.04 % and 0.8 % faster than the plain kernel, within
# the timing's noise: xlstm, gated_ssm)
TACTIC_MARGIN = 0.01
FEWER_BLOCKS_FRACTION = 0.75  # of the SMs
STEPKERNELS = {  # name -> compile_step's tactic arguments
    STEPKERNEL: {"copy_pieces": 0},
    STEPKERNEL_PIECES: {"copy_pieces": COPY_PIECES_TACTIC},
    STEPKERNEL_FEWER_BLOCKS: {"copy_pieces": 0, "grid_fraction": FEWER_BLOCKS_FRACTION},
    STEPKERNEL_WIDE: {"copy_pieces": 0, "threads": WIDE_THREADS},
    STEPKERNEL_PACED: {"copy_pieces": 0, "paced_copies": True},
    STEPKERNEL_UNFRAMED: {"copy_pieces": 0, "compose_input": False},
    STEPKERNEL_SKEWED: {"copy_pieces": 0, "skewed_sums": True},
    STEPKERNEL_WIDE_SKEWED: {"copy_pieces": 0, "threads": WIDE_THREADS, "skewed_sums": True},
    STEPKERNEL_UNROLLED: {"copy_pieces": 0, "roll_recurrences": False},
    STEPKERNEL_REPLICA_CAP: {"copy_pieces": 0, "replica_floats": REPLICA_CAP_FLOATS},
    STEPKERNEL_WIDE_REPLICA_CAP: {"copy_pieces": 0, "threads": WIDE_THREADS, "replica_floats": REPLICA_CAP_FLOATS},
    STEPKERNEL_HYBRID_WIDE: {"copy_pieces": 0, "hybrid_threads": HYBRID_THREADS},
    STEPKERNEL_LANES: {"copy_pieces": 0, "lane_cells": True},
    STEPKERNEL_WIDE_AHEAD_4: {"copy_pieces": 0, "threads": WIDE_THREADS, "inputs_ahead": 4},
    STEPKERNEL_WIDE_AHEAD_8: {"copy_pieces": 0, "threads": WIDE_THREADS, "inputs_ahead": 8},
    STEPKERNEL_VIEWS: {"copy_pieces": 0, "alias_views": True},
    STEPKERNEL_FEWER_PHASES: {"copy_pieces": 0, **FEWER_PHASES},
    STEPKERNEL_WIDE_FEWER_PHASES: {"copy_pieces": 0, "threads": WIDE_THREADS, **FEWER_PHASES},
    STEPKERNEL_FEWER_PHASES_EARLY_FRAME: {"copy_pieces": 0, **FEWER_PHASES, "early_frame": True},
    STEPKERNEL_FEWER_LEVELS: {"copy_pieces": 0, **FEWER_LEVELS},
    STEPKERNEL_SPLIT: {"copy_pieces": 0, **FEWER_PHASES, **SPLIT},
    STEPKERNEL_WIDE_SPLIT: {"copy_pieces": 0, "threads": WIDE_THREADS, **FEWER_PHASES, **SPLIT},
}
# The step compiler's program as one C++ function on the host CPU (compiler/cstep.py,
# engines/cpustep.py): a candidate of fp32 builds, timed host to host like the others.
CPUSTEP = "cpustep"
SELECT_CHOICES = ("time", "time-autotune", "plan", "unoptimized", *STEPKERNELS, CPUSTEP, *COMPILE_MODES)

# A precision build's step kernels (issue 19 item 4). Its graph (precision/convert: fp16 / bf16
# storage; int8 weight-only: DequantizeLinear of int8 weights) is lowered with its weights as the
# graph stores them and its activations and state in float32 (compiler.lower's widened storage:
# the weight-only reading of the build: the graph's rounding of activations left out). Every tactic is then a
# candidate twice: with float32 weight rows, and with the rows in the precision's own format where
# that format stores them exactly (codegen.stores_exactly: the graph already rounded them), named
# "<tactic>@<format>". Both compute with the same weights; the selection keeps the faster, the
# narrow one within TACTIC_MARGIN (the precision asked for, in less memory).
PRECISION_ROWS = {"fp16": "fp16", "bf16": "bf16", "int8": "int8"}  # precision -> its weight rows' format
ROWS_MARK = "@"
# Where the build names the fp32 graph of a precision build (the cuda-graph engine's fp32_graph
# option), that graph's step kernels are timed in the same rounds as references: the build says
# when the precision build is slower than them (issue 19: never slower without saying so).
FP32_REFERENCE = "fp32 graph: "


def candidate_name(tactic: str, weight_format: str = "fp32") -> str:
    """A step-kernel candidate's name: the tactic, with "@<format>" for rows in a narrow format."""
    return tactic if weight_format == "fp32" else f"{tactic}{ROWS_MARK}{weight_format}"


def split_candidate(name: str) -> tuple[str, str]:
    """(tactic or candidate, weight rows' format) of a selection name (see candidate_name)."""
    tactic, mark, weight_format = name.partition(ROWS_MARK)
    return (tactic, weight_format) if mark else (name, "fp32")


def widens_storage(precision: str) -> bool:
    """Whether a build of ``precision`` lowers its graph with widened storage (fp16 / bf16)."""
    return precision in ("fp16", "bf16")


def check_select(select: str, precision: str = "fp32") -> tuple[str, str]:
    """(choice, weight rows' format) of a ``select`` value: one of SELECT_CHOICES, or a step-kernel
    tactic with its precision's narrow rows ("stepkernel@fp16" in an fp16 build)."""
    tactic, weight_format = split_candidate(select)
    if tactic not in SELECT_CHOICES or (weight_format != "fp32" and tactic not in STEPKERNELS):
        raise EngineBuildError(f"select must be one of {SELECT_CHOICES}, got {select!r}")
    if weight_format != "fp32" and PRECISION_ROWS.get(precision) != weight_format:
        raise EngineBuildError(
            f"select {select!r}: {weight_format} weight rows belong to a {weight_format} build, this one is {precision}"
        )
    return tactic, weight_format


def stepkernel_candidate(
    executor,
    plan: Plan,
    say: Callable[[str], None],
    *,
    required: bool = False,
    name: str = STEPKERNEL,
    exact_math: bool = False,
    precision: str = "fp32",
    weight_format: str = "fp32",
):
    """The step compiler's kernel for the engine's graph (``name``: which tactic, see STEPKERNELS;
    ``exact_math``: IEEE division, square root and exp instead of the kernel's default fast math;
    ``precision``: the build's, whose graph an fp16 / bf16 build lowers with widened storage;
    ``weight_format``: its products' rows, PRECISION_ROWS[precision] for the narrow ones), as a
    Plan-like candidate; None (with the reason logged) when the graph cannot be compiled, or
    EngineBuildError when ``required``."""
    from framefuse.compiler.engine import compile_step
    from framefuse.engines.stepkernel import StepKernelPlan

    label = candidate_name(name, weight_format)
    try:
        compiled = compile_step(
            executor.model,
            device=plan.device,
            log=say,
            fast_math=not exact_math,
            widen_storage=widens_storage(precision),
            weight_format=weight_format,
            lossless_rows=weight_format != "fp32",
            **STEPKERNELS[name],
        )
        return StepKernelPlan(compiled, plan.input_specs, plan.output_specs)
    except Exception as exc:  # a graph the compiler declines is reported, never fatal to the build
        reason = f"{type(exc).__name__}: {str(exc)[:400]}"
        if required:
            raise EngineBuildError(f"--select {label}: the step compiler cannot build this graph ({reason})") from exc
        say(f"selection: {label} not a candidate ({reason})")
        return None


def stepkernel_tactics(precision: str = "fp32") -> dict[str, dict]:
    """Candidate name -> prepare_tactics' arguments of every step-kernel candidate of a build of
    ``precision``: each tactic of STEPKERNELS (lowered with widened storage in an fp16 / bf16
    build), then, in a precision build, each again with its rows in PRECISION_ROWS[precision]
    where they are stored exactly."""
    widen = {"widen_storage": True} if widens_storage(precision) else {}
    timed = {name: arguments for name, arguments in STEPKERNELS.items() if name not in UNTIMED_TACTICS}
    tactics = {name: {**arguments, **widen} for name, arguments in timed.items()}
    narrow = PRECISION_ROWS.get(precision)
    if narrow is not None:
        for name, arguments in timed.items():
            tactics[candidate_name(name, narrow)] = {
                **arguments,
                **widen,
                "weight_format": narrow,
                "lossless_rows": True,
            }
    return tactics


def stepkernel_candidates(
    executor, plan: Plan, say: Callable[[str], None], *, exact_math: bool = False, precision: str = "fp32"
) -> dict:
    """Every candidate of stepkernel_tactics(precision) that builds a kernel of its own (name ->
    plan): their sources generated one after the other and compiled side by side (compiler.engine's
    prepare_tactics); none when the plain kernel is declined (the reason logged). A narrow-row
    candidate none of whose products the format stores exactly is the float32 one: not repeated."""
    from framefuse.compiler import memo
    from framefuse.compiler.engine import CompiledStep, device_properties, nvrtc_workers, prepare_tactics
    from framefuse.engines.stepkernel import StepKernelPlan

    candidates: dict = {}
    workers = nvrtc_workers()  # a bad FRAMEFUSE_NVRTC_WORKERS stops the build, not only the step kernel
    try:
        try:
            sources = prepare_tactics(
                executor.model,
                device_properties(plan.device),
                stepkernel_tactics(precision),
                fast_math=not exact_math,
                workers=workers,
                log=say,
            )
        except Exception as exc:  # never fatal to the build: the other candidates still compete
            say(f"selection: {STEPKERNEL} not a candidate ({type(exc).__name__}: {str(exc)[:400]})")
            return candidates
        seen: set = set()
        for tactic, source in sources.items():
            if isinstance(source, Exception):
                say(f"selection: {tactic} not a candidate ({type(source).__name__}: {str(source)[:400]})")
                if tactic == STEPKERNEL:
                    break
                continue
            # a tactic that changes nothing here (no copy long enough to cut) is the same kernel:
            # the same source and the same range table (a tactic may change only the table)
            if source.kernel.identity in seen:
                continue
            try:
                compiled = CompiledStep(source.program, device=plan.device, source=source, log=say)
                candidates[tactic] = StepKernelPlan(compiled, plan.input_specs, plan.output_specs)
            except Exception as exc:  # e.g. too many registers for every block to be resident
                say(f"selection: {tactic} not a candidate ({type(exc).__name__}: {str(exc)[:400]})")
                if tactic == STEPKERNEL:
                    break
                continue
            seen.add(source.kernel.identity)
    finally:
        # the tactics hold what they use; the memo would keep the model's weights past the build
        memo.clear()
    return candidates


def plain_kernel_within_margin(chosen: str, timings: Mapping[str, float | None]) -> bool:
    """Whether the timed selection's ``chosen`` is a step-kernel tactic that is not measurably
    faster than the plain kernel with the same weight rows (within TACTIC_MARGIN of its host-to-host
    median): then the plain kernel is kept, so the same model builds the same kernel from one build
    to the next."""
    tactic, weight_format = split_candidate(chosen)
    plain = timings.get(candidate_name(STEPKERNEL, weight_format))
    if tactic == STEPKERNEL or tactic not in STEPKERNELS or plain is None or timings.get(chosen) is None:
        return False
    return timings[chosen] > plain * (1.0 - TACTIC_MARGIN)


def narrow_rows_within_margin(chosen: str, timings: Mapping[str, float | None], precision: str) -> str | None:
    """The narrow-row twin of a chosen float32-row step kernel in a precision build when it is
    within TACTIC_MARGIN of it (the same numbers in the precision asked for), else None."""
    tactic, weight_format = split_candidate(chosen)
    narrow = PRECISION_ROWS.get(precision)
    if narrow is None or weight_format != "fp32" or tactic not in STEPKERNELS:
        return None
    twin = candidate_name(tactic, narrow)
    if timings.get(twin) is None or timings.get(chosen) is None:
        return None
    return twin if timings[twin] <= timings[chosen] * (1.0 + TACTIC_MARGIN) else None


def fp32_comparison(report: dict, precision: str) -> dict | None:
    """How the chosen candidate of a precision build compares with the fastest step kernel of its
    fp32 graph timed in the same rounds (FP32_REFERENCE), or None when none was timed: {"precision",
    "chosen", "us_per_step", "fp32_reference", "fp32_us_per_step", "slower"}; "slower" when the
    chosen one's median is more than TACTIC_MARGIN above."""
    candidates = report.get("candidates") or {}
    references = {
        name: entry["us_per_step"]
        for name, entry in candidates.items()
        if entry.get("reference") and name.startswith(FP32_REFERENCE) and "us_per_step" in entry
    }
    chosen = report.get("chosen")
    mine = (candidates.get(chosen) or {}).get("us_per_step")
    if not references or mine is None:
        return None
    best = min(references, key=references.get)
    return {
        "precision": precision,
        "chosen": chosen,
        "us_per_step": mine,
        "fp32_reference": best.removeprefix(FP32_REFERENCE),
        "fp32_us_per_step": references[best],
        "slower": mine > references[best] * (1.0 + TACTIC_MARGIN),
    }


def comparison_line(comparison: dict) -> str:
    """The build's line for fp32_comparison's result."""
    mine, theirs = comparison["us_per_step"], comparison["fp32_us_per_step"]
    head = (
        f"the {comparison['precision']} build's {comparison['chosen']} takes {mine:.2f} us against "
        f"{theirs:.2f} us for the fp32 graph's {comparison['fp32_reference']}"
    )
    if comparison["slower"]:
        return f"{head}: this {comparison['precision']} build is SLOWER than the fp32 build ({mine / theirs - 1:.1%})"
    return f"{head}: not slower than the fp32 build"


UNFUSED = "unfused"  # the candidates made from the graph before the rewrite ("unfused", "unfused+inductor")


def apply_selection(
    executor,
    plan: Plan,
    select: str,
    *,
    unfused_executor=None,
    exact_math: bool = False,
    precision: str = "fp32",
    fp32_graph=None,
    log: Callable[[str], None] | None = None,
) -> tuple[Plan, dict]:
    """The engine's hook: ``select`` is "time" (time the plan, the unoptimised plan and the
    inductor-compiled plan; "time-autotune" adds ``max-autotune-no-cudagraphs``) or a candidate
    name recorded by an earlier build (the artifact's metadata), applied without timing again.

    With ``unfused_executor`` (a GraphExecutor of the graph before the rewrite, same inputs and
    outputs), timing also runs that graph, plain and compiled: a fused op that makes the model
    slower is never kept. When one of those wins, report["graph"] is "unfused" (the caller then
    runs that executor) and report["apply"] is the choice to re-apply to it at load.
    In an fp32 build without ``exact_math`` the step compiler's CPU step (engines/cpustep.py,
    CPUSTEP) is a candidate too, timed host to host like the others.
    ``exact_math``: the step kernels are compiled with exact IEEE math (compiler/engine.FAST_MATH).
    ``precision``: the build's (its graph converted by framefuse.precision): the step kernels
    compute with the graph's weights and float32 activations (see PRECISION_ROWS), every candidate
    is checked against the plan within the precision's tolerance (a tactic named alone reads float32
    rows, "<tactic>@<format>" the narrow ones); ``fp32_graph`` (that build's fp32 graph): its step kernels are timed
    beside as references, and report["vs_fp32"] says whether this build is slower.
    Returns (plan, report); report["log"] holds the lines logged."""
    from framefuse.config import PRECISION_TOLERANCE
    from framefuse.engines.executor import GraphExecutor

    lines: list[str] = []

    def say(message: str) -> None:
        lines.append(message)
        if log is not None:
            log(message)

    choice, weight_format = check_select(select, precision)

    def unoptimized() -> Plan:
        other = GraphExecutor(executor.model, executor.device, executor.framefuse_impl, optimize=False)
        shapes = {name: spec.shape for name, spec in plan.input_specs.items()}
        return other.plan(shapes)

    if select.startswith("time") and plan.device.type != "cuda":
        chosen, report = select_plan(plan, log=say)  # skipped with a note
    elif select.startswith("time"):
        phases: dict[str, float] = {}
        started = time.perf_counter()
        alternatives = {"unoptimized": unoptimized()} if executor.optimize else {}
        started = _phase(phases, "unoptimized plan", started)
        alternatives.update(stepkernel_candidates(executor, plan, say, exact_math=exact_math, precision=precision))
        started = _phase(phases, "step kernels", started)
        if precision == "fp32" and not exact_math:  # (its exp and tanh are glibc's vector ones, not IEEE-exact)
            from framefuse.engines.cpustep import cpustep_candidate

            cpu = cpustep_candidate(executor.model, plan, say)
            if cpu is not None:
                alternatives[CPUSTEP] = cpu
            started = _phase(phases, "CPU step", started)
        references = {}
        if fp32_graph is not None and precision != "fp32":
            from types import SimpleNamespace

            fp32_kernels = stepkernel_candidates(SimpleNamespace(model=fp32_graph), plan, say, exact_math=exact_math)
            references = {FP32_REFERENCE + name: kernel for name, kernel in fp32_kernels.items()}
        if unfused_executor is not None:
            shapes = {name: spec.shape for name, spec in plan.input_specs.items()}
            try:
                alternatives[UNFUSED] = unfused_executor.plan(shapes)
            except Exception as exc:  # e.g. an op outside the table: reported, the fused plans still compete
                say(f"selection: {UNFUSED} graph not a candidate ({type(exc).__name__}: {str(exc)[:200]})")
        started = _phase(phases, "references and the unfused plan", started)
        modes = dict(COMPILE_MODES) if select == "time-autotune" else {"inductor": COMPILE_MODES["inductor"]}
        precise = precision == "fp32"
        chosen, report = select_plan(
            plan,
            alternatives=alternatives,
            modes=modes,
            compile_also=(UNFUSED,) if UNFUSED in alternatives else (),
            references=references,
            tolerance=PARITY_TOLERANCE if precise else PRECISION_TOLERANCE[precision],
            relative=not precise,
            log=say,
        )
        report["phase_s"] = {**{k: round(v, 2) for k, v in phases.items()}, **report.get("phase_s", {})}
        say("selection: seconds by phase, " + ", ".join(f"{k} {v:.1f}" for k, v in report["phase_s"].items()))
        name = report["chosen"]
        timings = {k: v.get("us_per_step") for k, v in report.get("candidates", {}).items() if not v.get("reference")}
        twin = narrow_rows_within_margin(name, timings, precision)
        if twin is not None:
            say(
                f"selection: {twin} ({timings[twin]:.2f} us) is within {TACTIC_MARGIN:.0%} of {name} "
                f"({timings[name]:.2f} us), the same numbers: the {precision} rows are kept"
            )
            name = report["chosen"] = twin
            chosen = alternatives[twin]
        if plain_kernel_within_margin(name, timings):
            plain = candidate_name(STEPKERNEL, split_candidate(name)[1])
            say(
                f"selection: {name} ({timings[name]:.2f} us) is within {TACTIC_MARGIN:.0%} of {plain} "
                f"({timings[plain]:.2f} us): the plain kernel is kept"
            )
            name = report["chosen"] = plain
            chosen = alternatives[plain]
        for candidate, kernel_plan in (*alternatives.items(), *references.items()):
            if getattr(kernel_plan, "compiled", None) is not None:
                report.setdefault("candidates", {}).setdefault(candidate, {})["kernel"] = (
                    kernel_plan.compiled.describe()
                )
        if name == UNFUSED or name.startswith(UNFUSED + "+"):
            report["graph"] = UNFUSED
            report["apply"] = name.partition("+")[2] or "plan"
            say(f"selection: the unfused graph is faster than the fused one here: the engine runs it ({name})")
        comparison = fp32_comparison(report, precision)
        if comparison is not None:
            report["vs_fp32"] = comparison
            say(f"selection: {comparison_line(comparison)}")
    elif choice == "plan":
        chosen, report = plan, {"chosen": "plan"}
    elif choice == "unoptimized":
        chosen, report = unoptimized(), {"chosen": "unoptimized"}
    elif choice == CPUSTEP:
        from framefuse.engines.cpustep import cpustep_candidate

        chosen = cpustep_candidate(executor.model, plan, say, required=True)
        report = {"chosen": CPUSTEP}
    elif choice in STEPKERNELS and plan.device.type == "cuda":
        chosen = stepkernel_candidate(
            executor,
            plan,
            say,
            required=True,
            name=choice,
            exact_math=exact_math,
            precision=precision,
            weight_format=weight_format,
        )
        report = {"chosen": candidate_name(choice, weight_format)}
    elif plan.device.type != "cuda":
        note = f"recorded choice {select!r} needs a CUDA device: the plan is used as planned"
        say(note)
        chosen, report = plan, {"chosen": "plan", "skipped": note}
    else:
        chosen, info = compile_plan(plan, mode=COMPILE_MODES[choice])
        report = {"chosen": choice, "compile_s": info["compile_s"]}
        say(f"selection: {choice} (recorded at build) compiled in {info['compile_s']:.1f} s")
    if getattr(chosen, "compiled", None) is not None:
        report["stepkernel"] = chosen.compiled.describe()
    if getattr(chosen, "host_only", False):
        report[CPUSTEP] = chosen.describe()
    report["log"] = lines
    return chosen, report


__all__ = [
    "COMPILE_MODES",
    "CPUSTEP",
    "SELECT_CHOICES",
    "STEPKERNEL",
    "STEPKERNELS",
    "STEPKERNEL_FEWER_BLOCKS",
    "STEPKERNEL_REPLICA_CAP",
    "STEPKERNEL_WIDE_REPLICA_CAP",
    "STEPKERNEL_HYBRID_WIDE",
    "STEPKERNEL_LANES",
    "STEPKERNEL_VIEWS",
    "STEPKERNEL_FEWER_PHASES",
    "STEPKERNEL_WIDE_FEWER_PHASES",
    "STEPKERNEL_FEWER_PHASES_EARLY_FRAME",
    "STEPKERNEL_WIDE",
    "STEPKERNEL_PACED",
    "STEPKERNEL_UNFRAMED",
    "STEPKERNEL_PIECES",
    "UNFUSED",
    "PRECISION_ROWS",
    "apply_selection",
    "candidate_name",
    "check_select",
    "split_candidate",
    "stepkernel_tactics",
    "Segment",
    "compile_plan",
    "example_feeds",
    "find_segments",
    "select_plan",
    "session_io",
    "stepkernel_candidate",
    "time_plan_graph",
    "time_plans_host",
    "keep_host_step_between_frames",
]
