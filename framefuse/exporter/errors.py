"""Errors of the export stage (each is a FrameFuseError: one line, non-zero exit)."""

from framefuse.errors import FrameFuseError, ParityError


class ExportError(FrameFuseError):
    """The model could not be exported (the message says what to change)."""


class ModelLoadError(ExportError):
    """A model could not be found or built: unknown architecture, bad file, bad factory."""


class ShapeError(ExportError):
    """The model's forward (or step) failed on an input of the configured shape."""


class UnsupportedOperatorError(ExportError):
    """torch.onnx cannot express an operator of the model at the requested opset."""


class NoStepFormError(ExportError):
    """The step form was asked for a model without ``step`` / ``init_state`` / ``state_names``."""


class OutputDirError(ExportError):
    """The artifacts folder cannot be created or written."""


__all__ = [
    "ExportError",
    "ModelLoadError",
    "NoStepFormError",
    "OutputDirError",
    "ParityError",
    "ShapeError",
    "UnsupportedOperatorError",
]
