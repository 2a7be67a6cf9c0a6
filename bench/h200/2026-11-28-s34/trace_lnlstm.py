"""Session 34: the traced step kernel of torch_lnlstm_loop at T = 32 (256 and 384 threads): per task
the blocks' entry / ready / exit times and the phase clocks (the body loop's: its prologue, the loop
until the middle position, that position's levels, the rest)."""

import sys
from pathlib import Path

import torch

sys.path[:0] = ["tests", "."]

from real_models.flow import fuse_real_model  # noqa: E402

from framefuse.compiler import lower_program  # noqa: E402
from framefuse.compiler.engine import CompiledStep, StepKernelPlan  # noqa: E402

run = fuse_real_model("torch_lnlstm_loop", 32, Path("/tmp/exports"))
for threads in (256, 384):
    compiled = CompiledStep(lower_program(run.fused_path), device=torch.device("cuda"), threads=threads, trace=True)
    plan = StepKernelPlan(compiled, compiled.input_specs, compiled.output_specs)
    feeds = {n: torch.randn(s.shape, device="cuda") for n, s in compiled.input_specs.items()}
    for _ in range(20):
        plan.execute(feeds)
    torch.cuda.synchronize()
    print("T 32 threads", threads)
    for row in compiled.timeline():
        print(
            " ",
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
