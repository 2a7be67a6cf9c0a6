"""Attention kernel vs torch's F.scaled_dot_product_attention on the GPU (CUDA-event timing of
the kernels alone, launches replayed from a captured CUDA graph so Python launch cost is out).

    python -m framefuse.plugins.attention.benchmark [--iters 200]

Shapes: batch 1, embed 256 = 4 heads × 64 (the game models), causal, T ∈ {32, 128, 1024, 4096}
(sequence form) and the step form (one query against a window of W keys), fp16/bf16/fp32.
Prints microseconds per call and the ratio SDPA time / framefuse time (> 1: framefuse faster).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def _graph_time_us(fn, iters: int) -> float:
    fn()  # warm-up (loads / compiles kernels, picks SDPA backends)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / (iters * 10)


def main(argv=None) -> None:
    from framefuse.plugins.attention import launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args(argv)
    heads, dh = 4, 64
    print(f"{torch.cuda.get_device_name()}  B=1 H={heads} Dh={dh} causal")
    print(f"{'form':>10} {'T':>6} {'dtype':>9} {'framefuse us':>13} {'sdpa us':>9} {'sdpa/ff':>8}")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for form, tq, tk in (("step", 1, 32), ("step", 1, 128), ("sequence", 32, 32), ("sequence", 128, 128),
                             ("sequence", 1024, 1024), ("sequence", 4096, 4096)):
            q = torch.randn(1, heads, tq, dh, device="cuda", dtype=dtype)
            k = torch.randn(1, heads, tk, dh, device="cuda", dtype=dtype)
            v = torch.randn(1, heads, tk, dh, device="cuda", dtype=dtype)
            o = torch.empty_like(q)
            causal = int(tq > 1)
            ours = _graph_time_us(lambda: launch([q, k, v], {"causal": causal}, outputs=[o]), args.iters)
            theirs = _graph_time_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)), args.iters)
            name = str(dtype).removeprefix("torch.")
            print(f"{form:>10} {tk:>6} {name:>9} {ours:>13.2f} {theirs:>9.2f} {theirs / ours:>8.2f}")


if __name__ == "__main__":
    main()
