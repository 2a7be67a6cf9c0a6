"""``framefuse build``: an ONNX graph → an engine artifact of one backend (see
:mod:`framefuse.engines.registry`): ``engine.ffe`` (cuda-graph), ``engine.ort`` (ONNX Runtime),
``engine.plan`` (TensorRT)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from framefuse.cli import non_negative_int, positive_float
from framefuse.config import INT8_MODES, PRECISIONS
from framefuse.engines.registry import ENGINE_NAMES, ENGINES

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
        choices=ENGINE_NAMES,
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
        "not rolled into a loop), the inductor-compiled plan and, when model.onnx sits beside "
        "model.fused.onnx, the unfused graph (plain and compiled) on the GPU, host to host as the session runs "
        "them, and keeps the fastest; time-autotune "
        "adds max-autotune; a name forces that candidate",
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


def default_engine(device: str | None = None) -> str:
    from framefuse.runtime.session import default_engine as session_default

    return session_default(device)


def _has_framefuse_nodes(path: Path) -> bool:
    from framefuse.engines.base import EngineBuildError
    from framefuse.errors import read_onnx

    model = read_onnx(path, load_external_data=False, error=EngineBuildError)
    return any(node.domain == "framefuse" for node in model.graph.node)


def resolve_source(source: str, engine: str = "cuda-graph", fused: bool = False) -> Path:
    """The ONNX file to build: a file as given; in a folder, ONNX Runtime's original model.onnx
    (model.fused.onnx with ``fused``), the other engines' model.fused.onnx first."""
    from framefuse.engines.base import EngineBuildError

    path = Path(source)
    if path.is_dir():
        if engine == "onnxruntime":
            names = ("model.fused.onnx",) if fused else ("model.onnx",)
        else:
            names = ("model.fused.onnx", "model.onnx")
        for name in names:
            if (path / name).is_file():
                return path / name
        hint = "run `framefuse rewrite` first" if "model.fused.onnx" in names else "run `framefuse export` first"
        raise EngineBuildError(f"{path}: no {' or '.join(names)} in this folder ({hint})")
    if not path.is_file():
        raise EngineBuildError(f"{path}: no such file or folder")
    return path


def convert_precision(
    source: Path,
    precision: str,
    calib: str | None,
    out_dir: Path,
    log,
    *,
    engine: str | None = None,
    gate=None,
    int8_mode: str | None = None,
    fallback: bool = True,
) -> Path:
    """``source`` converted by framefuse.precision.convert_model, saved as model.<precision>.onnx
    in ``out_dir`` (so the artifact records it as its source); fp32 is ``source`` itself.

    ``gate`` = (frames, tolerance or None): the accuracy report against ``source`` runs before
    anything is written; beyond tolerance the build fails (AccuracyError), else the report is
    written beside as accuracy.<precision>.json. ``fallback``: an int8 weight-only build that
    fails the gate keeps its most sensitive products in float32, one at a time, until it passes
    (at most INT8_FALLBACK_SHARE of them; see _int8_fallback); the report names them."""
    from framefuse.engines.base import EngineBuildError

    if precision != "int8" and int8_mode is not None:
        raise EngineBuildError(f"--int8-mode is for --precision int8, not {precision}")
    if precision == "fp32":
        if calib:
            raise EngineBuildError("--calib is for --precision int8")
        return source
    import onnx

    from framefuse.engines import artifact
    from framefuse.precision import convert_model

    config = None
    manifest_data: dict = {}
    manifest = source.parent / "manifest.json"
    if manifest.is_file():
        manifest_data = json.loads(manifest.read_text()) or {}
        config = manifest_data.get("config")
    from framefuse.precision import unsupported_reason

    reason = unsupported_reason(engine, precision) if engine else None
    if reason is not None:
        raise EngineBuildError(reason)
    label = precision
    if precision == "int8":
        from framefuse.precision import int8_mode_of

        int8_mode = int8_mode_of(int8_mode, config, calib=calib)
        label = f"int8 ({int8_mode})"
    model = convert_model(onnx.load(str(source)), precision, calib=calib, config=config, int8_mode=int8_mode)
    report = None
    if gate is not None and gate[0] > 0:
        from framefuse.precision import AccuracyError, accuracy_report

        frames, tolerance = gate
        if tolerance is None:
            tolerance = ((config or {}).get("tolerance") or {}).get(precision)
        from framefuse.exporter.loading import describe_weights
        from framefuse.precision.accuracy import gate_inputs

        inputs, inputs_note = gate_inputs(manifest_data, frames)
        log(f"accuracy gate: {label} vs fp32 over {frames} frames ...")
        report = accuracy_report(source, model, frames=frames, precision=precision, tolerance=tolerance, calib=inputs)
        report.notes.append(f"weights: {describe_weights(manifest_data.get('weights'))}")
        if inputs_note:
            report.notes.append(inputs_note)
        if int8_mode is not None:
            report.notes.append(f"int8 mode: {int8_mode}")
        if not report.passed and int8_mode == "weights" and fallback:
            original = onnx.load(str(source))
            found = _int8_fallback(source, original, config, report, frames, tolerance, inputs, log)
            if found is not None:
                model, better, kept, candidates = found
                better.notes = report.notes + [
                    f"kept in float32 for accuracy: {', '.join(kept)} ({len(kept)} of {candidates} quantizable "
                    f"products; the gate failed with all of them int8: {'; '.join(report.failures())})"
                ]
                report = better
                label = f"{label}, {len(kept)} product{'s' if len(kept) > 1 else ''} in float32"
        if not report.passed:
            raise AccuracyError(f"{source}: {label} build rejected, " + "; ".join(report.failures()))
        log(report.table())
    stem = source.name.removesuffix(".onnx")
    target = out_dir / f"{stem}.{precision}.onnx"
    artifact.write_atomic(target, lambda raw: raw.write(model.SerializeToString()))
    if report is not None:
        report.write(out_dir / f"accuracy.{precision}.json")
    log(f"precision: {source.name} -> {target} ({label})")
    return target


