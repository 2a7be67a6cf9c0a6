"""Full TensorRT on a GPU: fused graphs (framefuse plugins) and unfused graphs built into plans,
run through Session, compared with ONNX Runtime on the unfused graph. Skipped without the
``tensorrt`` package and a GPU (NOT run in this project so far: see framefuse/engines/TENSORRT.md)."""

from __future__ import annotations

import numpy as np
import pytest

from framefuse.runtime.pipeline import prepare_cached

pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu]

SMALL = {"model": {"embed": 64, "layers": 1}, "seq": 8, "seed": 0}
ARCHS = ["lstm", "gru", "min_gru", "mamba", "attention", "xlstm", "delta_net", "liquid"]
TOL = 2e-4


def _frames(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("graph", ["onnx", "fused"])
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_matches_onnxruntime(arch, graph, tmp_path):
    from framefuse.engines import tensorrt as fft
    from framefuse.runtime.session import Session

    forms = prepare_cached(arch, SMALL)
    source = getattr(forms["sequence"], graph)
    if source is None:
        pytest.skip(f"{arch}: no fused graph ({forms['sequence'].fused_error})")
    runner = fft.build(source, out=tmp_path)
    assert runner.metadata["flavour"] == "tensorrt"
    expected_ops = forms["sequence"].fused_ops if graph == "fused" else []
    assert sorted(runner.metadata["plugins"]) == sorted(set(expected_ops))
    reference = Session.load(forms["sequence"].onnx, engine="onnxruntime")
    x = _frames(reference.engine.input_specs["x"].shape)
    want = reference.run(x)["y"]
    got = Session.load(tmp_path, engine="tensorrt").run(x)["y"]
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("arch", ["lstm", "mamba"])
def test_step_plan_keeps_state_on_the_gpu(arch, tmp_path):
    from framefuse.engines import tensorrt as fft
    from framefuse.runtime.session import Session

    forms = prepare_cached(arch, SMALL)
    fft.build(forms["step"].fused or forms["step"].onnx, out=tmp_path)
    step = Session.load(tmp_path, engine="tensorrt")
    seq = Session.load(forms["sequence"].onnx, engine="onnxruntime")
    x = _frames(seq.engine.input_specs["x"].shape)
    want = seq.run(x)["y"]
    got = np.stack([step.step(x[:, t]).copy() for t in range(x.shape[1])], axis=1)
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    step.reset()
    again = np.stack([step.step(x[:, t]).copy() for t in range(3)], axis=1)
    np.testing.assert_allclose(again, want[:, :3], rtol=TOL, atol=TOL)
