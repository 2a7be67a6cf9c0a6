"""Errors that framefuse reports to users as one clear line and a non-zero exit."""


class FrameFuseError(Exception):
    """A problem with the user's input or environment, reported without a traceback.

    The message must name what is wrong (file, node, shape, dtype) so the user can act on it.
    """

    exit_code = 2


def read_onnx(path, *, load_external_data: bool = True, error: type[FrameFuseError] = FrameFuseError):
    """An ONNX file read with the errors a user can act on: a missing file, or one that does not
    parse (truncated, random bytes, another format), named in one line as ``error``."""
    from pathlib import Path

    import onnx

    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such ONNX file")
    try:
        return onnx.load(str(path), load_external_data=load_external_data)
    except Exception as exc:  # DecodeError, a missing external-data file, ...
        raise error(f"{path}: not a readable ONNX model ({type(exc).__name__}: {_first_line(exc)})") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ParityError(FrameFuseError):
    """An artifact does not match its reference within tolerance."""

    exit_code = 3