# An int8 weight-only build that fails the accuracy gate keeps products in float32, the most
# sensitive first, up to this share of them; each is ranked by its own error (it alone int8) over
# SENSITIVITY_FRAMES frames. With the trained zoo weights on the CPU (2026-11-26): min_gru,
# gated_ssm and delta_net failed the gate (99.40 / 99.40 / 98.80 % argmax agreement) with every
# product int8.
INT8_FALLBACK_SHARE = 0.5
SENSITIVITY_FRAMES = 200


def _int8_fallback(source: Path, original, config, first, frames: int, tolerance, inputs, log):
    """(model, report, kept, candidates) of the first int8 weight-only build that passes the gate
    with the products in ``kept`` (of ``candidates`` quantizable ones) in float32, or None. The products are ranked once by the error of a build
    where only that one is int8 (argmax disagreement, then the mean |diff| of the outputs), then
    kept in float32 greedily in that order."""
    from framefuse.precision import accuracy_report, convert_model
    from framefuse.precision.convert import int8_candidates

    names = int8_candidates(original, config)
    limit = int(len(names) * INT8_FALLBACK_SHARE)
    if limit < 1:
        return None
    log(
        f"accuracy gate: int8 (weights) failed ({'; '.join(first.failures())}); ranking its {len(names)} "
        f"products by their own error over {min(frames, SENSITIVITY_FRAMES)} frames ..."
    )
    scores = {}
    for name in names:
        alone = convert_model(
            original, "int8", config=config, keep_fp32=[n for n in names if n != name], int8_mode="weights"
        )
        report = accuracy_report(
            source,
            alone,
            frames=min(frames, SENSITIVITY_FRAMES),
            precision="int8",
            tolerance=tolerance,
            calib=inputs,
        )
        disagreement = 1.0 - (report.argmax_agreement if report.argmax_agreement is not None else 1.0)
        scores[name] = (disagreement, max((o.mean_abs for o in report.outputs), default=0.0))
    kept: list[str] = []
    for name in sorted(names, key=lambda n: scores[n], reverse=True)[:limit]:
        kept.append(name)
        model = convert_model(original, "int8", config=config, keep_fp32=kept, int8_mode="weights")
        report = accuracy_report(source, model, frames=frames, precision="int8", tolerance=tolerance, calib=inputs)
        verdict = "passes" if report.passed else "; ".join(report.failures())
        log(f"accuracy gate: int8 (weights) with {', '.join(kept)} in float32: {verdict}")
        if report.passed:
            return model, report, kept, len(names)
    return None


