"""``framefuse rewrite``: fuse an exported graph, check it against the original, write it.

Writes beside the input (or the -o path): ``model.fused.onnx``, ``rewrite-report.json`` and
``parity-report.json``. Files are written under a temporary name and renamed. When parity fails
the reports are written, the fused graph is not, and the exit code is non-zero.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from framefuse.artifact_folder import FUSED, ORIGINAL, manifest_tolerance
from framefuse.cli import positive_float
from framefuse.errors import FrameFuseError, ParityError

DESCRIPTION = """Replace recurrences (ONNX LSTM/GRU, Loop/Scan, unrolled loops) and attention in an
exported ONNX graph with fused framefuse ops, then check the result against the original graph
in ONNX Runtime (framefuse ops run their reference implementations)."""

EXAMPLES = """examples:
  framefuse rewrite artifacts/lstm            (or artifacts/lstm/model.onnx)
      -> artifacts/lstm/model.fused.onnx, rewrite-report.json, parity-report.json
  framefuse rewrite artifacts/attention-step/model.onnx --tolerance 1e-5
  framefuse rewrite my.onnx -o out/my.fused.onnx"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "rewrite",
        help="fuse recurrences and attention into framefuse ops",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="exported ONNX graph or its artifact folder, e.g. artifacts/<name> (its model.onnx)")
    p.add_argument("-o", "--output", help="where to write the fused graph (default: model.fused.onnx beside the input)")
    p.add_argument(
        "--tolerance",
        type=positive_float,
        default=None,
        help="parity tolerance (atol and rtol) for every output; default: the fp32 tolerance of "
        "the artifact's manifest.json, else 1e-4",
    )
    p.set_defaults(func=run)


def default_output(src: Path) -> Path:
    name = FUSED if src.name == ORIGINAL else f"{src.stem}.fused.onnx"
    return src.with_name(name)


def run(args) -> int:
    from framefuse.files import write_bytes_atomic
    from framefuse.parity import compare
    from framefuse.rewrite.pipeline import rewrite_model

    src = Path(args.model)
    if src.is_dir():  # an artifact folder, as every other stage takes it
        if not (src / ORIGINAL).is_file():
            raise FrameFuseError(f"{src}: an artifact folder holds model.onnx (framefuse export writes it); none here")
        src = src / ORIGINAL
    out = Path(args.output) if args.output else default_output(src)
    if out.resolve() == src.resolve():
        raise FrameFuseError(f"output {out} would overwrite the input graph; choose another -o")
    tolerance = args.tolerance if args.tolerance is not None else manifest_tolerance(src)
    quiet = getattr(args, "quiet", False)

    fused, report = rewrite_model(src)
    report.write(out.parent / "rewrite-report.json")
    if not quiet:
        report.print()
    parity = compare(src, fused, tolerance=tolerance)
    parity.fused = str(out)
    parity.write(out.parent / "parity-report.json")
    if not quiet:
        print(parity.summary())
    if not parity.passed:
        failed = [o for o in parity.outputs if not o.passed]
        listing = "; ".join(
            f"{o.name}: max abs {o.max_abs:.3g}, max rel {o.max_rel:.3g} (tol {o.atol:g})" for o in failed
        )
        raise ParityError(
            f"fused graph of {src} does not match the original ({listing}); "
            f"not written. See {out.parent / 'parity-report.json'}"
        )
    write_bytes_atomic(out, fused.SerializeToString())
    if not quiet:
        print(f"wrote {out}")
    return 0
