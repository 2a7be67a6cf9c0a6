"""Runtime: ``Session`` (``run`` / ``step`` / ``reset``, latency statistics, frame budget) over an
engine, the game-loop runner (``framefuse run``) and the end-to-end benchmark (``framefuse bench``).

Names are loaded lazily so ``framefuse --help`` does not import torch.
"""

from __future__ import annotations

from framefuse._lazy import lazy_getattr

_EXPORTS = {
    "Session": "framefuse.runtime.session",
    "SessionError": "framefuse.runtime.session",
    "LatencyStats": "framefuse.runtime.stats",
    "DEFAULT_BUDGET_MS": "framefuse.runtime.stats",
    "run_game_loop": "framefuse.runtime.game_loop",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
