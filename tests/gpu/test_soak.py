"""Soak: step one engine 1,000,000 frames as fast as it can and check that nothing drifts or leaks.

At checkpoints the session's state is checked finite, and a fresh reference — the torch model's
own step loop started from the session's state at that moment — is run over the next frames next
to the session: both must agree (the engine did not corrupt its state over a long run, and the
state it carries is a state the model would have). GPU memory (torch.cuda.memory_allocated) must
be identical at every checkpoint and host RSS must stay flat.

Latency must stay flat: each checkpoint's p50 over its own frames within 1.5× of the lowest.

FRAMEFUSE_SOAK_FRAMES shortens the run (e.g. 20000); FRAMEFUSE_SOAK_ARCH picks the model
(default mamba: conv window + selective-scan state); FRAMEFUSE_SOAK_SELECT the cuda-graph
engine's plan (e.g. stepkernel: the step compiler's one kernel; default: the engine's default);
FRAMEFUSE_SOAK_RESIDENT=1 keeps that kernel resident (Session(resident=True); the checkpoints'
state reads stop it and the next frame starts it again).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from framefuse.runtime.pipeline import prepare_cached, torch_model
from framefuse.runtime.session import Session

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

FRAMES = int(os.environ.get("FRAMEFUSE_SOAK_FRAMES", "1000000"))
ARCH = os.environ.get("FRAMEFUSE_SOAK_ARCH", "mamba")
SELECT = os.environ.get("FRAMEFUSE_SOAK_SELECT")
RESIDENT = os.environ.get("FRAMEFUSE_SOAK_RESIDENT") == "1"
FLAT = 1.5  # the highest checkpoint p50 over the lowest
CHECKPOINTS = 10
WINDOW = 32  # frames compared with the torch reference at each checkpoint
POOL = 1024  # random frames cycled through (drawn once: the loop measures the engine, not the RNG)
TOL = 1e-4
RSS_SLACK_MB = 64


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _compare_window(session, model, pool, start, names):
    """From the session's current state, step WINDOW frames in both and compare outputs and
    the final state."""
    current = session.get_state()
    state = tuple(torch.from_numpy(current[f"state.{n}"]).cuda() for n in names)
    worst = 0.0
    # the reference first: torch's kernels never run beside a resident step kernel
    frames = [pool[(start + k) % POOL] for k in range(WINDOW)]
    with torch.no_grad():
        expected_all = []
        for frame in frames:
            expected, state = model.step(torch.from_numpy(frame).cuda(), state)
            expected_all.append(expected.cpu().numpy())
    for k, (frame, expected) in enumerate(zip(frames, expected_all)):
        got = session.step(frame)
        worst = max(worst, float(np.abs(got - expected).max()))
        np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL, err_msg=f"frame {start + k}")
    ours = session.get_state()
    for n, value in zip(names, state):
        np.testing.assert_allclose(ours[f"state.{n}"], value.cpu().numpy(), rtol=TOL, atol=TOL, err_msg=n)
    return worst


def test_soak_million_frames():
    cudnn_tf32, matmul_tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        prepared = prepare_cached(ARCH, {"seq": 32, "seed": 0})["step"]
        assert prepared.fused is not None, prepared.fused_error
        options = {"select": SELECT} if SELECT else None
        session = Session.load(
            prepared.fused, device="cuda", stats_capacity=100_000, engine_options=options, resident=RESIDENT
        )
        model = torch_model(prepared, "cuda")
        names = prepared.state_names
        shape = session.engine.input_specs["x"].shape
        pool = np.random.default_rng(0).standard_normal((POOL, *shape)).astype(np.float32)

        _compare_window(session, model, pool, 0, names)  # from the zero state
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        rss = _rss_mb()
        step = session.step
        every = max(FRAMES // CHECKPOINTS, 1)
        done = 0
        start = time.perf_counter()
        log = []
        while done < FRAMES:
            chunk = min(every, FRAMES - done)
            for i in range(done, done + chunk):
                step(pool[i % POOL])
            done += chunk
            recent = session.stats.window()[-min(chunk, session.stats.capacity) :]
            p50_us = float(np.percentile(recent, 50)) / 1000.0
            state = session.get_state()
            for name, value in state.items():
                assert np.isfinite(value).all(), f"state {name} not finite after {done} frames"
            torch.cuda.synchronize()
            assert torch.cuda.memory_allocated() == allocated, f"GPU memory changed after {done} frames"
            grown = _rss_mb() - rss
            assert grown < RSS_SLACK_MB, f"host RSS grew {grown:.1f} MB after {done} frames"
            worst = _compare_window(session, model, pool, done, names)
            log.append((done, grown, worst, p50_us))
        seconds = time.perf_counter() - start
        s = session.stats.summary()
        print(
            f"\nsoak {ARCH}{' resident' if RESIDENT else ''}: {FRAMES} frames in {seconds:.1f} s ({FRAMES / seconds:,.0f} frames/s); step p50 "
            f"{s['p50_us']:.1f} us, p99 {s['p99_us']:.1f} us, max {s['max_us']:.1f} us; checkpoints "
            + ", ".join(f"{n}: p50 {p:.1f} us, rss +{g:.1f} MB, err {w:.1e}" for n, g, w, p in log)
        )
        p50s = [p for *_, p in log]
        assert max(p50s) <= FLAT * min(p50s), f"latency not flat over the run: checkpoint p50s {p50s}"
        assert session.engine.eager_runs == 0
        session.close()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn_tf32, matmul_tf32
