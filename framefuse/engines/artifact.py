"""The engine artifact ``engine.ffe``: a zip holding the planned graph and its metadata.

    engine.ffe (zip, stored)
      graph.onnx      the graph as the engine runs it: static input shapes, every shape
                      computation folded into initializers, weights inside
      metadata.json   format, framefuse version, engine, device, GPU name and compute capability,
                      torch version, source ONNX path and sha256, inputs/outputs, op counts

It is written atomically (a temporary file in the same folder, then ``os.replace``), so a reader
never sees half an artifact. Loading refuses, with a message that says how to fix it:
- a *foreign* artifact: built by another framefuse version, for another GPU architecture
  (compute capability), or for a GPU when there is none here;
- a *stale* artifact: its source ONNX (found next to it or at the recorded path) has changed
  since the build (sha256 differs).
A different torch version is recorded but not refused: the graph is torch-independent.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
import zipfile
from pathlib import Path

import onnx
import torch

import framefuse
from framefuse.errors import FrameFuseError

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


def artifact_path(path) -> Path:
    """``path`` itself when it names a file (``*.ffe``), else ``path/engine.ffe``."""
    path = Path(path)
    if path.suffix == ".ffe":
        return path
    return path / ARTIFACT_NAME


def save_engine(engine, path, *, source: Path | None = None) -> Path:
    """Write ``engine`` as an artifact at ``path`` (a ``.ffe`` file, or a folder that gets
    ``engine.ffe``); returns the file written."""
    from framefuse.engines.cuda_graph import sha256_file

    target = artifact_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    model = engine.executor.folded_model(engine.default_shapes)
    graph_bytes = model.SerializeToString()
    source_info = None
    if source is not None:
        source = Path(source).resolve()
        try:
            relative = os.path.relpath(source, target.parent.resolve())
        except ValueError:  # another drive (Windows)
            relative = None
        source_info = {"path": str(source), "relative_path": relative, "sha256": sha256_file(source)}
    summary = engine.summary()
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "engine": ENGINE_KIND,
        "framefuse_version": framefuse.__version__,
        "torch_version": torch.__version__,
        **device_description(engine.device),
        "framefuse_impl": engine.framefuse_impl,
        "precision": "fp32",
        "source": source_info,
        "inputs": summary["inputs"],
        "outputs": summary["outputs"],
        "nodes": summary["nodes"],
        "folded_nodes": summary["folded"],
        "ops": summary["ops"],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "extra": dict(engine.metadata),
    }
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr("metadata.json", json.dumps(metadata, indent=2, sort_keys=True))
            zf.writestr("graph.onnx", graph_bytes)
        with open(tmp_name, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return target


def read_artifact(path) -> tuple[dict, onnx.ModelProto]:
    """(metadata, graph) of an artifact, without any compatibility check."""
    target = artifact_path(path)
    if not target.is_file():
        raise ArtifactError(f"{target}: no engine artifact (build one with `framefuse build <model.fused.onnx>`)")
    try:
        with zipfile.ZipFile(target) as zf:
            metadata = json.loads(zf.read("metadata.json"))
            graph = onnx.load_from_string(zf.read("graph.onnx"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{target}: not a framefuse engine artifact ({type(exc).__name__}: {exc})") from exc
    if metadata.get("format") != FORMAT:
        raise ArtifactError(f"{target}: not a framefuse engine artifact (format {metadata.get('format')!r})")
    return metadata, graph


def check_compatible(metadata: dict, target: Path, device: torch.device | None = None) -> None:
    """Raise ForeignArtifactError unless this process can use an artifact with ``metadata``."""
    rebuild = f"rebuild it with `framefuse build {_source_hint(metadata, target)}`"
    if metadata.get("format_version") != FORMAT_VERSION:
        raise ForeignArtifactError(
            f"{target}: artifact format {metadata.get('format_version')} is not this framefuse's format "
            f"{FORMAT_VERSION}; {rebuild}"
        )
    if metadata.get("framefuse_version") != framefuse.__version__:
        raise ForeignArtifactError(
            f"{target}: built by framefuse {metadata.get('framefuse_version')}, this is framefuse "
            f"{framefuse.__version__}; {rebuild}"
        )
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
        here = device_description(torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index))
        if here["compute_capability"] != metadata.get("compute_capability"):
            raise ForeignArtifactError(
                f"{target}: built for {metadata.get('gpu_name')} (compute capability "
                f"{metadata.get('compute_capability')}), this GPU is {here['gpu_name']} (compute capability "
                f"{here['compute_capability']}); {rebuild}"
            )


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
    from framefuse.engines.cuda_graph import sha256_file

    source = find_source(metadata, target)
    if source is None:
        return None
    recorded = (metadata.get("source") or {}).get("sha256")
    actual = sha256_file(source)
    if recorded != actual:
        raise StaleArtifactError(
            f"{target}: stale — its source {source} changed since the build (sha256 {actual[:12]}…, the "
            f"artifact was built from {str(recorded)[:12]}…); rebuild it with `framefuse build {source}`"
        )
    return source


def load_engine(path, *, device: str | torch.device | None = None, check_source: bool = True):
    """Load an engine artifact after checking it is neither foreign nor stale."""
    from framefuse.engines.cuda_graph import CudaGraphEngine

    target = artifact_path(path)
    metadata, graph = read_artifact(target)
    device = torch.device(device) if device is not None else None
    check_compatible(metadata, target, device)
    source = check_fresh(metadata, target) if check_source else find_source(metadata, target)
    engine = CudaGraphEngine(
        graph,
        device=device if device is not None else metadata["device"],
        framefuse_impl=metadata.get("framefuse_impl"),
        metadata=metadata.get("extra") or {},
    )
    engine.artifact_metadata = metadata
    engine.source_path = source
    engine.artifact_path = target
    return engine
