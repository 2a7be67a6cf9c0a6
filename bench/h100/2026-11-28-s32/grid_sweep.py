"""Session 32's one-off measurement (grid-sweep.txt): the step kernel of small real-model windows
scheduled over 1..132 blocks, launched and resident, p50/p99 host -> host beside ONNX Runtime CPU
and the mapped floor, in interleaved rounds of one process. Run from the repository root on a GPU:

    python bench/h100/2026-11-28-s32/grid_sweep.py torch_rnn_bidir,torch_rnncell_loop 1,2,4,16,132
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, ".")
from bench.e2e import make_mapped_floor, make_ort, measure_rounds  # noqa: E402
from framefuse.compiler.engine import CompiledStep, StepKernelPlan  # noqa: E402
from framefuse.engines import cuda_graph  # noqa: E402
from tests.real_models import flow  # noqa: E402

POOL = 64


def frame_call(binding, pool, in_name, out_name):
    host_in, host_out = binding.host_in[in_name], binding.host_out[out_name]

    def call(i):
        np.copyto(host_in, pool[i % POOL])
        binding.launch()
        binding.wait_host()
        return host_out

    return call


def sweep(name: str, seq: int, grids: list[int], work: Path) -> None:
    fused = flow.fuse_real_model(name, seq, work)
    manifest = fused.manifest
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    pool = np.random.default_rng(0).standard_normal((POOL, *manifest["inputs"][0]["shape"])).astype(np.float32)
    engine = cuda_graph.build(fused.fused_path, device="cuda", options={"select": "stepkernel"})
    base = engine.default_plan
    c0 = base.compiled
    out_shape = manifest["outputs"][0]["shape"]
    calls = {
        "ort_cpu": make_ort(fused.source, pool=pool, manifest=manifest),
        "mapped_floor": make_mapped_floor(pool=pool, out_shape=out_shape, device=torch.device("cuda")),
    }
    reference = None
    residents = {}
    for grid in grids:
        start = time.time()
        compiled = CompiledStep(c0.program, device=c0.device, source=c0.source.rescheduled(grid))
        plan = StepKernelPlan(compiled, base.input_specs, base.output_specs)
        bindings = {"host_inputs": [in_name], "host_outputs": [out_name], "state_pairs": {}}
        call = frame_call(plan.create_binding(engine, **bindings), pool, in_name, out_name)
        out = np.array(call(0), copy=True)
        reference = out if reference is None else reference
        info = compiled.describe()
        print(
            f"{name} T={seq} grid {grid}: levels {info.get('levels')} tasks {info.get('tasks')} "
            f"compile {time.time() - start:.1f}s diff {np.abs(out - reference).max():.2e}",
            flush=True,
        )
        calls[f"launched-{grid}"] = call
        residents[grid] = plan.create_binding(engine, **bindings, resident=True)
    for key, value in measure_rounds(calls, iters=6000, warmup=500, rounds=6).items():
        if isinstance(value, dict):
            print(f"  {name} T={seq} {key:<16} p50 {value['p50_us']:7.1f} p99 {value['p99_us']:7.1f}", flush=True)
        else:
            print(f"  {name} T={seq} {key:<16} FAILED {value}")
    for grid, binding in residents.items():
        call = frame_call(binding, pool, in_name, out_name)
        out = np.array(call(0), copy=True)
        r = measure_rounds({"r": call}, iters=6000, warmup=500, rounds=1)["r"]
        print(
            f"  {name} T={seq} resident-{grid:<7} p50 {r['p50_us']:7.1f} p99 {r['p99_us']:7.1f} "
            f"diff {np.abs(out - reference).max():.2e}",
            flush=True,
        )
        binding.close()


def main() -> None:
    grids = [int(g) for g in sys.argv[2].split(",")]
    work = Path("/tmp/grid-sweep")
    work.mkdir(exist_ok=True)
    for item in sys.argv[1].split(","):
        name, _, seq = item.partition(":")
        sweep(name, int(seq or 1), grids, work)


if __name__ == "__main__":
    main()
