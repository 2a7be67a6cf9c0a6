"""README "Adding an engine", followed literally (issue 22): one backend module (here, this file:
a toy engine that runs the original graph with ONNX's reference evaluator) and one EngineKind in
the registry, and the engine builds with `framefuse build`, steps under `Session.load`, and passes
`framefuse check`, with no other file touched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from framefuse.engines import registry
from framefuse.engines.base import EngineBuildError, EngineRunner, IOSpec, load_onnx
from framefuse.files import write_atomic

NAME = "toy"
ARTIFACT_NAME = "engine.toy"


def unavailable_reason(**kwargs) -> str | None:
    return None


class ToyRunner(EngineRunner):
    ENGINE = NAME
    DEVICE_FRAMES = False

    def __init__(self, source):
        super().__init__()
        model, path = load_onnx(source)
        self.evaluator = ReferenceEvaluator(model)
        self.device = torch.device("cpu")
        self.metadata = {}
        self.source_path = path
        self.runs = 0

        def specs(values) -> dict[str, IOSpec]:
            out = {}
            for value in values:
                tensor = value.type.tensor_type
                dims = tuple(d.dim_value for d in tensor.shape.dim)
                if tensor.elem_type != onnx.TensorProto.FLOAT or not all(dims):
                    raise EngineBuildError(f"toy engine: '{value.name}' is not a static float32 tensor")
                out[value.name] = IOSpec(value.name, dims, torch.float32)
            return out

        initializers = {i.name for i in model.graph.initializer}
        self._inputs = specs(v for v in model.graph.input if v.name not in initializers)
        self._outputs = specs(model.graph.output)

    @property
    def input_specs(self) -> dict[str, IOSpec]:
        return self._inputs

    @property
    def output_specs(self) -> dict[str, IOSpec]:
        return self._outputs

    def run(self, feeds):
        self.check_feeds(feeds)
        results = self.evaluator.run(None, {n: np.asarray(feeds[n], dtype=np.float32) for n in self.input_names})
        self.runs += 1
        return {name: np.asarray(value, dtype=np.float32) for name, value in zip(self.output_names, results)}

    def summary(self) -> dict:
        return {
            "engine": NAME,
            "source": str(self.source_path),
            "inputs": [s.describe() for s in self._inputs.values()],
            "outputs": [s.describe() for s in self._outputs.values()],
        }


def build(source, *, out=None, precision="fp32", device=None, options=None, log=None) -> ToyRunner:
    if options:
        raise EngineBuildError(f"toy engine: unknown option(s) {sorted(options)}")
    if precision != "fp32":
        raise EngineBuildError(f"toy engine: fp32 only, not {precision}")
    runner = ToyRunner(source)
    if out is not None:
        out = Path(out)
        target = out if out.suffix == ".toy" else out / ARTIFACT_NAME
        record = json.dumps({"source": str(Path(source).resolve())}).encode()
        write_atomic(target, lambda raw: raw.write(record))
        runner.artifact_path = target
    return runner


def load(artifact, *, device=None, check_source=True) -> ToyRunner:
    target = Path(artifact)
    runner = ToyRunner(json.loads(target.read_text())["source"])
    runner.artifact_path = target
    return runner


@pytest.fixture
def toy_engine(monkeypatch):
    kind = registry.EngineKind(
        NAME,
        __name__,
        ARTIFACT_NAME,
        "ONNX's reference evaluator over the original graph (a test of the engine contract)",
        "nothing: it ships with onnx",
        original_first=True,  # it cannot run framefuse nodes
    )
    monkeypatch.setitem(registry.ENGINES, NAME, kind)
    return kind


@pytest.fixture
def folder(tmp_path):
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached("min_gru", {"model": {"embed": 32, "layers": 2}, "seq": 6, "seed": 0})["step"]
    for name in ("model.onnx", "model.fused.onnx"):
        shutil.copy(prepared.onnx if name == "model.onnx" else prepared.fused, tmp_path / name)
    (tmp_path / "manifest.json").write_text(json.dumps(prepared.manifest))
    return tmp_path


def test_a_new_engine_builds_steps_and_checks_through_the_registry_alone(toy_engine, folder, capsys):
    from framefuse.cli import main
    from framefuse.runtime.session import Session

    assert main(["build", str(folder), "--engine", NAME]) == 0
    assert (folder / ARTIFACT_NAME).is_file()
    assert f"({NAME} engine of {folder / 'model.onnx'}" in capsys.readouterr().out  # the original graph first
    assert main(["build", str(folder), "--engine", NAME, "--select", "plan"]) == 2
    assert "--select is an option of the cuda-graph engine, not of toy" in capsys.readouterr().err

    toy = Session.load(folder, engine=NAME)
    assert toy.engine_name == NAME and isinstance(toy.engine, ToyRunner)
    reference = Session.load(folder / "model.onnx", engine="onnxruntime")
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((12, *toy.engine.input_specs["x"].shape)).astype(np.float32)
    for frame in frames:  # the state is handed on by the default binding, frame after frame
        np.testing.assert_allclose(toy.step(frame), reference.step(frame), rtol=1e-5, atol=1e-5)
    assert toy.replays == len(frames)
    toy.reset()
    reference.reset()
    np.testing.assert_allclose(toy.step(frames[0]), reference.step(frames[0]), rtol=1e-5, atol=1e-5)

    assert main(["check", str(folder), "--engine", NAME]) == 0
    assert "PASS" in capsys.readouterr().out
    assert (folder / f"parity-report.{NAME}.json").is_file()


def test_without_its_registry_entry_the_engine_does_not_exist(folder, capsys):
    from framefuse.cli import main

    assert main(["build", str(folder), "--engine", NAME]) == 2
    assert "invalid choice: 'toy'" in capsys.readouterr().err
