"""One NaN/Inf policy for frames on every engine: a non-finite frame is refused before the engine
runs (the state and the frame index stay as they were), unless the session asks to propagate it.

Without the policy the engines disagree: on a NaN frame ONNX Runtime's LSTM op zeroes its next
state while the cuda-graph engine carries the NaN into every later frame."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from framefuse.runtime.pipeline import prepare_cached
from framefuse.runtime.session import Session, SessionError

SMALL = {"model": {"embed": 32, "layers": 1}, "seq": 4, "seed": 0}
ENGINES = ["onnxruntime", "cuda-graph"]  # every engine that runs on this machine's CPU


def _session(engine: str, **kwargs) -> Session:
    prepared = prepare_cached("lstm", SMALL)["step"]
    source = prepared.onnx if engine == "onnxruntime" else prepared.fused
    return Session.load(source, engine=engine, device="cpu", **kwargs)


def _state(session) -> dict:
    return {k: np.array(v.cpu() if hasattr(v, "cpu") else v, copy=True) for k, v in session.get_state().items()}


def _frames(session, count=3):
    shape = session.engine.input_specs["x"].shape
    return np.random.default_rng(0).standard_normal((count, *shape)).astype(np.float32)


def _bad(frame, value, where):
    bad = frame.copy()
    bad.reshape(-1)[0 if where == "first" else -1] = value
    return bad


def _as_kind(frame, kind):
    if kind == "float64":
        return frame.astype(np.float64)
    if kind == "torch":
        return torch.from_numpy(frame.copy())
    if kind == "dict":
        return {"x": frame}
    return frame


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("kind", ["float32", "float64", "torch", "dict"])
def test_a_nonfinite_frame_is_refused_and_the_state_kept(engine, value, where, kind):
    session = _session(engine)
    clean = _session(engine)
    frames = _frames(session)
    for s in (session, clean):
        s.step(frames[0])
    before = _state(session)
    count = session.stats.summary()["count"]
    with pytest.raises(SessionError) as caught:
        session.step(_as_kind(_bad(frames[1], value, where), kind))
    message = str(caught.value)
    assert message.startswith("frame 1: frame input 'x' has 1 NaN/Inf value(s) of ")
    assert "not run: the state is unchanged" in message and 'nonfinite="propagate"' in message
    assert "\n" not in message
    assert session.frame_index == 1 and session.stats.summary()["count"] == count
    for name, value_before in _state(session).items():
        np.testing.assert_array_equal(value_before, before[name], err_msg=name)
    # the next finite frame goes on as if the bad one had never come
    np.testing.assert_array_equal(session.step(frames[2]), clean.step(frames[2]))


@pytest.mark.parametrize("engine", ENGINES)
def test_propagate_hands_the_frame_to_the_engine(engine):
    session = _session(engine, nonfinite="propagate")
    frames = _frames(session)
    session.step(frames[0])
    y = session.step(_bad(frames[1], np.nan, "first"))
    assert np.isnan(y).any()  # the engine ran it: what the state becomes is the engine's
    assert session.frame_index == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_run_refuses_inputs_holding_nan(engine):
    prepared = prepare_cached("lstm", SMALL)["sequence"]
    source = prepared.onnx if engine == "onnxruntime" else prepared.fused
    session = Session.load(source, engine=engine, device="cpu")
    x = np.random.default_rng(1).standard_normal(session.engine.input_specs["x"].shape).astype(np.float32)
    session.run(x)
    x[0, -1, 0] = np.nan
    with pytest.raises(SessionError, match=r"input 'x' has 1 NaN/Inf value\(s\) of \d+ \(not run; "):
        session.run(x)
    relaxed = Session.load(source, engine=engine, device="cpu", nonfinite="propagate")
    assert np.isnan(relaxed.run(x)["y"]).any()


def test_an_unknown_policy_is_refused():
    with pytest.raises(SessionError, match=r"nonfinite='zero': use one of raise, propagate"):
        _session("onnxruntime", nonfinite="zero")


def test_the_frame_check_reads_the_buffer_the_engine_reads():
    """The check's flat view shares the binding's input buffer (no copy a frame)."""
    session = _session("onnxruntime")
    frame = _frames(session)[0]
    session.step(frame)
    buffer = session._host_step.host_in["x"]
    flat, zeros, _ = session._finite_probe[id(buffer)]
    assert np.shares_memory(flat, buffer) and not zeros.any()
    buffer[...] = np.nan  # what the engine would read is what the check reads
    assert np.dot(flat, zeros) != np.dot(flat, zeros)


@pytest.mark.parametrize("engine", ["onnxruntime", "cuda-graph"])
def test_host_path_is_named_only_for_the_step_kernel(engine):
    """Session.host_path says how step() launches and waits on the step kernel; the CPU engines
    have no such path (None), and their frames still step."""
    session = _session(engine)
    assert session.host_path is None
    session.step(np.zeros(session.engine.input_specs["x"].shape, dtype=np.float32))
    assert session.host_path is None
