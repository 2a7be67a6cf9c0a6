"""Session 33: the build's selection for torch_mlpcell_loop windows (python3 sel_mlp.py 32 8): the
step-kernel tactics' timings, nothing else (run from the repository root on the GPU machine)."""

import sys
import time
from pathlib import Path

sys.path[:0] = ["tests", "."]

from real_models.flow import fuse_real_model  # noqa: E402

from framefuse.engines import cuda_graph  # noqa: E402

for steps in [int(a) for a in sys.argv[1:]]:
    run = fuse_real_model("torch_mlpcell_loop", steps, Path("/tmp/exports"))
    start = time.time()
    engine = cuda_graph.build(run.fused_path, device="cuda", options={"select": "time"})
    selection = engine.metadata["selection"]
    timings = {k: v.get("us_per_step") for k, v in selection["candidates"].items() if k.startswith("stepkernel")}
    print(steps, f"{time.time() - start:.1f}s", selection["chosen"], timings, flush=True)
