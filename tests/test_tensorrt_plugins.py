"""The TensorRT plugins' build-time logic, without TensorRT: shape rules, dtype/format support and
field round-trips all come from the op schemas (framefuse/plugins/tensorrt_plugins.py)."""

from __future__ import annotations

import numpy as np
import pytest

from framefuse.plugins import registry
from framefuse.plugins import tensorrt_plugins as tp
from framefuse.plugins.schema import SchemaError


def test_output_shapes_are_the_schema_rule():
    assert tp.output_shapes("LinearScan", [(2, 8, 16), (2, 8, 16), (2, 16)]) == [(2, 8, 16), (2, 16)]
    # LSTMSeq: X [T,B,I], W [4H,I], R [4H,H] -> Y [T,B,H], h, c
    assert tp.output_shapes("LSTMSeq", [(8, 1, 5), (12, 5), (12, 3)]) == [(8, 1, 3), (1, 3), (1, 3)]


def test_output_shapes_errors_name_the_op_and_refuse_unknown_dims():
    with pytest.raises(tp.PluginError, match="LinearScan"):
        tp.output_shapes("LinearScan", [(2, 8, 16), (2, 9, 16)])
    with pytest.raises(tp.PluginError, match="static shapes"):
        tp.output_shapes("LinearScan", [(-1, 8, 16), (-1, 8, 16)])
    with pytest.raises(SchemaError):
        tp.output_shapes("LinearScan", [(2, 8, 16)])  # b is required


@pytest.mark.parametrize("op_type", registry.OP_TYPES)
def test_dtypes_follow_the_schema(op_type):
    schema = registry.get_schema(op_type)
    n = len(schema.required_inputs)
    for storage in ("float32", "float16", "bfloat16"):
        in_dtypes = [storage if s.dtype == "T" else s.dtype for s in schema.inputs[:n]]
        out = tp.output_dtypes(op_type, in_dtypes)
        assert out == [storage if s.dtype == "T" else s.dtype for s in schema.outputs]
        dtypes = in_dtypes + out
        linear = [True] * len(dtypes)
        assert all(tp.supports_combination(op_type, pos, dtypes, linear, n) for pos in range(len(dtypes)))
        # a non-row-major format is refused at every position
        assert not any(
            tp.supports_combination(op_type, pos, dtypes, [False] * len(dtypes), n) for pos in range(len(dtypes))
        )


def test_format_combination_rejects_mixed_storage_and_wrong_state_dtype():
    dtypes = ["float16", "float32", "float32", "float16", "float32"]  # a fp16, b fp32: mixed storage
    assert tp.supports_combination("LinearScan", 0, dtypes, [True] * 5, 3)
    assert not tp.supports_combination("LinearScan", 1, dtypes, [True] * 5, 3)
    dtypes = ["float16", "float16", "float16", "float16", "float32"]  # h0 is fp32 state, not fp16
    assert not tp.supports_combination("LinearScan", 2, dtypes, [True] * 5, 3)
    assert not tp.supports_combination("LinearScan", 0, ["int32"] * 5, [True] * 5, 3)


@pytest.mark.parametrize("op_type", registry.OP_TYPES)
def test_fields_round_trip(op_type):
    schema = registry.get_schema(op_type)
    attrs = schema.attrs_with_defaults({})
    for name, (typ, _default) in schema.attributes.items():
        attrs[name] = {int: 1, float: 0.375, str: "x"}[typ]
    fields = tp.attrs_to_fields(op_type, attrs)
    assert [n for n, _ in fields] == list(schema.attributes)
    assert all(isinstance(a, np.ndarray) for _, a in fields)
    # the parser adds its own plugin_version / plugin_namespace fields: they are dropped
    back = tp.fields_to_attrs(op_type, {**dict(fields), "plugin_version": np.array([1], np.int8)})
    assert back == attrs


def test_none_attribute_is_left_out_and_restored():
    fields = dict(tp.attrs_to_fields("Attention", {"causal": 1}))
    assert "scale" not in fields and fields["causal"].dtype == np.int32
    assert tp.fields_to_attrs("Attention", fields) == {"scale": None, "causal": 1}
    with pytest.raises(SchemaError, match="unknown attribute"):
        tp.attrs_to_fields("Attention", {"bogus": 1})


