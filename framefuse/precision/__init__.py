"""Precision conversion of framefuse graphs (fp16 / bf16 / int8) and the accuracy report against fp32.

>>> from framefuse.precision import convert_model, accuracy_report
>>> fp16 = convert_model(onnx.load("artifacts/mamba-step/model.fused.onnx"), "fp16")
>>> report = accuracy_report("artifacts/mamba-step/model.fused.onnx", fp16, frames=1000)
>>> report.passed, report.rows()

Precision is a transformation of the ONNX graph, so every engine sees the same numbers. See
README.md (section "Precision") for what stays fp32 and why. Names are loaded lazily.
"""

from __future__ import annotations

from framefuse._lazy import lazy_getattr

_EXPORTS = {
    "PRECISIONS": "framefuse.precision.convert",
    "INT8_MODES": "framefuse.precision.convert",
    "int8_mode_of": "framefuse.precision.convert",
    "convert_model": "framefuse.precision.convert",
    "to_low_precision": "framefuse.precision.convert",
    "unsupported_reason": "framefuse.precision.convert",
    "quantize_int8": "framefuse.precision.quantize",
    "load_calibration": "framefuse.precision.calibration",
    "default_calibration": "framefuse.precision.calibration",
    "accuracy_report": "framefuse.precision.accuracy",
    "AccuracyReport": "framefuse.precision.accuracy",
    "OutputAccuracy": "framefuse.precision.accuracy",
    "PrecisionError": "framefuse.precision.errors",
    "CalibrationError": "framefuse.precision.errors",
    "AccuracyError": "framefuse.precision.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
