#!/usr/bin/env python
"""Where the tail of a host-to-host step comes from: the mapped floor (one kernel on pinned
mapped host memory in a CUDA graph), the step compiler's Session.step and the same with the
kernel resident (Session(resident=True)), timed over many calls
under the host conditions a game could set for its inference thread:

  base      as bench/e2e.py times them
  gc-off    Python's cyclic garbage collector disabled while timing
  pinned    the process pinned to the core it runs on (os.sched_setaffinity)
  both      gc-off and pinned

(each condition twice, in turn, so that a drift of the machine shows as a difference between
the two rounds rather than between conditions)

For each: p50 / p90 / p99 / p99.9 / max, the share of calls over --slow-us, and the median gap
(in calls) between slow calls, which says whether the slow calls are periodic (a timer tick)
or scattered. For Session.step (launched and resident) each call is also split by what
engines/hostpath.c records of the same frame: its spin on the done words (``wait``: the frame's
trip over PCIe, the kernel, the answer's trip back) and the rest of the call (``host``: Python's
call, the frame's copy and tagging, the bell or launch, the latency record); ``tail_wait_share``
is how much of the calls above the p99 exceed the median call by a longer wait, not by the
host's work (issue 18: is the resident step's p99 the GPU's side or the host's?).

    python bench/microbench/host_jitter.py --archs min_gru --out /tmp/jitter.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "bench"):  # framefuse, and bench/e2e.py's floors
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

CONDITIONS = ("base", "gc-off", "pinned", "both")


def times_ns(call, iters: int, warmup: int) -> tuple:
    """Each call's ns host to host, and where ``call.native`` is a session's hostpath state, the
    ns of the same frame's spin on its done words (else None)."""
    for i in range(warmup):
        call(i)
    native = getattr(call, "native", lambda: None)()
    ns = np.empty(iters, dtype=np.int64)
    wait = np.empty(iters, dtype=np.int64) if native is not None else None
    clock = time.perf_counter_ns
    for i in range(iters):
        start = clock()
        call(i)
        ns[i] = clock() - start
        if wait is not None:
            wait[i] = native.wait_ns
    return ns, wait


def split(total_ns: np.ndarray, wait_ns: np.ndarray) -> dict:
    """The calls' wait and host work (total - wait) at p50 / p99 (us), and over the calls above
    the p99 the share of their excess over the median call that is the wait's excess over the
    median wait (the rest is the host's)."""
    total, wait = np.asarray(total_ns, dtype=np.int64), np.asarray(wait_ns, dtype=np.int64)
    if total.shape != wait.shape or total.ndim != 1 or total.size == 0:
        raise ValueError(f"split: two equal non-empty 1-d arrays, got {total.shape} and {wait.shape}")
    if np.any(wait > total):
        raise ValueError("split: a frame's wait is longer than its call (the arrays are not of the same frames)")
    host = total - wait
    tail = total > np.percentile(total, 99)
    row = {
        "wait_p50_us": round(float(np.percentile(wait, 50)) / 1e3, 2),
        "wait_p99_us": round(float(np.percentile(wait, 99)) / 1e3, 2),
        "host_p50_us": round(float(np.percentile(host, 50)) / 1e3, 2),
        "host_p99_us": round(float(np.percentile(host, 99)) / 1e3, 2),
    }
    excess = float((total[tail] - np.median(total)).sum())
    if tail.any() and excess > 0:
        row["tail_wait_share"] = round(float((wait[tail] - np.median(wait)).sum()) / excess, 3)
    return row


def summary(us: np.ndarray, slow_us: float) -> dict:
    p50, p90, p99, p999 = np.percentile(us, [50, 90, 99, 99.9])
    slow = np.flatnonzero(us > slow_us)
    gaps = np.diff(slow)
    return {
        "p50_us": round(float(p50), 2),
        "p90_us": round(float(p90), 2),
        "p99_us": round(float(p99), 2),
        "p999_us": round(float(p999), 2),
        "max_us": round(float(us.max()), 2),
        "slow_share": round(float(len(slow) / len(us)), 5),
        "slow_gap_median_calls": float(np.median(gaps)) if len(gaps) else None,
    }


def current_cpu() -> int:
    """The core this thread last ran on (/proc/self/stat field 39; os has no sched_getcpu)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def under(condition: str, call, iters: int, warmup: int, slow_us: float) -> dict:
    saved = os.sched_getaffinity(0)
    was_enabled = gc.isenabled()
    try:
        if condition in ("pinned", "both"):
            os.sched_setaffinity(0, {current_cpu()})
        if condition in ("gc-off", "both"):
            gc.collect()
            gc.disable()
        ns, wait = times_ns(call, iters, warmup)
        return {**summary(ns / 1e3, slow_us), **(split(ns, wait) if wait is not None else {})}
    finally:
        if was_enabled:
            gc.enable()
        os.sched_setaffinity(0, saved)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default="min_gru")
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--slow-us", type=float, default=25.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch
    from e2e import make_mapped_floor

    from framefuse.engines import cuda_graph
    from framefuse.runtime.pipeline import prepare
    from framefuse.runtime.session import Session

    result = {
        "gpu": torch.cuda.get_device_name(),
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "loadavg": os.getloadavg(),
        "settings": {"iters": args.iters, "warmup": args.warmup, "slow_us": args.slow_us},
        "rows": [],
    }
    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="ff-jitter-"))
    calls = {}
    for arch in [a for a in args.archs.split(",") if a]:
        prepared = prepare(arch, root / arch)["step"]
        engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
        session = Session(engine, budget_ms=None)
        in_shape = prepared.manifest["inputs"][0]["shape"]
        out_shape = prepared.manifest["outputs"][0]["shape"]
        pool = rng.standard_normal((64, *in_shape)).astype(np.float32)
        call = (lambda s, p: lambda i: s.step(p[i % 64]))(session, pool)
        call.native = (lambda s: lambda: s._host_step.native_state)(session)  # after the warm-up's frames
        calls[f"{arch} step"] = call
        resident = Session(engine, budget_ms=None, resident=True)
        call = (lambda s, p: lambda i: s.step(p[i % 64]))(resident, pool)
        call.close = resident.close  # stopped after each condition: the other calls need the GPU
        call.native = (lambda s: lambda: s._host_step.native_state)(resident)
        calls[f"{arch} resident step"] = call
        calls[f"{arch} mapped floor"] = make_mapped_floor(pool=pool, out_shape=out_shape, device=torch.device("cuda"))
    for name, call in calls.items():
        for condition in CONDITIONS + CONDITIONS:  # twice: drift between conditions shows
            row = {
                "what": name,
                "condition": condition,
                **under(condition, call, args.iters, args.warmup, args.slow_us),
            }
            if hasattr(call, "close"):
                call.close()
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
