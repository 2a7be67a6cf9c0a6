#!/usr/bin/env python
"""End-to-end benchmark: framefuse's engine against its peers and against the floor, one process.

Sections (``--section``, comma-separated or ``all``; default ``zoo``):

  zoo        every zoo architecture (embed 256, 2 layers, batch 1), T = 1 (step form: state carried
             on the device) and T = --seq (sequence form)
  real       models written by others (tests/real_models: transformers GPT-2 sdpa, Llama with grouped
             KV heads, Mamba, Jamba; torch.nn LSTM, GRU and RNN bidirectional), T = --seq and T = 1.
             These models have only a sequence form: T = 1 is a length-1 sequence, not a step.
  precision  the framefuse engine of each zoo architecture's step form at fp32 / fp16 / bf16 / int8
             (graphs as ``framefuse build --precision`` makes them: the accuracy gate and the int8
             fallback included), with the accuracy report's max abs error and argmax agreement over
             a 1000-frame rollout; an architecture's precisions and its floor timed in the same
             interleaved rounds

Every row times host input → host output per call (the same ``measure_rounds`` for every engine:
all of a row's engines are built first, then timed in --rounds interleaved rounds, so each samples
the same windows of the host; the resident kernel and torch.compile reduce-overhead are timed
alone, after: reduce-overhead's CUDA graph trees broke graphs captured before them) for

  framefuse                  the cuda-graph engine as ``framefuse build`` makes it: build-time
                             selection ``select="time"`` with model.onnx as the unfused candidate
                             (the chosen candidate and the selection timings are in the row)
  framefuse (unfused graph)  ablation: the engine on the graph before the rewrite, no selection
  framefuse (driver replay)  ablation: the built engine replayed with cuGraphLaunch (cuda-python)
  framefuse (resident kernel)  when the build chose the step kernel: the same engine with
             Session(resident=True), the kernel launched once and rung per call (the step form's
             frame with its state on the device; a graph without state, as the sequence form and
             the real models are, the whole graph on each call's input)
and the peers (the best peer = the lowest p50 among them, per row):
  torch eager                the torch module, pinned host buffers, async copies, one sync
  torch eager + CUDA graph   the same torch code captured in one CUDA graph, copies inside
  torch.compile RO           torch.compile(mode="reduce-overhead") (inductor's own cudagraphs)
  torch.compile AT + graph   torch.compile(mode="max-autotune-no-cudagraphs") kernels captured by
                             hand in a torch.cuda.CUDAGraph with static input/output buffers
  ONNX Runtime CPU           the original, unfused graph
and three floors: a CUDA graph holding only the pinned host→device input copy, one trivial kernel and
the device→host output copy, replayed and synchronised ("floor"); a CUDA graph of one trivial
kernel that reads the frame from and writes the output to pinned, mapped host memory, launched and
stream-synchronised ("mapped floor": what a one-kernel step cannot go below); and the same kernel
raising a done word, launched and waited on through engines/hostpath.c exactly as Session.step
waits on the step kernel ("mapped floor, done word", 1.4-2 µs lower on an H200). Every p50 is also
given as a multiple of the first two, and framefuse's of the third.

When the build chose the step compiler's kernel, framefuse's row also gives its dependency levels
and the cost of one level (the profiled kernel time per call / levels).

Per row the JSON also holds, for framefuse and the best torch peer, the kernels per call and the
summed kernel time per call (torch.profiler, CUDA activity, over --profile-calls replays).

Outputs under --out: e2e.json (everything), e2e.md, e2e.png. Results are rewritten after every
row, so a run cut short keeps what it measured; --time-budget stops starting new work after N s.

    python bench/e2e.py --section zoo --out /tmp/zoo                    # full run: every peer, every T
    python bench/e2e.py --section real --out /tmp/real
    python bench/e2e.py --section precision --archs mamba,lstm --out /tmp/prec
    python bench/e2e.py --merge /tmp/zoo/e2e.json /tmp/real/e2e.json /tmp/prec/e2e.json --out bench/h100
    python bench/e2e.py --device cpu --quick --archs min_gru --iters 5 --out /tmp/b   # smoke test
    python bench/e2e.py --archs xlstm --forms sequence --out /tmp/x   # one long T = 32 row by itself

On the lab's H100 the torch.compile peers' compiles take most of a full run (xlstm's T = 32 row
alone ran past 8 minutes, mostly max-autotune). Split the zoo over calls of at most 10 minutes
(--archs, --forms, --time-budget), point TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at an ignored
folder of the checkout (the device machine keeps ignored build outputs between calls while it is
held), and merge the parts with --merge: every row holds all of its peers from one process.
A row whose builds alone outlast one call (xlstm at T = 32: max-autotune 331 s, reduce-overhead
81 s and framefuse's build 194 s from cold caches, H100, 2026-11-27) fills the caches first with
--prebuild, which builds the named engines one after the other, times nothing and writes a report
that --merge refuses; the row itself then runs whole in the next call on the same machine:

    python bench/e2e.py --archs xlstm --forms sequence --prebuild torch_compile_autotune_graph,torch_compile --out /tmp/p
    python bench/e2e.py --archs xlstm --forms sequence --out /tmp/x
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BUDGET_MS = 1000.0 / 60.0
POOL = 64  # distinct random inputs cycled through the timed calls
ROUNDS = 5  # interleaved timing rounds a row (see bench_row)
SECTIONS = ("zoo", "real", "precision")
ROW_KEYS = {"zoo": "rows", "real": "real_rows", "precision": "precision_rows"}
TORCH_PEERS = ("torch_eager", "torch_cuda_graph", "torch_compile", "torch_compile_autotune_graph")
PEERS = (*TORCH_PEERS, "ort_cpu")
GPU_ONLY = (
    "torch_cuda_graph",
    "torch_compile",
    "torch_compile_autotune_graph",
    "floor",
    "mapped_floor",
    "mapped_floor_done",
)
COMPILE_PEERS = ("torch_compile", "torch_compile_autotune_graph")
ABLATIONS = ("framefuse_unfused", "framefuse_driver", "framefuse_resident")
FORMS = ("step", "sequence")
FLOOR = "floor"
MAPPED_FLOOR = "mapped_floor"
# the mapped floor's kernel raising a done word, waited on through engines/hostpath.c as
# Session.step waits on the step kernel (no cuStreamSynchronize): reported beside, not the ratio's
MAPPED_FLOOR_DONE = "mapped_floor_done"
FLOORS = (FLOOR, MAPPED_FLOOR, MAPPED_FLOOR_DONE)
ENGINE_LABELS = {
    "framefuse": "framefuse",
    "framefuse_unfused": "framefuse (unfused graph)",
    "framefuse_driver": "framefuse (driver replay)",
    "framefuse_resident": "framefuse (resident kernel)",
    "torch_eager": "torch eager",
    "torch_cuda_graph": "torch eager + CUDA graph",
    "torch_compile": "torch.compile reduce-overhead",
    "torch_compile_autotune_graph": "torch.compile max-autotune + CUDA graph",
    "ort_cpu": "ONNX Runtime CPU",
    "floor": "floor (H2D + 1 kernel + D2H graph)",
    "mapped_floor": "mapped floor (1 kernel on mapped host memory)",
    "mapped_floor_done": "mapped floor, done word (waited on as Session.step waits)",
}
# tests/real_models entries benchmarked by --section real (--models overrides)
REAL_MODELS = (
    "gpt2_sdpa",
    "llama_gqa_sdpa",
    "mamba",
    "jamba",
    "torch_lstm_bidir",
    "torch_gru_bidir",
    "torch_rnn_bidir",
    "torch_rnncell_loop",
    "torch_mlpcell_loop",
    "torch_lnlstm_loop",
)
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
QUICK_NOTE = "quick: not for publication"
PREBUILD_NOTE = "prebuild: engines built to fill the compile caches, nothing timed"


def say(message: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]


# ---------------------------------------------------------------------------------------------
# timing


def measure(call: Callable[[int], object], *, iters: int, warmup: int, between=None) -> dict:
    """Time ``call(i)`` (one host→host inference) ``iters`` times after ``warmup`` calls;
    ``between()`` (a framegap.FrameGap: --frame-gap, --frame-hz) runs before each timed call, off the clock."""
    for i in range(warmup):
        call(i)
    ns = np.empty(iters, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(iters):
        if between is not None:
            between()
        start = clock()
        call(i)
        ns[i] = clock() - start
    return latency_stats(ns)


def latency_stats(ns: np.ndarray) -> dict:
    """p50 / p99 / mean / max (µs) and frames a second of per-call durations in ns."""
    us = ns / 1e3
    p50, p99 = np.percentile(us, [50, 99])
    return {
        "p50_us": float(p50),
        "p99_us": float(p99),
        "mean_us": float(us.mean()),
        "max_us": float(us.max()),
        "fps": float(1e6 / p50),
        "iters": int(us.size),
    }


ROUND_ORDER = "rotated"  # the results' config says so: runs before 2026-12-02 kept one order


def measure_rounds(calls: dict, *, iters: int, warmup: int, rounds: int, between=None) -> dict:
    """measure() of every call in ``calls`` interleaved: ``warmup`` untimed calls each, then
    ``rounds`` rounds in which each call is timed ``iters / rounds`` times in turn (a block of
    calls, not one call each: switching engines on every call would time the switch), the order
    rotated by one each round so that no engine always takes the same place in a round (the H200
    precision runs of 2026-12-02 timed them in a fixed order, fp32 first). An engine that raises is
    left out of the later rounds; its entry is the exception. ``between()`` as in measure()."""
    per_round = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
    samples: dict = {name: [] for name in calls}
    failed: dict = {}
    clock = time.perf_counter_ns
    for name, call in calls.items():
        try:
            for i in range(warmup):
                call(i)
        except Exception as exc:  # noqa: BLE001
            failed[name] = exc
    done = 0
    names = list(calls)
    for r, n in enumerate(per_round):
        first = r % max(1, len(names))
        for name in names[first:] + names[:first]:
            call = calls[name]
            if name in failed:
                continue
            ns = np.empty(n, dtype=np.int64)
            try:
                for k in range(n):
                    if between is not None:
                        between()
                    start = clock()
                    call(done + k)
                    ns[k] = clock() - start
            except Exception as exc:  # noqa: BLE001
                failed[name] = exc
                continue
            samples[name].append(ns)
        done += n
    out: dict = dict(failed)
    for name in calls:
        if name in failed:
            continue
        out[name] = {
            **latency_stats(np.concatenate(samples[name])),
            "rounds": len(samples[name]),
            # how far the host's windows moved this engine's median
            "round_p50_us": [float(np.percentile(x / 1e3, 50)) for x in samples[name]],
        }
    return out


def _finish_engine(row: dict, name: str, call, result: dict, *, settings, dev) -> None:
    """After an engine's timing: its own check, what its call carries (build, selection, graph
    replays), its kernels a call (profiled while it is still alive) and the log line."""
    if hasattr(call, "check"):
        result["output_correct"] = call.check()
    result.update(getattr(call, "extra", {}))
    engine = getattr(call, "engine", None)
    if engine is not None:
        result["replays"] = engine.replays
        result["captures"] = engine.captures
    if (
        dev.type == "cuda"
        and settings.profile_calls > 0
        and name not in FLOORS
        and name != "ort_cpu"
        and "kernels" not in result
    ):
        try:
            result["kernels"] = kernel_profile(call, calls=settings.profile_calls, device=dev)
        except Exception as exc:  # noqa: BLE001
            result["kernels"] = {"error": _error(exc)}
    row["engines"][name] = result
    err = f"  err {result['max_abs_err_vs_ort']:.1e}" if "max_abs_err_vs_ort" in result else ""
    chosen = f"  [{result['selection'].get('chosen')}]" if "selection" in result else ""
    say(
        f"  {row['arch']:16s} T={row['T']:<3d} {ENGINE_LABELS[name]:40s} p50 {result['p50_us']:9.1f} us  "
        f"p99 {result['p99_us']:9.1f} us{err}  (setup {result['setup_s']:.1f} s){chosen}"
    )


def _engine_failed(row: dict, name: str, exc: BaseException) -> None:
    message = _error(exc)
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=6))
    row["engines"][name] = {"error": message, "traceback": trace}
    say(f"  {row['arch']:16s} T={row['T']:<3d} {ENGINE_LABELS[name]:40s} FAILED: {message}")


def max_abs_err(actual, expected) -> float:
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf")
    return float(np.abs(a - e).max()) if a.size else 0.0


_PROFILER_READY = False


def init_profiler(device) -> None:
    """Start CUPTI once before any graph is captured (cheap; kernels of graphs captured before the
    profiler first ran are then reported like the others)."""
    global _PROFILER_READY
    if _PROFILER_READY or device.type != "cuda":
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    with contextlib.suppress(Exception), profile(activities=[ProfilerActivity.CUDA]):
        torch.zeros(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    _PROFILER_READY = True


def kernel_profile(call: Callable[[int], object], *, calls: int, device) -> dict:
    """Kernels per call and summed kernel time per call (µs) of ``calls`` calls, from
    torch.profiler's CUDA activity; memcpy/memset are counted apart."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            call(i)
        torch.cuda.synchronize(device)
    kernels = copies = 0
    kernel_us = copy_us = 0.0
    names: dict[str, int] = {}
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        duration = float(event.time_range.elapsed_us())
        if event.name.startswith(("Memcpy", "Memset", "memcpy", "memset")):
            copies += 1
            copy_us += duration
        else:
            kernels += 1
            kernel_us += duration
            names[event.name] = names.get(event.name, 0) + 1
    top = sorted(names.items(), key=lambda kv: -kv[1])[:8]
    return {
        "calls": calls,
        "kernels_per_call": kernels / calls,
        "kernel_us_per_call": kernel_us / calls,
        "copies_per_call": copies / calls,
        "copy_us_per_call": copy_us / calls,
        "top_kernels": [{"name": n[:120], "per_call": c / calls} for n, c in top],
    }


