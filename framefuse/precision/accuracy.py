"""Accuracy of a converted graph (fp16 / bf16 / int8) against its fp32 reference, on the same inputs.

The step form is run over ``frames`` frames (1000 by default) two ways at once:

- **every frame from the reference's state**: the reference steps its own rollout, and the candidate
  runs each frame from the *reference's* state. Per output (the next states included): max |Δ|, max
  relative |Δ| / |ref| (over elements where |ref| > 1e-6), mean |Δ|, and the pass test, norm-wise
  per output and frame, ``max|Δ| ≤ tol · (1 + max|ref|)`` with tol the configured tolerance of the
  precision (``configs/<arch>.yaml`` ``tolerance``): the error a step of this precision adds.
  Norm-wise because rounding error scales with the magnitudes that were summed, not with the
  result: a state element that is a near-cancellation of large terms (an LSTM's c = f·c + i·g; the
  zoo LSTM trained with an earlier recipe reached |c| = 470 over 1000 frames) is off by
  eps·|terms| however small it is, which an element-wise ``|Δ| ≤ tol + tol·|ref|`` calls a failure of any precision (fp16 on the
  min_lstm of that recipe, from the reference's state: max |Δ| 0.044, relative 14.8 on some element).
- **the candidate's own rollout**: the candidate carries its *own* state (``next_state.<n>`` →
  ``state.<n>``) from the zero state, as the game loop will. The policy output's (default ``y``)
  argmax is compared with the reference's frame by frame, and each output's max |Δ| to the
  reference is kept as ``drift``. Recurrent state lets error accumulate, and a trained model's
  state amplifies it where its dynamics switch (that LSTM's cell state after 1000 frames of the
  zoo's task: bf16 2.5 apart, while no step from the reference's state was more than 0.004 beyond
  the element-wise 3e-2): so the decisions are what this rollout gates, and the drift is reported.

The report passes when every output is within tolerance and the argmax agreement is ≥ 99.5 %. The
sequence form (no state) is run on ``ceil(frames / T)`` independent sequences, one way.

Sides are ONNX models / paths or runners with ``.run(feeds) -> dict`` (the engine runners of
:mod:`framefuse.engines.registry`). A model is run by ONNX Runtime (CPU; framefuse nodes through
their references) unless it holds bfloat16 tensors — ORT's CPU provider has no bf16 kernels for
MatMul/Gemm and most elementwise ops — then by the CPU executor
(:class:`framefuse.engines.cuda_graph.CudaGraphEngine`, ``device="cpu"``); ``engine=`` forces one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from framefuse.config import PRECISION_TOLERANCE
from framefuse.precision import calibration
from framefuse.precision.errors import PrecisionError

DEFAULT_FRAMES = 1000
MIN_AGREEMENT = 0.995
DEFAULT_TOLERANCE = dict(PRECISION_TOLERANCE)
ENGINES = ("auto", "onnxruntime", "cpu")
_REL_FLOOR = 1e-6


@dataclass
class OutputAccuracy:
    name: str
    max_abs: float
    max_rel: float
    mean_abs: float
    atol: float
    rtol: float
    passed: bool


@dataclass
class AccuracyReport:
    reference: str
    candidate: str
    precision: str | None
    form: str  # "step" | "sequence"
    frames: int
    seed: int
    tolerance: float
    outputs: list[OutputAccuracy] = field(default_factory=list)
    policy_output: str | None = None
    argmax_agreement: float | None = None
    min_agreement: float = MIN_AGREEMENT
    engines: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Percentiles (p1, p10, p50) of the reference's top-2 margin of the policy output (its largest
    #: value minus the second largest) over the compared rows: how close to a tie the decisions are.
    margins: dict | None = None
    #: max |Δ| per output over the candidate's own rollout (step form), reported, not gated.
    drift: dict | None = None
    #: Products an int8 weight-only build kept in float32 to pass the gate (framefuse.build's fallback).
    kept_fp32: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        agree = self.argmax_agreement is None or self.argmax_agreement >= self.min_agreement
        return agree and all(o.passed for o in self.outputs)

    def failures(self) -> list[str]:
        lines = [
            f"{o.name}: max |diff| {o.max_abs:.3g} (max rel {o.max_rel:.3g}) beyond tolerance {o.atol:g}"
            for o in self.outputs
            if not o.passed
        ]
        if self.argmax_agreement is not None and self.argmax_agreement < self.min_agreement:
            lines.append(
                f"{self.policy_output}: argmax agrees on {100 * self.argmax_agreement:.2f}% of frames "
                f"(need {100 * self.min_agreement:.1f}%{self._margin_text()})"
            )
        return lines

    def _margin_text(self) -> str:
        if not self.margins:
            return ""
        m = self.margins
        return f"; fp32 top-2 margin p1 {m['p1']:.3g}, p10 {m['p10']:.3g}, p50 {m['p50']:.3g}"

    def to_dict(self) -> dict:
        def clean(value):
            return None if isinstance(value, float) and not math.isfinite(value) else value

        data = asdict(self)
        data["outputs"] = [{k: clean(v) for k, v in asdict(o).items()} for o in self.outputs]
        data["passed"] = self.passed
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> AccuracyReport:
        def num(value):
            return math.inf if value is None else value

        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "outputs"}
        outputs = [
            OutputAccuracy(**{k: (num(v) if k in ("max_abs", "max_rel", "mean_abs") else v) for k, v in o.items()})
            for o in data.get("outputs", [])
        ]
        return cls(**fields, outputs=outputs)

    @classmethod
    def read(cls, path) -> AccuracyReport:
        path = Path(os.fspath(path))
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise PrecisionError(f"{path}: not a readable accuracy report ({exc})") from exc

    def rows(self) -> list[dict]:
        """One row per output (+ the argmax agreement on the policy output's row), for tables."""
        rows = []
        for o in self.outputs:
            row = {
                "precision": self.precision or "-",
                "output": o.name,
                "max_abs": o.max_abs,
                "max_rel": o.max_rel,
                "tolerance": o.atol,
                "argmax_agree": self.argmax_agreement if o.name == self.policy_output else None,
                "passed": o.passed,
            }
            rows.append(row)
        return rows

    def table(self) -> str:
        head = f"{'precision':<9}  {'output':<24}  {'max abs':>9}  {'max rel':>9}  {'tol':>7}  {'argmax':>7}  ok"
        lines = [head]
        for r in self.rows():
            agree = "-" if r["argmax_agree"] is None else f"{100 * r['argmax_agree']:.2f}%"
            lines.append(
                f"{r['precision']:<9}  {r['output']:<24}  {r['max_abs']:>9.3g}  {r['max_rel']:>9.3g}  "
                f"{r['tolerance']:>7.0e}  {agree:>7}  {'yes' if r['passed'] else 'NO'}"
            )
        if self.margins:
            lines.append(f"{self.policy_output}: {self._margin_text().removeprefix('; ')}")
        if self.drift:
            worst = ", ".join(f"{name} {value:.3g}" for name, value in self.drift.items())
            lines.append(f"drift over its own rollout (max |diff|, not gated): {worst}")
        lines.append(
            f"({self.form} form, {self.frames} frames, seed {self.seed}; {'passed' if self.passed else 'FAILED'})"
        )
        return "\n".join(lines)

    def write(self, path) -> Path:
        """Write the report as JSON, atomically (temp name, then os.replace)."""
        path = Path(os.fspath(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str) + "\n")
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path


# ---------------------------------------------------------------------------------------------
# running a side


def _has_bf16(model: onnx.ModelProto) -> bool:
    graph = model.graph
    if any(i.data_type == TensorProto.BFLOAT16 for i in graph.initializer):
        return True
    values = list(graph.input) + list(graph.output) + list(graph.value_info)
    if any(v.type.tensor_type.elem_type == TensorProto.BFLOAT16 for v in values):
        return True
    return any(
        a.name == "to" and a.i == TensorProto.BFLOAT16 for n in graph.node if n.op_type == "Cast" for a in n.attribute
    )


class _Side:
    """One side of the comparison: a ``run(feeds) -> dict`` and what it is."""

    def __init__(self, source, engine: str, what: str):
        self.model: onnx.ModelProto | None = None
        if isinstance(source, (str, os.PathLike)):
            path = Path(os.fspath(source))
            if not path.is_file():
                raise PrecisionError(f"{what}: {path}: no such ONNX file")
            self.model = onnx.load(str(path))
            self.label = str(path)
        elif isinstance(source, onnx.ModelProto):
            self.model = source
            self.label = source.graph.name or "<model>"
        elif callable(getattr(source, "run", None)):
            self.runner = source
            self.label = type(source).__name__
            self.engine = getattr(source, "NAME", None) or type(source).__name__
            self._run = source.run
            return
        else:
            raise PrecisionError(
                f"{what}: need an ONNX model, a path or a runner with .run(feeds), got {type(source).__name__}"
            )
        if engine not in ENGINES:
            raise PrecisionError(f"engine must be one of {ENGINES}, got {engine!r}")
        if engine == "auto":
            engine = "cpu" if _has_bf16(self.model) else "onnxruntime"
        self.engine = engine
        if engine == "onnxruntime":
            from framefuse.plugins.ort_bridge import ort_session

            session = ort_session(self.model)
            names = [o.name for o in session.get_outputs()]
            self._run = lambda feeds: dict(zip(names, session.run(names, dict(feeds))))
        else:
            from framefuse.engines.cuda_graph import CudaGraphEngine

            runner = CudaGraphEngine(self.model, device="cpu")
            self._run = runner.run

    def run(self, feeds) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in self._run(feeds).items()}


