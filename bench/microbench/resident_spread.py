#!/usr/bin/env python
"""Where the resident step's p50 spread comes from: the same resident kernel timed in several
sessions (fresh control word, state halves and mapped buffers each) and relaunched several times
in each, with the SM clock read (nvidia-smi, while the kernel still runs), the host CPU of the
timing thread and the SM each block ran on (ResidentStepBinding.block_sms) after every measurement. resident_variants.py saw one kernel's p50 differ by ~1 us
between two sessions of one process (gated_ssm 9.9 / 11.1, session 70's g44).

    python bench/microbench/resident_spread.py --archs gated_ssm,min_gru --sessions 4 --launches 3

Session 71 (bench/h100/2026-12-07-s71/g48): every launch put every block on the same SM, fast and
slow launches alike. --reads counts each frame's reads of host memory by the frame block (is a
slow launch's frame one read later?); --poll-ahead times codegen.RESIDENT_POLL_AHEAD's kernel.
Session 72 (g52): yes, min_gru's launches at 9.15-9.20 us p50 saw most frames in one read, those at
10.24-10.34 in two. --replicas CYCLES times codegen.RESIDENT_FRAMER_REPLICAS at that delay (0: off;
with --reads a frame is counted by the frame block and by each replica), --replicas-each K with K
replicas a frame block (codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK). --summarize pools earlier
runs' JSON by label (LABEL=FILE[,FILE...]) into each arch's median launch, without a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def sm_clock_mhz() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return int(out.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def summarize(groups: list[str]) -> list[dict]:
    """Launches written by --out, pooled by label: each of ``groups`` is LABEL=FILE[,FILE...] (the
    JSON of several processes of one variant, e.g. two passes alternating with another). A row an
    arch and label: how many launches, the median, smallest and largest launch p50 and the median
    p99 (one launch's p50 may sit ~1 us off another's: the median launch is the figure to compare)."""
    import statistics

    rows = []
    for group in groups:
        label, sep, files = group.partition("=")
        if not sep or not files:
            raise SystemExit(f"--summarize: {group!r} is not LABEL=FILE[,FILE...]")
        launches = [r for f in files.split(",") for r in json.loads(Path(f).read_text())]
        for arch in dict.fromkeys(r["arch"] for r in launches):
            mine = [r for r in launches if r["arch"] == arch]
            p50 = [r["p50_us"] for r in mine]
            rows.append(
                {
                    "arch": arch,
                    "label": label,
                    "launches": len(mine),
                    "frame_copies": sorted({r.get("frame_copies", 1) for r in mine}),
                    "p50_median": round(statistics.median(p50), 2),
                    "p50_min": min(p50),
                    "p50_max": max(p50),
                    "p99_median": round(statistics.median(r["p99_us"] for r in mine), 2),
                }
            )
    return sorted(rows, key=lambda r: r["arch"])


def main() -> int:
    import tempfile

    if "--summarize" in sys.argv:  # no GPU: the JSON of earlier runs
        parser = argparse.ArgumentParser()
        parser.add_argument("--summarize", nargs="+", metavar="LABEL=FILE[,FILE...]", required=True)
        for row in summarize(parser.parse_args().summarize):
            print(
                f"{row['arch']:10s} {row['label']:12s} {row['launches']:3d} launches, copies {row['frame_copies']}: "
                f"p50 median {row['p50_median']:.2f} [{row['p50_min']:.2f}-{row['p50_max']:.2f}], "
                f"p99 median {row['p99_median']:.2f}"
            )
        return 0

    from e2e import measure

    from framefuse.engines import cuda_graph
    from framefuse.runtime.pipeline import prepare
    from framefuse.runtime.session import Session

    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default="gated_ssm,min_gru")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument(
        "--reads",
        action="store_true",
        help="count each frame's reads of host memory (codegen.RESIDENT_POLL_COUNTS): a row's frame_reads",
    )
    parser.add_argument("--poll-ahead", action="store_true", help="codegen.RESIDENT_POLL_AHEAD on")
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="CYCLES",
        help="codegen.RESIDENT_FRAMER_REPLICAS on, the replica this many cycles behind (RESIDENT_REPLICA_DELAY); "
        "0: off (default: the module's settings)",
    )
    parser.add_argument(
        "--replicas-each",
        type=int,
        default=None,
        help="replicas of each frame block (codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK; default: the module's)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from framefuse.compiler import codegen

    # (set before any engine is built: every resident kernel here is generated with them)
    codegen.RESIDENT_POLL_COUNTS = args.reads
    codegen.RESIDENT_POLL_AHEAD = args.poll_ahead
    if args.replicas_each is not None:
        codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK = args.replicas_each
    if args.replicas == 0:
        codegen.RESIDENT_FRAMER_REPLICAS = False
    elif args.replicas is not None:
        codegen.RESIDENT_FRAMER_REPLICAS, codegen.RESIDENT_REPLICA_DELAY = True, args.replicas
    libc = ctypes.CDLL(None)
    root = Path(tempfile.mkdtemp(prefix="framefuse-spread-"))
    rows = []
    for arch in args.archs.split(","):
        prepared = prepare(arch, root / arch)["step"]
        engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
        shape = prepared.manifest["inputs"][0]["shape"]
        pool = np.random.default_rng(0).standard_normal((64, *shape)).astype(np.float32)
        for s in range(args.sessions):
            session = Session(engine, budget_ms=None, resident=True)
            for launch in range(args.launches):
                stats = measure(
                    lambda i, p=pool, step=session.step: step(p[i % 64]), iters=args.iters, warmup=args.warmup
                )
                row = {
                    "arch": arch,
                    "session": s,
                    "launch": launch,
                    "p50_us": round(stats["p50_us"], 2),
                    "p99_us": round(stats["p99_us"], 2),
                    "sm_mhz": sm_clock_mhz(),
                    "cpu": libc.sched_getcpu(),
                    "ctl": hex(session._host_step._ctl.data_ptr()),
                    "frame_copies": session._host_step.resident_kernel.frame_copies,
                }
                session.close()
                # where the launch put each block (the kernel writes %smid at launch)
                row["block_sms"] = session._host_step.block_sms()
                if args.reads:  # frames by the reads of host memory they took (1, 2, ..., 8 or more)
                    row["frame_reads"] = session._host_step.frame_reads()
                rows.append(row)
                print(json.dumps({**row, "block_sms": row["block_sms"][:8] + ["..."]}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
