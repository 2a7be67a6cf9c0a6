"""DeltaRuleScan kernel vs its plain-loop reference on a CUDA GPU (skipped without one).

The cases sub-sample T ∈ {1, 2, 17, 31, 32, 33, 40, 1024} × B ∈ {1, 2, 7, 64} × Dk ∈ {16, 33, 64,
100, 128} (each of the three instantiations k32/k64/k128, with and without padded columns) × Dv
(one or several row blocks, ragged) × dtype × initial state (none, zeros, random). Inputs follow
DeltaNet: q, k L2-normalised, β = σ(·) ∈ (0, 1), so the recurrence is stable over 1024 steps.
The reference runs on the CPU in float64 from the kernel's own (rounded) inputs.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
IDS = {F32: "f32", F16: "f16", BF16: "bf16"}
TOL = {F32: 1e-5, F16: 5e-3, BF16: 3e-2}
STATE_TOL = 2e-5  # S is fp32 arithmetic whatever the storage dtype


def make_inputs(kc, gen, B, H, T, Dk, Dv, dtype, s0_kind):
    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)

    q = unit(torch.randn(B, H, T, Dk, generator=gen)).to(dtype).cuda()
    k = unit(torch.randn(B, H, T, Dk, generator=gen)).to(dtype).cuda()
    v = kc.randn(gen, B, H, T, Dv, dtype=dtype)
    beta = torch.sigmoid(torch.randn(B, H, T, generator=gen)).to(dtype).cuda()
    S0 = {
        "none": None,
        "zero": torch.zeros(B, H, Dk, Dv, device="cuda"),
        "rand": kc.randn(gen, B, H, Dk, Dv, scale=0.5),
    }[s0_kind]
    return q, k, v, beta, S0


def check(kc, q, k, v, beta, S0, o, S_last, name=""):
    from framefuse.plugins.delta_rule_scan import reference

    o_ref, S_ref = reference(
        q.cpu().double(),
        k.cpu().double(),
        v.cpu().double(),
        beta.cpu().double(),
        None if S0 is None else S0.cpu().double(),
    )
    assert o.dtype == q.dtype and S_last.dtype == torch.float32
    kc.assert_close(o, o_ref, TOL[q.dtype], name=f"o {name}")
    kc.assert_close(S_last, S_ref, STATE_TOL, name=f"S_last {name}")


def poisoned_outputs(kc, q, v):
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    return [kc.poisoned_like(v), kc.poisoned_like(v, dtype=torch.float32, shape=(B, H, Dk, Dv))]


CASES = [
    # B, H, T, Dk, Dv, dtype, S0
    (1, 4, 1, 64, 64, F32, "none"),  # the game-loop step
    (1, 4, 1, 64, 64, F16, "rand"),
    (1, 4, 1, 64, 64, BF16, "zero"),
    (7, 2, 2, 16, 16, F32, "rand"),
    (7, 2, 2, 16, 16, BF16, "none"),
    (1, 4, 31, 33, 33, F16, "rand"),
    (1, 4, 31, 33, 33, F32, "zero"),
    (64, 2, 32, 64, 64, F32, "rand"),  # the game-loop window
    (64, 2, 32, 64, 64, BF16, "rand"),
    (7, 3, 33, 128, 128, F16, "zero"),
    (7, 3, 33, 128, 128, F32, "rand"),
    (1, 4, 1024, 64, 64, F32, "rand"),
    (1, 4, 1024, 64, 64, F16, "rand"),
    (1, 4, 1024, 64, 64, BF16, "none"),
    (2, 2, 1024, 128, 128, F32, "rand"),
    (1, 2, 17, 32, 100, F32, "rand"),  # Dv > 64 rows per block: two row blocks, the last ragged
    (3, 2, 40, 128, 20, BF16, "rand"),  # 16 rows per block: two row blocks
    (2, 1, 50, 100, 7, F16, "rand"),  # Dk = 100 in the k128 instantiation (28 padded columns)
]


@pytest.mark.parametrize(
    "B,H,T,Dk,Dv,dtype,s0_kind",
    CASES,
    ids=[f"B{c[0]}-H{c[1]}-T{c[2]}-Dk{c[3]}-Dv{c[4]}-{IDS[c[5]]}-S0{c[6]}" for c in CASES],
)
def test_matches_reference(kc, gen, B, H, T, Dk, Dv, dtype, s0_kind):
    from framefuse.plugins.delta_rule_scan import launch

    q, k, v, beta, S0 = make_inputs(kc, gen, B, H, T, Dk, Dv, dtype, s0_kind)
    outs = poisoned_outputs(kc, q, v)
    result = launch([q, k, v, beta, S0], {}, outputs=outs)
    assert result[0] is outs[0] and result[1] is outs[1]
    torch.cuda.synchronize()
    check(kc, q, k, v, beta, S0, *outs)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=IDS.get)
def test_step_chaining_equals_sequence(kc, gen, dtype):
    """T calls of the step form (T = 1), each fed the previous S_last, equal one T-step call."""
    from framefuse.plugins.delta_rule_scan import launch

    q, k, v, beta, S0 = make_inputs(kc, gen, 2, 3, 20, 33, 40, dtype, "rand")
    o_seq, S_seq = launch([q, k, v, beta, S0], {})
    S = S0
    steps = []
    for t in range(q.shape[2]):
        sl = slice(t, t + 1)
        o_t, S = launch(
            [
                q[:, :, sl].contiguous(),
                k[:, :, sl].contiguous(),
                v[:, :, sl].contiguous(),
                beta[:, :, sl].contiguous(),
                S,
            ],
            {},
        )
        steps.append(o_t)
    torch.cuda.synchronize()
    # same arithmetic in the same order: equal to the last bit
    assert torch.equal(torch.cat(steps, dim=2), o_seq)
    assert torch.equal(S, S_seq)
    check(kc, q, k, v, beta, S0, o_seq, S_seq)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=IDS.get)
def test_nan_and_inf_propagate_like_reference(kc, gen, dtype):
    from framefuse.plugins.delta_rule_scan import launch

    B, H, T, Dk, Dv = 2, 2, 40, 33, 24  # Dk = 33: padded columns in the k64 instantiation
    q, k, v, beta, S0 = make_inputs(kc, gen, B, H, T, Dk, Dv, dtype, "rand")
    v[0, 0, 5, 7] = float("nan")  # value index 7 of S (and of o) is NaN from t = 5 on
    beta[1, 0, 3] = float("nan")  # everything of (1, 0) is NaN from t = 3 on
    q[0, 1, 7, 4] = float("inf")  # o at t = 7 of (0, 1) is ±Inf, S unaffected
    S0[1, 1, 3, 2] = float("nan")  # value index 2 of (1, 1) (a column of S) is NaN from the start
    outs = poisoned_outputs(kc, q, v)
    launch([q, k, v, beta, S0], {}, outputs=outs)
    torch.cuda.synchronize()
    check(kc, q, k, v, beta, S0, *outs)
    o, S_last = outs
    assert torch.isnan(o[0, 0, 5:, 7]).all() and not torch.isnan(o[0, 0, :5]).any()
    assert torch.isnan(o[0, 0, 5:, :7]).sum() == 0
    assert torch.isnan(o[1, 0, 3:]).all() and torch.isnan(S_last[1, 0]).all()
    assert torch.isinf(o[0, 1, 7]).all() and torch.isfinite(S_last[0, 1]).all()


def test_cuda_graph_capture_and_replay(kc, gen):
    from framefuse.plugins.delta_rule_scan import launch

    q, k, v, beta, S0 = make_inputs(kc, gen, 1, 4, 32, 64, 64, F16, "rand")
    outs = [torch.empty_like(v), torch.empty(1, 4, 64, 64, device="cuda")]
    launch([q, k, v, beta, S0], {}, outputs=outs)  # warm-up: loads the kernel
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch([q, k, v, beta, S0], {}, outputs=outs)
    fresh = make_inputs(kc, gen, 1, 4, 32, 64, 64, F16, "rand")
    for dst, src in zip((q, k, v, beta, S0), fresh):
        dst.copy_(src)
    for t in outs:
        kc.poison_(t)
    graph.replay()
    torch.cuda.synchronize()
    check(kc, q, k, v, beta, S0, *outs, name="graph replay")


def test_side_stream_and_friendly_entry(kc, gen):
    from framefuse.plugins.delta_rule_scan import delta_rule_scan

    q, k, v, beta, S0 = make_inputs(kc, gen, 7, 2, 33, 64, 48, BF16, "rand")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        o, S_last = delta_rule_scan(q, k, v, beta, S0)
    stream.synchronize()
    check(kc, q, k, v, beta, S0, o, S_last, name="current stream")
    out = poisoned_outputs(kc, q, v)
    o2, S2 = delta_rule_scan(q, k, v, beta, S0, out=out, stream=stream.cuda_stream)
    stream.synchronize()
    assert o2 is out[0] and S2 is out[1]
    check(kc, q, k, v, beta, S0, o2, S2, name="explicit stream")


def test_gpu_validation_errors(kc, gen):
    from framefuse.errors import FrameFuseError
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.delta_rule_scan import launch

    q, k, v, beta, S0 = make_inputs(kc, gen, 2, 2, 8, 16, 16, F32, "rand")
    with pytest.raises(OpArgumentError, match=r"DeltaRuleScan: argument S0: expected dtype float32"):
        launch([q.half(), k.half(), v.half(), beta.half(), S0.half()], {})
    with pytest.raises(OpArgumentError, match=r"DeltaRuleScan: argument beta: expected dtype float32"):
        launch([q, k, v, beta.half(), S0], {})
    with pytest.raises(FrameFuseError, match=r"DeltaRuleScan: sequence lengths disagree"):
        launch([q, k, v, beta[:, :, :7].contiguous(), S0], {})
    with pytest.raises(OpArgumentError, match=r"DeltaRuleScan: key dim Dk=129 is larger than the kernel supports"):
        big = torch.zeros(1, 1, 2, 129, device="cuda")
        launch([big, big, torch.zeros(1, 1, 2, 4, device="cuda"), torch.zeros(1, 1, 2, device="cuda")], {})
    with pytest.raises(OpArgumentError, match=r"DeltaRuleScan: argument output S_last: expected shape"):
        launch([q, k, v, beta, S0], {}, outputs=[torch.empty_like(v), torch.empty(2, 2, 16, 15, device="cuda")])