# ---------------------------------------------------------------------------------------------
# the engines: each make_* returns call(i) -> host output of input i (numpy), state carried over


def _engine_call(engine, *, form: str, pool: np.ndarray, in_name: str, out_name: str, replay: str = "torch"):
    """call(i) over a built cuda-graph engine: Session.step for the step form (state stays on the
    device: one replay + one sync per frame), one all-host binding for the sequence form."""
    from framefuse.runtime.session import Session

    if form == "step":
        session = Session(engine, replay=replay)

        def call(i):
            return session.step(pool[i % POOL])

        call.engine = engine  # type: ignore[attr-defined]
        return call
    binding = engine.create_binding(host_inputs=[in_name], host_outputs=[out_name])
    binding.set_replay_mode(replay)
    host_in, host_out = binding.host_in[in_name], binding.host_out[out_name]

    def call(i):
        np.copyto(host_in, pool[i % POOL])
        binding.launch()
        binding.sync()
        return host_out

    call.engine = engine  # type: ignore[attr-defined]
    return call


def selection_summary(engine) -> dict:
    """The build-time selection as the artifact records it: the chosen candidate, which graph
    (fused / unfused) and every candidate's timing (µs per replay) or error."""
    selection = (getattr(engine, "metadata", None) or {}).get("selection") or {}
    out = {"chosen": selection.get("chosen"), "graph": selection.get("graph", "fused")}
    if "skipped" in selection:
        out["skipped"] = selection["skipped"]
    if "vs_fp32" in selection:  # a precision build beside its fp32 graph's step kernels (same rounds)
        out["vs_fp32"] = selection["vs_fp32"]
    for key in (
        "phase_s",
        "frame_gap",
        "frame_gap_bytes",
        "frame_hz",
    ):  # where the build's time went; the CPU step's check
        if key in selection:
            out[key] = selection[key]
    candidates = {}
    for name, entry in (selection.get("candidates") or {}).items():
        candidates[name] = {
            k: entry[k]
            for k in ("us_per_step", "error", "compile_s", "steps", "max_abs_diff", "reference")
            if k in entry
        }
    if candidates:
        out["candidates"] = candidates
    return out


def build_framefuse(source, *, device: str, precision: str = "fp32", unfused=None, fp32_graph=None):
    """The cuda-graph engine as ``framefuse build`` makes it (framefuse.build: select="time", the
    unfused model.onnx as a candidate for fp32 fused graphs), in memory. A precision row's graph
    comes converted by the precision section (which reports its accuracy beside the latency), so
    that one goes to the backend with its precision named, and with its ``fp32_graph`` as the build
    hands it (the fp32 graph's step kernels timed beside). Returns (engine, seconds)."""
    from framefuse.build import build_engine
    from framefuse.engines import cuda_graph

    options: dict = {"select": "time"}
    if precision == "fp32":
        if unfused is not None and Path(unfused).is_file():
            options["unfused"] = Path(unfused)
        built = build_engine(Path(source), engine="cuda-graph", device=device, options=options)
        return built.runner, built.seconds
    if fp32_graph is not None:
        options["fp32_graph"] = Path(fp32_graph)
    start = time.perf_counter()
    engine = cuda_graph.build(Path(source), precision=precision, device=device, options=options)
    return engine, time.perf_counter() - start


class _TorchIO:
    """Pinned host buffers and the device input for a torch peer (the same copies framefuse does)."""

    def __init__(self, torch, pool: np.ndarray, out_shape, device):
        on_gpu = device.type == "cuda"
        self.torch = torch
        self.device = device
        self.pin_in = torch.zeros(pool.shape[1:], dtype=torch.float32, pin_memory=on_gpu)
        self.pin_in_np = self.pin_in.numpy()
        self.pin_out = torch.zeros(out_shape, dtype=torch.float32, pin_memory=on_gpu)
        self.pin_out_np = self.pin_out.numpy()
        self.x = torch.zeros(pool.shape[1:], dtype=torch.float32, device=device)
        self.sync = torch.cuda.current_stream(device).synchronize if on_gpu else (lambda: None)


def _initial_state(model, form: str, pool: np.ndarray, device):
    return [s.to(device) for s in model.init_state(pool.shape[1])] if form == "step" else None


def make_torch_eager(model, *, form: str, pool: np.ndarray, out_shape, device):
    import torch

    io = _TorchIO(torch, pool, out_shape, device)
    state = _initial_state(model, form, pool, device)

    def call(i):
        nonlocal state
        np.copyto(io.pin_in_np, pool[i % POOL])
        io.x.copy_(io.pin_in, non_blocking=True)
        if form == "step":
            y, state = model.step(io.x, tuple(state))
        else:
            y = model(io.x)
        io.pin_out.copy_(y, non_blocking=True)
        io.sync()
        return io.pin_out_np

    return call


def _capture(body: Callable[[], None], device, *, reset: Callable[[], None] | None = None):
    """``body`` warmed up on a side stream, then captured into one CUDA graph; returns the graph."""
    import torch

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            body()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        body()
    if reset is not None:
        reset()
    torch.cuda.synchronize(device)
    return graph


def make_torch_cuda_graph(model, *, form: str, pool: np.ndarray, out_shape, device, compile_mode: str | None = None):
    """The torch code captured in one CUDA graph with static buffers, copies and (step form) the
    state hand-off inside. ``compile_mode``: the code is ``torch.compile(mode=compile_mode)``'s
    (compiled and autotuned on the default stream first, then captured by hand)."""
    import torch

    io = _TorchIO(torch, pool, out_shape, device)
    state = _initial_state(model, form, pool, device)
    fn = model.step if form == "step" else model
    if compile_mode is not None:
        torch._dynamo.reset()  # every zoo model shares StackedModel.step: do not hit the recompile limit
        fn = torch.compile(fn, mode=compile_mode)

    def body():
        io.x.copy_(io.pin_in, non_blocking=True)
        if form == "step":
            y, new_state = fn(io.x, tuple(state))
            for buffer, value in zip(state, new_state):
                buffer.copy_(value)
        else:
            y = fn(io.x)
        io.pin_out.copy_(y, non_blocking=True)

    def reset():
        for buffer in state or ():
            buffer.zero_()

    if compile_mode is not None:  # compile + autotune outside the capture stream, then warm up
        body()
        torch.cuda.synchronize(device)
    graph = _capture(body, device, reset=reset)

    def call(i):
        np.copyto(io.pin_in_np, pool[i % POOL])
        graph.replay()
        io.sync()
        return io.pin_out_np

    call.graph = graph  # type: ignore[attr-defined]
    return call


def make_torch_compile(model, *, form: str, pool: np.ndarray, out_shape, device):
    import torch

    torch._dynamo.reset()  # every zoo model shares StackedModel.step: do not hit the recompile limit
    io = _TorchIO(torch, pool, out_shape, device)
    state = _initial_state(model, form, pool, device)
    compiled = torch.compile(model.step if form == "step" else model, mode="reduce-overhead")

    def call(i):
        np.copyto(io.pin_in_np, pool[i % POOL])
        io.x.copy_(io.pin_in, non_blocking=True)
        torch.compiler.cudagraph_mark_step_begin()
        if form == "step":
            y, new_state = compiled(io.x, tuple(state))
            for buffer, value in zip(state, new_state):
                buffer.copy_(value)  # cudagraph-tree outputs are overwritten by the next call
        else:
            y = compiled(io.x)
        io.pin_out.copy_(y, non_blocking=True)
        io.sync()
        return io.pin_out_np

    return call


def make_floor(*, pool: np.ndarray, out_shape, device):
    """The floor: one CUDA graph of pinned H2D input copy → one trivial kernel (the output filled
    from the input's first element) → D2H output copy, replayed and synchronised."""
    import torch

    io = _TorchIO(torch, pool, out_shape, device)
    y = torch.zeros(out_shape, dtype=torch.float32, device=device)
    first = io.x.reshape(-1)[:1].reshape([1] * len(out_shape))

    def body():
        io.x.copy_(io.pin_in, non_blocking=True)
        y.copy_(first.expand(y.shape))
        io.pin_out.copy_(y, non_blocking=True)

    graph = _capture(body, device)

    def call(i):
        np.copyto(io.pin_in_np, pool[i % POOL])
        graph.replay()
        io.sync()
        return io.pin_out_np

    return call


MAPPED_FLOOR_SOURCE = r"""
extern "C" __global__ void floor_mapped(const float* x, float* y, int n_in, int n_out) {
    for (int i = threadIdx.x; i < max(n_in, n_out); i += blockDim.x) {
        float v = 0.0f;
        if (i < n_in) v = *(volatile const float*)(x + i);
        if (i < n_out) y[i] = v * 2.0f;
    }
}
"""


