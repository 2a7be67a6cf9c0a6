"""Per-call latency statistics in a preallocated ring buffer, with a frame-budget overrun count."""

from __future__ import annotations

from array import array

import numpy as np

DEFAULT_BUDGET_MS = 1000.0 / 60.0  # one frame at 60 FPS: 16.67 ms


# LatencyStats' counters, in an int64 array that engines/hostpath.c's step records into too
NEXT, COUNT, OVERRUNS, MAX_NS, BUDGET_NS, CAPACITY = range(6)


class LatencyStats:
    """The last ``capacity`` call durations (ns) and totals over every call.

    ``record`` writes one int into a preallocated array (no allocation on the hot path; an
    ``array.array`` rather than numpy: a numpy item assignment costs ~0.3 us, a tenth of a
    step's host work); percentiles are computed on demand over what the ring holds. The ring and
    the counters are plain int64 arrays at fixed addresses (``buffers()``): the step kernel's
    native frame call (engines/hostpath.c) records into them without coming back to Python.
    """

    def __init__(self, capacity: int = 100_000, budget_ms: float | None = DEFAULT_BUDGET_MS):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self._ring = array("q", bytes(8 * self.capacity))
        self.budget_ms = budget_ms
        self._budget_ns = int(budget_ms * 1e6) if budget_ms is not None else None
        self._counters = array("q", [0] * 6)
        self._counters[BUDGET_NS] = -1 if self._budget_ns is None else self._budget_ns
        self._counters[CAPACITY] = self.capacity
        self.reset()

    def reset(self) -> None:
        c = self._counters
        c[NEXT] = c[COUNT] = c[OVERRUNS] = c[MAX_NS] = 0

    @property
    def count(self) -> int:
        return self._counters[COUNT]

    @property
    def overruns(self) -> int:
        return self._counters[OVERRUNS]

    @property
    def max_ns(self) -> int:
        return self._counters[MAX_NS]

    def buffers(self) -> tuple[int, int]:
        """The addresses of the ring and of the counters (NEXT, COUNT, ... above), for a recorder
        in C; both arrays keep their size, so the addresses hold for the object's life."""
        return self._ring.buffer_info()[0], self._counters.buffer_info()[0]

    def record(self, elapsed_ns: int) -> None:
        c = self._counters
        i = c[NEXT]
        self._ring[i] = elapsed_ns
        c[NEXT] = i + 1 if i + 1 < self.capacity else 0
        c[COUNT] += 1
        if elapsed_ns > c[MAX_NS]:
            c[MAX_NS] = elapsed_ns
        if self._budget_ns is not None and elapsed_ns > self._budget_ns:
            c[OVERRUNS] += 1

    def window(self) -> np.ndarray:
        """The durations (ns) held in the ring, oldest first."""
        ring = np.frombuffer(self._ring, dtype=np.int64)
        count, nxt = self._counters[COUNT], self._counters[NEXT]
        if count < self.capacity:
            return ring[:count].copy()
        return np.concatenate([ring[nxt:], ring[:nxt]])

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
