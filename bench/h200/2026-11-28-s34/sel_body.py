"""Session 34: the build's selection (the step-kernel tactics' timings, nothing else) for body-loop
windows: python3 sel_body.py MODEL T [MODEL T ...] (from the repository root on the GPU machine)."""

import sys
import time
from pathlib import Path

sys.path[:0] = ["tests", "."]

from real_models.flow import fuse_real_model  # noqa: E402

from framefuse.engines import cuda_graph  # noqa: E402

args = sys.argv[1:]
for name, steps in zip(args[::2], args[1::2]):
    run = fuse_real_model(name, int(steps), Path("/tmp/exports"))
    start = time.time()
    engine = cuda_graph.build(run.fused_path, device="cuda", options={"select": "time"})
    selection = engine.metadata["selection"]
    timings = {k: v.get("us_per_step") for k, v in selection["candidates"].items() if k.startswith("stepkernel")}
    print(name, steps, f"{time.time() - start:.1f}s", selection["chosen"], timings, flush=True)
