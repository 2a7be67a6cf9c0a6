"""framefuse.rewrite.normalize: exporter leftovers removed, semantics kept, every change counted."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from framefuse.rewrite import rewrite_model
from framefuse.rewrite.normalize import fix_negative_transpose_perms, normalize_graph, normalize_model

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(nodes, inputs, outputs, initializers=(), opset=17, check=True):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    if check:
        onnx.checker.check_model(model, full_check=True)
    return onnx.shape_inference.infer_shapes(model)


def _run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _ops(model):
    return [n.op_type for n in model.graph.node]


def _leftovers_model():
    """x → Cast(f32) → Identity → Identity → Dropout(inference) → Transpose(identity perm) → Tanh
    → Cast(f16) → Cast(f32) → y: only Tanh and the two real Casts carry meaning."""
    nodes = [
        helper.make_node("Cast", ["x"], ["c0"], to=F32),
        helper.make_node("Identity", ["c0"], ["i0"]),
        helper.make_node("Identity", ["i0"], ["i1"]),
        helper.make_node("Dropout", ["i1"], ["d0"]),
        helper.make_node("Transpose", ["d0"], ["t0"], perm=[0, 1, 2]),
        helper.make_node("Tanh", ["t0"], ["h"]),
        helper.make_node("Cast", ["h"], ["h16"], to=F16),
        helper.make_node("Cast", ["h16"], ["y"], to=F32),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [1, 4, 3])],
        [helper.make_tensor_value_info("y", F32, [1, 4, 3])],
    )


def test_leftovers_are_removed_counted_and_semantics_kept():
    model = _leftovers_model()
    notes: list[str] = []
    out, counts = normalize_model(model, notes)
    assert _ops(out) == ["Tanh", "Cast", "Cast"]
    assert [n.attribute[0].i for n in out.graph.node if n.op_type == "Cast"] == [F16, F32]
    assert counts == {"no-op Cast": 1, "Identity": 2, "inference Dropout": 1, "identity Transpose": 1}
    assert notes == [
        "normalized before the passes: 2 Identity, 1 identity Transpose, 1 inference Dropout, 1 no-op Cast"
    ]
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(_run(out, {"x": x})[0], _run(model, {"x": x})[0])


def test_graph_outputs_and_meaningful_nodes_are_kept():
    nodes = [
        helper.make_node("Identity", ["x"], ["y"]),  # the graph output's name is the interface
        helper.make_node("Cast", ["x"], ["z16"], to=F16),  # a real conversion
        helper.make_node("Dropout", ["x", "ratio", "train"], ["d"]),  # training mode on
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Add", ["d", "x"], ["s"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [1, 3, 3])],
        [helper.make_tensor_value_info(n, t, [1, 3, 3]) for n, t in (("y", F32), ("z16", F16), ("s", F32), ("t", F32))],
        [helper.make_tensor("ratio", F32, [], [0.5]), helper.make_tensor("train", TensorProto.BOOL, [], [True])],
    )
    out, counts = normalize_model(model)
    assert sorted(_ops(out)) == sorted(_ops(model))
    assert not counts


def test_negative_transpose_perm_becomes_non_negative():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, -1, 1]), helper.make_node("Relu", ["t"], ["y"])]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [2, 3, 4])],
        [helper.make_tensor_value_info("y", F32, [2, 4, 3])],
        check=False,
    )
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError), match="perm"):
        onnx.checker.check_model(model, full_check=True)
    graph = gs.import_onnx(model)
    assert normalize_graph(graph) == {"negative Transpose perm": 1}
    assert graph.nodes[0].attrs["perm"] == [0, 2, 1]

    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    assert fix_negative_transpose_perms(proto) == 1
    assert list(proto.graph.node[0].attribute[0].ints) == [0, 2, 1]
    onnx.checker.check_model(proto, full_check=True)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 12
    np.testing.assert_array_equal(_run(proto, {"x": x})[0], np.maximum(x.transpose(0, 2, 1), 0))
    assert fix_negative_transpose_perms(proto) == 0


def test_a_subgraph_reading_a_removed_identity_reads_its_source():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "i0"], ["s_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", F32, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_out", F32, [2]),
        ],
    )
    nodes = [
        helper.make_node("Identity", ["x"], ["i0"]),
        helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [2])],
        [helper.make_tensor_value_info("y", F32, [2])],
        [helper.make_tensor("trips", TensorProto.INT64, [], [3])],
    )
    out, counts = normalize_model(model)
    assert counts == {"Identity": 1} and _ops(out) == ["Loop"]  # bodies keep their own nodes
    x = np.array([1.0, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(_run(out, {"x": x})[0], x * 4)


def test_rewrite_model_normalizes_and_reports_it():
    notes_model = _leftovers_model()
    fused, report = rewrite_model(notes_model)
    assert any(n.startswith("normalized before the passes:") and "1 no-op Cast" in n for n in report.notes)
    assert "Identity" not in _ops(fused) and "Dropout" not in _ops(fused)
    x = np.random.default_rng(1).standard_normal((1, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(_run(fused, {"x": x})[0], _run(notes_model, {"x": x})[0])
