"""Shared helpers of engine artifacts: metadata, atomic writes, foreign/stale refusal.

Every backend writes one artifact file (``engine.ffe`` for cuda-graph, ``engine.ort`` for ONNX
Runtime, ``engine.plan`` for TensorRT) whose metadata records at least: format and format version,
framefuse version, engine, device, precision, and the source ONNX (absolute path, path relative to
the artifact, sha256). The backend modules own their file layouts; this module owns the rules
they share:

- writes are atomic (a temporary file in the same folder, fsync, then ``os.replace``), so a reader
  never sees half an artifact;
- a *foreign* artifact is refused: built by another framefuse version or artifact format, for
  another GPU architecture (compute capability), or for a GPU when there is none here;
- a *stale* artifact is refused: its source ONNX (found next to it or at the recorded path) has
  changed since the build (sha256 differs).

Each refusal says how to fix it (``framefuse build <source>``). This module imports no backend.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

import torch

import framefuse
from framefuse.engines.base import sha256_file
from framefuse.errors import FrameFuseError
from framefuse.files import write_atomic  # noqa: F401 - re-exported

# The cuda-graph artifact's format (kept here: its name is what old code imports).
FORMAT = "framefuse-engine"
FORMAT_VERSION = 1
ENGINE_KIND = "cuda-graph"
ARTIFACT_NAME = "engine.ffe"


class ArtifactError(FrameFuseError):
    """An engine artifact that cannot be read."""


class ForeignArtifactError(ArtifactError):
    """An artifact built by another framefuse version or for another GPU."""


class StaleArtifactError(ArtifactError):
    """An artifact whose source ONNX changed after it was built."""


def device_description(device: torch.device) -> dict:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return {
            "device": "cuda",
            "gpu_name": torch.cuda.get_device_name(device),
            "compute_capability": f"{major}.{minor}",
        }
    return {"device": "cpu", "gpu_name": None, "compute_capability": None}


def artifact_path(path, artifact_name: str = ARTIFACT_NAME) -> Path:
    """``path`` itself when it names a file with the artifact's suffix, else ``path/<artifact_name>``."""
    path = Path(path)
    if path.suffix == Path(artifact_name).suffix:
        return path
    return path / artifact_name


def source_info(source, target: Path) -> dict | None:
    """What an artifact records about its source ONNX (None when built from a ModelProto)."""
    if source is None:
        return None
    source = Path(source).resolve()
    try:
        relative = os.path.relpath(source, target.parent.resolve())
    except ValueError:  # another drive (Windows)
        relative = None
    return {"path": str(source), "relative_path": relative, "sha256": sha256_file(source)}


def common_metadata(
    *, fmt: str, format_version: int, engine: str, device: torch.device, precision: str, source, target: Path
) -> dict:
    """The metadata fields every artifact carries (a backend adds its own)."""
    return {
        "format": fmt,
        "format_version": format_version,
        "engine": engine,
        "framefuse_version": framefuse.__version__,
        "torch_version": torch.__version__,
        **device_description(device),
        "precision": precision,
        "source": source_info(source, target),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def check_compatible(
    metadata: dict,
    target: Path,
    device: torch.device | None = None,
    *,
    format_version: int = FORMAT_VERSION,
) -> None:
    """Raise ForeignArtifactError unless this process can use an artifact with ``metadata``
    (format, framefuse version, device type, GPU compute capability)."""
    check_version(metadata, target, format_version)
    rebuild = rebuild_hint(metadata, target)
    built_for = metadata.get("device")
    if device is None:
        device = torch.device("cuda") if built_for == "cuda" else torch.device("cpu")
    if built_for != device.type:
        raise ForeignArtifactError(
            f"{target}: built for {built_for} ({metadata.get('gpu_name') or 'no GPU'}), asked to run on "
            f"{device.type}; {rebuild}"
        )
    if built_for == "cuda":
        if not torch.cuda.is_available():
            raise ForeignArtifactError(
                f"{target}: built for the GPU {metadata.get('gpu_name')} (sm {metadata.get('compute_capability')}) "
                f"but there is no CUDA GPU here"
            )
        index = torch.cuda.current_device() if device.index is None else device.index
        here = device_description(torch.device("cuda", index))
        if here["compute_capability"] != metadata.get("compute_capability"):
            raise ForeignArtifactError(
                f"{target}: built for {metadata.get('gpu_name')} (compute capability "
                f"{metadata.get('compute_capability')}), this GPU is {here['gpu_name']} (compute capability "
                f"{here['compute_capability']}); {rebuild}"
            )


def check_version(metadata: dict, target: Path, format_version: int) -> None:
    """Raise ForeignArtifactError for another artifact format version or framefuse version."""
    rebuild = rebuild_hint(metadata, target)
    if metadata.get("format_version") != format_version:
        raise ForeignArtifactError(
            f"{target}: artifact format {metadata.get('format_version')} is not this framefuse's format "
            f"{format_version}; {rebuild}"
        )
    if metadata.get("framefuse_version") != framefuse.__version__:
        raise ForeignArtifactError(
            f"{target}: built by framefuse {metadata.get('framefuse_version')}, this is framefuse "
            f"{framefuse.__version__}; {rebuild}"
        )


def rebuild_hint(metadata: dict, target: Path) -> str:
    engine = metadata.get("engine")
    flag = f" --engine {engine}" if engine and engine != ENGINE_KIND else ""
    return f"rebuild it with `framefuse build {_source_hint(metadata, target)}{flag}`"


def _source_hint(metadata: dict, target: Path) -> str:
    source = metadata.get("source") or {}
    return source.get("path") or "<model.fused.onnx>"


def find_source(metadata: dict, target: Path) -> Path | None:
    """The recorded source ONNX: relative to the artifact first (the folder may have moved),
    then the absolute path; None when neither exists."""
    source = metadata.get("source") or {}
    candidates = []
    if source.get("relative_path"):
        candidates.append(target.parent / source["relative_path"])
    if source.get("path"):
        candidates.append(Path(source["path"]))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


def check_fresh(metadata: dict, target: Path) -> Path | None:
    """Raise StaleArtifactError when the source ONNX changed; returns the source found (or None)."""
    source = find_source(metadata, target)
    if source is None:
        return None
    recorded = (metadata.get("source") or {}).get("sha256")
    actual = sha256_file(source)
    engine = metadata.get("engine")
    flag = f" --engine {engine}" if engine and engine != ENGINE_KIND else ""
    if recorded != actual:
        raise StaleArtifactError(
            f"{target}: stale — its source {source} changed since the build (sha256 {actual[:12]}…, the "
            f"artifact was built from {str(recorded)[:12]}…); rebuild it with `framefuse build {source}{flag}`"
        )
    return source


__all__ = [
    "ArtifactError",
    "ForeignArtifactError",
    "StaleArtifactError",
    "artifact_path",
    "check_compatible",
    "check_fresh",
    "check_version",
    "rebuild_hint",
    "common_metadata",
    "device_description",
    "find_source",
    "source_info",
    "write_atomic",
]
