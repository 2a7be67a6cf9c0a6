"""The build stage (see the package docstring): source, precision and its gate, the backend's
build, the parity gate."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from framefuse.artifact_folder import MANIFEST, ORIGINAL, build_source, manifest_tolerance
from framefuse.engines.base import EngineBuildError
from framefuse.engines.registry import FUSED_ANYWHERE, default_engine, get_backend, get_kind, unavailable_reason


def resolve_source(source, engine: str = FUSED_ANYWHERE, fused: bool = False) -> Path:
    """The ONNX file ``framefuse build`` takes from ``source`` (see :func:`framefuse.artifact_folder.build_source`)."""
    return build_source(source, engine, fused, error=EngineBuildError)


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
    manifest = source.parent / MANIFEST
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
            found = int8_fallback(source, original, config, report, frames, tolerance, inputs, log)
            if found is not None:
                model, better, kept, candidates = found
                better.notes = report.notes + [
                    f"kept in float32 for accuracy: {', '.join(kept)} ({len(kept)} of {candidates} quantizable "
                    f"products; the gate failed with all of them int8: {'; '.join(report.failures())})"
                ]
                better.kept_fp32 = list(kept)
                report = better
                label = f"{label}, {len(kept)} product{'s' if len(kept) > 1 else ''} in float32"
        if not report.passed:
            raise AccuracyError(
                f"{source}: {label} build rejected, " + "; ".join(report.failures()), report=report, model=model
            )
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


def int8_fallback(source: Path, original, config, first, frames: int, tolerance, inputs, log):
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


def parity_gate(runner, target: Path | None, source: Path, engine: str, log) -> None:
    """The built engine against ONNX Runtime on the original graph beside ``source``. A mismatch
    removes what the build wrote and raises ParityError; an engine that cannot run on this machine
    (a TensorRT plan without a GPU) is reported as not checked, never as passing."""
    from framefuse.engines.base import EngineRunError
    from framefuse.parity import compare

    original = source.parent / ORIGINAL
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


@dataclass
class Built:
    """What :func:`build_engine` made: the runner, the graph it was built from (the converted one
    for a precision build) and the seconds the backend's build took."""

    runner: object
    source: Path
    seconds: float


def build_engine(
    source,
    *,
    engine: str | None = None,
    precision: str = "fp32",
    device: str | None = None,
    out: Path | None = None,
    options: dict | None = None,
    fused: bool = False,
    offer_unfused: bool = False,
    calib: str | None = None,
    gate: tuple | None = None,
    int8_mode: str | None = None,
    fallback: bool = True,
    check: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> Built:
    """Build ``engine`` (default: :func:`default_engine`) of ``source`` (an ONNX file, a ModelProto
    or an artifact folder) and, with ``out``, write its artifact there (a file or a folder; None:
    in memory).

    ``precision``: the graph is converted first and, with ``gate`` = (frames, tolerance or None),
    checked against fp32 before anything is written. ``offer_unfused``: a fused fp32 graph's
    model.onnx beside it becomes a candidate of the cuda-graph engine's build-time selection (a
    fused op must never cost time); a precision build's fp32 graph is handed to an engine that
    times against it (its ``fp32_graph`` option). ``check`` (default: the engine kind's ``checked_by_default``):
    the parity gate against ONNX Runtime on the original graph; a mismatch removes what was
    written. ``log`` receives the build's progress lines (and is handed to the backend). Problems
    raise a one-line framefuse error (EngineBuildError, AccuracyError, ParityError)."""
    say = log or (lambda message: None)
    engine = engine or default_engine(device)
    kind = get_kind(engine)
    reason = unavailable_reason(engine, device=device) if device else unavailable_reason(engine)
    if reason is not None:
        raise EngineBuildError(reason)
    options = dict(options or {})
    in_memory = not isinstance(source, (str, Path))
    if not in_memory:
        source = resolve_source(source, engine, fused)
        unfused = source.with_name(source.name.removesuffix(".fused.onnx") + ".onnx")
        if (
            offer_unfused
            and "unfused" in kind.options
            and precision == "fp32"
            and source.name.endswith(".fused.onnx")
            and unfused.is_file()
        ):
            options.setdefault("unfused", unfused)
    if precision != "fp32" and (in_memory or out is None):
        raise EngineBuildError(
            f"a {precision} build writes its converted graph and accuracy report: it needs an ONNX file or an "
            "artifact folder and an output (out=)"
        )
    out_dir = None
    if out is not None:
        out = Path(out)
        out_dir = out if out.suffix != kind.suffix else out.parent
    if precision != "fp32" and not in_memory and "fp32_graph" in kind.options:
        # the fp32 graph's step kernels are timed beside the precision build's (engines.fusion)
        options.setdefault("fp32_graph", source)
    if precision != "fp32" or calib is not None or int8_mode is not None:
        source = convert_precision(
            source,
            precision,
            calib,
            out_dir if out_dir is not None else source.parent,
            say,
            engine=engine,
            gate=gate,
            int8_mode=int8_mode,
            fallback=fallback,
        )
    backend = get_backend(engine)
    say(f"building the {engine} engine of {source} ...")
    start = time.perf_counter()
    try:
        runner = backend.build(source, out=out, precision=precision, device=device, options=options, log=log)
    except BaseException:
        if precision != "fp32" and out_dir is not None:  # the converted graph and its report go with the failed build
            source.unlink(missing_ok=True)
            (out_dir / f"accuracy.{precision}.json").unlink(missing_ok=True)
        raise
    seconds = time.perf_counter() - start
    if (check if check is not None else kind.checked_by_default) and not in_memory:
        parity_gate(runner, runner.artifact_path, source, engine, say)
    return Built(runner, source, seconds)
