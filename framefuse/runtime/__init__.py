"""Runtime: ``Session`` (``run`` / ``step`` / ``reset``, latency statistics, frame budget) over an
engine, the game-loop runner (``framefuse run``) and the end-to-end benchmark (``framefuse bench``).

Names are loaded lazily so ``framefuse --help`` does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Session": "framefuse.runtime.session",
    "SessionError": "framefuse.runtime.session",
    "LatencyStats": "framefuse.runtime.stats",
    "DEFAULT_BUDGET_MS": "framefuse.runtime.stats",
    "run_game_loop": "framefuse.runtime.game_loop",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'framefuse.runtime' has no attribute '{name}'")
