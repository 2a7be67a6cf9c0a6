#!/usr/bin/env python
"""The step compiler on a GPU: parity and latency of the one-kernel step, every zoo architecture.

For each architecture (configs/<arch>.yaml: embed 256, 2 layers, batch 1) the step form is
exported and rewritten, then built by the cuda-graph engine with ``select="stepkernel"`` and run
through ``Session.step`` (host frame in, host output back, state on the GPU):

  parity     --steps chained steps against ONNX Runtime (CPU) on the original model.onnx, each side
             carrying its own state; max |diff| of y per step and of every final state, relative
             to 1 + |reference|
  latency    Session.step p50 / p99 over --iters frames; the raw replay + sync of the same graph
             (no Session, no frame copy) for the host work Session.step adds; the engine's
             previous best plan (``select="plan"``) in the same process
  resident   the same engine with Session(resident=True): the kernel launched once and rung
             per frame; parity against ONNX Runtime over the same frames, bitwise equality
             with the launched kernel over the first 200, Session.step p50 / p99
  floors     mapped: a CUDA graph of one kernel reading its input from and writing its output to
             pinned mapped host memory, replayed and synchronised with the same host loop;
             copy: the H2D copy + one kernel + D2H copy graph bench/e2e.py calls its floor
  schedule   tasks, dependency levels, shared memory, registers (from the compiled kernel)

--sweep times the raw kernel (CUDA events over back-to-back replays) at several grid sizes and
block sizes for the architectures named, so the defaults are chosen by measurement.

    python bench/stepkernel.py --out /tmp/sk                       # every zoo architecture
    python bench/stepkernel.py --archs min_gru,mamba --sweep min_gru,mamba --out /tmp/sk
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "bench"):  # framefuse, and bench/e2e.py's measure and floor
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

TOL = 1e-4


def say(message: str) -> None:
    print(f"[stepkernel {time.strftime('%H:%M:%S')}] {message}", flush=True)


def timed(call, iters: int, warmup: int) -> dict:
    """bench/e2e.py's measure (p50 / p99 / mean / max µs of host→host calls)."""
    from e2e import measure

    return measure(call, iters=iters, warmup=warmup)


def mapped_floor(out_shape, pool, iters: int, warmup: int) -> dict:
    """bench/e2e.py's mapped floor: one kernel on pinned mapped host memory in a CUDA graph."""
    import torch
    from e2e import make_mapped_floor

    call = make_mapped_floor(pool=pool, out_shape=out_shape, device=torch.device("cuda"))
    result = timed(call, iters, warmup)
    result["output_correct"] = call.check()
    return result


def copy_floor(in_shape, out_shape, pool, iters: int, warmup: int) -> dict:
    import torch
    from e2e import make_floor

    call = make_floor(pool=pool, out_shape=out_shape, device=torch.device("cuda"))
    return timed(call, iters, warmup)


def ort_rollout(onnx_path, manifest: dict, frames: np.ndarray):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    names = manifest.get("state_names") or []
    shapes = {i["name"]: i["shape"] for i in manifest["inputs"]}
    state = {f"state.{n}": np.zeros(shapes[f"state.{n}"], dtype=np.float32) for n in names}
    outs = []
    wanted = [out_name] + [f"next_state.{n}" for n in names]
    for frame in frames:
        result = sess.run(wanted, {in_name: frame, **state})
        outs.append(result[0])
        for n, value in zip(names, result[1:]):
            state[f"state.{n}"] = value
    return np.stack(outs), state


