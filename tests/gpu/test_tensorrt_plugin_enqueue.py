"""The TensorRT plugins' enqueue core on the GPU, without TensorRT (its wheels are not on the GPU
machine): ``tensorrt_plugins.enqueue_core`` gets raw device pointers, shapes, dtypes and a CUDA
stream handle, exactly what ``IPluginV3OneRuntime.enqueue`` receives, and must write the op's
outputs into the given buffers, matching the op's plain-loop reference."""

from __future__ import annotations

import pytest
import torch

from framefuse.plugins import registry
from framefuse.plugins import tensorrt_plugins as tp

pytestmark = pytest.mark.gpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# Looser than the ops' own kernel tests (tests/gpu/test_<op>.py pin each kernel's accuracy): this
# test is about the pointer/shape/dtype/stream plumbing, which is either exact or grossly wrong.
RTOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}

B, T, D, N, H, DK, DV = 2, 5, 8, 4, 2, 8, 8
RNN_I, RNN_H = 6, 8
# required input shapes of each op (test data; the ops' shape rules are checked by enqueue_core)
SHAPES = {
    "LinearScan": {"a": (B, T, D), "b": (B, T, D)},
    "SelectiveScan": {"x": (B, T, D), "dt": (B, T, D), "A": (D, N), "B": (B, T, N), "C": (B, T, N)},
    "LSTMSeq": {"X": (T, B, RNN_I), "W": (4 * RNN_H, RNN_I), "R": (4 * RNN_H, RNN_H)},
    "GRUSeq": {"X": (T, B, RNN_I), "W": (3 * RNN_H, RNN_I), "R": (3 * RNN_H, RNN_H)},
    "Attention": {"q": (B, H, T, DK), "k": (B, H, T, DK), "v": (B, H, T, DK)},
    "DeltaRuleScan": {"q": (B, H, T, DK), "k": (B, H, T, DK), "v": (B, H, T, DV), "beta": (B, H, T)},
    "MLSTMScan": {"q": (B, H, T, DK), "k": (B, H, T, DK), "v": (B, H, T, DV), "i_pre": (B, H, T), "f_pre": (B, H, T)},
    "LiquidScan": {"xg": (B, T, 4 * RNN_H), "R": (4 * RNN_H, RNN_H)},
    "WKVScan": {"k": (B, T, D), "v": (B, T, D), "w": (D,), "u": (D,)},
    "GatedDeltaRuleScan": {
        "q": (B, H, T, DK),
        "k": (B, H, T, DK),
        "v": (B, H, T, DV),
        "g": (B, H, T),
        "beta": (B, H, T),
    },
}


def _value(op_type: str, name: str, shape, gen) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen) * 0.5
    if name in ("A", "w", "g"):
        return -x.abs() - 0.1  # decays: negative log rates
    if name in ("a", "beta"):
        return torch.rand(*shape, generator=gen) * 0.9 + 0.05  # gates in (0, 1)
    if name == "k" and op_type in ("DeltaRuleScan", "GatedDeltaRuleScan"):
        return torch.nn.functional.normalize(x, dim=-1)  # the delta rule expects unit keys
    return x


def test_every_op_has_shapes_here():
    assert set(SHAPES) == set(registry.OP_TYPES)


