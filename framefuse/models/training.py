"""Trained weights for the zoo: a small deterministic training on a synthetic game-like task.

Why: with seeded random weights a zoo model's logits are near-ties, so the precision gate's argmax
agreement measures rounding noise between nearly equal numbers rather than whether a build keeps
the model's decisions (issue 19). A model trained on a task with a right answer has margins, and the
task's own frames are realistic inputs for the gate.

The task (:class:`GameTask`): ``objects`` balls move and bounce in a box; a frame is their positions
and velocities, lifted into ``in_features`` numbers by a fixed random projection (tanh), plus sensor
noise. The action at frame t is the latest bounce so far: which ball hit which of the four walls
(``4 * ball + wall``; ``4 * objects`` before the first one), folded into ``out_features`` classes.
A bounce shows only as a change between two frames (a velocity component changes sign), so a policy
has to remember an event: a recurrent (or attention) model has something to learn that a per-frame
MLP does not.

Training (:func:`train`): Adam, cross-entropy over every frame of windows of ``window`` frames from
the zero state, gradient norm clipped at 1, ``steps`` steps, all seeded. Seconds to minutes
on a CPU per model; the result is cached (:func:`trained_state_dict`) under
``$FRAMEFUSE_WEIGHTS_CACHE`` (default ``~/.cache/framefuse/weights``), keyed by a hash of the
architecture, its model config, the seed and the training recipe, so every export, test and
benchmark of the same config shares one training.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

#: Changing the task or the recipe changes this, and with it every cache key.
RECIPE_VERSION = 1


@dataclass(frozen=True)
class Recipe:
    steps: int = 200
    batch: int = 16
    window: int = 16
    lr: float = 3e-3
    clip: float = 1.0


@dataclass(frozen=True)
class GameTask:
    """The synthetic game (see the module docstring); every array it makes is float32."""

    in_features: int
    out_features: int
    seed: int = 0
    objects: int = 7
    speed: float = 0.08
    noise: float = 0.05

    @property
    def raw_features(self) -> int:
        return 4 * self.objects  # ball positions and velocities

    def _projection(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 7919])
        return (rng.standard_normal((self.raw_features, self.in_features)) / math.sqrt(self.raw_features)).astype(
            np.float32
        )

    def episodes(self, batch: int, frames: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x [batch, frames, in_features], actions [batch, frames] int64)`` of ``batch`` episodes."""
        rng = np.random.default_rng([self.seed, seed])
        pos = rng.uniform(-1, 1, (batch, self.objects, 2))
        vel = rng.normal(0, self.speed, (batch, self.objects, 2))
        raw = np.empty((batch, frames, self.raw_features))
        actions = np.empty((batch, frames), np.int64)
        last = np.full(batch, self.none_action)
        for t in range(frames):
            pos += vel
            for axis in range(2):  # bounce off the walls; the latest bounce is the action
                low, high = pos[..., axis] < -1, pos[..., axis] > 1
                vel[..., axis] = np.where(low | high, -vel[..., axis], vel[..., axis])
                pos[..., axis] = np.clip(pos[..., axis], -1, 1)
                for wall, hit in ((2 * axis, low), (2 * axis + 1, high)):
                    rows, balls = np.nonzero(hit)
                    last[rows] = 4 * balls + wall
            raw[:, t] = np.concatenate([pos.reshape(batch, -1), vel.reshape(batch, -1) / self.speed], axis=1)
            actions[:, t] = last
        x = np.tanh(raw @ self._projection()) + self.noise * rng.standard_normal((batch, frames, self.in_features))
        return x.astype(np.float32), actions % self.out_features

    @property
    def none_action(self) -> int:
        return 4 * self.objects  # before the first bounce

    def describe(self) -> str:
        return f"synthetic game ({self.objects} bouncing balls; action = the latest bounce: ball and wall)"


