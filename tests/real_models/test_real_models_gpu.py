"""On the GPU, the cuda-graph engine of each real model's fused graph matches torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .flow import COMPILED, GPU_SEQS, WINDOWS, fuse_real_model
from .models import BATCH, BY_NAME, MODELS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("seq", GPU_SEQS)
@pytest.mark.parametrize("name", [m.name for m in MODELS])
def test_cuda_graph_engine_of_fused_real_model_matches_torch(name, seq, export_root):
    """Every real model's fused graph at a short and a long length (a chunked form needs T a
    multiple of its chunk: 8 and 32 are, for every chunk here)."""
    from framefuse.engines.cuda_graph import build_engine

    run = fuse_real_model(name, seq, export_root)
    spec = BY_NAME[name]
    x = torch.randn(BATCH, seq, spec.features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = spec.build()(x).numpy()
    engine = build_engine(run.fused_path, device="cuda")
    actual = engine.run({"x": x.numpy()})["y"]
    tol = run.manifest["parity"]["tolerance"]
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=f"{name}: engine vs torch")


@pytest.mark.parametrize(
    "name,steps",
    [(name, 1) for name in COMPILED] + WINDOWS,  # the CPU's compiler test's models and windows
    ids=lambda v: str(v),
)
def test_step_kernel_of_real_model_matches_onnxruntime(name, steps, export_root):
    """The step compiler's one kernel of each benchmarked real model at T = 1 (a length-1
    sequence) and of windows of T frames, run on the GPU, against ONNX Runtime on the original
    export."""
    from framefuse.compiler import lower_program
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.plugins.ort_bridge import ort_session

    run = fuse_real_model(name, steps, export_root)
    compiled = CompiledStep(lower_program(run.fused_path), device=torch.device("cuda"))
    plan = StepKernelPlan.of(compiled)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in compiled.input_shapes.items()}
    session = ort_session(run.source, fused=False)
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, feeds)))
    for _ in range(2):  # a second launch: the epoch flags of the first must not satisfy its waits
        actual = plan.execute({n: torch.from_numpy(v).cuda() for n, v in feeds.items()})
    torch.cuda.synchronize()
    assert compiled.kernel.source.count('extern "C" __global__') == 1
    for out in names:
        got = actual[out].cpu().numpy()
        err = np.abs(got - expected[out]) / (1 + np.abs(expected[out]))
        assert err.max() <= 1e-4, f"{name} T={steps} {out}: max rel diff {err.max():.3g} (step kernel vs ONNX Runtime)"
