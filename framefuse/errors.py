"""Errors that framefuse reports to users as one clear line and a non-zero exit."""


class FrameFuseError(Exception):
    """A problem with the user's input or environment, reported without a traceback.

    The message must name what is wrong (file, node, shape, dtype) so the user can act on it.
    """

    exit_code = 2


class ParityError(FrameFuseError):
    """An artifact does not match its reference within tolerance."""

    exit_code = 3
