"""The step compiler on models written by others (issue 16): the benchmark's real models at T = 1
(a length-1 sequence: these models have no step form) are lowered and scheduled into one kernel,
and the IR's reference interpreter matches ONNX Runtime on the original export. On the CPU; the
GPU run of the same kernels is bench/stepkernel.py's business.
"""

from __future__ import annotations

import numpy as np
import pytest

from .flow import COMPILED, WINDOWS, fuse_real_model


def _one_step_emulated_against_interpreter(name, program, kernels, tmp_path, seed):
    """Each of ``kernels`` ({label: Kernel}) emulated for one step from a random frame and state
    (``seed``) against the float64 interpreter, within 1e-5 relative."""
    from framefuse.compiler import naive
    from framefuse.compiler.emulate import emulate

    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
    state = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.states.items()}
    expected = naive.run(program, {**feeds, **state})
    for label, kernel in kernels.items():
        outputs, _ = emulate(kernel, {n: v[None] for n, v in feeds.items()}, state, steps=1, workdir=tmp_path / label)
        for out in kernel.output_names:
            err = np.abs(outputs[out][0] - expected[out]) / (1 + np.abs(expected[out]))
            assert err.max() <= 1e-5, f"{name} {out} ({label}): max rel diff {err.max():.3g}"


@pytest.mark.parametrize("name,steps", [(n, 1) for n in COMPILED] + WINDOWS, ids=lambda v: str(v))
def test_real_model_compiles_and_its_ir_matches_onnxruntime(name, steps, export_root):
    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.schedule import schedule
    from framefuse.plugins.ort_bridge import ort_session

    run = fuse_real_model(name, steps, export_root)
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
        assert err.max() <= 1e-4, f"{name} T={steps} {out}: max rel diff {err.max():.3g}"


@pytest.mark.parametrize("name,op", [("torch_lstm_bidir", "LSTMSeq"), ("torch_gru_bidir", "GRUSeq")])
def test_real_model_window_past_the_unroll_is_declined_naming_the_node(name, op, export_root, monkeypatch):
    """Without the recurrence loop (lower.RECUR_WINDOWS off) a window is unrolled, up to 8 positions."""
    from framefuse.compiler import CompileError, lower, lower_program

    monkeypatch.setattr(lower, "RECUR_WINDOWS", False)
    run = fuse_real_model(name, 32, export_root)
    with pytest.raises(CompileError, match=rf"\(framefuse::{op}\): X has 32 time steps"):
        lower_program(run.fused_path)


@pytest.mark.parametrize("name", ["torch_lstm_bidir", "torch_gru_bidir"])
def test_products_of_the_zero_initial_state_fold_away(name, export_root):
    """nn.LSTM / nn.GRU exported without an initial state multiply their recurrent weights by
    zeros: the compiler computes those products once, at compile time (simplify.FoldConstants),
    and what is left means the same."""
    import framefuse.compiler.simplify as simplify
    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.ir import Dot, Leaf

    run = fuse_real_model(name, 1, export_root)
    folded = lower_program(run.fused_path)
    try:
        simplify.FOLD_CONSTANTS = False
        unfolded = lower_program(run.fused_path)
    finally:
        simplify.FOLD_CONSTANTS = True

    def products(program):
        return [n for n in program.nodes() if isinstance(n, Dot)]

    def constant(node):
        return isinstance(node, Leaf) and node.role in ("weight", "const")

    assert any(constant(d.src) for d in products(unfolded)), "the export no longer has a zero initial state"
    assert not any(constant(d.src) for d in products(folded))
    assert len(products(folded)) < len(products(unfolded))
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in folded.inputs.items()}
    a, b = naive.run(folded, feeds), naive.run(unfolded, feeds)
    for out in a:
        np.testing.assert_allclose(a[out], b[out], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["torch_lstm_bidir", "torch_gru_bidir"])
