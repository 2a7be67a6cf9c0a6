#!/usr/bin/env python
"""One architecture's generated step kernel, built with a tactic and launched a few times with its
own buffers: the target of a profiler run (Nsight Compute's per-instruction stall samples show
where a kernel's warps wait, which device times and traces do not).

    ncu -k regex:ffk_step --launch-skip 3 --launch-count 1 --section SourceCounters -o /tmp/rep \\
        python bench/microbench/ncu_step.py min_gru stepkernel-384-threads-split
    ncu -i /tmp/rep.ncu-rep --page source --print-source sass --csv > /tmp/rep.csv
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> int:
    import torch

    from framefuse.compiler.engine import compile_step
    from framefuse.engines.fusion import STEPKERNELS, example_feeds
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.runtime.pipeline import prepare

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arch")
    parser.add_argument("tactic", choices=sorted(STEPKERNELS))
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--source", default=None, help="write the kernel's source here")
    args = parser.parse_args()
    prepared = prepare(args.arch, Path(tempfile.mkdtemp(prefix="ff-ncu-")) / args.arch)["step"]
    compiled = compile_step(prepared.fused, device=torch.device("cuda"), **STEPKERNELS[args.tactic])
    if args.source:
        Path(args.source).write_text(compiled.kernel.source)
    plan = StepKernelPlan.of(compiled)
    feeds = example_feeds(plan)
    for _ in range(args.launches):
        plan.execute(feeds)
    torch.cuda.synchronize()
    print(f"{args.arch} {args.tactic}: {compiled.schedule.levels()} levels, {args.launches} launches", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
