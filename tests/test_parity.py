"""framefuse.parity: framefuse nodes in ONNX Runtime through their references, and Polygraphy
comparison of two graphs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

from framefuse.errors import ParityError
from framefuse.parity import ParitySetupError, compare, ort_session, prepare_for_ort, tolerance_for

Bt, T, D = 2, 7, 5


def linear_scan_loop(a, b, h0):
    """h_t = a_t ⊙ h_{t−1} + b_t, written out."""
    h = np.zeros((a.shape[0], a.shape[2]), np.float64) if h0 is None else h0.astype(np.float64)
    hs = []
    for t in range(a.shape[1]):
        h = a[:, t].astype(np.float64) * h + b[:, t].astype(np.float64)
        hs.append(h)
    return np.stack(hs, 1), h


def fused_linear_scan_model(*, with_h0=True, dtype=TP.FLOAT, scale_b=1.0):
    """x → Mul(scale_b) → LinearScan(a, b·scale_b, h0) → (h, h_last)."""
    inputs = [oh.make_tensor_value_info("a", dtype, [Bt, T, D]), oh.make_tensor_value_info("b", dtype, [Bt, T, D])]
    scan_inputs = ["a", "b_scaled"]
    if with_h0:
        inputs.append(oh.make_tensor_value_info("h0", TP.FLOAT, [Bt, D]))
        scan_inputs.append("h0")
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    nodes = [
        oh.make_node("Mul", ["b", "k"], ["b_scaled"]),
        oh.make_node("LinearScan", scan_inputs, ["h", "h_last"], domain="framefuse", name="scan"),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        inputs,
        [oh.make_tensor_value_info("h", dtype, [Bt, T, D]), oh.make_tensor_value_info("h_last", TP.FLOAT, [Bt, D])],
        initializer=[nh.from_array(np.asarray(scale_b, np_dtype), "k")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("framefuse", 1)])
    model.ir_version = 9
    return model


def plain_linear_scan_model():
    """The same recurrence as an ONNX Scan (the 'original' side of a comparison)."""
    body = oh.make_graph(
        [
            oh.make_node("Mul", ["a_t", "h_in"], ["ah"]),
            oh.make_node("Add", ["ah", "b_t"], ["h_out"]),
            oh.make_node("Identity", ["h_out"], ["y_t"]),
        ],
        "body",
        [oh.make_tensor_value_info(n, TP.FLOAT, [Bt, D]) for n in ("h_in", "a_t", "b_t")],
        [oh.make_tensor_value_info(n, TP.FLOAT, [Bt, D]) for n in ("h_out", "y_t")],
    )
    nodes = [
        oh.make_node("Transpose", ["a"], ["a_tm"], perm=[1, 0, 2]),
        oh.make_node("Transpose", ["b"], ["b_tm"], perm=[1, 0, 2]),
        oh.make_node("Scan", ["h0", "a_tm", "b_tm"], ["h_last", "h_tm"], num_scan_inputs=2, body=body),
        oh.make_node("Transpose", ["h_tm"], ["h"], perm=[1, 0, 2]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [
            oh.make_tensor_value_info("a", TP.FLOAT, [Bt, T, D]),
            oh.make_tensor_value_info("b", TP.FLOAT, [Bt, T, D]),
            oh.make_tensor_value_info("h0", TP.FLOAT, [Bt, D]),
        ],
        [oh.make_tensor_value_info("h", TP.FLOAT, [Bt, T, D]), oh.make_tensor_value_info("h_last", TP.FLOAT, [Bt, D])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def feeds(seed=0, dtype=np.float32, with_h0=True):
    rng = np.random.default_rng(seed)
    f = {"a": rng.uniform(0.5, 1.0, (Bt, T, D)).astype(dtype), "b": rng.standard_normal((Bt, T, D)).astype(dtype)}
    if with_h0:
        f["h0"] = rng.standard_normal((Bt, D)).astype(np.float32)
    return f


@pytest.mark.parametrize("with_h0", [True, False])
def test_ort_session_runs_reference(with_h0):
    f = feeds(with_h0=with_h0)
    h, h_last = ort_session(fused_linear_scan_model(with_h0=with_h0)).run(None, f)
    want_h, want_last = linear_scan_loop(f["a"], f["b"], f.get("h0"))
    np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_last, want_last, rtol=1e-5, atol=1e-6)
    assert h.dtype == np.float32 and h_last.dtype == np.float32


def test_ort_session_fp16_storage_fp32_state():
    f = feeds(dtype=np.float16)
    h, h_last = ort_session(fused_linear_scan_model(dtype=TP.FLOAT16)).run(None, f)
    assert h.dtype == np.float16 and h_last.dtype == np.float32  # OPS.md: state outputs are fp32
    want_h, want_last = linear_scan_loop(f["a"], f["b"], f["h0"])
    np.testing.assert_allclose(h.astype(np.float64), want_h, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(h_last, want_last, rtol=1e-3, atol=1e-3)


def test_prepare_for_ort_leaves_original_untouched():
    model = fused_linear_scan_model()
    before = model.SerializeToString()
    prepared = prepare_for_ort(model)
    assert model.SerializeToString() == before
    node = next(n for n in prepared.graph.node if n.name == "scan")
    assert node.op_type.startswith("FF_LinearScan_") and node.domain == "framefuse.ort." + node.op_type
    assert {i.domain for i in prepared.opset_import} == {"", node.domain}


def test_compare_passes_and_writes_report(tmp_path):
    report = compare(
        plain_linear_scan_model(),
        fused_linear_scan_model(),
        tolerance=1e-5,
        report_path=tmp_path / "parity-report.json",
    )
    assert report.passed
    assert {o.name for o in report.outputs} == {"h", "h_last"}
    assert all(o.max_abs < 1e-5 for o in report.outputs)
    data = json.loads((tmp_path / "parity-report.json").read_text())
    assert data["passed"] is True and data["tolerance"] == {"h": 1e-5, "h_last": 1e-5}
    assert {o["name"] for o in data["outputs"]} == {"h", "h_last"}


def test_compare_detects_mismatch(tmp_path):
    # The fused side computes b·1.01 instead of b: a 1 % error must fail a 1e-4 tolerance.
    report = compare(
        plain_linear_scan_model(),
        fused_linear_scan_model(scale_b=1.01),
        tolerance=1e-4,
        report_path=tmp_path / "parity-report.json",
    )
    assert not report.passed
    assert all(not o.passed for o in report.outputs)
    assert max(o.max_abs for o in report.outputs) > 1e-3
    assert json.loads((tmp_path / "parity-report.json").read_text())["passed"] is False
    with pytest.raises(ParityError, match="h_last"):
        report.raise_if_failed()


def test_compare_with_given_inputs_and_runners():
    from polygraphy.backend.onnxrt import OnnxrtRunner

    original = OnnxrtRunner(lambda: ort_session(plain_linear_scan_model(), fused=False), name="mine")
    fused = OnnxrtRunner(lambda: ort_session(fused_linear_scan_model()), name="theirs")
    several = [feeds(seed=s) for s in range(3)]
    report = compare(original, fused, inputs=several, tolerance=1e-5)
    assert report.passed and report.iterations == 3
    assert report.original == "mine" and report.fused == "theirs"


def test_tolerance_per_dtype():
    assert tolerance_for("float32", None) == 1e-4
    assert tolerance_for("float16", {"fp32": 1e-4, "fp16": 2e-2}) == 2e-2
    assert tolerance_for("float32", 3e-3) == 3e-3
    # a dtype the table lacks takes its precision's tolerance, defined once (config.PRECISION_TOLERANCE):
    # the accuracy gate and the configs use the same 3e-2 for bf16 (the parity table said 5e-2)
    from framefuse.config import DEFAULTS, PRECISION_TOLERANCE
    from framefuse.precision.accuracy import DEFAULT_TOLERANCE

    assert tolerance_for("bfloat16", {"fp32": 1e-4}) == PRECISION_TOLERANCE["bf16"] == 3e-2
    assert DEFAULT_TOLERANCE == DEFAULTS["tolerance"] == PRECISION_TOLERANCE


def test_dynamic_shapes_need_inputs():
    model = plain_linear_scan_model()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "T"
    with pytest.raises(ParitySetupError, match="dynamic shape"):
        compare(model, model)


def test_missing_model_file(tmp_path):
    with pytest.raises(ParitySetupError, match="not found"):
        ort_session(tmp_path / "absent.onnx")
