#!/usr/bin/env python
"""The head on the host (compiler/tail.py), host to host: a resident step kernel of the whole
program against one of the program less its last level followed by the tail's C++ function on
the host, each frame through hostpath.c's frame call (the bell, the spin, the tagged words
unpacked) as Session.step makes it. Both kernels write tagged outputs (codegen.TAGGED_OUTPUTS),
so the difference is the level and where the head runs.

The tail's function reads the frontier values where the binding unpacks them (its input pointers
are the binding's host_out arrays) and is called by hostpath.c once the frame's words are taken
(the FrameState's tail; through ctypes where hostpath.c is not built, or a frame that Python
finished): its call is also timed alone (hostpath.c's tail_ns). Outputs compared within 1e-5 over
200 chained frames (the head's sums run in another order on the CPU).

    python bench/microbench/host_tail.py --archs min_gru,gru,mamba --out /tmp/host_tail.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def _binding(compiled, program):
    from framefuse.engines.stepkernel import StepKernelPlan

    state_outputs = set(program.state_of.values())
    return StepKernelPlan.of(compiled).create_binding(
        None,
        host_inputs=list(program.inputs),
        host_outputs=[n for n in program.outputs if n not in state_outputs],
        state_pairs={out: state for state, out in program.state_of.items()},
        resident=True,
    )


def _frame_call(binding):
    """One frame: hostpath.c's call where it is built, the binding's Python methods where not."""
    native = binding.native_frame(None)
    if native is None:

        def frame():
            binding.launch()
            binding.wait_host()

        return frame
    call, argument = native

    def frame():
        code = call(argument)
        if code != 0 and binding.native_failed(code):
            raise RuntimeError(f"frame failed: {code}")

    return frame


def _percentiles(times_ns) -> dict:
    t = np.sort(np.asarray(times_ns, dtype=np.float64)) / 1000.0
    return {"p50_us": float(t[len(t) // 2]), "p99_us": float(t[int(len(t) * 0.99)]), "n": len(t)}


def main() -> int:
    import tempfile

    import torch

    from framefuse.compiler import codegen, cstep, lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.compiler.tail import split_host_tail
    from framefuse.engines.fusion import STEPKERNELS
    from framefuse.runtime.pipeline import prepare

    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default="min_gru,gru,mamba")
    parser.add_argument("--select", default="stepkernel-384-threads-fewer-phases", help="a STEPKERNELS tactic")
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="framefuse-tail-"))
    device = torch.device("cuda")
    codegen.TAGGED_OUTPUTS = True
    rows = []
    for arch in args.archs.split(","):
        prepared = prepare(arch, root / arch)["step"]
        tactic = dict(STEPKERNELS[args.select])
        lowering = {k: tactic.pop(k) for k in ("compose_input", "roll_recurrences", "split") if k in tactic}
        program = lower_program(prepared.fused, **lowering)
        whole = CompiledStep(program, device=device, **tactic)
        cut = split_host_tail(program, whole.schedule)
        if isinstance(cut, str):
            print(f"{arch}: no host tail: {cut}", flush=True)
            continue
        cut_step = CompiledStep(cut.device, device=device, **tactic)
        tail = cstep.Runner(cstep.generate(cut.tail, lanes=True))
        b_whole, b_cut = _binding(whole, program), _binding(cut_step, cut.device)
        # the tail reads the frontier floats where the binding unpacks them: no copy
        tail.inputs = {name: b_cut.host_out[name] for name in tail.step.input_names}
        tail._io = [tail._make_io(parity) for parity in range(2)]
        tail._io_addresses = [ctypes.addressof(io) for io in tail._io]
        outputs = [n for n in program.outputs if n not in set(program.state_of.values())]
        (frame_name,) = program.inputs
        pool = np.random.default_rng(0).standard_normal((64, *program.inputs[frame_name].shape)).astype(np.float32)
        f_whole, f_cut = _frame_call(b_whole), _frame_call(b_cut)
        native = b_cut.native_frame(None) is not None
        if native:  # hostpath.c calls the tail once the frame's words are taken (its tail_ns times it)
            b_cut._hs.tail, b_cut._hs.tail_io = tail.function, tail.io_address(0)
        # two resident kernels do not share the GPU: each binding's kernel is stopped (close)
        # before the other's first frame launches it again
        answers = {"whole": [], "cut+tail": []}
        for i in range(200):
            b_whole.host_in[frame_name][...] = pool[i % 64]
            f_whole()
            answers["whole"].append({n: b_whole.host_out[n].copy() for n in outputs})
        b_whole.close()
        for i in range(200):
            b_cut.host_in[frame_name][...] = pool[i % 64]
            f_cut()
            if not native or b_cut._hs.tail_ns == 0:  # the Python path finished the frame: no tail ran
                tail.call(0)
            b_cut._hs.tail_ns = 0
            answers["cut+tail"].append({n: tail.outputs[n].copy() for n in outputs})
        b_cut.close()
        diff = max(
            float(np.abs(a[n] - b[n]).max()) for a, b in zip(answers["whole"], answers["cut+tail"]) for n in outputs
        )
        times = {"whole": [], "cut+tail": [], "tail call": []}
        for _ in range(args.rounds):
            for name in ("whole", "cut+tail"):
                b = b_whole if name == "whole" else b_cut
                frame = f_whole if name == "whole" else f_cut
                x = b.host_in[frame_name]
                for i in range(args.iters + 200):
                    x[...] = pool[i % 64]
                    start = time.perf_counter_ns()
                    frame()
                    middle = time.perf_counter_ns()
                    if name == "cut+tail" and (not native or b._hs.tail_ns == 0):
                        tail.call(0)
                    end = time.perf_counter_ns()
                    if i >= 200:
                        times[name].append(end - start)
                        if name == "cut+tail":
                            times["tail call"].append(b._hs.tail_ns if native and b._hs.tail_ns else end - middle)
                    b._hs.tail_ns = 0
                b.close()
        row = {
            "arch": arch,
            "select": args.select,
            "levels": [whole.schedule.levels(), cut_step.schedule.levels()],
            "tail_macs": cut.macs,
            "max_abs_diff": diff,
            **{name: _percentiles(t) for name, t in times.items()},
            "device": torch.cuda.get_device_name(device),
        }
        rows.append(row)
        print(
            f"{arch}: levels {row['levels'][0]} -> {row['levels'][1]}; p50/p99 us whole {row['whole']['p50_us']:.2f}/"
            f"{row['whole']['p99_us']:.2f}  cut+tail {row['cut+tail']['p50_us']:.2f}/{row['cut+tail']['p99_us']:.2f}"
            f"  (the tail's ctypes call {row['tail call']['p50_us']:.2f}/{row['tail call']['p99_us']:.2f}); "
            f"max |diff| {diff:.2e}",
            flush=True,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
