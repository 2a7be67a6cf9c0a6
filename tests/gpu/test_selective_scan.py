"""SelectiveScan kernel vs its plain-loop reference on a CUDA GPU (skipped without one).

The cases sub-sample T × B × D × N × dtype × optional inputs so that every thread-group variant
(G = 1 … 32 threads per channel, 4 or 8 states per thread), ragged D (1, 33, 257) and N (1, 5,
129), T across the staging chunk of 16 (1, 2, 31, 32, 33, 1024, 4096) and every dtype are hit.
The reference runs on the CPU, and B·T·D·N stays small enough for it to be quick.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
IDS = {F32: "f32", F16: "f16", BF16: "bf16"}
ALL = ("D", "z", "dt_bias", "h0")


def make_inputs(kc, gen, batch, steps, channels, nstate, dtype, optional=ALL, softplus=True):
    x = kc.randn(gen, batch, steps, channels, dtype=dtype)
    # Δ ≈ 0.05..1 after softplus; without softplus dt must already be a positive step size
    dt = (
        kc.randn(gen, batch, steps, channels, dtype=dtype, scale=0.5, shift=-1.5)
        if softplus
        else kc.rand(gen, batch, steps, channels, dtype=dtype, low=0.01, high=0.2)
    )
    A = -torch.exp(kc.randn(gen, channels, nstate, scale=0.5))  # negative: a stable scan
    Bm = kc.randn(gen, batch, steps, nstate, dtype=dtype)
    Cm = kc.randn(gen, batch, steps, nstate, dtype=dtype)
    Dskip = kc.randn(gen, channels) if "D" in optional else None
    z = kc.randn(gen, batch, steps, channels, dtype=dtype) if "z" in optional else None
    dt_bias = kc.randn(gen, channels, scale=0.1) if "dt_bias" in optional else None
    h0 = kc.randn(gen, batch, channels, nstate) if "h0" in optional else None
    return [x, dt, A, Bm, Cm, Dskip, z, dt_bias, h0]


def check_against_reference(kc, inputs, y, h_last, softplus=True, name=""):
    from framefuse.plugins.selective_scan import reference

    y_ref, h_ref = reference(*[None if t is None else t.cpu() for t in inputs], delta_softplus=int(softplus))
    dtype = inputs[0].dtype
    assert y.dtype == dtype and h_last.dtype == torch.float32
    kc.assert_close(y, y_ref, kc.RTOL[dtype], name=f"y {name}")
    kc.assert_close(h_last, h_ref, kc.RTOL[dtype], name=f"h_last {name}")


CASES = [
    # batch, steps, channels, nstate, dtype, optional inputs, delta_softplus
    (1, 1, 1, 1, F32, (), True),
    (1, 1, 512, 16, F16, ALL, True),  # the game-loop step of a Mamba layer (d_inner 512)
    (1, 2, 33, 16, BF16, ALL, True),
    (7, 31, 257, 16, F32, ("D", "z"), True),
    (1, 32, 512, 16, F32, ALL, True),  # game-loop window
    (64, 32, 33, 8, F16, ("h0",), True),
    (7, 33, 33, 5, BF16, ("dt_bias",), False),
    (2, 1024, 64, 64, F32, ALL, True),
    (1, 1024, 257, 4, F16, ("D", "h0"), False),
    (1, 4096, 32, 16, BF16, ALL, True),
    (1, 4096, 33, 2, F32, ("z",), True),
    (2, 64, 33, 129, F16, ALL, True),
    (2, 40, 20, 256, F32, ALL, True),
    (2, 40, 20, 256, BF16, ALL, True),
    (3, 48, 40, 32, F16, ALL, False),
    (7, 17, 40, 128, F32, ALL, True),
]


@pytest.mark.parametrize(
    "batch,steps,channels,nstate,dtype,optional,softplus",
    CASES,
    ids=[
        f"B{b}-T{t}-D{d}-N{n}-{IDS[dt]}-{'+'.join(o) or 'plain'}-{'sp' if s else 'nosp'}"
        for b, t, d, n, dt, o, s in CASES
    ],
)
def test_matches_reference(kc, gen, batch, steps, channels, nstate, dtype, optional, softplus):
    from framefuse.plugins.selective_scan import launch

    inputs = make_inputs(kc, gen, batch, steps, channels, nstate, dtype, optional, softplus)
    y = kc.poisoned_like(inputs[0])
    h_last = kc.poisoned_like(inputs[0], dtype=torch.float32, shape=(batch, channels, nstate))
    out = launch(inputs, {"delta_softplus": int(softplus)}, outputs=[y, h_last])
    assert out[0] is y and out[1] is h_last
    torch.cuda.synchronize()
    check_against_reference(kc, inputs, y, h_last, softplus)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=IDS.get)
def test_nan_and_inf_propagate_like_reference(kc, gen, dtype):
    from framefuse.plugins.selective_scan import launch

    batch, steps, channels, nstate = 2, 40, 33, 16
    inputs = make_inputs(kc, gen, batch, steps, channels, nstate, dtype)
    x, dt, A, Bm, Cm, Dskip, z, dt_bias, h0 = inputs
    x[0, 5, 3] = float("nan")  # one channel from t = 5 on
    Bm[1, 20, 4] = float("nan")  # every channel of batch 1 from t = 20 on
    z[0, 30, 7] = float("inf")  # silu(inf) = inf: y inf (or nan) at one position only
    dt[1, 3, 9] = float("nan")
    h = kc.poisoned_like(x)
    h_last = kc.poisoned_like(x, dtype=torch.float32, shape=(batch, channels, nstate))
    launch(inputs, {}, outputs=[h, h_last])
    torch.cuda.synchronize()
    check_against_reference(kc, inputs, h, h_last)
    assert torch.isnan(h[0, 5:, 3]).all() and not torch.isnan(h[0, :5, 3]).any()


def test_cuda_graph_capture_and_replay(kc, gen):
    from framefuse.plugins.selective_scan import launch

    batch, steps, channels, nstate = 1, 32, 64, 16
    inputs = make_inputs(kc, gen, batch, steps, channels, nstate, torch.bfloat16)
    y = torch.empty_like(inputs[0])
    h_last = torch.empty(batch, channels, nstate, device="cuda")
    launch(inputs, {}, outputs=[y, h_last])  # warm-up: loads the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(inputs, {}, outputs=[y, h_last])
    fresh = make_inputs(kc, gen, batch, steps, channels, nstate, torch.bfloat16)
    for dst, src in zip(inputs, fresh):
        dst.copy_(src)
    kc.poison_(y), kc.poison_(h_last)
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(kc, inputs, y, h_last, name="graph replay")


def test_state_carries_across_calls(kc, gen):
    """Two calls of T/2 chained through h_last → h0 equal one call of T (the step form)."""
    from framefuse.plugins.selective_scan import selective_scan

    x, dt, A, Bm, Cm, Dskip, z, dt_bias, h0 = make_inputs(kc, gen, 2, 34, 40, 16, torch.float32)
    y_full, last_full = selective_scan(x, dt, A, Bm, Cm, Dskip, z, dt_bias, h0)
    y1, last1 = selective_scan(
        x[:, :17].contiguous(),
        dt[:, :17].contiguous(),
        A,
        Bm[:, :17].contiguous(),
        Cm[:, :17].contiguous(),
        Dskip,
        z[:, :17].contiguous(),
        dt_bias,
        h0,
    )
    y2, last2 = selective_scan(
        x[:, 17:].contiguous(),
        dt[:, 17:].contiguous(),
        A,
        Bm[:, 17:].contiguous(),
        Cm[:, 17:].contiguous(),
        Dskip,
        z[:, 17:].contiguous(),
        dt_bias,
        last1,
    )
    torch.cuda.synchronize()
    kc.assert_close(torch.cat([y1, y2], dim=1), y_full, 1e-6, name="chained y")
    kc.assert_close(last2, last_full, 1e-6, name="chained h_last")


def test_gpu_validation_errors(kc, gen):
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.selective_scan import launch

    inputs = make_inputs(kc, gen, 2, 8, 16, 4, torch.float16)
    bad = list(inputs)
    bad[2] = inputs[2].half()
    with pytest.raises(OpArgumentError, match=r"SelectiveScan: argument A: expected dtype float32"):
        launch(bad, {})
    bad = list(inputs)
    bad[6] = inputs[6].float()
    with pytest.raises(OpArgumentError, match=r"SelectiveScan: argument z: expected dtype float16"):
        launch(bad, {})
    with pytest.raises(OpArgumentError, match=r"SelectiveScan: argument output y: expected shape"):
        launch(
            inputs,
            {},
            outputs=[torch.empty(2, 8, 15, device="cuda", dtype=torch.float16), torch.empty(2, 16, 4, device="cuda")],
        )
