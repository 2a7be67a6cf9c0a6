"""``framefuse check``: parity of a fused artifact against its original ONNX graph.

``framefuse check artifacts/<name>`` compares ``model.fused.onnx`` with ``model.onnx`` in that
folder; ``framefuse check PATH --against ORIGINAL`` compares any pair. The report is written as
``parity-report.json`` beside PATH; a mismatch exits non-zero.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from framefuse.errors import FrameFuseError, ParityError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="parity of a fused graph against the original (ONNX Runtime + Polygraphy)",
        description="Run the original graph and a fused artifact on the same seeded inputs and compare every output.",
        epilog="examples:\n  framefuse check artifacts/lstm\n  framefuse check out/my.fused.onnx --against my.onnx",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="fused graph (.onnx) or an artifact folder holding model.fused.onnx and model.onnx")
    p.add_argument("--against", help="original ONNX graph (default: model.onnx beside PATH)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="atol and rtol for every output (default: the manifest's fp32 tolerance, else 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(func=run)


def resolve_pair(path: Path, against: str | None) -> tuple[Path, Path]:
    fused = path / "model.fused.onnx" if path.is_dir() else path
    if not fused.is_file():
        raise FrameFuseError(f"fused graph not found: {fused} (run `framefuse rewrite` first)")
    if fused.suffix != ".onnx":
        raise FrameFuseError(f"{fused}: only ONNX artifacts can be checked by this version (engines bring their own "
                             f"Polygraphy runner through framefuse.parity.compare)")
    original = Path(against) if against else fused.parent / "model.onnx"
    if not original.is_file():
        raise FrameFuseError(f"original graph not found: {original} (pass --against ORIGINAL)")
    if original.resolve() == fused.resolve():
        raise FrameFuseError(f"{fused} is compared against itself; pass --against ORIGINAL")
    return fused, original


def run(args) -> int:
    from framefuse.parity import compare
    from framefuse.rewrite.cli import manifest_tolerance

    fused, original = resolve_pair(Path(args.path), args.against)
    tolerance = args.tolerance if args.tolerance is not None else manifest_tolerance(original)
    report = compare(original, fused, tolerance=tolerance, seed=args.seed,
                     report_path=fused.parent / "parity-report.json")
    if not getattr(args, "quiet", False):
        print(report.summary())
    if not report.passed:
        report.raise_if_failed()
    return 0