def bench_arch(arch: str, args, root: Path) -> dict:
    import torch

    from framefuse.engines import cuda_graph
    from framefuse.runtime.pipeline import prepare
    from framefuse.runtime.session import Session

    row: dict = {"arch": arch}
    start = time.perf_counter()
    prepared = prepare(arch, root / arch)["step"]
    if prepared.fused is None:
        row["error"] = f"rewrite failed: {prepared.fused_error}"
        return row
    manifest = prepared.manifest
    in_shape = manifest["inputs"][0]["shape"]
    out_shape = manifest["outputs"][0]["shape"]
    row["export_s"] = round(time.perf_counter() - start, 2)
    lines: list[str] = []
    start = time.perf_counter()
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": args.select}, log=lines.append)
    row["select"] = args.select
    row["build_s"] = round(time.perf_counter() - start, 2)
    row["build_log"] = lines
    row["kernel"] = engine.default_plan.compiled.describe()
    session = Session(engine, budget_ms=None)
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((args.steps, *in_shape)).astype(np.float32)
    # parity: chained steps against ONNX Runtime
    ref_y, ref_state = ort_rollout(prepared.onnx, manifest, frames)
    worst_y = 0.0
    for i, frame in enumerate(frames):
        y = session.step(frame)
        worst_y = max(worst_y, float((np.abs(y - ref_y[i]) / (1 + np.abs(ref_y[i]))).max()))
    state = session.get_state()
    worst_state = {
        name: float((np.abs(state[name] - ref_state[name]) / (1 + np.abs(ref_state[name]))).max()) for name in ref_state
    }
    row["parity"] = {
        "steps": args.steps,
        "max_rel_diff_y": worst_y,
        "max_rel_diff_state": worst_state,
        "passed": worst_y <= TOL and all(v <= TOL for v in worst_state.values()),
    }
    say(
        f"{arch} ({args.select}): parity over {args.steps} steps: y {worst_y:.2e}, "
        f"state {max(worst_state.values()):.2e}" + ("" if row["parity"]["passed"] else f"  FAILED (tolerance {TOL})")
    )
    # latency
    pool = rng.standard_normal((64, *in_shape)).astype(np.float32)
    session.reset()
    row["session_step"] = timed(lambda i: session.step(pool[i % 64]), args.iters, args.warmup)
    binding = session._host_step
    row["replay_sync"] = timed(lambda i: (binding.launch(), binding.sync()), args.iters, args.warmup)
    # the same replay, the host waiting on the kernel's done words (what Session.step does)
    row["replay_wait_host"] = timed(lambda i: (binding.launch(), binding.wait_host()), args.iters, args.warmup)
    binding.sync()
    row["session_host_us"] = round(row["session_step"]["p50_us"] - row["replay_wait_host"]["p50_us"], 2)
    if not args.no_resident:
        row.update(resident_rows(engine, frames, ref_y, ref_state, pool, args))
        say(
            f"{arch}: resident step p50 {row['resident_step']['p50_us']} us p99 {row['resident_step']['p99_us']} us, "
            f"parity y {row['resident_parity']['max_rel_diff_y']:.2e}, "
            f"bitwise equal to the launched kernel: {row['resident_parity']['equals_launched']}"
        )
    row["floor_mapped"] = mapped_floor(out_shape, pool, args.iters, args.warmup)
    row["floor_copy"] = copy_floor(in_shape, out_shape, pool, args.iters, args.warmup)
    # device time of one step: back-to-back replays timed with events
    from framefuse.engines.fusion import example_feeds, time_plan_graph

    plan = engine.default_plan
    row["device_us_per_step"] = time_plan_graph(plan, example_feeds(plan))["us_per_step"]
    levels = row["kernel"]["levels"]
    floor = row["floor_mapped"]["p50_us"]
    row["us_per_level"] = round((row["session_step"]["p50_us"] - floor) / max(levels, 1), 2)
    if not args.no_plan:
        other = cuda_graph.build(prepared.fused, device="cuda", options={"select": "plan"})
        other_session = Session(other, budget_ms=None)
        row["cuda_graph_plan"] = timed(lambda i: other_session.step(pool[i % 64]), args.iters, args.warmup)
        row["cuda_graph_plan"]["kernels"] = len(other.default_plan.steps)
        other_session = other = None
    say(
        f"{arch}: step p50 {row['session_step']['p50_us']} us p99 {row['session_step']['p99_us']} us "
        f"(mapped floor {floor} us, {levels} levels, device {row['device_us_per_step']} us)"
    )
    session = engine = None  # the binding and its buffers go before the next architecture
    torch.cuda.synchronize()
    return row


