"""The step compiler's flag waits on the GPU (framefuse/compiler/runtime.cuh): a value that never
arrives traps the kernel after FFK_POLL_LIMIT polls instead of hanging the GPU, and a value that
arrives late, by more than the former clock-cycle limit (2^31 cycles, ~1.1 s on an H100), is still
received (the limit counts polls, so a producer that waits seconds for its turn on a time-sliced GPU
does not kill the context)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
COMPILER = REPO / "framefuse" / "compiler"

SOURCE = r"""
#include "runtime.cuh"

extern "C" __global__ void ffk_test_wait(const unsigned long long* word, unsigned epoch, float* out) {
    out[threadIdx.x] = ffk_ll_wait(word, epoch);
}

extern "C" __global__ void ffk_test_stage(const unsigned long long* words, int n, unsigned epoch, float* out) {
    __shared__ float buf[1024];
    float* const dst[1] = {buf};
    const unsigned long long* const src[1] = {words};
    const int count[1] = {n};
    ffk_ll_stage_n<256, 1>(dst, src, count, epoch);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[i];
}

extern "C" __global__ void ffk_test_store_late(unsigned long long* words, int n, unsigned epoch, float base,
                                               unsigned long long delay_ns) {
    const unsigned long long start = ffk_globaltimer();
    while (ffk_globaltimer() - start < delay_ns) {
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) ffk_ll_store(words + i, base + (float)i, epoch);
}
"""

# one process per trap: a trapped kernel leaves its CUDA context unusable
TRAP_SCRIPT = textwrap.dedent(
    """
    import ctypes, sys, time
    import torch
    from framefuse.plugins import cuda
    source, which = sys.argv[1], sys.argv[2]
    words = torch.zeros(300, dtype=torch.int64, device="cuda")  # epoch 0 everywhere: never current
    out = torch.zeros(300, device="cuda")
    torch.cuda.synchronize()
    options = ("--include-path=" + sys.argv[3],)
    t0 = time.perf_counter()
    if which == "wait":
        k = cuda.get_kernel(source, "ffk_test_wait", options)
        k.launch(1, 32, [cuda.ptr(words), ctypes.c_uint(1), cuda.ptr(out)])
    else:
        k = cuda.get_kernel(source, "ffk_test_stage", options)
        k.launch(1, 256, [cuda.ptr(words), cuda.i32(300), ctypes.c_uint(1), cuda.ptr(out)])
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        print(f"TRAPPED {time.perf_counter() - t0:.2f} s: {str(exc).splitlines()[0]}")
        sys.exit(0)
    print(f"RETURNED {time.perf_counter() - t0:.2f} s")
    sys.exit(1)
    """
)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ffk_runtime") / "ffk_runtime_test.cu"
    path.write_text(SOURCE)
    return path


@pytest.mark.parametrize("which", ["wait", "stage"])
def test_a_value_that_never_arrives_traps_the_kernel_instead_of_hanging(source, which):
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", TRAP_SCRIPT, str(source), which, str(COMPILER)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    elapsed = time.perf_counter() - t0
    print(proc.stdout.strip(), f"(process {elapsed:.1f} s)")
    assert proc.returncode == 0 and "TRAPPED" in proc.stdout, proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("which", ["wait", "stage"])
def test_a_value_late_by_longer_than_the_former_cycle_limit_is_received(source, which):
    import ctypes

    import torch

    from framefuse.plugins import cuda

    options = (f"--include-path={COMPILER}",)
    n = 300
    words = torch.zeros(n, dtype=torch.int64, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    waiting, storing = torch.cuda.Stream(), torch.cuda.Stream()
    delay_ns = 1_500_000_000  # 1.5 s: past 2^31 cycles at the H100's 1.98 GHz, short of 2^24 polls

    def wait(epoch):
        if which == "wait":
            consumer.launch(1, 32, [cuda.ptr(words), ctypes.c_uint(epoch), cuda.ptr(out)], stream=waiting)
        else:
            consumer.launch(1, 256, [cuda.ptr(words), cuda.i32(n), ctypes.c_uint(epoch), cuda.ptr(out)], stream=waiting)

    def store(epoch, delay):
        args = [cuda.ptr(words), cuda.i32(n), ctypes.c_uint(epoch), ctypes.c_float(0.5), ctypes.c_ulonglong(delay)]
        producer.launch(1, 128, args, stream=storing)

    consumer = cuda.get_kernel(source, f"ffk_test_{which}", options)
    producer = cuda.get_kernel(source, "ffk_test_store_late", options)
    # Launch each kernel once before the test: with CUDA's lazy loading a kernel is loaded at its
    # first launch, and a load waits for the running kernels, the spinning consumer among them.
    wait(0)
    store(0, 0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    wait(7)
    store(7, delay_ns)
    expect = torch.full((32,), 0.5) if which == "wait" else 0.5 + torch.arange(n, dtype=torch.float32)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(f"{which}: received after {elapsed:.2f} s")
    assert elapsed >= delay_ns * 1e-9, "the producer did not delay: the test would prove nothing"
    assert torch.equal(out[: expect.numel()].cpu(), expect)
