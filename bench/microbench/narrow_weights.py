#!/usr/bin/env python
"""The step kernel with its products' weight rows stored as fp32, fp16 and bf16
(compiler/codegen.WEIGHT_FORMATS), in one process on one GPU: per architecture (the zoo at the
benchmark's size, embed 256, 2 layers, 384 threads a block) the three kernels' device time (CUDA
graph replays, engines.fusion.time_plan_graph) and host to host as the session runs them
(engines.fusion.time_plans_host: interleaved rounds), and the weight buffer's bytes. A development
probe, not the published benchmark (bench/e2e.py).

    python bench/microbench/narrow_weights.py --seconds 150 min_gru lstm mamba/sequence --out /tmp/nw.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FULL = {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0}
FORMATS = ("fp32", "fp16", "bf16")


def main() -> None:
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.fusion import time_plan_graph, time_plans_host
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.runtime.pipeline import prepare_cached

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archs", nargs="+", help="zoo architectures; arch/sequence for the window form")
    parser.add_argument("--seconds", type=float, default=600.0, help="start no architecture after this long")
    parser.add_argument("--out", type=Path, default=Path("narrow_weights.json"))
    args = parser.parse_args()
    deadline = time.time() + args.seconds
    results = {"gpu": torch.cuda.get_device_name(), "rows": {}}
    for spec in args.archs:
        if time.time() > deadline:
            print(f"out of time: {spec} and after not run", flush=True)
            break
        arch, _, form = spec.partition("/")
        program = lower_program(prepare_cached(arch, FULL)[form or "step"].fused)
        plans = {
            fmt: StepKernelPlan.of(CompiledStep(program, device=torch.device("cuda"), weight_format=fmt, threads=384))
            for fmt in FORMATS
        }
        rng = np.random.default_rng(0)
        feeds = {
            n: torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).cuda()
            for n, shape in plans["fp32"].compiled.input_shapes.items()
        }
        row = {
            fmt: {
                "device_us": time_plan_graph(plan, feeds)["us_per_step"],
                "weight_bytes": plan.compiled.kernel.describe()["weight_bytes"],
            }
            for fmt, plan in plans.items()
        }
        for fmt, timing in time_plans_host(plans, feeds).items():
            row[fmt].update(timing)
        results["rows"][spec] = row
        print(spec, json.dumps(row), flush=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
