"""``framefuse run``: a 60 Hz game loop over a step-form artifact, reporting latency and overruns."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from framefuse.cli import non_negative_float, non_negative_int, positive_float, positive_int, writable_file
from framefuse.engines.registry import ENGINES

EXAMPLES = """\
examples:
  framefuse run artifacts/mamba-step                       # 600 frames at 60 Hz
  framefuse run artifacts/mamba-step --frames 10000 --hz 0 # as fast as it can
  framefuse run artifacts/mamba-step --engine onnxruntime  # engine.ort if built, else ONNX Runtime on model.onnx
  framefuse run artifacts/lstm-step --device cpu --budget-ms 5 --check-finite --json loop.json"""


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run",
        help="run a step-form artifact in a fixed-rate game loop and report latency",
        description="Load a step-form artifact (an engine artifact when built: engine.ffe / engine.ort / "
        "engine.plan; else the default engine over the folder's ONNX: cuda-graph with a GPU, ONNX Runtime "
        "on model.onnx without), feed it one random observation per tick at --hz, keep the recurrent state "
        "in the engine between frames, and report step latency (p50/p99/max, host input to host output) "
        "and frame-budget overruns.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "artifact", metavar="ARTIFACT", help="artifact folder (e.g. artifacts/<name>-step), engine.ffe or .onnx"
    )
    parser.add_argument("--frames", type=positive_int, default=600, metavar="N", help="frames to run (default 600)")
    parser.add_argument(
        "--hz", type=non_negative_float, default=60.0, help="ticks per second; 0 = as fast as possible (default 60)"
    )
    parser.add_argument(
        "--budget-ms", type=positive_float, default=None, help="frame budget (default 1000/hz, 16.67 ms at 60 Hz)"
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=10, metavar="N", help="untimed frames first (default 10)"
    )
    parser.add_argument(
        "--engine",
        choices=tuple(ENGINES),
        default=None,
        help="backend (default: a built artifact, else cuda-graph with a GPU, onnxruntime without)",
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is a GPU")
    parser.add_argument(
        "--check-finite",
        action="store_true",
        help="also stop with an error naming the tensor and frame at the first NaN/Inf of an output or state",
    )
    parser.add_argument(
        "--nonfinite",
        choices=["raise", "propagate"],
        default="raise",
        help="a frame holding NaN/Inf: refused before the engine runs, the state unchanged (raise, the default), "
        "or handed to the engine (propagate)",
    )
    parser.add_argument(
        "--replay", choices=["torch", "driver"], default="torch", help="how the captured graph is replayed"
    )
    parser.add_argument(
        "--resident",
        action="store_true",
        help="keep the step kernel on the GPU between frames (rung per frame, no launch; needs an engine built "
        "with --select stepkernel)",
    )
    parser.add_argument(
        "--resident-sms",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --resident: schedule the kernel over N SMs and leave the others free (default: every SM)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the observations")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args) -> int:
    from framefuse.runtime.game_loop import run_game_loop
    from framefuse.runtime.session import Session, SessionError
    from framefuse.runtime.stats import DEFAULT_BUDGET_MS

    writable_file(args.json, "--json")
    budget = args.budget_ms
    if budget is None:
        budget = 1000.0 / args.hz if args.hz and args.hz > 0 else DEFAULT_BUDGET_MS
    quiet = getattr(args, "quiet", False)
    if not quiet:
        print(f"loading {args.artifact} ...", file=sys.stderr)
    session = Session.load(
        args.artifact,
        engine=args.engine,
        device=args.device,
        budget_ms=budget,
        replay=args.replay,
        check_finite=args.check_finite,
        nonfinite=args.nonfinite,
        resident=args.resident,
        resident_sms=args.resident_sms,
    )
    if not session.is_step_form:
        if session.manifest.get("form") == "sequence":  # framefuse export's window: its step form is the one to run
            session.close()
            raise SessionError(
                f"{args.artifact} is a sequence-form graph (inputs {session.input_names}); the game loop needs the "
                f"step form: export it (framefuse export --form step) and run artifacts/<name>-step"
            )
        if not quiet:
            print(
                f"note: {args.artifact} has no state (inputs {session.input_names}): each frame runs the whole graph "
                "on that frame, nothing is carried to the next",
                file=sys.stderr,
            )
    try:
        report = run_game_loop(session, frames=args.frames, hz=args.hz, warmup=args.warmup, seed=args.seed)
    finally:
        session.close()  # a resident kernel leaves the GPU
    data = report.as_dict()
    data["artifact"] = str(args.artifact)
    if args.json:
        from framefuse.files import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps(data, indent=2))
    if not quiet:
        lat = data["latency"]
        where = data["gpu_name"] or "CPU"
        print(
            f"{args.artifact} ({data['engine']} engine) on {where}: {data['frames']} frames at {args.hz:g} Hz "
            f"in {data['wall_s']:.2f} s"
        )
        print(f"  step latency  p50 {lat['p50_us']:.1f} us   p99 {lat['p99_us']:.1f} us   max {lat['max_us']:.1f} us")
        print(f"  budget {lat['budget_ms']:.2f} ms: {lat['overruns']} overruns; {data['late_ticks']} late ticks")
        if session.host_path:
            print(f"  host path  {session.host_path}")
        if not data["output_finite"]:
            print("  WARNING: the last output is not finite", file=sys.stderr)
    if data.get("interrupted"):
        print(f"framefuse: interrupted after {data['frames']} of {data['frames_asked']} frames", file=sys.stderr)
        return 130
    return 0 if data["output_finite"] else 1