def task_inputs(config: Mapping, shape, frames: int) -> np.ndarray:
    """Frames of the task for a graph input ``x`` of ``shape`` (step [B, F] or sequence [B, T, F]),
    laid out as the accuracy report takes them: [frames, B, F] or [ceil(frames / T), B, T, F]; one
    continuous episode per batch row, from a seed no training batch uses."""
    task = task_for(config)
    batch = int(shape[0])
    per_run = int(shape[1]) if len(shape) == 3 else 1
    runs = -(-frames // per_run)
    x, _ = task.episodes(batch, runs * per_run, seed=2**31 - 1)
    if len(shape) == 3:
        return np.ascontiguousarray(x.reshape(batch, runs, per_run, -1).transpose(1, 0, 2, 3))
    return np.ascontiguousarray(x.transpose(1, 0, 2))


def task_for(config: Mapping) -> GameTask:
    return GameTask(int(config["in_features"]), int(config["out_features"]), seed=int(config.get("seed", 0)))


def cache_dir() -> Path:
    root = os.environ.get("FRAMEFUSE_WEIGHTS_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "framefuse" / "weights"


def cache_key(arch: str, model_config: Mapping, seed: int, recipe: Recipe = Recipe()) -> str:
    text = json.dumps(
        {"arch": arch, "model": dict(model_config), "seed": seed, "recipe": asdict(recipe), "v": RECIPE_VERSION},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def train(
    model, task: GameTask, *, seed: int, recipe: Recipe = Recipe(), progress: Callable[[str], None] | None = None
):
    """Train ``model`` (a FrameModel: forward [B, T, F] → [B, T, C]) in place on ``task``; returns
    a summary (first and last loss, accuracy of the last batch, seconds)."""
    import torch

    torch.manual_seed(seed)
    model.train()
    optimiser = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    first = last = math.nan
    accuracy = math.nan
    start = time.perf_counter()
    for step in range(recipe.steps):
        x, actions = task.episodes(recipe.batch, recipe.window, seed=1_000_003 * seed + step)
        logits = model(torch.from_numpy(x))
        target = torch.from_numpy(actions)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training diverged at step {step} (loss {float(loss)})")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        optimiser.step()
        last = float(loss.detach())
        if step == 0:
            first = last
        if step == recipe.steps - 1:
            accuracy = float((logits.argmax(-1) == target).float().mean())
        if progress is not None and (step + 1) % 50 == 0:
            progress(f"training step {step + 1}/{recipe.steps}: loss {last:.3f}")
    model.eval()
    return {
        "steps": recipe.steps,
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "accuracy_last_batch": round(accuracy, 4),
        "seconds": round(time.perf_counter() - start, 1),
    }


def trained_state_dict(
    arch: str, model, model_config: Mapping, seed: int, task: GameTask, *, progress: Callable[[str], None] | None = None
) -> tuple[dict, dict]:
    """``(state_dict, summary)`` of ``model`` (built from ``model_config`` and ``seed``) trained on
    ``task``: from the cache when this config was trained before, else trained now and cached
    (written to a temporary name, then renamed)."""
    import torch

    recipe = Recipe()
    key = cache_key(arch, {**dict(model_config), "task": asdict(task)}, seed, recipe)
    folder = cache_dir()
    path = folder / f"{arch}-{key}.pt"
    if path.is_file():
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            return saved["state_dict"], {**json.loads(saved["summary"]), "cache": str(path), "cached": True}
        except Exception:  # noqa: BLE001 - a damaged cache entry is trained again
            pass
    if progress is not None:
        progress(f"training {arch} on the {task.describe()} ({recipe.steps} steps; cached afterwards)")
    summary = train(model, task, seed=seed, recipe=recipe, progress=progress)
    summary.update({"task": task.describe(), "recipe": asdict(recipe)})
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"
    torch.save({"state_dict": state, "summary": json.dumps(summary)}, tmp)
    os.replace(tmp, path)
    return state, {**summary, "cache": str(path), "cached": False}
