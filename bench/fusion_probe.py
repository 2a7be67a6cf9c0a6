"""Per-architecture build-time selection on the GPU: the plan as planned, the unoptimised plan and
the inductor-compiled plans, each timed captured in a CUDA graph (device us per replay), with the
kernel count of one eager run (torch.profiler). One JSON row per (arch, form), written as it goes.

    python bench/fusion_probe.py --archs min_gru,lstm --forms step,sequence --out probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def kernel_count(plan, feeds) -> tuple[int, float]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from framefuse.engines.executor import fp32_math

    with fp32_math(), torch.no_grad():
        plan.execute({k: v.clone() for k, v in feeds.items()})
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            plan.execute({k: v.clone() for k, v in feeds.items()})
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    kernels = [e for e in kernels if "Memcpy" not in e.name and "Memset" not in e.name] or kernels
    return len(kernels), round(sum(e.device_time for e in kernels), 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default="min_gru,lstm,mamba,delta_net,attention")
    parser.add_argument("--forms", default="step,sequence")
    parser.add_argument("--modes", default="inductor", help="comma-separated keys of fusion.COMPILE_MODES")
    parser.add_argument("--out", default="fusion_probe.json")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop starting rows after this many seconds")
    args = parser.parse_args(argv)
    import onnx
    import torch

    from framefuse.engines import fusion
    from framefuse.engines.executor import GraphExecutor
    from framefuse.runtime.pipeline import prepare_cached

    start = time.time()
    rows = []
    modes = {m: fusion.COMPILE_MODES[m] for m in args.modes.split(",") if m}
    for arch in args.archs.split(","):
        for form in args.forms.split(","):
            if time.time() - start > args.budget_s:
                print(f"budget spent: skipping {arch} {form}", flush=True)
                continue
            row = {"arch": arch, "form": form, "device": torch.cuda.get_device_name()}
            try:
                prepared = prepare_cached(arch, {"seq": 32, "seed": 0})[form]
                model = onnx.load(str(prepared.fused))
                plan = GraphExecutor(model, "cuda", optimize=True).plan()
                plain = GraphExecutor(model, "cuda", optimize=False).plan()
                chosen, report = fusion.select_plan(plan, alternatives={"unoptimized": plain}, modes=modes, log=print)
                row.update(report)
                feeds = fusion.example_feeds(plan)
                for name, entry in report["candidates"].items():
                    if "us_per_step" in entry:
                        candidate = {"plan": plan, "unoptimized": plain}.get(name)
                        if candidate is None:
                            candidate, _ = fusion.compile_plan(plan, mode=modes[name])
                        entry["kernels"], entry["kernel_us"] = kernel_count(candidate, feeds)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            row["seconds"] = round(time.time() - start, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
            tmp = args.out + ".tmp"
            Path(tmp).write_text(json.dumps(rows, indent=1))
            os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
