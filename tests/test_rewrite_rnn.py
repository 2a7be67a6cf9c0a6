"""ONNX LSTM / GRU nodes → LSTMSeq / GRUSeq, checked against ONNX Runtime on the original graph."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

from framefuse.parity import compare
from framefuse.parity.runners import OnnxReferenceRunner
from framefuse.plugins.registry import OpUnavailableError, get_op
from framefuse.rewrite import rewrite_model

TOL = 1e-4


def require_ops(*ops):
    for op in ops:
        try:
            get_op(op)
        except OpUnavailableError as exc:
            pytest.skip(f"reference of {op} not available yet: {exc}")


def export(module, args, path, input_names, output_names):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=input_names,
            output_names=output_names,
        )
    return path


def op_types(model):
    return [n.op_type for n in model.graph.node]


class SeqRNN(torch.nn.Module):
    def __init__(self, cell, **kw):
        super().__init__()
        self.rnn = cell(6, 8, batch_first=True, **kw)

    def forward(self, x):
        y, _ = self.rnn(x)
        return y


class StepLSTM(torch.nn.Module):
    """Initial states in, final states out: the shape of a step-form export."""

    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(6, 8, num_layers=1)

    def forward(self, x, h0, c0):
        y, (h, c) = self.rnn(x, (h0, c0))
        return y, h, c


@pytest.mark.parametrize(
    "cell,kw,fused_op,n_nodes",
    [
        (torch.nn.LSTM, dict(num_layers=2), "LSTMSeq", 2),
        (torch.nn.GRU, dict(), "GRUSeq", 1),
        (torch.nn.LSTM, dict(bidirectional=True), "LSTMSeq", 2),  # one node per direction
        (torch.nn.GRU, dict(bidirectional=True, num_layers=2), "GRUSeq", 4),
    ],
)
def test_torch_rnn_rewritten_with_parity(tmp_path, cell, kw, fused_op, n_nodes):
    require_ops(fused_op)
    path = export(SeqRNN(cell, **kw), (torch.randn(2, 5, 6),), tmp_path / "m.onnx", ["x"], ["y"])
    fused, report = rewrite_model(path)
    types = op_types(fused)
    assert types.count(fused_op) == n_nodes
    assert "LSTM" not in types and "GRU" not in types
    assert report.remaining_per_timestep_ops["LSTM"] == 0 and report.remaining_per_timestep_ops["GRU"] == 0
    assert all(n.domain == "framefuse" for n in fused.graph.node if n.op_type == fused_op)
    parity = compare(path, fused, tolerance=TOL)
    assert parity.passed, parity.summary()
    assert parity.outputs[0].max_abs < TOL


def test_lstm_states_in_and_out(tmp_path):
    require_ops("LSTMSeq")
    args = (torch.randn(4, 2, 6), torch.randn(1, 2, 8), torch.randn(1, 2, 8))
    path = export(StepLSTM(), args, tmp_path / "m.onnx", ["x", "h0", "c0"], ["y", "h", "c"])
    fused, report = rewrite_model(path)
    node = next(n for n in fused.graph.node if n.op_type == "LSTMSeq")
    assert node.input[4] and node.input[5], "initial states must be wired to the fused node"
    assert [o.name for o in fused.graph.output] == ["y", "h", "c"]
    parity = compare(path, fused, tolerance=TOL, inputs={k: v.numpy() for k, v in zip(["x", "h0", "c0"], args)})
    assert parity.passed, parity.summary()
    assert {o.name for o in parity.outputs} == {"y", "h", "c"}


def _onnx_rnn_model(
    op="LSTM", *, layout=0, direction="forward", extra_attrs=None, peephole=False, seq_lens=None, bias=True
):
    """An ONNX LSTM/GRU node built by hand, with all outputs as graph outputs."""
    rng = np.random.default_rng(0)
    T, B, I, H = 5, 2, 3, 4
    gates = 4 if op == "LSTM" else 3
    D = 2 if direction == "bidirectional" else 1
    w = nh.from_array((rng.standard_normal((D, gates * H, I)) * 0.5).astype(np.float32), "W")
    r = nh.from_array((rng.standard_normal((D, gates * H, H)) * 0.5).astype(np.float32), "R")
    b = nh.from_array((rng.standard_normal((D, 2 * gates * H)) * 0.1).astype(np.float32), "B")
    inits = [w, r, b] if bias else [w, r]
    x_shape = [B, T, I] if layout else [T, B, I]
    s_shape = [B, D, H] if layout else [D, B, H]
    inputs = ["X", "W", "R", "B" if bias else "", "", "h0"]
    graph_inputs = [
        oh.make_tensor_value_info("X", TP.FLOAT, x_shape),
        oh.make_tensor_value_info("h0", TP.FLOAT, s_shape),
    ]
    if seq_lens is not None:
        inits.append(nh.from_array(np.asarray(seq_lens, np.int32), "seq_lens"))
        inputs[4] = "seq_lens"
    if op == "LSTM":
        inputs.append("c0")
        graph_inputs.append(oh.make_tensor_value_info("c0", TP.FLOAT, s_shape))
        if peephole:
            inits.append(nh.from_array(rng.standard_normal((D, 3 * H)).astype(np.float32), "P"))
            inputs.append("P")
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    attrs = dict(hidden_size=H, direction=direction, layout=layout, **(extra_attrs or {}))
    if op == "GRU":
        attrs.setdefault("linear_before_reset", 1)
    node = oh.make_node(op, inputs, outs, name=f"my_{op.lower()}", **attrs)
    y_shape = [B, T, D, H] if layout else [T, D, B, H]
    graph = oh.make_graph(
        [node],
        "g",
        graph_inputs,
        [oh.make_tensor_value_info("Y", TP.FLOAT, y_shape)]
        + [oh.make_tensor_value_info(o, TP.FLOAT, s_shape) for o in outs[1:]],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize(
    "op,layout,direction",
    [
        ("LSTM", 1, "forward"),
        ("LSTM", 0, "reverse"),
        ("LSTM", 1, "bidirectional"),
        ("GRU", 1, "forward"),
        ("GRU", 0, "reverse"),
    ],
)
def test_layouts_and_directions(op, layout, direction):
    fused_op = "LSTMSeq" if op == "LSTM" else "GRUSeq"
    require_ops(fused_op)
    model = _onnx_rnn_model(op, layout=layout, direction=direction)
    fused, report = rewrite_model(model)
    assert op not in op_types(fused)
    assert op_types(fused).count(fused_op) == (2 if direction == "bidirectional" else 1)
    assert report.matches[0].detail["layout"] == layout
    # ONNX Runtime rejects layout=1 RNNs, so the original runs on numpy of the ONNX spec.
    original = OnnxReferenceRunner(model) if layout == 1 else model
    parity = compare(original, fused, tolerance=TOL)
    assert parity.passed, parity.summary()
    assert {o.name for o in parity.outputs} == {"Y", "Y_h"} | ({"Y_c"} if op == "LSTM" else set())


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_absent_bias_stays_an_empty_optional_input(op):
    fused_op = "LSTMSeq" if op == "LSTM" else "GRUSeq"
    require_ops(fused_op)
    model = _onnx_rnn_model(op, bias=False)
    fused, _ = rewrite_model(model)
    node = next(n for n in fused.graph.node if n.op_type == fused_op)
    assert node.input[3] == "" and node.input[4] != ""  # bias absent, h0 given
    assert compare(model, fused, tolerance=TOL).passed


def test_sequence_lens_equal_to_T_is_accepted():
    require_ops("LSTMSeq")
    model = _onnx_rnn_model("LSTM", seq_lens=[5, 5])
    fused, report = rewrite_model(model)
    assert "LSTMSeq" in op_types(fused) and not report.declined
    assert compare(model, fused, tolerance=TOL).passed


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        (dict(peephole=True), "peephole"),
        (dict(extra_attrs={"clip": 3.0}), "clip"),
        (dict(extra_attrs={"input_forget": 1}), "input_forget"),
        (dict(extra_attrs={"activations": ["Sigmoid", "Relu", "Tanh"]}), "activations"),
        (dict(seq_lens=[5, 3]), "sequence_lens"),
    ],
)
def test_lstm_declined_with_reason(kwargs, reason):
    model = _onnx_rnn_model("LSTM", **kwargs)
    fused, report = rewrite_model(model)
    assert op_types(fused).count("LSTM") == 1
    assert report.remaining_per_timestep_ops["LSTM"] == 1
    assert len(report.declined) == 1
    assert report.declined[0].where == "my_lstm"
    assert reason in report.declined[0].reason


def test_gru_linear_before_reset_0_declined():
    model = _onnx_rnn_model("GRU", extra_attrs={"linear_before_reset": 0})
    fused, report = rewrite_model(model)
    assert "GRU" in op_types(fused)
    assert "linear_before_reset" in report.declined[0].reason
    assert report.remaining_per_timestep_ops["GRU"] == 1


def test_weights_are_folded_per_direction():
    require_ops("LSTMSeq")
    model = _onnx_rnn_model("LSTM", direction="bidirectional")
    fused, _ = rewrite_model(model)
    inits = {i.name: i for i in fused.graph.initializer}
    for node in (n for n in fused.graph.node if n.op_type == "LSTMSeq"):
        w, r, b = (inits[name] for name in node.input[1:4])
        assert list(w.dims) == [16, 3] and list(r.dims) == [16, 4] and list(b.dims) == [32]
    w_orig = nh.to_array(next(i for i in model.graph.initializer if i.name == "W"))
    first, second = (n for n in fused.graph.node if n.op_type == "LSTMSeq")
    np.testing.assert_array_equal(nh.to_array(inits[first.input[1]]), w_orig[0])
    np.testing.assert_array_equal(nh.to_array(inits[second.input[1]]), w_orig[1])


def test_onnx_rnn_node_declined():
    rng = np.random.default_rng(0)
    inits = [
        nh.from_array(rng.standard_normal((1, 4, 3)).astype(np.float32), "W"),
        nh.from_array(rng.standard_normal((1, 4, 4)).astype(np.float32), "R"),
    ]
    node = oh.make_node("RNN", ["X", "W", "R"], ["Y"], hidden_size=4, name="elman")
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("X", TP.FLOAT, [5, 2, 3])],
        [oh.make_tensor_value_info("Y", TP.FLOAT, [5, 1, 2, 4])],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    fused, report = rewrite_model(model)
    assert report.declined[0].where == "elman" and "RNN" in report.declined[0].reason
    assert report.remaining_per_timestep_ops["RNN"] == 1
    onnx.checker.check_model(fused)


def test_fp16_lstm_gets_fp32_states():
    """OPS.md: storage fp16, recurrent state fp32. ORT's CPU LSTM has no fp16 kernel, so the
    original runs on numpy of the ONNX spec."""
    require_ops("LSTMSeq")
    model = _onnx_rnn_model("LSTM", direction="bidirectional")
    for init in model.graph.initializer:
        init.CopyFrom(nh.from_array(nh.to_array(init).astype(np.float16), init.name))
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.elem_type = TP.FLOAT16
    fused, _ = rewrite_model(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(fused.graph.value_info) + list(fused.graph.input)}
    for node in (n for n in fused.graph.node if n.op_type == "LSTMSeq"):
        assert types[node.input[0]] == TP.FLOAT16
        assert types[node.input[4]] == TP.FLOAT and types[node.input[5]] == TP.FLOAT  # h0, c0 cast to fp32
    parity = compare(OnnxReferenceRunner(model), fused, tolerance={"fp16": 1e-2})
    assert parity.passed, parity.summary()
    assert {o.dtype for o in parity.outputs} == {"float16"}
