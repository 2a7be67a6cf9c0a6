"""Accuracy of every zoo architecture at fp16 / bf16 / int8 against fp32, as `framefuse build
--precision` computes it (framefuse.precision: convert_model, then the accuracy report over a
1000-frame step rollout, each side carrying its own state). Runs on the CPU: ONNX Runtime for
fp32/fp16/int8 graphs, the CPU executor where ONNX Runtime has no kernel (bf16). Speed is not
measured here (bench/e2e.py --section precision does that on a GPU).

    python bench/precision_accuracy.py --out bench/cpu/precision-accuracy.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default=None, help="comma-separated zoo architectures (default: all)")
    parser.add_argument("--precisions", default="fp16,bf16,int8")
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--out", default="bench/cpu/precision-accuracy.md", help="markdown; a .json is written beside")
    args = parser.parse_args(argv)

    import onnx

    from framefuse.models import ARCHITECTURES
    from framefuse.precision import accuracy_report, convert_model
    from framefuse.runtime.pipeline import prepare_cached

    archs = args.archs.split(",") if args.archs else list(ARCHITECTURES)
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:  # after every row: a long run stopped midway keeps what it measured
        out.with_suffix(".json").write_text(json.dumps(rows, indent=2, default=str))
        out.write_text(markdown(rows, args.frames))

    for arch in archs:
        prepared = prepare_cached(arch, {"seed": 0})["step"]
        source = prepared.fused or prepared.onnx
        fp32 = onnx.load(str(source))
        config = prepared.manifest.get("config")
        for precision in args.precisions.split(","):
            start = time.perf_counter()
            try:
                model = convert_model(fp32, precision, config=config)
                tolerance = ((config or {}).get("tolerance") or {}).get(precision)  # as `framefuse build` takes it
                report = accuracy_report(source, model, frames=args.frames, precision=precision, tolerance=tolerance)
                info = report.to_dict()
                rows.append({"arch": arch, "precision": precision, "seconds": time.perf_counter() - start, **info})
                print(
                    f"{arch:10s} {precision:5s} passed={report.passed} {time.perf_counter() - start:.1f} s", flush=True
                )
            except Exception as exc:  # recorded: a precision that cannot be built is a result too
                rows.append({"arch": arch, "precision": precision, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{arch:10s} {precision:5s} ERROR {type(exc).__name__}: {exc}", flush=True)
            write()
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


def markdown(rows: list[dict], frames: int) -> str:
    lines = [
        "# Accuracy of fp16 / bf16 / int8 against fp32 (CPU; framefuse.precision)",
        "",
        f"Step form, {frames}-frame rollout, each side carrying its own state; seeded standard-normal frames; "
        "the gate: every output within the precision's tolerance (|Δ| ≤ tol + tol·|ref|) and argmax agreement "
        "of y ≥ 99.5 %. Written by `bench/precision_accuracy.py`.",
        "",
        "| architecture | precision | gate | max abs err (y) | worst output | its max abs err | argmax agreement | tolerance |",
        "|---|---|:---:|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['arch']} | {row['precision']} | error | {row['error'][:120]} | | | | |")
            continue
        outputs = row.get("outputs") or []
        y = next((o for o in outputs if o.get("name") == "y"), None)
        worst = max(outputs, key=lambda o: o.get("max_abs", 0.0), default=None)
        agreement = row.get("argmax_agreement")
        lines.append(
            f"| {row['arch']} | {row['precision']} | {'pass' if row.get('passed') else 'FAIL'} | "
            f"{y['max_abs']:.3g} | {worst['name']} | {worst['max_abs']:.3g} | "
            f"{'—' if agreement is None else f'{100 * agreement:.2f} %'} | {row.get('tolerance')} |"
            if y and worst
            else f"| {row['arch']} | {row['precision']} | {row.get('passed')} | {json.dumps(row)[:150]} | | | | |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
