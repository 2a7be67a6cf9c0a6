"""What a game does to the CPU's caches between two frames, for timing a step as a game calls it.

A game calls Session.step once a frame, 16.7 ms apart at 60 FPS, and between two calls its own
work (the emulator, the renderer's CPU side, the bot's logic) fills the CPU's caches with its own
data. Timing steps back to back, as a tight loop does, leaves a CPU-side step's weights, code and
buffers in L1/L2/L3 from one call to the next: it times a step no game sees. Measured on this
repository's 2-core CI machine (an Emerald Rapids Xeon VM, 2 MB L2 a vCPU;
``bench/microbench/frame_gap.py``, ``bench/cpu/2026-12-05-frame-gap/``, Session.step p50), the
step compiler's CPU step of the transformers GPT-2 test model took 19.5 us back to back, 40.0
after 4 MiB had been written between frames, 48.9 after 32 MiB and 97.4 after 128 MiB; nn.LSTM
2-layer bidirectional 4.4 / 11.8 / 16.5 / 43.9 us; ONNX Runtime CPU on GPT-2 99 / 200 / 230 / 456.
A bot's thread that waits for the game's next frame leaves its core idle between calls, and that
costs more still: with the calls paced at 60 Hz and nothing else running, GPT-2's CPU step took
102.6 us, nn.LSTM's 49.7 (``frame_gap_60hz.json`` there; a sweep added nothing to it).

:class:`CacheSweep` is that work, reduced to what matters to the caches: a buffer of
``frame_gap_bytes()`` (``FRAME_GAP_BYTES``, 32 MiB: a desktop CPU's last-level cache, e.g. 30-36
MB on current 8-core parts; ``FRAMEFUSE_FRAME_GAP_BYTES`` replaces it, 0: none) written through
once, every cache line of it, before a timed call and outside its clock; :class:`FramePacer` the
wait for the next tick of a ``frame_hz()`` clock (``FRAME_HZ``, 60: the game's frame rate;
``FRAMEFUSE_FRAME_HZ``, 0: none); :class:`FrameGap` the two, in that order.
"""

from __future__ import annotations

import os
import time

import numpy as np

FRAME_GAP_BYTES = 32 << 20
FRAME_GAP_ENV = "FRAMEFUSE_FRAME_GAP_BYTES"
FRAME_HZ = 60.0
FRAME_HZ_ENV = "FRAMEFUSE_FRAME_HZ"
_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


def parse_bytes(text: str, *, what: str = FRAME_GAP_ENV) -> int:
    """``text`` as a byte count: a whole number, optionally with K/KiB, M/MiB or G/GiB (powers of
    two). Raises ValueError naming ``what`` and the text otherwise."""
    raw = str(text).strip()
    digits = raw.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = raw[len(digits) :].strip().lower()
    try:
        value = int(digits.strip())
    except ValueError:
        value = -1
    if value < 0 or unit not in _UNITS:
        raise ValueError(f"{what}={text!r}: give a byte count such as 33554432 or 32M (0: back to back)")
    return value * _UNITS[unit]


def frame_gap_bytes() -> int:
    """The bytes a frame's gap writes: FRAMEFUSE_FRAME_GAP_BYTES when set, else FRAME_GAP_BYTES."""
    raw = os.environ.get(FRAME_GAP_ENV)
    if raw is None or not raw.strip():
        return FRAME_GAP_BYTES
    return parse_bytes(raw)


class CacheSweep:
    """``sweep()`` writes every cache line of a buffer of ``nbytes`` (allocated once, here): what
    the caches hold afterwards is that buffer, as after a game's frame of its own work. Costs
    ~1.5 ms for 32 MiB on the CI machine; allocates nothing per call."""

    def __init__(self, nbytes: int):
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"CacheSweep needs a positive byte count, not {nbytes}")
        self.nbytes = nbytes
        self._buffer = np.zeros(max(1, nbytes // 8), dtype=np.int64)

    def __call__(self) -> None:
        np.add(self._buffer, 1, out=self._buffer)

    def __repr__(self) -> str:
        return f"CacheSweep({self.nbytes} bytes)"


class FramePacer:
    """``wait()`` sleeps until the next tick of a ``hz`` clock (a frame every 1/hz s), as a bot's
    thread waits for the game's next frame; behind the clock it waits for nothing and the ticks
    start again from now. Waiting matters apart from the caches: on the CI machine nn.LSTM's CPU
    step took 4.4 us back to back and 49.7 paced at 60 Hz, nothing else running (an idle core and
    its caches go to other work, or power down)."""

    def __init__(self, hz: float):
        hz = float(hz)
        if not hz > 0:
            raise ValueError(f"FramePacer needs a positive rate, not {hz}")
        self.hz = hz
        self.period = 1.0 / hz
        self._next = 0.0

    def wait(self) -> None:
        now = time.perf_counter()
        if self._next <= now:
            self._next = now + self.period
            return
        time.sleep(self._next - now)
        self._next += self.period

    __call__ = wait

    def __repr__(self) -> str:
        return f"FramePacer({self.hz:g} Hz)"


class FrameGap:
    """What a frame's gap does before a timed call: the sweep (if any), then the wait for the
    next tick (if any). ``describe()`` says both."""

    def __init__(self, sweep: CacheSweep | None, pacer: FramePacer | None):
        if sweep is None and pacer is None:
            raise ValueError("a FrameGap needs a sweep or a pace")
        self.sweep, self.pacer = sweep, pacer
        self.nbytes = sweep.nbytes if sweep is not None else 0
        self.hz = pacer.hz if pacer is not None else 0.0

    def __call__(self) -> None:
        if self.sweep is not None:
            self.sweep()
        if self.pacer is not None:
            self.pacer.wait()

    def describe(self) -> str:
        parts = []
        if self.sweep is not None:
            parts.append(f"{describe(self.nbytes)} written between frames")
        if self.pacer is not None:
            parts.append(f"frames paced at {self.hz:g} Hz")
        return " and ".join(parts)


def frame_hz() -> float:
    """The frame rate a frame gap paces at: FRAMEFUSE_FRAME_HZ when set, else FRAME_HZ (0: no pace)."""
    raw = os.environ.get(FRAME_HZ_ENV)
    if raw is None or not raw.strip():
        return FRAME_HZ
    try:
        hz = float(raw)
    except ValueError:
        hz = -1.0
    if not hz >= 0 or hz != hz or hz == float("inf"):
        raise ValueError(f"{FRAME_HZ_ENV}={raw!r}: give frames a second such as 60 (0: calls not paced)")
    return hz


def frame_gap(nbytes: int | None = None, hz: float | None = None) -> FrameGap | None:
    """The FrameGap of ``nbytes`` (default frame_gap_bytes()) and ``hz`` (default frame_hz()), or
    None when both are 0 (back to back)."""
    nbytes = frame_gap_bytes() if nbytes is None else int(nbytes)
    hz = frame_hz() if hz is None else float(hz)
    if nbytes <= 0 and hz <= 0:
        return None
    return FrameGap(CacheSweep(nbytes) if nbytes > 0 else None, FramePacer(hz) if hz > 0 else None)


def describe(nbytes: int) -> str:
    """``nbytes`` as a reader names it (32 MiB, 512 KiB, 100 bytes)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} bytes"


__all__ = [
    "FRAME_GAP_BYTES",
    "FRAME_GAP_ENV",
    "FRAME_HZ",
    "FRAME_HZ_ENV",
    "CacheSweep",
    "FrameGap",
    "FramePacer",
    "describe",
    "frame_gap",
    "frame_gap_bytes",
    "frame_hz",
    "parse_bytes",
]
