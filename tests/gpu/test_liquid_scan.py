"""LiquidScan kernel vs its reference on a CUDA GPU (skipped without one).

Tolerances are against the float32 reference computed from the same rounded inputs. The cases
sub-sample T x B x H x dtype so that every kernel path (cluster / single block, R in shared memory
/ from global memory) and the edge sizes are hit while the suite stays fast.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (5e-3, 5e-3), torch.bfloat16: (3e-2, 3e-2)}


def _inputs(B, T, H, dtype, *, with_state=True, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale):
        return ((torch.rand(*shape, generator=gen, device="cuda") * 2 - 1) * scale).contiguous()

    xg = rand(B, T, 4 * H, scale=1.0).to(dtype)
    R = rand(4 * H, H, scale=1.0 / H**0.5).to(dtype)
    h0 = rand(B, H, scale=0.5) if with_state else None
    return [xg, R, h0]


def _check(outs, inputs, ts):
    from framefuse.plugins.liquid_scan import reference

    dtype = inputs[0].dtype
    h_ref, last_ref = reference(*inputs, ts=ts)
    atol, rtol = TOL[dtype]
    h, h_last = outs
    assert h.dtype == dtype and h_last.dtype == torch.float32
    torch.testing.assert_close(h.float(), h_ref.float(), atol=atol, rtol=rtol, equal_nan=True)
    torch.testing.assert_close(h_last, last_ref, atol=atol, rtol=rtol, equal_nan=True)


CASES = [
    # B, T, H, dtype, state, ts
    (1, 32, 256, torch.float32, True, 1.0),  # the seed size: cluster, R in shared memory
    (1, 32, 256, torch.float16, True, 0.5),
    (1, 32, 256, torch.bfloat16, False, 1.0),
    (7, 1, 33, torch.float32, False, 1.0),  # single block
    (64, 2, 64, torch.bfloat16, True, 2.0),  # cluster, 4 batch rows per group
    (7, 31, 1, torch.float16, True, 1.0),  # H = 1
    (1, 33, 257, torch.float32, True, 1.0),  # cluster, HB = 33
    (64, 1024, 128, torch.float16, True, 1.0),
    (3, 32, 330, torch.float32, True, 1.0),  # fp32 slice too large: cluster, R from global
]


@pytest.mark.parametrize("B,T,H,dtype,with_state,ts", CASES)
def test_liquid_scan_matches_reference(B, T, H, dtype, with_state, ts):
    from framefuse.plugins.liquid_scan import launch

    inputs = _inputs(B, T, H, dtype, with_state=with_state, seed=T + H)
    outs = launch(inputs, {"ts": ts})
    torch.cuda.synchronize()
    _check(outs, inputs, ts)


@pytest.mark.parametrize(
    "path,H,dtype",
    [((False, True), 100, torch.float16), ((False, False), 257, torch.float32)],
    ids=["single-smem", "single-global"],
)
def test_liquid_scan_single_block_paths(forced_path, path, H, dtype):
    from framefuse.plugins.liquid_scan import launch
    from framefuse.plugins.lstm_seq import persistent

    forced_path(path)
    inputs = _inputs(7, 33, H, dtype, seed=H)
    outs = launch(inputs, {"ts": 0.75})
    torch.cuda.synchronize()
    plan = next(iter(persistent._plans.values()))
    assert not plan.cluster and plan.r_in_smem == path[1]
    _check(outs, inputs, 0.75)


def test_liquid_scan_nan_and_inf_propagate_as_in_reference():
    from framefuse.plugins.liquid_scan import launch

    B, T, H = 3, 12, 256
    inputs = _inputs(B, T, H, torch.float32, seed=11)
    xg = inputs[0]
    xg[1, 4, 3] = float("nan")  # batch row 1: NaN from step 4 on
    xg[2, 6, 2 * H] = float("inf")  # batch row 2: time gate saturates at step 6, stays finite
    outs = launch(inputs, {})
    torch.cuda.synchronize()
    h = outs[0]
    # Step 4's NaN sits in one unit; from step 5 on R·h spreads it to every unit.
    assert torch.isnan(h[1, 4, 3]) and torch.isnan(h[1, 5:]).all() and torch.isfinite(h[1, :4]).all()
    assert torch.isfinite(h[0]).all() and torch.isfinite(h[2]).all()
    _check(outs, inputs, 1.0)


@pytest.mark.parametrize("H", [48, 256], ids=["single", "cluster"])
def test_liquid_scan_writes_every_element_of_preallocated_outputs(H):
    from framefuse.plugins.liquid_scan import launch

    B, T = 7, 9
    inputs = _inputs(B, T, H, torch.bfloat16, seed=3)
    outs = [
        torch.full((B, T, H), float("nan"), dtype=torch.bfloat16, device="cuda"),
        torch.full((B, H), float("nan"), device="cuda"),
    ]
    got = launch(inputs, {}, outputs=outs)
    torch.cuda.synchronize()
    assert all(g.data_ptr() == o.data_ptr() for g, o in zip(got, outs))
    assert all(torch.isfinite(o.float()).all() for o in outs)
    _check(outs, inputs, 1.0)


def test_liquid_scan_on_a_side_stream_and_in_a_cuda_graph():
    from framefuse.plugins.liquid_scan import launch

    B, T, H = 1, 32, 256
    inputs = _inputs(B, T, H, torch.float32, seed=5)
    outs = [torch.empty(B, T, H, device="cuda"), torch.empty(B, H, device="cuda")]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    launch(inputs, {"ts": 1.0}, outputs=outs, stream=side.cuda_stream)
    side.synchronize()
    _check(outs, inputs, 1.0)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(inputs, {"ts": 1.0}, outputs=outs)
    for seed in (6, 7):
        fresh = _inputs(B, T, H, torch.float32, seed=seed)
        for dst, src in zip(inputs, fresh):
            dst.copy_(src)
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(outs, inputs, 1.0)


def test_liquid_scan_rejects_bad_arguments_naming_them():
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.liquid_scan import launch
    from framefuse.plugins.schema import SchemaError

    xg, R, h0 = _inputs(2, 4, 16, torch.float32)
    with pytest.raises(OpArgumentError, match="LiquidScan: argument R: expected dtype float32"):
        launch([xg, R.half(), h0], {})
    with pytest.raises(OpArgumentError, match="LiquidScan: argument xg: expected shape"):
        launch([xg[:, :, :60].contiguous(), R, h0], {})
    with pytest.raises(OpArgumentError, match="LiquidScan: argument h0: expected shape"):
        launch([xg, R, h0[:1].contiguous()], {})
    with pytest.raises(SchemaError, match="unknown attribute"):
        launch([xg, R, h0], {"timespan": 1.0})
