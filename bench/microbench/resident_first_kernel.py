"""Whether a CUDA kernel this process runs for the first time finishes while a resident step kernel
holds 16 SMs (Session(resident=True, resident_sms=16)): under CUDA's lazy loading the kernel's
module is loaded on that first use, and CUDA's programming guide warns that a load may synchronize
the context, which would wait for a kernel that ends only when the session stops it.

    CUDA_MODULE_LOADING=LAZY  python bench/microbench/resident_first_kernel.py   # expected: waits
    CUDA_MODULE_LOADING=EAGER python bench/microbench/resident_first_kernel.py   # expected: finishes

Prints one line, "finished in X s" or "still waiting after X s" (then exits 3 without joining the
stuck thread), after the loading mode the driver reports. tests/gpu/test_resident.py runs it under
EAGER (the documented remedy)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="min_gru")
    parser.add_argument("--sms", type=int, default=16)
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the first-use kernel")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from framefuse.engines import cuda_graph
    from framefuse.engines.stepkernel import lazy_module_loading
    from framefuse.runtime.pipeline import prepare_cached
    from framefuse.runtime.session import Session

    prepared = prepare_cached(args.arch, {"model": {"embed": 64, "layers": 2}, "seq": 4, "seed": 0})["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
    shape = engine.input_specs[[n for n in engine.input_specs if not n.startswith("state.")][0]].shape
    print(
        f"CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING')} lazy={lazy_module_loading()} "
        f"{torch.cuda.get_device_name()}",
        flush=True,
    )
    session = Session(engine, budget_ms=None, resident=True, resident_sms=args.sms)
    session.step(np.ones(shape, dtype=np.float32))
    assert session._host_step.running
    done = threading.Event()

    def first_use():  # kernels this process has not run yet: a cumulative max over int16
        values = torch.arange(1 << 16, device="cuda", dtype=torch.int16)
        torch.cummax(values, 0).values.sum().item()
        done.set()

    start = time.perf_counter()
    threading.Thread(target=first_use, daemon=True).start()
    if done.wait(args.wait):
        print(f"finished in {time.perf_counter() - start:.3f} s", flush=True)
        session.step(np.ones(shape, dtype=np.float32))  # and the resident kernel still answers
        session.close()
        return 0
    print(f"still waiting after {args.wait:.0f} s", flush=True)
    os._exit(3)  # the thread is stuck in the driver; the process's exit stops the resident kernel


if __name__ == "__main__":
    sys.exit(main())