def _mapped_floor_graph(source: str, kernel: str, *, pool: np.ndarray, out_shape, device, extra_args=()):
    """One block of ``kernel`` (``source``) over a frame and an output in pinned mapped host memory,
    captured in a CUDA graph: (x, y, launcher, keep)."""
    import ctypes

    import torch

    from framefuse.engines.stepkernel import MappedHostBuffer, _FastLaunch
    from framefuse.plugins import cuda

    folder = Path(tempfile.mkdtemp(prefix=f"ff-{kernel}-"))
    src = folder / f"{kernel}.cu"
    src.write_text(source)
    fn = cuda.get_kernel(src, kernel)
    in_shape = pool.shape[1:]
    x, y = MappedHostBuffer(in_shape), MappedHostBuffer(out_shape)
    n_in, n_out = int(np.prod(in_shape)), int(np.prod(out_shape))
    stream = torch.cuda.Stream(device)
    graph = torch.cuda.CUDAGraph()
    args = [ctypes.c_void_p(x.device_ptr), ctypes.c_void_p(y.device_ptr), ctypes.c_int(n_in), ctypes.c_int(n_out)]
    with torch.cuda.graph(graph, stream=stream):
        # one block: a sequence loops
        fn.launch(1, min(1024, max(32, -(-max(n_in, n_out) // 32) * 32)), args + list(extra_args))
    launcher = _FastLaunch(int(graph.raw_cuda_graph_exec()), int(stream.cuda_stream))
    return x, y, launcher, (graph, x, y, stream, fn, launcher)


def make_mapped_floor(*, pool: np.ndarray, out_shape, device):
    """The mapped floor: a CUDA graph of one kernel that reads the frame from and writes the output
    (2 × the frame's first elements) to pinned, mapped host memory, launched and synchronised with
    the ctypes calls Session.step's step kernel uses. call.check() says whether the output is right."""
    x, y, launcher, keep = _mapped_floor_graph(
        MAPPED_FLOOR_SOURCE, "floor_mapped", pool=pool, out_shape=out_shape, device=device
    )
    launch, sync, exe, st = launcher.launch_fn, launcher.sync_fn, launcher.exec_handle, launcher.stream
    n_out = y.array.size

    def call(i):
        np.copyto(x.array, pool[i % len(pool)])
        launch(exe, st)
        sync(st)
        return y.array

    def check() -> bool:
        call(0)
        k = min(x.array.size, n_out)
        return bool(np.allclose(y.array.reshape(-1)[:k], 2 * pool[0].reshape(-1)[:k]))

    call.check = check  # type: ignore[attr-defined]
    call.keep = keep  # type: ignore[attr-defined] - alive as long as the call
    return call


FLOOR_DONE_SOURCE = r"""
extern "C" __global__ void floor_mapped_done(const float* x, float* y, int n_in, int n_out, unsigned* done) {
    for (int i = threadIdx.x; i < max(n_in, n_out); i += blockDim.x) {
        float v = 0.0f;
        if (i < n_in) v = *(volatile const float*)(x + i);
        if (i < n_out) y[i] = v * 2.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        *(volatile unsigned*)done = 1u;
    }
}
"""


def make_mapped_floor_done(*, pool: np.ndarray, out_shape, device):
    """The mapped floor's kernel raising a done word after a system fence, and the host waiting
    through hostpath.c as Session.step does (not cuStreamSynchronize): the floor of the host path
    Session.step takes. None without the native host path (engines/hostpath.status() says why)."""
    import ctypes

    from framefuse.engines import hostpath
    from framefuse.engines.stepkernel import MappedHostBuffer, fill_launch

    lib = hostpath.load()
    if lib is None:
        return None
    done = MappedHostBuffer((1,), dtype=np.uint32)
    x, y, launcher, keep = _mapped_floor_graph(
        FLOOR_DONE_SOURCE,
        "floor_mapped_done",
        pool=pool,
        out_shape=out_shape,
        device=device,
        extra_args=[ctypes.c_void_p(done.device_ptr)],
    )
    state = hostpath.FrameState()
    fill_launch(state, [launcher.exec_handle], launcher.stream)
    state.done, state.n_done, state.spin_limit = done.array.ctypes.data, 1, 1 << 26
    pointer = ctypes.pointer(state)
    frame_call = lib[0]

    def call(i):
        x.array[...] = pool[i % len(pool)]
        code = frame_call(pointer)
        if code == hostpath.SPINNING:  # seconds without its done word: the stream says why
            err = launcher.sync_fn(launcher.stream)
            state.unwaited = 0
            if err or not done.array[0]:
                raise RuntimeError(f"the done-word floor's kernel did not raise its word (CUresult {err})")
        elif code:
            raise RuntimeError(f"the done-word floor's launch failed: answer {code}, CUresult {state.error}")
        return y.array

    call.keep = (keep, done, state)  # type: ignore[attr-defined]
    return call


def make_ort(model_path, *, pool: np.ndarray, manifest: dict):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    state_names = manifest.get("state_names") or []
    inputs = {i.name: i for i in session.get_inputs()}
    state = {
        f"state.{n}": np.zeros([int(d) for d in inputs[f"state.{n}"].shape], dtype=np.float32) for n in state_names
    }
    outputs = [out_name] + [f"next_state.{n}" for n in state_names]

    def call(i):
        feeds = {in_name: pool[i % POOL], **state}
        results = session.run(outputs, feeds)
        for n, value in zip(state_names, results[1:]):
            state[f"state.{n}"] = value
        return results[0]

    return call


def ort_reference(onnx_path, manifest: dict, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime's output for input ``x`` with zero state (the correctness column's reference)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    feeds = {in_name: x}
    for n in manifest.get("state_names") or []:
        spec = next(i for i in manifest["inputs"] if i["name"] == f"state.{n}")
        feeds[f"state.{n}"] = np.zeros(spec["shape"], dtype=np.float32)
    return sess.run([out_name], feeds)[0]


# ---------------------------------------------------------------------------------------------
# one row (one model at one T)


class Settings:
    """What every row needs from the command line."""

    def __init__(
        self,
        *,
        iters,
        warmup,
        device,
        compile_forms,
        replays,
        profile_calls,
        quick,
        rounds=ROUNDS,
        prebuild=None,
        frame_gap_bytes=0,
        frame_hz=0.0,
    ):
        from framefuse.engines.framegap import frame_gap

        self.prebuild = prebuild  # engine names: build these, time nothing (see --prebuild)
        self.frame_gap_bytes = int(frame_gap_bytes)
        self.frame_hz = float(frame_hz)
        # run before every timed call of every engine, off the clock (--frame-gap, --frame-hz)
        self.between = frame_gap(self.frame_gap_bytes, self.frame_hz)
        self.rounds = max(1, min(rounds, iters))
        self.iters = iters
        self.warmup = warmup
        self.device = device
        self.compile_forms = compile_forms
        self.replays = replays
        self.profile_calls = profile_calls
        self.quick = quick


def bench_row(
    arch: str,
    form: str,
    entry: dict,
    *,
    model,
    settings: Settings,
    section: str = "zoo",
    category: str | None = None,
) -> dict:
    """Time framefuse, its ablations, the peers and the floor on one model/form; ``entry`` holds
    onnx (the original graph), manifest and fused (or fused_error)."""
    import torch

    manifest = entry["manifest"]
    in_shape = manifest["inputs"][0]["shape"]
    out_shape = manifest["outputs"][0]["shape"]
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((POOL, *in_shape)).astype(np.float32)
    T = 1 if form == "step" else in_shape[1]
    row = {
        "section": section,
        "arch": arch,
        "category": category or getattr(model, "category", "other"),
        "form": form,
        "T": T,
        "input_shape": in_shape,
        "fused_ops": entry.get("fused_ops"),
        "nodes": entry.get("nodes"),
        "engines": {},
    }
    if "fused_error" in entry:
        row["rewrite_error"] = entry["fused_error"]
    reference = ort_reference(entry["onnx"], manifest, pool[0])
    dev = torch.device(settings.device)
    on_gpu = dev.type == "cuda"
    init_profiler(dev)
    torch_args = {"form": form, "pool": pool, "out_shape": out_shape, "device": dev}
    built: dict = {}

    def framefuse_call():
        engine, seconds = build_framefuse(entry["fused"], device=settings.device, unfused=entry["onnx"])
        built["engine"] = engine
        call = _engine_call(engine, form=form, pool=pool, in_name=in_name, out_name=out_name)
        call.extra = {"build_s": seconds, "selection": selection_summary(engine)}  # type: ignore[attr-defined]
        step_kernel = engine.summary().get("stepkernel") if hasattr(engine, "summary") else None
        if step_kernel:  # the build chose the step compiler's one kernel
            call.extra["stepkernel"] = step_kernel  # type: ignore[attr-defined]
        cpu_step = engine.summary().get("cpustep") if hasattr(engine, "summary") else None
        if cpu_step:  # the build chose the step compiler's CPU step: no kernel at all
            call.extra["cpustep"] = cpu_step  # type: ignore[attr-defined]
        return call

    def unfused_call():
        from framefuse.engines.cuda_graph import build_engine

        engine = build_engine(entry["onnx"], device=settings.device)
        return _engine_call(engine, form=form, pool=pool, in_name=in_name, out_name=out_name)

    makers: list[tuple[str, Callable[[], Callable]]] = []
    # torch.compile(mode="reduce-overhead") is made and timed alone after the others: its CUDA
    # graph trees broke the graphs captured by hand before it (H100, torch 2.11, min_gru at T = 32:
    # the next replay of the torch eager + CUDA graph peer failed with "unspecified launch
    # failure", and every engine of the process after it; with the peer left out, the row ran)
    late: list[tuple[str, Callable[[], Callable]]] = []
    if on_gpu:
        makers.append((FLOOR, lambda: make_floor(pool=pool, out_shape=out_shape, device=dev)))
        makers.append((MAPPED_FLOOR, lambda: make_mapped_floor(pool=pool, out_shape=out_shape, device=dev)))
        from framefuse.engines import hostpath

        if hostpath.load() is not None:
            makers.append(
                (MAPPED_FLOOR_DONE, lambda: make_mapped_floor_done(pool=pool, out_shape=out_shape, device=dev))
            )
        else:
            row["engines"][MAPPED_FLOOR_DONE] = {"skipped": f"no native host path: {hostpath.status()}"}
    else:
        for name in FLOORS:
            row["engines"][name] = {"skipped": "no GPU"}
    if "fused" in entry:
        makers.append(("framefuse", framefuse_call))
        if on_gpu and "driver" in settings.replays:

            def driver_call():
                if "engine" not in built:
                    raise RuntimeError("the framefuse build failed (see the framefuse row)")
                return _engine_call(
                    built["engine"], form=form, pool=pool, in_name=in_name, out_name=out_name, replay="driver"
                )

            makers.append(("framefuse_driver", driver_call))
        # a graph without state steps too (Session.step: the graph on each frame), so the real
        # models' windows and the zoo's sequence form are kept resident as the step form is
        if on_gpu and (form == "step" or not any(i["name"].startswith("state.") for i in manifest["inputs"])):

            def resident_call():
                from framefuse.runtime.session import Session

                if "engine" not in built:
                    raise RuntimeError("the framefuse build failed (see the framefuse row)")
                engine = built["engine"]
                chosen = selection_summary(engine).get("chosen")
                if not str(chosen).startswith("stepkernel"):
                    # the build chose another candidate (the CPU step for a small model): the
                    # resident column is the plain step kernel, built for it alone
                    from framefuse.engines import cuda_graph

                    engine = cuda_graph.build(entry["fused"], device=settings.device, options={"select": "stepkernel"})
                    built["resident_note"] = f"the build chose {chosen}; resident: the plain step kernel, built for it"
                session = Session(engine, resident=True)

                def call(i):
                    return session.step(pool[i % POOL])

                call.engine = engine  # type: ignore[attr-defined]
                call.close = session.close  # type: ignore[attr-defined]
                if "resident_note" in built:
                    call.extra = {"note": built["resident_note"]}  # type: ignore[attr-defined]
                return call

            makers.append(("framefuse_resident", resident_call))
    else:
        row["engines"]["framefuse"] = {"error": f"no fused graph: {entry.get('fused_error')}"}
    makers.append(("framefuse_unfused", unfused_call))
    makers.append(("torch_eager", lambda: make_torch_eager(model, **torch_args)))
    if on_gpu:
        makers.append(("torch_cuda_graph", lambda: make_torch_cuda_graph(model, **torch_args)))
        if form in settings.compile_forms:
            late.append(("torch_compile", lambda: make_torch_compile(model, **torch_args)))
            makers.append(
                (
                    "torch_compile_autotune_graph",
                    lambda: make_torch_cuda_graph(model, **torch_args, compile_mode="max-autotune-no-cudagraphs"),
                )
            )
        else:
            for name in COMPILE_PEERS:
                row["engines"][name] = {"skipped": f"{QUICK_NOTE}: not asked for the {form} form (--compile)"}
    else:
        for name in GPU_ONLY:
            row["engines"].setdefault(name, {"skipped": "no GPU"})
    makers.append(("ort_cpu", lambda: make_ort(entry["onnx"], pool=pool, manifest=manifest)))
    if settings.prebuild is not None:
        return prebuild_row(row, makers + late, settings.prebuild, dev=dev)

    # Every engine is built first and then timed in interleaved rounds (ROUNDS blocks of iters /
    # ROUNDS calls each, engine after engine), so that each one's samples come from the same
    # windows of the host: on the H100 machines a window of a second can be 3-4 us slower than the
    # next, and an engine timed in one stretch took whichever it fell in (gated_ssm, 2026-11-26:
    # 24.2 and 24.7 us in two runs, 18.7-23.6 in windows of one process). A resident kernel holds
    # every SM and must stop before anything waits for the device: it is timed alone, after.
    def make_and_time(group: list) -> None:
        live: dict[str, Callable] = {}
        for name, make in group:
            call = None
            try:
                start = time.perf_counter()
                with torch.no_grad():
                    call = make()
                    first = np.array(call(0), copy=True)  # zero state, input 0: compared with ORT
                    result = {"setup_s": time.perf_counter() - start}
                    # progress: a row's builds (torch.compile max-autotune above all) take minutes
                    say(f"  {arch:<16} T={T:<3} built {ENGINE_LABELS.get(name, name)} ({result['setup_s']:.1f} s)")
                    phases = (getattr(call, "extra", {}).get("selection") or {}).get("phase_s")
                    if phases:  # where a build's minutes go, for the next run's planning
                        say(
                            f"  {arch:<16} T={T:<3}   by phase: "
                            + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
                        )
                    if name not in FLOORS:
                        result["max_abs_err_vs_ort"] = max_abs_err(first, reference)
                    if name == "framefuse_resident":
                        result.update(
                            measure(call, iters=settings.iters, warmup=settings.warmup, between=settings.between)
                        )
                        result["rounds"] = 1
                        call.close()
                        result["kernels"] = {"skipped": "resident: no launch per call (one kernel, launched once)"}
                        _finish_engine(row, name, call, result, settings=settings, dev=dev)
                    else:
                        row["engines"][name] = result
                        live[name] = call
                        call = None  # kept for the rounds
            except Exception as exc:  # noqa: BLE001 - a failing engine is a result, not a crash
                _engine_failed(row, name, exc)
            finally:
                if call is not None and hasattr(call, "close"):
                    call.close()
                call = None
                if on_gpu:
                    torch.cuda.synchronize(dev)
        if live:
            say(f"  {arch:<16} T={T:<3} timing {len(live)} engine(s) in {settings.rounds} interleaved rounds")
        try:
            with torch.no_grad():
                timed = measure_rounds(
                    live, iters=settings.iters, warmup=settings.warmup, rounds=settings.rounds, between=settings.between
                )
            for name, call in live.items():
                if isinstance(timed[name], BaseException):
                    _engine_failed(row, name, timed[name])
                    continue
                row["engines"][name].update(timed[name])
                _finish_engine(row, name, call, row["engines"][name], settings=settings, dev=dev)
        finally:
            for call in live.values():
                if hasattr(call, "close"):
                    call.close()
            live.clear()
            if on_gpu:
                torch.cuda.synchronize(dev)

    make_and_time(makers)
    make_and_time(late)  # reduce-overhead on its own, after every other engine (see `late`)
    finish_row(row)
    profile_row(row, settings, dev)
    built.clear()
    if on_gpu:
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return row


def prebuild_row(row: dict, makers: list, names: list, *, dev) -> dict:
    """--prebuild: build the named engines of the row and run each once, untimed, one after the
    other in the order named (a build that times candidates, such as framefuse's selection or max-autotune, has the
    GPU to itself): their compiles land in the caches for a later run of the same row."""
    import torch

    row["prebuild"] = {}
    by_name = dict(makers)
    for name in names:
        if name not in by_name:  # e.g. a GPU peer on the CPU
            row["prebuild"][name] = {"skipped": "not an engine of this row"}
            continue
        make, call = by_name[name], None
        try:
            start = time.perf_counter()
            with torch.no_grad():
                call = make()
                call(0)
            seconds = time.perf_counter() - start
            row["prebuild"][name] = {"setup_s": round(seconds, 1)}
            say(f"  {row['arch']:<16} T={row['T']:<3} prebuilt {ENGINE_LABELS.get(name, name)} ({seconds:.1f} s)")
        except Exception as exc:  # noqa: BLE001 - reported; the later run meets it again
            row["prebuild"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            say(f"  {row['arch']:<16} T={row['T']:<3} prebuild of {name} failed: {row['prebuild'][name]['error']}")
        finally:
            if call is not None and hasattr(call, "close"):
                call.close()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
    if dev.type == "cuda":
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return row


def profile_row(row: dict, settings: Settings, dev) -> None:
    """row["kernels"]: kernels and kernel time per call of framefuse and of the best torch peer
    (each profiled right after its own timing; every GPU engine's profile stays in its entry)."""
    if dev.type != "cuda":
        row["kernels"] = {"skipped": "no GPU"}
        return
    if settings.profile_calls <= 0:
        row["kernels"] = {"skipped": "--profile-calls 0"}
        return
    engines = row["engines"]
    torch_peers = {k: engines[k]["p50_us"] for k in TORCH_PEERS if "p50_us" in engines.get(k, {})}
    targets = ["framefuse"] if "kernels" in engines.get("framefuse", {}) else []
    if torch_peers:
        best = min(torch_peers, key=torch_peers.get)
        row["best_torch_peer"] = best
        targets.append(best)
    row["kernels"] = {name: engines[name].get("kernels", {"error": "not profiled"}) for name in targets}
    step_kernel = engines.get("framefuse", {}).get("stepkernel")
    profiled = engines.get("framefuse", {}).get("kernels", {})
    if step_kernel and step_kernel.get("levels") and "kernel_us_per_call" in profiled:
        # one dependency level's cost: the kernel's time spread over its levels (entry, prologue
        # and the done fence included, so an upper bound on the level itself)
        step_kernel["us_per_level"] = profiled["kernel_us_per_call"] / step_kernel["levels"]


def finish_row(row: dict) -> None:
    """Best peer, and per engine the ratio to the best peer and the multiple of the floor."""
    engines = row["engines"]
    peers = {k: v for k, v in engines.items() if k in PEERS and "p50_us" in v}
    ff = engines.get("framefuse", {})
    floor = engines.get(FLOOR, {}).get("p50_us")
    if floor:
        row["floor_p50_us"] = floor
    mapped = engines.get(MAPPED_FLOOR, {}).get("p50_us")
    if mapped:
        row["mapped_floor_p50_us"] = mapped
    mapped_done = engines.get(MAPPED_FLOOR_DONE, {}).get("p50_us")
    if mapped_done:
        row["mapped_floor_done_p50_us"] = mapped_done
        if "p50_us" in ff:
            row["mapped_floor_done_multiple"] = ff["p50_us"] / mapped_done
    best_p50 = None
    if peers:
        best = min(peers, key=lambda k: peers[k]["p50_us"])
        best_p50 = peers[best]["p50_us"]
        row["best_peer"] = best
        row["best_peer_p50_us"] = best_p50
    for name, e in engines.items():
        if "p50_us" not in e:
            continue
        if best_p50 is not None and name not in FLOORS:
            e["speedup_vs_best_peer"] = best_p50 / e["p50_us"]  # > 1: faster than the best peer
        if floor:
            e["floor_multiple"] = e["p50_us"] / floor
        if mapped:
            e["mapped_floor_multiple"] = e["p50_us"] / mapped
    if "speedup_vs_best_peer" in ff:
        row["speedup_vs_best_peer"] = ff["speedup_vs_best_peer"]
        row["below_best_peer"] = ff["speedup_vs_best_peer"] < 1.0
    if "floor_multiple" in ff:
        row["floor_multiple"] = ff["floor_multiple"]
    if "mapped_floor_multiple" in ff:
        row["mapped_floor_multiple"] = ff["mapped_floor_multiple"]
    row["viable_60fps"] = bool("p99_us" in ff and ff["p99_us"] <= BUDGET_MS * 1000)


# ---------------------------------------------------------------------------------------------
# sections


def prepare_artifacts(
    arch: str, *, work: Path, embed: int, layers: int, seq: int, seed: int, weights: str = "random"
) -> dict:
    """export (both forms) → rewrite → model.fused.onnx; returns per form the paths and reports.
    ``weights``: random (the latency sections: every engine runs the same weights, untrained) or
    trained (the precision section)."""
    from framefuse.runtime.pipeline import prepare

    config = {"model": {"embed": embed, "layers": layers}, "seq": seq, "batch": 1, "seed": seed, "weights": weights}
    forms = {}
    for form, p in prepare(arch, work, config).items():
        entry = {
            "dir": p.directory,
            "onnx": p.onnx,
            "manifest": p.manifest,
            "nodes": {"before": p.nodes_before, "after": p.nodes_after},
        }
        if p.fused is not None:
            entry["fused"] = p.fused
            entry["fused_ops"] = p.fused_ops
        else:
            entry["fused_error"] = p.fused_error
        forms[form] = entry
    return forms


class Runner:
    """Holds the results, writes them after every row, and keeps the time budget."""

    def __init__(self, results: dict, out: Path, args, settings: Settings):
        self.results = results
        self.out = out
        self.args = args
        self.settings = settings
        self.start = time.perf_counter()
        self.budget = args.time_budget
        self.forms = tuple(results.get("config", {}).get("forms") or FORMS)

    def over_budget(self, what: str) -> bool:
        if self.budget and time.perf_counter() - self.start > self.budget:
            note = f"--time-budget {self.budget:.0f} s spent: not run: {what}"
            self.results.setdefault("not_run", []).append(what)
            say(note)
            return True
        return False

    def add(self, section: str, row: dict) -> None:
        self.results[ROW_KEYS[section]].append(row)
        write_reports(self.results, self.out)

    def error(self, message: str) -> None:
        self.results["errors"].append(message)
        say(message)
        write_reports(self.results, self.out)


def run_zoo(runner: Runner, archs: list[str], work: Path) -> None:
    import torch

    from framefuse.exporter.loading import zoo_model

    args, settings = runner.args, runner.settings
    for n, arch in enumerate(archs, 1):
        if runner.over_budget(f"zoo {arch}"):
            continue
        say(f"[zoo {n}/{len(archs)}] {arch}: export → rewrite")
        try:
            forms = prepare_artifacts(
                arch, work=work / "zoo", embed=args.embed, layers=args.layers, seq=args.seq, seed=args.seed
            )
        except Exception as exc:  # noqa: BLE001
            runner.error(f"zoo {arch}: export failed: {_error(exc)}")
            continue
        cfg = forms["step"]["manifest"]["config"]
        model = zoo_model(arch, cfg).to(settings.device).eval()  # the weights the export has
        for form in runner.forms:
            for key in ("fused_ops", "fused_error"):
                if key in forms[form]:
                    say(f"  {arch} {form}: {key} = {forms[form][key]}")
            row = bench_row(arch, form, forms[form], model=model, settings=settings)
            runner.add("zoo", row)
            _say_ratio(row)
        del model
        if settings.device == "cuda":
            torch.cuda.empty_cache()


def _say_ratio(row: dict) -> None:
    if "speedup_vs_best_peer" in row:
        floor = f", {row['floor_multiple']:.2f}× the floor" if "floor_multiple" in row else ""
        say(
            f"  {row['arch']} T={row['T']}: framefuse {row['speedup_vs_best_peer']:.2f}× vs best peer "
            f"({ENGINE_LABELS[row['best_peer']]}){floor}"
        )


def load_real_models():
    """tests/real_models (models.py, flow.py) as a package: the builders and the export flow."""
    import importlib

    models = importlib.import_module("tests.real_models.models")
    flow = importlib.import_module("tests.real_models.flow")
    return models, flow


def run_real(runner: Runner, names: list[str], work: Path) -> None:
    import torch

    settings = runner.settings
    try:
        models, flow = load_real_models()
    except Exception as exc:  # noqa: BLE001 - e.g. transformers missing
        runner.error(f"real: tests/real_models cannot be imported: {_error(exc)}")
        return
    unknown = [n for n in names if n not in models.BY_NAME]
    if unknown:
        raise SystemExit(f"unknown real model(s) {unknown}; available: {', '.join(models.BY_NAME)}")
    seqs = [runner.args.seq] if "sequence" in runner.forms else []
    seqs += [1] if "step" in runner.forms and runner.args.seq != 1 else []
    for n, name in enumerate(names, 1):
        spec = models.BY_NAME[name]
        try:
            module = spec.build().to(settings.device).eval()
        except Exception as exc:  # noqa: BLE001
            runner.error(f"real {name}: building the torch module failed: {_error(exc)}")
            continue
        for seq in seqs:
            if runner.over_budget(f"real {name} T={seq}"):
                continue
            say(f"[real {n}/{len(names)}] {name} T={seq}: export → rewrite")
            try:
                fused = flow.fuse_real_model(name, seq, work / "real")
            except Exception as exc:  # noqa: BLE001
                runner.add(
                    "real",
                    {
                        "section": "real",
                        "arch": name,
                        "category": "real",
                        "form": "sequence",
                        "T": seq,
                        "export_error": _error(exc),
                        "engines": {},
                    },
                )
                say(f"  {name} T={seq}: export/rewrite failed: {_error(exc)}")
                continue
            entry = {
                "onnx": fused.source,
                "manifest": fused.manifest,
                "fused": fused.fused_path,
                "fused_ops": sorted(fused.framefuse_ops.elements()),
                "nodes": {"before": None, "after": len(fused.fused.graph.node)},
            }
            with contextlib.suppress(Exception):
                entry["nodes"]["before"] = len(_load_graph(fused.source).node)
            row = bench_row(name, "sequence", entry, model=module, settings=settings, section="real", category="real")
            row["parity_passed"] = bool(getattr(fused.parity, "passed", getattr(fused.parity, "ok", True)))
            runner.add("real", row)
            _say_ratio(row)
        del module
        if settings.device == "cuda":
            torch.cuda.empty_cache()


def _load_graph(path):
    import onnx

    return onnx.load(str(path), load_external_data=False).graph


def precision_graph(entry: dict, precision: str, frames: int, say) -> tuple[Path, object, str | None]:
    """(graph, accuracy report, refusal) of ``precision`` for a zoo step form, as ``framefuse build
    --precision`` makes it: framefuse.build.convert_precision with the accuracy gate over ``frames``
    frames and the int8 weight-only fallback (products kept in float32 until the gate passes). A
    graph the build refuses is still timed, with the gate's report and its failures beside it: the
    row says the build would not ship it."""
    import onnx

    from framefuse.build import convert_precision
    from framefuse.precision import AccuracyError
    from framefuse.precision.accuracy import AccuracyReport

    source = Path(entry["fused"])
    try:
        target = convert_precision(
            source,
            precision,
            None,
            source.parent,
            lambda line: say(f"    {line}"),
            engine="cuda-graph",
            gate=(frames, None),
        )
    except AccuracyError as exc:
        target = source.with_name(f"{source.stem}.{precision}.refused.onnx")
        onnx.save(exc.model, str(target))
        return target, exc.report, str(exc)
    report = AccuracyReport.read(source.parent / f"accuracy.{precision}.json") if frames > 0 else None
    return target, report, None


def run_precision(runner: Runner, archs: list[str], precisions: list[str], work: Path) -> None:
    """Per architecture: every precision's engine built (its graph from precision_graph), then all
    of them and the floor timed in the same interleaved rounds, so that "faster than fp32" compares
    samples from the same windows of the host (timed one after the other on the H200, 2026-12-01,
    mamba's fp32 and fp16 engines, whose kernels have the same source, were 27.6 and 30.3 µs)."""
    import torch

    args, settings = runner.args, runner.settings
    dev = torch.device(settings.device)
    on_gpu = dev.type == "cuda"
    for n, arch in enumerate(archs, 1):
        if runner.over_budget(f"precision {arch}"):
            continue
        say(f"[precision {n}/{len(archs)}] {arch}: export → rewrite (step form)")
        try:
            forms = prepare_artifacts(  # trained: an accuracy report on random weights measures near-ties
                arch,
                work=work / "precision",
                embed=args.embed,
                layers=args.layers,
                seq=args.seq,
                seed=args.seed,
                weights="trained",
            )
        except Exception as exc:  # noqa: BLE001
            runner.error(f"precision {arch}: export failed: {_error(exc)}")
            continue
        entry = forms["step"]
        if "fused" not in entry:
            runner.error(f"precision {arch}: no fused graph: {entry.get('fused_error')}")
            continue
        manifest = entry["manifest"]
        in_shape = manifest["inputs"][0]["shape"]
        in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
        pool = np.random.default_rng(0).standard_normal((POOL, *in_shape)).astype(np.float32)
        rows: dict[str, dict] = {}
        live: dict[str, Callable] = {}
        try:
            if on_gpu:
                try:
                    live[FLOOR] = make_floor(pool=pool, out_shape=manifest["outputs"][0]["shape"], device=dev)
                except Exception as exc:  # noqa: BLE001
                    say(f"  {arch}: floor failed: {_error(exc)}")
            for precision in precisions:
                row = rows[precision] = {
                    "section": "precision",
                    "arch": arch,
                    "category": _zoo_category(arch),
                    "form": "step",
                    "T": 1,
                    "precision": precision,
                }
                try:
                    source = entry["fused"]
                    if precision != "fp32":
                        from framefuse.precision import unsupported_reason

                        reason = unsupported_reason("cuda-graph", precision)
                        if reason:
                            raise RuntimeError(reason)
                        start = time.perf_counter()
                        source, report, refusal = precision_graph(entry, precision, args.accuracy_frames, say)
                        row["accuracy_s"] = time.perf_counter() - start
                        if report is not None:
                            row["accuracy"] = accuracy_summary(report)
                        if refusal:
                            row["refused"] = refusal
                    engine, build_s = build_framefuse(
                        source,
                        device=settings.device,
                        precision=precision,
                        unfused=entry["onnx"],
                        fp32_graph=entry["fused"] if precision != "fp32" else None,
                    )
                    call = _engine_call(engine, form="step", pool=pool, in_name=in_name, out_name=out_name)
                    with torch.no_grad():
                        call(0)
                    row.update(build_s=build_s, selection=selection_summary(engine))
                    live[precision] = call
                    say(f"  {arch:10s} {precision:5s} built ({build_s:.1f} s; {row['selection'].get('chosen')})")
                except Exception as exc:  # noqa: BLE001
                    row["error"] = _error(exc)
                    row["traceback"] = traceback.format_exc(limit=6)
                    say(f"  {arch:10s} {precision:5s} FAILED: {row['error']}")
                finally:
                    if on_gpu:
                        torch.cuda.synchronize(dev)
            if live:
                say(f"  {arch:10s} timing {len(live)} engine(s) in {settings.rounds} interleaved rounds")
                with torch.no_grad():
                    timed = measure_rounds(
                        live,
                        iters=settings.iters,
                        warmup=settings.warmup,
                        rounds=settings.rounds,
                        between=settings.between,
                    )
                floor = timed.get(FLOOR)
                floor_p50 = floor["p50_us"] if isinstance(floor, dict) else None
                fp32 = timed.get("fp32")
                fp32_p50 = fp32["p50_us"] if isinstance(fp32, dict) else None
                for precision, row in rows.items():
                    result = timed.get(precision)
                    if result is None:
                        continue
                    if isinstance(result, BaseException):
                        row["error"] = _error(result)
                        continue
                    row.update(
                        {k: result[k] for k in ("p50_us", "p99_us", "mean_us", "max_us", "fps", "iters", "rounds")},
                        round_p50_us=result["round_p50_us"],
                    )
                    if floor_p50:
                        row["floor_p50_us"] = floor_p50
                        row["floor_multiple"] = row["p50_us"] / floor_p50
                    if fp32_p50:
                        row["speedup_vs_fp32"] = fp32_p50 / row["p50_us"]
                    acc = row.get("accuracy", {})
                    say(
                        f"  {arch:10s} {precision:5s} p50 {row['p50_us']:8.1f} us  p99 {row['p99_us']:8.1f} us"
                        + (
                            f"  max abs {acc['max_abs_policy']:.2e}  argmax {100 * acc['argmax_agreement']:.2f}%"
                            if acc.get("argmax_agreement") is not None
                            else ""
                        )
                        + ("  (the build refuses it)" if row.get("refused") else "")
                    )
        finally:
            for call in live.values():
                if hasattr(call, "close"):
                    call.close()
            live.clear()
            if on_gpu:
                torch.cuda.synchronize(dev)
                torch.cuda.empty_cache()
        for row in rows.values():
            runner.add("precision", row)


def _zoo_category(arch: str) -> str:
    try:
        from framefuse.models import model_class

        return str(getattr(model_class(arch), "category", None) or "other")
    except Exception:  # noqa: BLE001
        return "other"


def accuracy_summary(report) -> dict:
    """The figures of framefuse.precision's accuracy report the table shows."""
    policy = report.policy_output
    by_name = {o.name: o for o in report.outputs}
    finite = [o.max_abs for o in report.outputs]
    return {
        "frames": report.frames,
        "form": report.form,
        "tolerance": report.tolerance,
        "policy_output": policy,
        "max_abs_policy": by_name[policy].max_abs if policy in by_name else None,
        "max_abs_all": max(finite) if finite else None,
        "argmax_agreement": report.argmax_agreement,
        "passed": report.passed,
        "failures": report.failures(),
        "engines": report.engines,
        "kept_fp32": list(report.kept_fp32),  # the int8 fallback's products
        "notes": list(report.notes),
    }


# ---------------------------------------------------------------------------------------------
# reports


def environment(device: str) -> dict:
    import onnxruntime as ort
    import torch

    import framefuse

    info = {
        "framefuse_version": framefuse.__version__,
        "torch_version": torch.__version__,
        "onnxruntime_version": ort.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "device": device,
        "gpu": None,
        "compute_capability": None,
        "cuda": getattr(torch.version, "cuda", None),
    }
    with contextlib.suppress(Exception):
        import transformers

        info["transformers_version"] = transformers.__version__
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        info["gpu"] = torch.cuda.get_device_name()
        info["compute_capability"] = f"{major}.{minor}"
    return info


def _rounds_note(cfg: dict) -> str:
    rounds = cfg.get("rounds", 1)
    if rounds <= 1:  # runs before 2026-11-26 timed each engine in one stretch
        return ""
    order = ", in an order rotated each round" if cfg.get("round_order") == ROUND_ORDER else ""
    return (
        f", timed in {rounds} interleaved rounds of a row's engines{order} (the resident kernel and "
        "torch.compile reduce-overhead alone, after)"
    )


def _ms(us) -> str:
    return f"{us / 1000:.3f}" if us is not None else "—"


def _us(us) -> str:
    return f"{us:.1f}" if us is not None else "—"


def _x(value) -> str:
    return f"{value:.2f}×" if value is not None else "—"


def _cell(e: dict | None, key: str, fmt: Callable) -> str:
    if e is None:
        return "—"
    if key in e:
        return fmt(e[key])
    if "error" in e:
        return "failed"
    if "skipped" in e:
        return "skipped"
    return "—"


def _engine_names(rows: list[dict]) -> list[str]:
    names = ["framefuse", *ABLATIONS, *PEERS, FLOOR]
    return [n for n in names if any(n in r.get("engines", {}) for r in rows)]


def _below_line(rows: list[dict], what: str) -> str:
    below = [
        f"{r['arch']} T={r['T']} ({r['speedup_vs_best_peer']:.2f}× vs {ENGINE_LABELS[r['best_peer']]})"
        for r in sorted(rows, key=lambda r: (r["T"], r["arch"]))
        if r.get("speedup_vs_best_peer") is not None and r["speedup_vs_best_peer"] < 1.0
    ]
    missing = [f"{r['arch']} T={r['T']}" for r in rows if r.get("speedup_vs_best_peer") is None]
    line = f"**{what}: rows where framefuse is below 1.0× of the best peer ({len(below)} of {len(rows)}):** " + (
        ", ".join(below) if below else "none"
    )
    if missing:
        line += f". No ratio (framefuse or every peer failed): {', '.join(missing)}"
    return line + "."


def engine_section(rows: list[dict], *, title: str, seed_table: bool) -> list[str]:
    """Tables of one section (zoo / real): per T the ranking, then µs, ratios, floor multiples, kernels."""
    lines: list[str] = [f"## {title}", ""]
    if not rows:
        return [*lines, "(no rows)", ""]
    lines += [_below_line(rows, title), ""]
    for T in sorted({r["T"] for r in rows}):
        subset = [r for r in rows if r["T"] == T]
        if seed_table:
            head = "T = 1 (step form: one frame in, state kept on the device)" if T == 1 else f"T = {T} (sequence form)"
        else:
            head = f"T = {T}" + (" (a length-1 sequence: these models have no step form)" if T == 1 else "")
        lines += [
            f"### {head}",
            "",
            "| rank | architecture | category | ms | p99 ms | FPS | viable at 60 FPS | best peer | peer ms | speedup "
            "| × floor | × mapped floor | kernels / call | levels | µs / level | selection |",
            "|---:|---|---|---:|---:|---:|:---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        ranked = sorted(subset, key=lambda r: r.get("engines", {}).get("framefuse", {}).get("p50_us", float("inf")))
        for rank, r in enumerate(ranked, 1):
            ff = r.get("engines", {}).get("framefuse", {})
            if "p50_us" in ff:
                ms, p99, fps = _ms(ff["p50_us"]), _ms(ff["p99_us"]), f"{ff['fps']:,.0f}"
            else:
                ms = p99 = fps = "—"
            best = r.get("best_peer")
            peer = ENGINE_LABELS[best] if best else "—"
            viable = "yes" if r.get("viable_60fps") else "no"
            selection = ff.get("selection", {})
            chosen = selection.get("chosen") or "—"
            if selection.get("graph") == "unfused" and "unfused" not in chosen:
                chosen = f"unfused+{chosen}"
            kernels = ff.get("kernels", {}).get("kernels_per_call")
            step_kernel = ff.get("stepkernel") or {}
            per_level = step_kernel.get("us_per_level")
            lines.append(
                f"| {rank} | {r['arch']} | {r['category']} | {ms} | {p99} | {fps} | {viable} | {peer} "
                f"| {_ms(r.get('best_peer_p50_us'))} | {_x(r.get('speedup_vs_best_peer'))} "
                f"| {_x(r.get('floor_multiple'))} | {_x(r.get('mapped_floor_multiple'))} "
                f"| {'—' if kernels is None else f'{kernels:g}'} | {step_kernel.get('levels', '—')} "
                f"| {'—' if per_level is None else f'{per_level:.2f}'} | {chosen} |"
            )
        lines.append("")
    names = _engine_names(rows)
    header = "| architecture | T | " + " | ".join(ENGINE_LABELS[n] for n in names) + " |"
    rule = "|---|---:|" + "---:|" * len(names)
    ordered = sorted(rows, key=lambda r: (r["T"], r["arch"]))
    tables = [
        ("p50 µs per call (host → host)", "p50_us", _us),
        ("p99 µs per call", "p99_us", _us),
        ("speedup vs the best peer of the row (best peer p50 / engine p50; < 1 is slower)", "speedup_vs_best_peer", _x),
        ("p50 as a multiple of the floor", "floor_multiple", _x),
        ("p50 as a multiple of the mapped floor", "mapped_floor_multiple", _x),
    ]
    for caption, key, fmt in tables:
        lines += [f"#### {caption}", "", header, rule]
        for r in ordered:
            cells = [_cell(r.get("engines", {}).get(n), key, fmt) for n in names]
            lines.append(f"| {r['arch']} | {r['T']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "#### GPU kernels per call (torch.profiler, CUDA activity; memcpy apart)",
        "",
        "| architecture | T | framefuse kernels | framefuse kernel µs | best torch peer | its kernels | its kernel µs |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in ordered:
        k = r.get("kernels") or {}
        if "skipped" in k:
            lines.append(f"| {r['arch']} | {r['T']} | skipped: {k['skipped']} | | | | |")
            continue
        ff = k.get("framefuse", {})
        peer = r.get("best_torch_peer")
        pk = k.get(peer, {}) if peer else {}

        def num(d, key, fmt="{:.1f}"):
            return fmt.format(d[key]) if key in d else ("failed" if "error" in d else "—")

        lines.append(
            f"| {r['arch']} | {r['T']} | {num(ff, 'kernels_per_call')} | {num(ff, 'kernel_us_per_call')} "
            f"| {ENGINE_LABELS.get(peer, '—') if peer else '—'} | {num(pk, 'kernels_per_call')} "
            f"| {num(pk, 'kernel_us_per_call')} |"
        )
    lines.append("")
    return lines


def precision_section(rows: list[dict]) -> list[str]:
    lines = [
        "## Precision: the framefuse engine at fp32 / fp16 / bf16 / int8 (step form, T = 1)",
        "",
        "Graphs as `framefuse build --precision` makes them (framefuse.build.convert_precision: fp16/bf16 "
        "storage conversion, int8 weight-only by default, the accuracy gate, and for int8 the fallback that "
        'keeps the most sensitive products in float32 until the gate passes); the engine built with select="time". '
        "A step kernel of a precision build computes with the weights as the graph stores them and float32 "
        "activations and state; a selection name ending in @fp16 / @bf16 / @int8 reads those weight rows in that "
        "format (engines/fusion.PRECISION_ROWS), checked against the converted graph's plan within the "
        "precision's tolerance. An architecture's precisions and its floor are built first, then timed in the "
        "same interleaved rounds: speedup vs fp32 compares samples from the same windows of the host. "
        "Build's kernel vs fp32: the build's own timing of the chosen step kernel beside the fp32 graph's "
        "kernels in the same rounds (µs a replay; device work and launch, no host copy). "
        "Accuracy: the accuracy report of the converted graph against the fp32 graph over a rollout (each side "
        "carries its own state); max abs error of the policy output y and of every output (next state "
        "included); argmax agreement of y. Gate: yes = `framefuse build` ships this graph (with the products "
        "the int8 fallback kept in float32 counted); no = the build refuses it (timed anyway, from the plain "
        "conversion).",
        "",
    ]
    if not rows:
        return [*lines, "(no rows)", ""]
    lines += [
        "| architecture | precision | p50 µs | p99 µs | × floor | speedup vs fp32 | build's kernel vs fp32 µs "
        "| max abs err (y) | max abs err (all outputs) | argmax agreement | frames | gate | selection |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---|",
    ]
    order = {p: i for i, p in enumerate(PRECISIONS)}
    for r in sorted(rows, key=lambda r: (r["arch"], order.get(r["precision"], 9))):
        acc = r.get("accuracy") or {}
        if "error" in r:
            lines.append(f"| {r['arch']} | {r['precision']} | failed: {r['error'][:120]} | | | | | | | | | | |")
            continue
        if r["precision"] == "fp32":
            err_y = err_all = agree = frames = "reference"
            gate = "—"
        else:
            err_y = f"{acc['max_abs_policy']:.2e}" if acc.get("max_abs_policy") is not None else "—"
            err_all = f"{acc['max_abs_all']:.2e}" if acc.get("max_abs_all") is not None else "—"
            agree = f"{100 * acc['argmax_agreement']:.2f}%" if acc.get("argmax_agreement") is not None else "—"
            frames = str(acc.get("frames", "—"))
            gate = _gate_cell(r)
        selection = r.get("selection") or {}
        vs = selection.get("vs_fp32") or {}
        kernel = (
            f"{vs['us_per_step']:.2f} / {vs['fp32_us_per_step']:.2f}"
            if vs.get("us_per_step") is not None and vs.get("fp32_us_per_step") is not None
            else "—"
        )
        lines.append(
            f"| {r['arch']} | {r['precision']} | {_us(r.get('p50_us'))} | {_us(r.get('p99_us'))} "
            f"| {_x(r.get('floor_multiple'))} | {_x(r.get('speedup_vs_fp32'))} | {kernel} | {err_y} | {err_all} "
            f"| {agree} | {frames} | {gate} | {selection.get('chosen') or '—'} |"
        )
    lines.append("")
    narrow = [r for r in rows if r["precision"] != "fp32" and "error" not in r and r.get("speedup_vs_fp32")]
    slower = [r for r in narrow if r["speedup_vs_fp32"] < 1.0]
    if narrow:
        listed = ", ".join(f"{r['arch']} {r['precision']} {r['speedup_vs_fp32']:.2f}×" for r in slower)
        lines += [
            f"**Precision rows slower than fp32 in the same rounds: {len(slower)} of {len(narrow)}**"
            + (f": {listed}." if slower else "."),
            "",
        ]
    return lines


def _gate_cell(row: dict) -> str:
    acc = row.get("accuracy") or {}
    if row.get("refused") or not acc.get("passed"):
        return "no"
    kept = acc.get("kept_fp32")
    return f"yes (fp32: {', '.join(kept)})" if kept else "yes"


def _measured_lengths(results: dict, cfg: dict) -> str:
    """The sequence lengths the rows hold ("1", "1 and 32"): a run of one form measured one."""
    lengths = sorted({int(r["T"]) for key in ("rows", "real_rows") for r in results.get(key, []) if "T" in r})
    if not lengths:
        lengths = [1, int(cfg["seq"])]
    return " and ".join(str(t) for t in lengths)


def _frame_gap_note(cfg: dict) -> str:
    """What the settings line says of --frame-gap and --frame-hz (nothing for calls back to back)."""
    nbytes, hz = int(cfg.get("frame_gap_bytes") or 0), float(cfg.get("frame_hz") or 0)
    note = ""
    if nbytes:
        from framefuse.engines.framegap import describe

        note += (
            f"; **{describe(nbytes)} written before every timed call**, off the clock (--frame-gap: a game's own "
            "work between two frames, which evicts what the CPU's caches held)"
        )
    if hz:
        note += f"; **calls paced at {hz:g} Hz** (--frame-hz: each waits for the next tick, as a bot waits for a frame)"
    return note


def markdown(results: dict) -> str:
    env = results["environment"]
    cfg = results["config"]
    gpu = env.get("gpu") or "no GPU (CPU executor)"
    lines = ["# framefuse end-to-end benchmark", ""]
    if results.get("quick"):
        lines += [f"> **{QUICK_NOTE}** (--quick: fewer calls; compile peers may be skipped).", ""]
    if results.get("prebuild"):
        lines += [f"> **{PREBUILD_NOTE}** (--prebuild {','.join(results['prebuild'])}): not a result.", ""]
    lines += [
        f"GPU: **{gpu}**"
        + (f" (compute capability {env['compute_capability']})" if env.get("compute_capability") else "")
        + f" · torch {env['torch_version']} · onnxruntime {env['onnxruntime_version']}"
        + (f" · transformers {env['transformers_version']}" if env.get("transformers_version") else "")
        + f" · framefuse {env['framefuse_version']} · {_when(results)}",
        "",
        f"Settings: sections {', '.join(results.get('sections', ['zoo']))}; zoo embed {cfg['embed']}, "
        f"{cfg['layers']} layers, batch 1, T = {_measured_lengths(results, cfg)}; {cfg['iters']} timed calls after {cfg['warmup']} "
        f"warm-up calls per engine{_rounds_note(cfg)}{_frame_gap_note(cfg)}; kernel profile over {cfg.get('profile_calls', '—')} "
        "calls; fp32 everywhere (TF32 off).",
    ]
    if results.get("merged_from"):
        lines.append(f"Merged from {len(results['merged_from'])} runs of one GPU: {', '.join(results['merged_from'])}.")
        by_run: dict[str, list[str]] = {}
        for r in [*results.get("rows", []), *results.get("real_rows", []), *results.get("precision_rows", [])]:
            run = r.get("run") or {}
            label = run.get("file", "?") + (f" (a merge of {run['merge_of']} runs)" if run.get("merge_of") else "")
            what = r["precision"] if "precision" in r else f"T = {r['T']}"
            by_run.setdefault(label, []).append(f"{r['arch']} {what}")
        lines.append("Rows by run: " + "; ".join(f"{label}: {', '.join(rows)}" for label, rows in by_run.items()) + ".")
    lines += [
        "",
        "Latency is host input → host output per call, measured the same way for every engine (p50; p99 beside). "
        'Peers: torch eager; torch eager captured in a CUDA graph; torch.compile(mode="reduce-overhead"); '
        'torch.compile(mode="max-autotune-no-cudagraphs") captured by hand in a CUDA graph with static buffers; '
        "ONNX Runtime CPU. Best peer = the lowest p50 among them in the same row. Speedup = best peer p50 / "
        "framefuse p50 (< 1.00× means framefuse is slower). The floor is a CUDA graph of only the pinned H2D "
        "input copy, one trivial kernel and the D2H output copy, replayed and synchronised: × floor = p50 / floor "
        "p50. The mapped floor is a CUDA graph of one trivial kernel reading the frame from and writing the output "
        "to pinned, mapped host memory (no copies), launched and synchronised: what a one-kernel step cannot go "
        "below; × mapped floor = p50 / mapped floor p50. The mapped floor, done word, is the same kernel raising a "
        "word in mapped memory that the host spins on through engines/hostpath.c, as Session.step waits on the step "
        "kernel (no stream synchronisation). Kernels / call: torch.profiler over the profiled calls; "
        "levels and µs / level: the step compiler's dependency levels and its kernel time per call / levels, when "
        'the build chose it. framefuse is the engine `framefuse build` makes (build-time selection select="time"; the chosen '
        "candidate is in the selection column, its timings in the JSON). Viable at 60 FPS: framefuse p99 ≤ 16.67 ms.",
        "",
    ]
    if results.get("rows") or "zoo" in results.get("sections", ["zoo"]):
        lines += engine_section(results.get("rows", []), title="Zoo architectures", seed_table=True)
    if results.get("real_rows") or "real" in results.get("sections", []):
        lines += engine_section(
            results.get("real_rows", []),
            title="Real models (tests/real_models: transformers, torch.nn)",
            seed_table=False,
        )
        lines += [
            "The real models are exported in their sequence form only; T = 1 is a length-1 sequence (no state "
            "carried between calls), not a step.",
            "",
        ]
    if results.get("precision_rows") or "precision" in results.get("sections", []):
        lines += precision_section(results.get("precision_rows", []))
    every = [*results.get("rows", []), *results.get("real_rows", [])]
    failures = [(r, n, e["error"]) for r in every for n, e in r.get("engines", {}).items() if "error" in e]
    problems = [r for r in every if "rewrite_error" in r or "export_error" in r]
    prec_fail = [r for r in results.get("precision_rows", []) if "error" in r]
    if failures or problems or prec_fail or results.get("errors") or results.get("not_run") or results.get("missing"):
        lines += ["## Failures and gaps", ""]
        for r in problems:
            what = "export failed" if "export_error" in r else "rewrite failed"
            lines.append(
                f"- {r['section']} {r['arch']} T={r['T']}: {what}: {r.get('export_error') or r['rewrite_error']}"
            )
        for r, n, err in failures:
            lines.append(f"- {r.get('section', 'zoo')} {r['arch']} T={r['T']} {ENGINE_LABELS[n]}: {err}")
        for r in prec_fail:
            lines.append(f"- precision {r['arch']} {r['precision']}: {r['error']}")
        for message in results.get("errors", []):
            lines.append(f"- {message}")
        for what in results.get("not_run", []):
            lines.append(f"- not run (time budget): {what}")
        if results.get("missing"):
            lines.append(f"- no row in any merged run: {', '.join(results['missing'])}")
    lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> str | None:
    """The PNG: a panel per section (zoo, real models) and T; returns an error message instead of
    raising when matplotlib is missing (and writes no PNG when there are no rows)."""
    panels = [
        (title, T, [r for r in rows if r["T"] == T])
        for title, rows in (("zoo", results.get("rows") or []), ("real models", results.get("real_rows") or []))
        for T in sorted({r["T"] for r in rows})
    ]
    if not panels:
        path.unlink(missing_ok=True)
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot: matplotlib is not installed ({exc})"
    names = ["framefuse", "framefuse_unfused", *PEERS, FLOOR]
    most = max(len(subset) for _, _, subset in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 0.6 * max(most, 4) + 3), squeeze=False)
    for ax, (title, T, subset) in zip(axes[0], panels):
        subset = sorted(subset, key=lambda r: r["arch"])
        y = np.arange(len(subset))
        height = 0.8 / len(names)
        for k, name in enumerate(names):
            values = [r["engines"].get(name, {}).get("p50_us", np.nan) for r in subset]
            ax.barh(y + k * height, values, height=height, label=ENGINE_LABELS[name])
        ax.set_yticks(y + 0.4 - height / 2)
        ax.set_yticklabels([r["arch"] for r in subset])
        ax.set_xscale("log")
        ax.axvline(BUDGET_MS * 1000, color="red", linestyle="--", linewidth=1, label="60 FPS budget")
        ax.set_xlabel("p50 latency per call, µs (host → host, log scale)")
        ax.set_title(f"{title}, T = {T}" + (" (step)" if T == 1 else " (sequence)"))
        ax.invert_yaxis()
    axes[0][0].legend(loc="lower right", fontsize=7)
    gpu = results["environment"].get("gpu") or "CPU only"
    cfg = results["config"]
    quick = f" — {QUICK_NOTE}" if results.get("quick") else ""
    fig.suptitle(f"framefuse e2e — {gpu} — embed {cfg['embed']}, {cfg['layers']} layers, batch 1{quick}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_reports(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "e2e.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, default=str))
    os.replace(tmp, out / "e2e.json")
    (out / "e2e.md").write_text(markdown(results))
    problem = plot(results, out / "e2e.png")
    if problem:
        results.setdefault("notes", [])
        if problem not in results["notes"]:
            results["notes"].append(problem)
            say(problem)


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/e2e.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser.parse_args(argv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench/results", help="folder for e2e.json / e2e.md / e2e.png")
    parser.add_argument(
        "--section",
        default="zoo",
        help="zoo, real, precision (comma-separated) or all (default zoo)",
    )
    parser.add_argument(
        "--archs", default=None, help="comma-separated zoo architectures for zoo and precision (default: all)"
    )
    parser.add_argument(
        "--models", default=None, help=f"comma-separated tests/real_models names (default: {','.join(REAL_MODELS)})"
    )
    parser.add_argument(
        "--precisions", default=",".join(PRECISIONS), help="precision section: which (default fp32,fp16,bf16,int8)"
    )
    parser.add_argument(
        "--accuracy-frames", type=int, default=1000, help="precision section: rollout frames of the accuracy report"
    )
    parser.add_argument("--iters", type=int, default=None, help="timed calls per engine (default 1000; --quick 200)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 100; --quick 20)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"a row's engines are timed in this many interleaved rounds of iters/rounds calls (default {ROUNDS})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"fewer calls, compile peers only for the step form; marked '{QUICK_NOTE}'",
    )
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32, help="T of the sequence form (default 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--forms",
        default=",".join(FORMS),
        help="zoo and real: which rows, step (T = 1) and/or sequence (T = --seq) (default both); a row holds "
        "all of its peers either way, so a long T = --seq row can run in a call of its own and be merged",
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is a GPU")
    parser.add_argument(
        "--compile",
        choices=["all", "step", "none"],
        default=None,
        help="which forms get the torch.compile peers (default all; only --quick may skip: then default step)",
    )
    parser.add_argument(
        "--profile-calls", type=int, default=20, help="calls profiled for the kernel counts (0: no profile)"
    )
    parser.add_argument("--no-driver-replay", action="store_true", help="skip the driver-replay ablation")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="stop starting new architectures/models after S seconds (what was measured is kept)",
    )
    parser.add_argument(
        "--no-isolate",
        action="store_true",
        help="GPU: run every architecture/model in this process (default: one child process each, so that a "
        "sticky CUDA error in one peer cannot end the whole run)",
    )
    parser.add_argument(
        "--prebuild",
        metavar="ENGINES",
        default=None,
        help="build these engines of every row (comma-separated names as in e2e.json, e.g. "
        "torch_compile_autotune_graph,torch_compile) and run each once, untimed, to fill the compile caches "
        "(TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, FRAMEFUSE_CACHE) for a later run whose row must fit a "
        "time limit; the report is marked and cannot be merged",
    )
    parser.add_argument(
        "--frame-gap",
        default="0",
        metavar="BYTES",
        help="write this many bytes (e.g. 32M) before every timed call of every engine, off the clock: a game's "
        "own work between two frames, which evicts what the CPU's caches held (framefuse/engines/framegap.py); "
        "0 (default): calls back to back, as every run before 2026-12-05",
    )
    parser.add_argument(
        "--frame-hz",
        type=float,
        default=0.0,
        metavar="HZ",
        help="pace every engine's timed calls at this rate (after --frame-gap's sweep), as a bot's thread waits "
        "for the game's next frame: 1000 calls at 60 Hz take 17 s an engine; 0 (default): back to back",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help="folder for the exported artifacts (default: a temporary folder)")
    parser.add_argument("--merge", nargs="+", metavar="E2E_JSON", help="merge earlier e2e.json files into one report")


def merge(paths: list[str], out: Path) -> dict:
    """One report of several runs of one GPU: rows by (arch, T) (zoo, real) and (arch, precision);
    a later file's row replaces an earlier one's. Quick if any part was quick."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    for part, path in zip(parts, paths):
        if part.get("prebuild"):
            raise SystemExit(f"{path}: a --prebuild run ({PREBUILD_NOTE}): nothing to merge")
    gpus = {p["environment"].get("gpu") for p in parts}
    if len(gpus) > 1:
        raise SystemExit(f"refusing to merge results from different GPUs: {sorted(map(str, gpus))}")
    merged = dict(parts[0])
    keys = {
        "rows": lambda r: (r["arch"], r["T"]),
        "real_rows": lambda r: (r["arch"], r["T"]),
        "precision_rows": lambda r: (r["arch"], r["precision"]),
    }
    for field, key in keys.items():
        rows: dict = {}
        for part, path in zip(parts, paths):
            for row in part.get(field, []):
                rows[key(row)] = dict(row, run=row.get("run") or _origin(row, field, key, part, path))
        merged[field] = list(rows.values())
    sections: list[str] = []
    for part in parts:
        for s in part.get("sections", ["zoo"] if part.get("rows") else []):
            if s not in sections:
                sections.append(s)
    merged["sections"] = sections
    merged["errors"] = [e for part in parts for e in part.get("errors", [])]
    merged["not_run"] = [
        what if what.endswith(")") else f"{what} ({_run_of(part, path)['file']})"
        for part, path in zip(parts, paths)
        for what in part.get("not_run", [])
        if not _covered(what, part, merged)
    ]
    merged["missing"] = _missing(merged)
    merged["quick"] = any(part.get("quick") for part in parts)
    if merged["quick"]:
        merged["publication"] = QUICK_NOTE
    else:
        merged.pop("publication", None)
    merged["configs"] = [
        dict(part["config"], created=part.get("created"), file=str(p)) for part, p in zip(parts, paths)
    ]
    comparable = (
        *("embed", "layers", "seq", "iters", "warmup", "compile", "rounds", "round_order"),
        *("frame_gap_bytes", "frame_hz"),
    )
    defaults = {"frame_gap_bytes": 0, "frame_hz": 0.0}  # (runs before them had neither: back to back)
    differing = [
        k for k in comparable if len({json.dumps(part["config"].get(k, defaults.get(k))) for part in parts}) > 1
    ]
    if "round_order" in differing:  # the report's settings line then claims no order
        merged["config"] = dict(merged["config"], round_order=None)
    for key in ("frame_gap_bytes", "frame_hz"):  # ... nor a frame gap (each run's is in configs)
        if key in differing:
            merged["config"] = dict(merged["config"], **{key: None})
    if differing:
        merged.setdefault("notes", []).append(f"merged runs differ in {', '.join(differing)} (see configs)")
        say(f"warning: merged runs differ in {', '.join(differing)}")
    merged["merged_from"] = [str(p) for p in paths]
    write_reports(merged, out)
    return merged


def _run_of(part: dict, path) -> dict:
    """Where a merged row was measured: its result file (a merge's own rows name the merge, whose
    merged_from lists its runs) and when that run started."""
    run = {"file": str(path), "created": part.get("created")}
    if part.get("merged_from"):
        run["merge_of"] = len(part["merged_from"])
    return run


def _origin(row: dict, field: str, key: Callable, part: dict, path) -> dict:
    """The run a row came from. A row of an older merge (made before rows named their run) is
    traced through that merge's merged_from files, where they are still on disk: the last of them
    holding the same row, framefuse's p50 equal."""
    for named in reversed(part.get("merged_from") or []):
        # as written when that merge ran: from its working folder, which may have been the merge's own
        near = [Path(named), Path(path).parent / named, Path(path).parent.parent / named]
        source = next((os.path.normpath(c) for c in near if c.is_file()), None)
        try:
            earlier = json.loads(Path(source).read_text()) if source else None
        except (OSError, ValueError):
            earlier = None
        if earlier is None:
            continue
        for candidate in earlier.get(field, []):
            if key(candidate) == key(row) and _ff_p50(candidate) == _ff_p50(row):
                return candidate.get("run") or _origin(candidate, field, key, earlier, source)
    return _run_of(part, path)


def _ff_p50(row: dict):
    return row.get("engines", {}).get("framefuse", {}).get("p50_us", row.get("p50_us"))


def _when(results: dict) -> str:
    """When the report's rows were measured: its run's start, or a merge's first and last rows' runs."""
    runs = sorted(
        {str((r.get("run") or {}).get("created")) for key in ROW_KEYS.values() for r in results.get(key, [])} - {"None"}
    )
    if results.get("merged_from") and len(runs) > 1:
        return f"rows measured {runs[0]} to {runs[-1]}"
    return str(results["created"])


def _missing(merged: dict) -> list[str]:
    """The rows a merged report lacks: every zoo architecture and every benchmarked real model at
    each T the report has rows for in either section (a report of T = 1 real rows and T = 32 zoo
    rows lacks the real models' T = 32 rows too), where no run has one (named whether or not a run
    tried)."""
    from framefuse.models import ARCHITECTURES

    fields = (("rows", "zoo", ARCHITECTURES), ("real_rows", "real", REAL_MODELS))
    seqs = sorted({r["T"] for field, _, _ in fields for r in merged.get(field, [])})
    missing = []
    for field, section, names in fields:
        if not merged.get(field):
            continue  # a report without this section (zoo only, say) lacks none of its rows
        have = {(r["arch"], r["T"]) for r in merged[field]}
        missing += [f"{section} {name} T={T}" for T in seqs for name in names if (name, T) not in have]
    return missing


def _covered(what: str, part: dict, merged: dict) -> bool:
    """Whether a unit that ``part`` did not run ("zoo xlstm", "real gpt2_sdpa T=32", "precision
    mamba") has its rows in the merged report, from another run (every T that part asked for)."""
    section, _, rest = what.split(" (", 1)[0].partition(" ")
    name, _, seq = rest.partition(" T=")
    config = part.get("config", {})
    if section == "zoo":
        wanted = {1 if form == "step" else config.get("seq") for form in config.get("forms") or FORMS}
        return wanted <= {r["T"] for r in merged.get("rows", []) if r["arch"] == name}
    if section == "real" and seq.isdigit():
        return any(r["arch"] == name and r["T"] == int(seq) for r in merged.get("real_rows", []))
    if section == "precision":
        wanted = set(config.get("precisions") or [])
        have = {r["precision"] for r in merged.get("precision_rows", []) if r["arch"] == name}
        return bool(wanted) and wanted <= have
    return False


def _sections(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return list(SECTIONS)
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names:
        raise SystemExit(f"--section: unknown {unknown or text!r}; use {', '.join(SECTIONS)} or all")
    return names


def child_argv(args, section: str, item: str, out: Path, work: Path) -> list[str]:
    """The command line of one isolated unit (one section, one architecture or real model)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--section", section, "--out", str(out)]
    argv += ["--models" if section == "real" else "--archs", item, "--work", str(work)]
    for flag in ("iters", "warmup", "embed", "layers", "seq", "seed", "forms", "compile", "device", "accuracy_frames"):
        value = getattr(args, flag, None)
        if value is not None:
            argv += [f"--{flag.replace('_', '-')}", str(value)]
    argv += ["--profile-calls", str(getattr(args, "profile_calls", 20))]
    argv += ["--precisions", getattr(args, "precisions", None) or ",".join(PRECISIONS)]
    if args.quick:
        argv.append("--quick")
    if args.no_driver_replay:
        argv.append("--no-driver-replay")
    if getattr(args, "prebuild", None):
        argv += ["--prebuild", args.prebuild]
    argv += ["--frame-gap", str(getattr(args, "frame_gap", None) or "0")]
    argv += ["--frame-hz", str(getattr(args, "frame_hz", None) or 0)]
    return argv


def _take_over(runner: Runner, committed: dict, out: Path) -> tuple[dict, int]:
    """The rows of a child's e2e.json after the rows committed before it; (its JSON, its row count)."""
    part: dict = {}
    with contextlib.suppress(Exception):
        part = json.loads((out / "e2e.json").read_text())
    for key in ROW_KEYS.values():
        runner.results[key] = committed[key] + list(part.get(key, []))
    return part, sum(len(part.get(k, [])) for k in ROW_KEYS.values())


def run_isolated(runner: Runner, units: list[tuple[str, str]], work: Path) -> None:
    """Each (section, item) in a child process; its rows are taken over when it ends (the child
    rewrites its e2e.json after every row), a crash is recorded with the end of its output."""
    import subprocess

    for n, (section, item) in enumerate(units, 1):
        if runner.over_budget(f"{section} {item}"):
            continue
        out = work / "units" / f"{section}-{item}"
        say(f"[{n}/{len(units)}] {section} {item}: child process")
        argv = child_argv(runner.args, section, item, out, work / "artifacts" / f"{section}-{item}")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        committed = {key: list(runner.results[key]) for key in ROW_KEYS.values()}
        part: dict = {}
        seen = 0
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("[e2e"):
                print(line, end="", flush=True)
                if "× vs best peer" in line or (" p50 " in line and section == "precision"):
                    part, count = _take_over(runner, committed, out)  # rows survive a parent killed at its limit
                    if count != seen:
                        seen = count
                        write_reports(runner.results, runner.out)
            tail = (tail + [line.rstrip()])[-40:]
        rc = proc.wait()
        part, rows = _take_over(runner, committed, out)
        runner.results["errors"].extend(part.get("errors", []))
        runner.results.setdefault("not_run", []).extend(part.get("not_run", []))
        if rc != 0:
            lines = [t for t in tail if t.strip()]
            cause = next((t for t in reversed(lines) if "rror" in t), lines[-1] if lines else "")
            message = f"{section} {item}: the child process ended with status {rc} after {rows} row(s): {cause[:300]}"
            runner.results["errors"].append(message)
            say(f"  {message}")
        write_reports(runner.results, runner.out)


def _written(out: Path) -> str:
    """The report files under ``out``, as a log line names them."""
    return f"{out}/e2e.json, e2e.md" + (", e2e.png" if (out / "e2e.png").exists() else " (no PNG)")


def run(args) -> int:
    out = Path(args.out)
    if args.merge:
        merge(args.merge, out)
        say(f"merged {len(args.merge)} result files into {_written(out)}")
        return 0
    import torch

    from framefuse.models import ARCHITECTURES

    sections = _sections(getattr(args, "section", None) or "zoo")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no GPU")
    archs = args.archs.split(",") if args.archs else list(ARCHITECTURES)
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown:
        raise SystemExit(f"unknown architecture(s) {unknown}; available: {', '.join(ARCHITECTURES)}")
    models = args.models.split(",") if getattr(args, "models", None) else list(REAL_MODELS)
    precisions = [p.strip() for p in (getattr(args, "precisions", None) or ",".join(PRECISIONS)).split(",")]
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise SystemExit(f"--precisions: unknown {bad}; use {', '.join(PRECISIONS)}")
    asked = {x.strip() for x in (getattr(args, "forms", None) or ",".join(FORMS)).split(",") if x.strip()}
    forms = tuple(f for f in FORMS if f in asked)
    stray = asked - set(FORMS)
    if stray or not forms:
        raise SystemExit(f"--forms: unknown {sorted(stray)}; use step and/or sequence")
    iters = args.iters or (200 if args.quick else 1000)
    warmup = args.warmup if args.warmup is not None else (20 if args.quick else 100)
    if args.compile not in (None, "all") and not args.quick:
        raise SystemExit("a full run never skips a compile peer: --compile step|none needs --quick")
    compile_choice = args.compile or ("step" if args.quick else "all")
    compile_forms = {"all": {"step", "sequence"}, "step": {"step"}, "none": set()}[compile_choice]
    replays = set() if args.no_driver_replay else {"driver"}
    prebuild = list(dict.fromkeys(filter(None, args.prebuild.split(",")))) if getattr(args, "prebuild", None) else None
    if prebuild is not None and (not prebuild or set(prebuild) - set(ENGINE_LABELS)):
        unknown = sorted(set(prebuild) - set(ENGINE_LABELS))
        raise SystemExit(f"--prebuild: unknown engine(s) {unknown}; use {', '.join(ENGINE_LABELS)}")
    from framefuse.engines.framegap import parse_bytes

    try:
        frame_gap_bytes = parse_bytes(getattr(args, "frame_gap", None) or "0", what="--frame-gap")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    frame_hz = float(getattr(args, "frame_hz", None) or 0)
    if not 0 <= frame_hz < float("inf"):
        raise SystemExit(f"--frame-hz {frame_hz:g}: give frames a second such as 60 (0: calls back to back)")
    # fp32 everywhere: no TF32 in any engine (framefuse's own contract; the peers match it).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    settings = Settings(
        iters=iters,
        warmup=warmup,
        device=device,
        compile_forms=compile_forms,
        replays=replays,
        profile_calls=max(0, getattr(args, "profile_calls", 20)),
        quick=args.quick,
        rounds=args.rounds,
        prebuild=prebuild,
        frame_gap_bytes=frame_gap_bytes,
        frame_hz=frame_hz,
    )
    work_ctx = contextlib.nullcontext(args.work) if args.work else tempfile.TemporaryDirectory(prefix="ffbench-")
    results = {
        "benchmark": "framefuse e2e",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "quick": bool(args.quick),
        "environment": environment(device),
        "sections": sections,
        "config": {
            "embed": args.embed,
            "layers": args.layers,
            "seq": args.seq,
            "batch": 1,
            "iters": iters,
            "warmup": warmup,
            "compile": compile_choice,
            "archs": archs,
            "forms": list(forms),
            "models": models,
            "precisions": precisions,
            "accuracy_frames": args.accuracy_frames,
            "profile_calls": settings.profile_calls,
            "rounds": settings.rounds,
            "round_order": ROUND_ORDER,
            "frame_gap_bytes": settings.frame_gap_bytes,
            "frame_hz": settings.frame_hz,
            "seed": args.seed,
            "quick": bool(args.quick),
        },
        "rows": [],
        "real_rows": [],
        "precision_rows": [],
        "errors": [],
    }
    if args.quick:
        results["publication"] = QUICK_NOTE
    if prebuild is not None:
        results["prebuild"] = prebuild
        results["publication"] = PREBUILD_NOTE
    label = results["environment"]["gpu"] or "CPU"
    say(
        f"sections {', '.join(sections)} on {label}; {iters} timed calls per engine"
        + (f" ({QUICK_NOTE})" if args.quick else "")
    )
    write_reports(results, out)
    with work_ctx as work:
        work = Path(work)
        runner = Runner(results, out, args, settings)
        if device == "cuda" and not args.no_isolate and not args.child:
            units = [("zoo", a) for a in archs] if "zoo" in sections else []
            units += [("real", m) for m in models] if "real" in sections else []
            units += [("precision", a) for a in archs] if "precision" in sections else []
            run_isolated(runner, units, work)
        else:
            run_sections(runner, sections, archs, models, precisions, work)
    results["elapsed_s"] = round(time.perf_counter() - runner.start, 1)
    write_reports(results, out)
    say(f"wrote {_written(out)} ({results['elapsed_s']:.0f} s)")
    return 0


def run_sections(runner: Runner, sections, archs, models, precisions, work: Path) -> None:
    if "zoo" in sections:
        run_zoo(runner, archs, work)
    if "real" in sections:
        run_real(runner, models, work)
    if "precision" in sections:
        run_precision(runner, archs, precisions, work)


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