def _parity_gate(runner, target: Path | None, source: Path, engine: str, log) -> None:
    """The built engine against ONNX Runtime on the original graph beside ``source``. A mismatch
    removes what the build wrote and raises ParityError; an engine that cannot run on this machine
    (a TensorRT plan without a GPU) is reported as not checked, never as passing."""
    from framefuse.engines.base import EngineRunError
    from framefuse.parity import compare
    from framefuse.rewrite.cli import manifest_tolerance

    original = source.parent / "model.onnx"
    if not original.is_file():
        log(f"parity: not checked ({original} not found: nothing to compare the engine with)")
        return
    tolerance = manifest_tolerance(original)
    precision = getattr(runner, "precision", "fp32")
    if isinstance(tolerance, dict) and precision in tolerance:
        tolerance = float(tolerance[precision])
    report_path = source.parent / f"parity-report.{engine}.json"
    try:
        report = compare(original, runner, tolerance=tolerance, report_path=report_path)
    except EngineRunError as exc:
        log(f"parity: NOT CHECKED here ({exc}); run `framefuse check {target}` where the engine runs")
        return
    log(f"parity: {report.summary()}")
    if not report.passed:
        written = [target] if target is not None else []
        if target is not None:
            written += [target.with_name(target.name + suffix) for suffix in (".json", ".onnx")]
        for path in written:
            path.unlink(missing_ok=True)
        report.raise_if_failed()


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
    from framefuse.engines.base import EngineBuildError
    from framefuse.engines.registry import get_backend, get_kind, unavailable_reason

    quiet = getattr(args, "quiet", False)

    def log(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    engine = args.engine or default_engine(args.device)
    kind = get_kind(engine)
    reason = unavailable_reason(engine, device=args.device) if args.device else unavailable_reason(engine)
    if reason is not None:
        raise EngineBuildError(reason)
    options: dict = {}
    if args.framefuse_impl is not None:
        if engine != "cuda-graph":
            raise EngineBuildError(f"--framefuse-impl is an option of the cuda-graph engine, not of {engine}")
        options["framefuse_impl"] = args.framefuse_impl
    if args.fused or args.providers:
        if engine != "onnxruntime":
            raise EngineBuildError(f"--fused / --providers are options of the onnxruntime engine, not of {engine}")
        if args.fused:
            options["fused"] = True
        if args.providers:
            options["providers"] = [p.strip() for p in args.providers.split(",") if p.strip()]
    source = resolve_source(args.source, engine, args.fused)
    select = getattr(args, "select", None)
    if select is not None:
        if engine != "cuda-graph":
            raise EngineBuildError(f"--select is an option of the cuda-graph engine, not of {engine}")
        options["select"] = select
    if getattr(args, "exact_math", False):
        if engine != "cuda-graph":
            raise EngineBuildError(f"--exact-math is an option of the cuda-graph engine, not of {engine}")
        options["exact_math"] = True
    unfused = source.with_name(source.name.removesuffix(".fused.onnx") + ".onnx")
    if (
        engine == "cuda-graph"
        and args.precision == "fp32"
        and source.name.endswith(".fused.onnx")
        and unfused.is_file()
    ):
        options["unfused"] = unfused  # a candidate of the build-time selection: a fused op must never cost time
    out = Path(args.out) if args.out else source.parent
    out_dir = out if out.suffix != kind.suffix else out.parent
    gate = (getattr(args, "accuracy_frames", 1000), getattr(args, "accuracy_tolerance", None))
    source = convert_precision(
        source,
        args.precision,
        args.calib,
        out_dir,
        log,
        engine=engine,
        gate=gate,
        int8_mode=getattr(args, "int8_mode", None),
        fallback=getattr(args, "precision_fallback", True),
    )
    backend = get_backend(engine)
    log(f"building the {engine} engine of {source} ...")
    start = time.perf_counter()
    try:
        runner = backend.build(source, out=out, precision=args.precision, device=args.device, options=options, log=log)
    except BaseException:
        if args.precision != "fp32":  # the converted graph and its accuracy report go with the failed build
            source.unlink(missing_ok=True)
            (out_dir / f"accuracy.{args.precision}.json").unlink(missing_ok=True)
        raise
    seconds = time.perf_counter() - start
    target = runner.artifact_path
    check = getattr(args, "check", None)
    if check if check is not None else engine == "tensorrt":
        _parity_gate(runner, target, source, engine, log)
    if args.json:
        if target is not None and target.suffix == ".ort":
            metadata = json.loads(target.read_text())
        elif engine == "cuda-graph":
            from framefuse.engines.cuda_graph import read_artifact

            metadata, _ = read_artifact(target)
        else:
            metadata = runner.artifact_metadata or runner.summary()
        print(json.dumps(metadata, indent=2, sort_keys=True, default=str))
    elif not quiet:
        print(f"wrote {target}  ({engine} engine of {source}, precision {args.precision}; {seconds:.1f} s)")
        print("\n".join(_describe(runner.summary())))
    dump = getattr(args, "dump_source", None)
    if dump:
        _dump_source(runner, source, Path(dump), getattr(args, "grid", None), log)
    return 0


def _dump_source(runner, source: Path, folder: Path, grid: int | None, log) -> None:
    """The step kernel's CUDA source: the one the build compiled, else generated for ``grid``."""
    from framefuse.compiler.engine import StepKernelPlan

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
    kernel = generate_source(source, grid=blocks)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"stepkernel-{kernel.digest[:12]}.cu"
    _atomic_write(target, kernel.source.encode())
    info = kernel.describe()
    log(
        f"stepkernel: wrote {target} for {blocks} blocks ({info['tasks']} tasks, {info['levels']} dependency "
        f"levels); the build did not select it, so this is the source it would compile (NVRTC options "
        f"{' '.join(FAST_MATH_OPTIONS)}; -DFFK_EXACT_MATH with --exact-math)"
    )
