#!/usr/bin/env python
"""nn.LSTM / nn.GRU (and nn.RNN) against cuDNN over sizes: framefuse's kernel for the whole window and torch's
cuDNN kernels, each host input → host output, timed in the same process in interleaved rounds.

Issue 17's target: "LSTM/GRU at least as fast as cuDNN at every size the benchmark covers (hidden
64…1024, T 1…256, one or two directions)". Each configuration is one torch.nn layer (batch 1,
input width = hidden, ``batch_first``), exported as a window of T frames (framefuse.exporter,
sequence form), rewritten (LSTMSeq / GRUSeq) and built:

  framefuse        the cuda-graph engine built with ``--select`` (default ``stepkernel``: the step
                   compiler's one kernel, plain tactic, no build-time timing; ``time`` is what
                   ``framefuse build`` does: every candidate timed, the fastest kept; slower to build)
  cudnn            the same torch module on the GPU (cuDNN's RNN kernels) captured in one CUDA graph
                   with its copies (bench/e2e.py's "torch eager + CUDA graph")
  torch_eager      the module called eagerly (cuDNN, no graph)
  mapped_floor     one trivial kernel on mapped host memory (what a one-kernel step cannot go below)

Every engine's first output is compared with ONNX Runtime on the exported graph (max abs error).
Results: one JSON line a configuration in --out/rnn_sizes.jsonl (appended as each finishes, so a cut
call keeps what it measured) and a table in --out/rnn_sizes.md.

    python bench/rnn_sizes.py --out /tmp/rnn                                  # the whole grid
    python bench/rnn_sizes.py --kinds LSTM --hidden 1024 --seq 256 --dirs 2 --out /tmp/rnn
    python bench/rnn_sizes.py --dry-run --out /tmp/rnn   # no GPU: export, rewrite, generate the kernel
    python bench/rnn_sizes.py --merge a/rnn_sizes.jsonl b/rnn_sizes.jsonl --out /tmp/all   # runs as one table

``--merge`` puts the rows of several runs (the grid split over GPU calls) in one table, each row as
its own run measured it (every engine of a row from one process): it refuses rows of different
GPUs, selections or timing settings and a configuration measured twice, and lists the grid's
configurations no run has.

``--dry-run`` (any machine) lowers, schedules and generates each configuration's kernel for the
H100's grid and reports its tasks, levels and shared memory, and the IR interpreter's error against
ONNX Runtime for windows of at most 2**16 outputs: that the grid compiles, not how fast it runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.e2e import (  # noqa: E402 - after the path set-up, as bench/e2e.py is run as a script too
    _engine_call,
    environment,
    make_mapped_floor,
    make_torch_cuda_graph,
    make_torch_eager,
    max_abs_err,
    measure_rounds,
    ort_reference,
)

KINDS = ("LSTM", "GRU")  # the default grid; --kinds RNN adds nn.RNN (Elman: no fused op, lowered as it stands)
ALL_KINDS = (*KINDS, "RNN")
HIDDEN = (64, 256, 1024)
SEQ = (1, 32, 256)
DIRS = (1, 2)
POOL = 64  # bench/e2e.py's: distinct inputs cycled through the timed calls
ENGINES = ("framefuse", "cudnn", "torch_eager", "mapped_floor")
# An engine whose first answer is further than this from ONNX Runtime (CPU, fp32) is a failed row,
# never timed: cuDNN's TF32 products sit near 5e-4 at T = 256, a wrong kernel at 0.1-1 (h in [-1, 1]).
PARITY_TOL = 2e-3
DRY_RUN_CHECK_OUTPUTS = 1 << 16  # the interpreter (numpy, float64) runs windows up to this size
# What a row records of the run that measured it, and --merge requires rows to share
RUN_KEYS = ("gpu", "torch_version", "select", "iters", "rounds", "dry_run")


def say(message: str) -> None:
    print(f"[rnn_sizes {time.strftime('%H:%M:%S')}] {message}", flush=True)


def rnn_module(kind: str, hidden: int, directions: int):
    import torch.nn as nn

    class RNNLayer(nn.Module):
        """One torch.nn LSTM / GRU layer, batch_first: x [B, T, H] → y [B, T, directions·H]."""

        def __init__(self):
            super().__init__()
            self.rnn = getattr(nn, kind)(hidden, hidden, batch_first=True, bidirectional=directions == 2)

        def forward(self, x):
            return self.rnn(x)[0]

    return RNNLayer()


def configurations(args) -> list[tuple[str, int, int, int]]:
    return list(itertools.product(args.kinds, args.hidden, args.seq, args.dirs))


def export_window(kind: str, hidden: int, seq: int, directions: int, work: Path) -> dict:
    """Export, rewrite and save one configuration; returns the paths, the manifest and the module."""
    import onnx
    import torch

    from framefuse.exporter import export_model
    from framefuse.rewrite import rewrite_model

    torch.manual_seed(0)
    module = rnn_module(kind, hidden, directions).eval()
    name = f"{kind.lower()}-h{hidden}-t{seq}-d{directions}"
    result = export_model(
        module,
        form="sequence",
        config={"batch": 1, "seq": seq, "in_features": hidden, "seed": 0},
        out_dir=work,
        name=name,
        exporter="auto",
    )
    fused, report = rewrite_model(result.model_path)
    fused_path = Path(result.directory) / "model.fused.onnx"
    onnx.save(fused, str(fused_path))
    ops = sorted({n.op_type for n in fused.graph.node if n.domain == "framefuse"})
    manifest = json.loads(Path(result.manifest_path).read_text())
    return {
        "name": name,
        "onnx": Path(result.model_path),
        "fused": fused_path,
        "manifest": manifest,
        "ops": ops,
        "module": module,
    }


def dry_run(entry: dict, row: dict):
    """Lower, schedule and generate the kernel for the H100's grid (no GPU), and check the IR;
    returns the generated kernel."""
    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.engine import STATIC_SMEM_RESERVE
    from framefuse.compiler.schedule import schedule

    start = time.perf_counter()
    program = lower_program(entry["fused"])
    smem = 227 * 1024 - STATIC_SMEM_RESERVE  # the H100's opt-in shared memory, as the engine takes it
    plan = schedule(program, grid=132, threads=256, smem_floats=smem // 8)
    kernel = generate(plan, smem_limit_bytes=smem)
    row["compile_s"] = round(time.perf_counter() - start, 2)
    described = kernel.describe()
    row["kernel"] = {k: described.get(k) for k in ("tasks", "levels", "smem_bytes", "weight_bytes")}
    row["kernel"]["counts"] = program.counts()
    out_size = int(np.prod(entry["manifest"]["outputs"][0]["shape"]))
    if out_size <= DRY_RUN_CHECK_OUTPUTS:
        manifest = entry["manifest"]
        x = np.random.default_rng(0).standard_normal(manifest["inputs"][0]["shape"]).astype(np.float32)
        expected = ort_reference(entry["onnx"], manifest, x)
        actual = naive.run(program, {manifest["inputs"][0]["name"]: x})[manifest["outputs"][0]["name"]]
        row["interpreter_max_abs_err_vs_ort"] = float(np.abs(np.asarray(actual) - expected).max())
    return kernel


def measure_row(entry: dict, row: dict, args) -> None:
    import torch

    from framefuse.engines import cuda_graph

    dev = torch.device("cuda")
    manifest = entry["manifest"]
    in_shape, out_shape = manifest["inputs"][0]["shape"], manifest["outputs"][0]["shape"]
    in_name, out_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    pool = np.random.default_rng(0).standard_normal((POOL, *in_shape)).astype(np.float32)
    reference = ort_reference(entry["onnx"], manifest, pool[0])
    module = entry["module"].to(dev)
    torch_args = {"form": "sequence", "pool": pool, "out_shape": out_shape, "device": dev}

    def framefuse_call():
        start = time.perf_counter()
        engine = cuda_graph.build(entry["fused"], device="cuda", options={"select": args.select})
        row["build_s"] = round(time.perf_counter() - start, 2)
        selection = (engine.metadata or {}).get("selection") or {}
        row["selection"] = selection.get("chosen")
        if selection.get("candidates"):  # the build's own timings, host to host (--select time)
            row["candidates_us"] = {k: v.get("us_per_step") for k, v in selection["candidates"].items()}
        summary = engine.summary().get("stepkernel")
        if summary:
            row["stepkernel"] = summary
        return _engine_call(engine, form="sequence", pool=pool, in_name=in_name, out_name=out_name)

    makers = {
        "framefuse": framefuse_call,
        "cudnn": lambda: make_torch_cuda_graph(module, **torch_args),
        "torch_eager": lambda: make_torch_eager(module, **torch_args),
        "mapped_floor": lambda: make_mapped_floor(pool=pool, out_shape=out_shape, device=dev),
    }
    live = {}
    for name, make in makers.items():
        try:
            with torch.no_grad():
                call = make()
                first = np.array(call(0), copy=True)
            if name != "mapped_floor":
                err = max_abs_err(first, reference)
                row["engines"][name] = {"max_abs_err_vs_ort": err}
                if not err <= PARITY_TOL:  # NaN included
                    row["engines"][name]["error"] = f"parity: max abs err {err:.3g} vs ONNX Runtime > {PARITY_TOL:g}"
                else:
                    live[name] = call
            else:
                row["engines"][name] = {}
                live[name] = call
        except Exception as exc:  # noqa: BLE001 - a failing engine is a result
            row["engines"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        torch.cuda.synchronize(dev)
    with torch.no_grad():
        timed = measure_rounds(live, iters=args.iters, warmup=args.warmup, rounds=args.rounds)
    for name, result in timed.items():
        if isinstance(result, BaseException):
            row["engines"][name] = {"error": f"{type(result).__name__}: {str(result)[:400]}"}
        else:
            row["engines"][name].update(result)
    for call in live.values():
        if hasattr(call, "close"):
            call.close()
    ours, theirs = row["engines"].get("framefuse", {}), row["engines"].get("cudnn", {})
    if "p50_us" in ours and "p50_us" in theirs:
        row["speedup_vs_cudnn"] = theirs["p50_us"] / ours["p50_us"]
    module.cpu()
    torch.cuda.empty_cache()


def markdown(rows: list[dict], env: dict, args, settings: dict, runs: list[str] | None = None) -> str:
    lines = [
        "# nn.LSTM / nn.GRU against cuDNN, by size",
        "",
        f"GPU: **{env.get('gpu', 'none')}** · torch {env.get('torch_version')} · framefuse build `--select {args.select}` · "
        f"{args.iters} timed calls a engine in {args.rounds} interleaved rounds · one layer, batch 1, input width = "
        "hidden · p50 host → host (µs); speedup = cuDNN p50 / framefuse p50 (< 1.00×: framefuse slower)"
        + (f" · compiler settings changed for this run: {settings}" if settings else ""),
        "",
        *([f"Merged from {len(runs)} runs, each row from one: {', '.join(runs)}.", ""] if runs else []),
        "| kind | hidden | T | dirs | framefuse | cuDNN + graph | torch eager | mapped floor | speedup vs cuDNN | framefuse err vs ORT | selection |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def cell(row, name):
        e = row.get("engines", {}).get(name, {})
        if "p50_us" in e:
            return f"{e['p50_us']:.1f}"
        return "error" if "error" in e else "—"

    for row in rows:
        err = row.get("engines", {}).get("framefuse", {}).get("max_abs_err_vs_ort")
        speed = row.get("speedup_vs_cudnn")
        lines.append(
            f"| {row['kind']} | {row['hidden']} | {row['T']} | {row['dirs']} | {cell(row, 'framefuse')} | "
            f"{cell(row, 'cudnn')} | {cell(row, 'torch_eager')} | {cell(row, 'mapped_floor')} | "
            f"{'—' if speed is None else f'{speed:.2f}×'} | {'—' if err is None else f'{err:.1e}'} | "
            f"{row.get('selection') or row.get('error', '—')} |"
        )
    slower = [r for r in rows if r.get("speedup_vs_cudnn") is not None and r["speedup_vs_cudnn"] < 1.0]
    failed = [r for r in rows if "error" in r or any("error" in e for e in r.get("engines", {}).values())]
    lines += ["", f"Rows where framefuse is slower than cuDNN: **{len(slower)} of {len(rows)}**."]
    for r in failed:
        errors = {n: e["error"] for n, e in r.get("engines", {}).items() if "error" in e}
        lines.append(f"- {r['name']}: {r.get('error') or errors}")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for rnn_sizes.jsonl / rnn_sizes.md")
    p.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    p.add_argument("--hidden", type=lambda s: [int(v) for v in s.split(",")], default=list(HIDDEN))
    p.add_argument("--seq", type=lambda s: [int(v) for v in s.split(",")], default=list(SEQ))
    p.add_argument("--dirs", type=lambda s: [int(v) for v in s.split(",")], default=list(DIRS))
    p.add_argument(
        "--select",
        default="stepkernel",
        help="the engine's build-time selection (default stepkernel; time: as framefuse build)",
    )
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dry-run", action="store_true", help="no GPU: export, rewrite and generate each kernel only")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODULE.NAME=VALUE",
        help="override a compiler setting for this run (e.g. schedule.RECUR_MAX_BLOCKS=128; MODULE under "
        "framefuse.compiler; VALUE a Python literal); recorded in the results. Repeatable",
    )
    p.add_argument("--work", default=None, help="folder for the exported graphs (default: --out/work)")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSONL",
        help="put several runs' rnn_sizes.jsonl in one table under --out (nothing is measured)",
    )
    args = p.parse_args(argv)
    bad = [k for k in args.kinds if k not in ALL_KINDS]
    if bad:
        p.error(f"--kinds: {bad} not among {list(ALL_KINDS)}")
    if any(d not in (1, 2) for d in args.dirs):
        p.error("--dirs: 1 and/or 2")
    return args


def apply_settings(assignments: list[str]) -> dict:
    """--set MODULE.NAME=VALUE: framefuse.compiler.MODULE.NAME = VALUE (an existing setting only)."""
    import ast
    import importlib

    applied = {}
    for text in assignments:
        target, sep, value = text.partition("=")
        module_name, _, name = target.strip().rpartition(".")
        if not sep or not module_name or not name:
            raise SystemExit(f"rnn_sizes: --set {text!r}: expected MODULE.NAME=VALUE")
        module = importlib.import_module(f"framefuse.compiler.{module_name}")
        if not hasattr(module, name):
            raise SystemExit(f"rnn_sizes: --set {text!r}: framefuse.compiler.{module_name} has no setting {name}")
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError) as exc:
            raise SystemExit(f"rnn_sizes: --set {text!r}: {value!r} is not a Python literal") from exc
        setattr(module, name, parsed)
        applied[f"{module_name}.{name}"] = parsed
    return applied


def merge(paths: list[str], out: Path) -> int:
    """--merge: the rows of several runs' rnn_sizes.jsonl in one rnn_sizes.jsonl / .md under ``out``."""
    rows, runs, seen = [], [], {}
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise SystemExit(f"rnn_sizes --merge: {path}: {exc.strerror or exc}") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"rnn_sizes --merge: {path}:{number}: not a JSON row ({exc.msg})") from exc
            if "run" not in row:
                raise SystemExit(
                    f"rnn_sizes --merge: {path}:{number}: {row.get('name', 'a row')} does not say which GPU and "
                    "settings measured it (a run before --merge existed): run it again"
                )
            key = (row["kind"], row["hidden"], row["T"], row["dirs"])
            if key in seen:
                raise SystemExit(f"rnn_sizes --merge: {row.get('name', key)} is in both {seen[key]} and {path}")
            seen[key] = path
            first = rows[0] if rows else row
            mine = {**row["run"], "settings": row.get("settings") or {}}
            theirs = {**first["run"], "settings": first.get("settings") or {}}
            for field in (*RUN_KEYS, "settings"):
                if mine.get(field) != theirs.get(field):
                    first_key = (first["kind"], first["hidden"], first["T"], first["dirs"])
                    raise SystemExit(
                        f"rnn_sizes --merge: {path}:{number}: {row.get('name', key)} has {field} {mine.get(field)!r}, "
                        f"{seen[first_key]} has {theirs.get(field)!r}: the rows of one table are measured alike"
                    )
            rows.append(row)
        runs.append(str(path))
    if not rows:
        raise SystemExit("rnn_sizes --merge: no rows in " + ", ".join(paths))
    if rows[0]["run"].get("dry_run"):
        raise SystemExit("rnn_sizes --merge: the rows are --dry-run rows (nothing was timed)")
    order = {c: i for i, c in enumerate(itertools.product(ALL_KINDS, HIDDEN, SEQ, DIRS))}
    rows.sort(key=lambda r: (order.get((r["kind"], r["hidden"], r["T"], r["dirs"]), len(order)), r["hidden"], r["T"]))
    run = rows[0]["run"]
    args = argparse.Namespace(select=run["select"], iters=run["iters"], rounds=run["rounds"])
    env = {"gpu": run["gpu"], "torch_version": run["torch_version"]}
    text = markdown(rows, env, args, rows[0].get("settings") or {}, runs=runs)
    kinds = sorted({r["kind"] for r in rows}, key=list(ALL_KINDS).index)
    missing = [
        f"{k} {h} / {t} / {d}" for k, h, t, d in itertools.product(kinds, HIDDEN, SEQ, DIRS) if (k, h, t, d) not in seen
    ]
    text += (
        f"\nThe grid's configurations not run ({len(missing)}): {', '.join(missing)}.\n"
        if missing
        else "\nEvery configuration of the grid (for these kinds) is here.\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    for name, body in (("rnn_sizes.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), ("rnn_sizes.md", text)):
        tmp = out / f"{name}.tmp"
        tmp.write_text(body)
        tmp.replace(out / name)
    say(f"merged {len(rows)} rows of {len(runs)} runs into {out}/rnn_sizes.jsonl, rnn_sizes.md")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    settings = apply_settings(args.set)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else out / "work"
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("rnn_sizes: no CUDA device (use --dry-run to only generate the kernels)")
    env = environment(device)
    run = {
        "gpu": env.get("gpu"),
        "torch_version": env.get("torch_version"),
        "select": args.select,
        "iters": args.iters,
        "rounds": args.rounds,
        "dry_run": bool(args.dry_run),
    }
    jsonl = out / "rnn_sizes.jsonl"
    jsonl.write_text("")
    rows = []
    configs = configurations(args)
    for n, (kind, hidden, seq, dirs) in enumerate(configs, 1):
        row = {"kind": kind, "hidden": hidden, "T": seq, "dirs": dirs, "settings": settings, "engines": {}}
        row["run"] = {key: run[key] for key in RUN_KEYS}  # what --merge checks rows agree on
        start = time.perf_counter()
        try:
            entry = export_window(kind, hidden, seq, dirs, work)
            row["name"], row["fused_ops"] = entry["name"], entry["ops"]
            if args.dry_run:
                dry_run(entry, row)
            else:
                measure_row(entry, row, args)
        except Exception as exc:  # noqa: BLE001 - one failing size is a row, not the end of the sweep
            row.setdefault("name", f"{kind.lower()}-h{hidden}-t{seq}-d{dirs}")
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            row["traceback"] = traceback.format_exc()[-2000:]
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        with jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        ff, cd = row["engines"].get("framefuse", {}), row["engines"].get("cudnn", {})
        summary = (
            f"framefuse {ff.get('p50_us', float('nan')):.1f} us, cuDNN {cd.get('p50_us', float('nan')):.1f} us, "
            f"{row.get('speedup_vs_cudnn', float('nan')):.2f}x"
            if not args.dry_run
            else f"kernel {row.get('kernel')}, {row.get('compile_s')} s, "
            f"interpreter err {row.get('interpreter_max_abs_err_vs_ort', '—')}"
        )
        say(f"[{n}/{len(configs)}] {row['name']}: {row.get('error') or summary} ({row['seconds']} s)")
    if not args.dry_run:
        text = markdown(rows, env, args, settings)
        tmp = out / "rnn_sizes.md.tmp"
        tmp.write_text(text)
        tmp.replace(out / "rnn_sizes.md")
    failed = [r["name"] for r in rows if "error" in r or any("error" in e for e in r["engines"].values())]
    if failed:
        say(f"failed (see rnn_sizes.jsonl): {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