class _Stats:
    def __init__(self):
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.sum_abs = 0.0
        self.count = 0
        self.excess = -np.inf  # max over frames of max|Δ| - tol·(1 + max|ref|)

    def add(self, ref: np.ndarray, got: np.ndarray, tol: float) -> None:
        ref = ref.astype(np.float64)
        got = got.astype(np.float64)
        diff = np.abs(got - ref)
        diff = np.where(np.isnan(diff) & ~(np.isnan(ref) & np.isnan(got)), np.inf, np.nan_to_num(diff, nan=0.0))
        self.max_abs = max(self.max_abs, float(diff.max(initial=0.0)))
        big = np.abs(ref) > _REL_FLOOR
        if big.any():
            self.max_rel = max(self.max_rel, float((diff[big] / np.abs(ref[big])).max()))
        self.sum_abs += float(np.minimum(diff, 1e300).sum())
        self.count += diff.size
        scale = float(np.abs(np.nan_to_num(ref, nan=0.0, posinf=0.0, neginf=0.0)).max(initial=0.0))
        self.excess = max(self.excess, float(diff.max(initial=-np.inf)) - tol * (1.0 + scale))


def accuracy_report(
    reference,
    candidate,
    *,
    frames: int = DEFAULT_FRAMES,
    seed: int = 0,
    calib=None,
    policy_output: str | None = None,
    tolerance: float | None = None,
    precision: str | None = None,
    min_agreement: float = MIN_AGREEMENT,
    engine: str = "auto",
) -> AccuracyReport:
    """Compare ``candidate`` with ``reference`` (see the module docstring). ``calib``: a .npz path or
    a mapping of arrays (leading axis = frames) used as the inputs instead of seeded normal frames.
    ``tolerance`` default: DEFAULT_TOLERANCE[precision] (fp32's when no precision is given)."""
    if frames < 1:
        raise PrecisionError(f"frames must be ≥ 1, got {frames}")
    ref = _Side(reference, engine, "reference")
    cand = _Side(candidate, engine, "candidate")
    model = ref.model or cand.model
    if model is None:
        raise PrecisionError("accuracy_report: at least one side must be an ONNX model or path (for the input shapes)")
    tol = float(tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(precision or "fp32", 1e-4))
    specs = calibration.graph_inputs(model)
    states = [n for n in specs if calibration.is_state(n)]
    form = "step" if states else "sequence"
    notes = []
    if calib is not None:
        arrays = calibration.resolve(calib, model)
        available = next(iter(arrays.values())).shape[0]
        if form == "sequence":
            available *= _seq_len(specs)  # runs of T frames
        if available < frames:
            notes.append(f"the calibration set has {available} frames; compared over those")
    else:
        rng_frames = frames if form == "step" else max(1, math.ceil(frames / _seq_len(specs)))
        arrays = calibration.default_calibration(model, frames=rng_frames, seed=seed)
    count = next(iter(arrays.values())).shape[0]
    if form == "step":
        count = min(count, frames)
    stats: dict[str, _Stats] = {}
    agree = total = 0
    margins: list[np.ndarray] = []
    drift: dict[str, float] = {}
    carried_ref = {n: np.zeros(specs[n][0], specs[n][1]) for n in states if n not in arrays}
    carried_cand = {n: v.copy() for n, v in carried_ref.items()}
    for t in range(count):
        feeds = {name: arr[t] for name, arr in arrays.items()}
        out_ref = ref.run({**feeds, **carried_ref})
        # The step's own error: the candidate from the reference's state. Without state the two
        # runs are the same run.
        out_cand = cand.run({**feeds, **carried_ref})
        own = cand.run({**feeds, **carried_cand}) if carried_ref else out_cand
        for name in carried_ref:
            carried_ref[name] = out_ref["next_" + name]
            carried_cand[name] = np.asarray(own["next_" + name], dtype=specs[name][1])
        if carried_ref:
            for name, value in out_ref.items():
                gap = np.abs(np.asarray(own[name], dtype=np.float64) - value)
                worst = float(np.nan_to_num(gap, nan=np.inf).max(initial=0.0))
                drift[name] = max(drift.get(name, 0.0), worst)
        if t == 0:
            missing = sorted(set(out_ref) - set(out_cand))
            if missing:
                raise PrecisionError(f"{cand.label}: outputs {missing} of the reference are missing")
            if policy_output is None and "y" in out_ref:
                policy_output = "y"
            if policy_output is not None and policy_output not in out_ref:
                raise PrecisionError(f"policy output {policy_output!r} is not an output (outputs: {sorted(out_ref)})")
        for name, value in out_ref.items():
            stats.setdefault(name, _Stats()).add(value, out_cand[name], tol)
        if policy_output is not None:
            reference_logits = np.asarray(out_ref[policy_output], dtype=np.float64)
            if reference_logits.shape[-1] >= 2:
                top2 = np.sort(reference_logits, axis=-1)[..., -2:]
                margins.append((top2[..., 1] - top2[..., 0]).ravel())
            a = np.argmax(out_ref[policy_output], axis=-1)
            b = np.argmax(np.asarray(own[policy_output], dtype=np.float32), axis=-1)
            agree += int((a == b).sum())
            total += a.size
    outputs = [
        OutputAccuracy(name, s.max_abs, s.max_rel, s.sum_abs / max(s.count, 1), tol, tol, bool(s.excess <= 0.0))
        for name, s in stats.items()
    ]
    return AccuracyReport(
        reference=ref.label,
        candidate=cand.label,
        precision=precision,
        form=form,
        frames=count if form == "step" else count * _seq_len(specs),
        seed=seed,
        tolerance=tol,
        outputs=outputs,
        policy_output=policy_output,
        argmax_agreement=(agree / total) if total else None,
        min_agreement=min_agreement,
        engines={"reference": ref.engine, "candidate": cand.engine},
        notes=notes,
        margins=_margin_percentiles(margins),
        drift=drift or None,
    )


