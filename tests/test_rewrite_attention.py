"""Attention patterns → framefuse Attention: torch's SDPA export (plain, GQA, causal, masks),
hand-written attention, the step form's window attention, and the opset-23 Attention op."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper as oh

from framefuse.parity import compare
from framefuse.parity.runners import OnnxReferenceRunner
from framefuse.plugins.registry import OpUnavailableError, get_op
from framefuse.rewrite import rewrite_model

TOL = 1e-4
B, H, T, D = 2, 4, 6, 16


@pytest.fixture
def attention_op():
    try:
        return get_op("Attention")
    except OpUnavailableError as exc:
        pytest.skip(f"reference of Attention not available yet: {exc}")


def export(module, args, path):
    names = [f"in{i}" for i in range(len(args))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), args, str(path), dynamo=False, opset_version=17, input_names=names, output_names=["out"]
        )
    return path, {n: a.numpy() for n, a in zip(names, args)}


def fused_nodes(model, op="Attention"):
    return [n for n in model.graph.node if n.op_type == op and n.domain == "framefuse"]


def attrs_of(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class SDPA(torch.nn.Module):
    def __init__(self, *, causal=False, repeat=None, groups=1):
        super().__init__()
        self.causal, self.repeat, self.groups = causal, repeat, groups

    def forward(self, q, k, v, mask=None):
        if self.repeat == "interleave":
            k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
        elif self.repeat == "expand":  # HF's repeat_kv
            b, h, t, d = k.shape
            k = k[:, :, None].expand(b, h, self.groups, t, d).reshape(b, h * self.groups, t, d)
            v = v[:, :, None].expand(b, h, self.groups, t, d).reshape(b, h * self.groups, t, d)
        elif self.repeat == "tile":  # head h reads KV head h % Hkv: not the op's grouping
            k, v = k.repeat(1, self.groups, 1, 1), v.repeat(1, self.groups, 1, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)


def qkv(hkv=H, tq=T, tk=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, tq, D, generator=g),
        torch.randn(B, hkv, tk, D, generator=g),
        torch.randn(B, hkv, tk, D, generator=g),
    )


def check(path, feeds, fused):
    parity = compare(path, fused, inputs=feeds, tolerance=TOL)
    assert parity.passed, parity.summary()
    return parity


def test_plain_sdpa(tmp_path, attention_op):
    path, feeds = export(SDPA(), qkv(), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert [n.op_type for n in fused.graph.node] == ["Attention"]  # Shape/Sqrt/Mul/Softmax/MatMul all gone
    assert attrs_of(node)["scale"] == pytest.approx(1 / np.sqrt(D), rel=1e-6)
    assert attrs_of(node)["causal"] == 0
    assert len(node.input) == 3
    assert len(report.matches[0].removed) >= 5
    check(path, feeds, fused)


@pytest.mark.parametrize("repeat", ["interleave", "expand"])
def test_gqa_feeds_unrepeated_kv(tmp_path, attention_op, repeat):
    path, feeds = export(SDPA(repeat=repeat, groups=2), qkv(hkv=2), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    graph_inputs = [i.name for i in fused.graph.input]
    assert node.input[1] == graph_inputs[1] and node.input[2] == graph_inputs[2], "K/V must be the un-repeated inputs"
    assert report.matches[0].detail["kv_heads"] == 2
    assert not any(n.op_type in ("Tile", "Expand") for n in fused.graph.node)
    check(path, feeds, fused)


def test_tiled_heads_are_not_unrepeated(tmp_path, attention_op):
    path, feeds = export(SDPA(repeat="tile", groups=2), qkv(hkv=2), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert report.matches[0].detail["kv_heads"] == H  # repeated tensors passed, Hkv = Hq
    check(path, feeds, fused)


def test_multi_query_causal(tmp_path, attention_op):
    path, feeds = export(SDPA(repeat="interleave", groups=H, causal=True), qkv(hkv=1), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert attrs_of(node)["causal"] == 1 and report.matches[0].detail["kv_heads"] == 1
    check(path, feeds, fused)


def test_is_causal_becomes_attribute(tmp_path, attention_op):
    path, feeds = export(SDPA(causal=True), qkv(), tmp_path / "a.onnx")
    fused, _ = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert attrs_of(node)["causal"] == 1 and len(node.input) == 3
    assert not any(n.op_type in ("Trilu", "Where") for n in fused.graph.node)
    check(path, feeds, fused)


def test_top_left_causal_with_fewer_queries_keeps_mask(tmp_path, attention_op):
    # torch's is_causal aligns top-left; with Tq < Tk that is not the op's bottom-right causal.
    path, feeds = export(SDPA(causal=True), qkv(tq=2, tk=T), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert attrs_of(node)["causal"] == 0 and len(node.input) == 4
    check(path, feeds, fused)


def test_float_mask_input(tmp_path, attention_op):
    path, feeds = export(SDPA(), qkv() + (torch.randn(T, T),), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert node.input[3] == "in3"
    check(path, feeds, fused)


def test_bool_mask_input(tmp_path, attention_op):
    mask = torch.rand(T, T) > 0.3
    mask[:, 0] = True  # no fully masked row
    path, feeds = export(SDPA(), qkv() + (mask,), tmp_path / "a.onnx")
    fused, _ = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert len(node.input) == 4
    assert not any(n.op_type in ("IsNaN", "Softmax") for n in fused.graph.node)
    check(path, feeds, fused)


def test_fully_masked_row_gives_zero_like_torch(tmp_path, attention_op):
    mask = torch.ones(T, T, dtype=torch.bool)
    mask[2] = False  # row 2 sees nothing: torch's export zeroes it (Where(IsNaN)), the op gives 0
    path, feeds = export(SDPA(), qkv() + (mask,), tmp_path / "a.onnx")
    fused, _ = rewrite_model(path)
    assert len(fused_nodes(fused)) == 1
    check(path, feeds, fused)


class HandWritten(torch.nn.Module):
    """Per-head projections, explicit q @ kᵀ / √d, masked_fill, softmax, @ v — no SDPA."""

    def __init__(self, softmax_dim=-1, scale_input=False):
        super().__init__()
        self.proj = torch.nn.Linear(D, 3 * D)
        self.softmax_dim, self.scale_input = softmax_dim, scale_input

    def forward(self, x, keep, scale=None):
        q, k, v = self.proj(x).chunk(3, dim=-1)  # [B, T, D] each: rank-3 attention
        s = q @ k.transpose(-1, -2)
        s = s * scale if self.scale_input else s / (D**0.5)
        s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=self.softmax_dim) @ v


def test_hand_written_rank3_masked_fill(tmp_path, attention_op):
    keep = torch.tril(torch.ones(T, T, dtype=torch.bool))
    path, feeds = export(HandWritten(), (torch.randn(B, T, D), keep), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert attrs_of(node)["scale"] == pytest.approx(1 / np.sqrt(D), rel=1e-6)
    check(path, feeds, fused)


def test_softmax_over_other_axis_declined(tmp_path):
    keep = torch.ones(T, T, dtype=torch.bool)
    path, _ = export(HandWritten(softmax_dim=-2), (torch.randn(B, T, D), keep), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    assert not fused_nodes(fused)
    assert len(report.declined) == 1 and "axis" in report.declined[0].reason


def test_runtime_scale_declined(tmp_path):
    keep = torch.ones(T, T, dtype=torch.bool)
    path, _ = export(
        HandWritten(scale_input=True), (torch.randn(B, T, D), keep, torch.tensor(0.3)), tmp_path / "a.onnx"
    )
    fused, report = rewrite_model(path)
    assert not fused_nodes(fused)
    assert "scale" in report.declined[0].reason and "constant" in report.declined[0].reason


class ProbsToo(torch.nn.Module):
    def forward(self, q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1)
        return p @ v, p


def test_probabilities_used_elsewhere_declined(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            ProbsToo(),
            qkv(),
            str(tmp_path / "a.onnx"),
            dynamo=False,
            opset_version=17,
            input_names=["q", "k", "v"],
            output_names=["o", "p"],
        )
    fused, report = rewrite_model(tmp_path / "a.onnx")
    assert not fused_nodes(fused)
    assert "probabilities" in report.declined[0].reason


def test_classifier_softmax_is_not_a_candidate(tmp_path):
    path, _ = export(
        torch.nn.Sequential(torch.nn.Linear(D, 5), torch.nn.Softmax(dim=-1)), (torch.randn(B, D),), tmp_path / "a.onnx"
    )
    fused, report = rewrite_model(path)
    assert not report.matches and not report.declined


class WindowStep(torch.nn.Module):
    """The step form's attention: one query against a sliding KV window with a valid mask [B, W]
    (1.0 where the slot holds a frame), as the zoo's attention step form computes it."""

    def forward(self, q, k_new, v_new, k_cache, v_cache, valid):
        k_cache = torch.cat([k_cache[:, :, 1:], k_new], dim=2)
        v_cache = torch.cat([v_cache[:, :, 1:], v_new], dim=2)
        valid = torch.cat([valid[:, 1:], torch.ones_like(valid[:, :1])], dim=1)
        mask = torch.where(valid > 0.5, torch.zeros_like(valid), torch.full_like(valid, float("-inf")))
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask[:, None, None, :])
        return o, k_cache, v_cache, valid


