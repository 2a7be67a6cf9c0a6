"""bench/microbench's CUDA sources (the GPU calls compile them there with nvcc and run them) compile
here for sm_90 with the flags their headers give, so a call is not spent on a build error."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

MICROBENCH = Path(__file__).resolve().parent.parent / "bench" / "microbench"
SOURCES = sorted(MICROBENCH.glob("*.cu"))


def _build_flags(source: Path) -> list[str]:
    """The nvcc flags of the source's own "Build: nvcc ... -o NAME NAME.cu" line."""
    match = re.search(r"Build:\s*nvcc (.*?) -o \S+ \S+\.cu", source.read_text())
    assert match, f"{source.name}: no 'Build: nvcc ... -o NAME NAME.cu' line in its header"
    return match.group(1).split()


def test_every_microbenchmark_is_listed():
    assert {s.name for s in SOURCES} >= {"level_cost.cu", "recur_position.cu", "poll_latency.cu", "host_roundtrip.cu"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", SOURCES, ids=[s.name for s in SOURCES])
def test_a_microbenchmark_compiles_with_its_own_flags(source, tmp_path):
    flags = _build_flags(source)
    assert "-arch=sm_90" in flags
    result = subprocess.run(
        ["nvcc", *flags, "-o", str(tmp_path / source.stem), str(source)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{source.name}:\n{result.stderr[-3000:]}"
    assert (tmp_path / source.stem).stat().st_size > 0
