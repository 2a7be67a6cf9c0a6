"""CPU tests of the Attention, DeltaRuleScan and MLSTMScan definitions (schema, shape rules,
references) and of their kernels' compilation (nvcc, when present).

Each reference is checked against an independent formulation:
- Attention vs torch's F.scaled_dot_product_attention with the KV heads repeated;
- DeltaRuleScan ((I − βkkᵀ)S + βkvᵀ, S [Dk, Dv]) vs DeltaNet's error-correction form S − βk(Sᵀk − v)ᵀ;
- MLSTMScan (stabilised) vs the unstabilised recurrence (C̃ = e^f̃ C̃ + e^i v kᵀ, h = C̃q / max(|ñᵀq|, 1)),
  on inputs small enough not to overflow, with m_T from its closed form;
and the step form (T = 1, state carried) is checked to chain into the sequence form.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

from framefuse.errors import FrameFuseError

F64 = torch.float64


def seeded(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# Attention


def attention_inputs(gen, B, Hq, Hkv, Tq, Tk, Dh, mask_kind="none", dtype=F64):
    q = torch.randn(B, Hq, Tq, Dh, generator=gen, dtype=dtype)
    k = torch.randn(B, Hkv, Tk, Dh, generator=gen, dtype=dtype)
    v = torch.randn(B, Hkv, Tk, Dh, generator=gen, dtype=dtype)
    shape = {"none": None, "2d": (Tq, Tk), "b1": (B, 1, Tq, Tk), "bh": (B, Hq, Tq, Tk), "11": (1, 1, Tq, Tk)}[mask_kind]
    mask = None
    if shape is not None:
        mask = torch.randn(*shape, generator=gen, dtype=dtype)
        mask = mask.masked_fill(torch.rand(*shape, generator=gen) < 0.2, float("-inf"))
        mask[..., 0] = 0.0  # key 0 stays visible to every row (no fully masked row here)
    return q, k, v, mask


def sdpa_expected(q, k, v, mask, scale, causal):
    """torch's SDPA with the KV heads repeated (query head h reads KV head h // groups) and the
    causal rule written as a bottom-right-aligned lower triangle."""
    B, Hq, Tq, Dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    k_rep = k[:, :, None].expand(B, Hkv, groups, Tk, Dh).reshape(B, Hq, Tk, Dh)
    v_rep = v[:, :, None].expand(B, Hkv, groups, Tk, Dh).reshape(B, Hq, Tk, Dh)
    additive = torch.zeros(Tq, Tk, dtype=q.dtype) if mask is None else mask
    if causal:
        visible = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
        additive = additive + torch.zeros(Tq, Tk, dtype=q.dtype).masked_fill(~visible, float("-inf"))
    return F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=additive, scale=scale)


ATTENTION_CASES = [
    # B, Hq, Hkv, Tq, Tk, Dh, mask, causal
    (1, 4, 4, 1, 1, 64, "none", 0),
    (1, 4, 4, 1, 9, 64, "b1", 1),
    (2, 4, 2, 7, 7, 32, "none", 1),
    (2, 4, 2, 7, 7, 32, "2d", 0),
    (3, 6, 2, 5, 12, 16, "bh", 1),  # a chunk of queries against a longer cache
    (2, 2, 1, 9, 9, 8, "11", 1),
    (1, 8, 1, 16, 16, 24, "2d", 1),  # MQA
]


@pytest.mark.parametrize("B,Hq,Hkv,Tq,Tk,Dh,mask_kind,causal", ATTENTION_CASES)
def test_attention_reference_matches_sdpa(B, Hq, Hkv, Tq, Tk, Dh, mask_kind, causal):
    from framefuse.plugins.attention import reference

    q, k, v, mask = attention_inputs(seeded(B * 100 + Tq), B, Hq, Hkv, Tq, Tk, Dh, mask_kind)
    for scale in (None, 0.37):
        (o,) = reference(q, k, v, mask, scale=scale, causal=causal)
        expected = sdpa_expected(q, k, v, mask, 1 / math.sqrt(Dh) if scale is None else scale, causal)
        assert o.dtype == F64 and o.shape == q.shape
        torch.testing.assert_close(o, expected, rtol=1e-10, atol=1e-12)


def test_attention_reference_low_precision_dtypes():
    from framefuse.plugins.attention import reference

    q, k, v, mask = attention_inputs(seeded(1), 2, 4, 2, 6, 6, 32, "b1", dtype=torch.float32)
    (o32,) = reference(q, k, v, mask, causal=1)
    for dtype in (torch.float16, torch.bfloat16):
        (o,) = reference(q.to(dtype), k.to(dtype), v.to(dtype), mask.to(dtype), causal=1)
        assert o.dtype == dtype
        torch.testing.assert_close(o.float(), o32, rtol=0.05, atol=0.05)
    (o_mask32,) = reference(q.half(), k.half(), v.half(), mask, causal=1)  # float32 mask with fp16 storage
    assert o_mask32.dtype == torch.float16


def test_attention_fully_masked_rows_give_zero_not_nan():
    from framefuse.plugins.attention import reference

    q, k, v, _ = attention_inputs(seeded(2), 1, 2, 2, 6, 6, 8)
    mask = torch.zeros(1, 2, 6, 6, dtype=F64)
    mask[0, 1, 3, :] = float("-inf")
    (o,) = reference(q, k, v, mask)
    assert torch.equal(o[0, 1, 3], torch.zeros(8, dtype=F64))
    assert torch.isfinite(o).all()
    expected = sdpa_expected(q, k, v, mask, 1 / math.sqrt(8), 0)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 3] = False
    torch.testing.assert_close(o[0][keep], expected[0][keep])
    # causal with Tq > Tk: query i sees keys j <= i + (Tk - Tq) = i - 4, so rows 0..3 see nothing
    q, k, v, _ = attention_inputs(seeded(3), 1, 2, 2, 10, 6, 8)
    (o,) = reference(q, k, v, None, causal=1)
    assert torch.equal(o[:, :, :4], torch.zeros(1, 2, 4, 8, dtype=F64))
    (o_last,) = reference(q[:, :, 4:], k, v, None, causal=1)  # Tq = Tk: plain lower triangle
    torch.testing.assert_close(o[:, :, 4:], o_last)


def test_attention_nan_and_inf_propagate():
    from framefuse.plugins.attention import reference

    q, k, v, _ = attention_inputs(seeded(4), 1, 2, 1, 5, 5, 8)
    q[0, 1, 2, 0] = float("nan")
    v[0, 0, 0, 3] = float("inf")
    (o,) = reference(q, k, v, None, causal=1)
    assert torch.isnan(o[0, 1, 2]).all()
    assert torch.isnan(o).sum() == 8  # only that row
    assert torch.isposinf(o[0, 0, :, 3]).all() and torch.isposinf(o[0, 1, [0, 1, 3, 4], 3]).all()


def test_attention_step_form_is_the_last_row_of_the_sequence_form():
    """Bottom-right causal alignment: one query (or a chunk of the last queries) against all keys
    gives the last row(s) of the full causal attention."""
    from framefuse.plugins.attention import reference

    q, k, v, _ = attention_inputs(seeded(5), 2, 4, 2, 12, 12, 16)
    (full,) = reference(q, k, v, None, causal=1)
    (step,) = reference(q[:, :, -1:], k, v, None, causal=1)
    (chunk,) = reference(q[:, :, -5:], k, v, None, causal=1)
    torch.testing.assert_close(step, full[:, :, -1:])
    torch.testing.assert_close(chunk, full[:, :, -5:])


def test_attention_schema_and_shape_rule():
    from framefuse.plugins.attention import SCHEMA
    from framefuse.plugins.attention.schema import mask_layout

    assert SCHEMA.name == "Attention" and SCHEMA.domain == "framefuse"
    assert SCHEMA.input_names == ("q", "k", "v", "mask") and SCHEMA.output_names == ("o",)
    assert SCHEMA.attrs_with_defaults({}) == {"scale": None, "causal": 0}
    assert SCHEMA.output_dtypes(torch.bfloat16) == [torch.bfloat16]
    assert SCHEMA.infer_shapes([(2, 8, 5, 64), (2, 2, 9, 64), (2, 2, 9, 64), None], {}) == [(2, 8, 5, 64)]
    assert SCHEMA.infer_shapes([(2, 8, 5, 64), (2, 2, 9, 64), (2, 2, 9, 64), (5, 9)], {}) == [(2, 8, 5, 64)]
    # (batch stride, head stride) in elements; 0 = broadcast
    assert mask_layout((5, 9), 2, 8, 5, 9) == (0, 0)
    assert mask_layout((2, 1, 5, 9), 2, 8, 5, 9) == (45, 0)
    assert mask_layout((2, 8, 5, 9), 2, 8, 5, 9) == (360, 45)
    assert mask_layout((1, 8, 5, 9), 2, 8, 5, 9) == (0, 45)
    assert mask_layout((1, 1, 5, 9), 2, 8, 5, 9) == (0, 0)
    bad = [
        ([(2, 8, 5, 64), (2, 3, 9, 64), (2, 3, 9, 64), None], r"Hq=8 must be a multiple of KV heads Hkv=3"),
        ([(2, 8, 5, 64), (2, 2, 9, 64), (2, 2, 8, 64), None], r"key lengths of k, v disagree"),
        ([(2, 8, 5, 64), (2, 2, 9, 32), (2, 2, 9, 32), None], r"head dims of q, k, v disagree"),
        ([(2, 8, 5, 64), (2, 2, 9, 64), (2, 2, 9, 64), (5, 8)], r"input mask of shape \[5, 8\]"),
        ([(2, 8, 5, 64), (2, 2, 9, 64), (2, 2, 9, 64), (3, 1, 5, 9)], r"input mask of shape \[3, 1, 5, 9\]"),
        ([(2, 8, 5, 64), (2, 2, 9, 64), (2, 2, 9, 64), (2, 4, 5, 9)], r"input mask of shape \[2, 4, 5, 9\]"),
        ([(2, 8, 5, 64), (2, 2, 9, 64), (2, 2, 9, 64), (9,)], r"mask must have rank 2"),
        ([(2, 8, 5), (2, 2, 9, 64), (2, 2, 9, 64), None], r"input q must have rank 4"),
    ]
    for shapes, message in bad:
        with pytest.raises(FrameFuseError, match=r"^Attention: .*" + message):
            SCHEMA.infer_shapes(shapes, {})
    with pytest.raises(FrameFuseError, match=r"Attention: unknown attribute\(s\) window"):
        SCHEMA.attrs_with_defaults({"window": 3})


def test_attention_kernel_choice():
    from framefuse.plugins.attention.interface import kernel_name

    h100, turing = (9, 0), (7, 5)
    assert kernel_name(torch.float16, 64, 1, h100, True) == ("attention_decode_f16_d64", 1)
    assert kernel_name(torch.float32, 32, 1, h100, True) == ("attention_decode_f32_d32", 1)
    assert kernel_name(torch.bfloat16, 128, 32, h100, True) == ("attention_mma_bf16_d128", 64)
    assert kernel_name(torch.float16, 64, 4096, h100, False) == ("attention_simt_f16_d64", 32)
    assert kernel_name(torch.float16, 64, 32, turing, True) == ("attention_simt_f16_d64", 32)
    assert kernel_name(torch.float32, 64, 32, h100, True) == ("attention_simt_f32_d64", 32)


# ---------------------------------------------------------------------------------------------
# DeltaRuleScan


def delta_inputs(gen, B, H, T, Dk, Dv, dtype=F64, with_state=True):
    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)

    q = unit(torch.randn(B, H, T, Dk, generator=gen, dtype=dtype))
    k = unit(torch.randn(B, H, T, Dk, generator=gen, dtype=dtype))
    v = torch.randn(B, H, T, Dv, generator=gen, dtype=dtype)
    beta = torch.sigmoid(torch.randn(B, H, T, generator=gen, dtype=dtype))
    S0 = torch.randn(B, H, Dk, Dv, generator=gen, dtype=dtype) if with_state else None
    return q, k, v, beta, S0


def delta_error_correction_form(q, k, v, beta, S0):
    """DeltaNet as fla's naive recurrence writes it, S [Dk, Dv]: S ← S − β k (Sᵀk − v)ᵀ, o = Sᵀq (einsum)."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    S = torch.zeros(B, H, Dk, Dv, dtype=q.dtype) if S0 is None else S0.clone()
    outs = []
    for t in range(T):
        error = torch.einsum("bhkv,bhk->bhv", S, k[:, :, t]) - v[:, :, t]
        S = S - torch.einsum("bh,bhk,bhv->bhkv", beta[:, :, t], k[:, :, t], error)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
    return torch.stack(outs, dim=2), S


