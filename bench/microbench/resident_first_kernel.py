"""Whether GPU work this process runs beside a resident step kernel on 16 SMs
(Session(resident=True, resident_sms=16)) finishes, or waits for a kernel that ends only when the
session stops it. --case picks the work (CASES); prints the loading mode the driver reports, the case,
then one line, "finished in X s" or "still waiting after X s" (then exits 3 without joining the
stuck thread).

Session 58 (H100 under CUDA_MODULE_LOADING=EAGER; first-kernel also on an H200 under both modes):
first-kernel, sum, item and device-sync wait; used-kernel-no-alloc, new-kernel-no-alloc, alloc,
arange, cummax and item-warm finish. So not the lazy loading of a kernel's module (session 57's
suspect): the process's first torch.sum waits. memset (a first cudaMemsetAsync) is the next
suspect, not run yet (session 59's try failed in the probe itself, CUDA_ERROR_INVALID_CONTEXT: the
thread had no current driver context; it now makes torch's current, and a case that raises prints
"failed: ..." and exits 4). tests/gpu/test_resident.py runs the cases that finish.

    python bench/microbench/resident_first_kernel.py --case sum --wait 10
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


CASES = {
    "first-kernel": "torch kernels this process has not run yet, on new allocations",
    "new-kernel-no-alloc": "a torch kernel not run yet, into memory allocated before the resident kernel",
    "used-kernel-no-alloc": "a torch kernel already run, into memory allocated before",
    "alloc": "a new 256 MB allocation (cudaMalloc), no kernel",
    "arange": "torch.arange (a new allocation and its kernel)",
    "cummax": "torch.cummax of memory allocated before",
    "item": "a sum read back with .item()",
    "sum": "torch's sum kernel, not read back",
    "item-warm": "a sum read back with .item(), one .item() run before the resident kernel",
    "memset": "cuMemsetD8Async into memory allocated before, no torch kernel",
    "device-sync": "torch.cuda.synchronize() (a device-wide wait: expected to wait for the resident kernel)",
}


def _lazy_loading(cuda) -> bool | None:
    """cuModuleGetLoadingMode's answer (None where the driver cannot tell)."""
    try:
        driver = cuda._driver()
        err, mode = driver.cuModuleGetLoadingMode()
    except Exception:  # noqa: BLE001 - no driver, or one without the call
        return None
    return None if int(err) else int(mode) == int(driver.CUmoduleLoadingMode.CU_MODULE_LAZY_LOADING)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="min_gru")
    parser.add_argument("--sms", type=int, default=16)
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the first-use kernel")
    parser.add_argument(
        "--case",
        choices=sorted(CASES),
        default="first-kernel",
        help="what runs beside the resident kernel: " + "; ".join(f"{k}: {v}" for k, v in sorted(CASES.items())),
    )
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from framefuse.engines import cuda_graph
    from framefuse.plugins import cuda
    from framefuse.runtime.pipeline import prepare_cached
    from framefuse.runtime.session import Session

    prepared = prepare_cached(args.arch, {"model": {"embed": 64, "layers": 2}, "seq": 4, "seed": 0})["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
    shape = engine.input_specs[[n for n in engine.input_specs if not n.startswith("state.")][0]].shape
    print(
        f"CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING')} lazy={_lazy_loading(cuda)} "
        f"{torch.cuda.get_device_name()}",
        flush=True,
    )
    # tensors for the cases that must not allocate while the resident kernel runs, and a kernel run
    # before it starts (the allocator's cache then holds blocks; torch.ones's module is loaded)
    a = torch.ones(1 << 16, device="cuda", dtype=torch.int16)
    b = torch.ones(1 << 16, device="cuda", dtype=torch.int16)
    c = torch.empty(1 << 16, device="cuda", dtype=torch.int16)
    if args.case == "item-warm":
        b.sum().item()
    torch.cuda.synchronize()
    session = Session(engine, budget_ms=None, resident=True, resident_sms=args.sms)
    session.step(np.ones(shape, dtype=np.float32))
    assert session._host_step.running
    print(f"case {args.case}: {CASES[args.case]}", flush=True)
    done = threading.Event()
    failure = []

    def first_use():
        try:
            run_case()
        except Exception as exc:  # noqa: BLE001 - reported as the case's result, not as a wait
            failure.append(exc)
        done.set()

    def run_case():
        stream = torch.cuda.current_stream()
        if args.case == "first-kernel":  # kernels this process has not run yet, new allocations
            values = torch.arange(1 << 16, device="cuda", dtype=torch.int16)
            torch.cummax(values, 0).values.sum().item()
        elif args.case == "new-kernel-no-alloc":  # a kernel not run yet, into preallocated memory
            torch.bitwise_xor(a, b, out=c)
            stream.synchronize()
        elif args.case == "used-kernel-no-alloc":  # torch.ones's fill kernel again, preallocated
            c.fill_(1)
            stream.synchronize()
        elif args.case == "alloc":  # a new 256 MB segment from the driver (cudaMalloc), no kernel
            torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
            stream.synchronize()
        elif args.case == "arange":  # a new allocation and torch.arange's kernel
            torch.arange(1 << 16, device="cuda", dtype=torch.int16)
            stream.synchronize()
        elif args.case == "cummax":  # torch.cummax on memory allocated before (it allocates its outputs)
            torch.cummax(a, 0)
            stream.synchronize()
        elif args.case == "sum":  # torch's sum kernel, not read back
            a.sum()
            stream.synchronize()
        elif args.case == "item-warm":  # .item() as "item", after one .item() before the resident kernel
            a.sum().item()
        elif args.case == "item":  # a sum of memory allocated before, read back with .item()
            a.sum().item()
        elif args.case == "memset":
            # a new thread has no current driver context (torch's runtime calls make it current
            # lazily, the driver's do not): without this the memset fails, it does not wait
            cuda.ensure_context(torch.cuda.current_device())
            driver = cuda._driver()
            cuda._check(
                driver.cuMemsetD8Async(c.data_ptr(), 0, c.numel() * c.element_size(), stream.cuda_stream),
                "cuMemsetD8Async",
            )
            stream.synchronize()
        elif args.case == "device-sync":  # waits for every stream, the resident one too
            torch.cuda.synchronize()

    start = time.perf_counter()
    threading.Thread(target=first_use, daemon=True).start()
    if done.wait(args.wait):
        if failure:
            print(f"failed: {type(failure[0]).__name__}: {failure[0]}", flush=True)
            session.close()
            return 4
        print(f"finished in {time.perf_counter() - start:.3f} s", flush=True)
        session.step(np.ones(shape, dtype=np.float32))  # and the resident kernel still answers
        session.close()
        return 0
    print(f"still waiting after {args.wait:.0f} s", flush=True)
    os._exit(3)  # the thread is stuck in the driver; the process's exit stops the resident kernel


if __name__ == "__main__":
    sys.exit(main())
