"""``framefuse bench``: the end-to-end benchmark of ``bench/e2e.py`` (sections zoo / real /
precision: framefuse against torch eager, torch eager in a CUDA graph, torch.compile
reduce-overhead, torch.compile max-autotune in a CUDA graph and ONNX Runtime CPU, and the floor)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

from framefuse.errors import FrameFuseError


class BenchUnavailableError(FrameFuseError):
    """bench/e2e.py is not there (framefuse was installed without its source checkout)."""


def _e2e_path() -> Path:
    return Path(__file__).resolve().parents[2] / "bench" / "e2e.py"


def load_e2e() -> ModuleType:
    path = _e2e_path()
    if not path.is_file():
        raise BenchUnavailableError(
            f"{path} not found: `framefuse bench` runs the benchmark script of a source checkout of framefuse"
        )
    spec = importlib.util.spec_from_file_location("framefuse_bench_e2e", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench",
        help="end-to-end benchmark: framefuse vs torch eager / CUDA graph / torch.compile / ONNX Runtime and the floor",
        description="Time host input -> host output per call for the framefuse engine (as `framefuse build` makes "
        "it) and its peers, measured the same way in one run: --section zoo (every zoo architecture, embed 256, "
        "2 layers, batch 1, T in {1, 32}), real (models written by others: transformers, torch.nn) and precision "
        "(fp32/fp16/bf16/int8 with their accuracy). Reports ratios to the best peer and to the floor (a CUDA graph "
        "with only the copies and one kernel); writes e2e.json, e2e.md and e2e.png under --out.",
    )
    if _e2e_path().is_file():
        load_e2e().add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args) -> int:
    return int(load_e2e().run(args) or 0)
