"""The engine's plan-time rewrites (executor._optimize_steps): same outputs, fewer kernels.

Kernels are counted on the CPU with a TorchDispatchMode, which sees the aten ops each step really
runs (composite ops such as reshape/matmul/linear already decomposed). An op counts as one GPU
kernel unless it is a view or an allocation; a framefuse node counts as its one launch plus one
copy per non-contiguous input (the kernel path makes inputs contiguous); an ``addmm`` whose
first matrix has one row counts as two, because torch on CUDA copies the bias into the output
and then runs the GEMM onto it (cuBLASLt's bias epilogue needs more than one row).
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from framefuse.engines.executor import GraphExecutor, optimization_enabled
from framefuse.models import ARCHITECTURES

# Ops that launch no kernel: allocations and metadata-only ops (views are recognised by schema).
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "detach", "lift_fresh", "alias", "_unsafe_view", "view",
              "as_strided", "expand", "permute", "t", "transpose", "unsqueeze", "squeeze", "slice", "select",
              "split", "split_with_sizes", "narrow", "unbind", "_reshape_alias", "resize_"}


class _KernelCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels: collections.Counter = collections.Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.paused and not func.is_view and name not in _NO_KERNEL:
            if name == "addmm" and args[1].shape[0] == 1:
                self.kernels["addmm(bias copy)"] += 1
            self.kernels[name] += 1
        return func(*args, **(kwargs or {}))


def gpu_kernel_count(plan, feeds) -> tuple[int, collections.Counter]:
    """Kernels one ``plan.execute(feeds)`` would launch on a GPU (see the module docstring)."""
    counter = _KernelCounter()
    saved = [step.fn for step in plan.steps]

    def framefuse_launch(fn):
        def run(args):
            counter.kernels["<framefuse launch>"] += 1
            counter.kernels["<contiguous copy>"] += sum(
                1 for a in args if isinstance(a, torch.Tensor) and not a.is_contiguous()
            )
            counter.paused += 1
            try:
                return fn(args)
            finally:
                counter.paused -= 1

        return run

    for step in plan.steps:
        if not step.standard:
            step.fn = framefuse_launch(step.fn)
    try:
        with torch.no_grad(), counter:
            plan.execute(feeds)
    finally:
        for step, fn in zip(plan.steps, saved):
            step.fn = fn
    return sum(counter.kernels.values()), counter.kernels


@pytest.fixture(scope="module")
def fused_models():
    import onnx

    from framefuse.runtime.pipeline import prepare_cached

    def load(arch: str, form: str):
        prepared = prepare_cached(arch, {"seq": 32, "seed": 0})[form]
        assert prepared.fused is not None, prepared.fused_error
        return onnx.load(str(prepared.fused))

    return load


def _feeds(plan, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(spec.shape, generator=generator) if spec.dtype.is_floating_point
               else torch.zeros(spec.shape)).to(spec.dtype)
        for name, spec in plan.input_specs.items()
    }


def _plans(model):
    return GraphExecutor(model, "cpu", optimize=False).plan(), GraphExecutor(model, "cpu", optimize=True).plan()


@pytest.mark.parametrize("form", ["step", "sequence"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_optimised_plan_gives_the_same_outputs(fused_models, arch, form):
    plain, optimised = _plans(fused_models(arch, form))
    feeds = _feeds(plain)
    with torch.no_grad():
        expected = plain.execute(feeds)
        got = optimised.execute(feeds)
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].shape == expected[name].shape and got[name].dtype == expected[name].dtype, name
        scale = max(1.0, expected[name].abs().max().item())
        diff = (got[name] - expected[name]).abs().max().item()
        assert diff <= 1e-6 * scale, f"{arch} {form} output {name}: max abs diff {diff:.3g}"
    # Never more kernels than the plain plan.
    assert gpu_kernel_count(optimised, feeds)[0] <= gpu_kernel_count(plain, feeds)[0]


# Kernel counts measured with gpu_kernel_count (plain -> optimised) at embed 256, 2 layers.
MEASURED = {
    ("lstm", "step"): (27, 11),  # 4 Gathers of a layer's state: 4 kernels each -> a view
    ("mamba", "step"): (67, 59),
    ("min_gru", "step"): (29, 27),  # the two gate projections: one GEMM
    ("min_gru", "sequence"): (29, 21),  # MatMul + bias -> addmm (bias in the epilogue)
    ("xlstm", "step"): (78, 47),
}


@pytest.mark.parametrize("arch, form", sorted(MEASURED))
def test_optimised_plan_launches_fewer_kernels(fused_models, arch, form):
    plain, optimised = _plans(fused_models(arch, form))
    feeds = _feeds(plain)
    before, _ = gpu_kernel_count(plain, feeds)
    after, kinds = gpu_kernel_count(optimised, feeds)
    assert (before, after) == MEASURED[(arch, form)], dict(kinds)


def test_escape_hatch(monkeypatch, fused_models):
    monkeypatch.setenv("FRAMEFUSE_ENGINE_OPT", "0")
    assert not optimization_enabled()
    model = fused_models("lstm", "step")
    default = GraphExecutor(model, "cpu")
    assert not default.optimize
    assert [s.op_type for s in default.plan().steps] == [s.op_type for s in _plans(model)[0].steps]
    monkeypatch.delenv("FRAMEFUSE_ENGINE_OPT")
    assert optimization_enabled() and GraphExecutor(model, "cpu").optimize
    assert not optimization_enabled(False)


def test_folded_model_keeps_merged_nodes(fused_models):
    # Rewritten steps still stand for their nodes: the stored (folded) graph is unchanged.
    model = fused_models("min_gru", "sequence")
    executor = GraphExecutor(model, "cpu", optimize=True)
    assert any(step.op_type == "MatMul+Add" for step in executor.plan().steps)
    assert len(executor.plan().steps) == len(GraphExecutor(model, "cpu", optimize=False).plan().steps)
    folded = executor.folded_model()
    plain_folded = GraphExecutor(model, "cpu", optimize=False).folded_model()
    assert [n.op_type for n in folded.graph.node] == [n.op_type for n in plain_folded.graph.node]