def test_enqueue_core_checks_shapes_before_touching_pointers():
    # wrong output shape: refused before any device pointer is wrapped (so this runs without a GPU)
    with pytest.raises(tp.PluginError, match="output shapes"):
        tp.enqueue_core(
            "LinearScan",
            {},
            [1, 2],
            [(1, 4, 8), (1, 4, 8)],
            ["float32"] * 2,
            [3, 4],
            [(1, 4, 8), (1, 9)],
            ["float32"] * 2,
            0,
        )
    with pytest.raises(tp.PluginError, match="dtypes"):
        tp.enqueue_core(
            "LinearScan",
            {},
            [1, 2],
            [(1, 4, 8), (1, 4, 8)],
            ["float32"] * 2,
            [3, 4],
            [(1, 4, 8), (1, 8)],
            ["float32", "float16"],
            0,
        )


def test_plugin_classes_for_tensorrt_rtx_follow_the_registry():
    trt = pytest.importorskip("tensorrt_rtx")
    classes = tp.plugin_classes(trt)
    assert set(classes) == set(registry.OP_TYPES)
    for op_type, (_plugin_cls, creator_cls) in classes.items():
        creator = creator_cls()
        name = tp.trt_plugin_name(op_type)  # the op type, but for Attention (an ONNX op TensorRT imports itself)
        assert (creator.name, creator.plugin_namespace, creator.plugin_version) == (name, "framefuse", "1")
        fields = [f.name for f in creator.field_names]  # the op's attributes, then the input mask
        assert fields == [*registry.get_schema(op_type).attributes, tp.PRESENT_FIELD]


def test_a_layer_with_absent_inputs_reads_its_present_ones_through_the_mask():
    """mamba's step form: SelectiveScan given x, dt, A, B, C and h0, without D, z, dt_bias."""
    names = ["x", "dt", "A", "B", "C", "", "", "", "h0"]
    mask = tp.presence_mask(names)
    assert mask == 0b100011111
    assert tp.present_positions("SelectiveScan", mask, 6) == [0, 1, 2, 3, 4, 8]
    assert tp.by_position("SelectiveScan", list("abcdeh"), mask) == ["a", "b", "c", "d", "e", None, None, None, "h"]
    assert tp.by_position("SelectiveScan", list("abcde")) == ["a", "b", "c", "d", "e", None, None, None, None]
    shapes = [(1, 1, 8), (1, 1, 8), (8, 4), (1, 1, 4), (1, 1, 4), (1, 8, 4)]
    assert tp.output_shapes("SelectiveScan", shapes, {}, present=mask) == [(1, 1, 8), (1, 8, 4)]
    with pytest.raises(tp.PluginError, match="input D must have rank 1"):  # h0 read as D without the mask
        tp.output_shapes("SelectiveScan", shapes, {})
    dtypes = ["float16", "float16", "float32", "float16", "float16", "float32"]  # A and h0: fp32
    assert tp.output_dtypes("SelectiveScan", dtypes, mask) == ["float16", "float32"]
    combo = dtypes + ["float16", "float32"]  # + y, h_last
    linear = [True] * len(combo)
    assert all(tp.supports_combination("SelectiveScan", pos, combo, linear, 6, mask) for pos in range(len(combo)))
    # x, dt, A, B, C, z (mask 0b1011111): position 5 is z, a storage tensor, not D (fp32)
    z_combo = dtypes[:5] + ["float16", "float16", "float32"]
    assert tp.supports_combination("SelectiveScan", 5, z_combo, linear, 6, 0b1011111)
    assert not tp.supports_combination("SelectiveScan", 5, z_combo, linear, 6)
    with pytest.raises(tp.PluginError, match="6 inputs given, but framefuse_present_inputs=31 says 5"):
        tp.present_positions("SelectiveScan", 0b11111, 6)
    with pytest.raises(tp.PluginError, match=r"required input\(s\) C not given"):
        tp.present_positions("SelectiveScan", 0b100001111, 5)
    with pytest.raises(tp.PluginError, match="names inputs the op does not have"):
        tp.present_positions("SelectiveScan", 1 << 9 | 0b11111, 6)
