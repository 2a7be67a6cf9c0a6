#!/usr/bin/env python
"""Session.step's host work on the step kernel, native (engines/hostpath.c: the NaN check, the
launch or the bell, the wait in one foreign call) against the Python path, in the same process,
interleaved in rounds (bench/e2e.py's measure_rounds), beside the raw replay + wait and the mapped
floor. The kernel is the same in every column: the differences are host work.

    python bench/microbench/session_host.py --archs min_gru,attention --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def _outputs_equal(a: list, b: list) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def host_work(session, pool, iters: int) -> dict:
    """Session.step's own host work: the call less the spin on the done words (hostpath.c times
    the spin, and the frame's check and launch call or bell, of each frame)."""
    import time

    hs = session._host_step.native_state
    total, wait, launch = (np.empty(iters, dtype=np.int64) for _ in range(3))
    clock = time.perf_counter_ns
    for i in range(iters):
        start = clock()
        session.step(pool[i % 64])
        total[i] = clock() - start
        wait[i], launch[i] = hs.wait_ns, hs.launch_ns
    p50 = lambda a: float(np.percentile(a / 1e3, 50))  # noqa: E731
    return {
        "step_p50_us": p50(total),
        "host_work_p50_us": p50(total - wait),
        "host_work_p99_us": float(np.percentile((total - wait) / 1e3, 99)),
        "launch_call_p50_us": p50(launch),
        "wait_p50_us": p50(wait),
    }


def bench_arch(arch: str, args, root: Path) -> dict:
    import torch
    from e2e import make_mapped_floor, make_mapped_floor_done, measure, measure_rounds

    from framefuse.engines import cuda_graph, hostpath
    from framefuse.runtime.pipeline import prepare
    from framefuse.runtime.session import Session

    prepared = prepare(arch, root / arch)["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": args.select})
    in_shape = engine.input_specs["x"].shape
    out_name = next(n for n in engine.output_specs if not n.startswith("next_state."))
    out_shape = engine.output_specs[out_name].shape
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((64, *in_shape)).astype(np.float32)
    row: dict = {"arch": arch, "select": args.select, "hostpath": hostpath.status()}

    # the two paths give the same outputs (same kernel, same frames)
    outs = {}
    for native in (True, False):
        session = Session(engine, budget_ms=None)
        if not native:
            session._hot = None
        outs[native] = [session.step(pool[i % 64]).copy() for i in range(200)]
    row["paths_equal"] = _outputs_equal(outs[True], outs[False])

    native = Session(engine, budget_ms=None)
    python = Session(engine, budget_ms=None)
    python._hot = None
    through_ctypes = Session(engine, budget_ms=None)  # the native call without the extension's step
    if through_ctypes._hot is not None:
        through_ctypes._hot = through_ctypes._hot[:5] + (None, None)
    row["extension"] = native.host_path
    binding = python._host_step
    floor = make_mapped_floor(pool=pool, out_shape=out_shape, device=torch.device("cuda"))
    fn, arg = native._hot[2:4] if native._hot else (None, None)
    nb = native._host_step

    def raw_native(i):
        nb.host_in["x"][...] = pool[i % 64]
        fn(arg)

    calls = {
        "step_native": lambda i: native.step(pool[i % 64]),
        "step_ctypes": lambda i: through_ctypes.step(pool[i % 64]),
        "step_python": lambda i: python.step(pool[i % 64]),
        "launch_wait_python": lambda i: (binding.launch(), binding.wait_host()),
        "copy_call_native": raw_native,
        "mapped_floor": floor,
    }
    native_floor = make_mapped_floor_done(pool=pool, out_shape=out_shape, device=torch.device("cuda"))
    if native_floor is not None:
        calls["mapped_floor_native_wait"] = native_floor
    if fn is None:
        calls = {k: v for k, v in calls.items() if "native" not in k and "ctypes" not in k}
    row["launched"] = measure_rounds(calls, iters=args.iters, warmup=args.warmup, rounds=args.rounds)
    if fn is not None:
        row["host_work"] = host_work(native, pool, args.iters)
    for s in (native, python, through_ctypes):
        s.close()
    torch.cuda.synchronize()
    if not args.no_resident:
        res_native = Session(engine, budget_ms=None, resident=True)
        outs_native = [res_native.step(pool[i % 64]).copy() for i in range(200)]
        res_native.close()
        res_python = Session(engine, budget_ms=None, resident=True)
        res_python._hot = None
        outs_python = [res_python.step(pool[i % 64]).copy() for i in range(200)]
        res_python.close()
        row["resident_paths_equal"] = _outputs_equal(outs_native, outs_python) and _outputs_equal(
            outs_native, outs[True]
        )
        # one resident session at a time (each holds every SM): a fresh one each block of calls
        names = ["step_native", "step_ctypes", "step_python"]
        results: dict = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                s = Session(engine, budget_ms=None, resident=True)
                if name == "step_python":
                    s._hot = None
                elif name == "step_ctypes" and s._hot is not None:
                    s._hot = s._hot[:5] + (None, None)
                step = s.step
                results[name].append(
                    measure(
                        lambda i, step=step: step(pool[i % 64]), iters=args.iters // args.rounds, warmup=args.warmup
                    )
                )
                s.close()
        s = Session(engine, budget_ms=None, resident=True)
        if s._hot is not None:
            for i in range(args.warmup):
                s.step(pool[i % 64])
            row["resident_host_work"] = host_work(s, pool, args.iters)
        s.close()
        row["resident"] = {
            name: {
                "p50_us_rounds": [g["p50_us"] for g in got],
                "p50_us": float(np.median([g["p50_us"] for g in got])),
                "p99_us": float(np.median([g["p99_us"] for g in got])),
            }
            for name, got in results.items()
        }
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="min_gru,attention")
    ap.add_argument("--select", default="stepkernel")
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-resident", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    rows = []
    with tempfile.TemporaryDirectory(prefix="ff-session-host-") as tmp:
        for arch in args.archs.split(","):
            row = bench_arch(arch, args, Path(tmp))
            rows.append(row)
            line = ", ".join(f"{k} {v['p50_us']:.2f}/{v['p99_us']:.2f}" for k, v in row["launched"].items())
            print(f"{arch} [{row['hostpath']}] paths equal {row['paths_equal']}: {line}", flush=True)
            for key in ("host_work", "resident_host_work"):
                if key in row:
                    print(f"{arch} {key}: " + ", ".join(f"{k} {v:.2f}" for k, v in row[key].items()), flush=True)
            if "resident" in row:
                line = ", ".join(f"{k} {v['p50_us']:.2f}/{v['p99_us']:.2f}" for k, v in row["resident"].items())
                print(f"{arch} resident (equal {row['resident_paths_equal']}): {line}", flush=True)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "args": {**vars(args), "out": str(args.out)},
        "rows": rows,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "session_host.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