def resident_rows(engine, frames, ref_y, ref_state, pool, args) -> dict:
    """The same engine with the kernel resident (Session(resident=True)): parity against ONNX
    Runtime over the same chained frames, equality with the launched kernel, and Session.step
    timed the same way."""
    from framefuse.runtime.session import Session

    launched = Session(engine, budget_ms=None)
    expected = [launched.step(f).copy() for f in frames[:200]]
    launched = None
    rows: dict = {}
    with Session(engine, budget_ms=None, resident=True) as session:
        worst_y, equal = 0.0, True
        for i, frame in enumerate(frames):
            y = session.step(frame)
            worst_y = max(worst_y, float((np.abs(y - ref_y[i]) / (1 + np.abs(ref_y[i]))).max()))
            if i < len(expected):
                equal = equal and bool(np.array_equal(y, expected[i]))
        state = session.get_state()
        worst_state = {
            n: float((np.abs(state[n] - ref_state[n]) / (1 + np.abs(ref_state[n]))).max()) for n in ref_state
        }
        rows["resident_parity"] = {
            "steps": len(frames),
            "max_rel_diff_y": worst_y,
            "max_rel_diff_state": worst_state,
            "equals_launched": equal,
            "passed": worst_y <= TOL and all(v <= TOL for v in worst_state.values()),
        }
        session.reset()
        rows["resident_step"] = timed(lambda i: session.step(pool[i % 64]), args.iters, args.warmup)
        rows["resident_starts"] = session._host_step.starts
    return rows


def sweep(arch: str, root: Path, grids, threads_list) -> list:
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.fusion import example_feeds, time_plan_graph
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.runtime.pipeline import prepare

    arch, *variants = arch.split("+")
    settings = {}  # CompiledStep's arguments for the variants (their defaults: the codegen settings)
    for variant in variants:
        if variant == "lanes":
            settings["lane_cells"] = True
        elif variant.startswith("ahead") and variant[5:].isdigit() and int(variant[5:]) >= 1:
            settings["inputs_ahead"] = int(variant[5:])
        elif variant in ("together", "no-together"):
            settings["take_together"] = variant == "together"
        elif variant in ("helpers", "no-helpers"):
            settings["input_helpers"] = variant == "helpers"
        elif variant in ("xregs", "no-xregs"):
            settings["x_in_registers"] = variant == "xregs"
        else:
            raise SystemExit(
                f"--sweep {arch}+{variant}: variants are +lanes (codegen.RECUR_LANE_CELLS on), +aheadN "
                "(codegen.RECUR_INPUTS_AHEAD = N), +together / +no-together (codegen.RECUR_TAKE_TOGETHER on / "
                "off), +helpers / +no-helpers (codegen.RECUR_INPUT_HELPERS on / off) and +xregs / +no-xregs "
                "(codegen.DOT_X_IN_REGISTERS on / off)"
            )
    label = "+".join([arch, *variants])
    if arch.startswith("rnn:"):  # rnn:KIND/HIDDEN/T/DIRECTIONS, one of bench/rnn_sizes.py's windows
        from bench.rnn_sizes import export_window

        kind, hidden, seq, dirs = arch.removeprefix("rnn:").split("/")
        folder = root / f"sweep-{kind}-{hidden}-{seq}-{dirs}"
        fused = export_window(kind, int(hidden), int(seq), int(dirs), folder)["fused"]
    else:
        fused = prepare(arch, root / f"sweep-{arch}")["step"].fused
    program = lower_program(fused)
    rows = []
    for grid in grids:
        for threads in threads_list:
            entry = {"arch": label, "grid": grid, "threads": threads}
            try:
                compiled = CompiledStep(program, device=torch.device("cuda"), grid=grid, threads=threads, **settings)
                plan = StepKernelPlan.of(compiled)
                entry.update(time_plan_graph(plan, example_feeds(plan), replays=500))
                entry["levels"] = compiled.schedule.levels()
                entry["registers"] = compiled.fn.attribute("NUM_REGS")
            except Exception as exc:  # noqa: BLE001 - a configuration that cannot run is reported
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            say(f"sweep {entry['arch']} grid {grid} threads {threads}: {entry.get('us_per_step', entry.get('error'))}")
            rows.append(entry)
    return rows


