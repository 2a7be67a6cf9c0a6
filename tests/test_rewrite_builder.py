"""GraphBuilder, the one node builder of the rewrite passes: inferred shapes, folded constants,
skipped no-ops, multi-output nodes, the record of new nodes, and a built graph run by ONNX
Runtime against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from framefuse.rewrite.base import RewriteContext
from framefuse.rewrite.builder import GraphBuilder


def _builder(prefix=None):
    x = gs.Variable("x", dtype=np.float32, shape=[2, 3, 4])
    graph = gs.Graph(inputs=[x], outputs=[], opset=17)
    return GraphBuilder(graph, RewriteContext(), prefix=prefix), x


def test_shapes_and_dtypes_are_inferred():
    b, x = _builder()
    assert b.transpose(x, [2, 0, 1]).shape == [4, 2, 3]
    assert b.unsqueeze(x, [0, -1]).shape == [1, 2, 3, 4, 1]
    assert b.unsqueeze(x, 1).shape == [2, 1, 3, 4]
    assert b.squeeze(b.unsqueeze(x, 1), 1).shape == [2, 3, 4]
    assert b.reshape(x, (0, -1)).shape == [2, 12]
    assert b.gather(x, 1, axis=-1).shape == [2, 3]
    assert b.concat([x, x], axis=1).shape == [2, 6, 4]
    assert b.expand(b.const(np.ones((1, 4), np.float32)), (3, 4)).shape == [3, 4]
    y = b.node("Add", [x, b.const(np.ones((3, 1), np.float32))])
    assert y.shape == [2, 3, 4] and np.dtype(y.dtype) == np.float32
    c = b.cast(x, np.float16)
    assert c.shape == [2, 3, 4] and np.dtype(c.dtype) == np.float16
    assert c.inputs[0].attrs["to"] == onnx.TensorProto.FLOAT16
    # an explicit shape or dtype wins over inference; an unknown one stays unknown
    assert b.transpose(x, [1, 0, 2], shape=(7, 7, 7)).shape == [7, 7, 7]
    assert b.node("MatMul", [x, x]).shape is None


def test_constants_are_folded():
    b, _ = _builder()
    value = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    w = b.const(value)
    cases = [
        (b.transpose(w, [1, 0, 2]), np.transpose(value, [1, 0, 2])),
        (b.reshape(w, (6, 4)), value.reshape(6, 4)),
        (b.gather(w, 1, axis=1), value[:, 1]),
        (b.squeeze(b.const(value[:1]), 0), value[0]),
        (b.cast(w, np.int64), value.astype(np.int64)),
    ]
    for folded, expected in cases:
        assert isinstance(folded, gs.Constant)
        np.testing.assert_array_equal(folded.values, expected)
        assert folded.values.dtype == expected.dtype
    assert b.new_nodes == [] and b.graph.nodes == []
    # a 0-d value stays 0-d
    assert b.const(2.5).values.shape == ()


def test_no_ops_add_no_node():
    b, x = _builder()
    assert b.transpose(x, [0, 1, 2]) is x
    assert b.reshape(x, (2, 3, 4)) is x
    assert b.cast(x, np.float32) is x
    assert b.scaled(x, 1.0) is x
    assert b.graph.nodes == [] and b.new_nodes == []


def test_multi_output_node_names_domain_and_record():
    b, x = _builder(prefix="Fused_3")
    outs = b.node("Split", [x], n_out=2, out_shapes=[(2, 1, 4), (2, 2, 4)], dtype=np.float32, attrs={"axis": 1})
    assert [o.shape for o in outs] == [[2, 1, 4], [2, 2, 4]]
    node = outs[0].inputs[0]
    assert node is outs[1].inputs[0] and node.op == "Split" and node.attrs == {"axis": 1}
    assert node.name.startswith("Fused_3/Split_")
    assert [o.name for o in outs] == [f"{node.name}_out0", f"{node.name}_out1"]
    fused = b.node("LinearScan", [x], shape=(2, 3, 4), dtype=np.float32, domain="framefuse")
    assert fused.inputs[0].domain == "framefuse"
    t = b.transpose(x, [1, 0, 2])
    assert b.new_nodes == [node, fused.inputs[0], t.inputs[0]]
    assert b.graph.nodes == b.new_nodes


def test_built_graph_computes_what_numpy_does():
    b, x = _builder()
    moved = b.transpose(x, [0, 2, 1])  # [2, 4, 3]
    picked = b.gather(moved, 2, axis=1)  # [2, 3]
    both = b.concat([b.unsqueeze(picked, 0), b.unsqueeze(b.scaled(picked, 0.5), 0)], axis=0)  # [2, 2, 3]
    flipped = b.reverse(both, axis=2)
    mask = b.node("Greater", [flipped, b.const(np.float32(1.0))], shape=(2, 2, 3), dtype=np.bool_)
    out = b.where(mask, flipped, b.const(np.zeros((), np.float32)))
    assert out.shape == [2, 2, 3] and np.dtype(out.dtype) == np.float32
    b.graph.outputs = [out]
    model = gs.export_onnx(b.graph)
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model, full_check=True)
    value = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32) * 3
    (got,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": value})
    picked_ref = np.transpose(value, [0, 2, 1])[:, 2]
    ref = np.stack([picked_ref, 0.5 * picked_ref])[:, :, ::-1]
    np.testing.assert_allclose(got, np.where(ref > 1.0, ref, 0.0), rtol=1e-6)
    assert [n.op for n in b.new_nodes] == [
        "Transpose",
        "Gather",
        "Unsqueeze",
        "Mul",
        "Unsqueeze",
        "Concat",
        "Slice",
        "Greater",
        "Where",
    ]
