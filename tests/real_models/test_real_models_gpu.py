"""On the GPU, the cuda-graph engine of each real model's fused graph matches torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .flow import SEQS, fuse_real_model
from .models import BATCH, BY_NAME, MODELS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", [m.name for m in MODELS])
def test_cuda_graph_engine_of_fused_real_model_matches_torch(name, export_root):
    from framefuse.engines.cuda_graph import build_engine

    seq = SEQS[-1]
    run = fuse_real_model(name, seq, export_root)
    spec = BY_NAME[name]
    x = torch.randn(BATCH, seq, spec.features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = spec.build()(x).numpy()
    engine = build_engine(run.fused_path, device="cuda")
    actual = engine.run({"x": x.numpy()})["y"]
    tol = run.manifest["parity"]["tolerance"]
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=f"{name}: engine vs torch")