@pytest.mark.parametrize(
    "B,H,T,Dk,Dv,with_state",
    [
        (1, 1, 1, 4, 4, False),
        (2, 3, 9, 8, 8, True),
        (1, 2, 17, 16, 5, True),
        (3, 1, 6, 5, 12, False),
    ],
)
def test_delta_reference_matches_error_correction_form(B, H, T, Dk, Dv, with_state):
    from framefuse.plugins.delta_rule_scan import reference

    q, k, v, beta, S0 = delta_inputs(seeded(T), B, H, T, Dk, Dv, with_state=with_state)
    o, S_last = reference(q, k, v, beta, S0)
    o_exp, S_exp = delta_error_correction_form(q, k, v, beta, S0)
    assert o.dtype == F64 and S_last.dtype == torch.float32  # state outputs are float32 (OPS.md)
    assert o.shape == (B, H, T, Dv) and S_last.shape == (B, H, Dk, Dv)
    torch.testing.assert_close(o, o_exp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S_last, S_exp.float())


def test_delta_reference_writes_keys_it_is_given():
    """With β = 1 and a unit key, the state stores v exactly under k: Sᵀ k = v afterwards."""
    from framefuse.plugins.delta_rule_scan import reference

    q, k, v, _, S0 = delta_inputs(seeded(7), 1, 1, 1, 8, 6)
    beta = torch.ones(1, 1, 1, dtype=F64)
    o, S_last = reference(k, k, v, beta, S0)  # query = key: o reads back what was just written
    torch.testing.assert_close(o[0, 0, 0], v[0, 0, 0])
    torch.testing.assert_close(S_last[0, 0].double().T @ k[0, 0, 0], v[0, 0, 0], rtol=1e-6, atol=1e-6)


