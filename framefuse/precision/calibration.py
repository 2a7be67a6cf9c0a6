"""Calibration frames for int8: a user's ``.npz`` or inputs drawn from the config's seed.

A calibration set is a dict ``input name → array [frames, *input shape]`` (the leading axis counts
frames). For the step form the recurrent state inputs (``state.<name>``) may be left out: the
calibration rollout then carries the graph's own ``next_state.<name>`` from frame to frame,
starting from zeros, so the ranges seen are those of a real rollout rather than of random states.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from framefuse.precision.errors import CalibrationError

DEFAULT_FRAMES = 64


def graph_inputs(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Static shape and numpy dtype of every graph input (initializers excluded)."""
    inits = {i.name for i in model.graph.initializer}
    result = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = []
        for d in tt.shape.dim:
            if not d.HasField("dim_value"):
                raise CalibrationError(f"graph input {vi.name}: dimension {d.dim_param or '?'} is not static")
            dims.append(int(d.dim_value))
        result[vi.name] = (tuple(dims), np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)))
    return result


def is_state(name: str) -> bool:
    return name.startswith("state.")


def validate(arrays: Mapping[str, np.ndarray], model: onnx.ModelProto, label: str) -> dict[str, np.ndarray]:
    """``arrays`` checked against the graph's inputs; returns them as contiguous arrays.

    Every non-state input must be present; state inputs are optional (carried when absent); no
    unknown names; each array ``[frames, *shape]`` of the input's dtype, finite, frames ≥ 1 and the
    same for every array."""
    specs = graph_inputs(model)
    unknown = sorted(set(arrays) - set(specs))
    if unknown:
        raise CalibrationError(f"{label}: arrays {unknown} are not inputs of the graph (inputs: {sorted(specs)})")
    missing = sorted(n for n in specs if n not in arrays and not is_state(n))
    if missing:
        raise CalibrationError(f"{label}: no array for graph input(s) {missing} (arrays: {sorted(arrays)})")
    frames = None
    result = {}
    for name, raw in arrays.items():
        shape, dtype = specs[name]
        arr = np.asarray(raw)
        if arr.dtype != dtype:
            raise CalibrationError(f"{label}: array {name} is {arr.dtype}, the graph input is {dtype}")
        if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape:
            raise CalibrationError(
                f"{label}: array {name} has shape {list(arr.shape)}; expected [frames, {', '.join(map(str, shape))}]"
            )
        if arr.shape[0] == 0:
            raise CalibrationError(f"{label}: array {name} has no frames (leading axis is 0)")
        if frames is not None and arr.shape[0] != frames:
            raise CalibrationError(f"{label}: array {name} has {arr.shape[0]} frames, others have {frames}")
        frames = arr.shape[0]
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            bad = int(np.argmax(~np.isfinite(arr).reshape(arr.shape[0], -1).all(axis=1)))
            raise CalibrationError(f"{label}: array {name} has NaN/Inf (first at frame {bad})")
        result[name] = np.ascontiguousarray(arr)
    return result


def load_calibration(path, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A calibration ``.npz`` checked against ``model`` (see :func:`validate`)."""
    path = Path(os.fspath(path))
    if not path.is_file():
        raise CalibrationError(f"{path}: calibration file not found")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):  # a .npy: one unnamed array
            frames = sorted(n for n in graph_inputs(model) if not is_state(n))
            if len(frames) != 1:
                raise CalibrationError(
                    f"{path}: a .npy holds one unnamed array, the graph has frame inputs {frames}: save them by "
                    f"name with np.savez(path, **{{name: frames}})"
                )
            arrays = {frames[0]: loaded}
        else:
            with loaded as data:
                arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CalibrationError(f"{path}: not a readable .npz or .npy of arrays ({exc})") from exc
    if not arrays:
        raise CalibrationError(f"{path}: the file holds no arrays (no frames)")
    return validate(arrays, model, str(path))


def default_calibration(
    model: onnx.ModelProto, *, frames: int = DEFAULT_FRAMES, seed: int = 0
) -> dict[str, np.ndarray]:
    """Standard-normal frames for every non-state float input, seeded (the exporter's check inputs
    are drawn the same way); integer inputs are zeros. State inputs are left to the rollout."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, (shape, dtype) in graph_inputs(model).items():
        if is_state(name):
            continue
        if np.issubdtype(dtype, np.floating):
            arrays[name] = rng.standard_normal((frames, *shape)).astype(dtype)
        else:
            arrays[name] = np.zeros((frames, *shape), dtype=dtype)
    return arrays


def resolve(calib, model: onnx.ModelProto, *, config: Mapping | None = None, frames: int = DEFAULT_FRAMES):
    """``calib`` (None, a path, or a mapping of arrays) as a validated calibration set."""
    if calib is None:
        seed = int((config or {}).get("seed", 0) or 0)
        return default_calibration(model, frames=frames, seed=seed)
    if isinstance(calib, Mapping):
        return validate(calib, model, "calibration arrays")
    return load_calibration(calib, model)


def iter_feeds(arrays: Mapping[str, np.ndarray], model: onnx.ModelProto, run, *, limit: int | None = None):
    """Per-frame feeds; missing state inputs start at zeros and are carried through ``run(feeds) ->
    outputs`` (which must return ``next_state.<n>``). Yields ``(feeds, outputs)``."""
    specs = graph_inputs(model)
    n = next(iter(arrays.values())).shape[0]
    if limit is not None:
        n = min(n, limit)
    carried = {
        name: np.zeros(shape, dtype) for name, (shape, dtype) in specs.items() if is_state(name) and name not in arrays
    }
    for t in range(n):
        feeds = {name: arr[t] for name, arr in arrays.items()}
        feeds.update(carried)
        outputs = run(feeds)
        for name in carried:
            carried[name] = np.asarray(outputs["next_" + name])
        yield feeds, outputs
