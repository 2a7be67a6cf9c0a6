"""Session 34: the resident kernel's p50 over the number of SMs it holds (Session(resident=True,
resident_sms=N): the schedule redone over N blocks), beside the launched step, for zoo step forms
and the tiny real models at T = 1; two interleaved rounds, 3000 calls each, host → host.

    python3 resident_sms.py ARCH|real:NAME ..."""

import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = ["tests", "."]

from framefuse.engines import cuda_graph  # noqa: E402
from framefuse.runtime.pipeline import prepare_cached  # noqa: E402
from framefuse.runtime.session import Session  # noqa: E402

SMS = (None, 64, 32, 16, 8, 4)


def p50(session, pool, calls=3000):
    for i in range(300):
        session.step(pool[i % len(pool)])
    t = np.empty(calls)
    for i in range(calls):
        a = time.perf_counter_ns()
        session.step(pool[i % len(pool)])
        t[i] = time.perf_counter_ns() - a
    return np.percentile(t, 50) / 1e3, np.percentile(t, 99) / 1e3


for item in sys.argv[1:]:
    if item.startswith("real:"):
        from real_models.flow import fuse_real_model

        run = fuse_real_model(item[5:], 1, Path("/tmp/exports"))
        fused = run.fused_path
        import onnx

        dims = onnx.load(str(run.source)).graph.input[0].type.tensor_type.shape.dim
        shape = [d.dim_value or 1 for d in dims]
    else:
        prepared = prepare_cached(item, {"model": {"embed": 256, "layers": 2}, "seq": 32, "seed": 0})["step"]
        fused, shape = prepared.fused, prepared.input_shapes()["x"]
    pool = np.random.default_rng(0).standard_normal((64, *shape)).astype(np.float32)
    engine = cuda_graph.build(fused, device="cuda", options={"select": "stepkernel"})
    try:
        from framefuse.compiler.engine import StepKernelPlan

        plans = [v for v in vars(engine).values() if isinstance(v, StepKernelPlan)]
        plans += [v for b in getattr(engine, "_plans", {}).values() for v in [b] if isinstance(v, StepKernelPlan)]
        used = max(t.first + t.blocks for t in plans[0].compiled.schedule.tasks)
    except Exception as exc:  # noqa: BLE001 - a note only
        used = f"? ({type(exc).__name__})"
    rows = {}
    launched = Session(engine)
    for _ in range(2):
        rows.setdefault("launched", []).append(p50(launched, pool))
        for sms in SMS:
            s = Session(engine, resident=True, resident_sms=sms)
            rows.setdefault(f"resident {sms or 'all'}", []).append(p50(s, pool))
            s.close()
    print(f"== {item} (blocks used by the launched schedule: {used})", flush=True)
    for k, v in rows.items():
        print(
            f"  {k:16s} p50 "
            + " / ".join(f"{a:5.1f}" for a, _ in v)
            + "   p99 "
            + " / ".join(f"{b:5.1f}" for _, b in v)
        )