def test_short_row_products_run_in_lane_segments_under_emulation(name, export_root):
    """Their products have rows of 64 floats, more rows a block than warps: segments of 16
    lanes take a row each (codegen._dot_lanes, runtime ffk_seg_dot). The generated source run on
    the CPU (compiler/emulate.py; ThreadSanitizer over its shared memory for the LSTM) equals the
    reference interpreter."""
    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import compiler, emulate
    from framefuse.compiler.schedule import schedule

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulation")
    run = fuse_real_model(name, 1, export_root)
    program = lower_program(run.fused_path)
    kernel = generate(schedule(program, grid=8, threads=128))
    assert "16 lanes per element" in kernel.source and "ffk_seg_dot<64, 16, true>" in kernel.source
    rng = np.random.default_rng(2)
    steps = 2
    frames = {n: rng.standard_normal((steps, *leaf.shape)).astype(np.float32) for n, leaf in program.inputs.items()}
    outputs, _ = emulate(kernel, frames, {}, steps=steps, races=name == "torch_lstm_bidir")
    for s in range(steps):
        expected = naive.run(program, {n: v[s] for n, v in frames.items()})
        for out, value in expected.items():
            np.testing.assert_allclose(outputs[out][s], value, rtol=2e-5, atol=2e-6, err_msg=f"{name} {out} step {s}")


@pytest.mark.parametrize(
    "name,steps,weight_format",
    [("torch_lnlstm_loop", 8, "bf16"), ("gpt2_sdpa", 1, "fp16"), ("torch_lstm_bidir", 1, "int8")],
)
def test_narrow_product_rows_of_real_models_under_emulation(name, steps, weight_format, export_root, tmp_path):
    """Real models with their products' rows stored narrow (codegen.WEIGHT_FORMATS): a rolled
    body loop (its own products stay fp32) beside bf16 products, GPT-2's attention step in fp16,
    the bidirectional LSTM's 16-lane segments in int8 (ffk_seg_dot_q); the emulated kernel against the
    interpreter computing with the rows the kernel reads (Kernel.dot_rows)."""
    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import compiler, emulate
    from framefuse.compiler.schedule import schedule

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulation")
    program = lower_program(fuse_real_model(name, steps, export_root).fused_path)
    sched = schedule(program, grid=8, threads=128, smem_floats=12 * 1024)
    kernel = generate(sched, smem_limit_bytes=100 * 1024, weight_format=weight_format)
    assert kernel.layout.narrow
    rng = np.random.default_rng(4)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
    state = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.states.items()}
    outputs, _ = emulate(kernel, {n: v[None] for n, v in feeds.items()}, state, steps=1, workdir=tmp_path)
    expected = naive.run(program, {**feeds, **state}, dot_rows=kernel.dot_rows())
    for out in kernel.output_names:
        err = np.abs(outputs[out][0] - expected[out]) / (1 + np.abs(expected[out]))
        assert err.max() <= 1e-5, f"{name} {out}: max rel diff {err.max():.3g}"


@pytest.mark.parametrize("steps", [8, 32])
def test_an_rnncell_loop_rolls_into_one_recurrence_a_layer(steps, export_root):
    """nn.RNNCell layers stepped in a Python loop: no rewrite fuses the Elman cell, so the fused
    graph keeps a copy of each cell a position; the compiler rolls each layer's copies into one
    ir.Recur (simplify.RollRecurrences: a loop over the positions in one task, not a dependency
    level a position). Its IR against ONNX Runtime: test_real_model_compiles_and_its_ir_matches_onnxruntime
    (the benchmarked models' windows)."""
    from framefuse.compiler import lower_program
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.schedule import schedule

    run = fuse_real_model("torch_rnncell_loop", steps, export_root)
    program = lower_program(run.fused_path)
    counts = program.counts()
    assert sorted(n.cell for n in program.nodes() if n.kind == "recur") == ["rnn_relu", "rnn_tanh"], counts
    assert not counts.get("tanh") and not counts.get("relu"), counts
    kernel = generate(schedule(program, grid=132, threads=256, smem_floats=28 * 1024), smem_limit_bytes=226 * 1024)
    levels = kernel.describe()["levels"]
    assert levels < steps, f"{levels} dependency levels for {steps} positions"