def trace_arch(arch: str, root: Path, select: str = "stepkernel") -> list:
    """The per-task timeline of one launch (device inputs), from a traced build of the kernel of
    tactic ``select`` (engines/fusion.STEPKERNELS); ``ARCH/sequenceT``: the sequence form's window
    of T frames."""
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.fusion import example_feeds, time_plan_graph
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.runtime.pipeline import prepare

    name, _, steps = arch.partition("/sequence")
    if arch.startswith("real:"):  # real:NAME/T, a tests/real_models model's window of T frames
        from e2e import load_real_models

        real, _, seq = arch[len("real:") :].partition("/")
        _, flow = load_real_models()
        prepared = flow.fuse_real_model(real, int(seq or 1), root / f"trace-{real}-{seq or 1}")
    elif arch != name:
        prepared = prepare(name, root / f"trace-{name}-{steps}", {"seq": int(steps or 32)})["sequence"]
    else:
        prepared = prepare(arch, root / f"trace-{arch}")["step"]
    from framefuse.engines.fusion import STEPKERNELS

    tactic = dict(STEPKERNELS[select])
    lowering = {k: tactic.pop(k) for k in ("compose_input", "roll_recurrences", "split") if k in tactic}
    program = lower_program(prepared.fused, **lowering)
    compiled = CompiledStep(program, device=torch.device("cuda"), trace=True, **tactic)
    plan = StepKernelPlan.of(compiled)
    feeds = example_feeds(plan)
    for _ in range(20):
        plan.execute(feeds)
    torch.cuda.synchronize()
    timeline = compiled.timeline()
    untraced = StepKernelPlan.of(CompiledStep(program, device=torch.device("cuda"), **tactic))
    say(
        f"trace {arch} ({select}): device us a step, traced {time_plan_graph(plan, feeds)['us_per_step']}, "
        f"untraced {time_plan_graph(untraced, example_feeds(untraced))['us_per_step']}; "
        f"{compiled.grid} blocks x {compiled.threads} threads, {compiled.kernel.smem_bytes} B shared memory"
    )
    for row in timeline:
        say(
            f"trace {arch} task {row['task']:>2} ({row['blocks']:>3} blocks, {row['phases']} phases) "
            f"enter {row['enter_us'][0]:6.2f}/{row['enter_us'][1]:6.2f} ready {row['ready_us'][0]:6.2f}/{row['ready_us'][1]:6.2f} "
            f"exit {row['exit_us'][0]:6.2f}/{row['exit_us'][1]:6.2f}  {row['value'][:60]}; "
            f"cycles a phase {row['phase_cycles']}"
        )
    return timeline


