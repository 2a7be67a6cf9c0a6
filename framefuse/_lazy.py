"""Lazy package exports: `import framefuse.engines` stays cheap (no torch/onnx import) until a
name is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` that imports ``exports[name]`` on first use of ``name``."""

    def __getattr__(name: str):
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module '{package}' has no attribute '{name}'")

    return __getattr__
