"""MLSTMScan kernel vs its plain-loop reference on a CUDA GPU (skipped without one).

The cases sub-sample T ∈ {1, 2, 17, 31, 32, 33, 40, 1024} × B ∈ {1, 2, 7, 64} × Dk ∈ {16, 33, 64,
100, 128} (each instantiation k32/k64/k128, with and without padded columns) × Dv (one or
several row blocks, ragged) × dtype × initial state (none, zeros, random C0/n0/m0). Inputs follow
xLSTM: k scaled by 1/√Dk, forget gate biased open (f_pre ~ N(3, 1)), i_pre ~ N(0, 1).
The reference runs on the CPU in float64 from the kernel's own (rounded) inputs. The eps
attribute (transformers' xLSTM: 1e-6) has its own cases.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
IDS = {F32: "f32", F16: "f16", BF16: "bf16"}
# fp32 h gets 5e-5, not 1e-5: h = C q / max(|nᵀq|, exp(−m)) divides by nᵀq, a dot product that can
# cancel down to exp(−m) (≈ 0.05 here), which multiplies its fp32 rounding by up to ~20×.
TOL = {F32: 5e-5, F16: 5e-3, BF16: 3e-2}
STATE_TOL = 2e-5  # C, n, m are fp32 arithmetic whatever the storage dtype


def make_inputs(kc, gen, B, H, T, Dk, Dv, dtype, state_kind):
    q = kc.randn(gen, B, H, T, Dk, dtype=dtype)
    k = kc.randn(gen, B, H, T, Dk, dtype=dtype, scale=1 / math.sqrt(Dk))
    v = kc.randn(gen, B, H, T, Dv, dtype=dtype)
    i_pre = kc.randn(gen, B, H, T, dtype=dtype)
    f_pre = kc.randn(gen, B, H, T, dtype=dtype, shift=3.0)
    if state_kind == "none":
        states = [None, None, None]
    elif state_kind == "zero":
        states = [
            torch.zeros(B, H, Dv, Dk, device="cuda"),
            torch.zeros(B, H, Dk, device="cuda"),
            torch.zeros(B, H, device="cuda"),
        ]
    else:
        states = [kc.randn(gen, B, H, Dv, Dk, scale=0.3), kc.randn(gen, B, H, Dk, scale=0.3), kc.randn(gen, B, H)]
    return [q, k, v, i_pre, f_pre, *states]


def check(kc, inputs, outs, name="", eps=0.0):
    from framefuse.plugins.mlstm_scan import reference

    refs = reference(*[None if x is None else x.cpu().double() for x in inputs], eps=eps)
    h = outs[0]
    assert h.dtype == inputs[0].dtype and all(o.dtype == torch.float32 for o in outs[1:])
    kc.assert_close(h, refs[0], TOL[h.dtype], name=f"h {name}")
    for label, out, ref in zip(("C_last", "n_last", "m_last"), outs[1:], refs[1:]):
        kc.assert_close(out, ref, STATE_TOL, name=f"{label} {name}")


def poisoned_outputs(kc, inputs):
    q, v = inputs[0], inputs[2]
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    return [
        kc.poisoned_like(v),
        kc.poisoned_like(v, dtype=torch.float32, shape=(B, H, Dv, Dk)),
        kc.poisoned_like(v, dtype=torch.float32, shape=(B, H, Dk)),
        kc.poisoned_like(v, dtype=torch.float32, shape=(B, H)),
    ]


CASES = [
    # B, H, T, Dk, Dv, dtype, states
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
    "B,H,T,Dk,Dv,dtype,state_kind",
    CASES,
    ids=[f"B{c[0]}-H{c[1]}-T{c[2]}-Dk{c[3]}-Dv{c[4]}-{IDS[c[5]]}-state{c[6]}" for c in CASES],
)
def test_matches_reference(kc, gen, B, H, T, Dk, Dv, dtype, state_kind):
    from framefuse.plugins.mlstm_scan import launch

    inputs = make_inputs(kc, gen, B, H, T, Dk, Dv, dtype, state_kind)
    outs = poisoned_outputs(kc, inputs)
    result = launch(inputs, {}, outputs=outs)
    assert all(r is o for r, o in zip(result, outs))
    torch.cuda.synchronize()
    check(kc, inputs, outs)


EPS_CASES = [
    # B, H, T, Dk, Dv, dtype, states, eps, i_pre shift
    (1, 4, 1, 64, 64, F32, "none", 1e-6, 0.0),  # transformers' xLSTM eps, the game-loop step
    (2, 4, 33, 64, 64, F32, "rand", 1e-6, -8.0),  # tiny input gates: exp(−m) is the larger side
    (2, 4, 33, 64, 64, BF16, "rand", 1e-6, 0.0),
    (3, 2, 40, 33, 24, F32, "rand", 0.5, 0.0),  # a large eps moves every h: padded k64 columns
    (3, 2, 40, 128, 20, F16, "zero", 0.5, -8.0),  # two row blocks
    (1, 2, 17, 16, 100, BF16, "none", 0.25, 0.0),  # k32, Dv over two row blocks
]


@pytest.mark.parametrize(
    "B,H,T,Dk,Dv,dtype,state_kind,eps,i_shift",
    EPS_CASES,
    ids=[f"B{c[0]}-H{c[1]}-T{c[2]}-Dk{c[3]}-Dv{c[4]}-{IDS[c[5]]}-state{c[6]}-eps{c[7]:g}" for c in EPS_CASES],
)
def test_eps_matches_reference(kc, gen, B, H, T, Dk, Dv, dtype, state_kind, eps, i_shift):
    """The eps attribute is added to the read-out's denominator after the max, as the reference;
    it changes h only: C, n, m are bitwise those of eps = 0."""
    from framefuse.plugins.mlstm_scan import launch, mlstm_scan

    inputs = make_inputs(kc, gen, B, H, T, Dk, Dv, dtype, state_kind)
    inputs[3] += i_shift
    outs = poisoned_outputs(kc, inputs)
    launch(inputs, {"eps": eps}, outputs=outs)
    plain = launch(inputs, {})
    via_entry = mlstm_scan(*inputs, eps=eps)
    torch.cuda.synchronize()
    check(kc, inputs, outs, name=f"eps={eps:g}", eps=eps)
    assert all(torch.equal(a, b) for a, b in zip(via_entry, outs))
    for a, b in zip(outs[1:], plain[1:]):
        assert torch.equal(a, b)
    if eps >= 0.25:  # large enough to be seen through the storage dtype's rounding
        assert not torch.equal(outs[0], plain[0])


@pytest.mark.parametrize("dtype", [F32, F16], ids=IDS.get)
def test_step_chaining_equals_sequence(kc, gen, dtype):
    """T calls of the step form (T = 1), each fed the previous (C, n, m), equal one T-step call."""
    from framefuse.plugins.mlstm_scan import launch

    inputs = make_inputs(kc, gen, 2, 3, 20, 33, 40, dtype, "rand")
    seq = launch(inputs, {})
    C, n, m = inputs[5:]
    steps = []
    for t in range(inputs[0].shape[2]):
        sl = slice(t, t + 1)
        seq_t = [x[:, :, sl].contiguous() for x in inputs[:5]]
        h_t, C, n, m = launch([*seq_t, C, n, m], {})
        steps.append(h_t)
    torch.cuda.synchronize()
    # same arithmetic in the same order: equal to the last bit
    assert torch.equal(torch.cat(steps, dim=2), seq[0])
    for a, b in zip((C, n, m), seq[1:]):
        assert torch.equal(a, b)
    check(kc, inputs, seq)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=IDS.get)
def test_nan_and_inf_propagate_like_reference(kc, gen, dtype):
    from framefuse.plugins.mlstm_scan import launch

    B, H, T, Dk, Dv = 2, 2, 40, 33, 24  # Dk = 33: padded columns in the k64 instantiation
    inputs = make_inputs(kc, gen, B, H, T, Dk, Dv, dtype, "rand")
    q, k, v, i_pre, f_pre, C0, n0, m0 = inputs
    f_pre[0, 0, 4] = float("nan")  # m, and with it everything of (0, 0), is NaN from t = 4 on
    v[0, 1, 6, 5] = float("nan")  # row 5 of C (and of h) of (0, 1) is NaN from t = 6 on
    q[1, 1, 9, 2] = float("inf")  # h at t = 9 of (1, 1): ±Inf / Inf = NaN; the state is unaffected
    C0[1, 0, 3, 3] = float("nan")  # row 3 of (1, 0) is NaN from the start
    outs = poisoned_outputs(kc, inputs)
    launch(inputs, {}, outputs=outs)
    torch.cuda.synchronize()
    check(kc, inputs, outs)
    h, C_last, n_last, m_last = outs
    assert torch.isnan(h[0, 0, 4:]).all() and not torch.isnan(h[0, 0, :4]).any() and torch.isnan(m_last[0, 0])
    assert torch.isnan(h[0, 1, 6:, 5]).all() and not torch.isnan(h[0, 1, :, :5]).any()
    assert torch.isnan(h[1, 1, 9]).all() and torch.isfinite(h[1, 1, 10:]).all() and torch.isfinite(C_last[1, 1]).all()
    assert torch.isnan(h[1, 0, :, 3]).all() and torch.isfinite(n_last[1, 0]).all()


def test_cuda_graph_capture_and_replay(kc, gen):
    from framefuse.plugins.mlstm_scan import launch

    inputs = make_inputs(kc, gen, 1, 4, 32, 64, 64, F16, "rand")
    outs = [
        torch.empty_like(inputs[2]),
        torch.empty(1, 4, 64, 64, device="cuda"),
        torch.empty(1, 4, 64, device="cuda"),
        torch.empty(1, 4, device="cuda"),
    ]
    launch(inputs, {}, outputs=outs)  # warm-up: loads the kernel
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(inputs, {}, outputs=outs)
    for dst, src in zip(inputs, make_inputs(kc, gen, 1, 4, 32, 64, 64, F16, "rand")):
        dst.copy_(src)
    for t in outs:
        kc.poison_(t)
    graph.replay()
    torch.cuda.synchronize()
    check(kc, inputs, outs, name="graph replay")


def test_side_stream_and_friendly_entry(kc, gen):
    from framefuse.plugins.mlstm_scan import mlstm_scan

    inputs = make_inputs(kc, gen, 7, 2, 33, 64, 48, BF16, "rand")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        outs = mlstm_scan(*inputs)
    stream.synchronize()
    check(kc, inputs, outs, name="current stream")
    pre = poisoned_outputs(kc, inputs)
    outs2 = mlstm_scan(*inputs, out=pre, stream=stream.cuda_stream)
    stream.synchronize()
    assert all(a is b for a, b in zip(outs2, pre))
    check(kc, inputs, outs2, name="explicit stream")


def test_gpu_validation_errors(kc, gen):
    from framefuse.errors import FrameFuseError
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.mlstm_scan import launch

    q, k, v, i_pre, f_pre, C0, n0, m0 = make_inputs(kc, gen, 2, 2, 8, 16, 16, F32, "rand")
    with pytest.raises(OpArgumentError, match=r"MLSTMScan: argument m0: expected dtype float32"):
        launch([q, k, v, i_pre, f_pre, C0, n0, m0.double()], {})
    with pytest.raises(OpArgumentError, match=r"MLSTMScan: argument f_pre: expected dtype float32"):
        launch([q, k, v, i_pre, f_pre.half()], {})
    with pytest.raises(FrameFuseError, match=r"MLSTMScan: input n0 must have shape \[2, 2, 16\]"):
        launch([q, k, v, i_pre, f_pre, C0, n0[:, :, :15].contiguous(), m0], {})
    with pytest.raises(OpArgumentError, match=r"MLSTMScan: key dim Dk=200 is larger than the kernel supports"):
        big = torch.zeros(1, 1, 2, 200, device="cuda")
        gate = torch.zeros(1, 1, 2, device="cuda")
        launch([big, big, torch.zeros(1, 1, 2, 4, device="cuda"), gate, gate], {})
    with pytest.raises(OpArgumentError, match=r"MLSTMScan: attribute eps=inf must be finite"):
        launch([q, k, v, i_pre, f_pre], {"eps": float("inf")})
    with pytest.raises(OpArgumentError, match=r"MLSTMScan: expected 4 preallocated outputs"):
        launch([q, k, v, i_pre, f_pre], {}, outputs=[torch.empty_like(v)])