def test_delta_step_chaining_equals_sequence():
    from framefuse.plugins.delta_rule_scan import reference

    q, k, v, beta, S0 = delta_inputs(seeded(8), 2, 2, 11, 8, 6, dtype=torch.float32)
    o_seq, S_seq = reference(q, k, v, beta, S0)
    S, outs = S0, []
    for t in range(11):
        o_t, S = reference(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], beta[:, :, t : t + 1], S)
        outs.append(o_t)
    torch.testing.assert_close(torch.cat(outs, dim=2), o_seq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(S, S_seq, rtol=1e-6, atol=1e-6)


def test_delta_dtypes_and_nan():
    from framefuse.plugins.delta_rule_scan import reference

    q, k, v, beta, S0 = delta_inputs(seeded(9), 1, 2, 6, 4, 3, dtype=torch.float32)
    o, S = reference(q.half(), k.half(), v.half(), beta.half(), S0)
    assert o.dtype == torch.float16 and S.dtype == torch.float32
    v[0, 0, 2, 1] = float("nan")
    o, S = reference(q, k, v, beta, S0)
    assert torch.isnan(o[0, 0, 2:, 1]).all() and torch.isfinite(o[0, 0, :, [0, 2]]).all()
    assert torch.isnan(S[0, 0, :, 1]).all() and torch.isfinite(S[0, 1]).all()  # value index 1: a column of S


def test_delta_schema_and_shape_rule():
    from framefuse.plugins.delta_rule_scan import SCHEMA

    assert SCHEMA.name == "DeltaRuleScan"
    assert SCHEMA.input_names == ("q", "k", "v", "beta", "S0") and SCHEMA.output_names == ("o", "S_last")
    assert SCHEMA.output_dtypes(torch.float16) == [torch.float16, torch.float32]
    assert SCHEMA.infer_shapes([(2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 32), (2, 4, 7), None], {}) == [
        (2, 4, 7, 32),
        (2, 4, 16, 32),
    ]
    assert SCHEMA.infer_shapes([(2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 32), (2, 4, 7), (2, 4, 16, 32)], {})[1] == (
        2,
        4,
        16,
        32,
    )
    bad = [
        ([(2, 4, 7, 16), (2, 4, 7, 15), (2, 4, 7, 32), (2, 4, 7), None], r"key dims of q and k disagree"),
        ([(2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 32), (2, 4, 6), None], r"sequence lengths disagree"),
        ([(2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 32), (2, 4, 7), (2, 4, 32, 16)], r"input S0 must have shape"),
        ([(2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 32), (2, 4, 7, 1), None], r"input beta must have rank 3"),
    ]
    for shapes, message in bad:
        with pytest.raises(FrameFuseError, match=r"^DeltaRuleScan: .*" + message):
            SCHEMA.infer_shapes(shapes, {})


# ---------------------------------------------------------------------------------------------
# MLSTMScan


def mlstm_inputs(gen, B, H, T, Dk, Dv, dtype=F64, with_state=True):
    q = torch.randn(B, H, T, Dk, generator=gen, dtype=dtype)
    k = torch.randn(B, H, T, Dk, generator=gen, dtype=dtype) / math.sqrt(Dk)
    v = torch.randn(B, H, T, Dv, generator=gen, dtype=dtype)
    i_pre = torch.randn(B, H, T, generator=gen, dtype=dtype)
    f_pre = torch.randn(B, H, T, generator=gen, dtype=dtype) + 2.0
    states = [None, None, None]
    if with_state:
        states = [
            0.3 * torch.randn(B, H, Dv, Dk, generator=gen, dtype=dtype),
            0.3 * torch.randn(B, H, Dk, generator=gen, dtype=dtype),
            torch.randn(B, H, generator=gen, dtype=dtype),
        ]
    return [q, k, v, i_pre, f_pre, *states]


def mlstm_unstabilised(q, k, v, i_pre, f_pre, C0, n0, m0):
    """The mLSTM without the stabiliser: C̃_t = σ(f) C̃ + e^i v kᵀ, ñ_t = σ(f) ñ + e^i k,
    h_t = C̃ q / max(|ñᵀq|, 1) (the e^−m factors of the stabilised form cancel), starting from
    C̃_0 = e^{m_0} C_0, ñ_0 = e^{m_0} n_0. m_T in closed form: the largest of m_0 + Σ_{r≤T} f̃_r
    and i_s + Σ_{s<r≤T} f̃_r over s."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    m0 = torch.zeros(B, H, dtype=q.dtype) if m0 is None else m0
    C = (torch.zeros(B, H, Dv, Dk, dtype=q.dtype) if C0 is None else C0) * m0.exp()[..., None, None]
    n = (torch.zeros(B, H, Dk, dtype=q.dtype) if n0 is None else n0) * m0.exp()[..., None]
    forget = torch.sigmoid(f_pre)
    hs = []
    for t in range(T):
        C = forget[:, :, t, None, None] * C + torch.exp(i_pre[:, :, t])[..., None, None] * torch.einsum(
            "bhv,bhk->bhvk", v[:, :, t], k[:, :, t]
        )
        n = forget[:, :, t, None] * n + torch.exp(i_pre[:, :, t])[..., None] * k[:, :, t]
        num = torch.einsum("bhvk,bhk->bhv", C, q[:, :, t])
        den = torch.einsum("bhk,bhk->bh", n, q[:, :, t]).abs().clamp_min(1.0)
        hs.append(num / den[..., None])
    log_f = torch.log(forget)
    total = log_f.sum(-1)
    after = total[..., None] - log_f.cumsum(-1)  # Σ_{r>s} f̃_r for each s
    m_T = torch.maximum(m0 + total, (i_pre + after).amax(-1))
    scale = torch.exp(-m_T)
    return torch.stack(hs, dim=2), C * scale[..., None, None], n * scale[..., None], m_T


@pytest.mark.parametrize(
    "B,H,T,Dk,Dv,with_state",
    [
        (1, 1, 1, 4, 4, False),
        (2, 3, 9, 8, 8, True),
        (1, 2, 17, 16, 5, True),
        (3, 1, 6, 5, 12, False),
    ],
)
def test_mlstm_reference_matches_unstabilised_form(B, H, T, Dk, Dv, with_state):
    from framefuse.plugins.mlstm_scan import reference

    inputs = mlstm_inputs(seeded(T + 50), B, H, T, Dk, Dv, with_state=with_state)
    h, C, n, m = reference(*inputs)
    h_exp, C_exp, n_exp, m_exp = mlstm_unstabilised(*inputs)
    assert h.dtype == F64 and C.dtype == n.dtype == m.dtype == torch.float32
    assert (h.shape, C.shape, n.shape, m.shape) == ((B, H, T, Dv), (B, H, Dv, Dk), (B, H, Dk), (B, H))
    torch.testing.assert_close(h, h_exp, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(m, m_exp.float())
    torch.testing.assert_close(C, C_exp.float())
    torch.testing.assert_close(n, n_exp.float())


def test_mlstm_stabiliser_keeps_large_gates_finite():
    """Input gates of ~100 overflow e^i in float32; the stabilised reference stays finite."""
    from framefuse.plugins.mlstm_scan import reference

    inputs = mlstm_inputs(seeded(11), 1, 2, 8, 8, 8, dtype=torch.float32, with_state=False)
    inputs[3] = inputs[3] + 100.0
    h, C, n, m = reference(*inputs)
    assert torch.isfinite(h).all() and torch.isfinite(C).all() and torch.isfinite(n).all()
    assert (m > 99).all()


def test_mlstm_step_chaining_equals_sequence():
    from framefuse.plugins.mlstm_scan import reference

    inputs = mlstm_inputs(seeded(12), 2, 2, 10, 8, 6, dtype=torch.float32)
    h_seq, C_seq, n_seq, m_seq = reference(*inputs)
    C, n, m = inputs[5:]
    hs = []
    for t in range(10):
        h_t, C, n, m = reference(*[x[:, :, t : t + 1] for x in inputs[:5]], C, n, m)
        hs.append(h_t)
    torch.testing.assert_close(torch.cat(hs, dim=2), h_seq, rtol=1e-6, atol=1e-6)
    for a, b in zip((C, n, m), (C_seq, n_seq, m_seq)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_mlstm_dtypes_and_nan():
    from framefuse.plugins.mlstm_scan import reference

    inputs = mlstm_inputs(seeded(13), 1, 2, 6, 4, 3, dtype=torch.float32)
    h, *_ = reference(*[x.bfloat16() for x in inputs[:5]], *inputs[5:])
    assert h.dtype == torch.bfloat16
    inputs[4][0, 1, 3] = float("nan")  # a NaN forget gate poisons m, hence everything after it
    h, C, n, m = reference(*inputs)
    assert torch.isnan(h[0, 1, 3:]).all() and torch.isfinite(h[0, 1, :3]).all() and torch.isfinite(h[0, 0]).all()
    assert torch.isnan(m[0, 1]) and torch.isfinite(m[0, 0])


def test_mlstm_eps_matches_transformers_recurrent_step():
    """eps = 1e-6 (transformers' xLSTM) against transformers' own mlstm_recurrent_step_native, which
    keeps C as [Dk, Dv] (k⊗v), m as [B, H, 1] and scales q inside: the same recurrence in other
    layouts. Small gates make exp(−m_t) the larger side of the max, where eps matters most."""
    xlstm = pytest.importorskip("transformers.models.xlstm.modeling_xlstm")
    from framefuse.plugins.mlstm_scan import reference

    B, H, T, Dk, Dv, eps = 2, 3, 7, 8, 5, 1e-6
    q, k, v, i_pre, f_pre, C0, n0, m0 = mlstm_inputs(seeded(17), B, H, T, Dk, Dv)
    k = k * math.sqrt(Dk)  # transformers scales q instead; the products k·q are the same
    i_pre = i_pre - 20.0  # e^{i − m} tiny: |n·q| < exp(−m), the floor side of the max
    h, C, n, m = reference(q / math.sqrt(Dk), k, v, i_pre, f_pre, C0, n0, m0, eps=eps)
    C_t, n_t, m_t = C0.transpose(-1, -2), n0, m0[..., None]
    hs = []
    for t in range(T):
        h_t, (C_t, n_t, m_t) = xlstm.mlstm_recurrent_step_native(
            q[:, :, t],
            k[:, :, t],
            v[:, :, t],
            i_pre[:, :, t, None],
            f_pre[:, :, t, None],
            C_t,
            n_t,
            m_t,
            eps=eps,
            dtype_state=F64,
        )
        hs.append(h_t)
    torch.testing.assert_close(h, torch.stack(hs, dim=2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(C, C_t.transpose(-1, -2).float())
    torch.testing.assert_close(n, n_t.float())
    torch.testing.assert_close(m, m_t[..., 0].float())
    # eps is visible here (else the comparison would not test it): without it h differs.
    h0, *_ = reference(q / math.sqrt(Dk), k, v, i_pre, f_pre, C0, n0, m0)
    assert (h0 - h).abs().max() > 1e-9


def test_mlstm_eps_only_changes_the_readout():
    """eps enters h's denominator only: the states are bitwise those of eps = 0, eps = 0 is bitwise
    the call without it, and h is h(eps=0) · d / (d + eps) with d the eps-free denominator."""
    from framefuse.plugins.mlstm_scan import reference

    inputs = mlstm_inputs(seeded(18), 2, 2, 9, 6, 4, dtype=torch.float32)
    plain = reference(*inputs)
    zero = reference(*inputs, eps=0.0)
    with_eps = reference(*inputs, eps=0.5)
    for a, b in zip(plain, zero):
        assert torch.equal(a, b)
    for a, b in zip(plain[1:], with_eps[1:]):
        assert torch.equal(a, b)
    # d per step from the float64 reference: h(eps=0) = num / d, h(eps) = num / (d + eps).
    h64, *_ = reference(*[x.double() for x in inputs[:5]], *inputs[5:])
    h64_eps, *_ = reference(*[x.double() for x in inputs[:5]], *inputs[5:], eps=0.5)
    ratio = h64 / h64_eps  # (d + eps) / d, the same for every channel of a (b, h, t)
    assert (ratio > 1).all()
    torch.testing.assert_close(ratio.amax(-1), ratio.amin(-1))  # one denominator per (b, h, t)
    torch.testing.assert_close(with_eps[0], h64_eps.float())


def test_mlstm_schema_and_shape_rule():
    from framefuse.plugins.mlstm_scan import SCHEMA

    assert SCHEMA.name == "MLSTMScan"
    assert SCHEMA.input_names == ("q", "k", "v", "i_pre", "f_pre", "C0", "n0", "m0")
    assert SCHEMA.output_names == ("h", "C_last", "n_last", "m_last")
    assert SCHEMA.output_dtypes(torch.bfloat16) == [torch.bfloat16, torch.float32, torch.float32, torch.float32]
    assert SCHEMA.attrs_with_defaults(None) == {"eps": 0.0}
    assert SCHEMA.attrs_with_defaults({"eps": 1e-6}) == {"eps": 1e-6}
    seq = [(2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 32), (2, 4, 7), (2, 4, 7)]
    expected = [(2, 4, 7, 32), (2, 4, 32, 16), (2, 4, 16), (2, 4)]
    assert SCHEMA.infer_shapes(seq, {}) == expected
    assert SCHEMA.infer_shapes(seq + [(2, 4, 32, 16), (2, 4, 16), (2, 4)], {}) == expected
    bad = [
        (seq[:3] + [(2, 4, 6), (2, 4, 7)], r"sequence lengths disagree"),
        (seq + [(2, 4, 16, 32), None, None], r"input C0 must have shape \[2, 4, 32, 16\]"),
        (seq + [None, None, (2, 4, 1)], r"input m0 must have shape \[2, 4\]"),
        ([(2, 4, 7, 16), (2, 3, 7, 16)] + seq[2:], r"head counts disagree"),
    ]
    for shapes, message in bad:
        with pytest.raises(FrameFuseError, match=r"^MLSTMScan: .*" + message):
            SCHEMA.infer_shapes(shapes, {})


# ---------------------------------------------------------------------------------------------
# the GPU entries validate before touching the GPU


def test_launch_rejects_cpu_tensors_naming_op_and_argument():
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.registry import get_op

    q, k, v, _ = attention_inputs(seeded(14), 1, 2, 2, 3, 3, 32, dtype=torch.float32)
    with pytest.raises(OpArgumentError, match=r"^Attention: argument q: expected a CUDA tensor"):
        get_op("Attention").launch([q, k, v], {})
    with pytest.raises(FrameFuseError, match=r"^Attention: got 2 inputs, expected 3 to 4"):
        get_op("Attention").launch([q, k], {})
    dq, dk, dv, dbeta, dS0 = delta_inputs(seeded(15), 1, 1, 2, 4, 4, dtype=torch.float32)
    with pytest.raises(OpArgumentError, match=r"^DeltaRuleScan: argument q: expected a CUDA tensor"):
        get_op("DeltaRuleScan").launch([dq, dk, dv, dbeta, dS0], {})
    with pytest.raises(FrameFuseError, match=r"^DeltaRuleScan: unknown attribute"):
        get_op("DeltaRuleScan").launch([dq, dk, dv, dbeta, dS0], {"chunk": 4})
    m_inputs = mlstm_inputs(seeded(16), 1, 1, 2, 4, 4, dtype=torch.float32)
    with pytest.raises(OpArgumentError, match=r"^MLSTMScan: argument q: expected a CUDA tensor"):
        get_op("MLSTMScan").launch(m_inputs, {"eps": 1e-6})
    with pytest.raises(OpArgumentError, match=r"^MLSTMScan: attribute eps=nan must be finite"):
        get_op("MLSTMScan").launch(m_inputs, {"eps": float("nan")})


# ---------------------------------------------------------------------------------------------
# kernel compilation (nvcc, no GPU needed)

KERNEL_SOURCES = {
    "attention/attention.cu": [
        f"attention_{kind}_{dt}_d{dh}"
        for kind, dts in (
            ("simt", ("f32", "f16", "bf16")),
            ("decode", ("f32", "f16", "bf16")),
            ("mma", ("f16", "bf16")),
        )
        for dt in dts
        for dh in (32, 64, 128)
    ],
    "delta_rule_scan/delta_rule_scan.cu": [
        f"delta_rule_scan_{dt}_k{dk}" for dt in ("f32", "f16", "bf16") for dk in (32, 64, 128)
    ],
    "mlstm_scan/mlstm_scan.cu": [f"mlstm_scan_{dt}_k{dk}" for dt in ("f32", "f16", "bf16") for dk in (32, 64, 128)],
}


@pytest.mark.parametrize("source", sorted(KERNEL_SOURCES))
def test_kernels_compile_for_sm90_without_spills(source, tmp_path):
    from framefuse.plugins.build_kernels import find_nvcc
    from framefuse.plugins.cuda import PLUGINS_DIR

    nvcc = find_nvcc() or shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    proc = subprocess.run(
        [
            nvcc,
            "-arch=sm_90",
            "-cubin",
            "-std=c++17",
            "-w",
            "-Xptxas",
            "-v",
            "-o",
            str(tmp_path / "k.cubin"),
            str(PLUGINS_DIR / source),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    compiled = re.findall(r"Compiling entry function '(\w+)'", proc.stderr)
    assert sorted(compiled) == sorted(KERNEL_SOURCES[source])
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert len(spills) == len(compiled) and all(s == ("0", "0") for s in spills), proc.stderr
