"""Session 34: where a tiny real model's T = 1 step goes (torch_rnn_bidir, torch_rnncell_loop): the
launched step kernel and the resident one over 132 SMs and over fewer (resident_sms), ONNX Runtime on
the CPU, all host → host p50/p99 in one process; then the launched kernel's traced timeline.

    python3 tiny_t1.py [NAME ...]"""

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path[:0] = ["tests", "."]

from real_models.flow import fuse_real_model  # noqa: E402

from framefuse.compiler import lower_program  # noqa: E402
from framefuse.compiler.engine import CompiledStep, StepKernelPlan  # noqa: E402
from framefuse.engines import cuda_graph  # noqa: E402
from framefuse.runtime.session import Session  # noqa: E402

CALLS = 3000


def timed(call, frames):
    for i in range(300):
        call(frames[i % len(frames)])
    out = np.empty(CALLS)
    for i in range(CALLS):
        t0 = time.perf_counter_ns()
        call(frames[i % len(frames)])
        out[i] = time.perf_counter_ns() - t0
    return np.percentile(out, 50) / 1e3, np.percentile(out, 99) / 1e3


for name in sys.argv[1:] or ["torch_rnn_bidir", "torch_rnncell_loop"]:
    run = fuse_real_model(name, 1, Path("/tmp/exports"))
    engine = cuda_graph.build(run.fused_path, device="cuda", options={"select": "stepkernel"})
    in_name = engine.input_names[0] if hasattr(engine, "input_names") else None
    import onnxruntime as ort

    ortsess = ort.InferenceSession(str(run.source), providers=["CPUExecutionProvider"])
    inp = ortsess.get_inputs()[0]
    rng = np.random.default_rng(0)
    frames = [
        rng.standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32) for _ in range(16)
    ]
    rows = {}
    rows["ORT CPU"] = timed(lambda f, s=ortsess, n=inp.name: s.run(None, {n: f}), frames)
    s = Session(engine)
    rows["launched"] = timed(s.step, frames)
    want = [ortsess.run(None, {inp.name: f})[0] for f in frames[:2]]
    for sms in (None, 1, 2, 4, 8, 16):
        try:
            r = Session(engine, resident=True, resident_sms=sms)
            err = max(float(np.abs(np.asarray(r.step(f, copy=True)) - w).max()) for f, w in zip(frames, want))
            rows[f"resident sms={sms or 'all'} (err {err:.1e})"] = timed(r.step, frames)
            r.close()
        except Exception as exc:  # noqa: BLE001
            rows[f"resident sms={sms}"] = str(exc)[:200]
    print(f"== {name} T=1 ({engine.metadata['selection'].get('chosen')})")
    for k, v in rows.items():
        print(f"  {k:36s} " + (f"p50 {v[0]:6.1f} us  p99 {v[1]:6.1f} us" if isinstance(v, tuple) else v))
    for grid in (132, 1):
        compiled = CompiledStep(lower_program(run.fused_path), device=torch.device("cuda"), grid=grid, trace=True)
        plan = StepKernelPlan(compiled, compiled.input_specs, compiled.output_specs)
        feeds = {n: torch.randn(sp.shape, device="cuda") for n, sp in compiled.input_specs.items()}
        for _ in range(20):
            plan.execute(feeds)
        torch.cuda.synchronize()
        print(f"  traced launched kernel, grid {grid}: {compiled.kernel.describe()['tasks']} tasks")
        for row in compiled.timeline():
            print(
                "   ",
                row["task"],
                row["value"][:40],
                row["blocks"],
                "enter",
                row["enter_us"],
                "ready",
                row["ready_us"],
                "exit",
                row["exit_us"],
                "cycles",
                row["phase_cycles"],
            )
