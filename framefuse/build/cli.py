"""``framefuse build``: an ONNX graph → an engine artifact of one backend (see
:mod:`framefuse.engines.registry`): ``engine.ffe`` (cuda-graph), ``engine.ort`` (ONNX Runtime),
``engine.plan`` (TensorRT). The command parses and prints; :mod:`framefuse.build` builds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from framefuse.cli import non_negative_int, positive_float
from framefuse.config import INT8_MODES, PRECISIONS
from framefuse.engines.registry import ENGINES

EXAMPLES = """\
examples:
  framefuse build artifacts/mamba-step                      # the default engine for this machine
  framefuse build artifacts/mamba-step --engine onnxruntime # -> engine.ort over model.onnx (CPU EP)
  framefuse build artifacts/mamba/model.fused.onnx --engine cuda-graph   # -> artifacts/mamba/engine.ffe
  framefuse build artifacts/mamba --engine cuda-graph --device cpu       # the CPU executor (no GPU needed)
  framefuse build artifacts/mamba --engine onnxruntime --fused           # fused graph, nodes by references
  framefuse build artifacts/mamba --precision fp16          # convert the graph first (framefuse.precision)"""


def _engine_help() -> str:
    return "; ".join(f"{k.name}: {k.summary} -> {k.artifact_name}" for k in ENGINES.values())


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "build",
        help="build an engine artifact (cuda-graph engine.ffe, onnxruntime engine.ort, tensorrt engine.plan)",
        description="Build an engine of an ONNX graph with one backend, check every op is supported, and write "
        "its artifact next to the graph (atomically). Loading refuses an artifact whose source changed or that was "
        "built for another GPU or framefuse version. The default engine is cuda-graph on a machine with a usable "
        "CUDA GPU (torch + cuda-python), else onnxruntime. Engines: " + _engine_help(),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="ONNX_OR_FOLDER", help="model.fused.onnx, model.onnx, or an artifact folder")
    parser.add_argument(
        "--engine",
        choices=tuple(ENGINES),
        default=None,
        help="backend (default: cuda-graph with a GPU, onnxruntime without)",
    )
    parser.add_argument(
        "-o", "--out", metavar="PATH", help="artifact path (a file or a folder; default: the source's folder)"
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is a GPU")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="convert the graph first (framefuse.precision); default fp32: as exported",
    )
    parser.add_argument(
        "--int8-mode",
        choices=INT8_MODES,
        default=None,
        help="--precision int8: weights (default) quantizes the weights per output channel and keeps "
        "activations and state in fp32, no calibration; qdq also quantizes activations, calibrated on "
        "--calib (default with --calib)",
    )
    parser.add_argument(
        "--no-precision-fallback",
        dest="precision_fallback",
        action="store_false",
        help="--precision int8 --int8-mode weights: refuse a build that fails the accuracy gate instead of "
        "keeping its most sensitive products in float32 until it passes (at most half of them; the "
        "accuracy report names them)",
    )
    parser.add_argument(
        "--calib", metavar="FILE", help="calibration frames (.npz) for --precision int8 --int8-mode qdq"
    )
    parser.add_argument(
        "--accuracy-frames",
        type=non_negative_int,
        default=1000,
        metavar="N",
        help="fp16/bf16/int8: frames of the accuracy gate against fp32 (step rollout; default 1000; 0 skips the gate)",
    )
    parser.add_argument(
        "--accuracy-tolerance",
        type=positive_float,
        default=None,
        metavar="TOL",
        help="the gate's tolerance (atol = rtol; default: the config's tolerance for the precision)",
    )
    parser.add_argument(
        "--framefuse-impl",
        choices=["kernel", "reference"],
        default=None,
        help="cuda-graph: how framefuse nodes run, CUDA kernels (default on cuda) or their torch references",
    )
    parser.add_argument(
        "--select",
        choices=[
            "time",
            "time-autotune",
            "plan",
            "unoptimized",
            "stepkernel",
            "stepkernel-pieces",
            "stepkernel-fewer-blocks",
            "stepkernel-384-threads",
            "stepkernel-paced",
            "stepkernel-unframed",
            "stepkernel-skewed",
            "stepkernel-384-threads-skewed",
            "stepkernel-unrolled",
            "stepkernel-replica-cap",
            "stepkernel-384-threads-replica-cap",
            "stepkernel-512-threads",
            "stepkernel-lanes",
            "stepkernel-384-threads-ahead-4",
            "stepkernel-384-threads-ahead-8",
            "stepkernel-views",
            "stepkernel-fewer-phases",
            "stepkernel-384-threads-fewer-phases",
            "stepkernel-fewer-phases-early-frame",
            "stepkernel-fewer-levels",
            "stepkernel-split",
            "stepkernel-384-threads-split",
            "cpustep",
            "inductor",
            "inductor-autotune",
        ],  # engines.fusion.SELECT_CHOICES (a test keeps them equal; importing it here would load torch)
        default=None,
        help="cuda-graph: build-time selection. time (default) times the plan, the unoptimised plan, the step "
        "compiler's one-kernel step (stepkernel, and its tactics stepkernel-pieces: long prefetch copies cut "
        "into pieces, stepkernel-fewer-blocks: 3/4 of the SMs, stepkernel-384-threads: blocks of 384 threads, stepkernel-paced: each block's copies issued a "
        "task ahead in its own order, stepkernel-unframed: the frame's in-projection a level of its own, "
        "stepkernel-skewed / stepkernel-384-threads-skewed: sums that read one shared-memory bank a warp start "
        "each element at its own position, stepkernel-unrolled: an unrolled Elman cell's copies kept as they are, "
        "not rolled into a loop, stepkernel-replica-cap / stepkernel-384-threads-replica-cap: a task whose blocks "
        "each copy the same values whole, such as attention's KV caches, on fewer blocks, stepkernel-512-threads: "
        "blocks of 512 threads where a recurrence holds its weights partly in registers, hidden 1024, stepkernel-lanes: "
        "a one-block recurrence's units split over lanes of a warp, stepkernel-384-threads-ahead-4 / -8: blocks of "
        "384 threads, a one-block recurrence's inputs loaded 4 / 8 positions ahead, stepkernel-views: a task's views of its own arrays, "
        "such as a product's rows cut out of the frame, read where those lie instead of copied, "
        "stepkernel-fewer-phases / stepkernel-384-threads-fewer-phases: those views, a phase's products and "
        "reductions in one pass of the warps, a root that publishes its one product computed by that "
        "product's lanes, and a head's few scalars recomputed by their readers, stepkernel-fewer-levels: "
        "those, and a product every block of its reader needs whole, "
        "such as Mamba's x_proj, computed by each of them instead of a level earlier; named only, not yet timed "
        "by default: stepkernel-split / stepkernel-384-threads-split: the fewer phases, and a product of a "
        "recurrence's output that its readers need whole computed as partial sums by the recurrence's blocks "
        "and summed by the readers, a level less a layer), the step compiler's "
        "program as one C++ function on the host CPU (cpustep, fp32 builds: small models answer faster there), "
        "the inductor-compiled plan and, when model.onnx sits beside "
        "model.fused.onnx, the unfused graph (plain and compiled) on the GPU, host to host as the session runs "
        "them, and keeps the fastest (a --precision build times each step-kernel tactic with float32 weight rows "
        "and with its precision's rows, <tactic>@fp16 / @bf16 / @int8, and its fp32 graph's kernels beside); "
        "time-autotune adds max-autotune; a name forces that candidate (float32 rows)",
    )
    parser.add_argument(
        "--exact-math",
        action="store_true",
        help="cuda-graph: compile the step kernel with exact IEEE division, square root and exp (default: "
        "2-ulp division and square root, the hardware exp, denormals flushed; 0.1-1.2 us a step faster on "
        "an H100); recorded in the artifact",
    )
    parser.add_argument(
        "--dump-source",
        metavar="DIR",
        default=None,
        help="write the step compiler's generated CUDA source for this graph into DIR (the kernel the build "
        "compiled; without a GPU, the source for --grid blocks)",
    )
    parser.add_argument(
        "--grid",
        type=int,
        default=None,
        metavar="N",
        help="--dump-source without a GPU: blocks of the generated kernel (default 132, an H100's SM count)",
    )
    parser.add_argument(
        "--fused",
        action="store_true",
        help="onnxruntime: run the fused graph (framefuse nodes through their Python references) "
        "instead of the original model.onnx",
    )
    parser.add_argument(
        "--providers",
        metavar="EP[,EP]",
        help="onnxruntime: execution providers, e.g. CUDAExecutionProvider (default: by --device)",
    )
    parser.add_argument(
        "--check",
        dest="check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="after writing, compare the engine with ONNX Runtime on the original model.onnx (as `framefuse "
        "check`); a mismatch removes the artifact and fails the build (exit 3). Default: on for tensorrt (a plan "
        "that cannot run here is reported as not checked), off for the others",
    )
    parser.add_argument("--json", action="store_true", help="print the artifact's metadata as JSON")
    parser.set_defaults(func=run)
    return parser


def _describe(summary: dict) -> list[str]:
    lines = []
    width = max((len(key) for key in summary), default=0) + 2
    for key, value in summary.items():
        if key in ("inputs", "outputs") and isinstance(value, list):
            value = ", ".join(f"{io['name']} {io['shape']} {io['dtype']}" for io in value)
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        lines.append(f"  {key:<{width}}{value}")
    return lines


def run(args) -> int:
    from framefuse.build.stage import build_engine, resolve_source
    from framefuse.engines.base import EngineBuildError
    from framefuse.engines.registry import check_option, default_engine, unavailable_reason

    quiet = getattr(args, "quiet", False)

    def log(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    engine = args.engine or default_engine(args.device)
    reason = unavailable_reason(engine, device=args.device) if args.device else unavailable_reason(engine)
    if reason is not None:
        raise EngineBuildError(reason)
    options: dict = {}
    if args.framefuse_impl is not None:
        check_option(engine, "framefuse_impl", "--framefuse-impl")
        options["framefuse_impl"] = args.framefuse_impl
    if args.fused or args.providers:
        for flag, option, given in (("--fused", "fused", args.fused), ("--providers", "providers", args.providers)):
            if given:
                check_option(engine, option, flag)
        if args.fused:
            options["fused"] = True
        if args.providers:
            options["providers"] = [p.strip() for p in args.providers.split(",") if p.strip()]
    select = getattr(args, "select", None)
    if select is not None:
        check_option(engine, "select", "--select")
        options["select"] = select
    if getattr(args, "exact_math", False):
        check_option(engine, "exact_math", "--exact-math")
        options["exact_math"] = True
    out = Path(args.out) if args.out else resolve_source(args.source, engine, args.fused).parent
    built = build_engine(
        args.source,
        engine=engine,
        precision=args.precision,
        device=args.device,
        out=out,
        options=options,
        fused=args.fused,
        offer_unfused=True,
        calib=args.calib,
        gate=(getattr(args, "accuracy_frames", 1000), getattr(args, "accuracy_tolerance", None)),
        int8_mode=getattr(args, "int8_mode", None),
        fallback=getattr(args, "precision_fallback", True),
        check=getattr(args, "check", None),
        log=log,
    )
    runner, source = built.runner, built.source
    target = runner.artifact_path
    if args.json:  # every backend's save() leaves the metadata it wrote on the runner
        print(json.dumps(runner.artifact_metadata or runner.summary(), indent=2, sort_keys=True, default=str))
    elif not quiet:
        print(f"wrote {target}  ({engine} engine of {source}, precision {args.precision}; {built.seconds:.1f} s)")
        print("\n".join(_describe(runner.summary())))
    dump = getattr(args, "dump_source", None)
    if dump:
        _dump_source(runner, source, Path(dump), getattr(args, "grid", None), log)
    return 0


def _dump_source(runner, source: Path, folder: Path, grid: int | None, log) -> None:
    """The step kernel's CUDA source: the one the build compiled, else generated for ``grid``."""
    from framefuse.engines.stepkernel import StepKernelPlan

    plan = getattr(runner, "default_plan", None)
    if isinstance(plan, StepKernelPlan):
        from framefuse.compiler.engine import dump_source

        target = dump_source(plan.compiled, folder)
        options = " ".join(plan.compiled.nvrtc_options)
        log(f"stepkernel: wrote {target} (the kernel this build runs; NVRTC options {options})")
        return
    from framefuse.compiler import generate_source
    from framefuse.compiler.engine import FAST_MATH_OPTIONS
    from framefuse.plugins.cuda import _atomic_write

    blocks = grid or 132
    # a precision build's graph: its weights as stored, its activations in float32 (engines.fusion)
    kernel = generate_source(source, grid=blocks, widen_storage=getattr(runner, "precision", "fp32") in ("fp16", "bf16"))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"stepkernel-{kernel.digest[:12]}.cu"
    _atomic_write(target, kernel.source.encode())
    info = kernel.describe()
    log(
        f"stepkernel: wrote {target} for {blocks} blocks ({info['tasks']} tasks, {info['levels']} dependency "
        f"levels); the build did not select it, so this is the source it would compile (NVRTC options "
        f"{' '.join(FAST_MATH_OPTIONS)}; -DFFK_EXACT_MATH with --exact-math)"
    )
