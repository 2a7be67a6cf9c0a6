"""`plugins.checks.prepare`: every op's launch checks its arguments against the schema's symbolic
dims and dtypes, and sizes its outputs from them. These run on the CPU (`cuda=False`); the GPU
tests of each op call the same code through `launch`."""

from __future__ import annotations

import itertools

import pytest
import torch

from framefuse.plugins import registry
from framefuse.plugins.checks import OpArgumentError, prepare
from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, parse_dim, resolve_dims

# sizes that satisfy every op's own constraints (GQA: Hq a multiple of Hkv; Dk within the kernels')
FIXED = {"Hq": 4, "Hkv": 2}
# inputs whose shape no dims express (a mask that broadcasts): given a shape by hand
BY_HAND = {("Attention", "mask"): lambda s: (s["Tq"], s["Tk"])}
ATTRS = {"LiquidScan": {"ts": 0.5}, "MLSTMScan": {"eps": 1e-6}}


def _symbols(schema: OpSchema) -> list[str]:
    seen = []
    for spec in schema.inputs + schema.outputs:
        for dim in spec.dims or ():
            symbol = parse_dim(dim)[1]
            if symbol is not None and symbol not in seen:
                seen.append(symbol)
    return seen


def _inputs(schema: OpSchema, sizes: dict, dtype=torch.float32, with_optional=True):
    tensors = []
    for spec in schema.inputs:
        if spec.optional and not with_optional:
            tensors.append(None)
            continue
        shape = BY_HAND[(schema.name, spec.name)](sizes) if spec.dims is None else resolve_dims(spec.dims, sizes)
        tensors.append(torch.rand(shape, dtype=dtype if spec.dtype == "T" else torch.float32))
    return tensors


def _size_assignments(schema: OpSchema):
    symbols = _symbols(schema)
    for values in ((2, 3, 5, 7, 11, 13, 17), (1, 1, 1, 1, 1, 1, 1), (3, 1, 4, 6, 9, 2, 8)):
        sizes = dict(zip(symbols, itertools.cycle(values)))
        sizes.update({k: v for k, v in FIXED.items() if k in sizes})
        yield sizes


@pytest.mark.parametrize("op", registry.OP_TYPES)
def test_every_input_and_output_declares_dims_and_every_output_dim_is_sized_by_an_input(op):
    schema = registry.get_schema(op)
    bare = set()
    for spec in schema.inputs:
        if spec.dims is None:
            assert (op, spec.name) in BY_HAND, f"{op}: input {spec.name} has no dims"
            continue
        bare |= {s for c, s in map(parse_dim, spec.dims) if s is not None and c == 1}
    for spec in schema.outputs:
        assert spec.dims is not None, f"{op}: output {spec.name} has no dims"
        assert {parse_dim(d)[1] for d in spec.dims} - {None} <= bare, f"{op}: output {spec.name} {spec.dims}"


@pytest.mark.parametrize("op", registry.OP_TYPES)
def test_dims_agree_with_the_ops_shape_rule(op):
    """The outputs `prepare` sizes from the dims are the shapes the op's own shape rule (used by the
    rewrite, ONNX Runtime and TensorRT) infers, with and without the optional inputs, fp32 and fp16."""
    schema = registry.get_schema(op)
    for sizes, dtype, with_optional in itertools.product(
        _size_assignments(schema), (torch.float32, torch.float16), (True, False)
    ):
        inputs = _inputs(schema, sizes, dtype, with_optional)
        call = prepare(schema, inputs, ATTRS.get(op), cuda=False)
        shapes = [None if t is None else tuple(t.shape) for t in inputs]
        assert [tuple(o.shape) for o in call.outputs] == [tuple(s) for s in schema.infer_shapes(shapes, call.attrs)]
        assert [o.dtype for o in call.outputs] == schema.output_dtypes(dtype)
        assert all(call.dims[s] == v for s, v in sizes.items() if s in call.dims)
        # the caller's outputs are checked and returned as given, never reallocated
        again = prepare(schema, inputs, ATTRS.get(op), outputs=call.outputs, cuda=False)
        assert all(a is b for a, b in zip(again.outputs, call.outputs))


def _lstm(H=16, I=8, T=4, B=2):
    return [
        torch.rand(T, B, I),
        torch.rand(4 * H, I),
        torch.rand(4 * H, H),
        torch.rand(8 * H),
        torch.rand(B, H),
        torch.rand(B, H),
    ]


def test_a_wrong_input_is_named_not_the_one_sized_from_it():
    lstm = registry.get_schema("LSTMSeq")
    bad = _lstm()
    bad[2] = torch.rand(64, 17)  # R [4H, H] with H = 17 and 4H = 64: R is wrong, W [64, 8] is fine
    with pytest.raises(OpArgumentError, match=r"LSTMSeq: argument R: expected shape \[68, 17\], got \[64, 17\]"):
        prepare(lstm, bad, cuda=False)
    bad = _lstm()
    bad[1] = torch.rand(64, 9)
    with pytest.raises(OpArgumentError, match=r"LSTMSeq: argument W: expected shape \[64, 8\], got \[64, 9\]"):
        prepare(lstm, bad, cuda=False)
    # LiquidScan: xg [B, T, 4H] comes first but H is sized by R, so xg is checked after R
    liquid = registry.get_schema("LiquidScan")
    with pytest.raises(
        OpArgumentError, match=r"LiquidScan: argument xg: expected shape \[2, 5, 64\], got \[2, 5, 65\]"
    ):
        prepare(liquid, [torch.rand(2, 5, 65), torch.rand(64, 16), None], {"ts": 1.0}, cuda=False)
    with pytest.raises(OpArgumentError, match=r"LiquidScan: argument R: expected shape \[68, 17\], got \[64, 17\]"):
        prepare(liquid, [torch.rand(2, 5, 64), torch.rand(64, 17), None], {"ts": 1.0}, cuda=False)


