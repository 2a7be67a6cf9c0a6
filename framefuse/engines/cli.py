"""``framefuse build``: a (fused) ONNX graph → the cuda-graph engine artifact ``engine.ffe``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

EXAMPLES = """\
examples:
  framefuse build artifacts/mamba/model.fused.onnx          # -> artifacts/mamba/engine.ffe
  framefuse build artifacts/mamba-step                      # the folder's model.fused.onnx (else model.onnx)
  framefuse build artifacts/mamba/model.onnx --device cpu   # the CPU executor (no GPU needed)
  framefuse build artifacts/mamba --framefuse-impl reference   # fused nodes by their torch references"""


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "build",
        help="build the cuda-graph engine (engine.ffe) of a fused ONNX graph",
        description="Build the cuda-graph engine of an ONNX graph (standard ops through torch, framefuse "
        "nodes through their CUDA kernels), fold its shape computations, check every op is supported, "
        "and write the engine artifact engine.ffe next to the graph (atomically). Loading refuses an "
        "artifact whose source changed or that was built for another GPU or framefuse version.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="ONNX_OR_FOLDER", help="model.fused.onnx, model.onnx, or an artifact folder")
    parser.add_argument("-o", "--out", metavar="PATH", help="artifact path (a .ffe file or a folder; default: next to the source)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is a GPU")
    parser.add_argument(
        "--framefuse-impl", choices=["kernel", "reference"], default=None,
        help="how framefuse nodes run: CUDA kernels (default on cuda) or their torch references",
    )
    parser.add_argument("--json", action="store_true", help="print the artifact's metadata as JSON")
    parser.set_defaults(func=run)
    return parser


def resolve_source(source: str) -> Path:
    from framefuse.engines.base import EngineBuildError

    path = Path(source)
    if path.is_dir():
        for name in ("model.fused.onnx", "model.onnx"):
            if (path / name).is_file():
                return path / name
        raise EngineBuildError(f"{path}: no model.fused.onnx or model.onnx in this folder (run `framefuse rewrite` first)")
    if not path.is_file():
        raise EngineBuildError(f"{path}: no such file or folder")
    return path


def run(args) -> int:
    import torch

    from framefuse.engines.artifact import artifact_path
    from framefuse.engines.cuda_graph import build_engine

    source = resolve_source(args.source)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out) if args.out else source.parent
    quiet = getattr(args, "quiet", False)
    if not quiet:
        print(f"building {source} on {device} ...", file=sys.stderr)
    start = time.perf_counter()
    engine = build_engine(source, device=device, out=out, framefuse_impl=args.framefuse_impl)
    seconds = time.perf_counter() - start
    target = artifact_path(out)
    summary = engine.summary()
    if args.json:
        from framefuse.engines.cuda_graph import read_artifact

        metadata, _ = read_artifact(target)
        print(json.dumps(metadata, indent=2, sort_keys=True))
    elif not quiet:
        gpu = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu"
        print(
            f"wrote {target}  ({gpu}; {summary['nodes']} nodes, {summary['folded']} folded at build time, "
            f"{summary['steps']} run; framefuse nodes by {summary['framefuse_impl']}; {seconds:.1f} s)"
        )
    return 0
