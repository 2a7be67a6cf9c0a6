"""Where the frame block's time goes before the frame's scalars are out (H100 investigation tool).

The traced kernel (CompiledStep(trace=True)) stamps each task's phases; this adds SM-clock stamps
inside the one block that reads the frame from host memory (the FrameConcat task,
compiler/simplify.PublishFrameScalars) and prints them in cycles after that block entered the
kernel, median of 30 launches:

  ranges      the range table read into shared memory (the first global round trip)
  prologue    the prologue's prefetch copies issued (PROLOGUE_GROUPS commit groups)
  x_arrived   the frame's value in warp 0's register (read at kernel entry; an upper bound:
              stamped at the frame task's start)
  R_landed    the frame task's own copies landed (its cp.async wait)
  after_bar   ... and the barrier after it
  staged      the frame in shared memory
  Rx_done     the product R·x (a barrier added after it, to split the phase)
  mean_done   the phase's other products (the mean's row, before the centred variance)
  sumsq       the sum of squares;  end: the scalars stored (flagged words)

It patches the generated source text (the stamps go where the comments and calls of
codegen.Generator put them), so it breaks loudly when the generator's output changes shape.

    python bench/microbench/frame_probe.py attention min_gru lstm
    python bench/microbench/frame_probe.py codegen.COPIES_AFTER_LEVEL=2 attention   # a setting
"""

from __future__ import annotations

import importlib
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NAMES = ["ranges", "prologue", "x_arrived", "R_landed", "after_bar", "staged", "Rx_done", "mean_done", "sumsq", "end"]


def probed_source(src: str, tf: int, fb: int, n: int) -> str:
    """The traced source with stamps 8-13 in the frame task's trace row (slots 0-7 are its own)."""

    def slot(k: int) -> str:
        return f"ffk_trace[(b * {n} + {tf}) * 16 + {k}]"

    def at_frame_block(k: int) -> str:
        return f"if (b == {fb} && tid == 0) {slot(k)} = clock64();"

    # the value read from host memory stored first, then the clock: a warp issues in order, so the
    # clock is read only once the load has returned
    x_probe = (
        f'if (tid == 0) {{ asm volatile("st.volatile.global.f32 [%0], %1;" :: "l"((float*)&{slot(14)}), '
        f'"f"(ffk_host{tf}) : "memory"); unsigned long long c; '
        f'asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory"); {slot(13)} = c; }}'
    )
    out, state = [], 0
    for line in src.split("\n"):
        if state == 0 and f"ffk_trace[(b * {n} + {n - 1}) * 16 + 0] = ffk_globaltimer();" in line:
            out += [line, at_frame_block(8)]
            state = 1
        elif state == 1 and line.strip() == "__syncthreads();":
            out += [line, at_frame_block(9)]
            state = 2
        elif state == 2 and f"ffk_trace[(b * {n} + {n - 1}) * 16 + 1] = ffk_globaltimer();" in line:
            out += [at_frame_block(10), line]
            state = 3
        elif state == 3 and re.search(rf"// task {tf}: frame", line):
            out.append(line)
            state = 4
        elif state == 4 and "ffk_prefetch_wait" in line:
            out += [x_probe, line, f"if (tid == 0) {slot(11)} = clock64();"]
            state = 5
        elif state == 5 and "// array" in line and "(R·x)" not in line and "dot products" in line:
            out += ["__syncthreads();", f"if (tid == 0) {slot(12)} = clock64();", line]
            state = 6
        elif state == 5 and "// array" in line and "sum over" in line:  # no other product: R·x ends here
            out += [f"if (tid == 0) {slot(12)} = clock64();", line]
            state = 6
        else:
            out.append(line)
    if state != 6:
        raise SystemExit(f"frame_probe: the generated source is not shaped as expected (stopped at step {state})")
    return "\n".join(out)


def main() -> int:
    import numpy as np
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.codegen import KERNEL_NAME
    from framefuse.compiler.engine import CompiledStep
    from framefuse.compiler.ir import FrameConcat
    from framefuse.engines.fusion import example_feeds
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.plugins import cuda
    from framefuse.runtime.pipeline import prepare_cached

    for setting in [a for a in sys.argv[1:] if "=" in a]:
        key, value = setting.split("=")
        module, constant = key.rsplit(".", 1)
        setattr(importlib.import_module(f"framefuse.compiler.{module}"), constant, int(value))
    for arch in [a for a in sys.argv[1:] if "=" not in a]:
        prepared = prepare_cached(arch, {"seq": 32, "seed": 0})["step"]
        compiled = CompiledStep(lower_program(str(prepared.fused)), device=torch.device("cuda"), trace=True)
        tasks = compiled.schedule.tasks
        tf = next(i for i, t in enumerate(tasks) if isinstance(t.root, FrameConcat))
        fb = tasks[tf].first
        path = Path(tempfile.mkdtemp(prefix="ff-probe-")) / f"{arch}-probe.cu"
        path.write_text(probed_source(compiled.kernel.source, tf, fb, len(tasks) + 1))
        compiled.fn = cuda.get_kernel(path, KERNEL_NAME, compiled.nvrtc_options)
        if compiled.kernel.smem_bytes > 48 * 1024:
            compiled.fn.set_max_dynamic_shared_memory(compiled.kernel.smem_bytes)
        plan = StepKernelPlan.of(compiled)
        feeds = example_feeds(plan)
        rows = []
        for _ in range(40):
            plan.execute(feeds)
            torch.cuda.synchronize()
            r = compiled.trace.cpu().numpy().astype(np.float64)[fb, tf]
            rows.append([r[k] - r[8] for k in (9, 10, 13, 11, 3, 4, 12, 5, 6, 7)])
        medians = np.median(np.array(rows[10:]), axis=0)
        print(f"{arch} frame task {tf} block {fb} cycles after kernel entry (median of 30 launches):")
        print("  " + "  ".join(f"{k} {int(v)}" for k, v in zip(NAMES, medians)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