def test_rank_dtype_contiguity_and_absence_errors_name_the_argument():
    lstm = registry.get_schema("LSTMSeq")
    cases = [
        (0, torch.rand(8), r"argument X: expected rank 3 \[T, B, I\], got shape \[8\]"),
        (4, torch.rand(32), r"argument h0: expected shape \[2, 16\], got \[32\]"),
        (2, torch.rand(64, 16).half(), r"argument R: expected dtype float32, got float16"),
        (4, torch.rand(2, 16).double(), r"argument h0: expected dtype float32, got float64"),
        (1, torch.rand(8, 64).t(), r"argument W: expected a contiguous"),
        (1, None, r"argument W is required but was None"),
        (1, [[1.0]], r"argument W must be a torch tensor"),
    ]
    for index, value, message in cases:
        bad = _lstm()
        bad[index] = value
        with pytest.raises(OpArgumentError, match="LSTMSeq: " + message):
            prepare(lstm, bad, cuda=False)
    with pytest.raises(OpArgumentError, match=r"LSTMSeq: argument X: storage dtype must be"):
        prepare(lstm, [t.double() for t in _lstm()], cuda=False)
    with pytest.raises(OpArgumentError, match=r"LSTMSeq: argument X: expected a CUDA tensor"):
        prepare(lstm, _lstm())
    with pytest.raises(SchemaError, match=r"LSTMSeq: got 1 inputs, expected 3 to 6"):
        prepare(lstm, _lstm()[:1], cuda=False)
    with pytest.raises(SchemaError, match=r"LSTMSeq: unknown attribute"):
        prepare(lstm, _lstm(), {"clip": 1.0}, cuda=False)


def test_outputs_are_checked_by_name():
    lstm = registry.get_schema("LSTMSeq")
    good = prepare(lstm, _lstm(), cuda=False).outputs
    with pytest.raises(OpArgumentError, match=r"LSTMSeq: expected 3 preallocated outputs \(Y, h_last, c_last\), got 2"):
        prepare(lstm, _lstm(), outputs=good[:2], cuda=False)
    with pytest.raises(
        OpArgumentError, match=r"LSTMSeq: argument output c_last: expected shape \[2, 16\], got \[2, 17\]"
    ):
        prepare(lstm, _lstm(), outputs=[good[0], good[1], torch.rand(2, 17)], cuda=False)
    with pytest.raises(OpArgumentError, match=r"LSTMSeq: argument output Y: expected dtype float32, got float16"):
        prepare(lstm, _lstm(), outputs=[good[0].half(), good[1], good[2]], cuda=False)


def test_float32_alternative_and_limits():
    attention = registry.get_schema("Attention")
    q, k, v = torch.rand(1, 4, 3, 32).half(), torch.rand(1, 2, 5, 32).half(), torch.rand(1, 2, 5, 32).half()
    from framefuse.plugins.attention.schema import check_shapes

    for mask in (torch.zeros(3, 5).half(), torch.zeros(3, 5)):  # storage dtype or float32
        prepare(attention, [q, k, v, mask], shape_rule=check_shapes, also_float32=("mask",), cuda=False)
    with pytest.raises(
        OpArgumentError, match=r"Attention: argument mask: expected dtype float16 or float32, got bfloat16"
    ):
        prepare(
            attention,
            [q, k, v, torch.zeros(3, 5).bfloat16()],
            shape_rule=check_shapes,
            also_float32=("mask",),
            cuda=False,
        )
    with pytest.raises(OpArgumentError, match=r"Attention: argument k: expected dtype float16, got float32"):
        prepare(attention, [q, k.float(), v, None], shape_rule=check_shapes, cuda=False)
    scan = registry.get_schema("SelectiveScan")
    x = torch.rand(1, 2, 3)
    inputs = [x, x, torch.rand(3, 300), torch.rand(1, 2, 300), torch.rand(1, 2, 300)]
    with pytest.raises(OpArgumentError, match=r"SelectiveScan: argument A: N=300 must be between 1 and 256"):
        prepare(scan, inputs, limits={"N": (1, 256)}, cuda=False)


def test_dims_are_validated_where_the_schema_is_written():
    assert parse_dim("4H") == (4, "H") and parse_dim("Dk") == (1, "Dk") and parse_dim(3) == (3, None)
    assert resolve_dims(("B", "4H", 2), {"B": 2, "H": 3}) == (2, 12, 2)
    assert resolve_dims(("B", "4H"), {"B": 2}) == (2, None)
    with pytest.raises(SchemaError, match=r"tensor x: dims \['B', 'T'\] do not have rank 3"):
        TensorSpec("x", 3, "T", dims=("B", "T"))
    with pytest.raises(SchemaError, match=r"symbolic dim 'H\*4' is not"):
        TensorSpec("x", 1, "T", dims=("H*4",))
