#!/usr/bin/env python
"""The CPU step and ONNX Runtime CPU timed back to back and with a game's work between frames.

A game calls the step once a frame; between two calls its own work fills the CPU's caches. This
times each engine host to host (Session.step: the frame in, the output back, the state carried;
ONNX Runtime as bench/e2e.py calls it) with a framegap.CacheSweep of each --gaps size written
before every timed call, off the clock, the gap sizes and engines interleaved in rounds. The CPU
step runs on the caller's thread (``cpu_step``) and resident on a worker thread of its own
(``cpu_step_resident``: engines/cpustep.CpuResidentBinding, stopped while the others are timed).
Gap 0 without --hz is the back-to-back loop every benchmark before 2026-12-05 timed; --hz 60 also
waits for the next tick of a 60 Hz clock before each call (framegap.FramePacer), as a bot's thread
waits for the game's next frame. No GPU is used: the GPU
step's host side under the same gaps is `bench/e2e.py --frame-gap`'s to measure.

    python bench/microbench/frame_gap.py --items real:gpt2_sdpa,lstm --out FILE.json

An item is a zoo architecture (its step form at --embed, 2 layers) or real:NAME (a tests/real_models
model's length-1 window), as in cpu_step.py.
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
for path in (REPO, REPO / "bench", REPO / "bench" / "microbench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def _session(fused, resident: bool):
    """A Session over the fused graph on the CPU with the CPU step, on the caller's thread or
    resident on a worker thread of its own."""
    from framefuse.runtime.session import Session

    options = {"select": "cpustep"}
    return Session.load(fused, engine="cuda-graph", device="cpu", engine_options=options, resident=resident)


def bench_item(item: str, args, root: Path, gaps: list[int]) -> dict:
    import onnxruntime as ort
    from cpu_step import _prepare
    from e2e import make_ort

    from framefuse.engines.framegap import describe, frame_gap

    fused, onnx_path, manifest = _prepare(item, root, args.embed)
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    state_names = [f"state.{n}" for n in manifest.get("state_names") or []]
    shape = tuple(manifest["inputs"][0]["shape"])
    pool = np.random.default_rng(0).standard_normal((64, *shape)).astype(np.float32)
    sessions = {"cpu_step": _session(fused, False), "cpu_step_resident": _session(fused, True)}

    # parity over chained steps against ONNX Runtime on the original graph (each its own state)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    outputs = [out_name] + [s.replace("state.", "next_state.", 1) for s in state_names]
    shapes = {i.name: [d if isinstance(d, int) else 1 for d in i.shape] for i in sess.get_inputs()}
    ort_state = {n: np.zeros(shapes[n], np.float32) for n in state_names}
    worst = {name: 0.0 for name in sessions}
    for i in range(args.steps):
        results = sess.run(outputs, {in_name: pool[i % 64], **ort_state})
        ort_state = dict(zip(state_names, results[1:]))
        for name, session in sessions.items():
            got = np.asarray(session.step(pool[i % 64]))
            worst[name] = max(worst[name], float(np.max(np.abs(got - results[0]) / (1 + np.abs(results[0])))))
    for session in sessions.values():
        session.reset()
    sessions["cpu_step_resident"].close()  # started again by its own block's first call

    def stepper(session):
        return lambda i: session.step(pool[i % 64])

    engines = {name: stepper(session) for name, session in sessions.items()}
    engines["ort_cpu"] = make_ort(onnx_path, pool=pool, manifest=manifest)
    sweeps = {gap: frame_gap(gap, args.hz) for gap in gaps}  # the sweep, then the wait for the tick
    samples: dict = {(name, gap): [] for name in engines for gap in gaps}
    sweep_ns: dict = {gap: [] for gap in gaps}
    clock = time.perf_counter_ns
    cells = [(name, gap) for gap in gaps for name in engines]
    for r in range(args.rounds):
        shift = r % len(cells)
        for name, gap in cells[shift:] + cells[:shift]:
            fn, sweep = engines[name], sweeps[gap]
            for i in range(args.warmup if r == 0 else 10):  # the resident worker starts here
                fn(i)
            ns = samples[(name, gap)]
            for k in range(args.calls):
                if sweep is not None:
                    start = clock()
                    sweep()
                    sweep_ns[gap].append(clock() - start)
                start = clock()
                fn(k)
                ns.append(clock() - start)
            sessions["cpu_step_resident"].close()  # its worker holds a core: not while others run
    row: dict = {"item": item, "parity_steps": args.steps, "max_rel_diff": worst, "gaps": []}
    row["cpu_step"] = sessions["cpu_step"].engine.summary().get("cpustep")
    for gap in gaps:
        entry: dict = {"gap_bytes": gap, "gap": describe(gap) if gap else "no bytes", "hz": args.hz}
        if sweep_ns[gap]:
            entry["gap_ms"] = round(float(np.median(sweep_ns[gap])) / 1e6, 3)  # the sweep and the wait
        for name in engines:
            us = np.asarray(samples[(name, gap)]) / 1e3
            entry[name] = {
                "p50_us": round(float(np.percentile(us, 50)), 2),
                "p99_us": round(float(np.percentile(us, 99)), 2),
                "calls": int(us.size),
            }
        row["gaps"].append(entry)
    return row


def main() -> int:
    from framefuse.engines.framegap import parse_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", default="real:gpt2_sdpa,real:llama_gqa_sdpa,real:mamba,real:torch_lstm_bidir,lstm")
    parser.add_argument("--gaps", default="0,1M,4M,16M,32M,64M,256M", help="bytes written between frames (0 first)")
    parser.add_argument("--embed", type=int, default=256, help="zoo items' embedding width")
    parser.add_argument("--steps", type=int, default=100, help="chained steps of the parity check")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per engine, gap and round")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hz", type=float, default=0.0, help="pace the calls at this rate after each gap's sweep (0: back to back)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    gaps = [parse_bytes(g, what="--gaps") for g in args.gaps.split(",") if g.strip()]
    if not gaps or gaps[0] != 0:
        gaps = [0, *[g for g in gaps if g]]
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    result = {"cpu": cpu, "args": vars(args), "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": []}
    root = Path(tempfile.mkdtemp(prefix="ff-frame-gap-"))
    for item in [i for i in args.items.split(",") if i]:
        try:
            row = bench_item(item, args, root, gaps)
        except Exception as exc:  # noqa: BLE001 - a row that fails is reported with its error
            row = {"item": item, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            print(f"{item}: {row['error']}", flush=True)
        else:
            cells = "  ".join(
                f"{g['gap']}: {g['cpu_step']['p50_us']:.1f} / {g['cpu_step_resident']['p50_us']:.1f} / "
                f"{g['ort_cpu']['p50_us']:.1f}"
                for g in row["gaps"]
            )
            parity = max(row["max_rel_diff"].values())
            print(
                f"{item} (parity {parity:.1e}), Session.step p50 us, CPU step / resident on a worker / "
                f"ONNX Runtime CPU: {cells}",
                flush=True,
            )
        result["rows"].append(row)
        if args.out:  # after every item: a cut run keeps what it measured
            Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
