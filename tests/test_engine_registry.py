"""The engine registry: names, lazy backends, availability reasons, artifact lookup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from framefuse.engines import registry
from framefuse.engines.base import EngineBuildError, EngineRunner


def test_known_engines_and_artifact_names():
    assert list(registry.ENGINES) == ["cuda-graph", "onnxruntime", "tensorrt"]
    names = {k.name: k.artifact_name for k in registry.ENGINES.values()}
    assert names == {"cuda-graph": "engine.ffe", "onnxruntime": "engine.ort", "tensorrt": "engine.plan"}
    for name, kind in registry.ENGINES.items():
        assert kind.name == name and kind.module == f"framefuse.engines.{name.replace('-', '_')}"
        assert kind.summary


def test_unknown_engine_lists_the_names():
    with pytest.raises(EngineBuildError, match="unknown engine 'tvm'.*cuda-graph, onnxruntime, tensorrt"):
        registry.get_backend("tvm")
    with pytest.raises(EngineBuildError, match="unknown engine"):
        registry.unavailable_reason("tvm")


def test_backends_follow_the_contract():
    for name in ("cuda-graph", "onnxruntime"):
        module = registry.get_backend(name)
        assert module.NAME == name
        for attr in ("unavailable_reason", "build", "load"):
            assert callable(getattr(module, attr)), f"{name} lacks {attr}"
    # Both run on this machine: ONNX Runtime on its CPU EP, cuda-graph as the eager CPU executor.
    assert registry.unavailable_reason("onnxruntime") is None
    assert registry.unavailable_reason("cuda-graph", device="cpu") is None


def test_cuda_graph_on_cuda_without_a_gpu_says_why():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    reason = registry.unavailable_reason("cuda-graph", device="cuda")
    assert reason is not None and "no CUDA GPU" in reason and "\n" not in reason


def test_missing_backend_is_one_line_with_a_hint(monkeypatch):
    fake = registry.EngineKind("fake", "framefuse.engines.no_such_backend", "engine.fake", "a test double", "pip x")
    monkeypatch.setitem(registry.ENGINES, "fake", fake)
    reason = registry.unavailable_reason("fake")
    assert reason is not None and "not part of this framefuse version" in reason and "\n" not in reason
    with pytest.raises(EngineBuildError, match="not part of this framefuse version"):
        registry.get_backend("fake")


def test_backend_for_artifact(tmp_path):
    assert registry.backend_for_artifact(tmp_path / "x" / "engine.ort").name == "onnxruntime"
    assert registry.backend_for_artifact(tmp_path / "mine.plan").name == "tensorrt"
    assert registry.backend_for_artifact(tmp_path / "engine.ffe").name == "cuda-graph"
    with pytest.raises(EngineBuildError, match="no engine artifact in this folder"):
        registry.backend_for_artifact(tmp_path)
    (tmp_path / "engine.ort").write_text("{}")
    assert registry.backend_for_artifact(tmp_path).name == "onnxruntime"
    (tmp_path / "engine.ffe").write_bytes(b"")
    assert [k.name for k, _ in registry.artifacts_in(tmp_path)] == ["cuda-graph", "onnxruntime"]
    assert registry.backend_for_artifact(tmp_path).name == "cuda-graph"
    with pytest.raises(EngineBuildError, match="not an engine artifact"):
        registry.backend_for_artifact(tmp_path / "model.onnx")


def test_runners_derive_from_engine_runner():
    from framefuse.engines.cuda_graph import CudaGraphEngine
    from framefuse.engines.onnxruntime import OnnxRuntimeRunner

    assert issubclass(CudaGraphEngine, EngineRunner) and issubclass(OnnxRuntimeRunner, EngineRunner)
    assert CudaGraphEngine.ENGINE == "cuda-graph" and OnnxRuntimeRunner.ENGINE == "onnxruntime"


def test_registry_and_artifact_import_no_backend():
    # The cycle artifact <-> cuda_graph is gone, and listing engines imports no backend or torch.
    code = (
        "import sys; import framefuse.engines.registry as r; r.ENGINES;"
        "assert 'torch' not in sys.modules, 'registry imported torch';"
        "import framefuse.engines.artifact;"
        "assert 'framefuse.engines.cuda_graph' not in sys.modules, 'artifact imported cuda_graph'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_kind_declares_what_the_stages_above_ask_of_it():
    """The build, the artifact folder and Session.load ask the engine kind, not its name (issue
    22): the build options it takes (the backends validate against the same tuple), which graph of
    a folder it builds first, the precisions it refuses, whether its build is checked by default."""
    from framefuse.engines import onnxruntime as ort_engine
    from framefuse.engines import tensorrt as trt_engine
    from framefuse.precision.convert import unsupported_reason

    kinds = registry.ENGINES
    assert set(kinds["onnxruntime"].options) == set(ort_engine.DEFAULT_OPTIONS)
    assert trt_engine.OPTIONS == kinds["tensorrt"].options
    with pytest.raises(EngineBuildError, match=r"unknown option\(s\) \['providers'\]"):
        registry.get_backend("cuda-graph").build("unused.onnx", device="cpu", options={"providers": ["x"]})
    assert [k.name for k in kinds.values() if k.original_first] == ["onnxruntime"]
    assert registry.FUSED_ANYWHERE == "cuda-graph"
    assert [k.name for k in kinds.values() if k.checked_by_default] == ["tensorrt"]
    assert "cannot run bf16" in unsupported_reason("onnxruntime", "bf16")
    assert unsupported_reason("cuda-graph", "bf16") is None and unsupported_reason("onnxruntime", "fp16") is None
    registry.check_option("cuda-graph", "select", "--select")
    with pytest.raises(EngineBuildError, match="^--select is an option of the cuda-graph engine, not of onnxruntime$"):
        registry.check_option("onnxruntime", "select", "--select")
    with pytest.raises(ValueError, match="^--fused is an option of the onnxruntime engine, not of tensorrt$"):
        registry.check_option("tensorrt", "fused", "--fused", error=ValueError)


def test_the_build_stage_is_what_session_load_and_the_command_call(tmp_path, monkeypatch):
    """Session.load of an ONNX graph and `framefuse build` both go through
    framefuse.build.stage.build_engine (one place for what a build does above a backend)."""
    import argparse
    import shutil

    from framefuse.build import cli as build_cli
    from framefuse.build import stage
    from framefuse.runtime import session as session_module
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached("min_gru", {"seq": 32, "seed": 0})["step"]
    shutil.copy(prepared.onnx, tmp_path / "model.onnx")
    shutil.copy(prepared.fused, tmp_path / "model.fused.onnx")
    calls = []
    real = stage.build_engine

    def spy(source, **kwargs):
        calls.append((source, kwargs.get("engine"), kwargs.get("out")))
        return real(source, **kwargs)

    monkeypatch.setattr(stage, "build_engine", spy)
    monkeypatch.setattr(session_module, "build_engine", spy)
    session = session_module.Session.load(tmp_path / "model.onnx", engine="onnxruntime")
    assert session.engine_name == "onnxruntime"
    assert calls == [(tmp_path / "model.onnx", "onnxruntime", None)]
    parser = argparse.ArgumentParser()
    build_cli.register(parser.add_subparsers())
    args = parser.parse_args(["build", str(tmp_path), "--engine", "onnxruntime"])
    assert args.func(args) == 0
    assert calls[1] == (str(tmp_path), "onnxruntime", tmp_path) and (tmp_path / "engine.ort").is_file()
