"""``framefuse bench``: the end-to-end benchmark of ``bench/e2e.py`` (every zoo architecture,
framefuse against torch eager / CUDA graph / torch.compile / ONNX Runtime, one process)."""

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
        help="end-to-end benchmark: every architecture, framefuse vs torch / torch.compile / ONNX Runtime",
        description="Export, rewrite and build every zoo architecture (embed 256, 2 layers, batch 1, T in {1, 32}) "
        "and time host input -> host output per call for the framefuse engine and its peers in one process; "
        "writes e2e.json, e2e.md and e2e.png under --out.",
    )
    if _e2e_path().is_file():
        load_e2e().add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args) -> int:
    return int(load_e2e().run(args) or 0)