@pytest.mark.parametrize("steps", [8, 32])
def test_an_mlp_cell_loop_rolls_into_one_body_loop_and_compiles_to_one_task(steps, export_root, tmp_path):
    """An MLP cell with a LayerNorm and a gate on h, stepped in a Python loop from zeros: no fused op
    and not an Elman cell. simplify.RollBodies rolls its copies into one ir.BodyLoop (every position
    but the first, whose products of the zero state the export folded; the biases the export writes
    once a position are read as the constants they are, not staged as windows); the interpreter on
    the rolled program matches ONNX Runtime on the original export, and the generated kernel runs the
    loop as one task on one block (a few levels, not a level a position), emulated against the
    interpreter at T = 8. The unrolled copies took 15 s to schedule at T = 8, 90 s at 16."""
    from framefuse.compiler import lower_program

    run = fuse_real_model("torch_mlpcell_loop", steps, export_root)
    rolled = lower_program(run.fused_path)
    (loop,) = [n for n in rolled.nodes() if n.kind == "bodyloop"]
    assert loop.steps == steps - 1 and loop.carried.shape == (1, 32)
    assert len(loop.windows) == 1 and loop.windows[0].shape == (steps - 1, 1, 64)  # x_t; the biases are constants
    kinds = {n.kind for n in loop.body_nodes()}
    assert {"dot", "reduce", "ew"} <= kinds, kinds  # the products of h, the LayerNorm's sums, the gate
    assert rolled.counts()["tanh"] == 1  # the first position's cell, outside the loop
    _check_rolled_window(run, rolled, loop, steps, tmp_path)


@pytest.mark.parametrize("steps", [8, 32])
def test_a_layernorm_lstm_loop_rolls_carrying_h_and_c_and_compiles_to_one_task(steps, export_root, tmp_path):
    """A LayerNorm LSTM cell written by hand, stepped in a Python loop from zeros: its copies carry
    h and c. simplify.RollBodies cuts each position at h, finds that c_t leaves the body for the
    next position and carries both as one vector [1, 64]; the interpreter on the rolled program
    matches ONNX Runtime on the export and the kernel runs the loop as one task (emulated at T = 8).
    Unrolled, the T = 32 window is 2,900 nodes (which the unrolled tactic no longer tries)."""
    from framefuse.compiler import lower_program

    run = fuse_real_model("torch_lnlstm_loop", steps, export_root)
    rolled = lower_program(run.fused_path)
    (loop,) = [n for n in rolled.nodes() if n.kind == "bodyloop"]
    assert loop.steps == steps - 1 and loop.carried.shape == (1, 64)  # h and c, 32 each
    assert [w.shape for w in loop.windows] == [(steps - 1, 1, 128)]  # the input products
    assert sum(n.kind == "reduce" for n in loop.body_nodes()) == 4  # the two LayerNorms' sums
    _check_rolled_window(run, rolled, loop, steps, tmp_path)


def _check_rolled_window(run, rolled, loop, steps, tmp_path):
    """The interpreter on the rolled program against ONNX Runtime on the export; the loop one task
    of a kernel with few levels (not a level a position), emulated against the interpreter at T = 8."""
    from framefuse.compiler import naive
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import compiler, emulate
    from framefuse.compiler.schedule import schedule
    from framefuse.plugins.ort_bridge import ort_session

    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in rolled.inputs.items()}
    session = ort_session(run.source, fused=False)
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, feeds)))
    actual = naive.run(rolled, feeds)
    for out in names:
        err = np.abs(actual[out] - expected[out]) / (1 + np.abs(expected[out]))
        assert err.max() <= 1e-5, f"T={steps} {out}: max rel diff {err.max():.3g}"
    sched = schedule(rolled, grid=8, threads=128, smem_floats=12 * 1024)
    assert sum(t.root is loop for t in sched.tasks) == 1
    kernel = generate(sched, smem_limit_bytes=100 * 1024)
    assert kernel.describe()["levels"] < 8
    if steps == 8 and compiler() is not None:
        frames = {n: np.stack([feeds[n], -feeds[n]]) for n in feeds}
        outputs, _ = emulate(kernel, frames, {}, steps=2, workdir=tmp_path)
        for step in range(2):
            want = naive.run(rolled, {n: frames[n][step] for n in frames})
            for out in kernel.output_names:
                assert np.abs(outputs[out][step] - want[out]).max() <= 1e-5, (step, out)


