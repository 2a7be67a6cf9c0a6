"""Bad input to the rewrite: each gives a FrameFuseError whose message names the problem."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

from framefuse.errors import FrameFuseError
from framefuse.rewrite import RewriteError, rewrite_model
from framefuse.rewrite.cli import register as register_rewrite


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 9
    return model


def test_corrupt_file_names_the_file(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07this is not a protobuf \xff\xfe" * 10)
    with pytest.raises(RewriteError) as err:
        rewrite_model(path)
    assert str(path) in str(err.value)


def test_truncated_model_file(tmp_path):
    x = oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])
    good = _model([oh.make_node("Relu", ["x"], ["y"])], [x], [y])
    path = tmp_path / "cut.onnx"
    path.write_bytes(good.SerializeToString()[:-7])
    with pytest.raises(FrameFuseError) as err:
        rewrite_model(path)
    assert "cut.onnx" in str(err.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(RewriteError, match="empty.onnx"):
        rewrite_model(path)


def test_missing_file(tmp_path):
    with pytest.raises(RewriteError, match="not found"):
        rewrite_model(tmp_path / "nope.onnx")


def test_unknown_domain_names_the_node():
    x = oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])
    node = oh.make_node("FancyOp", ["x"], ["y"], name="my_fancy_node", domain="com.example")
    model = _model([node], [x], [y], opsets=(("", 17), ("com.example", 1)))
    with pytest.raises(RewriteError) as err:
        rewrite_model(model)
    msg = str(err.value)
    assert "my_fancy_node" in msg and "FancyOp" in msg and "com.example" in msg


def test_unknown_onnx_op_names_the_node():
    x = oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])
    node = oh.make_node("NotARealOnnxOp", ["x"], ["y"], name="odd")
    with pytest.raises(RewriteError) as err:
        rewrite_model(_model([node], [x], [y]))
    assert "odd" in str(err.value) and "NotARealOnnxOp" in str(err.value)


def test_unknown_framefuse_op():
    x = oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])
    node = oh.make_node("WarpDrive", ["x"], ["y"], name="warp", domain="framefuse")
    with pytest.raises(RewriteError) as err:
        rewrite_model(_model([node], [x], [y], opsets=(("", 17), ("framefuse", 1))))
    assert "warp" in str(err.value) and "WarpDrive" in str(err.value)


def test_unknown_op_inside_a_loop_body():
    inner = oh.make_graph(
        [oh.make_node("Mystery", ["h_in"], ["h_out"], name="inner_mystery", domain="x.y")],
        "body",
        [oh.make_tensor_value_info("h_in", TP.FLOAT, [3]), oh.make_tensor_value_info("s", TP.FLOAT, [3])],
        [oh.make_tensor_value_info("h_out", TP.FLOAT, [3])],
    )
    scan = oh.make_node("Scan", ["h0", "xs"], ["hT"], num_scan_inputs=1, body=inner, name="scan")
    model = _model(
        [scan],
        [oh.make_tensor_value_info("h0", TP.FLOAT, [3]), oh.make_tensor_value_info("xs", TP.FLOAT, [4, 3])],
        [oh.make_tensor_value_info("hT", TP.FLOAT, [3])],
        opsets=(("", 17), ("x.y", 1)),
    )
    with pytest.raises(RewriteError) as err:
        rewrite_model(model)
    assert "inner_mystery" in str(err.value) and "scan" in str(err.value)


def test_mismatched_shapes():
    x = oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TP.FLOAT, [2, 5])
    w = nh.from_array(np.ones((4, 5), np.float32), "w")
    node = oh.make_node("MatMul", ["x", "w"], ["y"], name="bad_matmul")
    with pytest.raises(RewriteError) as err:
        rewrite_model(_model([node], [x], [y], inits=[w]))
    msg = str(err.value)
    assert "shape inference failed" in msg and "bad_matmul" in msg


def test_invalid_graph_is_reported():
    x = oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])
    node = oh.make_node("Relu", ["not_defined_anywhere"], ["y"], name="dangling")
    with pytest.raises(RewriteError, match="invalid ONNX model"):
        rewrite_model(_model([node], [x], [y]))


def test_cli_reports_corrupt_file(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    register_rewrite(parser.add_subparsers())
    path = tmp_path / "model.onnx"
    path.write_bytes(b"garbage")
    args = parser.parse_args(["rewrite", str(path)])
    with pytest.raises(FrameFuseError, match="model.onnx"):
        args.func(args)
    assert not (tmp_path / "model.fused.onnx").exists()
