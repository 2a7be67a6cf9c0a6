"""The README's "Adding an op" toy (tests/toy_ops/toy_silu) on a CUDA GPU: its launch against its
reference over fp32/fp16/bf16, odd and empty sizes, preallocated outputs and NaN/±Inf, through
the registry as every op is reached (skipped without a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from framefuse.plugins import registry

pytestmark = pytest.mark.gpu

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPES = (F32, F16, BF16)
IDS = {F32: "f32", F16: "f16", BF16: "bf16"}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    registry.add_op_package("toy_ops")
    yield registry.get_op("ToySilu")
    registry.remove_op_package("toy_ops")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 1, 256), (3, 33, 129), (2, 1024, 257)], ids=str)
def test_launch_matches_the_reference(kc, toy, dtype, shape):
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(shape, generator=gen)).to(dtype).cuda()
    (y,) = toy.launch([x])
    torch.cuda.synchronize()
    (expected,) = toy.reference(x.cpu())
    assert y.dtype == dtype and y.shape == x.shape
    kc.assert_close(y, expected, kc.RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
def test_nan_and_inf_like_the_reference(kc, toy, dtype):
    x = torch.tensor([[[float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 80.0, -80.0]]]).to(dtype).cuda()
    out = torch.full_like(x, 7.0)
    (y,) = toy.launch([x], outputs=[out])
    torch.cuda.synchronize()
    assert y is out
    (expected,) = toy.reference(x.cpu())
    # −Inf · sigmoid(−Inf) is −Inf · 0: NaN in the reference; the kernel's x / (1 + e^{−x}) gives
    # −Inf / Inf, NaN too
    kc.assert_close(y, expected, kc.RTOL[dtype])


def test_empty_input_launches_nothing(toy):
    x = torch.empty(2, 0, 8, device="cuda")
    (y,) = toy.launch([x])
    assert y.shape == (2, 0, 8)


def test_bad_input_names_the_op_and_argument(toy):
    from framefuse.plugins.checks import OpArgumentError

    with pytest.raises(OpArgumentError, match="ToySilu: argument x: expected a CUDA tensor"):
        toy.launch([torch.zeros(1, 2, 3)])
    with pytest.raises(OpArgumentError, match="ToySilu: argument output y: expected shape"):
        toy.launch([torch.zeros(1, 2, 3, device="cuda")], outputs=[torch.zeros(1, 2, 4, device="cuda")])
