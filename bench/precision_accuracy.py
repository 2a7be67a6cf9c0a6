"""Accuracy of every zoo architecture at fp16 / bf16 / int8 against fp32, as `framefuse build
--precision` computes it (framefuse.precision: convert_model, then the accuracy gate over 1000
frames: each step from the reference's state, and the candidate's own rollout for the decisions),
on the zoo's trained weights and the task's frames (``--weights random``: the seeded init on
standard-normal frames). Runs on the CPU: ONNX Runtime for
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
    parser.add_argument("--weights", choices=["trained", "random"], default="trained")
    parser.add_argument("--out", default="bench/cpu/precision-accuracy.md", help="markdown; a .json is written beside")
    args = parser.parse_args(argv)

    import onnx

    from framefuse.models import ARCHITECTURES
    from framefuse.precision import accuracy_report, convert_model
    from framefuse.precision.accuracy import gate_inputs
    from framefuse.runtime.pipeline import prepare_cached

    archs = args.archs.split(",") if args.archs else list(ARCHITECTURES)
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:  # after every row: a long run stopped midway keeps what it measured
        out.with_suffix(".json").write_text(json.dumps(rows, indent=2, default=str))
        out.write_text(markdown(rows, args.frames, args.weights))

    for arch in archs:
        prepared = prepare_cached(arch, {"seed": 0, "weights": args.weights})["step"]
        source = prepared.fused or prepared.onnx
        fp32 = onnx.load(str(source))
        config = prepared.manifest.get("config")
        for precision in args.precisions.split(","):
            start = time.perf_counter()
            try:
                model = convert_model(fp32, precision, config=config)
                tolerance = ((config or {}).get("tolerance") or {}).get(precision)  # as `framefuse build` takes it
                inputs, _ = gate_inputs(prepared.manifest, args.frames)
                report = accuracy_report(
                    source, model, frames=args.frames, precision=precision, tolerance=tolerance, calib=inputs
                )
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


def markdown(rows: list[dict], frames: int, weights: str = "trained") -> str:
    inputs = "the synthetic game task's frames" if weights == "trained" else "seeded standard-normal frames"
    lines = [
        "# Accuracy of fp16 / bf16 / int8 against fp32 (CPU; framefuse.precision)",
        "",
        f"Step form, {frames} frames of {inputs}, {weights} weights; the gate: each step from the reference's "
        "state within the precision's tolerance (max|Δ| ≤ tol·(1 + max|ref|) per output), and argmax agreement "
        "of y over the candidate's own rollout ≥ 99.5 %. Written by `bench/precision_accuracy.py`.",
        "",
        "| architecture | precision | gate | max abs err (y) | worst output | its max abs err | argmax agreement | "
        "y top-2 margin p1 | tolerance |",
        "|---|---|:---:|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['arch']} | {row['precision']} | error | {row['error'][:120]} | | | | | |")
            continue
        outputs = row.get("outputs") or []
        y = next((o for o in outputs if o.get("name") == "y"), None)
        worst = max(outputs, key=lambda o: o.get("max_abs", 0.0), default=None)
        agreement = row.get("argmax_agreement")
        lines.append(
            f"| {row['arch']} | {row['precision']} | {'pass' if row.get('passed') else 'FAIL'} | "
            f"{y['max_abs']:.3g} | {worst['name']} | {worst['max_abs']:.3g} | "
            f"{'—' if agreement is None else f'{100 * agreement:.2f} %'} | "
            f"{(row.get('margins') or {}).get('p1', float('nan')):.3g} | {row.get('tolerance')} |"
            if y and worst
            else f"| {row['arch']} | {row['precision']} | {row.get('passed')} | {json.dumps(row)[:150]} | | | | | |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
