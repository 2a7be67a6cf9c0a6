"""``framefuse check``: parity of a fused graph or an engine against the original ONNX graph.

``framefuse check artifacts/<name>`` compares ``model.fused.onnx`` with ``model.onnx`` in that
folder, then every engine artifact built there (``engine.ffe``, ``engine.ort``, ``engine.plan``:
each engine's Polygraphy runner against ONNX Runtime on the original graph). ``framefuse check
PATH`` checks one fused graph or one artifact; ``--against ORIGINAL`` names the original. Each
report is written beside PATH (``parity-report.json`` for the fused graph,
``parity-report.<engine>.json`` for an engine); a mismatch exits non-zero.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from framefuse.artifact_folder import ORIGINAL, check_targets, manifest_tolerance
from framefuse.cli import positive_float
from framefuse.errors import FrameFuseError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "check",
        help="parity of a fused graph or an engine against the original (ONNX Runtime + Polygraphy)",
        description="Run the original graph in ONNX Runtime and a fused graph or an engine artifact on the same "
        "seeded inputs and compare every output. A folder checks its model.fused.onnx and every engine "
        "artifact built in it.",
        epilog="examples:\n  framefuse check artifacts/lstm\n  framefuse check artifacts/lstm-step/engine.ort\n"
        "  framefuse check artifacts/lstm --engine cuda-graph\n"
        "  framefuse check out/my.fused.onnx --against my.onnx",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="fused graph (.onnx), engine artifact (.ffe/.ort/.plan) or an artifact folder")
    p.add_argument("--against", help="original ONNX graph (default: model.onnx beside PATH)")
    p.add_argument(
        "--engine",
        default=None,
        help="in a folder, check only this engine's artifact (cuda-graph, onnxruntime, tensorrt)",
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where engines run (default: as built)")
    p.add_argument(
        "--tolerance",
        type=positive_float,
        default=None,
        help="atol and rtol for every output (default: the manifest's fp32 tolerance, else 1e-4)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(func=run)


def _original(beside: Path, against: str | None) -> Path:
    original = Path(against) if against else beside.parent / ORIGINAL
    if not original.is_file():
        raise FrameFuseError(f"original graph not found: {original} (pass --against ORIGINAL)")
    if original.resolve() == beside.resolve():
        raise FrameFuseError(f"{beside} is compared against itself; pass --against ORIGINAL")
    return original


def run(args) -> int:
    from framefuse.engines.registry import get_backend, unavailable_reason
    from framefuse.parity import compare

    quiet = getattr(args, "quiet", False)
    path = Path(args.path)
    checks = check_targets(path, args.engine)
    explicit = not path.is_dir() or args.engine is not None
    failed = []
    for what, file in checks:
        original = _original(file, args.against)
        tolerance = args.tolerance if args.tolerance is not None else manifest_tolerance(original)
        if what == "onnx":
            side, report_path, label = file, file.parent / "parity-report.json", f"{file.name}"
        else:
            reason = unavailable_reason(what, device=args.device) if args.device else unavailable_reason(what)
            if reason is not None:
                if explicit:
                    raise FrameFuseError(reason)
                if not quiet:
                    print(f"{file.name}: not checked here ({reason})", file=sys.stderr)
                continue
            side = get_backend(what).load(file, device=args.device)
            report_path, label = file.parent / f"parity-report.{what}.json", f"{file.name} ({what})"
            precision = getattr(side, "precision", "fp32")
            if args.tolerance is None and isinstance(tolerance, dict) and precision in tolerance:
                tolerance = float(tolerance[precision])  # an fp16/bf16/int8 build: its own tolerance
        report = compare(original, side, tolerance=tolerance, seed=args.seed, report_path=report_path)
        if not quiet:
            print(f"{label}: {report.summary()}")
        if not report.passed:
            failed.append(report)
    if not quiet and path.is_dir():
        from framefuse.precision.accuracy import AccuracyReport

        for accuracy in sorted(path.glob("accuracy.*.json")):  # written by `framefuse build --precision`
            print(f"{accuracy.name}: accuracy vs fp32")
            print(AccuracyReport.read(accuracy).table())
    for report in failed:
        report.raise_if_failed()
    return 0