def trace_resident(arch: str, root: Path, select: str = "stepkernel", samples: int = 20, frames: int = 50) -> dict:
    """The per-task timeline of the resident kernel (Session(resident=True)) of tactic ``select``:
    ``samples`` times, ``frames`` frames then a stop, the last frame's stamps read back; per task
    the median over the samples of its blocks' median and latest entry, inputs and exit (µs after
    the median block entered the frame, CompiledStep.timeline(resident=True)). The traced
    session's step p50 / p99 come with it (the stamps cost a little: compare with an untraced run)."""
    import torch

    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines import cuda_graph
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.runtime.pipeline import prepare
    from framefuse.runtime.session import Session

    prepared = prepare(arch, root / f"trace-resident-{arch}")["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": select})
    chosen = engine.metadata["selection"]["chosen"]
    if chosen != select:
        raise RuntimeError(f"{arch}: the build chose {chosen}, not {select}")
    shape = prepared.manifest["inputs"][0]["shape"]
    frames_in = np.random.default_rng(0).standard_normal((frames, *shape)).astype(np.float32)
    with Session(engine, budget_ms=None) as launched:  # the untraced launched kernel's answers
        expected = np.stack([launched.step(frame).copy() for frame in frames_in])
    plan = engine.default_plan
    c = plan.compiled
    traced = CompiledStep(c.program, device=c.device, source=c.source.traced())
    engine.default_plan = StepKernelPlan(traced, plan.input_specs, plan.output_specs)
    runs, times, got = [], [], []
    with Session(engine, budget_ms=None, resident=True) as session:
        binding = session._host_step
        for sample in range(samples):
            for frame in frames_in:
                t0 = time.perf_counter_ns()
                y = session.step(frame)
                times.append(time.perf_counter_ns() - t0)
                if sample == 0:
                    got.append(y.copy())
            binding.stop()  # the last frame's stamps stay in the trace buffer
            runs.append(binding.compiled.timeline(resident=True))
    torch.cuda.synchronize()
    if not np.array_equal(np.stack(got), expected):  # the stamps change no value
        raise RuntimeError(f"{arch}: the traced resident kernel's outputs differ from the launched kernel's")
    rows = []
    for i, row in enumerate(runs[0]):
        merged = {k: row[k] for k in ("task", "value", "blocks", "phases")}
        for key in ("enter_us", "ready_us", "exit_us"):
            merged[key] = [round(float(np.median([r[i][key][j] for r in runs])), 2) for j in (0, 1)]
        cycles = [r[i]["phase_cycles"] for r in runs if len(r[i]["phase_cycles"]) == len(row["phase_cycles"])]
        merged["phase_cycles"] = [int(np.median(col)) for col in zip(*cycles)] if cycles else []
        merged["block_us_last_sample"] = runs[-1][i].get("block_us", [])
        rows.append(merged)
    # each sample's first frame launches the kernel again
    steps = np.asarray(times, dtype=np.float64).reshape(samples, frames)[:, 1:].reshape(-1) / 1e3
    p50, p99 = float(np.percentile(steps, 50)), float(np.percentile(steps, 99))
    print(
        f"trace-resident {arch} ({select}): {samples} samples of {frames} frames; traced step p50 {p50:.1f} us, "
        f"p99 {p99:.1f} us; {traced.grid} blocks x {traced.threads} threads",
        flush=True,
    )
    for row in rows:
        print(
            f"trace-resident {arch} task {row['task']:>2} ({row['blocks']:>3} blocks, {row['phases']} phases) "
            f"enter {row['enter_us'][0]:6.2f}/{row['enter_us'][1]:6.2f} ready {row['ready_us'][0]:6.2f}/{row['ready_us'][1]:6.2f} "
            f"exit {row['exit_us'][0]:6.2f}/{row['exit_us'][1]:6.2f}  {row['value'][:60]}; cycles a phase {row['phase_cycles']}",
            flush=True,
        )
    return {"select": select, "step_p50_us": round(p50, 2), "step_p99_us": round(p99, 2), "tasks": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default=None, help="comma-separated (default: every zoo architecture)")
    parser.add_argument("--steps", type=int, default=1000, help="chained steps of the parity check")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument(
        "--sweep",
        default="",
        help="architectures whose grid/block sizes are swept (rnn:KIND/HIDDEN/T/DIRECTIONS: a bench/rnn_sizes.py window; +lanes after a name: codegen.RECUR_LANE_CELLS on; +aheadN: codegen.RECUR_INPUTS_AHEAD = N; +together / +no-together: codegen.RECUR_TAKE_TOGETHER on / off; +helpers / +no-helpers: codegen.RECUR_INPUT_HELPERS on / off)",
    )
    parser.add_argument("--grids", default="16,33,66,132")
    parser.add_argument("--threads", default="128,256,512")
    parser.add_argument(
        "--select",
        default="stepkernel",
        help="the step kernel's tactic (engines/fusion.STEPKERNELS: stepkernel, stepkernel-pieces, ...)",
    )
    parser.add_argument("--no-plan", action="store_true", help="skip the cuda-graph plan comparison")
    parser.add_argument("--no-resident", action="store_true", help="skip the resident kernel (Session(resident=True))")
    parser.add_argument(
        "--trace",
        default="",
        help="architectures whose per-task timeline is printed (ARCH/sequenceT: the sequence form; real:NAME/T: a tests/real_models model)",
    )
    parser.add_argument(
        "--trace-resident",
        default="",
        help="architectures whose resident kernel's per-task timeline is printed (the last frame of each of 20 samples)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch

    from framefuse.engines.fusion import STEPKERNELS

    if args.select not in STEPKERNELS:
        parser.error(f"--select must be one of {', '.join(STEPKERNELS)}, got {args.select!r}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ff-stepkernel-"))
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "settings": {"steps": args.steps, "iters": args.iters, "warmup": args.warmup, "select": args.select},
        "rows": [],
        "sweep": [],
    }
    from framefuse.models import ARCHITECTURES

    for arch in [a for a in args.archs.split(",") if a] if args.archs else ARCHITECTURES:
        try:
            result["rows"].append(bench_arch(arch, args, root))
        except Exception as exc:  # noqa: BLE001 - a failing architecture is a row with its error
            traceback.print_exc()
            result["rows"].append({"arch": arch, "error": f"{type(exc).__name__}: {str(exc)[:1000]}"})
        (out / "stepkernel.json").write_text(json.dumps(result, indent=2))
    for key, archs, trace in (
        ("traces", args.trace, trace_arch),
        ("resident_traces", args.trace_resident, trace_resident),
    ):
        result[key] = {}
        for arch in [a for a in archs.split(",") if a]:
            try:
                result[key][arch] = trace(arch, root, args.select)
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                result[key][arch] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            (out / "stepkernel.json").write_text(json.dumps(result, indent=2))
    for arch in [a for a in args.sweep.split(",") if a]:
        grids = [int(g) for g in args.grids.split(",")]
        threads = [int(t) for t in args.threads.split(",")]
        result["sweep"] += sweep(arch, root, grids, threads)
        (out / "stepkernel.json").write_text(json.dumps(result, indent=2))
    print(
        "\narch        levels  step p50/p99 us   mapped floor  x floor  device us  replay sync/host-wait  parity y   plan p50"
        "  resident p50/p99 us  x floor  parity y  = launched"
    )
    for row in result["rows"]:
        if "error" in row:
            print(f"{row['arch']:<11} ERROR {row['error'][:150]}")
            continue
        s = row["session_step"]
        f = row["floor_mapped"]["p50_us"]
        plan = row.get("cuda_graph_plan", {}).get("p50_us", float("nan"))
        print(
            f"{row['arch']:<11} {row['kernel']['levels']:>6}  {s['p50_us']:>7.1f}/{s['p99_us']:<7.1f}  {f:>10.1f}  "
            f"{s['p50_us'] / f:>6.2f}x  {row['device_us_per_step']:>8.1f}  "
            f"{row['replay_sync']['p50_us']:>10.1f}/{row['replay_wait_host']['p50_us']:<10.1f}  "
            f"{row['parity']['max_rel_diff_y']:.1e}  {plan:>8.1f}"
            + (
                f"  {row['resident_step']['p50_us']:>8.1f}/{row['resident_step']['p99_us']:<8.1f}  "
                f"{row['resident_step']['p50_us'] / f:>6.2f}x  {row['resident_parity']['max_rel_diff_y']:.1e}  "
                f"{row['resident_parity']['equals_launched']}"
                if "resident_step" in row
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
