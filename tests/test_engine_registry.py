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
