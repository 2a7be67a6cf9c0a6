#!/usr/bin/env python
"""End-to-end benchmark: every zoo architecture, framefuse's engine against its peers, one process.

For each architecture (embed 256, 2 layers, batch 1 by default) and T ∈ {1 (step form), 32
(sequence form)}: export → rewrite → build, then time host input → host output per call for

  framefuse            the cuda-graph engine on model.fused.onnx (Session.step for T=1: state stays
                       on the GPU, one replay + one sync per frame)
  torch eager          the zoo's torch model (pinned host buffers, async copies, one sync)
  torch eager + graph  the same torch code captured in one CUDA graph with the same pinned copies
                       (and, for T=1, the state hand-off) inside
  torch.compile        mode="reduce-overhead" (failures are reported, not fatal)
  ORT CPU              ONNX Runtime (CPU) on the original, unfused graph

plus two ablations that do not count as peers: the framefuse engine on the *unfused* graph (graph
capture without the fused kernels) and framefuse with "driver" replay (cuGraphLaunch through
cuda-python). Each engine's first output is compared with ONNX Runtime's (max abs error in the
JSON). Ratios are to the best peer of the same row, so they compare numbers from one run.

Outputs under --out: e2e.json (everything, GPU name included), e2e.md (the seed project's table:
rank, architecture, category, ms, FPS, viable at 60 FPS, plus all engines) and e2e.png.
Results are rewritten after every architecture, so a run cut short keeps what it measured.

    python bench/e2e.py --out bench/results                 # all archs, 1000 timed calls each
    python bench/e2e.py --quick --archs mamba,lstm --out /tmp/b
    python bench/e2e.py --merge run1/e2e.json run2/e2e.json --out bench/results
    python bench/e2e.py --device cpu --embed 32 --seq 4 --iters 20 --out /tmp/b   # smoke test, no GPU
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
PEERS = ("torch_eager", "torch_cuda_graph", "torch_compile", "ort_cpu")
ABLATIONS = ("framefuse_unfused", "framefuse_driver")
ENGINE_LABELS = {
    "framefuse": "framefuse",
    "framefuse_unfused": "framefuse (unfused graph)",
    "framefuse_driver": "framefuse (driver replay)",
    "torch_eager": "torch eager",
    "torch_cuda_graph": "torch eager + CUDA graph",
    "torch_compile": "torch.compile reduce-overhead",
    "ort_cpu": "ONNX Runtime CPU",
}


def say(message: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# timing


def measure(call: Callable[[int], object], *, iters: int, warmup: int) -> dict:
    """Time ``call(i)`` (one host→host inference) ``iters`` times after ``warmup`` calls."""
    for i in range(warmup):
        call(i)
    ns = np.empty(iters, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(iters):
        start = clock()
        call(i)
        ns[i] = clock() - start
    us = ns / 1e3
    p50, p99 = np.percentile(us, [50, 99])
    return {
        "p50_us": float(p50),
        "p99_us": float(p99),
        "mean_us": float(us.mean()),
        "max_us": float(us.max()),
        "fps": float(1e6 / p50),
        "iters": iters,
    }


def max_abs_err(actual, expected) -> float:
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf")
    return float(np.abs(a - e).max()) if a.size else 0.0


# ---------------------------------------------------------------------------------------------
# the engines: each make_* returns call(i) -> host output of input i (numpy), state carried over


def make_framefuse(path, *, form: str, pool: np.ndarray, device: str, replay: str = "torch"):
    from framefuse.engines.cuda_graph import build_engine
    from framefuse.runtime.session import Session

    engine = build_engine(path, device=device)
    if form == "step":
        session = Session(engine, replay=replay)

        def call(i):
            return session.step(pool[i % POOL])

        call.engine = engine  # type: ignore[attr-defined]
        return call
    binding = engine.create_binding(host_inputs=["x"], host_outputs=["y"])
    binding.set_replay_mode(replay)
    host_in, host_out = binding.host_in["x"], binding.host_out["y"]

    def call(i):
        np.copyto(host_in, pool[i % POOL])
        binding.launch()
        binding.sync()
        return host_out

    call.engine = engine  # type: ignore[attr-defined]
    return call


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


def make_torch_eager(model, *, form: str, pool: np.ndarray, out_shape, device):
    import torch

    io = _TorchIO(torch, pool, out_shape, device)
    state = [s.to(device) for s in model.init_state(pool.shape[1])] if form == "step" else None

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


def make_torch_cuda_graph(model, *, form: str, pool: np.ndarray, out_shape, device):
    import torch

    io = _TorchIO(torch, pool, out_shape, device)
    state = [s.to(device) for s in model.init_state(pool.shape[1])] if form == "step" else None

    def body():
        io.x.copy_(io.pin_in, non_blocking=True)
        if form == "step":
            y, new_state = model.step(io.x, tuple(state))
            for buffer, value in zip(state, new_state):
                buffer.copy_(value)
        else:
            y = model(io.x)
        io.pin_out.copy_(y, non_blocking=True)

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
    if state is not None:
        for buffer in state:
            buffer.zero_()
    torch.cuda.synchronize(device)

    def call(i):
        np.copyto(io.pin_in_np, pool[i % POOL])
        graph.replay()
        io.sync()
        return io.pin_out_np

    return call


def make_torch_compile(model, *, form: str, pool: np.ndarray, out_shape, device):
    import torch

    torch._dynamo.reset()  # every zoo model shares StackedModel.step: do not hit the recompile limit
    io = _TorchIO(torch, pool, out_shape, device)
    state = [s.to(device) for s in model.init_state(pool.shape[1])] if form == "step" else None
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


def make_ort(model_path, *, form: str, pool: np.ndarray, state_names: list[str]):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    state = {
        f"state.{n}": np.zeros([int(d) for d in inputs[f"state.{n}"].shape], dtype=np.float32) for n in state_names
    }
    outputs = ["y"] + [f"next_state.{n}" for n in state_names]

    def call(i):
        feeds = {"x": pool[i % POOL], **state}
        results = session.run(outputs, feeds)
        for n, value in zip(state_names, results[1:]):
            state[f"state.{n}"] = value
        return results[0]

    return call


# ---------------------------------------------------------------------------------------------
# one architecture


def prepare_artifacts(arch: str, *, work: Path, embed: int, layers: int, seq: int, seed: int) -> dict:
    """export (both forms) → rewrite → model.fused.onnx; returns per form the paths and reports."""
    from framefuse.runtime.pipeline import prepare

    config = {"model": {"embed": embed, "layers": layers}, "seq": seq, "batch": 1, "seed": seed}
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


def bench_row(
    arch: str, form: str, entry: dict, *, model, iters: int, warmup: int, device, compile_forms, replays
) -> dict:
    import onnxruntime as ort
    import torch

    manifest = entry["manifest"]
    in_shape = manifest["inputs"][0]["shape"]
    out_shape = manifest["outputs"][0]["shape"]
    state_names = manifest.get("state_names") or []
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((POOL, *in_shape)).astype(np.float32)
    T = 1 if form == "step" else in_shape[1]
    row = {
        "arch": arch,
        "category": getattr(model, "category", "other"),
        "form": form,
        "T": T,
        "input_shape": in_shape,
        "fused_ops": entry.get("fused_ops"),
        "nodes": entry.get("nodes"),
        "engines": {},
    }
    if "fused_error" in entry:
        row["rewrite_error"] = entry["fused_error"]

    # Reference for the correctness column: ONNX Runtime, zero state, first input.
    sess = ort.InferenceSession(str(entry["onnx"]), providers=["CPUExecutionProvider"])
    feeds = {"x": pool[0]}
    for n in state_names:
        spec = next(i for i in manifest["inputs"] if i["name"] == f"state.{n}")
        feeds[f"state.{n}"] = np.zeros(spec["shape"], dtype=np.float32)
    reference = sess.run(["y"], feeds)[0]

    dev = torch.device(device)
    makers: list[tuple[str, Callable[[], Callable]]] = []
    if "fused" in entry:
        makers.append(("framefuse", lambda: make_framefuse(entry["fused"], form=form, pool=pool, device=device)))
        if dev.type == "cuda" and "driver" in replays:
            makers.append(
                (
                    "framefuse_driver",
                    lambda: make_framefuse(entry["fused"], form=form, pool=pool, device=device, replay="driver"),
                )
            )
    makers.append(("framefuse_unfused", lambda: make_framefuse(entry["onnx"], form=form, pool=pool, device=device)))
    makers.append(
        ("torch_eager", lambda: make_torch_eager(model, form=form, pool=pool, out_shape=out_shape, device=dev))
    )
    if dev.type == "cuda":
        makers.append(
            (
                "torch_cuda_graph",
                lambda: make_torch_cuda_graph(model, form=form, pool=pool, out_shape=out_shape, device=dev),
            )
        )
        if form in compile_forms:
            makers.append(
                (
                    "torch_compile",
                    lambda: make_torch_compile(model, form=form, pool=pool, out_shape=out_shape, device=dev),
                )
            )
        else:
            row["engines"]["torch_compile"] = {"skipped": f"not asked for the {form} form (--compile)"}
    else:
        row["engines"]["torch_cuda_graph"] = {"skipped": "no GPU"}
        row["engines"]["torch_compile"] = {"skipped": "no GPU"}
    makers.append(("ort_cpu", lambda: make_ort(entry["onnx"], form=form, pool=pool, state_names=state_names)))

    for name, make in makers:
        try:
            start = time.perf_counter()
            with torch.no_grad():
                call = make()
                first = np.array(call(0), copy=True)  # zero state, input 0: compared with ORT
                setup_s = time.perf_counter() - start
                result = measure(call, iters=iters, warmup=warmup)
            result["setup_s"] = setup_s
            result["max_abs_err_vs_ort"] = max_abs_err(first, reference)
            engine = getattr(call, "engine", None)
            if engine is not None:
                result["replays"] = engine.replays
                result["captures"] = engine.captures
            row["engines"][name] = result
            say(
                f"  {arch:10s} T={T:<3d} {ENGINE_LABELS[name]:32s} p50 {result['p50_us']:9.1f} us  "
                f"p99 {result['p99_us']:9.1f} us  err {result['max_abs_err_vs_ort']:.1e}  (setup {setup_s:.1f} s)"
            )
        except Exception as exc:  # noqa: BLE001 - a failing engine is a result, not a crash
            message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            row["engines"][name] = {"error": message, "traceback": traceback.format_exc(limit=6)}
            say(f"  {arch:10s} T={T:<3d} {ENGINE_LABELS[name]:32s} FAILED: {message}")
        finally:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
    finish_row(row)
    return row


def finish_row(row: dict) -> None:
    """best peer and the framefuse ratio of one row."""
    engines = row["engines"]
    peers = {k: v for k, v in engines.items() if k in PEERS and "p50_us" in v}
    ff = engines.get("framefuse", {})
    if peers:
        best = min(peers, key=lambda k: peers[k]["p50_us"])
        row["best_peer"] = best
        row["best_peer_p50_us"] = peers[best]["p50_us"]
        if "p50_us" in ff:
            row["speedup_vs_best_peer"] = peers[best]["p50_us"] / ff["p50_us"]
    row["viable_60fps"] = bool("p99_us" in ff and ff["p99_us"] <= BUDGET_MS * 1000)


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
    }
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        info["gpu"] = torch.cuda.get_device_name()
        info["compute_capability"] = f"{major}.{minor}"
    return info


def _ms(us) -> str:
    return f"{us / 1000:.3f}" if us is not None else "—"


def markdown(results: dict) -> str:
    env = results["environment"]
    cfg = results["config"]
    gpu = env.get("gpu") or "no GPU (CPU executor)"
    lines = [
        "# framefuse end-to-end benchmark",
        "",
        f"GPU: **{gpu}**"
        + (f" (compute capability {env['compute_capability']})" if env.get("compute_capability") else "")
        + f" · torch {env['torch_version']} · onnxruntime {env['onnxruntime_version']} · framefuse {env['framefuse_version']}",
        "",
        f"embed {cfg['embed']}, {cfg['layers']} layers, batch 1; {cfg['iters']} timed calls after {cfg['warmup']} warm-up "
        f"calls; {results['created']}.",
        "Latency is host input → host output per call (p50; p99 in the next column). FPS = 1 / p50 calls per "
        "second. Viable at 60 FPS: framefuse p99 ≤ 16.67 ms. Speedup = best peer p50 / framefuse p50 "
        "(peers: torch eager, torch eager + CUDA graph, torch.compile reduce-overhead, ONNX Runtime CPU).",
        "",
    ]
    rows = results["rows"]
    for T in sorted({r["T"] for r in rows}):
        subset = [r for r in rows if r["T"] == T]
        title = "T = 1 (step form: one frame in, state kept on the device)" if T == 1 else f"T = {T} (sequence form)"
        lines += [
            f"## {title}",
            "",
            "| rank | architecture | category | ms | p99 ms | FPS | viable at 60 FPS | best peer | peer ms | speedup |",
            "|---:|---|---|---:|---:|---:|:---:|---|---:|---:|",
        ]
        ranked = sorted(subset, key=lambda r: r["engines"].get("framefuse", {}).get("p50_us", float("inf")))
        for rank, r in enumerate(ranked, 1):
            ff = r["engines"].get("framefuse", {})
            if "p50_us" in ff:
                ms, p99, fps = _ms(ff["p50_us"]), _ms(ff["p99_us"]), f"{ff['fps']:,.0f}"
            else:
                ms = p99 = fps = "—"
            best = r.get("best_peer")
            peer = ENGINE_LABELS[best] if best else "—"
            speedup = f"{r['speedup_vs_best_peer']:.2f}×" if "speedup_vs_best_peer" in r else "—"
            viable = "yes" if r.get("viable_60fps") else "no"
            lines.append(
                f"| {rank} | {r['arch']} | {r['category']} | {ms} | {p99} | {fps} | {viable} | {peer} "
                f"| {_ms(r.get('best_peer_p50_us'))} | {speedup} |"
            )
        lines.append("")
    names = ["framefuse", *ABLATIONS, *PEERS]
    lines += [
        "## Every engine (p50 µs; max abs error vs ONNX Runtime in the JSON)",
        "",
        "| architecture | T | " + " | ".join(ENGINE_LABELS[n] for n in names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for r in sorted(rows, key=lambda r: (r["T"], r["arch"])):
        cells = []
        for n in names:
            e = r["engines"].get(n)
            if e is None:
                cells.append("—")
            elif "p50_us" in e:
                cells.append(f"{e['p50_us']:.1f}")
            elif "error" in e:
                cells.append("failed")
            else:
                cells.append("skipped")
        lines.append(f"| {r['arch']} | {r['T']} | " + " | ".join(cells) + " |")
    failures = [(r, n, e["error"]) for r in rows for n, e in r["engines"].items() if "error" in e]
    rewrite_errors = [r for r in rows if "rewrite_error" in r]
    if failures or rewrite_errors:
        lines += ["", "## Failures", ""]
        for r in rewrite_errors:
            lines.append(f"- {r['arch']} T={r['T']}: rewrite failed: {r['rewrite_error']}")
        for r, n, err in failures:
            lines.append(f"- {r['arch']} T={r['T']} {ENGINE_LABELS[n]}: {err}")
    lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> str | None:
    """The PNG; returns an error message instead of raising when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot: matplotlib is not installed ({exc})"
    rows = results["rows"]
    Ts = sorted({r["T"] for r in rows})
    names = ["framefuse", "framefuse_unfused", *PEERS]
    fig, axes = plt.subplots(
        1, len(Ts), figsize=(7 * len(Ts), 0.5 * max(len(rows) // max(len(Ts), 1), 4) + 3), squeeze=False
    )
    for ax, T in zip(axes[0], Ts):
        subset = sorted([r for r in rows if r["T"] == T], key=lambda r: r["arch"])
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
        ax.set_title(f"T = {T}" + (" (step)" if T == 1 else " (sequence)"))
        ax.invert_yaxis()
    axes[0][0].legend(loc="lower right", fontsize=7)
    gpu = results["environment"].get("gpu") or "CPU only"
    cfg = results["config"]
    fig.suptitle(f"framefuse e2e — {gpu} — embed {cfg['embed']}, {cfg['layers']} layers, batch 1")
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
    parser.add_argument("--archs", default=None, help="comma-separated zoo architectures (default: all)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per engine (default 1000; --quick 200)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 100; --quick 20)")
    parser.add_argument("--quick", action="store_true", help="fewer calls, torch.compile only for the step form")
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32, help="T of the sequence form (default 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is a GPU")
    parser.add_argument(
        "--compile",
        choices=["all", "step", "none"],
        default=None,
        help="which forms get a torch.compile peer (default all; --quick: step)",
    )
    parser.add_argument("--no-driver-replay", action="store_true", help="skip the driver-replay ablation")
    parser.add_argument("--work", default=None, help="folder for the exported artifacts (default: a temporary folder)")
    parser.add_argument("--merge", nargs="+", metavar="E2E_JSON", help="merge earlier e2e.json files into one report")


def merge(paths: list[str], out: Path) -> dict:
    parts = [json.loads(Path(p).read_text()) for p in paths]
    gpus = {p["environment"].get("gpu") for p in parts}
    if len(gpus) > 1:
        raise SystemExit(f"refusing to merge results from different GPUs: {sorted(map(str, gpus))}")
    merged = dict(parts[0])
    rows = {}
    for part in parts:
        for row in part["rows"]:
            rows[(row["arch"], row["T"])] = row
    merged["rows"] = list(rows.values())
    merged["merged_from"] = [str(p) for p in paths]
    write_reports(merged, out)
    return merged


def run(args) -> int:
    out = Path(args.out)
    if args.merge:
        merge(args.merge, out)
        say(f"merged {len(args.merge)} result files into {out}/e2e.{{json,md,png}}")
        return 0
    import torch

    from framefuse.config import model_config
    from framefuse.exporter.loading import build_zoo_model
    from framefuse.models import ARCHITECTURES

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no GPU")
    archs = args.archs.split(",") if args.archs else list(ARCHITECTURES)
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown:
        raise SystemExit(f"unknown architecture(s) {unknown}; available: {', '.join(ARCHITECTURES)}")
    iters = args.iters or (200 if args.quick else 1000)
    warmup = args.warmup if args.warmup is not None else (20 if args.quick else 100)
    compile_choice = args.compile or ("step" if args.quick else "all")
    compile_forms = {"all": {"step", "sequence"}, "step": {"step"}, "none": set()}[compile_choice]
    replays = set() if args.no_driver_replay else {"driver"}
    # fp32 everywhere: no TF32 in any engine (framefuse's own contract; the peers match it).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    work_ctx = contextlib.nullcontext(args.work) if args.work else tempfile.TemporaryDirectory(prefix="ffbench-")
    results = {
        "benchmark": "framefuse e2e",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(device),
        "config": {
            "embed": args.embed,
            "layers": args.layers,
            "seq": args.seq,
            "batch": 1,
            "iters": iters,
            "warmup": warmup,
            "compile": compile_choice,
            "archs": archs,
            "seed": args.seed,
        },
        "rows": [],
        "errors": [],
    }
    say(f"{len(archs)} architectures on {results['environment']['gpu'] or 'CPU'}; {iters} timed calls per engine")
    with work_ctx as work:
        work = Path(work)
        for n, arch in enumerate(archs, 1):
            say(f"[{n}/{len(archs)}] {arch}: export → rewrite")
            try:
                forms = prepare_artifacts(
                    arch, work=work, embed=args.embed, layers=args.layers, seq=args.seq, seed=args.seed
                )
            except Exception as exc:  # noqa: BLE001
                message = f"{arch}: export failed: {type(exc).__name__}: {exc}"
                results["errors"].append(message)
                say(message)
                write_reports(results, out)
                continue
            cfg = forms["step"]["manifest"]["config"]
            model = build_zoo_model(arch, model_config(cfg), int(cfg["seed"])).to(device).eval()
            for form in ("step", "sequence"):
                for key in ("fused_ops", "fused_error"):
                    if key in forms[form]:
                        say(f"  {arch} {form}: {key} = {forms[form][key]}")
                row = bench_row(
                    arch,
                    form,
                    forms[form],
                    model=model,
                    iters=iters,
                    warmup=warmup,
                    device=device,
                    compile_forms=compile_forms,
                    replays=replays,
                )
                results["rows"].append(row)
                if "speedup_vs_best_peer" in row:
                    say(
                        f"  {arch} T={row['T']}: framefuse {row['speedup_vs_best_peer']:.2f}× vs best peer "
                        f"({ENGINE_LABELS[row['best_peer']]})"
                    )
                write_reports(results, out)
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
    write_reports(results, out)
    say(f"wrote {out}/e2e.json, e2e.md, e2e.png")
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
