"""Files written whole or not at all: every stage writes its outputs through here."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _default_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give (0666 less the umask): mkstemp's 0600 would
    make rewrite and build outputs unreadable to others where export's are not."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(target: Path, write: Callable[[object], None]) -> Path:
    """Create ``target`` by calling ``write(binary_file)`` on a temporary file beside it, then
    ``os.replace``: readers see the old file or the whole new one, never a part, and a failure
    leaves no file behind."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            write(raw)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp_name, _default_mode())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return target


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_atomic(Path(path), lambda f: f.write(data))


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())
