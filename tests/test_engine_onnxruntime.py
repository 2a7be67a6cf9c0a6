"""The ONNX Runtime engine on the CPU EP: run/step/reset through Session, the state ping-pong,
no allocation per step, copy=/check_finite, the engine.ort artifact (stale / foreign refusal), and
parity with the original graph through framefuse.parity.compare."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from framefuse.engines import onnxruntime as ort_engine
from framefuse.engines.artifact import ArtifactError, ForeignArtifactError, StaleArtifactError
from framefuse.engines.base import EngineBuildError
from framefuse.runtime.pipeline import prepare_cached
from framefuse.runtime.session import Session, SessionError

SMALL = {"model": {"embed": 32, "layers": 2}, "seq": 6, "seed": 0}
# Wide frames and outputs, so one array allocated per step is visible to tracemalloc.
WIDE = {"model": {"embed": 64, "layers": 1}, "seq": 4, "seed": 0, "in_features": 1024, "out_features": 1024}
TOL = 1e-5
STEP_ARCHS = ["min_gru", "lstm", "mamba", "attention", "xlstm"]


def _frames(shape, count, seed=0):
    return np.random.default_rng(seed).standard_normal((count, *shape)).astype(np.float32)


@pytest.mark.parametrize("arch", STEP_ARCHS)
def test_step_loop_equals_sequence_run(arch):
    forms = prepare_cached(arch, SMALL)
    seq = Session.load(forms["sequence"].onnx, engine="onnxruntime")
    step = Session.load(forms["step"].onnx, engine="onnxruntime")
    assert seq.engine_name == step.engine_name == "onnxruntime" and step.is_step_form
    x = _frames(seq.engine.input_specs["x"].shape, 1)[0]
    expected = seq.run(x)["y"]
    got = np.stack([step.step(x[:, t]).copy() for t in range(x.shape[1])], axis=1)
    np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)
    # reset() starts a new sequence, whichever of the two ping-pong buffers holds the state now.
    step.reset()
    assert step.frame_index == 0 and all(not v.any() for v in step.get_state().values())
    again = np.stack([step.step(x[:, t]).copy() for t in range(3)], axis=1)
    np.testing.assert_allclose(again, expected[:, :3], rtol=TOL, atol=TOL)


def test_state_ping_pong_uses_two_fixed_buffers_and_set_state():
    step = Session.load(prepare_cached("lstm", SMALL)["step"].onnx, engine="onnxruntime")
    binding = step._host_step
    frames = _frames(step.engine.input_specs["x"].shape, 6)
    y_buffer = binding.host_out["y"]
    pointers = {name: set() for name in step.state_inputs}
    for frame in frames[:5]:  # an odd number: the state ends in the second buffer
        assert step.step(frame) is y_buffer  # the session's output buffer, overwritten every step
        for name in step.state_inputs:
            pointers[name].add(binding.dev_in[name].data_ptr())
    assert all(len(p) == 2 for p in pointers.values()), "state buffers must alternate between two fixed buffers"
    # ONNX Runtime wrote y straight into the bound host buffer: same memory as the torch view.
    assert binding.host_out["y"].ctypes.data == binding.host_out_t["y"].data_ptr()
    saved = step.get_state()
    y1 = step.step(frames[5]).copy()
    step.set_state(saved)  # written into whichever buffer is current
    np.testing.assert_array_equal(step.step(frames[5]), y1)
    # run() evaluates from the given (or zero) state and leaves the session's state alone.
    before = step.get_state()
    step.run({"x": frames[0]})
    for name, value in step.get_state().items():
        np.testing.assert_array_equal(value, before[name])


def _peak_bytes_of_steps(session, frames) -> int:
    for frame in frames[:3]:
        session.step(frame)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for frame in frames:
            session.step(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base


def test_step_allocates_no_arrays():
    prepared = prepare_cached("min_gru", WIDE, rewrite=False)["step"]
    session = Session.load(prepared.onnx, engine="onnxruntime")
    frames = _frames(session.engine.input_specs["x"].shape, 40)
    out_bytes = session.engine.output_specs["y"].numpy_dtype.itemsize * int(
        np.prod(session.engine.output_specs["y"].shape)
    )
    assert out_bytes >= 4096
    peak = _peak_bytes_of_steps(session, frames)
    assert peak < out_bytes // 2, f"step() allocated {peak} bytes at peak (one output is {out_bytes})"
    # The measurement sees an allocation when there is one: copy=True allocates the output.
    copying = Session.load(prepared.onnx, engine="onnxruntime", copy=True)
    assert _peak_bytes_of_steps(copying, frames) >= out_bytes


def test_copy_returns_fresh_arrays():
    step = Session.load(prepare_cached("min_gru", SMALL)["step"].onnx, engine="onnxruntime")
    frames = _frames(step.engine.input_specs["x"].shape, 2)
    shared = step.step(frames[0])
    fresh = step.step(frames[0], copy=True)
    assert fresh is not shared and not np.shares_memory(fresh, shared)
    kept = fresh.copy()
    step.step(frames[1])
    np.testing.assert_array_equal(fresh, kept)  # the next step did not touch it
    always = Session.load(prepare_cached("min_gru", SMALL)["step"].onnx, engine="onnxruntime", copy=True)
    a, b = always.step(frames[0]), always.step(frames[0])
    assert a is not b and not np.shares_memory(a, b)


def _overflow_model() -> onnx.ModelProto:
    """next_state.h = state.h * x, y = x: a state that overflows while the output stays finite."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    h = helper.make_tensor_value_info("state.h", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    h2 = helper.make_tensor_value_info("next_state.h", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Mul", ["state.h", "x"], ["next_state.h"])]
    graph = helper.make_graph(nodes, "overflow", [x, h], [y, h2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_check_finite_names_the_tensor_and_the_frame():
    model = _overflow_model()
    quiet = Session.load(model, engine="onnxruntime", nonfinite="propagate")
    nan_frame = np.full((1, 4), np.nan, np.float32)
    assert np.isnan(quiet.step(nan_frame)).all()  # handed to the engine: nothing is checked
    session = Session.load(model, engine="onnxruntime", check_finite=True)
    session.set_state({"state.h": np.ones((1, 4), np.float32)})
    for _ in range(2):
        session.step(np.full((1, 4), 2.0, np.float32))
    with pytest.raises(SessionError, match=r"frame 2: frame input 'x' has 1 NaN/Inf value\(s\) of 4"):
        session.step(np.array([[1, np.inf, 1, 1]], np.float32))
    session.reset()
    session.set_state({"state.h": np.full((1, 4), 1e30, np.float32)})
    with pytest.raises(SessionError, match=r"frame 0: state 'state.h' has 4 NaN/Inf value\(s\).*reset\(\)"):
        session.step(np.full((1, 4), 1e30, np.float32))
    with pytest.raises(SessionError, match="input 'x' has"):
        session.run({"x": nan_frame})


def test_fused_graph_only_on_request():
    prepared = prepare_cached("min_gru", SMALL)["sequence"]
    with pytest.raises(EngineBuildError, match="framefuse nodes.*original model.onnx.*--fused"):
        ort_engine.build(prepared.fused)
    fused = ort_engine.build(prepared.fused, options={"fused": True})
    original = ort_engine.build(prepared.onnx)
    assert fused.summary()["graph"].startswith("fused") and original.summary()["graph"] == "original"
    x = _frames(original.input_specs["x"].shape, 1)[0]
    np.testing.assert_allclose(fused.run({"x": x})["y"], original.run({"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_unknown_option_and_missing_provider_are_clear():
    source = prepare_cached("min_gru", SMALL)["step"].onnx
    with pytest.raises(EngineBuildError, match="unknown option"):
        ort_engine.build(source, options={"threads": 2})
    with pytest.raises(EngineBuildError, match="no CUDAExecutionProvider.*onnxruntime-gpu"):
        ort_engine.build(source, options={"providers": ["CUDAExecutionProvider"]})


def test_artifact_build_load_stale_foreign(tmp_path):
    prepared = prepare_cached("mamba", SMALL)["step"]
    source = tmp_path / "model.onnx"
    source.write_bytes(prepared.onnx.read_bytes())
    built = ort_engine.build(source, out=tmp_path)
    target = tmp_path / "engine.ort"
    assert built.artifact_path == target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.ort", "model.onnx"], "temporary files left behind"
    metadata = json.loads(target.read_text())
    import hashlib

    import framefuse

    assert metadata["format"] == "framefuse-ort-engine" and metadata["engine"] == "onnxruntime"
    assert metadata["framefuse_version"] == framefuse.__version__ and metadata["precision"] == "fp32"
    assert metadata["source"]["relative_path"] == "model.onnx"
    assert metadata["source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert (
        metadata["providers"] == ["CPUExecutionProvider"] and metadata["session_options"]["intra_op_num_threads"] == 1
    )
    loaded = ort_engine.load(target)
    feeds = {n: _frames(s.shape, 1, seed=3)[0] for n, s in loaded.input_specs.items()}
    for name, value in loaded.run(feeds).items():
        np.testing.assert_array_equal(value, built.run(feeds)[name])
    # Session.load on the folder picks the artifact.
    assert Session.load(tmp_path, engine="onnxruntime").engine.artifact_path == target
    # Stale: the ONNX changed since the build.
    model = onnx.load(str(source))
    model.metadata_props.add(key="edited", value="1")
    onnx.save(model, str(source))
    with pytest.raises(StaleArtifactError, match="stale.*framefuse build .*--engine onnxruntime"):
        ort_engine.load(target)
    ort_engine.load(target, check_source=False)  # explicitly allowed
    # Foreign: another framefuse version; the CUDA EP where this onnxruntime has none.
    ort_engine.build(source, out=tmp_path)
    for change, pattern in (
        ({"framefuse_version": "0.0.1"}, "built by framefuse 0.0.1"),
        ({"format_version": 99}, "artifact format 99"),
        (
            {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]},
            "built for CUDAExecutionProvider.*onnxruntime-gpu",
        ),
    ):
        data = json.loads(target.read_text())
        data.update(change)
        target.write_text(json.dumps(data))
        with pytest.raises(ForeignArtifactError, match=pattern):
            ort_engine.load(target)
        ort_engine.build(source, out=tmp_path)
    # Not an artifact; the model gone.
    (tmp_path / "bad.ort").write_text("not json")
    with pytest.raises(ArtifactError, match="not a framefuse onnxruntime engine artifact"):
        ort_engine.load(tmp_path / "bad.ort")
    source.unlink()
    with pytest.raises(ArtifactError, match="is gone"):
        ort_engine.load(target)


def test_modelproto_build_saves_its_model(tmp_path):
    model = _overflow_model()
    runner = ort_engine.build(model, out=tmp_path / "sub")
    assert runner.source_path == tmp_path / "sub" / "engine.ort.onnx"
    assert onnx.load(str(runner.source_path)).graph.name == "overflow"
    loaded = ort_engine.load(tmp_path / "sub")
    assert loaded.input_names == ["x", "state.h"]


def test_parity_compare_accepts_the_runner():
    from framefuse.parity import compare

    prepared = prepare_cached("gated_ssm", SMALL)["step"]
    runner = ort_engine.build(prepared.onnx)
    report = compare(prepared.onnx, runner, tolerance=TOL)
    assert report.passed and {o.name for o in report.outputs} == {o["name"] for o in prepared.manifest["outputs"]}
