"""Micro-benchmark of every framefuse kernel against its peers, in one process and one run.

    python bench/kernels.py --out bench/results/kernels [--dtype float32] [--op LinearScan ...]

For each op in the registry that has a kernel, at batch 1 / hidden 256 with T ∈ {1, 32} (the game
loop) and at one large size, it times with CUDA events over many repetitions (median and p99):
  framefuse graph    the op's launch captured in a CUDA graph, replayed
  framefuse launch   a plain launch from Python (cuda-python cuLaunchKernel each call)
  eager              the op's plain-loop reference run by torch on the GPU
  eager graph        that loop captured in a CUDA graph
  compile            torch.compile(mode="reduce-overhead") of the loop (T ≤ 64; "failed: why")
  library            cuDNN nn.LSTM / nn.GRU for LSTMSeq / GRUSeq,
                     F.scaled_dot_product_attention for Attention
and prints a markdown table (µs, ratio of the best framefuse variant to the best peer, GB/s for
LinearScan at the large size) with the GPU name, and writes kernels.json + kernels.md to --out.
Ops whose package is not importable are skipped with a line saying why. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

try:
    import framefuse  # noqa: F401
except ImportError:  # run as `python bench/kernels.py` from a checkout
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

HIDDEN = 256


# ------------------------------------------------------------------------------- input builders
# Each builder returns (inputs in schema order, attrs, description). Magnitudes keep every
# recurrence stable so timings are of normal numbers, not of NaN/denormal paths.


def _r(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def build_linear_scan(batch, steps, dtype, large):
    d = 1024 if large else HIDDEN
    a = torch.sigmoid(torch.randn(batch, steps, d, device="cuda") + 2).to(dtype)
    return [a, _r(batch, steps, d, dtype=dtype), torch.zeros(batch, d, device="cuda")], {}, f"B{batch} T{steps} D{d}"


def build_selective_scan(batch, steps, dtype, large):
    d, n = (1024, 16) if large else (2 * HIDDEN, 16)
    inputs = [
        _r(batch, steps, d, dtype=dtype),
        _r(batch, steps, d, dtype=dtype, scale=0.5),
        -torch.exp(torch.randn(d, n, device="cuda") * 0.5),
        _r(batch, steps, n, dtype=dtype),
        _r(batch, steps, n, dtype=dtype),
        torch.randn(d, device="cuda"),
        _r(batch, steps, d, dtype=dtype),
        torch.randn(d, device="cuda") * 0.1,
        torch.zeros(batch, d, n, device="cuda"),
    ]
    return inputs, {"delta_softplus": 1}, f"B{batch} T{steps} D{d} N{n}"


def build_lstm_seq(batch, steps, dtype, large):
    h = HIDDEN
    s = 1 / math.sqrt(h)
    inputs = [
        _r(steps, batch, h, dtype=dtype),
        _r(4 * h, h, dtype=dtype, scale=s),
        _r(4 * h, h, dtype=dtype, scale=s),
        _r(8 * h, dtype=dtype, scale=s),
        torch.zeros(batch, h, device="cuda"),
        torch.zeros(batch, h, device="cuda"),
    ]
    return inputs, {}, f"T{steps} B{batch} I{h} H{h}"


def build_gru_seq(batch, steps, dtype, large):
    h = HIDDEN
    s = 1 / math.sqrt(h)
    inputs = [
        _r(steps, batch, h, dtype=dtype),
        _r(3 * h, h, dtype=dtype, scale=s),
        _r(3 * h, h, dtype=dtype, scale=s),
        _r(6 * h, dtype=dtype, scale=s),
        torch.zeros(batch, h, device="cuda"),
    ]
    return inputs, {}, f"T{steps} B{batch} I{h} H{h}"


def build_attention(batch, steps, dtype, large):
    heads, dh = (8, 64) if large else (HIDDEN // 64, 64)
    q, k, v = (_r(batch, heads, steps, dh, dtype=dtype) for _ in range(3))
    return [q, k, v, None], {"causal": 1}, f"B{batch} H{heads} T{steps} Dh{dh} causal"


def build_delta_rule_scan(batch, steps, dtype, large):
    heads, dk = (8, 64) if large else (HIDDEN // 64, 64)
    q = F.normalize(torch.randn(batch, heads, steps, dk, device="cuda"), dim=-1).to(dtype)
    k = F.normalize(torch.randn(batch, heads, steps, dk, device="cuda"), dim=-1).to(dtype)
    v = _r(batch, heads, steps, dk, dtype=dtype)
    beta = torch.sigmoid(torch.randn(batch, heads, steps, device="cuda")).to(dtype)
    return [q, k, v, beta, torch.zeros(batch, heads, dk, dk, device="cuda")], {}, f"B{batch} H{heads} T{steps} Dk{dk}"


def build_mlstm_scan(batch, steps, dtype, large):
    heads, dh = (8, 64) if large else (HIDDEN // 64, 64)
    q = _r(batch, heads, steps, dh, dtype=dtype)
    k = _r(batch, heads, steps, dh, dtype=dtype, scale=1 / math.sqrt(dh))
    v = _r(batch, heads, steps, dh, dtype=dtype)
    i_pre = _r(batch, heads, steps, dtype=dtype)
    f_pre = (torch.randn(batch, heads, steps, device="cuda") + 3).to(dtype)
    states = [
        torch.zeros(batch, heads, dh, dh, device="cuda"),
        torch.zeros(batch, heads, dh, device="cuda"),
        torch.zeros(batch, heads, device="cuda"),
    ]
    return [q, k, v, i_pre, f_pre, *states], {}, f"B{batch} H{heads} T{steps} Dh{dh}"


def build_liquid_scan(batch, steps, dtype, large):
    h = HIDDEN
    inputs = [
        _r(batch, steps, 4 * h, dtype=dtype),
        _r(4 * h, h, dtype=dtype, scale=1 / math.sqrt(h)),
        torch.zeros(batch, h, device="cuda"),
    ]
    return inputs, {"ts": 1.0}, f"B{batch} T{steps} H{h}"


BUILDERS = {
    "LinearScan": (build_linear_scan, (16, 4096)),
    "SelectiveScan": (build_selective_scan, (4, 1024)),
    "LSTMSeq": (build_lstm_seq, (64, 512)),
    "GRUSeq": (build_gru_seq, (64, 512)),
    "Attention": (build_attention, (4, 2048)),
    "DeltaRuleScan": (build_delta_rule_scan, (4, 1024)),
    "MLSTMScan": (build_mlstm_scan, (4, 1024)),
    "LiquidScan": (build_liquid_scan, (64, 512)),
}


# ----------------------------------------------------------------------------------- library peers


def library_peer(op_type, inputs, attrs):
    """(name, callable) of the vendor-library implementation, or None."""
    if op_type in ("LSTMSeq", "GRUSeq"):
        x = inputs[0]
        hidden = inputs[2].shape[1]
        cls = torch.nn.LSTM if op_type == "LSTMSeq" else torch.nn.GRU
        rnn = cls(x.shape[2], hidden).to(device="cuda", dtype=x.dtype).eval()
        h0 = inputs[4].to(x.dtype).unsqueeze(0)
        state = (h0, inputs[5].to(x.dtype).unsqueeze(0)) if op_type == "LSTMSeq" else h0

        def run():
            with torch.no_grad():
                return rnn(x, state)

        return "cuDNN " + cls.__name__, run
    if op_type == "Attention":
        q, k, v = inputs[:3]
        causal = bool(attrs.get("causal", 0))

        def run():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal and q.shape[2] > 1)

        return "SDPA", run
    return None


# ------------------------------------------------------------------------------------------ timing


def time_gpu(fn, *, budget_s=1.0, min_reps=10, max_reps=500):
    """Per-call GPU time of fn() in µs (median, p99) with CUDA events around each call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max_reps, max(min_reps, budget_s / once)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    samples = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
    p99 = samples[min(len(samples) - 1, math.ceil(0.99 * len(samples)) - 1)]
    return {"median_us": statistics.median(samples), "p99_us": p99, "reps": reps}


