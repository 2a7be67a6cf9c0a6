"""Per-call latency statistics in a preallocated ring buffer, with a frame-budget overrun count."""

from __future__ import annotations

from array import array

import numpy as np

DEFAULT_BUDGET_MS = 1000.0 / 60.0  # one frame at 60 FPS: 16.67 ms


class LatencyStats:
    """The last ``capacity`` call durations (ns) and totals over every call.

    ``record`` writes one int into a preallocated array (no allocation on the hot path; an
    ``array.array`` rather than numpy: a numpy item assignment costs ~0.3 us, a tenth of a
    step's host work); percentiles are computed on demand over what the ring holds.
    """

    def __init__(self, capacity: int = 100_000, budget_ms: float | None = DEFAULT_BUDGET_MS):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self._ring = array("q", bytes(8 * self.capacity))
        self.budget_ms = budget_ms
        self._budget_ns = int(budget_ms * 1e6) if budget_ms is not None else None
        self.reset()

    def reset(self) -> None:
        self._next = 0
        self.count = 0
        self.overruns = 0
        self.max_ns = 0

    def record(self, elapsed_ns: int) -> None:
        i = self._next
        self._ring[i] = elapsed_ns
        self._next = i + 1 if i + 1 < self.capacity else 0
        self.count += 1
        if elapsed_ns > self.max_ns:
            self.max_ns = elapsed_ns
        if self._budget_ns is not None and elapsed_ns > self._budget_ns:
            self.overruns += 1

    def window(self) -> np.ndarray:
        """The durations (ns) held in the ring, oldest first."""
        ring = np.frombuffer(self._ring, dtype=np.int64)
        if self.count < self.capacity:
            return ring[: self.count].copy()
        return np.concatenate([ring[self._next :], ring[: self._next]])

    def percentile_us(self, q: float) -> float:
        held = self.window()
        if held.size == 0:
            return float("nan")
        return float(np.percentile(held, q)) / 1e3

    def summary(self) -> dict:
        held = self.window()
        if held.size:
            p50, p99 = (float(v) / 1e3 for v in np.percentile(held, [50, 99]))
            mean = float(held.mean()) / 1e3
        else:
            p50 = p99 = mean = float("nan")
        return {
            "count": self.count,
            "window": int(held.size),
            "p50_us": p50,
            "p99_us": p99,
            "mean_us": mean,
            "max_us": self.max_ns / 1e3,  # over every call, not only the window
            "budget_ms": self.budget_ms,
            "overruns": self.overruns,
        }

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"LatencyStats(count={s['count']}, p50={s['p50_us']:.1f}us, p99={s['p99_us']:.1f}us, "
            f"max={s['max_us']:.1f}us, overruns={s['overruns']})"
        )
