"""bench/microbench's CUDA sources (the GPU calls compile them there with nvcc and run them) compile
here for sm_90 with the flags their headers give, so a call is not spent on a build error."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

MICROBENCH = Path(__file__).resolve().parent.parent / "bench" / "microbench"
SOURCES = sorted(MICROBENCH.glob("*.cu"))


def _build_flags(source: Path) -> list[str]:
    """The nvcc flags of the source's own "Build: nvcc ... -o NAME NAME.cu" line."""
    match = re.search(r"Build:\s*nvcc (.*?) -o \S+ \S+\.cu", source.read_text())
    assert match, f"{source.name}: no 'Build: nvcc ... -o NAME NAME.cu' line in its header"
    return match.group(1).split()


def test_every_microbenchmark_is_listed():
    assert {s.name for s in SOURCES} >= {
        "level_cost.cu",
        "recur_position.cu",
        "poll_latency.cu",
        "host_roundtrip.cu",
        "tail_roundtrip.cu",
    }


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


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, MICROBENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _host_jitter():
    return _script("host_jitter")


def test_host_jitter_splits_a_tail_of_the_gpus_side_from_one_of_the_hosts():
    jitter = _host_jitter()
    frames = 1000
    wait = np.full(frames, 6000)
    host = np.full(frames, 3000)
    wait[:10] += 20000  # ten frames the GPU answered late: the calls' top 1 %
    row = jitter.split(wait + host, wait)
    assert row["wait_p50_us"] == pytest.approx(6.0) and row["host_p99_us"] == pytest.approx(3.0)
    assert row["tail_wait_share"] == pytest.approx(1.0)
    host[:10] += 20000  # now the host's work is what is late, the GPU answered in time
    wait[:10] -= 20000
    row = jitter.split(wait + host, wait)
    assert row["tail_wait_share"] == pytest.approx(0.0) and row["wait_p99_us"] == pytest.approx(6.0)
    assert jitter.summary((wait + host) / 1e3, 25.0)["slow_share"] == pytest.approx(0.01)


def test_host_jitter_refuses_frames_that_do_not_line_up():
    jitter = _host_jitter()
    with pytest.raises(ValueError, match="equal non-empty"):
        jitter.split(np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="longer than its call"):
        jitter.split(np.array([5, 5]), np.array([6, 1]))


def test_resident_spread_pools_launches_by_label(tmp_path):
    """resident_spread.py --summarize: the launches of several runs of a variant pooled by label, a
    row an arch and label with the median, smallest and largest launch p50 and the median p99 (g54's
    way of comparing variants whose launches sit ~1 us apart); a group without LABEL= is refused."""
    import json

    resident_spread = _script("resident_spread")

    def run(path, p50s, copies):
        rows = [{"arch": "gru", "p50_us": v, "p99_us": v + 2, "frame_copies": copies} for v in p50s]
        rows.append({"arch": "lstm", "p50_us": 8.0, "p99_us": 9.0, "frame_copies": copies})
        path.write_text(json.dumps(rows))
        return str(path)

    a = run(tmp_path / "a.json", [9.0, 10.0, 10.2], 1)
    b = run(tmp_path / "b.json", [8.0], 1)
    c = run(tmp_path / "c.json", [8.3, 8.4], 2)
    rows = resident_spread.summarize([f"off={a},{b}", f"on={c}"])
    assert [(r["arch"], r["label"]) for r in rows] == [("gru", "off"), ("gru", "on"), ("lstm", "off"), ("lstm", "on")]
    off = rows[0]
    assert off["launches"] == 4 and off["frame_copies"] == [1]
    assert (off["p50_median"], off["p50_min"], off["p50_max"], off["p99_median"]) == (9.5, 8.0, 10.2, 11.5)
    assert rows[1]["p50_median"] == 8.35 and rows[1]["frame_copies"] == [2] and rows[3]["launches"] == 1
    with pytest.raises(SystemExit, match="LABEL=FILE"):
        resident_spread.summarize([a])
