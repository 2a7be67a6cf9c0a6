"""Reference parity: run original and fused graphs in ONNX Runtime (framefuse nodes through their
reference implementations) and compare them with Polygraphy."""

from framefuse.parity.compare import DEFAULT_TOLERANCE, OutputParity, ParityReport, compare, tolerance_for
from framefuse.parity.runners import OnnxReferenceRunner
from framefuse.plugins.ort_bridge import ParitySetupError, ort_session, prepare_for_ort

__all__ = [
    "DEFAULT_TOLERANCE",
    "OnnxReferenceRunner",
    "OutputParity",
    "ParityReport",
    "ParitySetupError",
    "compare",
    "ort_session",
    "prepare_for_ort",
    "tolerance_for",
]