def gate_inputs(manifest: Mapping | None, frames: int) -> tuple[dict | None, str | None]:
    """The inputs the accuracy gate of an export should run on, and a note saying which: the frames
    of the synthetic game task when the model was trained on it (its decisions mean something
    there), else None (seeded standard-normal frames, the report's default)."""
    manifest = manifest or {}
    weights = manifest.get("weights") or {}
    inputs = {i["name"]: i["shape"] for i in manifest.get("inputs") or []}
    if weights.get("source") != "trained" or "x" not in inputs or len(inputs["x"]) not in (2, 3):
        return None, None
    from framefuse.models.training import task_inputs

    x = task_inputs(manifest.get("config") or {}, inputs["x"], frames)
    return {"x": x}, "inputs: frames of the synthetic game task the weights were trained on"


def _margin_percentiles(margins: list[np.ndarray]) -> dict | None:
    values = np.concatenate(margins) if margins else np.empty(0)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    p1, p10, p50 = np.percentile(values, [1, 10, 50])
    return {"p1": float(p1), "p10": float(p10), "p50": float(p50)}


def _seq_len(specs: Mapping) -> int:
    """Frames per run of the sequence form: the time axis (1) of ``x`` [B, T, F], else 1."""
    shape = specs.get("x", ((),))[0]
    return int(shape[1]) if len(shape) >= 3 else 1
