"""Parity of a fused artifact against the original graph, with Polygraphy.

Each side is a Polygraphy runner (ONNX Runtime CPU for ONNX files; later engines bring their own
runner), fed the same inputs: given ones, or Polygraphy's seeded ``DataLoader`` over the graph's
static shapes. ``CompareFunc.simple`` checks every output with the tolerance of its dtype.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from framefuse.config import PRECISION_TOLERANCE
from framefuse.errors import ParityError
from framefuse.files import write_text_atomic
from framefuse.plugins.ort_bridge import load_any, ort_session

# Per-dtype tolerance (used as both atol and rtol) when the config does not say otherwise: the
# precisions' own (config.PRECISION_TOLERANCE), float64 tighter.
DEFAULT_TOLERANCE = {
    "float32": PRECISION_TOLERANCE["fp32"],
    "float64": 1e-6,
    "float16": PRECISION_TOLERANCE["fp16"],
    "bfloat16": PRECISION_TOLERANCE["bf16"],
}


@dataclass
class OutputParity:
    name: str
    dtype: str
    shape: list
    max_abs: float
    max_rel: float
    mean_abs: float
    atol: float
    rtol: float
    passed: bool


@dataclass
class ParityReport:
    original: str
    fused: str
    passed: bool
    outputs: list[OutputParity] = field(default_factory=list)
    tolerance: dict = field(default_factory=dict)
    seed: int = 0
    iterations: int = 1
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        def clean(x):
            return None if isinstance(x, float) and not math.isfinite(x) else x

        outs = []
        for o in self.outputs:
            d = asdict(o)
            d["max_abs"], d["max_rel"], d["mean_abs"] = (clean(d["max_abs"]), clean(d["max_rel"]), clean(d["mean_abs"]))
            outs.append(d)
        return {
            "original": self.original,
            "fused": self.fused,
            "passed": self.passed,
            "tolerance": self.tolerance,
            "seed": self.seed,
            "iterations": self.iterations,
            "outputs": outs,
            "notes": self.notes,
        }

    def write(self, path) -> Path:
        path = Path(path)
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def summary(self) -> str:
        worst = max(self.outputs, key=lambda o: o.max_abs if math.isfinite(o.max_abs) else float("inf"), default=None)
        state = "PASS" if self.passed else "FAIL"
        if worst is None:
            return f"parity {state}: no outputs compared"
        return (
            f"parity {state}: {len(self.outputs)} outputs, worst {worst.name} max abs {worst.max_abs:.3g} "
            f"rel {worst.max_rel:.3g} (atol {worst.atol:g}, rtol {worst.rtol:g})"
        )

    def raise_if_failed(self) -> None:
        if not self.passed:
            failed = [o for o in self.outputs if not o.passed]
            listing = "; ".join(
                f"{o.name}: max abs {o.max_abs:.3g}, max rel {o.max_rel:.3g} > tol {o.atol:g}" for o in failed
            )
            raise ParityError(f"{self.fused} does not match {self.original}: {listing or 'see report'}")


def tolerance_for(dtype_name: str, tolerance) -> float:
    """The tolerance of one output dtype: a number applies to every dtype; a dict maps dtype
    names (float32/float16/bfloat16, or fp32/fp16/bf16) to numbers."""
    if tolerance is None:
        return DEFAULT_TOLERANCE.get(dtype_name, 1e-4)
    if isinstance(tolerance, (int, float)):
        return float(tolerance)
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}
    table = {aliases.get(k, k): float(v) for k, v in dict(tolerance).items()}
    return table.get(dtype_name, DEFAULT_TOLERANCE.get(dtype_name, 1e-4))


def _runner(side, *, fused: bool, name: str):
    """A Polygraphy runner for `side` (a runner is used as is)."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.backend.onnxrt import OnnxrtRunner

    if isinstance(side, BaseRunner):
        return side, getattr(side, "name", name)
    proto, label = load_any(side)
    return OnnxrtRunner(lambda: ort_session(proto, fused=fused), name=name), label


def _feeds(inputs, runner, seed: int, iterations: int, val_range):
    from polygraphy.comparator import DataLoader

    if inputs is not None:
        feeds = [inputs] if isinstance(inputs, dict) else list(inputs)
        return [{k: np.asarray(v) for k, v in f.items()} for f in feeds]
    with runner:
        meta = runner.get_input_metadata(use_numpy_dtypes=False)
    ranges = {}
    for name, m in meta.items():
        shape = m.shape
        if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
            from framefuse.plugins.ort_bridge import ParitySetupError

            raise ParitySetupError(
                f"input {name} has a dynamic shape {shape}: pass `inputs` or export with static shapes"
            )
        dt = str(m.dtype).lower()
        ranges[name] = val_range if "float" in dt else (0, 1)
    loader = DataLoader(seed=seed, iterations=iterations, input_metadata=meta, val_range=ranges)
    return [dict(feed) for feed in loader]


