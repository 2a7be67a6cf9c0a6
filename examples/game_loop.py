#!/usr/bin/env python
"""A 60 Hz game loop driving a framefuse step-form engine, written out in full.

Every tick the "game" produces an observation vector for its AI agent, the agent's model turns it
into an action through ``Session.step`` (one run of the engine: a captured CUDA-graph replay on a
GPU, ONNX Runtime with I/O binding without one; the recurrent state stays in the engine between
frames), and the loop sleeps until the next tick. At the end it reports the step latency (host
observation in → host action out), how many steps overran the frame budget and how many ticks
were late.

    framefuse export --arch mamba                       # artifacts/mamba and artifacts/mamba-step
    framefuse rewrite artifacts/mamba-step              # -> model.fused.onnx
    framefuse build artifacts/mamba-step                # -> engine.ffe on a GPU, engine.ort without one
    python examples/game_loop.py artifacts/mamba-step --frames 600 --hz 60

The action ``Session.step`` returns lives in the session's output buffer, which the next step
overwrites: a game that keeps actions across frames copies them (or uses ``copy=True``).

``framefuse run artifacts/mamba-step`` does the same through framefuse.runtime.game_loop.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from framefuse.runtime.session import Session  # noqa: E402


class ToyGame:
    """A stand-in for a game world: an agent circling a target, observed as a feature vector."""

    def __init__(self, features: int, seed: int = 0):
        self.features = features
        self.rng = np.random.default_rng(seed)
        self.t = 0
        # a fixed random projection of the (tiny) world state to the model's input features
        self.projection = self.rng.standard_normal((4, features)).astype(np.float32) / 2
        self.observation = np.zeros((1, features), dtype=np.float32)  # reused every frame

    def observe(self) -> np.ndarray:
        angle = self.t * 2 * math.pi / 120  # one lap every two seconds at 60 Hz
        world = np.array([math.cos(angle), math.sin(angle), self.rng.standard_normal(), 1.0], dtype=np.float32)
        np.matmul(world[None, :], self.projection, out=self.observation)
        return self.observation

    def act(self, action: np.ndarray) -> None:
        self.t += 1  # a real game would move the agent according to `action`


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", help="a step-form artifact folder (artifacts/<name>-step), engine.ffe or .onnx")
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--hz", type=float, default=60.0, help="ticks per second (0: as fast as possible)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument(
        "--engine",
        choices=["cuda-graph", "onnxruntime", "tensorrt"],
        default=None,
        help="default: a built artifact, else cuda-graph with a GPU, onnxruntime without",
    )
    parser.add_argument("--check-finite", action="store_true", help="stop at the first NaN/Inf (frame, action, state)")
    args = parser.parse_args(argv)

    budget_ms = 1000.0 / args.hz if args.hz > 0 else 1000.0 / 60.0
    session = Session.load(
        args.artifact, engine=args.engine, device=args.device, budget_ms=budget_ms, check_finite=args.check_finite
    )
    if not session.is_step_form:
        print(f"{args.artifact} is not a step-form graph (inputs {session.input_names})", file=sys.stderr)
        return 2
    features = session.engine.input_specs["x"].shape[-1]
    game = ToyGame(features)
    for _ in range(10):  # warm up (caches, clocks), then start from a clean state
        session.step(game.observe())
    session.reset()
    session.stats.reset()

    period = 1.0 / args.hz if args.hz > 0 else 0.0
    late_ticks = 0
    next_tick = time.perf_counter()
    start = next_tick
    for _ in range(args.frames):
        action = session.step(game.observe())  # the AI's decision for this frame
        game.act(action)
        if period:
            next_tick += period
            now = time.perf_counter()
            if now > next_tick:
                late_ticks += 1
                next_tick = now
            else:
                time.sleep(max(next_tick - now - 0.0005, 0))
                while time.perf_counter() < next_tick:
                    pass
    wall = time.perf_counter() - start

    s = session.stats.summary()
    where = session.engine.device
    if where.type == "cuda":
        import torch

        where = torch.cuda.get_device_name(where)
    print(f"{args.frames} frames at {args.hz:g} Hz, {session.engine_name} engine on {where}, in {wall:.2f} s")
    print(f"step latency: p50 {s['p50_us']:.1f} us, p99 {s['p99_us']:.1f} us, max {s['max_us']:.1f} us")
    print(f"budget {s['budget_ms']:.2f} ms: {s['overruns']} overruns, {late_ticks} late ticks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
