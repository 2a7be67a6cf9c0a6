"""A linear recurrence computed in log space all at once (minGRU's "heinsen" parallel scan) →
LinearScan (framefuse/rewrite/logscan.py): the dynamo export of the torch code and a plain
Log(CumSum(Exp)) graph fuse with ONNX Runtime parity; expressions that are not the recurrence
from zero are left alone or declined naming the node."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from torch import nn

from framefuse.plugins.ort_bridge import ort_session
from framefuse.rewrite import rewrite_model

B, T, D = 2, 7, 5


def _log_g(x):
    return torch.where(x >= 0, (F.relu(x) + 0.5).log(), -F.softplus(-x))


class MinGRULogSpace(nn.Module):
    """minGRU's parallel scan as the paper's code writes it; ``h0``: False (from zero), "const" (a
    constant log h_0, torch.full) or "input" (h_0 a second input, log g(h_0) as the paper)."""

    def __init__(self, h0: bool | str = False):
        super().__init__()
        self.lin, self.h0 = nn.Linear(D, 2 * D), h0

    def forward(self, x, h_0=None):
        k, h_tilde = self.lin(x).chunk(2, dim=-1)
        log_coeffs, log_values = -F.softplus(k), -F.softplus(-k) + _log_g(h_tilde)
        if not self.h0:
            a_star = torch.cumsum(log_coeffs, dim=1)
            return torch.exp(a_star + torch.logcumsumexp(log_values - a_star, dim=1))
        log_h0 = torch.full((x.shape[0], 1, D), -1.0) if h_0 is None else _log_g(h_0).unsqueeze(1)
        a_star = F.pad(torch.cumsum(log_coeffs, dim=1), (0, 0, 1, 0))
        log_h = a_star + torch.logcumsumexp(torch.cat([log_h0, log_values], dim=1) - a_star, dim=1)
        return torch.exp(log_h)[:, 1:]


def _dynamo_export(module: nn.Module, seq: int = T) -> onnx.ModelProto:
    args = (torch.randn(B, seq, D),) + ((torch.randn(B, D),) if getattr(module, "h0", False) == "input" else ())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module.eval(), args, dynamo=True, verbose=False)
    return program.model_proto


def _feeds(model: onnx.ModelProto, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }


def _same_outputs(model, fused, feeds):
    expected = ort_session(model, fused=False).run(None, feeds)
    actual = ort_session(fused, fused=True).run(None, feeds)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


def test_torchscript_refuses_logcumsumexp_and_dynamo_exports_it():
    """Why the fusion reads the dynamo export: the TorchScript exporter has no logcumsumexp."""
    import io

    with pytest.raises(Exception, match="logcumsumexp"):
        torch.onnx.export(MinGRULogSpace().eval(), (torch.randn(B, T, D),), io.BytesIO(), dynamo=False)
    ops = {n.op_type for n in _dynamo_export(MinGRULogSpace()).graph.node}
    assert {"CumSum", "ReduceMax", "Log", "Exp"} <= ops


@pytest.mark.parametrize("seq", [T, 2 * T])
def test_heinsen_min_gru_fuses_into_one_linear_scan(seq):
    torch.manual_seed(0)
    model = _dynamo_export(MinGRULogSpace(), seq)
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["LinearScan"]
    assert not {"CumSum", "ReduceMax"} & {n.op_type for n in fused.graph.node}
    (match,) = [m for m in report.matches if m.pass_name == "log-space-scan"]
    assert match.detail["steps"] == seq and match.detail["check_max_rel_diff"] < 1e-5
    feeds = {model.graph.input[0].name: np.random.default_rng(1).standard_normal((B, seq, D)).astype(np.float32)}
    _same_outputs(model, fused, feeds)


def _plain_graph(other_a: bool = False) -> onnx.ModelProto:
    """h = exp(A + log(cumsum(exp(lb − A')))), A = cumsum(la): A' = A, or (``other_a``) a
    cumulative sum of something else, which is not the recurrence."""
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [1])
    nodes = [
        helper.make_node("CumSum", ["la", "axis"], ["A"]),
        helper.make_node("CumSum", ["lb", "axis"], ["A2"]),
        helper.make_node("Sub", ["lb", "A2" if other_a else "A"], ["v"]),
        helper.make_node("Exp", ["v"], ["ev"]),
        helper.make_node("CumSum", ["ev", "axis"], ["cs"]),
        helper.make_node("Log", ["cs"], ["lcse"]),
        helper.make_node("Add", ["A", "lcse"], ["s"]),
        helper.make_node("Exp", ["s"], ["h"]),
    ]
    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, T, D]) for n in ("la", "lb")]
    graph = helper.make_graph(
        nodes, "g", io_, [helper.make_tensor_value_info("h", TensorProto.FLOAT, [B, T, D])], [axis]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_plain_log_cumsum_exp_form_fuses():
    model = _plain_graph()
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["LinearScan"]
    rng = np.random.default_rng(2)
    feeds = {
        "la": np.log(rng.uniform(0.1, 0.9, (B, T, D))).astype(np.float32),
        "lb": rng.standard_normal((B, T, D)).astype(np.float32),
    }
    _same_outputs(model, fused, feeds)


@pytest.mark.parametrize("h0", ["const", "input"])
@pytest.mark.parametrize("seq", [T, 2 * T])
def test_the_papers_form_with_an_initial_state_fuses_into_one_linear_scan_from_h0(h0, seq):
    """pad(A) with a zero in front, cat([log h_0, log b]) and h[:, 1:]: the recurrence from
    h_(-1) = h_0, a LinearScan with h_0 its third input (a constant log h_0 or one computed from
    an input)."""
    torch.manual_seed(0)
    model = _dynamo_export(MinGRULogSpace(h0=h0), seq)
    fused, report = rewrite_model(model)
    (scan,) = [n for n in fused.graph.node if n.domain == "framefuse"]
    assert scan.op_type == "LinearScan" and len(scan.input) == 3
    assert not {"CumSum", "ReduceMax", "Pad"} & {n.op_type for n in fused.graph.node}
    (match,) = [m for m in report.matches if m.pass_name == "log-space-scan"]
    assert match.detail["form"] == "log-space, initial state" and match.detail["steps"] == seq
    assert match.detail["check_max_rel_diff"] < 1e-5
    _same_outputs(model, fused, _feeds(model))


def _padded_graph(*, pad_with_concat: bool, sliced: bool) -> onnx.ModelProto:
    """The initial-state form written by hand: A' = cat([0], cumsum(la)) or Pad(cumsum(la));
    h = exp(A' + log(cumsum(exp(cat([lh0, lb]) − A')))), read as h[:, 1:] or (``sliced`` False)
    whole, h_0 included."""
    inits = [
        helper.make_tensor("axis", TensorProto.INT64, [], [1]),
        helper.make_tensor("zeros", TensorProto.FLOAT, [B, 1, D], np.zeros(B * D).tolist()),
        helper.make_tensor("pads", TensorProto.INT64, [6], [0, 1, 0, 0, 0, 0]),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("end", TensorProto.INT64, [1], [1 << 62]),
    ]
    pad = (
        helper.make_node("Concat", ["zeros", "A"], ["Ap"], axis=1)
        if pad_with_concat
        else helper.make_node("Pad", ["A", "pads"], ["Ap"], mode="constant")
    )
    nodes = [
        helper.make_node("CumSum", ["la", "axis"], ["A"]),
        pad,
        helper.make_node("Concat", ["lh0", "lb"], ["cat"], axis=1),
        helper.make_node("Sub", ["cat", "Ap"], ["v"]),
        helper.make_node("Exp", ["v"], ["ev"]),
        helper.make_node("CumSum", ["ev", "axis"], ["cs"]),
        helper.make_node("Log", ["cs"], ["lcse"]),
        helper.make_node("Add", ["Ap", "lcse"], ["s"]),
        helper.make_node("Exp", ["s"], ["hh"]),
    ]
    if sliced:
        nodes.append(helper.make_node("Slice", ["hh", "one", "end", "one"], ["h"]))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, T, D]) for n in ("la", "lb")]
    inputs.append(helper.make_tensor_value_info("lh0", TensorProto.FLOAT, [B, 1, D]))
    out = helper.make_tensor_value_info("h" if sliced else "hh", TensorProto.FLOAT, [B, T + (0 if sliced else 1), D])
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, [out], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 10
    return model


@pytest.mark.parametrize("pad_with_concat", [False, True])
def test_a_hand_written_initial_state_form_fuses_and_keeps_its_values(pad_with_concat):
    model = _padded_graph(pad_with_concat=pad_with_concat, sliced=True)
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == ["LinearScan"]
    rng = np.random.default_rng(3)
    feeds = {
        "la": np.log(rng.uniform(0.1, 0.9, (B, T, D))).astype(np.float32),
        "lb": rng.standard_normal((B, T, D)).astype(np.float32),
        "lh0": rng.standard_normal((B, 1, D)).astype(np.float32),
    }
    _same_outputs(model, fused, feeds)


def test_log_space_forms_that_are_not_the_recurrence_from_zero_are_not_fused():
    """Another cumulative sum under the logcumsumexp is not the recurrence: declined naming the
    node; the initial-state form read whole (h_0 and every step, not h[:, 1:]) is declined with
    its reason. Neither graph changes."""
    fused, report = rewrite_model(_plain_graph(other_a=True))
    assert not [n for n in fused.graph.node if n.domain == "framefuse"]
    (declined,) = [d for d in report.declined if d.pass_name == "log-space-scan"]
    assert "not (log b − the same cumulative sum" in declined.reason
    model = _padded_graph(pad_with_concat=False, sliced=False)
    fused, report = rewrite_model(model)
    assert not [n for n in fused.graph.node if n.domain == "framefuse"]
    (declined,) = [d for d in report.declined if d.pass_name == "log-space-scan"]
    assert "only readers that slice h_0 off" in declined.reason and declined.where
    rng = np.random.default_rng(4)
    feeds = {
        "la": np.log(rng.uniform(0.1, 0.9, (B, T, D))).astype(np.float32),
        "lb": rng.standard_normal((B, T, D)).astype(np.float32),
        "lh0": rng.standard_normal((B, 1, D)).astype(np.float32),
    }
    _same_outputs(model, fused, feeds)
