"""The artifact folder, in one place: which file each stage takes from a folder (or a path).

``framefuse export`` writes ``model.onnx`` and ``manifest.json``, ``framefuse rewrite``
``model.fused.onnx``, ``framefuse build`` an engine artifact beside them (``engine.ffe``,
``engine.ort``, ``engine.plan``; see :mod:`framefuse.engines.registry`). Three stages read that
layout: the build (:func:`build_source`), ``Session.load`` (:func:`load_target`) and ``framefuse
check`` (:func:`check_targets`); the manifest's tolerance table is :func:`manifest_tolerance`.
Each raises the error class its caller reports (``error=``), so a user sees the same one line as
before. Nothing here imports torch or a backend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from framefuse.engines.registry import ENGINES, FUSED_ANYWHERE, artifact_kind, artifacts_in, default_engine, get_kind
from framefuse.errors import FrameFuseError, read_onnx

ORIGINAL = "model.onnx"
FUSED = "model.fused.onnx"
MANIFEST = "manifest.json"


def has_framefuse_nodes(path: Path, error: type[FrameFuseError] = FrameFuseError) -> bool:
    model = read_onnx(path, load_external_data=False, error=error)
    return any(node.domain == "framefuse" for node in model.graph.node)


def manifest_tolerance(model: Path):
    """The config tolerance table of the artifact (manifest.json beside ``model``), or None."""
    manifest = Path(model).parent / MANIFEST
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        raise FrameFuseError(f"cannot read {manifest}: {exc}") from exc
    tol = (data.get("config") or {}).get("tolerance")
    if tol is None:
        tol = (data.get("parity") or {}).get("tolerance")
    return tol


def build_source(source, engine: str = FUSED_ANYWHERE, fused: bool = False, *, error=FrameFuseError) -> Path:
    """The ONNX file to build: a file as given; in a folder, the original model.onnx for an engine
    that builds it first (ONNX Runtime; model.fused.onnx with ``fused``), model.fused.onnx first for
    the others."""
    path = Path(source)
    if path.is_dir():
        if get_kind(engine).original_first:
            names = (FUSED,) if fused else (ORIGINAL,)
        else:
            names = (FUSED, ORIGINAL)
        for name in names:
            if (path / name).is_file():
                return path / name
        hint = "run `framefuse rewrite` first" if FUSED in names else "run `framefuse export` first"
        raise error(f"{path}: no {' or '.join(names)} in this folder ({hint})")
    if not path.is_file():
        raise error(f"{path}: no such file or folder")
    return path


@dataclass
class Resolved:
    """What ``Session.load`` loads: an artifact of ``engine``, or an ONNX file it builds in memory."""

    engine: str
    kind: str  # "artifact" | "onnx"
    file: Path
    manifest: Path | None


def load_target(
    path, engine: str | None = None, device=None, fused: bool | None = None, *, error=FrameFuseError
) -> Resolved:
    """What ``Session.load`` would load for ``path`` (a folder, an engine artifact or an .onnx file).

    A folder: with no ``engine``, the artifact of the default engine if built, else any other
    artifact present, else the default engine over the folder's ONNX; with an ``engine``, its
    artifact if built, else its ONNX. ONNX Runtime runs the original ``model.onnx`` (the fused
    graph only with ``fused=True``); the cuda-graph and TensorRT engines take ``model.fused.onnx``
    first. Without a GPU the default is ONNX Runtime, except for a graph that exists only fused
    (a named ``*.fused.onnx``, a folder without ``model.onnx``): that one runs on the cuda-graph
    engine's CPU executor, which runs framefuse nodes through their torch references natively.
    """
    if engine is not None:
        get_kind(engine)  # an unknown name is an error here, not after a build
    path = Path(path)
    if path.is_dir():
        manifest = path / MANIFEST
        manifest = manifest if manifest.is_file() else None
        present = artifacts_in(path)
        chosen = engine or default_engine(device)
        for kind, file in present:
            if kind.name == chosen:
                return Resolved(kind.name, "artifact", file, manifest)
        if engine is None and present:
            kind, file = present[0]
            return Resolved(kind.name, "artifact", file, manifest)
        original, fused_file = path / ORIGINAL, path / FUSED
        if get_kind(chosen).original_first:
            if fused and fused_file.is_file():
                return Resolved(chosen, "onnx", fused_file, manifest)
            if original.is_file() and not fused:
                return Resolved(chosen, "onnx", original, manifest)
            if engine is None and fused_file.is_file():
                return Resolved(FUSED_ANYWHERE, "onnx", fused_file, manifest)
        else:
            for file in (fused_file, original):
                if file.is_file():
                    return Resolved(chosen, "onnx", file, manifest)
        artifacts = ", ".join(k.artifact_name for k in ENGINES.values())
        wanted = FUSED if fused else ORIGINAL if get_kind(chosen).original_first else f"{FUSED} or {ORIGINAL}"
        raise error(f"{path}: no engine artifact ({artifacts}) and no {wanted} in this folder")
    if not path.exists():
        raise error(f"{path}: no such file or folder")
    manifest = path.parent / MANIFEST
    manifest = manifest if manifest.is_file() else None
    kind = artifact_kind(path)
    if kind is not None:
        if engine is not None and engine != kind.name:
            raise error(
                f"{path} is a {kind.name} artifact, not {engine}: build one with "
                f"`framefuse build {path.parent} --engine {engine}`"
            )
        return Resolved(kind.name, "artifact", path, manifest)
    if path.suffix == ".onnx":
        chosen = engine or default_engine(device)
        if engine is None and get_kind(chosen).original_first and not fused and has_framefuse_nodes(path, error):
            chosen = FUSED_ANYWHERE
        return Resolved(chosen, "onnx", path, manifest)
    suffixes = ", ".join(k.suffix for k in ENGINES.values())
    raise error(f"{path}: expected an artifact folder, an engine artifact ({suffixes}) or an .onnx file")


def check_targets(path, engine: str | None, *, error=FrameFuseError) -> list[tuple[str, Path]]:
    """What ``framefuse check`` compares with the original graph: ("onnx", fused graph) and/or
    (engine name, artifact)."""
    path = Path(path)
    if path.is_dir():
        if engine is not None:
            kind = get_kind(engine)
            artifact = path / kind.artifact_name
            if not artifact.is_file():
                raise error(
                    f"{path}: no {kind.artifact_name} (build it with `framefuse build {path} --engine {engine}`)"
                )
            return [(engine, artifact)]
        found: list[tuple[str, Path]] = []
        if (path / FUSED).is_file():
            found.append(("onnx", path / FUSED))
        found += [(kind.name, file) for kind, file in artifacts_in(path)]
        if not found:
            raise error(
                f"fused graph not found: {path / FUSED}, and no engine artifact in "
                f"{path} (run `framefuse rewrite` or `framefuse build` first)"
            )
        return found
    if not path.is_file():
        raise error(f"{path}: no such file or folder")
    kind = artifact_kind(path)
    if kind is not None:
        if engine is not None and engine != kind.name:
            raise error(f"{path} is a {kind.name} artifact, not {engine}")
        return [(kind.name, path)]
    if path.suffix != ".onnx":
        raise error(f"{path}: not an ONNX graph or an engine artifact (.ffe, .ort, .plan)")
    read_onnx(path, load_external_data=False, error=error)  # a broken file is named as broken, before anything else
    return [("onnx", path)]