def test_step_form_window_attention(tmp_path, attention_op):
    W = 8
    g = torch.Generator().manual_seed(1)
    args = (
        torch.randn(B, H, 1, D, generator=g),
        torch.randn(B, H, 1, D, generator=g),
        torch.randn(B, H, 1, D, generator=g),
        torch.randn(B, H, W, D, generator=g),
        torch.randn(B, H, W, D, generator=g),
        (torch.arange(W) >= 5).float().expand(B, W).contiguous(),
    )
    names = ["q", "k_new", "v_new", "k_cache", "v_cache", "valid"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            WindowStep(),
            args,
            str(tmp_path / "s.onnx"),
            dynamo=False,
            opset_version=17,
            input_names=names,
            output_names=["o", "k_next", "v_next", "valid_next"],
        )
    fused, report = rewrite_model(tmp_path / "s.onnx")
    (node,) = fused_nodes(fused)
    assert len(node.input) == 4, "the valid mask must reach the node as its mask input"
    assert "input" in report.matches[0].detail["mask"]
    parity = compare(tmp_path / "s.onnx", fused, inputs={n: a.numpy() for n, a in zip(names, args)}, tolerance=TOL)
    assert parity.passed, parity.summary()


# --- opset-23 Attention -------------------------------------------------------------------