def _simple_compare_func(atol: dict, rtol: dict):
    """Polygraphy's simple comparison (|a−b| ≤ atol or ≤ rtol·|a| per element, NaN fails, equal
    infinities pass). Polygraphy 0.53 deprecates ``CompareFunc.simple`` in favour of
    ``SimpleCompareFunc``; older versions only have the former."""
    try:
        from polygraphy.comparator.compare import SimpleCompareFunc

        return SimpleCompareFunc(atol=atol, rtol=rtol, infinities_compare_equal=True)
    except ImportError:
        from polygraphy.comparator import CompareFunc

        return CompareFunc.simple(atol=atol, rtol=rtol, infinities_compare_equal=True)


def compare(
    original,
    fused,
    *,
    inputs=None,
    tolerance=None,
    seed: int = 0,
    iterations: int = 1,
    val_range=(-1.0, 1.0),
    report_path=None,
) -> ParityReport:
    """Run `original` and `fused` on the same inputs and compare every output.

    original/fused: ONNX ModelProto, path, or a Polygraphy runner. inputs: a feed dict or a list
    of them (default: seeded random data over the static input shapes). tolerance: a number or a
    per-dtype dict (default DEFAULT_TOLERANCE), used as atol and rtol. Writes the report to
    `report_path` when given. Does not raise on a mismatch: see ``ParityReport.passed``.
    """
    from polygraphy.comparator import Comparator
    from polygraphy.logger import G_LOGGER

    ref_runner, ref_label = _runner(original, fused=False, name="original")
    test_runner, test_label = _runner(fused, fused=True, name="fused")
    with G_LOGGER.verbosity(G_LOGGER.ERROR):
        feeds = _feeds(inputs, ref_runner, seed, iterations, val_range)
        results = Comparator.run([ref_runner, test_runner], data_loader=feeds)
    ref_outputs = results[0][1]
    test_outputs = results[1][1]

    per_output: dict[str, tuple[float, float]] = {}
    stats: dict[str, dict] = {}
    for _it, (ref, test) in enumerate(zip(ref_outputs, test_outputs)):
        for name in ref.keys():
            a = np.asarray(ref[name])
            if name not in test:
                raise ParityError(f"{test_label} does not produce output {name!r} that {ref_label} has")
            b = np.asarray(test[name])
            dtype = a.dtype.name
            tol = tolerance_for(dtype, tolerance)
            per_output[name] = (tol, tol)
            if a.shape != b.shape:
                stats[name] = dict(
                    dtype=dtype,
                    shape=list(a.shape),
                    max_abs=float("inf"),
                    max_rel=float("inf"),
                    mean_abs=float("inf"),
                    shape_mismatch=list(b.shape),
                )
                continue
            if a.dtype.kind in "fc":
                a64, b64 = a.astype(np.float64), b.astype(np.float64)
                both_nan = np.isnan(a64) & np.isnan(b64)
                same_inf = np.isinf(a64) & (a64 == b64)
                diff = np.where(both_nan | same_inf, 0.0, np.abs(a64 - b64))
                diff = np.where(np.isnan(diff), np.inf, diff)
                rel = diff / np.maximum(np.abs(a64), np.finfo(np.float64).tiny)
                rel = np.where(diff == 0, 0.0, rel)
            else:
                diff = np.abs(a.astype(np.int64) - b.astype(np.int64)).astype(np.float64)
                rel = diff
            prev = stats.get(name)
            cur = dict(
                dtype=dtype,
                shape=list(a.shape),
                max_abs=float(diff.max(initial=0.0)),
                max_rel=float(rel.max(initial=0.0)),
                mean_abs=float(diff.mean()) if diff.size else 0.0,
            )
            if prev is None or "shape_mismatch" not in prev:
                if prev is not None:
                    cur = dict(
                        cur,
                        max_abs=max(cur["max_abs"], prev["max_abs"]),
                        max_rel=max(cur["max_rel"], prev["max_rel"]),
                        mean_abs=max(cur["mean_abs"], prev["mean_abs"]),
                    )
                stats[name] = cur

    atol = {n: t[0] for n, t in per_output.items()}
    rtol = {n: t[1] for n, t in per_output.items()}
    with G_LOGGER.verbosity(G_LOGGER.ERROR):
        accuracy = Comparator.compare_accuracy(results, compare_func=_simple_compare_func(atol, rtol))
    poly_passed = bool(accuracy)
    outputs = []
    for name, s in stats.items():
        # Polygraphy's rule per element: |a−b| ≤ atol or |a−b|/|a| ≤ rtol; summarised per output here.
        ok = "shape_mismatch" not in s and (s["max_abs"] <= atol[name] or s["max_rel"] <= rtol[name])
        outputs.append(
            OutputParity(
                name=name,
                dtype=s["dtype"],
                shape=s["shape"],
                max_abs=s["max_abs"],
                max_rel=s["max_rel"],
                mean_abs=s["mean_abs"],
                atol=atol[name],
                rtol=rtol[name],
                passed=bool(ok),
            )
        )
    report = ParityReport(
        original=ref_label,
        fused=test_label,
        passed=poly_passed and all(o.passed for o in outputs),
        outputs=outputs,
        tolerance={n: atol[n] for n in atol},
        seed=seed,
        iterations=len(feeds),
    )
    if not poly_passed:
        report.notes.append("Polygraphy's CompareFunc.simple reported a mismatch")
    if report_path is not None:
        report.write(report_path)
    return report
