#!/usr/bin/env python
"""Step-kernel tactics side by side on one GPU, launched and resident, in one process: made for
the split products (compiler/simplify.SplitProducts, the stepkernel-split tactics) against the
tactic they add to, but any tactics of engines.fusion.STEPKERNELS can be named.

For each architecture (configs/<arch>.yaml: embed 256, 2 layers, batch 1) and each tactic: the
engine built with that tactic (``select=<tactic>``), its dependency levels, parity of --steps
chained steps against ONNX Runtime on the original model.onnx (max |diff| relative to
1 + |reference|, y and every final state), the resident kernel's outputs bit for bit the launched
kernel's over 200 frames, the device time of a step (CUDA events over back-to-back graph replays),
then Session.step p50 / p99 launched and resident, the tactics taken in turn for --rounds rounds.

    python bench/microbench/split_products.py --archs min_gru,mamba --out /tmp/split.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

TOL = 1e-4
DEFAULT_TACTICS = "stepkernel-384-threads-fewer-phases,stepkernel-384-threads-split"


def say(message: str) -> None:
    print(f"[split {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.abs(a - b) / (1 + np.abs(b))).max())


def main() -> int:
    from e2e import measure
    from stepkernel import ort_rollout

    from framefuse.engines import cuda_graph
    from framefuse.engines.fusion import example_feeds, time_plan_graph
    from framefuse.runtime.pipeline import prepare
    from framefuse.runtime.session import Session

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default="min_gru,min_lstm,gated_ssm,mamba,jamba")
    parser.add_argument("--tactics", default=DEFAULT_TACTICS, help="comma-separated names of STEPKERNELS")
    parser.add_argument("--steps", type=int, default=500, help="chained steps of the parity check")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-resident", action="store_true")
    parser.add_argument("--max-slices", type=int, default=None, help="simplify.SPLIT_MAX_SLICES for this run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tactics = args.tactics.split(",")
    if args.max_slices is not None:
        from framefuse.compiler import simplify

        simplify.SPLIT_MAX_SLICES = args.max_slices
    root = Path(tempfile.mkdtemp(prefix="framefuse-split-"))
    rows = []
    for arch in args.archs.split(","):
        prepared = prepare(arch, root / arch)["step"]
        manifest = prepared.manifest
        shape = manifest["inputs"][0]["shape"]
        rng = np.random.default_rng(0)
        frames = rng.standard_normal((args.steps, *shape)).astype(np.float32)
        pool = rng.standard_normal((64, *shape)).astype(np.float32)
        ref_y, ref_state = ort_rollout(prepared.onnx, manifest, frames)
        row: dict = {"arch": arch, "tactics": {}}
        sessions: dict[str, Session] = {}
        for tactic in tactics:
            entry: dict = {}
            lines: list[str] = []
            engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": tactic}, log=lines.append)
            compiled = engine.default_plan.compiled
            entry["levels"] = compiled.schedule.levels()
            entry["kernel"] = compiled.describe()
            launched = Session(engine, budget_ms=None)
            worst = 0.0
            for i, frame in enumerate(frames):
                worst = max(worst, _rel(launched.step(frame), ref_y[i]))
            state = launched.get_state()
            entry["parity_y"] = worst
            entry["parity_state"] = max(_rel(state[n], ref_state[n]) for n in ref_state)
            entry["parity_passed"] = worst <= TOL and entry["parity_state"] <= TOL
            launched.reset()
            expected = [launched.step(pool[i % 64]).copy() for i in range(200)]
            launched.reset()
            plan = engine.default_plan
            entry["device_us"] = time_plan_graph(plan, example_feeds(plan))["us_per_step"]
            sessions[f"{tactic} launched"] = launched
            if not args.no_resident:
                resident = Session(engine, budget_ms=None, resident=True)
                got = [resident.step(pool[i % 64]).copy() for i in range(200)]
                entry["resident_equal"] = all(np.array_equal(a, b) for a, b in zip(got, expected))
                resident.close()
                resident.reset()
                sessions[f"{tactic} resident"] = resident
            row["tactics"][tactic] = entry
            say(
                f"{arch} {tactic}: {entry['levels']} levels, device {entry['device_us']:.2f} us, parity y "
                f"{entry['parity_y']:.2e} state {entry['parity_state']:.2e}"
                + ("" if entry["parity_passed"] else f" FAILED (tolerance {TOL})")
                + (f", resident bit for bit: {entry['resident_equal']}" if "resident_equal" in entry else "")
            )
        timings: dict[str, list] = {name: [] for name in sessions}
        for _ in range(args.rounds):
            for name, session in sessions.items():
                timings[name].append(
                    measure(lambda i, s=session, p=pool: s.step(p[i % 64]), iters=args.iters, warmup=args.warmup)
                )
                if name.endswith("resident"):
                    session.close()  # one resident kernel at a time: each holds every SM
        row["timings"] = timings
        for session in sessions.values():
            session.close()
        sessions.clear()
        best = {name: (min(r["p50_us"] for r in rs), min(r["p99_us"] for r in rs)) for name, rs in timings.items()}
        say(f"{arch}: p50/p99 us (best round) " + "  ".join(f"{n} {a:.2f}/{b:.2f}" for n, (a, b) in best.items()))
        row["best"] = {name: {"p50_us": a, "p99_us": b} for name, (a, b) in best.items()}
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
