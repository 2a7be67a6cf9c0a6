"""Property test: random linear recurrences written in many of the ways authors write them are
rewritten into exactly one LinearScan with no per-timestep ops left, and compute the same."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from framefuse.parity import ort_session
from framefuse.rewrite.pipeline import rewrite_model
from framefuse.rewrite.unrolled import PASSES, remaining_recurrence_ops

# Gate a_t ∈ (0, 1) from the frame (or from a parameter: a constant decay).
GATES = ["sigmoid", "one_minus_sigmoid", "exp_neg_softplus", "f_over_f_plus_i", "static_decay"]
# Input term b_t.
INPUTS = ["linear", "sigmoid_times_linear", "one_minus_a_times_linear", "tanh"]
# How the update is written.
UPDATES = ["a*h+b", "h*a+b", "b+a*h", "lerp", "h/d+b", "a*h-(-b)", "-(-(a*h)-b)"]


class RandomLinearRecurrence(nn.Module):
    def __init__(self, features, width, heads, gate, inp, update, per_step_projection, readout, stateful):
        super().__init__()
        self.gate, self.inp, self.update = gate, inp, update
        self.per_step, self.readout, self.stateful = per_step_projection, readout, stateful
        self.heads, self.width = heads, width
        channels = heads * width
        self.w_a = nn.Linear(features, channels)
        self.w_i = nn.Linear(features, channels)
        self.w_b = nn.Linear(features, channels)
        self.decay = nn.Parameter(torch.randn(channels))
        self.out = nn.Linear(channels, features)

    def state_shape(self, batch):
        return (batch, self.width) if self.heads == 1 else (batch, self.heads, self.width)

    def _shape(self, v):  # [..., H*P] -> state layout
        return v if self.heads == 1 else v.reshape(*v.shape[:-1], self.heads, self.width)

    def coefficients(self, x):
        """a, b for x of shape [B, T, F] or [B, F] (all frames at once or one frame)."""
        s = self._shape
        if self.gate == "sigmoid":
            a = torch.sigmoid(s(self.w_a(x)))
        elif self.gate == "one_minus_sigmoid":
            a = 1 - torch.sigmoid(s(self.w_a(x)))
        elif self.gate == "exp_neg_softplus":
            a = torch.exp(-nn.functional.softplus(s(self.w_a(x))))
        elif self.gate == "f_over_f_plus_i":
            f, i = torch.sigmoid(s(self.w_a(x))), torch.sigmoid(s(self.w_i(x)))
            a = f / (f + i)
        else:
            a = torch.sigmoid(s(self.decay))
        if self.inp == "linear":
            b = s(self.w_b(x))
        elif self.inp == "sigmoid_times_linear":
            b = torch.sigmoid(s(self.w_i(x))) * s(self.w_b(x))
        elif self.inp == "one_minus_a_times_linear":
            b = (1 - a) * s(self.w_b(x))
        else:
            b = torch.tanh(s(self.w_b(x)))
        return a, b

    def step_update(self, h, a, b):
        u = self.update
        if u == "a*h+b":
            return a * h + b
        if u == "h*a+b":
            return h * a + b
        if u == "b+a*h":
            return b + a * h
        if u == "lerp":  # h + k (c − h) with k = 1 − a, c = b / k: the same recurrence
            k = 1 - a
            return h + k * (b / k - h)
        if u == "h/d+b":
            return h / (1 / a) + b
        if u == "a*h-(-b)":
            return a * h - (-b)
        return -(-(a * h) - b)

    def forward(self, x, h0=None):
        h = x.new_zeros(self.state_shape(x.shape[0])) if h0 is None else h0
        if not self.per_step:
            a, b = self.coefficients(x)
        hs = []
        for t in range(x.shape[1]):
            if self.per_step:
                a_t, b_t = self.coefficients(x[:, t])
            else:
                a_t = a if self.gate == "static_decay" else a[:, t]
                b_t = b[:, t]
            h = self.step_update(h, a_t, b_t)
            hs.append(h)
        y = torch.stack(hs, dim=1)
        if self.readout == "linear":
            y = self.out(y.reshape(*y.shape[:2], -1))
        elif self.readout == "last":
            y = hs[-1] * 2
        return (y, h) if self.stateful else y


@st.composite
def recurrences(draw):
    steps = draw(st.integers(1, 8))
    config = dict(
        features=draw(st.integers(1, 5)),
        width=draw(st.integers(1, 6)),
        heads=draw(st.sampled_from([1, 1, 2])),
        gate=draw(st.sampled_from(GATES)),
        inp=draw(st.sampled_from(INPUTS)),
        update=draw(st.sampled_from(UPDATES)),
        per_step_projection=draw(st.booleans()),
        readout=draw(st.sampled_from(["stack", "linear", "last"])),
        # One frame without a state input has no recurrence to find (h_1 = b_1).
        stateful=draw(st.booleans()) or steps == 1,
    )
    batch = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    return steps, batch, seed, config


def export(module, args, input_names, output_names):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=input_names,
            output_names=output_names,
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, 10)
    return model


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recurrences())
def test_random_linear_recurrence_becomes_one_linear_scan(case):
    steps, batch, seed, config = case
    torch.manual_seed(seed)
    module = RandomLinearRecurrence(**config)
    x = torch.randn(batch, steps, config["features"])
    if config["stateful"]:
        h0 = torch.randn(module.state_shape(batch))
        model = export(module, (x, h0), ["x", "state.h"], ["y", "next_state.h"])
    else:
        model = export(module, (x,), ["x"], ["y"])

    fused, report = rewrite_model(model, passes=PASSES)

    scans = [n.op_type for n in fused.graph.node if n.domain == "framefuse"]
    assert scans == ["LinearScan"], (config, steps, report.declined)
    assert remaining_recurrence_ops(gs.import_onnx(fused)) == 0
    # Nothing per-step is left: no node reads one frame of the input.
    assert not any(n.op_type == "Gather" and "x" in n.input for n in fused.graph.node)
    rng = np.random.default_rng(seed)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }
    expected = ort_session(model, fused=False).run(None, feeds)
    actual = ort_session(fused).run(None, feeds)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)
