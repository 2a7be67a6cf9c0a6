"""A fixed-rate loop that feeds one frame per tick to a step-form session, like a game's AI update.

Each tick: take the next observation, ``session.step`` it, then sleep until the next tick. The
session's statistics time every step (host input → host output) and count the steps that
overran the frame budget; the loop also counts late ticks (a step that ended after the next tick
was due), which is what a player would notice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from framefuse.runtime.session import Session, SessionError

# Observations are drawn once and cycled, so the loop measures the model, not the RNG.
OBSERVATION_POOL = 256


@dataclass
class LoopReport:
    frames: int
    hz: float
    wall_s: float
    late_ticks: int
    stats: dict
    device: str
    gpu_name: str | None
    output_finite: bool
    engine: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "frames": self.frames,
            "hz": self.hz,
            "wall_s": self.wall_s,
            "achieved_hz": self.frames / self.wall_s if self.wall_s > 0 else float("inf"),
            "late_ticks": self.late_ticks,
            "latency": self.stats,
            "device": self.device,
            "gpu_name": self.gpu_name,
            "output_finite": self.output_finite,
            "engine": self.engine,
            **self.extra,
        }


def observations(session: Session, count: int = OBSERVATION_POOL, seed: int = 0) -> np.ndarray:
    """``count`` random frames shaped like the session's frame input (a graph without state: its
    input, the whole graph run on each frame)."""
    if len(session.frame_inputs) != 1:
        raise SessionError(f"the game loop feeds one frame input; this graph has {session.frame_inputs}")
    spec = session.engine.input_specs[session.frame_inputs[0]]
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, *spec.shape)).astype(spec.numpy_dtype)


def run_game_loop(
    session: Session,
    *,
    frames: int = 600,
    hz: float = 60.0,
    warmup: int = 10,
    seed: int = 0,
    on_frame=None,
) -> LoopReport:
    """Step ``session`` ``frames`` times at ``hz`` ticks per second (``hz <= 0``: as fast as it can).

    ``warmup`` untimed steps come first (then the state is reset and the statistics cleared).
    ``on_frame(i, output)`` is called after each step (e.g. to print or to act on the output).
    Ctrl-C ends the loop early: the report covers the frames stepped so far (``extra["interrupted"]``).
    """
    import torch

    pool = observations(session, seed=seed)
    for i in range(warmup):
        session.step(pool[i % len(pool)])
    session.reset()
    session.stats.reset()
    period = 1.0 / hz if hz and hz > 0 else 0.0
    late = 0
    finite = True
    start = time.perf_counter()
    next_tick = start
    output = None
    done = 0
    interrupted = False
    try:
        for i in range(frames):
            output = session.step(pool[i % len(pool)])
            done = i + 1
            if on_frame is not None:
                on_frame(i, output)
            if period:
                next_tick += period
                now = time.perf_counter()
                if now > next_tick:
                    late += 1
                    next_tick = now  # do not try to catch up with a burst of frames
                else:
                    # sleep most of the wait, spin the last half millisecond (sleep overshoots)
                    remaining = next_tick - now
                    if remaining > 0.0005:
                        time.sleep(remaining - 0.0005)
                    while time.perf_counter() < next_tick:
                        pass
    except KeyboardInterrupt:
        interrupted = True
    wall = time.perf_counter() - start
    if output is not None:
        values = output.values() if isinstance(output, dict) else [output]
        finite = all(bool(np.isfinite(np.asarray(v)).all()) for v in values)
    device = session.device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    extra = {"interrupted": True, "frames_asked": frames} if interrupted else {}
    return LoopReport(
        done, hz, wall, late, session.stats.summary(), str(device), gpu, finite, session.engine_name, extra
    )