def graphed(fn):
    """fn captured in a CUDA graph (after warm-up on a side stream); returns graph.replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _failure(exc):
    text = str(exc).strip().splitlines()
    return f"failed: {type(exc).__name__}: {text[0][:160] if text else ''}"


def bench_case(op_type, module, batch, steps, dtype, large, args):
    builder = BUILDERS[op_type][0]
    inputs, attrs, shape = builder(batch, steps, dtype, large)
    result = {"op": op_type, "shape": shape, "large": large, "variants": {}}
    variants = result["variants"]

    def attempt(name, make):
        try:
            fn = make()
            variants[name] = time_gpu(fn, budget_s=args.budget)
        except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
            variants[name] = {"error": _failure(exc)}
            if args.verbose:
                traceback.print_exc()
        torch.cuda.synchronize()

    try:
        outputs = module.launch(inputs, attrs)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        result["error"] = _failure(exc)
        return result

    def ff_launch():
        return lambda: module.launch(inputs, attrs, outputs=outputs)

    attempt("framefuse graph", lambda: graphed(ff_launch()))
    attempt("framefuse launch", ff_launch)

    def eager():
        return lambda: module.reference(*inputs, **attrs)

    attempt("eager", eager)
    attempt("eager graph", lambda: graphed(eager()))
    if steps <= args.compile_max_steps or op_type == "Attention":  # Attention's reference has no time loop

        def compiled():
            fn = torch.compile(lambda: module.reference(*inputs, **attrs), mode="reduce-overhead")
            for _ in range(3):
                fn()
            return fn

        attempt("compile", compiled)
    else:
        variants["compile"] = {
            "error": f"skipped: T={steps} > {args.compile_max_steps} (the unrolled loop takes too long to compile)"
        }
    peer = library_peer(op_type, inputs, attrs)
    if peer is not None:
        name, fn = peer
        result["library"] = name
        attempt("library", lambda: fn)
        attempt("library graph", lambda: graphed(fn))

    ours = [v["median_us"] for k, v in variants.items() if k.startswith("framefuse") and "median_us" in v]
    peers = {k: v["median_us"] for k, v in variants.items() if not k.startswith("framefuse") and "median_us" in v}
    if ours and peers:
        best_peer = min(peers, key=peers.get)
        result["best_peer"] = best_peer
        result["speedup_vs_best_peer"] = peers[best_peer] / min(ours)
    if op_type == "LinearScan" and large and "median_us" in variants.get("framefuse graph", {}):
        a = inputs[0]
        nbytes = 3 * a.numel() * a.element_size() + 2 * inputs[2].numel() * 4
        result["gbps"] = nbytes / (variants["framefuse graph"]["median_us"] * 1e-6) / 1e9
    return result


COLUMNS = ["framefuse graph", "framefuse launch", "eager", "eager graph", "compile", "library", "library graph"]


def markdown(results, header):
    lines = [
        header,
        "",
        "| op | shape | " + " | ".join(COLUMNS) + " | best peer | speed-up | GB/s |",
        "|" + "---|" * (len(COLUMNS) + 5),
    ]
    notes = []
    for r in results:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['shape']} | " + " | ".join(["–"] * len(COLUMNS)) + f" | {r['error']} | | |")
            continue
        cells = []
        for col in COLUMNS:
            v = r["variants"].get(col)
            if v is None:
                cells.append("")
            elif "median_us" in v:
                cells.append(f"{v['median_us']:.1f} (p99 {v['p99_us']:.1f})")
            else:
                cells.append(v["error"].split(":")[0])
                notes.append(f"- {r['op']} {r['shape']} {col}: {v['error']}")
        best = r.get("best_peer", "")
        if best.startswith("library") and r.get("library"):
            best = best.replace("library", r["library"])
        speed = f"{r['speedup_vs_best_peer']:.2f}×" if "speedup_vs_best_peer" in r else ""
        gbps = f"{r['gbps']:.0f}" if "gbps" in r else ""
        lines.append(f"| {r['op']} | {r['shape']} | " + " | ".join(cells) + f" | {best} | {speed} | {gbps} |")
    lines += [
        "",
        "Times are µs per call, median (p99), CUDA events around each call. speed-up = best peer / best "
        "framefuse variant (> 1: framefuse faster).",
    ]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/kernels"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--op", action="append", help="only this op type (repeatable)")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timing per variant (default 0.5)")
    parser.add_argument("--compile-max-steps", type=int, default=64)
    parser.add_argument("--no-large", action="store_true", help="skip the large size")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2

    from framefuse.plugins import registry

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    header = (
        f"# framefuse kernels — {gpu}, {args.dtype}, torch {torch.__version__}, "
        f"{datetime.datetime.now().isoformat(timespec='seconds')}"
    )
    print(header, flush=True)
    results = []
    skipped = []
    for op_type in registry.OP_TYPES:
        if args.op and op_type not in args.op:
            continue
        try:
            module = registry.get_op(op_type)
        except Exception as exc:  # noqa: BLE001
            skipped.append(f"{op_type}: not importable ({_failure(exc)})")
            print(f"skip {op_type}: not importable ({_failure(exc)})", flush=True)
            continue
        if not callable(getattr(module, "launch", None)):
            skipped.append(f"{op_type}: no kernel (no launch)")
            print(f"skip {op_type}: no kernel", flush=True)
            continue
        sizes = [(1, 1, False), (1, 32, False)]
        if not args.no_large:
            batch, steps = BUILDERS[op_type][1]
            sizes.append((batch, steps, True))
        for batch, steps, large in sizes:
            print(f"{op_type} B{batch} T{steps}{' (large)' if large else ''} ...", flush=True)
            r = bench_case(op_type, module, batch, steps, dtype, large, args)
            results.append(r)
            torch.cuda.empty_cache()
    table = markdown(results, header)
    if skipped:
        table += "\nSkipped:\n" + "\n".join(f"- {s}" for s in skipped) + "\n"
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.md").write_text(table)
    meta = {
        "gpu": gpu,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
        "skipped": skipped,
        "results": results,
    }
    (args.out / "kernels.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out / 'kernels.md'} and {args.out / 'kernels.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
