"""The step compiler on models written by others (issue 16): the benchmark's real models at T = 1
(a length-1 sequence: these models have no step form) are lowered and scheduled into one kernel,
and the IR's reference interpreter matches ONNX Runtime on the original export. On the CPU; the
GPU run of the same kernels is bench/stepkernel.py's business.
"""

from __future__ import annotations

import numpy as np
import pytest

from .flow import fuse_real_model

#: the benchmark's real models (bench/e2e.py REAL_MODELS)
BENCHMARKED = ["gpt2_sdpa", "llama_gqa_sdpa", "mamba", "jamba", "torch_lstm_bidir", "torch_gru_bidir"]


@pytest.mark.parametrize("name", BENCHMARKED)
def test_real_model_compiles_and_its_ir_matches_onnxruntime(name, export_root):
    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.schedule import schedule
    from framefuse.parity.ort_bridge import ort_session

    run = fuse_real_model(name, 1, export_root)
    program = lower_program(run.fused_path)
    kernel = generate(schedule(program, grid=132, threads=256, smem_floats=28 * 1024), smem_limit_bytes=226 * 1024)
    assert kernel.source.count('extern "C" __global__') == 1
    # each graph input is read from host memory once, at entry, by the block of its own task; every
    # other reader takes its flag-tagged copy (read inline by every block, GPT-2's step ran 1.5 ms)
    assert kernel.source.count("ffk_load_host(in") == len(program.inputs)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
    session = ort_session(run.source, fused=False)
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, feeds)))
    actual = naive.run(program, feeds)
    for out in names:
        err = np.abs(actual[out] - expected[out]) / (1 + np.abs(expected[out]))
        assert err.max() <= 1e-4, f"{name} {out}: max rel diff {err.max():.3g}"
