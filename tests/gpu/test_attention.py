"""Attention kernels vs the explicit-softmax reference on a CUDA GPU (skipped without one).

The cases sub-sample T ∈ {1, 2, 31, 32, 33, 1024, 4096} × B ∈ {1, 7, 64} × Dh ∈ {32, 64, 128} ×
dtype × mask layout ([Tq,Tk], [B,1,Tq,Tk], [B,Hq,Tq,Tk], none; storage dtype or float32) × causal
× GQA group size, so that each kernel (decode for Tq = 1, tensor-core mma for fp16/bf16, CUDA-core
simt for fp32 and unaligned views) meets every head dim and dtype. The reference runs on the CPU
in float64 from the kernel's own (rounded) inputs, so compute-sanitizer only slows the kernels.

Tolerances (relative, see conftest.assert_close): fp32 1e-5; fp16 5e-3 and bf16 3e-2, because the
tensor-core path rounds the softmax weights P to the storage dtype before P·V (as FlashAttention).
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
IDS = {F32: "f32", F16: "f16", BF16: "bf16"}
TOL = {F32: 1e-5, F16: 5e-3, BF16: 3e-2}


def make_inputs(kc, gen, B, Hq, Hkv, Tq, Tk, Dh, dtype, mask_kind="none", mask_f32=False):
    q = kc.randn(gen, B, Hq, Tq, Dh, dtype=dtype)
    k = kc.randn(gen, B, Hkv, Tk, Dh, dtype=dtype)
    v = kc.randn(gen, B, Hkv, Tk, Dh, dtype=dtype)
    shape = {"none": None, "2d": (Tq, Tk), "b1": (B, 1, Tq, Tk), "bh": (B, Hq, Tq, Tk)}[mask_kind]
    mask = None
    if shape is not None:
        values = torch.randn(*shape, generator=gen)
        hidden = torch.rand(*shape, generator=gen) < 0.15  # some keys masked out (−inf)
        mask = values.masked_fill(hidden, float("-inf")).to(F32 if mask_f32 else dtype).cuda()
    return q, k, v, mask


def reference_o(q, k, v, mask, scale=None, causal=0):
    from framefuse.plugins.attention import reference

    (o,) = reference(
        q.cpu().double(),
        k.cpu().double(),
        v.cpu().double(),
        None if mask is None else mask.cpu().double(),
        scale=scale,
        causal=causal,
    )
    return o


def check(kc, q, k, v, mask, o, scale=None, causal=0, name=""):
    assert o.dtype == q.dtype and o.shape == q.shape
    kc.assert_close(o, reference_o(q, k, v, mask, scale, causal), TOL[q.dtype], name=f"o {name}")


CASES = [
    # B, Hq, Hkv, Tq, Tk, Dh, dtype, mask, mask in float32, causal
    # Tq = 1: the decode kernel (step form: one query against a window of keys)
    (1, 4, 4, 1, 1, 64, F32, "none", False, 0),
    (1, 4, 2, 1, 33, 64, F16, "b1", False, 1),  # window with a validity mask [B,1,1,W]
    (7, 4, 1, 1, 1024, 128, BF16, "none", False, 0),  # MQA, long window
    (64, 2, 2, 1, 32, 32, F32, "2d", True, 1),
    (7, 8, 2, 1, 31, 32, BF16, "bh", True, 0),
    (1, 4, 4, 1, 2, 128, F16, "none", False, 1),
    (1, 4, 4, 1, 32, 64, F16, "none", False, 0),  # the game-loop step shape
    # Tq > 1: mma (fp16/bf16) and simt (fp32)
    (1, 4, 4, 2, 2, 64, F32, "none", False, 1),
    (1, 4, 4, 2, 2, 64, F16, "none", False, 1),
    (7, 4, 2, 31, 31, 32, BF16, "bh", False, 1),
    (7, 4, 2, 31, 31, 32, F32, "bh", True, 1),
    (1, 4, 4, 32, 32, 64, F16, "none", False, 1),  # the game-loop window shape
    (1, 4, 4, 32, 32, 64, F32, "none", False, 1),
    (1, 4, 4, 32, 32, 64, BF16, "2d", False, 0),
    (7, 2, 1, 33, 33, 128, F16, "2d", True, 0),
    (7, 2, 1, 33, 33, 128, F32, "b1", False, 1),
    (7, 2, 1, 33, 33, 128, BF16, "none", False, 1),
    (1, 4, 4, 33, 64, 64, BF16, "b1", True, 1),  # a chunk of queries against a longer cache
    (1, 4, 4, 33, 64, 32, F16, "none", False, 1),
    (64, 2, 2, 32, 33, 64, F16, "none", False, 1),
    (64, 2, 2, 32, 33, 64, BF16, "bh", False, 0),
    (64, 2, 2, 32, 33, 128, F32, "2d", False, 0),
    (1, 2, 2, 40, 24, 32, F32, "none", False, 1),  # Tq > Tk: the first 16 rows see no key → 0
    (1, 2, 2, 40, 24, 128, F16, "none", False, 1),
    (1, 4, 2, 1024, 1024, 64, F16, "none", False, 1),
    (1, 4, 2, 1024, 1024, 64, BF16, "none", False, 1),
    (2, 2, 2, 1024, 1024, 128, F32, "bh", False, 0),
    (2, 2, 2, 1024, 1024, 32, F16, "2d", True, 0),
    (1, 4, 4, 4096, 4096, 64, F16, "none", False, 1),
]


@pytest.mark.parametrize(
    "B,Hq,Hkv,Tq,Tk,Dh,dtype,mask_kind,mask_f32,causal",
    CASES,
    ids=[
        f"B{c[0]}-H{c[1]}/{c[2]}-Tq{c[3]}-Tk{c[4]}-D{c[5]}-{IDS[c[6]]}-mask{c[7]}{'32' if c[8] else ''}-c{c[9]}"
        for c in CASES
    ],
)
def test_matches_reference(kc, gen, B, Hq, Hkv, Tq, Tk, Dh, dtype, mask_kind, mask_f32, causal):
    from framefuse.plugins.attention import launch

    q, k, v, mask = make_inputs(kc, gen, B, Hq, Hkv, Tq, Tk, Dh, dtype, mask_kind, mask_f32)
    o = kc.poisoned_like(q)
    out = launch([q, k, v, mask], {"causal": causal}, outputs=[o])
    assert out[0] is o  # preallocated output written in place
    torch.cuda.synchronize()
    check(kc, q, k, v, mask, o, causal=causal)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=IDS.get)
def test_custom_scale(kc, gen, dtype):
    from framefuse.plugins.attention import launch

    q, k, v, mask = make_inputs(kc, gen, 2, 4, 2, 40, 40, 64, dtype, "2d")
    (o,) = launch([q, k, v, mask], {"scale": 0.3, "causal": 1})
    (o1,) = launch([q[:, :, -1:].contiguous(), k, v, mask[-1:].contiguous()], {"scale": 0.3, "causal": 1})
    torch.cuda.synchronize()
    check(kc, q, k, v, mask, o, scale=0.3, causal=1)
    # the step form (decode kernel) of the last query agrees with the sequence form's last row
    check(kc, q[:, :, -1:], k, v, mask[-1:], o1, scale=0.3, causal=1, name="step")


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=IDS.get)
@pytest.mark.parametrize("Tq", [1, 37])
def test_fully_masked_rows_give_zero(kc, gen, dtype, Tq):
    from framefuse.plugins.attention import launch

    q, k, v, _ = make_inputs(kc, gen, 2, 2, 2, Tq, 37, 64, dtype)
    mask = torch.zeros(2, 2, Tq, 37, device="cuda", dtype=dtype)
    mask[0, 1, Tq - 1, :] = float("-inf")  # one row sees nothing
    mask[1, 0, 0, 5:] = float("-inf")  # one row sees keys 0..4 only
    v[0, 1, 7, 3] = float("nan")  # a NaN value behind the −inf mask: the fully masked row stays 0
    o = kc.poisoned_like(q)
    launch([q, k, v, mask], {}, outputs=[o])
    torch.cuda.synchronize()
    assert torch.equal(o[0, 1, Tq - 1].float().cpu(), torch.zeros(64))
    # (rows that are not fully masked do see 0·NaN = NaN at key 7, as the reference does)
    check(kc, q, k, v, mask, o)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=IDS.get)
@pytest.mark.parametrize("Tq", [1, 45])
def test_nan_and_inf_propagate_like_reference(kc, gen, dtype, Tq):
    """NaN in a query row → that row is NaN; NaN in a key every query sees → those heads are NaN;
    +Inf in a value every query sees → that column is +Inf."""
    from framefuse.plugins.attention import launch

    B, Hq, Hkv, Tk, Dh = 2, 4, 2, 45, 64
    q, k, v, _ = make_inputs(kc, gen, B, Hq, Hkv, Tq, Tk, Dh, dtype)
    q[1, 3, Tq - 1, 10] = float("nan")
    k[0, 1, 0, 3] = float("nan")  # batch 0, KV head 1 → query heads 2, 3
    v[1, 0, 0, 5] = float("inf")  # batch 1, KV head 0 → query heads 0, 1, column 5
    o = kc.poisoned_like(q)
    launch([q, k, v, None], {"causal": 1}, outputs=[o])
    torch.cuda.synchronize()
    check(kc, q, k, v, None, o, causal=1)
    assert torch.isnan(o[0, 2:]).all() and not torch.isnan(o[0, :2]).any()
    assert torch.isinf(o[1, :2, :, 5]).all()


def test_unaligned_views_use_simt_path(kc, gen):
    """Contiguous views whose data pointer is not 16-byte aligned skip the cp.async/mma kernel."""
    from framefuse.plugins import cuda
    from framefuse.plugins.attention import launch
    from framefuse.plugins.attention.interface import kernel_name

    B, H, T, Dh = 2, 2, 50, 64
    for dtype in (F16, BF16):
        n = B * H * T * Dh
        base = [kc.randn(gen, n + 1, dtype=dtype) for _ in range(3)]
        q, k, v = (b[1:].view(B, H, T, Dh) for b in base)
        assert q.data_ptr() % 16 != 0
        cc = cuda.device_properties()["cc"]
        assert kernel_name(dtype, Dh, T, cc, aligned=False)[0].startswith("attention_simt_")
        (o,) = launch([q, k, v], {"causal": 1})
        torch.cuda.synchronize()
        check(kc, q, k, v, None, o, causal=1, name=IDS[dtype])


@pytest.mark.parametrize("dtype", [F32, F16], ids=IDS.get)
def test_other_head_dims_use_the_reference(kc, gen, dtype):
    from framefuse.plugins.attention import launch

    q, k, v, mask = make_inputs(kc, gen, 2, 4, 2, 20, 24, 48, dtype, "b1")
    o = kc.poisoned_like(q)
    launch([q, k, v, mask], {"causal": 1}, outputs=[o])
    torch.cuda.synchronize()
    kc.assert_close(o, reference_o(q, k, v, mask, causal=1), 1e-2 if dtype == F16 else 1e-5, name="o Dh=48")


def test_cuda_graph_capture_and_replay(kc, gen):
    """A sequence call (mma kernel) and a step call (decode kernel) captured in one graph."""
    from framefuse.plugins.attention import launch

    q, k, v, mask = make_inputs(kc, gen, 1, 4, 2, 32, 32, 64, F16, "b1")
    q1 = q[:, :, -1:].contiguous()
    mask1 = mask[:, :, -1:].contiguous()
    o = torch.empty_like(q)
    o1 = torch.empty_like(q1)
    launch([q, k, v, mask], {"causal": 1}, outputs=[o])  # warm-up: loads the kernels
    launch([q1, k, v, mask1], {}, outputs=[o1])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch([q, k, v, mask], {"causal": 1}, outputs=[o])
        launch([q1, k, v, mask1], {}, outputs=[o1])
    q2, k2, v2, mask2 = make_inputs(kc, gen, 1, 4, 2, 32, 32, 64, F16, "b1")
    q.copy_(q2), k.copy_(k2), v.copy_(v2), mask.copy_(mask2)
    q1.copy_(q2[:, :, -1:]), mask1.copy_(mask2[:, :, -1:])
    kc.poison_(o), kc.poison_(o1)
    graph.replay()
    torch.cuda.synchronize()
    check(kc, q, k, v, mask, o, causal=1, name="graph sequence")
    check(kc, q1, k, v, mask1, o1, name="graph step")


def test_side_stream_and_friendly_entry(kc, gen):
    from framefuse.plugins.attention import attention

    q, k, v, mask = make_inputs(kc, gen, 7, 4, 2, 33, 33, 32, BF16, "bh")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # stream=None follows torch's current stream
        o = attention(q, k, v, mask, causal=True)
    stream.synchronize()
    check(kc, q, k, v, mask, o, causal=1, name="current stream")
    out = kc.poisoned_like(q)
    o2 = attention(q, k, v, mask, scale=1 / math.sqrt(32), causal=True, out=out, stream=stream.cuda_stream)
    stream.synchronize()
    assert o2 is out
    check(kc, q, k, v, mask, o2, causal=1, name="explicit stream")


def test_gpu_validation_errors(kc, gen):
    from framefuse.errors import FrameFuseError
    from framefuse.plugins.attention import launch
    from framefuse.plugins.checks import OpArgumentError

    q, k, v, mask = make_inputs(kc, gen, 2, 4, 2, 8, 8, 64, F16, "2d")
    with pytest.raises(OpArgumentError, match=r"Attention: argument q: storage dtype must be float32, float16"):
        launch([q.double(), k.double(), v.double()], {})
    with pytest.raises(OpArgumentError, match=r"Attention: argument k: expected dtype float16"):
        launch([q, k.float(), v], {})
    with pytest.raises(OpArgumentError, match=r"Attention: argument v: expected a contiguous"):
        launch([q, k, v.transpose(2, 3).contiguous().transpose(2, 3)], {})
    with pytest.raises(FrameFuseError, match=r"Attention: input mask of shape \[8, 9\]"):
        launch([q, k, v, torch.zeros(8, 9, device="cuda", dtype=F16)], {})
    with pytest.raises(OpArgumentError, match=r"Attention: argument mask: expected dtype"):
        launch([q, k, v, mask.double()], {})
    with pytest.raises(FrameFuseError, match=r"Attention: query heads Hq=4 must be a multiple of KV heads Hkv=3"):
        launch([q, k.repeat(1, 2, 1, 1)[:, :3].contiguous(), v.repeat(1, 2, 1, 1)[:, :3].contiguous()], {})
    with pytest.raises(OpArgumentError, match=r"Attention: argument output o: expected shape"):
        launch([q, k, v], {}, outputs=[torch.empty(2, 4, 8, 32, device="cuda", dtype=F16)])
    with pytest.raises(OpArgumentError, match=r"Attention: causal=2"):
        launch([q, k, v], {"causal": 2})
