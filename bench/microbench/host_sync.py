#!/usr/bin/env python
"""How the host learns that a step is done: the host-side cost of one graph replay of one kernel
that reads its frame from and writes its output to pinned mapped host memory (the mapped floor),
with the wait done three ways, and the Python work Session.step wraps around it.

  stream-sync   cuGraphLaunch, then cuStreamSynchronize (what the mapped floor does)
  flag          the kernel writes its output, fences (__threadfence_system) and writes the launch's
                epoch into a mapped word; the host spins on that word and returns (the kernel may
                still be retiring: the next launch on the stream is ordered after it anyway)
  flag+query    flag, then cuStreamQuery once (the cost of also collecting the kernel's status)

Also: the per-call cost of the Python statements Session.step runs around launch and wait.

    python bench/microbench/host_sync.py --out /tmp/host_sync.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "bench"):  # framefuse, and bench/e2e.py's measure
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

SOURCE = r"""
extern "C" __global__ void floor_flag(const float* x, float* y, unsigned* flag, unsigned* counter, int n_in, int n_out, int use_flag) {
    const int i = threadIdx.x;
    __shared__ unsigned epoch;
    if (i == 0) { epoch = *counter + 1; }
    __syncthreads();
    float v = 0.0f;
    if (i < n_in) v = *(volatile const float*)(x + i);
    if (i < n_out) y[i] = v * 2.0f;
    if (use_flag) {
        __threadfence_system();
        __syncthreads();
        if (i == 0) { *(volatile unsigned*)flag = epoch; *counter = epoch; }
    } else if (i == 0) {
        *counter = epoch;
    }
}
"""


def timed(call, iters: int, warmup: int) -> dict:
    """bench/e2e.py's measure: p50 / p99 / mean µs of ``call(i)``."""
    from e2e import measure

    return measure(call, iters=iters, warmup=warmup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from framefuse.engines.stepkernel import MappedHostBuffer, _FastLaunch
    from framefuse.plugins import cuda

    folder = Path(tempfile.mkdtemp(prefix="ff-hostsync-"))
    src = folder / "floor_flag.cu"
    src.write_text(SOURCE)
    fn = cuda.get_kernel(src, "floor_flag")
    n_in, n_out = 64, 32
    x, y = MappedHostBuffer((n_in,)), MappedHostBuffer((n_out,))
    flag = MappedHostBuffer((1,), dtype=np.uint32)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    pool = np.random.default_rng(0).standard_normal((64, n_in)).astype(np.float32)
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuStreamQuery.argtypes = [ctypes.c_void_p]
    lib.cuStreamQuery.restype = ctypes.c_int
    flag_word = ctypes.c_uint32.from_address(flag.array.ctypes.data)

    graphs = []
    launchers = {}
    for use_flag in (0, 1):
        graph = torch.cuda.CUDAGraph()
        kargs = [
            ctypes.c_void_p(x.device_ptr),
            ctypes.c_void_p(y.device_ptr),
            ctypes.c_void_p(flag.device_ptr),
            ctypes.c_void_p(counter.data_ptr()),
            ctypes.c_int(n_in),
            ctypes.c_int(n_out),
            ctypes.c_int(use_flag),
        ]
        with torch.cuda.graph(graph, stream=stream):
            fn.launch(1, 64, kargs)
        graphs.append(graph)
        launchers[use_flag] = _FastLaunch(int(graph.raw_cuda_graph_exec()), int(stream.cuda_stream))
    torch.cuda.synchronize()

    plain = launchers[0]
    launch, sync, exe, st = plain.launch_fn, plain.sync_fn, plain.exec_handle, plain.stream

    def stream_sync(i):
        np.copyto(x.array, pool[i % 64])
        launch(exe, st)
        sync(st)

    flagged = launchers[1]
    fexe = flagged.exec_handle
    state = {"epoch": 0}

    def flag_wait(i):
        np.copyto(x.array, pool[i % 64])
        state["epoch"] += 1
        epoch = state["epoch"]
        launch(fexe, st)
        while flag_word.value != epoch:
            pass

    query = lib.cuStreamQuery

    def flag_query(i):
        flag_wait(i)
        query(st)

    # the flag variants share the epoch counter: run them after each other, stream-sync in between
    results["stream_sync"] = timed(stream_sync, args.iters, args.warmup)
    sync(st)
    state["epoch"] = int(counter.item())
    results["flag"] = timed(flag_wait, args.iters, args.warmup)
    sync(st)
    state["epoch"] = int(counter.item())
    results["flag_query"] = timed(flag_query, args.iters, args.warmup)
    sync(st)
    results["stream_sync_again"] = timed(stream_sync, args.iters, args.warmup)
    ok = np.allclose(y.array, 2 * pool[(args.iters - 1) % 64][:n_out])  # the last call was i = iters - 1
    results["output_correct"] = bool(ok)

    # the Python statements around launch and wait in Session.step
    ring = np.zeros(4096, dtype=np.int64)
    clock = time.perf_counter_ns
    frame = pool[0]
    buf = x.array

    def nothing(i):
        return None

    results["python"] = {
        "empty_call": timed(nothing, args.iters, 100),
        "perf_counter_ns_x2": timed(lambda i: (clock(), clock()), args.iters, 100),
        "copyto_64": timed(lambda i: np.copyto(buf, frame), args.iters, 100),
        "ring_setitem": timed(lambda i: ring.__setitem__(i & 4095, i), args.iters, 100),
        "ctypes_query": timed(lambda i: query(st), args.iters, 100),
    }
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
