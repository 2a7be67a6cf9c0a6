"""The export stage: torch → ONNX (sequence and step forms), checked against ONNX Runtime.

>>> from framefuse.exporter import export_model
>>> result = export_model("min_gru", form="step", config=None, out_dir="artifacts")
>>> result.model_path   # artifacts/min_gru-step/model.onnx

Names are loaded lazily so ``framefuse --help`` does not import torch.
"""

from __future__ import annotations

from framefuse._lazy import lazy_getattr

_EXPORTS = {
    "export_model": "framefuse.exporter.export",
    "export_forms": "framefuse.exporter.export",
    "prepare_export": "framefuse.exporter.export",
    "write_artifacts": "framefuse.exporter.export",
    "has_step_form": "framefuse.exporter.export",
    "compare_outputs": "framefuse.exporter.export",
    "ExportResult": "framefuse.exporter.export",
    "FORMS": "framefuse.exporter.export",
    "ExportError": "framefuse.exporter.errors",
    "ModelLoadError": "framefuse.exporter.errors",
    "NoStepFormError": "framefuse.exporter.errors",
    "OutputDirError": "framefuse.exporter.errors",
    "ShapeError": "framefuse.exporter.errors",
    "UnsupportedOperatorError": "framefuse.exporter.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
