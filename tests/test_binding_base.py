"""engines.base.BindingBase: every binding checks its names, the state hand-off and the caller's
input buffers the same way, in one place (issue 22: one backend contract). Run here over the CPU
bindings (ONNX Runtime's, the cuda-graph engine's CPU executor, the default HostBinding); the GPU
bindings (the cuda-graph engine's, the step kernel's, TensorRT's) derive from the same class."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from framefuse.engines import cuda_graph, onnxruntime
from framefuse.engines.base import BindingBase, EngineBuildError, EngineRunError, EngineRunner, HostBinding

STATES = {"next_state.l0_h": "state.l0_h", "next_state.l1_h": "state.l1_h"}


@pytest.fixture(scope="module")
def prepared():
    from framefuse.runtime.pipeline import prepare_cached

    return prepare_cached("min_gru", {"model": {"embed": 32, "layers": 2}, "seq": 6, "seed": 0})["step"]


def _ort(prepared):
    return onnxruntime.build(prepared.onnx)


class PlainRunner(EngineRunner):
    """A runner with only ``run`` (ONNX Runtime's, borrowed): ``create_binding`` is the default."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.device = torch.device("cpu")

    @property
    def input_specs(self):
        return self.inner.input_specs

    @property
    def output_specs(self):
        return self.inner.output_specs

    def run(self, feeds):
        return self.inner.run(feeds)


MAKERS = {
    "onnxruntime": lambda p, **kw: _ort(p).create_binding(**kw),
    "cuda-graph (cpu)": lambda p, **kw: cuda_graph.build(p.fused, device="cpu").create_binding(**kw),
    "host": lambda p, **kw: PlainRunner(_ort(p)).create_binding(**kw),
}


def _make(kind, prepared, **overrides):
    args = {"host_inputs": ["x"], "host_outputs": ["y"], "state_pairs": dict(STATES), "input_buffers": None}
    args.update(overrides)
    return MAKERS[kind](prepared, **args)


@pytest.mark.parametrize("kind", MAKERS)
def test_the_callers_state_buffers_are_used_and_stepped(kind, prepared):
    state = {name: torch.zeros(1, 32) for name in STATES.values()}
    binding = _make(kind, prepared, input_buffers=state)
    assert isinstance(binding, BindingBase)
    assert isinstance(binding, HostBinding) == (kind == "host")
    assert all(binding.dev_in[name] is buffer for name, buffer in state.items())  # no copy made
    reference = _make("onnxruntime", prepared)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    for _ in range(3):
        for b in (binding, reference):
            b.host_in["x"][...] = x
            b.launch()
            b.sync()
        np.testing.assert_allclose(binding.host_out["y"], reference.host_out["y"], rtol=1e-5, atol=1e-6)
    assert binding.replays == 3 or kind == "cuda-graph (cpu)"  # the CPU executor runs eagerly
    current = binding.output("next_state.l0_h") if hasattr(binding, "output") else binding.dev_in["state.l0_h"]
    assert float(current.abs().sum()) > 0  # the state moved on from zeros


@pytest.mark.parametrize("kind", MAKERS)
def test_a_buffer_of_the_wrong_shape_is_refused_naming_it(kind, prepared):
    with pytest.raises(
        EngineBuildError, match=r"input buffer for 'state.l0_h' must be \[1, 32\] torch.float32 on cpu, got \[1, 31\]"
    ):
        _make(kind, prepared, input_buffers={"state.l0_h": torch.zeros(1, 31)})


@pytest.mark.parametrize("kind", MAKERS)
def test_a_strided_buffer_is_refused(kind, prepared):
    strided = torch.zeros(1, 64)[:, ::2]
    with pytest.raises(EngineBuildError, match="input buffer for 'state.l1_h' must be contiguous"):
        _make(kind, prepared, input_buffers={"state.l1_h": strided})


@pytest.mark.parametrize("kind", MAKERS)
def test_a_buffer_for_no_input_is_refused(kind, prepared):
    with pytest.raises(EngineBuildError, match="input buffer for 'state.l9_h': the engine has no such input"):
        _make(kind, prepared, input_buffers={"state.l9_h": torch.zeros(1, 32)})


@pytest.mark.parametrize("kind", MAKERS)
def test_unknown_names_and_a_mismatched_hand_off_are_refused(kind, prepared):
    with pytest.raises(EngineRunError, match="no graph input 'frame'"):
        _make(kind, prepared, host_inputs=["frame"])
    with pytest.raises(EngineRunError, match="no graph output 'logits'"):
        _make(kind, prepared, host_outputs=["logits"])
    with pytest.raises(
        EngineBuildError, match=r"state hand-off y -> x: output is \[1, 32\] torch.float32, input is \[1, 64\]"
    ):
        _make(kind, prepared, state_pairs={"y": "x"})


def test_replay_modes_are_checked_once_for_every_binding(prepared):
    binding = _make("host", prepared)
    binding.set_replay_mode("driver")
    assert binding.replay_mode == "driver"
    with pytest.raises(EngineRunError, match="replay mode must be one of"):
        binding.set_replay_mode("fast")