def onnx_attention_model(*, rank=4, causal=0, mask=None, past=0, hq=4, hkv=2, tq=5, tk=5, dh=8):
    b = 1
    if rank == 4:
        shapes = [[b, hq, tq, dh], [b, hkv, tk, dh], [b, hkv, tk, dh]]
        y_shape = [b, hq, tq, dh]
    else:
        shapes = [[b, tq, hq * dh], [b, tk, hkv * dh], [b, tk, hkv * dh]]
        y_shape = [b, tq, hq * dh]
    inputs = [oh.make_tensor_value_info(n, TP.FLOAT, s) for n, s in zip("QKV", shapes)]
    names = ["Q", "K", "V", ""]
    if mask is not None:
        inputs.append(oh.make_tensor_value_info("M", mask, [tq, tk + past]))
        names[3] = "M"
    outputs = [oh.make_tensor_value_info("Y", TP.FLOAT, y_shape)]
    if past:
        inputs += [oh.make_tensor_value_info(n, TP.FLOAT, [b, hkv, past, dh]) for n in ("PK", "PV")]
        names += ["PK", "PV"]
        outputs += [oh.make_tensor_value_info(n, TP.FLOAT, [b, hkv, past + tk, dh]) for n in ("present_k", "present_v")]
    attrs = {"is_causal": causal}
    if rank == 3:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    node = oh.make_node("Attention", names, [o.name for o in outputs], name="onnx_attention", **attrs)
    model = oh.make_model(oh.make_graph([node], "g", inputs, outputs), opset_imports=[oh.make_opsetid("", 23)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"causal": 1},
        {"mask": TP.FLOAT},
        {"mask": TP.BOOL},
        {"rank": 3},
        {"past": 3, "causal": 1},
        {"causal": 1, "tq": 2, "tk": 5},
        {"hkv": 4, "mask": TP.FLOAT, "causal": 1},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain",
)
def test_opset23_attention(attention_op, kwargs):
    model = onnx_attention_model(**kwargs)
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused_nodes(fused)] == ["Attention"]
    assert not any(n.op_type == "Attention" and n.domain in ("", "ai.onnx") for n in fused.graph.node)
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TP.BOOL:
            m = rng.random(shape) > 0.3
            m[..., 0] = True
            feeds[vi.name] = m
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    # Oracle: numpy of the ONNX spec (onnx.reference), independent of ONNX Runtime's kernel.
    parity = compare(OnnxReferenceRunner(model), fused, inputs=feeds, tolerance=TOL)
    assert parity.passed, parity.summary()


def test_opset23_softcap_declined():
    model = onnx_attention_model()
    model.graph.node[0].attribute.append(oh.make_attribute("softcap", 5.0))
    fused, report = rewrite_model(model)
    assert not fused_nodes(fused)
    assert "softcap" in report.declined[0].reason


class TorchMHA(torch.nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.causal = causal

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        return self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]


@pytest.mark.parametrize("causal", [False, True])
def test_nn_multihead_attention(tmp_path, attention_op, causal):
    path, feeds = export(TorchMHA(causal), (torch.randn(B, 7, 32),), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert attrs_of(node)["causal"] == int(causal) and len(node.input) == 3
    assert report.matches[0].detail["q"] == [B, 4, 7, 8]
    check(path, feeds, fused)


class WideSoftmax(torch.nn.Module):
    """Softmax in float64 between casts (how mixed-precision code keeps the softmax accurate)."""

    def forward(self, q, k, v, key_padding):
        s = (q @ k.transpose(-1, -2)) * 0.25 + key_padding[:, None, None, :]  # mask [B, 1, 1, Tk]
        return torch.softmax(s.double(), dim=-1).float() @ v


def test_casts_around_softmax_and_key_padding_mask(tmp_path, attention_op):
    pad = torch.zeros(B, T)
    pad[0, -2:] = float("-inf")
    path, feeds = export(WideSoftmax(), qkv() + (pad,), tmp_path / "a.onnx")
    fused, report = rewrite_model(path)
    (node,) = fused_nodes(fused)
    assert not any(n.op_type in ("Cast", "Softmax") for n in fused.graph.node)
    assert report.matches[0].detail["mask"].endswith(f"expanded to [{B}, 1, {T}, {T}]")
    check(path, feeds, fused)