@pytest.mark.parametrize(
    "name,steps",
    [("torch_rnncell_loop", 8), ("torch_lnlstm_loop", 8), ("llama_gqa_sdpa", 1), ("mamba", 1), ("torch_lstm_bidir", 1)],
)
def test_views_read_in_place_in_real_models_under_emulation(name, steps, export_root, tmp_path):
    """The build's stepkernel-views tactic (codegen.ALIAS_VIEWS) on real models that have such
    views: the rolled nn.RNNCell and LayerNorm-LSTM loops' windows (views beside their loops),
    Llama's and Mamba's steps, the bidirectional nn.LSTM's; fewer phases than the plain kernel of
    the same schedule, and the emulated kernel against the interpreter."""
    from framefuse.compiler import lower_program
    from framefuse.compiler.codegen import CodeSettings, Generator, generate
    from framefuse.compiler.emulate import compiler
    from framefuse.compiler.schedule import schedule

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulation")
    program = lower_program(fuse_real_model(name, steps, export_root).fused_path)
    sched = schedule(program, grid=8, threads=128, smem_floats=12 * 1024)
    assert any(
        Generator(sched, smem_limit_bytes=100 * 1024, settings=CodeSettings.of(alias_views=True)).views.values()
    ), name
    kernel = generate(sched, smem_limit_bytes=100 * 1024, alias_views=True)
    assert kernel.kernel_phases < generate(sched, smem_limit_bytes=100 * 1024).kernel_phases
    _one_step_emulated_against_interpreter(name, program, {"views": kernel}, tmp_path, seed=5)


@pytest.mark.parametrize(
    "name,steps",
    [
        ("mamba", 1),
        ("jamba", 1),
        ("gpt2_sdpa", 1),
        ("llama_gqa_sdpa", 8),
        ("torch_lstm_bidir", 8),
        ("torch_rnn_bidir", 1),
        ("torch_mlpcell_loop", 8),
    ],
)
def test_fewer_phases_in_real_models_under_emulation(name, steps, export_root, tmp_path):
    """The build's stepkernel-fewer-phases tactic (views, codegen.PHASE_ONE_PASS and
    ROOT_IN_ARRAY_WARP, scheduled with schedule's recomputed_scalars) on real models: a kernel other than the views one, no more phases than
    it, and the emulated kernel against the interpreter (launched, and a resident session)."""
    from framefuse.compiler import lower_program
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import compiler
    from framefuse.compiler.schedule import schedule

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulation")
    program = lower_program(fuse_real_model(name, steps, export_root).fused_path)
    sched = schedule(program, grid=8, threads=128, smem_floats=12 * 1024, recomputed_scalars=64)  # as the tactic
    views = generate(sched, smem_limit_bytes=100 * 1024, alias_views=True)
    kernels = {
        label: generate(sched, smem_limit_bytes=100 * 1024, alias_views=True, one_pass=True, resident=resident)
        for label, resident in (("launched", False), ("resident", True))
    }
    for kernel in kernels.values():
        assert kernel.settings.one_pass and kernel.kernel_phases <= views.kernel_phases
    assert kernels["launched"].digest != views.digest, f"{name}: nothing for the tactic to change"
    _one_step_emulated_against_interpreter(name, program, kernels, tmp_path, seed=6)


@pytest.mark.parametrize(
    "name, steps",
    [("mamba", 1), ("jamba", 1), ("gpt2_sdpa", 1), ("llama_gqa_sdpa", 1), ("torch_mlpcell_loop", 8)],
)
def test_fewer_levels_in_real_models_under_emulation(name, steps, export_root, tmp_path):
    """The build's stepkernel-fewer-levels tactic (the fewer-phases settings, scheduled with
    products that every block of their reader needs whole computed by each of those blocks,
    schedule's replicated_dot_macs) on real models: fewer levels than the fewer-phases schedule
    (the transformers models at T = 1 on 132 blocks: Mamba 10 -> 4, Jamba 12 -> 3, GPT-2 10 -> 2,
    Llama 9 -> 2), and the emulated kernel on 32 blocks against the interpreter (launched, and a
    resident session)."""
    from framefuse.compiler import lower_program
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import compiler
    from framefuse.compiler.schedule import schedule

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulation")
    program = lower_program(fuse_real_model(name, steps, export_root).fused_path)
    sizes = {"grid": 32, "threads": 128, "smem_floats": 24 * 1024, "recomputed_scalars": 64}
    fewer = schedule(program, **sizes)
    sched = schedule(program, **sizes, replicated_dot_macs=1 << 15)  # as the tactic
    assert sched.levels() < fewer.levels(), f"{name}: no level for the tactic to cut"
    kernels = {
        label: generate(sched, smem_limit_bytes=200 * 1024, alias_views=True, one_pass=True, resident=resident)
        for label, resident in (("launched", False), ("resident", True))
    }
    _one_step_emulated_against_interpreter(name, program, kernels, tmp_path, seed=6)
