#!/usr/bin/env python
"""The step IR compiled for the CPU (framefuse/compiler/cstep.py) against ONNX Runtime on the CPU,
in one process: parity with ONNX Runtime on the original graph over chained steps, then each timed
host to host the way bench/e2e.py times its peers (a frame in, the output back, the state carried),
interleaved in rounds. No GPU is used.

    python bench/microbench/cpu_step.py --items real:torch_rnncell_loop,lstm --out FILE.json

An item is a zoo architecture (its step form at --embed, 2 layers) or real:NAME (a tests/real_models
model's length-1 window).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def _prepare(item: str, root: Path, embed: int):
    """(fused ModelProto, original ONNX path, manifest) of an item."""
    if item.startswith("real:"):
        from e2e import load_real_models

        _, flow = load_real_models()
        fused = flow.fuse_real_model(item[len("real:") :], 1, root / item.replace(":", "-"))
        return fused.fused, fused.source, fused.manifest
    from framefuse.runtime.pipeline import prepare

    prepared = prepare(item, root / item, {"model": {"embed": embed, "layers": 2}, "seed": 0})["step"]
    return prepared.fused, prepared.onnx, prepared.manifest


def bench_item(item: str, args, root: Path) -> dict:
    from e2e import make_ort, measure

    from framefuse.compiler import cstep, lower_program

    fused, onnx_path, manifest = _prepare(item, root, args.embed)
    program = lower_program(fused)
    start = time.perf_counter()
    step = cstep.generate(program)
    runner = cstep.Runner(step)
    row: dict = {"item": item, "build_s": round(time.perf_counter() - start, 2), **step.describe()}
    in_name = manifest["inputs"][0]["name"]
    out_name = manifest["outputs"][0]["name"]
    state_names = [f"state.{n}" for n in manifest.get("state_names") or []]
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((64, *program.inputs[in_name].shape)).astype(np.float32)

    # parity: chained steps against ONNX Runtime on the original graph, each side its own state
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ort_state = {n: np.zeros(program.states[n].shape, np.float32) for n in state_names}
    outputs = [out_name] + [program.state_of[n] for n in state_names]
    frame_buffer, out_buffer = runner.inputs[in_name], runner.outputs[out_name]
    worst = 0.0
    for i in range(args.steps):
        frame_buffer[...] = pool[i % 64]
        runner.call(i % 2)
        got = out_buffer.copy()
        results = sess.run(outputs, {in_name: pool[i % 64], **ort_state})
        ort_state = dict(zip(state_names, results[1:]))
        worst = max(worst, float(np.max(np.abs(got - results[0]) / (1 + np.abs(results[0])))))
    row["parity_steps"], row["max_rel_diff"] = args.steps, worst

    # host to host: the frame copied in, the step, the output read; the state halves alternate
    call = runner._call
    ios = [runner.io_address(0), runner.io_address(1)]

    def cpu_step(i):
        frame_buffer[...] = pool[i % 64]
        call(ios[i & 1], None)
        return out_buffer

    peers = {"cpu_step": cpu_step, "ort_cpu": make_ort(onnx_path, pool=pool, manifest=manifest)}
    rounds: dict[str, list] = {name: [] for name in peers}
    for r in range(args.rounds):
        for name in list(peers)[r % 2 :] + list(peers)[: r % 2]:
            rounds[name].append(measure(peers[name], iters=args.iters, warmup=args.warmup))
    for name, got in rounds.items():
        row[name] = {
            "p50_us": float(np.median([g["p50_us"] for g in got])),
            "p99_us": float(np.median([g["p99_us"] for g in got])),
            "p50_us_rounds": [round(g["p50_us"], 3) for g in got],
        }
    row["speedup_vs_ort_cpu"] = row["ort_cpu"]["p50_us"] / row["cpu_step"]["p50_us"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", default="real:torch_rnncell_loop,real:torch_mlpcell_loop,lstm")
    parser.add_argument("--embed", type=int, default=256, help="zoo items' embedding width")
    parser.add_argument("--steps", type=int, default=200, help="chained steps of the parity check")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    result = {"cpu": cpu, "args": vars(args), "rows": []}
    root = Path(tempfile.mkdtemp(prefix="ff-cpu-step-"))
    for item in [i for i in args.items.split(",") if i]:
        try:
            row = bench_item(item, args, root)
        except Exception as exc:  # noqa: BLE001 - a row that fails is reported with its error
            row = {"item": item, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            print(f"{item}: {row['error']}", flush=True)
        else:
            print(
                f"{item}: parity {row['max_rel_diff']:.1e} over {row['parity_steps']} steps; cpu step "
                f"{row['cpu_step']['p50_us']:.2f}/{row['cpu_step']['p99_us']:.2f} us, ONNX Runtime CPU "
                f"{row['ort_cpu']['p50_us']:.2f}/{row['ort_cpu']['p99_us']:.2f} us: {row['speedup_vs_ort_cpu']:.2f}x "
                f"(build {row['build_s']} s, {row['weight_floats']} weights)",
                flush=True,
            )
        result["rows"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
