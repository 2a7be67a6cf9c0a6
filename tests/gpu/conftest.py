"""Shared helpers of the GPU kernel tests: tolerances per storage dtype, NaN-aware comparison,
random inputs and output poisoning.

Tolerances are relative to the reference computed in float32 from the *same rounded inputs*
(the kernel's inputs upcast), so they measure the kernel's arithmetic and its output rounding,
not input quantisation. A value passes when |actual − expected| ≤ rtol · (|expected| + rms),
rms being the root mean square of the finite expected values: relative error for large values,
scaled absolute error near zero (where cancellation makes pure relative error meaningless).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, *, name: str = "output") -> None:
    """NaN-aware closeness: same shape, NaN at the same positions, ±Inf at the same positions
    with the same sign, finite values within rtol·(|expected| + rms(expected))."""
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    if not torch.equal(nan_a, nan_e):
        extra = (nan_a & ~nan_e).nonzero()[:5].tolist()
        missing = (nan_e & ~nan_a).nonzero()[:5].tolist()
        raise AssertionError(
            f"{name}: NaN positions differ ({int(nan_a.sum())} vs {int(nan_e.sum())} expected); "
            f"unexpected NaN at {extra}, missing NaN at {missing}"
        )
    inf_a, inf_e = torch.isinf(actual), torch.isinf(expected)
    if not torch.equal(inf_a, inf_e) or not torch.equal(actual[inf_a], expected[inf_e]):
        raise AssertionError(f"{name}: ±Inf positions or signs differ ({int(inf_a.sum())} vs {int(inf_e.sum())})")
    finite = ~(nan_e | inf_e)
    if not finite.any():
        return
    a, e = actual[finite], expected[finite]
    rms = float(e.square().mean().sqrt())
    scale = rms if rms > 0 else 1.0
    err = (a - e).abs()
    bound = rtol * (e.abs() + scale)
    bad = err > bound
    if bad.any():
        worst = int((err / bound).argmax())
        idx = finite.nonzero()[worst].tolist()
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{e.numel()} values off (rtol {rtol:g}, rms {rms:.3g}); worst at {idx}: "
            f"got {float(a[worst]):.8g}, expected {float(e[worst]):.8g}, |diff| {float(err[worst]):.3g} "
            f"> bound {float(bound[worst]):.3g}"
        )


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output with NaN before a launch: any element the kernel fails to write stays NaN
    and fails the NaN-position check."""
    return t.fill_(float("nan"))


def poisoned_like(t: torch.Tensor, dtype=None, shape=None) -> torch.Tensor:
    out = torch.empty(shape if shape is not None else t.shape, dtype=dtype or t.dtype, device=t.device)
    return poison_(out)


@pytest.fixture
def gen():
    """A seeded CPU generator: inputs are drawn on the CPU (reproducible) and moved to the GPU."""
    return torch.Generator().manual_seed(1234)


def randn(gen, *shape, dtype=torch.float32, device="cuda", scale=1.0, shift=0.0):
    return (torch.randn(*shape, generator=gen) * scale + shift).to(dtype).to(device)


def rand(gen, *shape, dtype=torch.float32, device="cuda", low=0.0, high=1.0):
    return (torch.rand(*shape, generator=gen) * (high - low) + low).to(dtype).to(device)


def cpu_or_none(t):
    return None if t is None else t.cpu()


@pytest.fixture
def kc():
    """These helpers as a namespace (test modules cannot reliably `import conftest`: there are
    several conftest.py files): kc.assert_close, kc.poison_, kc.poisoned_like, kc.randn, kc.rand,
    kc.RTOL, kc.DTYPES."""
    return _HELPERS


_HELPERS = SimpleNamespace(
    assert_close=assert_close,
    poison_=poison_,
    poisoned_like=poisoned_like,
    randn=randn,
    rand=rand,
    cpu_or_none=cpu_or_none,
    RTOL=RTOL,
    DTYPES=DTYPES,
    DTYPE_IDS=DTYPE_IDS,
)


@pytest.fixture
def forced_path():
    """Force a persistent-RNN kernel path (cluster, r_in_smem) for one test (LSTMSeq, GRUSeq and
    LiquidScan share the planner), restoring the planner afterwards."""
    from framefuse.plugins.lstm_seq import persistent

    def force(path):
        persistent.FORCED_PATH = path
        persistent._plans.clear()

    yield force
    persistent.FORCED_PATH = None
    persistent._plans.clear()
