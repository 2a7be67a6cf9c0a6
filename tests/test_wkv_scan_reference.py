"""CPU tests of the WKVScan definition: schema and shape rule, the reference against transformers'
own `rwkv_linear_attention_cpu` (the formulation the op is defined to reproduce) and against the
unstabilised closed form (y_t = Σ_i e^{w(t−1−i)+k_i} v_i + e^{u+k_t} v_t over the same sum of weights),
NaN propagation, the step form chaining into the sequence form, and the ONNX Runtime bridge."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from framefuse.plugins.registry import get_op
from framefuse.plugins.schema import SchemaError
from framefuse.plugins.wkv_scan.schema import MAX_INIT

WKV = get_op("WKVScan")
rwkv = pytest.importorskip("transformers.models.rwkv.modeling_rwkv")


def inputs(B, T, C, seed=0, dtype=torch.float32, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    k = (torch.randn(B, T, C, generator=gen) * scale).to(dtype)
    v = torch.randn(B, T, C, generator=gen).to(dtype)
    time_decay = torch.randn(C, generator=gen)
    u = torch.randn(C, generator=gen)
    return k, v, time_decay, u


@pytest.mark.parametrize("B,T,C", [(1, 1, 1), (2, 16, 64), (3, 37, 5)])
def test_reference_is_transformers_cpu_path_exactly(B, T, C):
    k, v, time_decay, u = inputs(B, T, C)
    y_hf, (num, den, mx) = rwkv.rwkv_linear_attention_cpu(time_decay, u, k, v, return_state=True)
    y, num_l, den_l, max_l = WKV.reference(k, v, -torch.exp(time_decay), u)
    # Same operations in the same order in float32: bit-identical.
    assert torch.equal(y, y_hf)
    assert torch.equal(num_l, num) and torch.equal(den_l, den) and torch.equal(max_l, mx)


def test_reference_with_state_matches_transformers():
    k, v, time_decay, u = inputs(2, 9, 7, seed=1)
    gen = torch.Generator().manual_seed(5)
    state = [torch.rand(2, 7, generator=gen), torch.rand(2, 7, generator=gen) + 0.5, torch.randn(2, 7, generator=gen)]
    y_hf, st_hf = rwkv.rwkv_linear_attention_cpu(time_decay, u, k, v, state=[s.clone() for s in state])
    y, *st = WKV.reference(k, v, -torch.exp(time_decay), u, *state)
    assert torch.equal(y, y_hf)
    for a, b in zip(st, st_hf):
        assert torch.equal(a, b)


def test_reference_matches_unstabilised_closed_form_float64():
    B, T, C = 2, 12, 6
    k, v, time_decay, u = (x.double() for x in inputs(B, T, C, seed=2, scale=1.0))
    w = -torch.exp(time_decay)
    y, num, den, mx = WKV.reference(k, v, w, u)
    assert y.dtype == torch.float64
    for t in range(T):
        i = torch.arange(t, dtype=torch.float64)
        weights = torch.exp(w[None, :] * (t - 1 - i)[:, None] + k[:, :t])  # [B, t, C]
        bonus = torch.exp(u + k[:, t])
        expected = ((weights * v[:, :t]).sum(1) + bonus * v[:, t]) / (weights.sum(1) + bonus)
        torch.testing.assert_close(y[:, t], expected, rtol=1e-10, atol=1e-12)
    # The stabilised state is the true state scaled by e^{−max}.
    i = torch.arange(T, dtype=torch.float64)
    weights = torch.exp(w[None, :] * (T - 1 - i)[:, None] + k)
    torch.testing.assert_close(num.double() * torch.exp(mx.double()), (weights * v).sum(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(den.double() * torch.exp(mx.double()), weights.sum(1), rtol=1e-5, atol=1e-6)


def test_large_keys_stay_finite():
    k, v, time_decay, u = inputs(1, 20, 8, seed=3)
    k = k * 100.0  # e^{k} alone would overflow float32
    y, num, den, mx = WKV.reference(k, v, -torch.exp(time_decay), u)
    assert torch.isfinite(y).all() and torch.isfinite(num).all() and torch.isfinite(den).all()


def test_step_form_chains_into_sequence_form():
    k, v, time_decay, u = inputs(2, 10, 9, seed=4)
    w = -torch.exp(time_decay)
    y_full, *last_full = WKV.reference(k, v, w, u)
    state = [None, None, None]
    ys = []
    for t in range(10):
        y_t, *state = WKV.reference(k[:, t : t + 1], v[:, t : t + 1], w, u, *state)
        ys.append(y_t)
    assert torch.equal(torch.cat(ys, 1), y_full)
    for a, b in zip(state, last_full):
        assert torch.equal(a, b)


def test_default_states_are_transformers_start():
    k, v, time_decay, u = inputs(2, 4, 3, seed=6)
    w = -torch.exp(time_decay)
    zeros = torch.zeros(2, 3)
    explicit = WKV.reference(k, v, w, u, zeros, zeros, torch.full((2, 3), MAX_INIT))
    for a, b in zip(WKV.reference(k, v, w, u), explicit):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_storage_computes_in_float32(dtype):
    k, v, time_decay, u = inputs(2, 8, 4, seed=7, dtype=dtype)
    y, num, den, mx = WKV.reference(k, v, -torch.exp(time_decay), u)
    y32, num32, *_ = WKV.reference(k.float(), v.float(), -torch.exp(time_decay), u)
    assert y.dtype == dtype and num.dtype == torch.float32
    assert torch.equal(y, y32.to(dtype)) and torch.equal(num, num32)


def test_nan_propagates_like_torch_maximum():
    k, v, time_decay, u = inputs(1, 5, 4, seed=8)
    k[0, 2, 1] = float("nan")
    y, num, den, mx = WKV.reference(k, v, -torch.exp(time_decay), u)
    y_hf, _ = rwkv.rwkv_linear_attention_cpu(time_decay, u, k, v)
    assert torch.isnan(y[0, 2:, 1]).all() and torch.isnan(mx[0, 1])
    assert torch.isfinite(y[0, :, [0, 2, 3]]).all() and torch.isfinite(y[0, :2, 1]).all()
    assert torch.equal(torch.isnan(y), torch.isnan(y_hf))


def test_schema_shapes_and_errors():
    schema = WKV.SCHEMA
    assert schema.name == "WKVScan" and schema.domain == "framefuse"
    assert schema.input_names == ("k", "v", "w", "u", "num0", "den0", "max0")
    assert schema.required_inputs == ("k", "v", "w", "u")
    assert schema.infer_shapes([(2, 5, 7), (2, 5, 7), (7,), (7,), None, None, None], {}) == [
        (2, 5, 7),
        (2, 7),
        (2, 7),
        (2, 7),
    ]
    with pytest.raises(SchemaError, match="WKVScan.*channel counts"):
        schema.infer_shapes([(2, 5, 7), (2, 5, 7), (6,), (7,)], {})
    with pytest.raises(SchemaError, match=r"WKVScan: input den0 must have shape \[B, C\] = \[2, 7\], got \[7\]"):
        schema.infer_shapes([(2, 5, 7), (2, 5, 7), (7,), (7,), None, (7,), None], {})
    with pytest.raises(SchemaError, match="WKVScan.*sequence lengths"):
        schema.infer_shapes([(2, 5, 7), (2, 4, 7), (7,), (7,)], {})


def test_runs_through_onnx_runtime_bridge():
    pytest.importorskip("onnxruntime_extensions")
    from framefuse.plugins.ort_bridge import ort_session

    B, T, C = 2, 6, 5
    k, v, time_decay, u = inputs(B, T, C, seed=9)
    w = -torch.exp(time_decay)
    node = helper.make_node(
        "WKVScan", ["k", "v", "w", "u", "", "", "max0"], ["y", "num", "den", "mx"], domain="framefuse"
    )
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "wkv",
        [
            helper.make_tensor_value_info(n, f, s)
            for n, s in (("k", [B, T, C]), ("v", [B, T, C]), ("w", [C]), ("u", [C]), ("max0", [B, C]))
        ],
        [
            helper.make_tensor_value_info(n, f, s)
            for n, s in (("y", [B, T, C]), ("num", [B, C]), ("den", [B, C]), ("mx", [B, C]))
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)])
    onnx.checker.check_model(model)
    max0 = torch.randn(B, C)
    sess = ort_session(model)
    got = sess.run(None, {"k": k.numpy(), "v": v.numpy(), "w": w.numpy(), "u": u.numpy(), "max0": max0.numpy()})
    expected = WKV.reference(k, v, w, u, None, None, max0)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b.numpy())
