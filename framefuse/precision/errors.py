"""Errors of the precision stage, each reported as one line and a non-zero exit."""

from __future__ import annotations

from framefuse.errors import FrameFuseError, ParityError


class PrecisionError(FrameFuseError):
    """A precision that is unknown, or that a graph or engine cannot be built in."""


class CalibrationError(FrameFuseError):
    """A calibration file (or array set) that does not fit the graph: names, shapes, dtypes, NaN/Inf,
    no frames."""


class AccuracyError(ParityError):
    """A converted graph is outside the configured tolerance of its fp32 reference. ``report`` and
    ``model``: the accuracy report and the converted graph that failed (None when not at hand)."""

    def __init__(self, message: str, *, report=None, model=None):
        super().__init__(message)
        self.report = report
        self.model = model
