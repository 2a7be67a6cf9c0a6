"""CPU tests of the GatedDeltaRuleScan definition: schema and shape rule; the reference against
transformers' own Qwen3-Next `torch_recurrent_gated_delta_rule` (decay, then the error-correction
update, written with sums over broadcast products); against DeltaRuleScan (the same state layout)
when g = 0; the decay applied before the update (one gated step = one un-gated step from
exp(g)·S0); step-form chaining; half storage; NaN locality; the ONNX Runtime bridge."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from framefuse.plugins.registry import get_op
from framefuse.plugins.schema import SchemaError

GD = get_op("GatedDeltaRuleScan")
DELTA = get_op("DeltaRuleScan")
F64 = torch.float64


def inputs(B, H, T, Dk, Dv, seed=0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dk, generator=gen, dtype=F64)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, Dk, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=gen, dtype=F64)
    g = -torch.rand(B, H, T, generator=gen, dtype=F64) * 2.0
    beta = torch.rand(B, H, T, generator=gen, dtype=F64)
    return tuple(x.to(dtype) for x in (q, k, v, g, beta))


@pytest.mark.parametrize("B,H,T,Dk,Dv", [(1, 1, 1, 1, 1), (2, 3, 16, 16, 8), (1, 2, 23, 5, 7)])
def test_reference_matches_transformers_qwen3_next(B, H, T, Dk, Dv):
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    q, k, v, g, beta = inputs(B, H, T, Dk, Dv, seed=T)
    gen = torch.Generator().manual_seed(99)
    S0 = torch.randn(B, H, Dk, Dv, generator=gen, dtype=F64)

    def seq_major(x):  # transformers takes [B, T, H, ...]
        return x.transpose(1, 2).contiguous()

    o_hf, S_hf = qwen.torch_recurrent_gated_delta_rule(
        seq_major(q),
        seq_major(k),
        seq_major(v),
        seq_major(g),
        seq_major(beta),
        initial_state=S0,
        output_final_state=True,
    )
    # transformers scales q by 1/√Dk inside; the op takes q already scaled (done in the graph).
    o, S = GD.reference(q / Dk**0.5, k, v, g, beta, S0)
    torch.testing.assert_close(o.float(), o_hf.transpose(1, 2).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_hf.float(), rtol=1e-5, atol=1e-5)


def test_zero_decay_is_delta_rule():
    """Both ops keep S as [Dk, Dv]: with g = 0 the gated rule is the plain one, state and all."""
    q, k, v, g, beta = inputs(2, 2, 11, 6, 4, seed=1)
    gen = torch.Generator().manual_seed(3)
    S0 = torch.randn(2, 2, 6, 4, generator=gen, dtype=F64)
    o, S = GD.reference(q, k, v, torch.zeros_like(g), beta, S0)
    o_d, S_d = DELTA.reference(q, k, v, beta, S0)
    torch.testing.assert_close(o, o_d, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_d, rtol=1e-6, atol=1e-6)


def test_decay_is_applied_before_the_update():
    # One step from S0 with decay g equals the un-gated rule from exp(g)·S0.
    q, k, v, g, beta = inputs(2, 3, 1, 5, 7, seed=2)
    gen = torch.Generator().manual_seed(4)
    S0 = torch.randn(2, 3, 5, 7, generator=gen, dtype=F64)
    o, S = GD.reference(q, k, v, g, beta, S0)
    scaled = S0 * torch.exp(g)[..., None]  # g [B,H,1] → [B,H,1,1]
    o0, S_0 = GD.reference(q, k, v, torch.zeros_like(g), beta, scaled)
    torch.testing.assert_close(o, o0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_0, rtol=1e-6, atol=1e-6)


def test_step_form_chains_into_sequence_form():
    q, k, v, g, beta = inputs(2, 2, 9, 4, 3, seed=5, dtype=torch.float32)
    o_full, S_full = GD.reference(q, k, v, g, beta)
    S, outs = None, []
    for t in range(9):
        o_t, S = GD.reference(*(x[:, :, t : t + 1] for x in (q, k, v, g, beta)), S)
        outs.append(o_t)
    torch.testing.assert_close(torch.cat(outs, 2), o_full, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(S, S_full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_storage_computes_in_float32(dtype):
    args = inputs(1, 2, 6, 8, 4, seed=6, dtype=dtype)
    o, S = GD.reference(*args)
    o32, S32 = GD.reference(*(x.float() for x in args))
    assert o.dtype == dtype and S.dtype == torch.float32
    assert torch.equal(o, o32.to(dtype)) and torch.equal(S, S32)


def test_nan_in_one_head_stays_in_that_head():
    q, k, v, g, beta = inputs(1, 2, 5, 4, 3, seed=7, dtype=torch.float32)
    v[0, 1, 2, 0] = float("nan")
    o, S = GD.reference(q, k, v, g, beta)
    assert torch.isfinite(o[0, 0]).all() and torch.isfinite(o[0, 1, :2]).all()
    assert torch.isnan(o[0, 1, 2:]).any() and torch.isnan(S[0, 1]).any()


def test_schema_shapes_and_errors():
    schema = GD.SCHEMA
    assert schema.name == "GatedDeltaRuleScan" and schema.domain == "framefuse"
    assert schema.input_names == ("q", "k", "v", "g", "beta", "S0")
    assert schema.infer_shapes([(2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 4), (2, 3, 5), (2, 3, 5)], {}) == [
        (2, 3, 5, 4),
        (2, 3, 8, 4),
    ]
    with pytest.raises(SchemaError, match=r"GatedDeltaRuleScan: input S0 must have shape \[B, H, Dk, Dv\]"):
        schema.infer_shapes([(2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 4), (2, 3, 5), (2, 3, 5), (2, 3, 4, 8)], {})
    with pytest.raises(SchemaError, match="GatedDeltaRuleScan.*sequence lengths"):
        schema.infer_shapes([(2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 4), (2, 3, 4), (2, 3, 5)], {})


def test_runs_through_onnx_runtime_bridge():
    pytest.importorskip("onnxruntime_extensions")
    from framefuse.plugins.ort_bridge import ort_session

    B, H, T, Dk, Dv = 1, 2, 5, 4, 3
    q, k, v, g, beta = inputs(B, H, T, Dk, Dv, seed=8, dtype=torch.float32)
    node = helper.make_node("GatedDeltaRuleScan", ["q", "k", "v", "g", "beta"], ["o", "S"], domain="framefuse")
    f = TensorProto.FLOAT
    ins = (("q", [B, H, T, Dk]), ("k", [B, H, T, Dk]), ("v", [B, H, T, Dv]), ("g", [B, H, T]), ("beta", [B, H, T]))
    graph = helper.make_graph(
        [node],
        "gdr",
        [helper.make_tensor_value_info(n, f, s) for n, s in ins],
        [helper.make_tensor_value_info("o", f, [B, H, T, Dv]), helper.make_tensor_value_info("S", f, [B, H, Dk, Dv])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)])
    onnx.checker.check_model(model)
    got = ort_session(model).run(None, {n: x.numpy() for (n, _), x in zip(ins, (q, k, v, g, beta))})
    for a, b in zip(got, GD.reference(q, k, v, g, beta)):
        np.testing.assert_array_equal(a, b.numpy())
