"""`framefuse build --check`: the built engine against ONNX Runtime on the original graph; a
mismatch removes the artifact (exit 3); an engine that cannot run here is reported as not checked."""

from __future__ import annotations

import argparse
import shutil

import pytest

from framefuse.build import cli
from framefuse.errors import ParityError


def _parse(*argv):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["build", *argv])


@pytest.fixture
def folder(tmp_path):
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached("min_gru", {"seq": 32, "seed": 0})["step"]
    shutil.copy(prepared.onnx, tmp_path / "model.onnx")
    shutil.copy(prepared.fused, tmp_path / "model.fused.onnx")
    return tmp_path


def test_check_passes_and_writes_the_report(folder, capsys):
    args = _parse(str(folder), "--engine", "cuda-graph", "--device", "cpu", "--check")
    assert args.func(args) == 0
    assert "parity PASS" in capsys.readouterr().err
    assert (folder / "engine.ffe").is_file() and (folder / "parity-report.cuda-graph.json").is_file()


def test_a_mismatch_removes_the_artifact(folder, monkeypatch):
    from framefuse.engines.base import EngineRunner

    real = EngineRunner.infer_impl

    def shifted(self, feed_dict):  # every output off by one: what a broken kernel would look like
        return {name: value + 1.0 for name, value in real(self, feed_dict).items()}

    monkeypatch.setattr(EngineRunner, "infer_impl", shifted)
    args = _parse(str(folder), "--engine", "cuda-graph", "--device", "cpu", "--check")
    with pytest.raises(ParityError, match="does not match"):
        args.func(args)
    assert not (folder / "engine.ffe").exists()


def test_tensorrt_plan_that_cannot_run_here_is_not_checked(folder, capsys):
    pytest.importorskip("tensorrt_rtx")
    from framefuse.engines.registry import unavailable_reason

    if unavailable_reason("tensorrt") is not None:
        pytest.skip(unavailable_reason("tensorrt"))
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the plan may run here")
    except ImportError:
        pass
    args = _parse(str(folder / "model.onnx"), "--engine", "tensorrt")  # the default for tensorrt: --check
    assert args.func(args) == 0
    err = capsys.readouterr().err
    assert "parity: NOT CHECKED here" in err and "framefuse check" in err
    assert (folder / "engine.plan").is_file()


def test_a_precision_build_without_an_output_is_refused_in_one_line(folder):
    """build_engine writes a precision build's converted graph and accuracy report, so it needs an
    output; in memory it refuses before converting anything (the folder is left as it was)."""
    from framefuse.build import build_engine
    from framefuse.engines.base import EngineBuildError

    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(EngineBuildError, match=r"^a fp16 build writes its converted graph .* \(out=\)$"):
        build_engine(folder, engine="cuda-graph", device="cpu", precision="fp16")
    assert sorted(p.name for p in folder.iterdir()) == before