@pytest.mark.parametrize("dtype", DTYPES, ids=[DTYPE_IDS[d] for d in DTYPES])
@pytest.mark.parametrize("op_type", registry.OP_TYPES)
def test_enqueue_core_matches_reference(op_type, dtype, kc):
    op = registry.get_op(op_type)
    schema = op.SCHEMA
    gen = torch.Generator().manual_seed(7)
    inputs = []
    for spec in schema.inputs[: len(SHAPES[op_type])]:
        dt = dtype if spec.dtype == "T" else torch.float32
        inputs.append(_value(op_type, spec.name, SHAPES[op_type][spec.name], gen).to(dt).cuda().contiguous())
    attrs = schema.attrs_with_defaults({})
    in_shapes = [tuple(t.shape) for t in inputs]
    out_shapes = tp.output_shapes(op_type, in_shapes, attrs)
    out_dtypes = tp.output_dtypes(op_type, [t.dtype for t in inputs])
    outputs = [kc.poisoned_like(inputs[0], dtype=getattr(torch, d), shape=s) for s, d in zip(out_shapes, out_dtypes)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    views = tp.enqueue_core(
        op_type,
        attrs,
        [t.data_ptr() for t in inputs],
        in_shapes,
        [t.dtype for t in inputs],
        [t.data_ptr() for t in outputs],
        out_shapes,
        out_dtypes,
        stream.cuda_stream,
    )
    stream.synchronize()
    # the kernel wrote into the buffers TensorRT would own (no copies)
    assert [v.data_ptr() for v in views] == [t.data_ptr() for t in outputs]
    kwargs = {k: v for k, v in attrs.items() if v is not None}
    expected = op.reference(*[t.float() for t in inputs], **kwargs)
    for spec, got, want in zip(schema.outputs, outputs, expected):
        kc.assert_close(got, want.to(got.dtype), RTOL[dtype], name=f"{op_type}.{spec.name}")


def test_enqueue_core_with_optional_state_input(kc):
    gen = torch.Generator().manual_seed(3)
    a = (torch.rand(B, T, D, generator=gen) * 0.9).cuda()
    b = torch.randn(B, T, D, generator=gen).cuda()
    h0 = torch.randn(B, D, generator=gen).cuda()
    h, h_last = torch.empty_like(b), torch.empty(B, D, device="cuda")
    tp.enqueue_core(
        "LinearScan",
        {},
        [a.data_ptr(), b.data_ptr(), h0.data_ptr()],
        [(B, T, D), (B, T, D), (B, D)],
        ["float32"] * 3,
        [h.data_ptr(), h_last.data_ptr()],
        [(B, T, D), (B, D)],
        ["float32"] * 2,
        torch.cuda.current_stream().cuda_stream,
    )
    torch.cuda.synchronize()
    ref_h, ref_last = registry.get_op("LinearScan").reference(a, b, h0)
    kc.assert_close(h, ref_h, 1e-5, name="h")
    kc.assert_close(h_last, ref_last, 1e-5, name="h_last")


def test_enqueue_core_places_present_inputs_by_the_mask(kc):
    """mamba's step form as a plugin layer gets x, dt, A, B, C and h0 (no D, z, dt_bias) and the
    mask that places h0 at its schema position (engines/tensorrt.packed_plugin_inputs)."""
    gen = torch.Generator().manual_seed(5)
    shapes = {**SHAPES["SelectiveScan"], "h0": (B, D, N)}
    given = [_value("SelectiveScan", name, shape, gen).cuda() for name, shape in shapes.items()]
    mask = tp.presence_mask(["x", "dt", "A", "B", "C", "", "", "", "h0"])
    y, h_last = torch.full((B, T, D), float("nan"), device="cuda"), torch.full((B, D, N), float("nan"), device="cuda")
    tp.enqueue_core(
        "SelectiveScan",
        {},
        [t.data_ptr() for t in given],
        [tuple(t.shape) for t in given],
        ["float32"] * len(given),
        [y.data_ptr(), h_last.data_ptr()],
        [(B, T, D), (B, D, N)],
        ["float32"] * 2,
        torch.cuda.current_stream().cuda_stream,
        present=mask,
    )
    torch.cuda.synchronize()
    x, dt, A, Bm, Cm, h0 = given
    ref_y, ref_last = registry.get_op("SelectiveScan").reference(x, dt, A, Bm, Cm, None, None, None, h0)
    kc.assert_close(y, ref_y, 1e-5, name="y")
    kc.assert_close(h_last, ref_last, 1e-5, name="h_last")
