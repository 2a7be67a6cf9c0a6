"""LinearScan kernel vs its plain-loop reference on a CUDA GPU (skipped without one).

The cases sub-sample T ∈ {1, 2, 31, 32, 33, 1024, 4096} × B ∈ {1, 7, 64} × D (1, 33, 256, 257)
× dtype × initial state so that every dtype meets both algorithms (sequential and chunked,
forced and chosen by the plan), vector widths 1/2/4/8 and ragged chunk counts, while the suite
stays fast (the reference runs on the CPU so compute-sanitizer only slows the kernels).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
IDS = {F32: "f32", F16: "f16", BF16: "bf16"}


def make_inputs(kc, gen, batch, steps, channels, dtype, h0_kind):
    # a in (0.5, 1): the decays gated recurrences produce; b ~ N(0, 1)
    a = kc.rand(gen, batch, steps, channels, dtype=dtype, low=0.5, high=1.0)
    b = kc.randn(gen, batch, steps, channels, dtype=dtype)
    h0 = (
        None
        if h0_kind == "none"
        else (torch.zeros(batch, channels, device="cuda") if h0_kind == "zero" else kc.randn(gen, batch, channels))
    )
    return a, b, h0


def check_against_reference(kc, a, b, h0, h, h_last, name=""):
    from framefuse.plugins.linear_scan import reference

    h_ref, last_ref = reference(a.cpu(), b.cpu(), None if h0 is None else h0.cpu())
    assert h.dtype == a.dtype and h_last.dtype == torch.float32
    kc.assert_close(h, h_ref, kc.RTOL[a.dtype], name=f"h {name}")
    # h_last is float32 state: compared at the storage tolerance (the stored h rounds, the state does not)
    kc.assert_close(h_last, last_ref, kc.RTOL[a.dtype], name=f"h_last {name}")


CASES = [
    # batch, steps, channels, dtype, h0, algorithm (None = the plan's choice)
    (1, 1, 1, F32, "none", None),
    (1, 1, 256, F16, "rand", None),  # the game-loop step
    (1, 2, 33, BF16, "rand", None),
    (7, 31, 257, F32, "zero", None),
    (64, 32, 256, F16, "rand", None),
    (1, 32, 256, F32, "rand", None),  # game-loop window
    (7, 33, 33, BF16, "none", None),
    (1, 1024, 257, F16, "rand", None),
    (7, 1024, 1, F32, "rand", None),
    (64, 1024, 33, BF16, "rand", None),
    (1, 4096, 256, F32, "rand", None),
    (1, 4096, 256, BF16, "zero", None),
    (7, 4096, 257, F16, "rand", None),
    (64, 1024, 257, F32, "zero", None),
    (7, 1024, 33, F32, "rand", "sequential"),
    (7, 1024, 33, F16, "rand", "sequential"),
    (7, 1024, 33, BF16, "rand", "sequential"),
    (7, 1024, 33, F32, "rand", "chunked"),
    (7, 1024, 33, F16, "rand", "chunked"),
    (7, 1024, 33, BF16, "rand", "chunked"),
    (1, 33, 1, F32, "rand", "chunked"),
    (64, 32, 257, F16, "zero", "chunked"),
    (1, 4096, 256, F32, "rand", "sequential"),
]


@pytest.mark.parametrize(
    "batch,steps,channels,dtype,h0_kind,algorithm",
    CASES,
    ids=[f"B{b}-T{t}-D{d}-{IDS[dt]}-h0{h}-{alg or 'auto'}" for b, t, d, dt, h, alg in CASES],
)
def test_matches_reference(kc, gen, batch, steps, channels, dtype, h0_kind, algorithm):
    from framefuse.plugins.linear_scan import launch

    a, b, h0 = make_inputs(kc, gen, batch, steps, channels, dtype, h0_kind)
    h = kc.poisoned_like(a)
    h_last = kc.poisoned_like(a, dtype=torch.float32, shape=(batch, channels))
    out = launch([a, b, h0], {}, outputs=[h, h_last], algorithm=algorithm)
    assert out[0] is h and out[1] is h_last  # preallocated outputs are written in place
    torch.cuda.synchronize()
    check_against_reference(kc, a, b, h0, h, h_last)


@pytest.mark.parametrize("chunk_len", [3, 7, 16, 100])
def test_chunked_ragged_chunks(kc, gen, chunk_len):
    """Chunk lengths that do not divide T and chunk counts that are not powers of two."""
    from framefuse.plugins.linear_scan import launch

    a, b, h0 = make_inputs(kc, gen, 3, 333, 40, torch.float32, "rand")
    h, h_last = launch([a, b, h0], {}, algorithm="chunked", chunk_len=chunk_len)
    torch.cuda.synchronize()
    check_against_reference(kc, a, b, h0, h, h_last, name=f"chunk_len={chunk_len}")


def test_chunk_len_too_small_for_one_block_is_refused(kc, gen):
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.linear_scan import launch

    a, b, h0 = make_inputs(kc, gen, 3, 333, 40, torch.float32, "rand")
    with pytest.raises(OpArgumentError, match="chunk_len=1 gives 333 chunks"):
        launch([a, b, h0], {}, algorithm="chunked", chunk_len=1)


def test_plan_picks_chunked_for_long_narrow_and_sequential_for_short():
    from framefuse.plugins import cuda
    from framefuse.plugins.linear_scan import plan

    sms = cuda.device_properties()["sm_count"]
    assert plan(1, 4096, 256, "float32", sms)["algorithm"] == "chunked"
    assert plan(1, 32, 256, "float32", sms)["algorithm"] == "sequential"


@pytest.mark.parametrize("algorithm", ["sequential", "chunked"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=IDS.get)
def test_nan_and_inf_propagate_like_reference(kc, gen, algorithm, dtype):
    from framefuse.plugins.linear_scan import launch

    batch, steps, channels = 3, 256, 40
    a, b, h0 = make_inputs(kc, gen, batch, steps, channels, dtype, "rand")
    a[0, 10, 3] = float("nan")
    b[1, 200, 5] = float("nan")
    b[2, steps - 3, 7] = float("inf")  # late: no long decay product can meet it (see the .cu)
    b[2, steps - 2, 8] = float("-inf")
    h0[1, 9] = float("nan")
    h = kc.poisoned_like(a)
    h_last = kc.poisoned_like(a, dtype=torch.float32, shape=(batch, channels))
    launch([a, b, h0], {}, outputs=[h, h_last], algorithm=algorithm)
    torch.cuda.synchronize()
    check_against_reference(kc, a, b, h0, h, h_last, name=algorithm)
    assert torch.isnan(h[0, 10:, 3]).all() and not torch.isnan(h[0, :10, 3]).any()


def test_inf_in_a_sequential(kc, gen):
    from framefuse.plugins.linear_scan import launch

    a, b, h0 = make_inputs(kc, gen, 2, 40, 8, torch.float32, "rand")
    a[0, 5, 1] = float("inf")
    a[1, 0, 2] = float("-inf")
    h, h_last = launch([a, b, h0], {}, algorithm="sequential")
    torch.cuda.synchronize()
    check_against_reference(kc, a, b, h0, h, h_last)


@pytest.mark.parametrize("algorithm", ["sequential", "chunked"])
def test_cuda_graph_capture_and_replay(kc, gen, algorithm):
    from framefuse.plugins.linear_scan import launch

    batch, steps, channels = 2, 300, 64
    a, b, h0 = make_inputs(kc, gen, batch, steps, channels, torch.float16, "rand")
    h = torch.empty_like(a)
    h_last = torch.empty(batch, channels, device="cuda")
    launch([a, b, h0], {}, outputs=[h, h_last], algorithm=algorithm)  # warm-up: loads the kernel
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch([a, b, h0], {}, outputs=[h, h_last], algorithm=algorithm)
    a2, b2, h02 = make_inputs(kc, gen, batch, steps, channels, torch.float16, "rand")
    a.copy_(a2), b.copy_(b2), h0.copy_(h02)
    kc.poison_(h), kc.poison_(h_last)
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(kc, a, b, h0, h, h_last, name="graph replay")


def test_side_stream_and_friendly_entry(kc, gen):
    from framefuse.plugins.linear_scan import linear_scan

    a, b, h0 = make_inputs(kc, gen, 7, 33, 257, torch.bfloat16, "rand")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # stream=None must follow torch's current stream
        h, h_last = linear_scan(a, b, h0)
    stream.synchronize()
    check_against_reference(kc, a, b, h0, h, h_last, name="current stream")
    out = (kc.poisoned_like(a), kc.poisoned_like(a, dtype=torch.float32, shape=(7, 257)))
    torch.cuda.synchronize()  # the poisoning ran on the default stream
    h2, last2 = linear_scan(a, b, h0, out=out, stream=stream.cuda_stream)
    stream.synchronize()
    assert h2 is out[0] and last2 is out[1]
    check_against_reference(kc, a, b, h0, h2, last2, name="explicit stream")


def test_unaligned_views_use_scalar_path(kc, gen):
    """A storage offset that breaks 16-byte alignment must still work: the launch plans the
    scalar sequential kernel for these views (the aligned tensors of the same shape get a vector
    one) and it computes the reference."""
    from framefuse.plugins import cuda
    from framefuse.plugins.linear_scan import launch
    from framefuse.plugins.linear_scan.interface import _alignment, plan

    base_a = kc.rand(gen, 2 * 10 * 64 + 1, low=0.5, high=1.0)
    base_b = kc.randn(gen, 2 * 10 * 64 + 1)
    a = base_a[1:].view(2, 10, 64)
    b = base_b[1:].view(2, 10, 64)
    sm_count = cuda.device_properties()["sm_count"]
    dtype = str(a.dtype).removeprefix("torch.")
    planned = plan(2, 10, 64, dtype, sm_count, alignment=_alignment(a, b))
    assert planned["algorithm"] == "sequential" and planned["vec"] == 1, planned
    assert planned["kernel"].startswith("linear_scan_seq_v1_")
    aligned = plan(2, 10, 64, dtype, sm_count, alignment=_alignment(a.contiguous().clone(), b.clone()))
    assert aligned["vec"] > 1, aligned
    h, h_last = launch([a, b, None], {})
    torch.cuda.synchronize()
    check_against_reference(kc, a, b, None, h, h_last)


def test_gpu_validation_errors(kc, gen):
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.linear_scan import launch

    a, b, h0 = make_inputs(kc, gen, 2, 8, 16, torch.float32, "rand")
    with pytest.raises(OpArgumentError, match=r"LinearScan: argument b: expected a contiguous"):
        launch([a, b.transpose(0, 1).contiguous().transpose(0, 1), h0], {})
    with pytest.raises(OpArgumentError, match=r"LinearScan: argument output h_last: expected shape"):
        launch([a, b, h0], {}, outputs=[torch.empty_like(a), torch.empty(2, 15, device="cuda")])
    with pytest.raises(OpArgumentError, match=r"LinearScan: argument h0: expected dtype float32"):
        launch([a, b, h0.half()], {})


def test_fatbin_path(kc, gen, tmp_path, monkeypatch):
    """A fatbin from build_kernels (this GPU's arch only, to stay fast) is loaded and gives the
    same results as the NVRTC build."""
    from framefuse.plugins import build_kernels, cuda
    from framefuse.plugins.linear_scan import interface

    if build_kernels.find_nvcc() is None:
        pytest.skip("nvcc not found: cannot build a fatbin here")
    major, minor = cuda.device_properties()["cc"]
    records = build_kernels.build(
        [major * 10 + minor], sources=[interface.SOURCE], out_dir=tmp_path, log=lambda *_: None
    )
    assert records[0]["ok"], records[0].get("error")
    monkeypatch.setattr(cuda, "KERNELS_DIR", tmp_path)
    cuda.clear_kernel_cache()
    try:
        a, b, h0 = make_inputs(kc, gen, 3, 100, 48, torch.float16, "rand")
        h, h_last = interface.launch([a, b, h0], {})
        kernel = cuda.get_kernel(interface.SOURCE, "linear_scan_chunked_f16")
        assert kernel.origin.startswith("fatbin:"), kernel.origin
        torch.cuda.synchronize()
        check_against_reference(kc, a, b, h0, h, h_last, name="fatbin")
    finally:
        cuda.clear_kernel_cache()
