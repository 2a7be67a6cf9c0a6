"""LSTMSeq kernel vs its reference on a CUDA GPU (skipped without one).

Tolerances are against the float32 reference computed from the same rounded inputs. The cases
sub-sample T x B x H x dtype so that every kernel path (8-block cluster with R in shared memory,
cluster with R from global memory, single block with R in shared memory / from global memory)
and the edge sizes (T = 1, 2, 31, 32, 33, 1024, 4096; B = 1, 7, 64; H = 1, 33, 257, ...) are hit
while the suite stays fast.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (5e-3, 5e-3), torch.bfloat16: (3e-2, 3e-2)}


def _inputs(T, B, I, H, dtype, *, with_bias=True, with_state=True, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale):
        return ((torch.rand(*shape, generator=gen, device="cuda") * 2 - 1) * scale).contiguous()

    X = rand(T, B, I, scale=1.0).to(dtype)
    W = rand(4 * H, I, scale=1.0 / I**0.5).to(dtype)
    R = rand(4 * H, H, scale=1.0 / H**0.5).to(dtype)
    bias = rand(8 * H, scale=0.5).to(dtype) if with_bias else None
    h0 = rand(B, H, scale=0.5) if with_state else None
    c0 = rand(B, H, scale=0.5) if with_state else None
    return [X, W, R, bias, h0, c0]


def _check(outs, inputs):
    from framefuse.plugins.lstm_seq import reference

    dtype = inputs[0].dtype
    Y_ref, h_ref, c_ref = reference(*inputs)
    atol, rtol = TOL[dtype]
    Y, h_last, c_last = outs
    assert Y.dtype == dtype and h_last.dtype == torch.float32 and c_last.dtype == torch.float32
    torch.testing.assert_close(Y.float(), Y_ref.float(), atol=atol, rtol=rtol, equal_nan=True)
    torch.testing.assert_close(h_last, h_ref, atol=atol, rtol=rtol, equal_nan=True)
    torch.testing.assert_close(c_last, c_ref, atol=atol, rtol=rtol, equal_nan=True)


CASES = [
    # T, B, I, H, dtype, bias, state
    (32, 1, 64, 256, torch.float32, True, True),  # the seed size: cluster, R in shared memory
    (32, 1, 64, 256, torch.float16, True, True),
    (32, 1, 64, 256, torch.bfloat16, True, False),
    (1, 7, 5, 33, torch.float32, False, False),  # single block, H not a multiple of 32
    (2, 64, 48, 64, torch.bfloat16, True, True),  # cluster, 4 batch rows per group
    (31, 7, 16, 1, torch.float16, True, True),  # H = 1
    (33, 1, 300, 257, torch.float32, True, True),  # cluster, HB = 33
    (1024, 64, 32, 128, torch.float16, True, True),
    (4096, 1, 16, 64, torch.float32, True, True),
    (32, 3, 20, 330, torch.float32, True, True),  # fp32 slice too large: cluster, R from global
]


@pytest.mark.parametrize("T,B,I,H,dtype,with_bias,with_state", CASES)
def test_lstm_seq_matches_reference(T, B, I, H, dtype, with_bias, with_state):
    from framefuse.plugins.lstm_seq import launch

    inputs = _inputs(T, B, I, H, dtype, with_bias=with_bias, with_state=with_state, seed=T + H)
    outs = launch(inputs, {})
    torch.cuda.synchronize()
    _check(outs, inputs)


@pytest.mark.parametrize(
    "path,H,dtype",
    [((False, True), 100, torch.float16), ((False, False), 96, torch.float32), ((False, False), 257, torch.bfloat16)],
    ids=["single-smem", "single-global", "single-global-257"],
)
def test_lstm_seq_single_block_paths(forced_path, path, H, dtype):
    from framefuse.plugins.lstm_seq import launch, persistent

    forced_path(path)
    inputs = _inputs(33, 7, 24, H, dtype, seed=H)
    outs = launch(inputs, {})
    torch.cuda.synchronize()
    plan = next(iter(persistent._plans.values()))
    assert not plan.cluster and plan.r_in_smem == path[1]
    _check(outs, inputs)


def test_lstm_seq_nan_and_inf_propagate_as_in_reference():
    from framefuse.plugins.lstm_seq import launch

    T, B, I, H = 12, 3, 16, 256
    inputs = _inputs(T, B, I, H, torch.float32, seed=11)
    X = inputs[0]
    X[4, 1, 3] = float("nan")  # batch row 1: NaN from step 4 on
    X[6, 2, 0] = float("inf")  # batch row 2: saturates the gates at step 6, stays finite
    outs = launch(inputs, {})
    torch.cuda.synchronize()
    Y = outs[0]
    assert torch.isnan(Y[4:, 1]).all() and torch.isfinite(Y[:4, 1]).all()
    assert torch.isfinite(Y[:, 0]).all()
    _check(outs, inputs)


@pytest.mark.parametrize("H", [48, 256], ids=["single", "cluster"])
def test_lstm_seq_writes_every_element_of_preallocated_outputs(H):
    from framefuse.plugins.lstm_seq import launch, workspace_size

    T, B, I = 9, 7, 10
    inputs = _inputs(T, B, I, H, torch.bfloat16, seed=3)
    outs = [
        torch.full((T, B, H), float("nan"), dtype=torch.bfloat16, device="cuda"),
        torch.full((B, H), float("nan"), device="cuda"),
        torch.full((B, H), float("nan"), device="cuda"),
    ]
    ws = torch.full((workspace_size(T, B, I, H, torch.bfloat16),), float("nan"), device="cuda")
    got = launch(inputs, {}, outputs=outs, workspace=ws)
    torch.cuda.synchronize()
    assert all(g.data_ptr() == o.data_ptr() for g, o in zip(got, outs))
    assert all(torch.isfinite(o.float()).all() for o in outs)
    _check(outs, inputs)


def test_lstm_seq_on_a_side_stream_and_in_a_cuda_graph():
    from framefuse.plugins.lstm_seq import launch, workspace_size

    T, B, I, H = 32, 1, 64, 256
    inputs = _inputs(T, B, I, H, torch.float16, seed=5)
    outs = [
        torch.empty(T, B, H, dtype=torch.float16, device="cuda"),
        torch.empty(B, H, device="cuda"),
        torch.empty(B, H, device="cuda"),
    ]
    ws = torch.empty(workspace_size(T, B, I, H, torch.float16), device="cuda")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    launch(inputs, {}, outputs=outs, workspace=ws, stream=side.cuda_stream)  # an int handle
    side.synchronize()
    _check(outs, inputs)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(inputs, {}, outputs=outs, workspace=ws)
    for seed in (6, 7):  # replay with new inputs copied into the captured buffers
        fresh = _inputs(T, B, I, H, torch.float16, seed=seed)
        for dst, src in zip(inputs, fresh):
            dst.copy_(src)
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(outs, inputs)


def test_lstm_seq_rejects_bad_arguments_naming_them():
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.lstm_seq import launch

    X, W, R, bias, h0, c0 = _inputs(4, 2, 8, 16, torch.float32)
    with pytest.raises(OpArgumentError, match="LSTMSeq: argument R: expected dtype float32"):
        launch([X, W, R.half(), bias, h0, c0], {})
    with pytest.raises(OpArgumentError, match="LSTMSeq: argument W: expected shape"):
        launch([X, W[:, :4].contiguous(), R, bias, h0, c0], {})
    with pytest.raises(OpArgumentError, match="LSTMSeq: argument X: expected a contiguous"):
        launch([X.transpose(0, 1), W, R, bias, h0, c0], {})
    with pytest.raises(OpArgumentError, match="LSTMSeq: argument h0: expected dtype float32"):
        launch([X, W, R, bias, h0.half(), c0], {})
    with pytest.raises(OpArgumentError, match="workspace"):
        launch([X, W, R, bias, h0, c0], {}, workspace=torch.empty(3, device="cuda"))
