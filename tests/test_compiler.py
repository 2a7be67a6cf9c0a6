"""The step compiler on the CPU (framefuse/compiler): index arithmetic, the lowering of every zoo
architecture against ONNX Runtime on the original graph (through the reference interpreter), the
simplification passes, the generated CUDA source run under CPU emulation against the interpreter,
nvcc compiles of the generated source for sm_80/sm_89/sm_90, and the declines (each names its node).

The same kernels on a GPU: tests/gpu/test_stepkernel.py and bench/stepkernel.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from framefuse.compiler import CompileError, generate_source, lower_program, naive
from framefuse.compiler import iexpr as ix
from framefuse.compiler.codegen import generate
from framefuse.compiler.emulate import compiler as cxx_compiler
from framefuse.compiler.emulate import emulate
from framefuse.compiler.ir import BodyLoop, Concat, DeltaScan, Map, PartialSums, Recur
from framefuse.compiler.lower import lower_onnx
from framefuse.compiler.schedule import schedule
from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached

ARCHS = ARCHITECTURES  # every zoo architecture
SMALL = {"model": {"embed": 32, "layers": 2}, "seq": 4, "seed": 0}


def _prepared(arch, config=SMALL):
    prepared = prepare_cached(arch, config)["step"]
    assert prepared.fused is not None, prepared.fused_error
    return prepared


def _feeds(program, rng):
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
    for name, leaf in program.states.items():
        value = (0.5 * rng.standard_normal(leaf.shape)).astype(np.float32)
        if "valid" in name:  # the attention window's 0/1 mask
            value = (rng.random(leaf.shape) > 0.3).astype(np.float32)
        feeds[name] = value
    return feeds


def _close(actual, expected, what, tol=1e-4):
    """Within ``tol`` relative to 1 + |expected|; a NaN or an infinity only where the reference has
    the same."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    finite = np.isfinite(expected)
    assert np.array_equal(actual[~finite], expected[~finite], equal_nan=True), f"{what}: NaN / Inf differ"
    err = np.abs(actual[finite] - expected[finite]) / (1 + np.abs(expected[finite]))
    assert err.size == 0 or err.max() <= tol, f"{what}: max rel diff {err.max():.3g}"


# -- index arithmetic ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_index_simplification_keeps_the_value(seed):
    rng = np.random.default_rng(seed)
    a, b = ix.Var("a", int(rng.integers(1, 9))), ix.Var("b", int(rng.integers(1, 17)))
    c1, c2, c0 = (int(v) for v in rng.integers(0, 40, 3))
    d, m = int(rng.integers(1, 20)), int(rng.integers(1, 20))
    expr = ix.add(ix.add(ix.mul(a, c1), ix.mul(b, c2)), ix.const(c0))
    for simplified, raw in (
        (ix.floordiv(expr, d), lambda env: (c1 * env[a] + c2 * env[b] + c0) // d),
        (ix.mod(expr, m), lambda env: (c1 * env[a] + c2 * env[b] + c0) % m),
        (ix.mod(ix.floordiv(expr, d), m), lambda env: ((c1 * env[a] + c2 * env[b] + c0) // d) % m),
    ):
        ix.check_same(simplified, raw, [a, b])


def test_index_simplification_sees_through_row_major_strides():
    d, n = ix.Var("d", 512), ix.Var("n", 16)
    flat = ix.add(ix.mul(d, 16), n)
    assert ix.floordiv(flat, 16) == d  # the row of (d, n) does not depend on n: it is hoisted
    assert ix.mod(flat, 16) == n
    assert ix.free_vars(ix.floordiv(flat, 16)) == frozenset({d})


# -- lowering and the reference interpreter --------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_lowering_matches_onnxruntime_on_the_original_graph(arch):
    from framefuse.plugins.ort_bridge import ort_session

    prepared = _prepared(arch)
    program = lower_onnx(prepared.fused)
    session = ort_session(prepared.onnx, fused=False)
    rng = np.random.default_rng(7)
    state = None
    for step in range(3):  # chained: each side carries its own state
        feeds = _feeds(program, rng)
        if state is not None:
            feeds.update(state)
        names = [o.name for o in session.get_outputs()]
        expected = dict(zip(names, session.run(names, feeds)))
        actual = naive.run(program, feeds)
        for name in names:
            _close(actual[name], expected[name], f"{arch} {name} step {step}")
        state = {s: expected[program.state_of[s]] for s in program.states}


@pytest.mark.parametrize("arch", ARCHS)
def test_simplification_keeps_the_meaning(arch):
    prepared = _prepared(arch)
    raw = lower_onnx(prepared.fused)
    simplified = lower_program(prepared.fused)
    from framefuse.compiler.ir import Dot

    # fewer nodes, but for a normalization folded into a product: its few per-row nodes (at most 6)
    products = sum(isinstance(n, Dot) for n in simplified.nodes())
    assert len(simplified.nodes()) <= len(raw.nodes()) + 6 * products
    feeds = _feeds(raw, np.random.default_rng(8))
    a, b = naive.run(raw, feeds), naive.run(simplified, feeds)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("arch", ["min_gru", "mamba", "jamba", "gated_ssm"])
def test_split_products_keep_the_meaning(arch):
    """simplify.SplitProducts: each product of a recurrence's output (the out-projections, mamba's
    x_proj) becomes partial sums over 16 slices of its contraction axis summed by its reader; the
    program computes the same values up to fp32 rounding (the sum over K in another order). The
    recurrent products of the state as it came in (an LSTM's R·h) and the products of a sum of
    partial sums (the next layer's in-projection) are left as they are."""
    from framefuse.compiler.ir import Dot, PartialSums
    from framefuse.compiler.simplify import split_products

    prepared = prepare_cached(arch, FULL)["step"]
    plain = lower_program(prepared.fused, split=False)
    split = lower_program(prepared.fused, split=True)
    assert split_products(plain) == 0 and split_products(split) > 0
    for node in split.nodes():
        if isinstance(node, PartialSums):
            assert node.shape[-2] <= 16 and node.src.shape[-1] >= 16  # slices x N, c columns a slice
    assert sum(isinstance(n, Dot) for n in split.nodes()) < sum(isinstance(n, Dot) for n in plain.nodes())
    feeds = _feeds(plain, np.random.default_rng(8))
    a, b = naive.run(plain, feeds), naive.run(split, feeds)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("arch", ["attention", "delta_net", "xlstm"])
def test_split_products_leave_outputs_of_a_whole_state_alone(arch, monkeypatch):
    """A product of a value each of whose elements reads more than SPLIT_MAX_FANIN state elements
    (attention's output over its window of keys and values, a delta-rule or mLSTM state's rows) is
    not split: it saved no level there (engine._split_saves_levels declined all three), and
    scheduling its partial sums took 12-134 s on a 2-core CPU. Lifting the limit splits them."""
    from framefuse.compiler import simplify

    prepared = prepare_cached(arch, FULL)["step"]
    assert simplify.split_products(lower_program(prepared.fused, split=True)) == 0
    monkeypatch.setattr(simplify, "SPLIT_MAX_FANIN", 1 << 40)
    assert simplify.split_products(lower_program(prepared.fused, split=True)) > 0


def test_lstm_gate_slices_sink_into_four_products():
    """The four ONNX gate slices of W·x + R·h + b become products of H rows each (so a block
    computes only its own elements' gate rows)."""
    from framefuse.compiler.ir import Dot

    prepared = _prepared("lstm")
    raw = [n for n in lower_onnx(prepared.fused).nodes() if isinstance(n, Dot)]
    simplified = [n for n in lower_program(prepared.fused).nodes() if isinstance(n, Dot)]
    hidden = 32
    before = [d for d in raw if "LSTMSeq" in d.label]  # W·x and R·h of each layer, 4H rows each
    after = [d for d in simplified if "LSTMSeq" in d.label]  # the same, one product per gate
    assert [d.n for d in before] == [4 * hidden] * 4
    assert len(after) == 16 and all(d.n == hidden for d in after)


@pytest.mark.parametrize(
    "channels, length, kernel, groups, pads, stride, dilation, out_channels",
    [(8, 4, 4, 8, [3, 0], 1, 1, 8), (6, 7, 3, 2, [1, 2], 2, 1, 4), (4, 9, 2, 1, [0, 0], 1, 3, 5)],
    ids=["depthwise-causal", "grouped-strided", "dilated"],
)
def test_conv1d_lowering_matches_onnxruntime(channels, length, kernel, groups, pads, stride, dilation, out_channels):
    import onnxruntime as ort

    rng = np.random.default_rng(11)
    w = rng.standard_normal((out_channels, channels // groups, kernel)).astype(np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    out_len = (length + sum(pads) - dilation * (kernel - 1) - 1) // stride + 1
    model = _graph(
        [
            helper.make_node(
                "Conv",
                ["x", "w", "b"],
                ["y"],
                group=groups,
                pads=pads,
                strides=[stride],
                dilations=[dilation],
                name="c",
            )
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, channels, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, out_channels, out_len])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    x = rng.standard_normal((2, channels, length)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[
        0
    ]
    np.testing.assert_allclose(naive.run(lower_onnx(model), {"x": x})["y"], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["DeltaRuleScan", "GatedDeltaRuleScan"])
def test_delta_rule_steps_lower_to_the_ops_reference(op):
    """The single step of both delta rules (state [Dk, Dv]) through the interpreter, against the
    op's reference in ONNX Runtime."""
    from framefuse.plugins.ort_bridge import ort_session

    rng = np.random.default_rng(12)
    b, h, dk, dv = 2, 3, 5, 4
    gated = op == "GatedDeltaRuleScan"
    feeds = {
        "q": rng.standard_normal((b, h, 1, dk)),
        "k": rng.standard_normal((b, h, 1, dk)) / 2,
        "v": rng.standard_normal((b, h, 1, dv)),
        **({"g": -np.abs(rng.standard_normal((b, h, 1)))} if gated else {}),
        "beta": 1 / (1 + np.exp(-rng.standard_normal((b, h, 1)))),
        "S0": rng.standard_normal((b, h, dk, dv)),
    }
    feeds = {n: a.astype(np.float32) for n, a in feeds.items()}
    node = helper.make_node(op, list(feeds), ["o", "S"], domain="framefuse", name="scan")
    model = helper.make_model(
        helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in feeds.items()],
            [
                helper.make_tensor_value_info("o", TensorProto.FLOAT, [b, h, 1, dv]),
                helper.make_tensor_value_info("S", TensorProto.FLOAT, list(feeds["S0"].shape)),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)],
    )
    expected = ort_session(model).run(None, feeds)
    got = naive.run(lower_onnx(model), feeds)
    np.testing.assert_allclose(got["o"], expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["S"], expected[1], rtol=1e-5, atol=1e-5)


def _attention_model(shape_q, shape_kv, causal):
    node = helper.make_node(
        "Attention", ["q", "k", "v", "mask"], ["o"], domain="framefuse", name="attention", causal=causal
    )
    b, h, t, d = shape_q
    return helper.make_model(
        helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("q", TensorProto.FLOAT, list(shape_q)),
                helper.make_tensor_value_info("k", TensorProto.FLOAT, list(shape_kv)),
                helper.make_tensor_value_info("v", TensorProto.FLOAT, list(shape_kv)),
                helper.make_tensor_value_info("mask", TensorProto.FLOAT, [b, h, t, shape_kv[2]]),
            ],
            [helper.make_tensor_value_info("o", TensorProto.FLOAT, list(shape_q))],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)],
    )


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_rows_that_see_no_key_give_zero_as_the_ops_reference(causal, tmp_path):
    """The compiler's attention finishes a row by Σ p·v / Σ p and gives 0 where Σ p is 0: a fully
    masked row (every weight exp(−inf)), the only row whose weights sum to 0, since a row with a
    finite max weighs that score exp(0) = 1. So no consumer needs the row max (reading it made
    GPT-2's output projection recompute every score). Checked against the Attention op's reference
    (plugins/attention/naive.py): fully masked rows (a NaN value behind the mask stays unseen),
    rows seeing one key, NaN and +inf scores; the interpreter and the emulated kernel."""
    import torch

    from framefuse.plugins.attention.naive import reference

    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    mask = np.zeros((1, 2, 5, 5), np.float32)
    mask[0, 0, 4, :] = -np.inf  # sees nothing
    mask[0, 1, 2, :] = -np.inf  # sees nothing
    mask[0, 1, 3, 1:] = -np.inf  # sees key 0 only
    v[0, 0, 3, 2] = np.nan  # a NaN value only the fully masked rows' weights (0) would touch ...
    mask[0, 0, :, 3] = -np.inf  # ... as every row of head 0 masks key 3
    q[0, 1, 4, 0] = np.inf  # an infinite score: that row is NaN, as the reference's
    feeds = {"q": q, "k": k, "v": v, "mask": mask}
    (expected,) = reference(*(torch.from_numpy(a) for a in (q, k, v, mask)), causal=causal)
    expected = expected.numpy()
    assert np.all(expected[0, 0, 4] == 0) and np.all(expected[0, 1, 2] == 0) and np.isnan(expected).any()
    model = _attention_model(q.shape, k.shape, causal)
    program = lower_onnx(model)
    np.testing.assert_allclose(naive.run(program, feeds)["o"], expected, rtol=1e-5, atol=1e-5)
    if cxx_compiler() is None:
        pytest.skip("no C++ compiler to emulate the generated kernel")
    kernel = generate(schedule(lower_program(model), grid=3, threads=64))
    assert re.search(r"ff::attention_finish\(\w+, \w+\);", kernel.source)  # Σ p·v and Σ p, no row max
    outputs, _ = emulate(kernel, {n: a[None] for n, a in feeds.items()}, {}, steps=1, workdir=tmp_path / "emu")
    np.testing.assert_allclose(outputs["o"][0], expected, rtol=1e-5, atol=1e-5)


# -- the generated kernel, emulated on the CPU -----------------------------------------------------------

needs_cxx = pytest.mark.skipif(cxx_compiler() is None, reason="no C++ compiler to emulate the generated kernel")


WIDE = {"model": {"embed": 256, "layers": 1}, "seq": 4, "seed": 0}  # 64-wide heads: warp-per-element roots
FULL = {"model": {"embed": 256, "layers": 2}, "seq": 4, "seed": 0}  # the benchmark's zoo size


@needs_cxx
@pytest.mark.parametrize(
    "arch,config", [(a, SMALL) for a in ARCHS] + [("delta_net", WIDE), ("xlstm", WIDE)], ids=lambda v: str(v)[:12]
)
def test_generated_kernel_emulated_matches_the_interpreter(arch, config, tmp_path):
    prepared = _prepared(arch, config)
    program = lower_program(prepared.fused)
    if config is WIDE:  # few rows a block, so the rows of the state run a warp each
        # (xlstm's normalizer and C·q tasks share a level, hence the grid: 64 blocks keep 8 rows a block)
        kernel = generate(schedule(program, grid=64 if arch == "xlstm" else 32, threads=128))
        assert "reductions over its lanes" in kernel.source
    else:
        kernel = generate(schedule(program, grid=3, threads=64))
    steps = 2
    rng = np.random.default_rng(9)
    first = _feeds(program, rng)
    frames = {
        n: np.stack([first[n], rng.standard_normal(leaf.shape).astype(np.float32)])
        for n, leaf in program.inputs.items()
    }
    state = {n: first[n] for n in program.states}
    outputs, final = emulate(kernel, frames, state, steps=steps, workdir=tmp_path)
    expected_state = dict(state)
    for step in range(steps):
        expected = naive.run(program, {**{n: frames[n][step] for n in frames}, **expected_state})
        for name in kernel.output_names:
            _close(outputs[name][step], expected[name], f"{arch} {name} step {step}", tol=1e-5)
        expected_state = {s: expected[program.state_of[s]] for s in program.states}
    for name, value in expected_state.items():
        _close(final[name], value, f"{arch} final {name}", tol=1e-5)  # every state element written


@needs_cxx
@pytest.mark.parametrize(
    "arch,grid,threads,resident,races",
    [
        ("min_gru", 24, 96, False, False),
        ("mamba", 24, 96, False, False),
        ("jamba", 24, 96, False, False),
        ("gated_ssm", 24, 96, False, False),  # its slices' task moved to 12 blocks: two slices a block
        ("gated_ssm", 20, 64, True, True),
    ],
)
def test_split_products_emulated_match_the_interpreter(arch, grid, threads, resident, races, tmp_path):
    """Kernels of split products (simplify.SplitProducts) at the benchmark's size with the
    stepkernel-split tactics' code settings: the slices' blocks compute their slice of the
    recurrence once into an array, which stores the state (the side store of a partitioned array)
    and feeds the slice's N partial sums; the readers sum the slices. Three chained steps against
    the interpreter of the split program, every state element written; the resident kernel under
    ThreadSanitizer."""
    from framefuse.compiler.codegen import CodeSettings
    from framefuse.compiler.simplify import split_products

    program = lower_program(prepare_cached(arch, FULL)["step"].fused, split=True)
    assert split_products(program) > 0
    sched = schedule(program, grid=grid, threads=threads, recomputed_scalars=64)
    assert sched.describe()["split_products"] == split_products(program)
    assert any(t.side and isinstance(t.root, PartialSums) for t in sched.tasks)
    kernel = generate(sched, settings=CodeSettings.of(None, alias_views=True, one_pass=True), resident=resident)
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=races)


@needs_cxx
@pytest.mark.parametrize(
    "arch,grid,threads,resident,races,replicated",
    [("min_gru", 24, 96, False, False, True), ("mamba", 24, 96, True, True, False)],
)
def test_split_sums_kept_emulated_match_the_interpreter(
    arch, grid, threads, resident, races, replicated, monkeypatch, tmp_path
):
    """schedule.SPLIT_SUMS_KEPT: the residual stream after a split output projection (a sum of
    partial sums) stays materialized, stored by the blocks that sum the slices anyway (min_gru: a
    side store of a replicated array, by its first block, `if (b == ...)`; mamba: by the root of
    the task that sums them), so a later reader stages its
    N words instead of the P x N partial sums; same levels, and the kernel computes what the split
    program's interpreter does over three chained steps (the resident one under ThreadSanitizer)."""
    from framefuse.compiler import schedule as schedule_module
    from framefuse.compiler.codegen import CodeSettings

    program = lower_program(prepare_cached(arch, FULL)["step"].fused, split=True)
    monkeypatch.setattr(schedule_module, "SPLIT_SUMS_KEPT", False)
    plain = schedule(program, grid=grid, threads=threads, recomputed_scalars=64)
    monkeypatch.setattr(schedule_module, "SPLIT_SUMS_KEPT", True)
    sched = schedule(program, grid=grid, threads=threads, recomputed_scalars=64)
    assert sched.levels() == plain.levels()
    kernel = generate(sched, settings=CodeSettings.of(None, alias_views=True, one_pass=True), resident=resident)
    assert bool(re.search(r"if \(b == \d+\) ffk_ll_store\(", kernel.source)) == replicated
    staged = lambda k: sum(int(m) for m in re.findall(r"ffk_ll_stage_wide<NT, (\d+),", k.source))  # noqa: E731
    assert staged(kernel) < staged(generate(plain, settings=CodeSettings.of(None, alias_views=True, one_pass=True)))
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=races)


@needs_cxx
@pytest.mark.parametrize(
    "arch,grid,threads,resident,races,entry",
    [
        ("min_gru", 24, 96, False, False, True),
        ("min_gru", 24, 96, True, True, False),
        ("lstm", 24, 96, False, False, True),
        ("attention", 24, 96, True, True, True),
    ],
)
def test_early_frame_words_emulated_match_the_interpreter(
    arch, grid, threads, resident, races, entry, monkeypatch, tmp_path
):
    """codegen.EARLY_FRAME_WORDS: the frame task publishes x before it computes the scalars of x
    (at entry, from the registers its threads read the frame into; ``entry`` False: where that
    does not apply, at the start of the phase after x's array), and with FRAME_SCALARS_LATE (off:
    measured slower) a first-layer task stages x for its products and the scalars at the end of
    the phase before their first reader (lstm's first-layer tasks on 24 blocks: two such copies). The kernel computes what the interpreter does
    over three chained steps (the resident ones under ThreadSanitizer), and without the setting its
    source is as before."""
    from framefuse.compiler import codegen
    from framefuse.compiler.codegen import CodeSettings

    if not entry:
        monkeypatch.setattr(codegen.Generator, "_entry_frame", lambda self, task: False)
    program = lower_program(prepare_cached(arch, FULL)["step"].fused)
    sched = schedule(program, grid=grid, threads=threads, recomputed_scalars=64)
    plain = CodeSettings.of(None, alias_views=True, one_pass=True)
    # the build's tactic (stepkernel-fewer-phases-early-frame): x early, the scalars staged as before
    tactic = generate(sched, settings=CodeSettings.of(plain, early_frame=True), resident=resident)
    assert "its words past x" not in tactic.source
    _emulate_against_interpreter(tactic, program, 3, tmp_path / "tactic", races=races)
    monkeypatch.setattr(codegen, "FRAME_SCALARS_LATE", True)
    kernel = generate(sched, settings=CodeSettings.of(plain, early_frame=True), resident=resident)
    before = generate(sched, settings=CodeSettings.of(plain, early_frame=False), resident=resident)
    assert kernel.source.count("frame x words, published now") == int(entry)
    assert kernel.source.count("published before the scalars of x are computed") == int(not entry)
    late = kernel.source.count("its words past x (the scalars), staged for the next phase")
    assert late == kernel.source.count("its x words alone, published before its scalars") >= 1
    assert late == (2 if arch != "min_gru" else 1)
    assert "its words past x" not in before.source and before.source != kernel.source
    assert generate(sched, settings=plain, resident=resident).source == before.source  # off by default
    _emulate_against_interpreter(kernel, program, 3, tmp_path / "late", races=races)


def _emulate_against_interpreter(kernel, program, steps, tmp_path, races=False, feeds=None):
    rng = np.random.default_rng(9)
    first = _feeds(program, rng) if feeds is None else feeds
    frames = {
        n: np.stack([first[n]] + [rng.standard_normal(leaf.shape).astype(np.float32) for _ in range(steps - 1)])
        for n, leaf in program.inputs.items()
    }
    state = {n: first[n] for n in program.states}
    outputs, final = emulate(kernel, frames, state, steps=steps, workdir=tmp_path, races=races)
    expected_state = dict(state)
    rows = kernel.dot_rows()  # the rows a kernel with narrow weights reads (none for fp32)
    for step in range(steps):
        expected = naive.run(program, {**{n: frames[n][step] for n in frames}, **expected_state}, dot_rows=rows)
        for name in kernel.output_names:
            _close(outputs[name][step], expected[name], f"{name} step {step}", tol=1e-5)
        expected_state = {s: expected[program.state_of[s]] for s in program.states}
    for name, value in expected_state.items():
        _close(final[name], value, f"final {name}", tol=1e-5)


# linear scans (their windows are Scans) and the nonlinear ones (a Recur each: a loop over positions)
SEQUENCE_ARCHS = [
    "min_gru",
    "min_lstm",
    "gated_ssm",
    "mamba",
    "jamba",
    "xlstm",
    "lstm",
    "gru",
    "liquid",
    "delta_net",
    "attention",
]


def _sequence_program(arch, config):
    prepared = prepare_cached(arch, config)["sequence"]
    assert prepared.fused is not None, prepared.fused_error
    return prepared, lower_program(prepared.fused)


@pytest.mark.parametrize("arch", SEQUENCE_ARCHS)
def test_sequence_form_lowering_matches_onnxruntime_on_the_original_graph(arch):
    from framefuse.plugins.ort_bridge import ort_session

    prepared, program = _sequence_program(arch, {**SMALL, "seq": 8})
    scans_of = {"LinearScan": 1, "SelectiveScan": 1, "MLSTMScan": 3}  # MLSTMScan: m, then C and n
    ops = [n.op_type for n in onnx.load(str(prepared.fused)).graph.node if n.domain == "framefuse"]
    assert program.counts().get("scan", 0) == sum(scans_of.get(op, 0) for op in ops)
    if arch in ("lstm", "gru", "liquid"):  # a loop over the positions a layer (ir.Recur)
        assert program.counts()["recur"] == len(ops)
    if arch == "delta_net":  # every state row a loop over the positions (ir.DeltaScan)
        assert program.counts()["deltascan"] == len(ops)
    session = ort_session(prepared.onnx, fused=False)
    feeds = _feeds(program, np.random.default_rng(7))
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, feeds)))
    actual = naive.run(program, feeds)
    for name in names:
        _close(actual[name], expected[name], f"{arch} {name}")


@needs_cxx
@pytest.mark.parametrize("arch", SEQUENCE_ARCHS)
def test_sequence_form_kernel_emulated_matches_the_interpreter(arch, tmp_path):
    """8 positions over 16 blocks: the scans' (and cells') outputs cross blocks to the products
    that read them."""
    _, program = _sequence_program(arch, {"model": {"embed": 64, "layers": 2}, "seq": 8, "seed": 0})
    kernel = generate(schedule(program, grid=16, threads=128))
    if program.counts().get("scan"):
        assert "for (int s" in kernel.source  # the recurrence's loop over positions
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=arch == "min_gru")


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,batch,smem,blocks,own,threads",
    [
        ("lstm", 64, 8, 1, None, None, True, 128),  # R in one block's shared memory, 2 K splits
        (
            "lstm",
            40,
            17,
            3,
            1500,
            None,
            True,
            64,
        ),  # odd sizes, 3 rows: units over 5 blocks of their own, 108 rows a block over 64 threads
        ("gru", 40, 6, 2, 700, None, False, 128),  # over 8 blocks a layer, more than half the grid in all: shared
        ("liquid", 48, 5, 1, 256, 2, True, 128),  # more units a block than R's rows fit: R from global memory
    ],
)
def test_a_nonlinear_window_runs_as_a_loop_over_its_positions(
    arch, embed, seq, batch, smem, blocks, own, threads, monkeypatch, tmp_path
):
    """LSTMSeq / GRUSeq / LiquidScan windows lower to one ir.Recur a layer, whatever T: the positions
    in a loop inside one task, h exchanged between the task's blocks as flag-tagged words each
    position. The emulated kernel (ThreadSanitizer on the split ones) computes the interpreter's
    values, over a grid where each layer's units are split across blocks."""
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.ir import Recur

    if smem is not None:
        monkeypatch.setattr(sched, "RECUR_SMEM_FLOATS", smem)
    if blocks is not None:
        monkeypatch.setattr(sched, "RECUR_MAX_BLOCKS", blocks)
        monkeypatch.setattr(sched, "RECUR_WIDE", False)  # no wider split either: R from global memory
    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    assert program.counts()["recur"] == 2
    plan = schedule(program, grid=24, threads=threads)
    loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
    per_block, n_blocks, held = sched.recur_split(loops[0].root, 24, loops[0].stage_limit)
    assert [t.blocks for t in loops] == [n_blocks] * 2 and held == (blocks is None)
    others = [t for t in plan.tasks if not isinstance(t.root, Recur)]
    overlap = any(o.first < t.first + t.blocks and t.first < o.first + o.blocks for t in loops for o in others)
    assert overlap == (not own)
    kernel = generate(plan)
    assert kernel.source.count("for (int rcs = 0; rcs < ") == 2
    # one block holding every unit keeps h in shared memory and takes its inputs a position ahead:
    # by the threads past its cells where it has some (codegen.RECUR_INPUT_HELPERS), else the cells
    one_block = n_blocks == 1 and batch * embed <= threads
    helpers = one_block and threads > -(-batch * embed // 32) * 32
    assert kernel.source.count("threads past the cells take each position's") == (2 if helpers else 0)
    assert kernel.source.count("loaded a position ahead") == (2 if one_block and not helpers else 0)
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=smem is not None)


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,batch,threads,lanes",
    [  # the emulator runs a std::thread per CUDA thread (under ThreadSanitizer): small grids
        ("lstm", 64, 7, 1, 256, 4),
        ("gru", 32, 5, 2, 256, 4),  # two batch rows, 3 gates: 24 weights a lane
        ("liquid", 48, 6, 1, 256, 4),
        ("lstm", 64, 5, 1, 128, 2),  # fewer threads, fewer lanes
    ],
)
def test_a_one_block_recurrence_splits_each_unit_over_lanes(
    arch, embed, seq, batch, threads, lanes, monkeypatch, tmp_path
):
    """generate(lane_cells=True) (the build's stepkernel-lanes tactic; codegen.RECUR_LANE_CELLS the
    default, off): a recurrence on one block gives each unit ``lanes`` threads of a warp, each its K
    split of the unit's gate rows in registers, the sums met through shuffles and the cell applied
    in every lane: one barrier a position. The emulated kernel (ThreadSanitizer) computes the
    interpreter's values; the default kernel is the other loop."""
    from framefuse.compiler import codegen
    from framefuse.compiler.ir import Recur

    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    plan = schedule(program, grid=4, threads=threads)
    loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
    assert [t.blocks for t in loops] == [1, 1]
    assert [codegen.recur_lanes(t.root, threads, True) for t in loops] == [lanes, lanes]
    assert not codegen.RECUR_LANE_CELLS and codegen.recur_lanes(loops[0].root, threads) == 0
    plain = generate(plan)
    assert "lanes a unit" not in plain.source and not plain.settings.lane_cells
    monkeypatch.setattr(codegen, "RECUR_LANE_CELLS", True)  # the default switched on: the same kernel
    assert generate(plan).source == generate(plan, lane_cells=True).source
    monkeypatch.setattr(codegen, "RECUR_LANE_CELLS", False)
    kernel = generate(plan, lane_cells=True)
    assert kernel.settings.lane_cells and kernel.describe()["lane_cells"]
    assert kernel.source.count(f"// {lanes} lanes a unit") == 2
    assert kernel.source.count("__shfl_xor_sync(0xffffffffu, a0, o)") == 2
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,batch,threads,ahead,ring,lane_cells",
    [  # the emulator runs a std::thread per CUDA thread (under ThreadSanitizer): small grids
        ("lstm", 64, 7, 1, 256, 4, 4, False),  # 7 positions: the unrolled loop's last round is cut
        ("gru", 32, 5, 2, 256, 2, 2, False),  # two batch rows
        ("liquid", 48, 6, 1, 256, 8, 6, False),  # more than the window: as many as it has
        ("lstm", 64, 7, 1, 256, 4, 4, True),  # the lanes loop
    ],
)
def test_a_one_block_recurrence_loads_its_inputs_several_positions_ahead(
    arch, embed, seq, batch, threads, ahead, ring, lane_cells, monkeypatch, tmp_path
):
    """codegen.RECUR_INPUTS_AHEAD: a recurrence on one block keeps that many positions' input
    words in flight, a ring of registers indexed by the position loop unrolled as many times (at
    most the window's length); at 1 the source is the one-slot loop it always was. The emulated
    kernel (ThreadSanitizer) computes the interpreter's values, and the resident kernel over two
    frames."""
    from framefuse.compiler import codegen
    from framefuse.compiler.ir import Recur

    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    plan = schedule(program, grid=4, threads=threads)
    assert [t.blocks for t in plan.tasks if isinstance(t.root, Recur)] == [1, 1]
    assert codegen.RECUR_INPUTS_AHEAD == 1
    # the ring itself: the cells load their own inputs (no helpers take them), word by word
    monkeypatch.setattr(codegen, "RECUR_INPUT_HELPERS", False)
    monkeypatch.setattr(codegen, "RECUR_TAKE_TOGETHER", False)
    plain = generate(plan, lane_cells=lane_cells)
    assert plain.source.count("loaded a position ahead") == 2 and "rcs0" not in plain.source
    monkeypatch.setattr(codegen, "RECUR_INPUTS_AHEAD", ahead)
    kernel = generate(plan, lane_cells=lane_cells)
    assert kernel.source.count(f"loaded {ring} positions ahead") == 2
    assert kernel.source.count(f"unsigned long long rxw[{ring}][") == 2
    assert kernel.source.count(f"for (int rcd = 0; rcd < {ring}; ++rcd)") == 2
    assert (f"if (rcs < {seq})" in kernel.source) == (seq % ring != 0)
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)
    resident = generate(plan, lane_cells=lane_cells, resident=True)  # the ring is the body's: two frames
    assert resident.source.count(f"loaded {ring} positions ahead") == 2
    _emulate_against_interpreter(resident, program, 2, tmp_path / "resident")
    monkeypatch.setattr(codegen, "RECUR_INPUTS_AHEAD", 0)
    with pytest.raises(CompileError, match="at least one position ahead"):
        generate(plan, lane_cells=lane_cells)


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,batch,ahead,lane_cells",
    [  # the emulator runs a std::thread per CUDA thread (under ThreadSanitizer): small grids
        ("lstm", 64, 7, 1, 1, False),  # four words a position
        ("gru", 32, 5, 2, 2, False),  # two batch rows, the ring two deep
        ("lstm", 64, 7, 1, 4, True),  # the lanes loop, the ring four deep
    ],
)
def test_a_one_block_recurrence_checks_its_input_words_with_one_branch(
    arch, embed, seq, batch, ahead, lane_cells, tmp_path
):
    """generate(take_together=True) (codegen.RECUR_TAKE_TOGETHER, on by default): the cell threads
    test that every input word of a position was current when loaded in one condition and wait
    word by word only in the other branch; the emulated kernel (ThreadSanitizer), where the input
    projection's blocks run beside the recurrence and words are often not current yet, computes
    the interpreter's values, and the resident kernel over two frames."""
    from framefuse.compiler import codegen
    from framefuse.compiler.ir import Recur

    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    plan = schedule(program, grid=4, threads=256)
    recurrences = [t for t in plan.tasks if isinstance(t.root, Recur)]
    assert [t.blocks for t in recurrences] == [1, 1]
    gates = recurrences[0].root.gates
    # the cells' own loads (the ring): without helpers, which would take the words instead
    assert codegen.RECUR_TAKE_TOGETHER is True
    plain = generate(plan, lane_cells=lane_cells, inputs_ahead=ahead, take_together=False, input_helpers=False)
    assert "& ffk_ll_current(" not in plain.source and not plain.settings.take_together
    default = generate(plan, lane_cells=lane_cells, inputs_ahead=ahead, input_helpers=False)
    assert default.settings.take_together
    kernel = generate(plan, lane_cells=lane_cells, inputs_ahead=ahead, take_together=True, input_helpers=False)
    assert kernel.identity == default.identity
    assert kernel.settings.take_together and kernel.describe()["take_together"] is True
    slot = "rxw[rcd]" if ahead > 1 else "rxw"
    together = " & ".join(f"ffk_ll_current({slot}[{g}], epoch)" for g in range(gates))
    assert kernel.source.count(f"if ({together})") == 2
    assert kernel.source.count(f"rxv0 = ffk_ll_value({slot}[0]);") == 2
    assert kernel.source.count(f"rxv{gates - 1} = ffk_ll_take({slot}[{gates - 1}], ") == 2  # the waits
    assert kernel.source.count("const float rxv0 = ffk_ll_take(") == 0
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)
    resident = generate(
        plan, lane_cells=lane_cells, inputs_ahead=ahead, take_together=True, input_helpers=False, resident=True
    )
    assert resident.source.count(f"if ({together})") == 2
    _emulate_against_interpreter(resident, program, 2, tmp_path / "resident")
    with pytest.raises(CompileError, match="at least one position ahead"):
        generate(plan, inputs_ahead=0)


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,batch,per",
    [  # the emulator runs a std::thread per CUDA thread (under ThreadSanitizer): small grids
        ("lstm", 64, 7, 1, 2),  # 256 words a position, 192 helpers: two words for some
        ("gru", 32, 5, 2, 1),  # two batch rows: 192 words, 192 helpers
        ("liquid", 48, 6, 1, 1),  # 48 cells: the helpers from the next warp on
        ("lstm", 64, 2, 1, 2),  # two positions: position 1 loaded before the loop, nothing in it
    ],
)
def test_a_one_block_recurrences_inputs_are_taken_by_the_threads_past_its_cells(arch, embed, seq, batch, per, tmp_path):
    """generate(input_helpers=True) (codegen.RECUR_INPUT_HELPERS, on by default): the block's
    threads past the cells take each position's input words a position ahead into shared memory
    (rX's two buffers) and the cells read them there, no load or take of their own; the emulated
    kernel (ThreadSanitizer: the helpers' stores against the cells' reads across the barriers)
    computes the interpreter's values, and the resident kernel over two frames; with inputs_ahead,
    the same loop unrolled. The lanes loop keeps its own loads."""
    from framefuse.compiler import codegen
    from framefuse.compiler.ir import Recur

    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    plan = schedule(program, grid=4, threads=256)
    assert [t.blocks for t in plan.tasks if isinstance(t.root, Recur)] == [1, 1]
    node = next(t.root for t in plan.tasks if isinstance(t.root, Recur))
    cells, words = node.batch * node.hidden, node.batch * node.gates * node.hidden
    assert codegen.RECUR_INPUT_HELPERS is True and generate(plan).settings.input_helpers
    assert "threads past the cells" not in generate(plan, input_helpers=False).source
    kernel = generate(plan, input_helpers=True)
    assert kernel.identity == generate(plan).identity
    assert kernel.settings.input_helpers and kernel.describe()["input_helpers"] is True
    source = kernel.source
    helpers = 256 - -(-cells // 32) * 32  # from the warp after the cells' last
    assert source.count(f"// the inputs: the {helpers} threads past the cells take each position's {words} words") == 2
    assert (f"else if (tid >= {256 - helpers})" in source) is (cells % 32 != 0)
    assert source.count(f"unsigned long long rxh[{per}];") == 2
    assert "rxv0" not in source and "unsigned long long rxw" not in source  # no cell loads its inputs
    assert source.count("rX[((rcs + 1) & 1) * ") == 2 * per  # a line a helper's word, both recurrences
    assert source.count(f"if (rcs + 2 < {seq}) {{") == 2
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)
    resident = generate(plan, input_helpers=True, resident=True)
    assert resident.source.count("threads past the cells take each position's") == 2
    _emulate_against_interpreter(resident, program, 2, tmp_path / "resident")
    lanes = generate(plan, input_helpers=True, lane_cells=True)
    assert "lanes a unit" in lanes.source and "threads past the cells" not in lanes.source
    if seq > 2:  # inputs_ahead unrolls the loop of the helpers' kernel: nothing more loaded ahead
        unrolled = generate(plan, input_helpers=True, inputs_ahead=4)
        assert unrolled.source.count("for (int rcd = 0; rcd < 4; ++rcd)") == 2
        assert unrolled.source.count(f"unsigned long long rxh[{per}];") == 2 and "rxw" not in unrolled.source
        _emulate_against_interpreter(unrolled, program, 1, tmp_path / "unrolled", races=True)


def test_lanes_a_unit_are_whole_warps_of_float4_splits_within_the_registers(monkeypatch):
    """recur_lanes: the most lanes (a power of two) whose threads fill whole warps of the block,
    whose K splits are whole float4s and whose gate rows fit RECUR_REGISTER_WEIGHTS; none when off."""
    from types import SimpleNamespace

    from framefuse.compiler import codegen

    def node(hidden, gates=4, batch=1):
        return SimpleNamespace(hidden=hidden, gates=gates, batch=batch)

    assert codegen.recur_lanes(node(64), 256) == 0  # off by default
    monkeypatch.setattr(codegen, "RECUR_LANE_CELLS", True)
    assert codegen.recur_lanes(node(64), 256) == 4  # 16 of K a lane, 64 weights
    assert codegen.recur_lanes(node(64), 384) == 4  # 8 lanes would need 512 threads
    assert codegen.recur_lanes(node(64), 1024) == 16  # 4 of K a lane
    assert codegen.recur_lanes(node(64), 128) == 2  # 32 of K a lane, 128 weights: the most registers
    assert codegen.recur_lanes(node(64), 64) == 0  # no room for two lanes a unit
    assert codegen.recur_lanes(node(48, gates=3), 256) == 4  # 12 of K a lane
    assert codegen.recur_lanes(node(40, gates=3), 256) == 0  # 80 threads are not whole warps, 40 / 4 not float4s
    assert codegen.recur_lanes(node(24, gates=3), 96) == 0  # 48 threads are not whole warps
    assert codegen.recur_lanes(node(128), 256) == 0  # 2 lanes: 4 x 64 weights, over the registers


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,batch,smem,threads,grid,blocks,ahead",
    [  # 256 threads on a grid of 4: the emulator runs a std::thread per CUDA thread (under TSan)
        ("lstm", 64, 7, 1, None, 256, 4, 1, True),
        ("gru", 32, 5, 2, 768, 128, 12, 4, False),
        ("liquid", 48, 6, 1, None, 256, 4, 1, True),
    ],
)
def test_a_recurrence_keeps_its_rows_of_r_in_registers(
    arch, embed, seq, batch, smem, threads, grid, blocks, ahead, monkeypatch, tmp_path
):
    """schedule.RECUR_REGISTER_WEIGHTS: a thread's K split of its product row of R (at most that many
    weights, splits dividing H) lives in registers for the whole window and the product reads h as
    float4s: one block holding every unit (h in shared memory, inputs a position ahead) and units
    split over blocks; the emulated kernel (ThreadSanitizer) computes the interpreter's values."""
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.ir import Recur

    if smem is not None:
        monkeypatch.setattr(sched, "RECUR_SMEM_FLOATS", smem)
    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    plan = schedule(program, grid=grid, threads=threads)
    loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
    assert [t.blocks for t in loops] == [blocks, blocks]
    kernel = generate(plan)
    assert kernel.source.count("in registers for the whole window") == 2
    # the one-block cases have threads past their cells, which take the inputs a position ahead
    # (codegen.RECUR_INPUT_HELPERS); units over several blocks load their own
    assert kernel.source.count("threads past the cells take each position's") == (2 if ahead else 0)
    assert "loaded a position ahead" not in kernel.source
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)


@needs_cxx
@pytest.mark.parametrize("arch,embed,seq,batch", [("lstm", 40, 6, 1), ("gru", 36, 5, 2)])
def test_a_recurrence_too_wide_for_its_usual_blocks_holds_r_over_more(arch, embed, seq, batch, monkeypatch, tmp_path):
    """schedule.RECUR_WIDE: R that does not fit RECUR_MAX_BLOCKS blocks at RECUR_SMEM_FLOATS is held
    over up to RECUR_WIDE_MAX_BLOCKS blocks with the whole arena (hidden 1024's 16 MB over 128
    H100 blocks); the emulated kernel (ThreadSanitizer) computes the interpreter's values."""
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.ir import Recur

    monkeypatch.setattr(sched, "RECUR_SMEM_FLOATS", 256)
    monkeypatch.setattr(sched, "RECUR_MAX_BLOCKS", 2)
    monkeypatch.setattr(sched, "RECUR_WIDE_MAX_BLOCKS", 16)
    monkeypatch.setattr(sched, "RECUR_ARENA_RESERVE", 0)
    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    plan = schedule(program, grid=24, threads=128, smem_floats=500)
    loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
    assert len(loops) == 2
    for task in loops:
        assert task.blocks == -(-embed // -(-embed // 16)) and task.chunk == -(-embed // 16)
        assert sched.recur_split(task.root, 24, task.stage_limit)[2]  # held
        assert 500 < sched.task_smem_floats(task) <= 1000  # more than a task's usual bound: the arena
    kernel = generate(plan)
    assert kernel.source.count("R in shared memory") == 2
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)


@needs_cxx
@pytest.mark.parametrize("arch,embed,seq,batch", [("lstm", 40, 6, 2), ("gru", 48, 5, 1)])
def test_a_recurrence_reads_r_from_global_memory_laid_out_by_k(arch, embed, seq, batch, monkeypatch, tmp_path):
    """codegen.RECUR_GLOBAL_ROWS_BY_K: R that does not fit shared memory is read from a copy laid
    out per block by k (the held rows' order, in global memory); R's rows of each block's units,
    zero past H, and the emulated kernel (ThreadSanitizer) computes the interpreter's values."""
    from framefuse.compiler import codegen
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.ir import Recur

    monkeypatch.setattr(sched, "RECUR_SMEM_FLOATS", 256)
    monkeypatch.setattr(sched, "RECUR_MAX_BLOCKS", 3)  # more units a block than R's rows fit: not held
    monkeypatch.setattr(sched, "RECUR_WIDE", False)
    monkeypatch.setattr(codegen, "RECUR_GLOBAL_ROWS_BY_K", True)
    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 0}
    _, program = _sequence_program(arch, config)
    plan = schedule(program, grid=12, threads=128)
    loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
    assert loops and not any(sched.recur_split(t.root, 12, t.stage_limit)[2] for t in loops)
    node, task = loops[0].root, loops[0]
    by_k = codegen._recur_rows_by_k(node, task.chunk, task.blocks).reshape(task.blocks, node.hidden, -1)
    G, H, HB = node.gates, node.hidden, task.chunk
    for b in range(task.blocks):
        for g in range(G):
            for j in range(HB):
                unit = b * HB + j
                want = node.rows[g * H + unit] if unit < H else np.zeros(H, np.float32)
                assert np.array_equal(by_k[b, :, g * HB + j], want)
    kernel = generate(plan)
    assert kernel.source.count("the block's rows by k") == 2
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)


@needs_cxx
@pytest.mark.parametrize("arch", ["min_gru", "mamba", "xlstm"])
def test_scan_prefix_ranges_stage_less_and_keep_the_values(arch, monkeypatch, tmp_path):
    """schedule.SCAN_PREFIX_RANGES: a Scan element at position t reads positions 0..t only, so the
    blocks holding early positions stage less of the scan's inputs; the emulated kernel (with
    ThreadSanitizer) still computes the interpreter's values. With simplify.SCAN_COLUMNS off: a
    column scan's blocks stage whole columns, which a prefix does not shorten."""
    from framefuse.compiler import schedule as sched
    from framefuse.compiler import simplify

    monkeypatch.setattr(simplify, "SCAN_COLUMNS", False)
    _, program = _sequence_program(arch, {"model": {"embed": 64, "layers": 2}, "seq": 8, "seed": 0})

    before = _staged_floats(schedule(program, grid=16, threads=128))
    monkeypatch.setattr(sched, "SCAN_PREFIX_RANGES", True)
    after_schedule = schedule(program, grid=16, threads=128)
    assert _staged_floats(after_schedule) < before
    _emulate_against_interpreter(generate(after_schedule), program, 1, tmp_path, races=True)


def _staged_floats(sched) -> int:
    """Floats of flag-tagged values staged into shared memory, summed over the blocks."""
    return sum(
        int((u.hi - u.lo).clip(0).sum())
        for task in sched.tasks
        for u in task.arrays()
        if u.how == "thread" and task.view.source_kind(u.node) == "materialized"
    )


@needs_cxx
@pytest.mark.parametrize("arch", ["min_gru", "min_lstm", "gated_ssm"])
def test_a_window_scan_runs_its_columns_in_order_in_a_task_of_its_own(arch, monkeypatch, tmp_path):
    """simplify.ScanColumns: every window scan runs along its last axis, in a task of its own
    whose blocks own whole columns; the column loop runs each position once; the emulated kernel
    (ThreadSanitizer) computes the interpreter's values, and stages less over the grid than the
    scans computed where they are read. The inputs are stored column by column, so a block stages
    no more than its own columns of each."""
    from framefuse.compiler import simplify

    config = {"model": {"embed": 64, "layers": 2}, "seq": 8, "seed": 0}
    _, program = _sequence_program(arch, config)
    sched = schedule(program, grid=16, threads=128)
    scans = [n for n in program.nodes() if n.kind == "scan"]
    assert scans and all(n.axis == n.rank - 1 for n in scans)
    for scan in scans:
        (task,) = [t for t in sched.tasks if t.root.id == scan.id]
        assert task.chunk % scan.steps == 0
        assert scan.id in sched.layouts  # stored back in the window's order
        for u in task.arrays():
            if u.how == "thread" and task.view.source_kind(u.node) == "materialized":
                assert u.node.id in sched.layouts and u.storage <= task.chunk, (u.node, u.storage, task.chunk)
    kernel = generate(sched)
    assert kernel.source.count("a thread per column") == len(scans)
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)
    monkeypatch.setattr(simplify, "SCAN_COLUMNS", False)
    _, rows = _sequence_program(arch, config)
    assert _staged_floats(sched) < _staged_floats(schedule(rows, grid=16, threads=128))


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,batch,grid,threads",
    [
        ("min_gru", 40, 7, 2, 5, 64),
        ("gated_ssm", 24, 9, 3, 7, 96),
        ("mamba", 24, 5, 2, 6, 64),
        ("min_lstm", 40, 13, 1, 3, 32),
    ],
)
def test_column_scans_at_odd_sizes_and_batches_emulate_the_interpreter(
    arch, embed, seq, batch, grid, threads, tmp_path
):
    """Column scans where the columns do not divide over the blocks, with batch rows, odd
    positions and widths (mamba's broadcast inputs too): each block's chunk is whole columns, and
    the emulated kernel (ThreadSanitizer) computes the interpreter's values."""
    config = {"model": {"embed": embed, "layers": 2}, "seq": seq, "batch": batch, "seed": 1}
    _, program = _sequence_program(arch, config)
    sched = schedule(program, grid=grid, threads=threads)
    scans = [t for t in sched.tasks if t.root.kind == "scan"]
    assert scans and all(t.chunk % t.root.steps == 0 for t in scans)
    _emulate_against_interpreter(generate(sched), program, 1, tmp_path, races=True)


def test_a_copy_mostly_of_elements_nobody_reads_is_read_in_place(monkeypatch):
    """schedule.SPARSE_COPY_ANY (on since timed in session 25): in mamba's window at embed 256, T = 32 on 132
    blocks, the output's task reads its convolution's [D, T] result a position at a time, and a
    block's copy of it is the hull of a few channels at every position (16,352 floats for 125
    elements); read in place instead, the blocks stage less. (Not emulated at this size; the
    in-place reads themselves are emulated by the next test, the stored orders by the column-scan
    tests.)"""
    from framefuse.compiler import schedule as sched

    _, program = _sequence_program("mamba", {"seq": 32, "seed": 0})
    smem = (227 * 1024 - 1024) // 8
    monkeypatch.setattr(sched, "SPARSE_COPY_ANY", False)
    before = schedule(program, grid=132, smem_floats=smem)
    monkeypatch.setattr(sched, "SPARSE_COPY_ANY", True)
    after = schedule(program, grid=132, smem_floats=smem)
    assert _staged_floats(after) < _staged_floats(before)
    assert any(task.view.read_in_place for task in after.tasks)
    assert not any(task.view.read_in_place for task in before.tasks)

    def waits(s):
        source = generate(s).source
        return source[source.index("ffk_step(") :].count("ffk_ll_wait(")

    assert waits(after) > waits(before)


@needs_cxx
def test_a_staged_copy_over_shared_memory_is_read_in_place(tmp_path):
    """Mamba's convolution reads its in-projection's window channel-major: a block's copy is the
    hull over every position, nearly the whole value. Under a shared-memory budget those copies
    overflow, the schedule reads them where they lie (flag-waited words) instead of failing, and
    the kernel still computes the interpreter's values."""
    _, program = _sequence_program("mamba", {"model": {"embed": 64, "layers": 2}, "seq": 8, "seed": 0})

    def waits(kernel):
        return kernel.source[kernel.source.index("ffk_step(") :].count("ffk_ll_wait(")

    assert waits(generate(schedule(program, grid=16, threads=128))) == 0  # fits: everything staged
    kernel = generate(schedule(program, grid=16, threads=128, smem_floats=1024))
    assert waits(kernel) > 0
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)


@needs_cxx
@pytest.mark.parametrize("arch", ARCHS)
def test_resident_kernel_emulated_matches_the_interpreter(arch, tmp_path):
    """ffk_resident under emulation: one launch, a host thread ringing 4 frames (the frame written
    into the one input buffer, the bell, the done words, the idle word before the half the next
    frame writes is poisoned, then the stop); the outputs of every frame and the final state
    against the interpreter, and every block's counter advanced by the frames."""
    program = lower_program(_prepared(arch).fused)
    kernel = generate(schedule(program, grid=3, threads=64), resident=True)
    assert kernel.name == "ffk_resident"
    _emulate_against_interpreter(kernel, program, 4, tmp_path)


@needs_cxx
@pytest.mark.parametrize("arch", ["min_gru", "attention"])
def test_resident_kernel_emulated_has_no_data_race(arch, tmp_path):
    """The frame protocol under ThreadSanitizer: the go, finished and idle words order every
    frame's state stores before the next frame's reads and the host's writes (a missing
    acquire/release or barrier is a reported race)."""
    program = lower_program(_prepared(arch).fused)
    kernel = generate(schedule(program, grid=3, threads=64), resident=True)
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)


@needs_cxx
@pytest.mark.parametrize("arch", ["min_gru", "mamba"])
def test_resident_kernel_with_the_leader_last_emulated(monkeypatch, arch, tmp_path):
    """codegen.RESIDENT_LEADER_LAST: the leader is a block that reads no frame and joins the frame
    at the latest dependency level (a block with no task latest of all), the first such block
    where none joins later than the first frame-free block; the frame protocol still orders every
    frame under ThreadSanitizer while the frame block publishes the go (RESIDENT_FRAMER_GO)."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_FRAMER_GO", True)
    monkeypatch.setattr(codegen, "RESIDENT_LEADER_LAST", True)
    program = lower_program(_prepared(arch).fused)
    sched = schedule(program, grid=5, threads=64)
    kernel = generate(sched, resident=True)
    body = kernel.source.split('extern "C"')[-1]
    leader = int(re.search(r"ffk_epoch_s = b == (\d+) \? ffk_lead_frame<true>\(", body).group(1))
    framer = re.search(r"const bool ffk_framer = (.*);", body).group(1)

    levels = sched.task_levels()

    def joins(b):  # the dependency level of the block's first task
        t = next((t for t, task in enumerate(sched.tasks) if task.first <= b < task.first + task.blocks), None)
        return len(sched.tasks) + 1 if t is None else levels[t]

    others = [b for b in range(5) if not eval(framer.replace("&&", "and").replace("||", "or"), {"b": b})]
    assert leader in others and joins(leader) == max(joins(b) for b in others)
    assert leader == others[0] or joins(leader) > joins(others[0])
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)


def test_the_leader_at_the_benchmark_size():
    """At the benchmark's size (132 blocks of 256, fewer-phases): mamba's leader is a block with no
    task (block 129, the frame block is 128); every xlstm block joins at level 1 or 2, so the first
    frame-free block, block 0, leads (session 68 timed a later one slower there)."""
    from framefuse.compiler import codegen
    from framefuse.engines.fusion import FEWER_PHASES

    assert codegen.RESIDENT_FRAMER_GO and codegen.RESIDENT_LEADER_LAST
    for arch, expected in (("mamba", 129), ("xlstm", 0)):
        kernel = generate_source(_prepared(arch, FULL).fused, grid=132, threads=256, resident=True, **FEWER_PHASES)
        body = kernel.source.split('extern "C"')[-1]
        assert int(re.search(r"ffk_epoch_s = b == (\d+) \? ffk_lead_frame<true>\(", body).group(1)) == expected, arch


@needs_cxx
@pytest.mark.parametrize("races", [False, True], ids=["outputs", "races"])
def test_resident_kernel_with_untagged_frames_emulated(monkeypatch, races, tmp_path):
    """The resident kernel that waits for the leader's go and then reads the frame's floats
    (codegen.RESIDENT_TAGGED_FRAMES off, the form before session 46 and resident_variants.py's
    untagged-frames variant) still matches the interpreter, also under ThreadSanitizer."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_TAGGED_FRAMES", False)
    program = lower_program(_prepared("lstm").fused)
    kernel = generate(schedule(program, grid=3, threads=64), resident=True)
    assert not kernel.tagged_frames and "ffk_framer" not in kernel.source
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=races)


@needs_cxx
@pytest.mark.parametrize(
    "arch,resident,races",
    [
        ("gru", False, False),
        ("attention", False, False),
        ("gru", True, False),
        ("mamba", True, False),
        ("min_gru", True, True),
        ("lstm/sequence", False, False),
        ("mamba/sequence", True, False),
    ],
    ids=lambda v: str(v),
)
def test_tagged_outputs_emulated_match_the_interpreter(monkeypatch, arch, resident, races, tmp_path):
    """Outputs as words (epoch << 32) | bits in host memory (codegen.TAGGED_OUTPUTS), launched and
    resident: the harness takes each output once its word carries the step's epoch (a word left
    unwritten aborts the run), so the values are the interpreter's only if every element was
    stored with the right epoch; the blocks that only write outputs raise no done word and lose
    their system fence, the frame's blocks keep theirs. The resident frame protocol also under
    ThreadSanitizer (the host takes the words with acquire loads, the kernel stores them released);
    windows (T = 4) too, launched and resident."""
    from framefuse.compiler import codegen

    arch, _, form = arch.partition("/")
    program = _sequence_program(arch, SMALL)[1] if form else lower_program(_prepared(arch).fused)
    sched = schedule(program, grid=3, threads=64)
    plain = generate(sched, resident=resident)
    kernel = generate(sched, resident=resident, tagged_outputs=True)
    monkeypatch.setattr(codegen, "TAGGED_OUTPUTS", True)  # the module setting, as a field left None
    assert generate(sched, resident=resident).source == kernel.source
    assert kernel.tagged_outputs and not plain.tagged_outputs and kernel.settings.tagged_outputs
    assert "ffk_store_host_word(out0 + " in kernel.source and "ffk_store_host_word" not in plain.source
    assert 0 < kernel.done_words <= plain.done_words  # the frame's blocks only (a block with no word: no fence)
    assert kernel.done_words < plain.done_words or form  # (a window's output blocks may read its frames too)
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=races)


@needs_cxx
@pytest.mark.parametrize("chunk", [16, 32])
def test_tagged_outputs_in_whole_host_lines_emulated(monkeypatch, chunk, tmp_path):
    """The head's outputs written in chunks of 16 / 32 floats a block (schedule.HOST_WRITE_CHUNK,
    resident_variants.py's tagged-outputs-16 / -32): a block's tagged words are whole 128-byte host
    lines, or the whole head is one block's; the resident kernel's words carry each step's values
    (min_gru at the benchmark's size, its 32 outputs)."""
    from framefuse.compiler import schedule as schedule_module

    program = lower_program(prepare_cached("min_gru", FULL)["step"].fused)
    monkeypatch.setattr(schedule_module, "HOST_WRITE_CHUNK", chunk)
    sched = schedule(program, grid=24, threads=96, recomputed_scalars=64)
    (out,) = [node for name, node in program.outputs.items() if name not in program.state_of.values()]
    head = sched.tasks[sched.producer[out.id]]
    assert (head.blocks, head.chunk) == (32 // chunk, chunk)
    kernel = generate(sched, resident=True, tagged_outputs=True)
    _emulate_against_interpreter(kernel, program, 3, tmp_path)


@needs_cxx
@pytest.mark.parametrize("arch", ["gru", "attention"])
def test_resident_kernel_of_a_graph_without_state_emulated(arch, tmp_path):
    """A window without state kept resident (Session.step of a sequence-form graph): every frame's
    outputs are the interpreter's on that frame alone; the frame protocol under ThreadSanitizer
    for one of them."""
    _, program = _sequence_program(arch, {**SMALL, "seq": 4})
    assert not program.states
    kernel = generate(schedule(program, grid=3, threads=64), resident=True)
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=arch == "gru")


# -- narrow weight rows (codegen.WEIGHT_FORMATS) ------------------------------------------------------------


def test_narrow_rows_round_as_torch_and_pad_each_row_to_16_bytes():
    """fp16 / bf16 rows round to nearest even as torch's casts do (NaN stays NaN, ±Inf and
    overflow to ±Inf in fp16, subnormals kept); each row padded with zeros to 8 elements, two
    elements a 32-bit word, element 2i in the low half."""
    import torch

    from framefuse.compiler.codegen import NARROW_ROW_ALIGN, narrow_rows, rounded_rows

    rng = np.random.default_rng(0)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 70000.0, 1e-6, 3e-8, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 3.4e38]
    rows = np.concatenate([np.array(special, np.float32), rng.standard_normal(33).astype(np.float32) * 10]).reshape(
        5, 9
    )
    for fmt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        want = torch.from_numpy(rows).to(dtype).float().numpy()
        got = rounded_rows(rows, fmt)
        assert np.array_equal(np.isnan(got), np.isnan(rows)), fmt
        assert np.array_equal(got[~np.isnan(rows)], want[~np.isnan(rows)]), fmt
        words, row_words = narrow_rows(rows, fmt)
        stride = 2 * row_words  # 9 values padded to 16
        assert stride == 16 and stride % NARROW_ROW_ALIGN == 0 and words.dtype == np.float32
        halves = words.view(np.uint16).reshape(5, stride)
        assert not halves[:, 9:].any()  # the padding is zeros
        bits = torch.from_numpy(rows).to(dtype).view(torch.int16).numpy().view(np.uint16)
        finite = ~np.isnan(rows)
        assert np.array_equal(halves[:, :9][finite], bits[finite]), fmt
    # int8: precision/quantize's weight-only scheme, a scale a row ahead of the row's values
    from framefuse.compiler.codegen import INT8_HEADER_WORDS, quantized_rows

    wide = np.concatenate([rng.standard_normal((3, 21)).astype(np.float32) * 5, np.zeros((1, 21), np.float32)])
    q, scale = quantized_rows(wide)
    assert np.array_equal(np.abs(q).max(axis=1), [127, 127, 127, 0]) and scale[3] == 1.0
    back = rounded_rows(wide, "int8")
    assert np.all(np.abs(back - wide) <= scale[:, None] / 2 * (1 + 1e-6)) and not back[3].any()
    words, row_words = narrow_rows(wide, "int8")
    assert row_words == INT8_HEADER_WORDS + 32 // 4  # 21 values padded to 32 bytes
    packed = words.view(np.uint8).reshape(4, 4 * row_words)
    assert np.array_equal(packed[:, :4].copy().view(np.float32)[:, 0], scale) and not packed[:, 4:16].any()
    assert np.array_equal(packed[:, 16:37].view(np.int8), q) and not packed[:, 37:].any()
    with pytest.raises(CompileError, match="weight format 'fp8'"):
        generate(schedule(lower_program(_prepared("min_gru").fused), grid=3, threads=64), weight_format="fp8")


@needs_cxx
@pytest.mark.parametrize(
    "arch,weight_format",
    [(a, "fp16") for a in ARCHS]
    + [("min_gru", "bf16"), ("mamba", "bf16"), ("attention", "bf16"), ("lstm", "bf16")]
    + [("min_gru", "int8"), ("gru", "int8"), ("mamba", "int8"), ("attention", "int8"), ("xlstm", "int8")],
)
def test_narrow_weight_kernel_emulated_matches_the_interpreter_on_the_rows_it_reads(arch, weight_format, tmp_path):
    """Every product's rows stored as fp16 / bf16 (widened as read) or int8 (a scale a row): the
    emulated kernel over two chained frames against the float64 interpreter computing with those
    rows (Kernel.dot_rows), every output and the final state within 1e-5; the rows at most 0.6 of
    the bytes."""
    program = lower_program(_prepared(arch).fused)
    sched = schedule(program, grid=3, threads=64)
    kernel = generate(sched, weight_format=weight_format)
    wide = generate(sched)
    dots = {u.node.id for t in kernel.schedule.tasks for u in t.units.values() if u.how == "dot"}
    assert set(kernel.layout.narrow) == dots and dots
    assert ("ffk_seg_dot_q<" if weight_format == "int8" else "ffk_seg_dot_n<") in kernel.source
    assert "ffk_warp_dot<" not in kernel.source
    assert kernel.describe()["weight_bytes"] < 0.6 * wide.describe()["weight_bytes"]
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


@needs_cxx
@pytest.mark.parametrize(
    "arch,weight_format", [("lstm", "fp16"), ("mamba", "fp16"), ("attention", "int8"), ("xlstm", "fp16")]
)
def test_narrow_weight_window_kernels_emulated_match_the_interpreter(arch, weight_format, tmp_path):
    """The sequence form (8 positions over 16 blocks) with narrow product rows: the recurrences'
    own weights (ir.Recur's R) stay fp32, every product unit reads narrow rows."""
    _, program = _sequence_program(arch, {"model": {"embed": 64, "layers": 2}, "seq": 8, "seed": 0})
    kernel = generate(schedule(program, grid=16, threads=128), weight_format=weight_format)
    assert kernel.layout.narrow
    _emulate_against_interpreter(kernel, program, 1, tmp_path)


@needs_cxx
def test_narrow_weights_read_from_global_memory_and_resident_under_emulation(tmp_path):
    """Without the prefetch (every product reads its rows from the weight buffer in global
    memory) and in the resident kernel (rows copied into shared memory once), bf16 rows;
    ThreadSanitizer over the resident one."""
    program = lower_program(_prepared("gru").fused)
    sched = schedule(program, grid=3, threads=64)
    unfetched = generate(sched, prefetch=False, weight_format="bf16")
    assert unfetched.layout.narrow and not unfetched.layout.prefetch
    _emulate_against_interpreter(unfetched, program, 2, tmp_path / "global")
    resident = generate(sched, resident=True, weight_format="bf16")
    _emulate_against_interpreter(resident, program, 3, tmp_path / "resident", races=True)


@needs_cxx
@pytest.mark.parametrize("weight_format", ["fp16", "bf16", "int8"])
def test_narrow_rows_of_odd_length_read_one_weight_at_a_time_under_emulation(weight_format, tmp_path):
    """Rows of 13 and 7 weights (not a multiple of 4: the scalar walk of ffk_seg_dot_n /
    ffk_seg_dot_q, each row still padded to 16 bytes) over 3 blocks, against the interpreter on
    the rows the kernel reads."""
    rng = np.random.default_rng(5)
    weights = [
        numpy_helper.from_array(rng.standard_normal((9, 13)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((13, 7)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.standard_normal((7, 5)).astype(np.float32), "w3"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("Tanh", ["a"], ["ta"]),
        helper.make_node("MatMul", ["ta", "w2"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["sb"]),
        helper.make_node("MatMul", ["sb", "w3"], ["y"]),
    ]
    model = _graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        weights,
    )
    program = lower_program(model)
    kernel = generate(schedule(program, grid=3, threads=64), weight_format=weight_format)
    odd = [dot for dot in program.nodes() if dot.kind == "dot" and dot.k % 4 and dot.id in kernel.layout.narrow]
    assert odd, "no narrow product with a row of odd length"
    assert re.search(r"ffk_seg_dot_[nq]<(13|7), \d+, false", kernel.source)
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


@needs_cxx
def test_a_product_whose_rows_a_format_cannot_hold_keeps_fp32_rows(tmp_path):
    """A weight beyond fp16's range (it would read back as inf) or not finite (int8 has no
    NaN): that product keeps its float32 rows, the others go narrow, and the kernel still matches
    the interpreter (the NaN weight's outputs NaN on both sides)."""
    program = lower_program(_prepared("min_gru").fused)
    dots = [n for n in program.nodes() if n.kind == "dot"]
    big, odd = dots[0], dots[-1]
    big.rows[0, 0] = 1e6
    odd.rows[1, 2] = np.nan
    sched = schedule(program, grid=3, threads=64)
    for weight_format, kept in (("fp16", big), ("int8", odd)):
        kernel = generate(sched, weight_format=weight_format)
        assert kept.id not in kernel.layout.narrow and len(kernel.layout.narrow) >= 2, weight_format
        _emulate_against_interpreter(kernel, program, 1, tmp_path / weight_format)


@pytest.mark.parametrize("arch", ["min_gru", "lstm", "mamba", "attention"])
def test_an_int8_weight_only_graph_lowers_with_its_dequantized_weights(arch, tmp_path):
    """`framefuse build --precision int8`'s default graph (precision/quantize: int8 weights, a
    scale per output channel, DequantizeLinear before each product): the weights fold to the
    float32 values the graph computes, and the interpreter matches ONNX Runtime running that graph
    as written (its optimiser off: its fused integer kernels quantize the activations too); an
    activation Q/DQ graph is declined naming the node."""
    from framefuse.plugins.ort_bridge import ort_session
    from framefuse.precision import convert_model

    prepared = _prepared(arch)
    model = convert_model(onnx.load(str(prepared.fused)), "int8", config=prepared.manifest["config"])
    assert "DequantizeLinear" in {n.op_type for n in model.graph.node}
    program = lower_program(model)
    path = tmp_path / "model.int8.onnx"
    onnx.save(model, str(path))
    session = ort_session(str(path), optimize=False)
    feeds = _feeds(program, np.random.default_rng(1))
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, feeds)))
    actual = naive.run(program, feeds)
    for name in names:
        _close(actual[name], expected[name], f"{arch} int8 {name}", tol=1e-5)
    if arch == "min_gru":
        qdq = convert_model(onnx.load(str(prepared.fused)), "int8", config=prepared.manifest["config"], int8_mode="qdq")
        with pytest.raises(CompileError, match=r"node '\w+' \((De)?QuantizeLinear\)"):
            lower_program(qdq)  # the activations' QuantizeLinear (no lowering) comes first


# -- a precision build's graph: widened storage, lossless narrow rows (issue 19 item 4) -----------------


def _weights_as_stored(model: onnx.ModelProto) -> onnx.ModelProto:
    """The precision build's graph rewritten, independently of the lowering, into the float32 graph
    the widened lowering means: fp16 / bf16 initializers as float32 (the same values), a Cast of
    a constant to fp16 / bf16 still rounding it (followed by a Cast back to float32), a Cast of a
    computed value to fp16 / bf16 an Identity. ONNX Runtime runs it."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    low = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    constants = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    for init in graph.initializer:
        if init.data_type in low:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    nodes = []
    for node in graph.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None
        if to in low and node.input[0] in constants:
            rounded = node.output[0] + "/rounded"
            nodes.append(helper.make_node("Cast", [node.input[0]], [rounded], to=to, name=node.name))
            nodes.append(helper.make_node("Cast", [rounded], [node.output[0]], to=TensorProto.FLOAT))
        elif to in low:
            nodes.append(helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name))
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return model


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_half_precision_graph_lowers_with_its_weights_as_stored(arch, precision, tmp_path):
    """`framefuse build --precision fp16 | bf16`'s graph (precision/convert: Casts around the
    products, fp16 / bf16 weights) is declined as it is and lowers with ``widen_storage``: the
    interpreter matches ONNX Runtime on the same graph rewritten by hand into float32 with the
    stored weights (within 1e-5), and the converted graph as written (the cuda-graph engine on the
    CPU: ONNX Runtime has no bf16 Gemm there) within the precision's tolerance (it also rounds the
    activations)."""
    from framefuse.config import PRECISION_TOLERANCE
    from framefuse.engines.cuda_graph import CudaGraphEngine
    from framefuse.plugins.ort_bridge import ort_session
    from framefuse.precision import convert_model

    prepared = _prepared(arch)
    model = convert_model(onnx.load(str(prepared.fused)), precision, config=prepared.manifest["config"])
    with pytest.raises(CompileError, match=r"\(Cast\): Cast to TensorProto\.(B?FLOAT16)"):
        lower_program(model)
    program = lower_program(model, widen_storage=True)
    feeds = _feeds(program, np.random.default_rng(2))
    actual = naive.run(program, feeds)
    path = tmp_path / "as_stored.onnx"
    onnx.save(_weights_as_stored(model), str(path))
    session = ort_session(str(path))
    names = [o.name for o in session.get_outputs()]
    for name, expected in zip(names, session.run(names, feeds)):
        _close(actual[name], expected, f"{arch} {precision} as stored {name}", tol=1e-5)
    as_written = CudaGraphEngine(model, device="cpu").run(feeds)
    for name in names:
        _close(
            actual[name], as_written[name], f"{arch} {precision} as written {name}", tol=PRECISION_TOLERANCE[precision]
        )


def test_stores_exactly_tells_stored_rows_from_rows_a_format_would_round():
    """codegen.stores_exactly: fp16 / bf16 rows already rounded (NaN, ±Inf and zeros included)
    are stored as they are, float32 rows are not; int8 rows that are a row scale times integers in
    [-127, 127] (precision/quantize's weight-only scheme, the products computed in float32) are,
    other rows are not; beyond fp16's range never."""
    from framefuse.compiler.codegen import quantized_rows, rounded_rows, stores_exactly

    rng = np.random.default_rng(3)
    rows = rng.standard_normal((6, 40)).astype(np.float32)
    for fmt in ("fp16", "bf16"):
        assert not stores_exactly(rows, fmt)
        stored = rounded_rows(rows, fmt)
        stored[0, :3] = [np.nan, np.inf, -0.0]
        assert stores_exactly(stored, fmt), fmt
    assert not stores_exactly(np.full((1, 4), 70000.0, np.float32), "fp16")
    q, scale = quantized_rows(rows * 3)
    dequantized = (q.astype(np.float32) * scale[:, None]).astype(np.float32)
    dequantized[5] = 0.0
    assert stores_exactly(dequantized, "int8")
    assert not stores_exactly(rows, "int8")
    nudged = dequantized.copy()
    nudged[1, 7] += scale[1] / 10  # off the grid by a tenth of a step
    assert not stores_exactly(nudged, "int8")
    assert not stores_exactly(np.array([[np.nan, 1.0]], np.float32), "int8")
    assert stores_exactly(rows, "fp32")


@needs_cxx
@pytest.mark.parametrize(
    "arch,precision", [("min_gru", "fp16"), ("lstm", "bf16"), ("mamba", "fp16"), ("attention", "int8"), ("gru", "int8")]
)
def test_a_precision_build_kernel_stores_the_graphs_weights_narrow_and_computes_the_same(arch, precision, tmp_path):
    """A precision build's step kernel (engines.fusion.PRECISION_ROWS): the graph lowered with its
    weights as stored, the products whose rows the format holds exactly read narrow
    (lossless_rows), the others float32. The rows it reads are the program's own, bit for bit
    (int8: within a few ulps), so the emulated kernel matches the interpreter on the program's
    rows, and the kernel with float32 rows of the same program computes the same outputs."""
    from framefuse.compiler.codegen import stores_exactly
    from framefuse.precision import convert_model

    prepared = _prepared(arch)
    model = convert_model(onnx.load(str(prepared.fused)), precision, config=prepared.manifest["config"])
    program = lower_program(model, widen_storage=precision != "int8")
    sched = schedule(program, grid=3, threads=64)
    kernel = generate(sched, weight_format=precision, lossless_rows=True)
    dots = {u.node.id: u.node for t in sched.tasks for u in t.units.values() if u.how == "dot"}
    assert kernel.layout.narrow and set(kernel.layout.narrow) <= set(dots)
    for nid, dot in dots.items():
        assert (nid in kernel.layout.narrow) == stores_exactly(dot.rows, precision)
    for nid, rows in kernel.dot_rows().items():
        np.testing.assert_allclose(rows, dots[nid].rows, rtol=0, atol=1e-6 * float(np.abs(rows).max() or 1))
        if precision != "int8":
            assert np.array_equal(rows, dots[nid].rows)
    assert kernel.describe()["lossless_rows"] and kernel.describe()["narrow_products"] == len(kernel.layout.narrow)
    assert kernel.describe()["weight_bytes"] < generate(sched).describe()["weight_bytes"]
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


@pytest.mark.parametrize("arch, op", [("lstm", "LSTMSeq"), ("gru", "GRUSeq"), ("liquid", "LiquidScan")])
def test_an_int8_build_kernel_reads_the_recurrent_ops_weights_as_int8(arch, op):
    """The LSTM's / GRU's W and R and the liquid cell's R are int8 rows in an int8 build
    (precision/quantize.OP_WEIGHTS), and the kernel reads them narrow: more narrow products and a
    smaller weight buffer than the int8 build with the op kept in float32 (at this test's embed 32:
    61-63 % of the float32 rows' bytes against 80-94 %; at the benchmark's embed 256, lstm 33 %)."""
    from framefuse.precision import convert_model

    prepared = _prepared(arch)

    def kernel_weights(keep):
        model = convert_model(onnx.load(str(prepared.fused)), "int8", keep_fp32=keep)
        sched = schedule(lower_program(model), grid=3, threads=64)
        narrow = generate(sched, weight_format="int8", lossless_rows=True).describe()
        return narrow["narrow_products"], narrow["weight_bytes"] / generate(sched).describe()["weight_bytes"]

    (products, share), (products_kept, share_kept) = kernel_weights([]), kernel_weights([op])
    assert products > products_kept and share < 0.7 < share_kept, (products, share, products_kept, share_kept)


def test_resident_source_reuses_weights_and_reads_state_coherently(monkeypatch):
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_TAGGED_FRAMES", True)

    prepared = _prepared("mamba")
    launched = generate_source(prepared.fused, grid=8, threads=128)
    resident = generate_source(prepared.fused, grid=8, threads=128, resident=True)
    assert resident.source.count('extern "C" __global__') == 1 and "ffk_resident(" in resident.source
    assert np.array_equal(resident.ranges(), launched.ranges()) and resident.smem_bytes == launched.smem_bytes
    # the weight rows are copied on the first frame only, the state every frame
    assert codegen.RESIDENT_WEIGHTS_ONCE and "(src != 0 || ffk_n == 0)" in resident.source
    # no state value through the read-only cache in the resident kernel (the state changes under
    # it): seen where nothing is prefetched, so every state value is read where it is used
    sched = schedule(lower_program(prepared.fused), grid=8, threads=128)
    assert "__ldg(sin" in generate(sched, prefetch=False).source
    unprefetched = generate(sched, prefetch=False, resident=True).source
    assert "__ldg(sin" not in unprefetched and "ffk_ld_cg(sin" in unprefetched
    # the first copies issued before the go, after every block is through the last frame
    loop = resident.source[resident.source.index("for (;; ++ffk_n)") :]
    assert loop.index("ffk_wait_finished") < loop.index("ffk_prefetch_commit") < loop.index("ffk_wait_go")
    # tagged frames: the input is words, the frame's blocks poll them (not the go), and the leader
    # is a block that reads no frame
    assert resident.tagged_frames and not launched.tagged_frames
    assert "const unsigned long long* __restrict__ in0" in resident.source
    step_body = launched.source[launched.source.index("ffk_step(") :]
    assert "const float* __restrict__ in0" in step_body and "ffk_poll_frame(" not in step_body
    framer = re.search(r"const bool ffk_framer = (.*);", resident.source).group(1)
    leader = int(re.search(r"ffk_epoch_s = b == (\d+) \? ffk_lead_frame", resident.source).group(1))
    assert "(ffk_framer ? e : ffk_wait_go(ffk_ctl, e))" in loop and "ffk_poll_frame(in0" in loop
    assert not eval(framer.replace("&&", "and").replace("||", "or"), {"b": leader})
    # the frame block publishes the go once its words are in, and the leader takes that go or its
    # bell (RESIDENT_FRAMER_GO); without it, only the leader's bell
    assert codegen.RESIDENT_FRAMER_GO and "ffk_lead_frame<true>(" in loop
    assert loop.index("ffk_poll_frame(in0") < loop.index("if (tid == 0) ffk_go(ffk_ctl, ffk_epoch_s);")
    monkeypatch.setattr(codegen, "RESIDENT_FRAMER_GO", False)
    plain = generate_source(prepared.fused, grid=8, threads=128, resident=True).source.split('extern "C"')[-1]
    assert "ffk_lead_frame<false>(" in plain and "ffk_lead_frame<true>(" not in plain and "ffk_go(" not in plain


def test_enumerated_index_pairs_match_a_plain_loop_and_are_kept_only_while_scheduling():
    """schedule.enumerate_pairs (each variable on an axis of its own, results kept by occurrence
    while a schedule is built): the (element, index) pairs of an occurrence with a reduction
    variable and a guard are exactly a plain loop's, in its order, read-only; schedule() leaves
    nothing kept."""
    from framefuse.compiler import iexpr as ix
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.schedule import Occurrence, enumerate_pairs

    e, r = ix.Var("e0", 12), ix.Var("r1", 5)
    flat = ix.add(ix.mul(ix.floordiv(e, 3), 7), ix.add(ix.mod(e, 3), ix.mul(r, 2)))
    guard = (ix.add(ix.mod(e, 4), r), 1, 6)
    occ = Occurrence(None, flat, (r,), (guard,))
    expected = [(ev, (ev // 3) * 7 + ev % 3 + 2 * rv) for ev in range(12) for rv in range(5) if 1 <= ev % 4 + rv < 6]
    elems, where = enumerate_pairs(occ, e, 12)
    assert list(zip(elems.tolist(), where.tolist())) == expected
    assert not elems.flags.writeable and enumerate_pairs(occ, e, 12)[0] is elems
    plain = Occurrence(None, flat, (r,), ())
    assert len(enumerate_pairs(plain, e, 12)[0]) == 60
    schedule(lower_program(_prepared("min_gru").fused), grid=4, threads=64)
    assert not sched._pairs_memo


@pytest.mark.parametrize("overlapping", [False, True, "to the end"])
def test_needed_ranges_match_a_plain_loop(overlapping):
    """schedule.needed_ranges (per-element runs, every block's range reduced at once): each
    block's [min, max + 1) of what its elements read, as a plain loop finds it, also for pairs out
    of element order, blocks whose ranges overlap (replicated arrays), out of order, and ranges
    that end at the last element."""
    from framefuse.compiler.schedule import needed_ranges

    rng = np.random.default_rng(3)
    elements, size, grid = 200, 1000, 9
    elems = rng.integers(0, elements, 700)
    flat = rng.integers(0, size, 700)
    elems[elems % 7 == 0] = 1  # elements nothing reads
    if overlapping == "to the end":
        unit_lo = rng.integers(0, elements, grid)
        unit_hi = np.where(np.arange(grid) % 2 == 0, elements, np.minimum(unit_lo + 30, elements))
    elif overlapping:
        unit_lo = rng.integers(0, elements - 40, grid)
        unit_hi = unit_lo + rng.integers(0, 40, grid)
    else:
        cuts = np.sort(rng.integers(0, elements, grid + 1))
        unit_lo, unit_hi = cuts[:-1], cuts[1:]
    lo, hi = needed_ranges((elems, flat), unit_lo, unit_hi, elements, size)
    for b in range(grid):
        read = flat[(elems >= unit_lo[b]) & (elems < unit_hi[b])]
        expected = (int(read.min()), int(read.max()) + 1) if read.size else (0, 0)
        assert (int(lo[b]), int(hi[b])) == expected, b


@pytest.mark.parametrize("seed", range(6))
def test_shared_reads_match_counting_the_readers(seed):
    """schedule.shared_reads: whether a value element is read by two distinct elements, as
    counting each value element's distinct readers finds it, over several pair arrays (the same
    pair twice, the same element reading one value element from two occurrences, none at all)."""
    from framefuse.compiler.schedule import shared_reads

    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 60))
    pairs = []
    for _ in range(int(rng.integers(1, 4))):
        n = int(rng.integers(0, 12))
        elems = np.sort(rng.integers(0, 20, n))
        flat = rng.permutation(size)[: min(n, size)] if seed % 2 else rng.integers(0, size, n)
        pairs.append((elems[: len(flat)], flat[: len(elems)]))
    readers: dict = {}
    for elems, flat in pairs:
        for e, f in zip(elems.tolist(), flat.tolist()):
            readers.setdefault(f, set()).add(e)
    expected = any(len(r) > 1 for r in readers.values())
    assert shared_reads(pairs, size) == expected
    one = (np.array([3, 3, 4]), np.array([0, 0, 1]))
    assert not shared_reads([one, one], 2)  # one reader each, read twice
    assert shared_reads([one, (np.array([5]), np.array([1]))], 2)  # element 1 read by 4 and 5
    assert not shared_reads([], 4)


def test_code_settings_carry_a_kernels_choices_whatever_the_module_settings(monkeypatch):
    """codegen.CodeSettings: a kernel keeps the settings it was written with, resolved, so the
    resident twin or a reschedule generated from them is the same kernel even after a module
    setting changed; ``one_pass`` sets both one-pass fields; an unknown name is one clear error."""
    from framefuse.compiler import codegen
    from framefuse.compiler.codegen import CodeSettings

    plan = schedule(lower_program(_prepared("lstm").fused), grid=8, threads=128, smem_floats=40 * 1024)
    kernel = generate(plan, one_pass=True, copy_pieces=1024)
    assert kernel.settings == CodeSettings.of(one_pass=True, copy_pieces=1024).resolved()
    assert kernel.settings.phase_one_pass and kernel.settings.root_in_warp and kernel.settings.inputs_ahead == 1
    assert generate(plan, settings=kernel.settings).identity == kernel.identity
    monkeypatch.setattr(codegen, "ALIAS_VIEWS", True)
    monkeypatch.setattr(codegen, "PREFETCH_PACED", True)
    assert generate(plan, settings=kernel.settings).identity == kernel.identity  # resolved: no None left
    changed = generate(plan, settings=CodeSettings.of(one_pass=True, copy_pieces=1024))
    assert changed.settings.alias_views and changed.settings.paced_copies and changed.identity != kernel.identity
    # the describe() keys are the settings' names, one_pass for the two one-pass fields
    info = kernel.describe()
    assert info["one_pass"] is True and info["copy_pieces"] == 1024 and "phase_one_pass" not in info
    only_roots = CodeSettings.of(root_in_warp=True).resolved()
    assert only_roots.one_pass and not only_roots.phase_one_pass
    with pytest.raises(CompileError, match=r"unknown code setting\(s\) ahead, oen_pass: expected one_pass or"):
        generate(plan, oen_pass=True, ahead=4)
    with pytest.raises(CompileError, match="at least one position ahead, got 0"):
        generate(plan, inputs_ahead=0)
    with pytest.raises(CompileError, match="weight format 'fp8'"):
        CodeSettings.of(weight_format="fp8").resolved()


def test_the_build_tactics_share_one_program_and_schedule(monkeypatch):
    """compiler.memo: the tactics that differ only in generated code (pieces, paced) reuse the
    plain kernel's lowered program and schedule; other options, sizes or settings do not, and a
    reused schedule generates the kernel a fresh one does."""
    from framefuse.compiler import memo, simplify
    from framefuse.compiler import schedule as sched

    memo.clear()
    path = _prepared("min_gru").fused
    program = memo.cached_program(path)
    assert memo.cached_program(path) is program
    assert memo.cached_program(path, compose_input=False) is not program  # its input products composed
    assert simplify.composed_inputs(program)
    # a window's input is too wide to compose: without composing it is the same program, scheduled once
    window = prepare_cached("min_gru", {**SMALL, "seq": 8})["sequence"].fused
    composing = memo.cached_program(window)
    assert not simplify.composed_inputs(composing)
    assert memo.cached_program(window, compose_input=False) is composing
    uncomposed = lower_program(window, compose_input=False)
    assert (
        generate(schedule(uncomposed, grid=8, threads=128, smem_floats=40 * 1024)).identity
        == generate(memo.cached_schedule(composing, grid=8, threads=128, smem_floats=40 * 1024)).identity
    )
    loaded = memo.cached_program(onnx.load(str(path)))  # the build passes its executor's ModelProto
    assert memo.cached_program(onnx.load(str(path))) is loaded
    first = memo.cached_schedule(program, grid=8, threads=128, smem_floats=40 * 1024)
    assert memo.cached_schedule(program, grid=8, threads=128, smem_floats=40 * 1024) is first
    assert memo.cached_schedule(program, grid=8, threads=256, smem_floats=40 * 1024) is not first
    fresh = schedule(lower_program(path), grid=8, threads=128, smem_floats=40 * 1024)
    assert generate(first, copy_pieces=1024).identity == generate(fresh, copy_pieces=1024).identity
    monkeypatch.setattr(sched, "HOST_WRITE_CHUNK", 4)
    assert memo.cached_schedule(program, grid=8, threads=128, smem_floats=40 * 1024) is not first
    assert memo.cached_program(path) is not program
    memo.clear()


@needs_cxx
def test_emulated_kernel_with_one_block_and_one_warp(tmp_path):
    """The same program on a grid of 1 block of 32 threads: every task's work on one block, no
    element left to another (the schedule is right for any grid)."""
    prepared = _prepared("gru")
    program = lower_program(prepared.fused)
    kernel = generate(schedule(program, grid=1, threads=32))
    feeds = _feeds(program, np.random.default_rng(10))
    frames = {n: feeds[n][None] for n in program.inputs}
    outputs, final = emulate(kernel, frames, {n: feeds[n] for n in program.states}, steps=1, workdir=tmp_path)
    expected = naive.run(program, feeds)
    _close(outputs["y"][0], expected["y"], "y", tol=1e-5)


def test_a_graph_input_is_read_from_host_memory_only_by_its_own_task():
    """x read inline (a LayerNorm of the frame itself, as GPT-2's first block does) is read through
    its flag-tagged copy, not from mapped host memory by every block of the reader."""
    from onnx import TensorProto, helper, numpy_helper

    n = 64
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "w")
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["centred"]),
        helper.make_node("MatMul", ["centred", "w"], ["h"]),
        helper.make_node("Add", ["h", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    kernel = generate_source(model, grid=16, threads=64)
    assert kernel.source.count("ffk_load_host(in") == 1  # the entry read of x's own task
    if cxx_compiler() is not None:  # and the flag-tagged copy gives the same values
        program = lower_program(model)
        frame = rng.standard_normal((1, n)).astype(np.float32)
        outputs, _ = emulate(generate(schedule(program, grid=3, threads=64)), {"x": frame[None]}, {}, steps=1)
        _close(outputs["y"][0], naive.run(program, {"x": frame})["y"], "y", tol=1e-5)
    for arch in ARCHS:
        assert generate_source(_prepared(arch).fused, grid=16, threads=64).source.count("ffk_load_host(in") == 1


def _layer_norm_then_product(n: int, m: int, rng, *, bias: bool = True):
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array((1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32), "g"),
        numpy_helper.from_array((rng.standard_normal((n, m)) / np.sqrt(n)).astype(np.float32), "w"),
    ]
    ln_inputs = ["x", "g"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        ln_inputs.append("b")
    nodes = [
        helper.make_node("LayerNormalization", ln_inputs, ["xn"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["xn", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bias", [True, False], ids=["layernorm", "no-shift"])
def test_a_normalization_folds_into_the_products_that_read_it(bias):
    """W·LayerNorm(x) becomes r·((W∘g)·x − m·Σ(W∘g)) + W·b: the product reads x, the normalized row
    is never written, and the generated fp32 kernel (emulated) still matches the float64 reference
    and ONNX Runtime when the row's mean is far from zero. (The subtraction after the product loses
    bits in proportion to the mean; the LayerNorm's variance is taken of the row shifted by its
    first element, without which the kernel was 5e-4 off the reference at a mean of 100.)"""
    import onnxruntime as ort

    from framefuse.compiler.ir import Dot
    from framefuse.compiler.simplify import FoldNorms

    n, m = 96, 40
    rng = np.random.default_rng(3)
    model = _layer_norm_then_product(n, m, rng, bias=bias)
    raw, program = lower_onnx(model), lower_program(model)
    assert sum(FoldNorms.fold(d) is not None for d in raw.nodes() if isinstance(d, Dot)) == 1
    from framefuse.compiler.schedule import frame_source

    (product,) = [d for d in program.nodes() if isinstance(d, Dot)]
    source = product.src
    while isinstance(source, Map):
        source = source.src
    # it reads x: the input itself, or its slice of the frame published with the LayerNorm's 1/σ
    assert source.kind == "leaf" or frame_source(source) is not None
    assert not any(FoldNorms.fold(d) for d in program.nodes() if isinstance(d, Dot))  # nothing left to fold
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for offset in (0.0, 30.0, 100.0):
        frame = (offset + rng.standard_normal((1, n))).astype(np.float32)
        (expected,) = session.run(None, {"x": frame})
        # ONNX Runtime's own fp32 LayerNorm is ~1e-5 off the float64 interpreter at a mean of 30
        reference = naive.run(program, {"x": frame})["y"]
        _close(reference, expected, f"interpreter, mean {offset}", tol=1e-4)
        if cxx_compiler() is not None:
            outputs, _ = emulate(generate(schedule(program, grid=4, threads=64)), {"x": frame[None]}, {}, steps=1)
            _close(outputs["y"][0], expected, f"emulated kernel vs ONNX Runtime, mean {offset}", tol=1e-4)
            _close(outputs["y"][0], reference, f"emulated kernel vs interpreter, mean {offset}", tol=3e-5)


def test_a_composed_layernorm_variance_is_one_centred_sum_of_squares():
    """A LayerNorm of h = W_in·x + b (x a small graph input): its variance E[d²] − E[d]² becomes
    the sum of squares of the centred form, |R·x + v|² + e with R from the QR of the centred
    coefficients (ComposeInputProducts.variance). The frame's task has one product of x, R·x, and no
    row for the mean after it; nothing cancels, so the interpreter and the emulated kernel stay
    within 1e-4 of ONNX Runtime when h's mean is far from zero."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from framefuse.compiler.ir import Dot
    from framefuse.compiler.schedule import frame_source

    k, n, m = 48, 192, 24
    rng = np.random.default_rng(5)
    for offset in (0.0, 40.0):
        inits = [
            numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w_in"),
            numpy_helper.from_array((offset + rng.standard_normal(n)).astype(np.float32), "b_in"),
            numpy_helper.from_array((1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32), "g"),
            numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
            numpy_helper.from_array((rng.standard_normal((n, m)) / np.sqrt(n)).astype(np.float32), "w"),
        ]
        nodes = [
            helper.make_node("MatMul", ["x", "w_in"], ["hw"]),
            helper.make_node("Add", ["hw", "b_in"], ["h"]),
            helper.make_node("LayerNormalization", ["h", "g", "b"], ["hn"], axis=-1, epsilon=1e-5),
            helper.make_node("MatMul", ["hn", "w"], ["y"]),
        ]
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m])],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        program = lower_program(model)
        frames = [t for t in schedule(program, grid=4, threads=64).tasks if frame_source(t.root) is not None]
        assert len(frames) == 1, "the LayerNorm's 1/σ is published with the frame"
        norm_products = [d.label for d in program.nodes() if isinstance(d, Dot) and "LayerNormalization" in d.label]
        assert len(norm_products) == 1 and norm_products[0].endswith("(R·x)"), norm_products  # no mean row
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for _ in range(3):
            frame = rng.standard_normal((1, k)).astype(np.float32)
            (expected,) = session.run(None, {"x": frame})
            reference = naive.run(program, {"x": frame})["y"]
            _close(reference, expected, f"interpreter, mean {offset}", tol=1e-4)
            if cxx_compiler() is not None:
                outputs, _ = emulate(generate(schedule(program, grid=4, threads=64)), {"x": frame[None]}, {}, steps=1)
                _close(outputs["y"][0], expected, f"emulated kernel vs ONNX Runtime, mean {offset}", tol=1e-4)


def test_zoo_normalizations_fold_into_their_products():
    """Every LayerNorm that feeds products in the zoo is folded (an LSTM layer's 4 gate products
    and the head's, mamba's in-projections...), and the kernel's tasks lose the normalizing phase."""
    from framefuse.compiler.ir import Dot
    from framefuse.compiler.simplify import FoldNorms, SinkSlices

    for arch in ("lstm", "mamba", "attention"):
        raw = SinkSlices(lower_onnx(_prepared(arch).fused)).run()
        foldable = [d for d in raw.nodes() if isinstance(d, Dot) and FoldNorms.fold(d) is not None]
        assert len(foldable) >= 3, arch
        program = lower_program(_prepared(arch).fused)
        assert not any(FoldNorms.fold(d) for d in program.nodes() if isinstance(d, Dot)), arch


def test_schedule_reports_levels_tasks_and_one_kernel_source():
    prepared = _prepared("min_gru")
    kernel = generate_source(prepared.fused, grid=8, threads=128)
    info = kernel.describe()
    assert info["tasks"] >= info["levels"] >= 5  # x, in_proj, then two GEMV levels per layer, head
    assert kernel.source.count('extern "C" __global__') == 1
    assert "ffk_step" in kernel.source and "generated by framefuse.compiler" in kernel.source


def test_tasks_of_one_level_run_on_disjoint_blocks():
    """Tasks that do not wait on one another (mamba's three x-projection slices, attention's q, k
    and v) get their own blocks where the grid has room, so they run side by side."""
    for arch in ("mamba", "attention", "xlstm"):
        sched = schedule(lower_program(_prepared(arch).fused), grid=64)
        by_level: dict[int, list] = {}
        for task, level in zip(sched.tasks, sched.task_levels()):
            by_level.setdefault(level, []).append(task)
        shared = [tasks for tasks in by_level.values() if len(tasks) > 1]
        assert shared, f"{arch}: expected tasks that share a level"
        for tasks in shared:
            if sum(t.blocks for t in tasks) > 64:
                continue
            used = np.zeros(64, dtype=int)
            for t in tasks:
                used[t.first : t.first + t.blocks] += 1
                assert t.root_unit.lo[: t.first].tolist() == [t.root.size] * t.first  # no elements before
            assert used.max() == 1, f"{arch}: tasks of one level overlap on a block"


@pytest.mark.parametrize("arch", ARCHS)
def test_side_stores_never_add_a_level(arch, monkeypatch):
    """A value stored beside another task's root reaches its other readers when that host's level
    is done: a host of a later level than the value's own task would hold them back (xlstm's
    scaled key stored by the normalizer's task pushed C·q a level down in both layers: 11 levels
    instead of 9). Every task's level is the same or lower than with no side stores at all."""
    import framefuse.compiler.schedule as sched_module

    program = lower_program(_prepared(arch, FULL).fused)
    with_side = schedule(program, grid=132)
    monkeypatch.setattr(sched_module, "_absorb", lambda *args, **kwargs: {})
    without = schedule(program, grid=132)
    assert with_side.levels() <= without.levels(), f"{arch}: side stores add levels"
    level_without = {t.root.id: lv for t, lv in zip(without.tasks, without.task_levels())}
    for task, level in zip(with_side.tasks, with_side.task_levels()):
        if task.root.id in level_without:
            assert level <= level_without[task.root.id], f"{arch}: {task.root.label} waits a level longer"
    if arch == "xlstm":
        assert with_side.levels() == 8  # (9 before the first layer's products read the frame)


def test_flagged_values_are_staged_never_waited_on_one_by_one():
    """Every flag-tagged value a task reads is staged into shared memory with all loads in flight;
    no task waits on single words (a residual read in the root cost a round trip after the
    products), and the prologue's prefetch is one table-driven loop, not a copy per call site."""
    for arch in ("min_gru", "attention"):
        source = generate_source(_prepared(arch).fused, grid=16).source
        body = source[source.index("ffk_step(") :]
        assert "ffk_ll_wait(" not in body
        assert "ffk_ll_stage_n<" in body
        # one table-driven loop an issue point (the prologue's, then one a task ahead of each use)
        assert body.count("ffk_prefetch_lanes(") == body.count("ffk_prefetch_commit();") >= 1
        assert "ffk_prefetch(" not in body
        assert "s += NWARPS" in body  # the copies shared out over the warps


def test_host_facing_blocks_raise_done_words_and_the_frame_is_read_at_entry():
    """The blocks that read the frame or write an output raise one done word each after a system
    fence (the host waits on those, not on the stream; the emulation checks every launch raises
    all of them), and the frame is read before the prologue so its host round trip overlaps it."""
    kernel = generate_source(_prepared("min_gru").fused, grid=16)
    body = kernel.source[kernel.source.index("ffk_step(") :]
    head = kernel.schedule.tasks[-1]
    assert kernel.done_words == len({0} | set(range(head.first, head.first + head.blocks)))
    assert body.index("__threadfence_system()") < body.index("ffk_store_done(ffk_done + ffk_slot, epoch)")
    assert body.index("ffk_host0 = ffk_load_host(in0") < body.index("ffk_counters[b]")
    assert body.count("ffk_load_host(") == 1


def test_later_copies_are_issued_a_task_ahead_and_waited_on_exactly(monkeypatch):
    """The prologue issues the first PROLOGUE_GROUPS commit groups; each later one is issued
    before the task a group ahead of its own, and every task waits for exactly its own group
    (cp.async.wait_group N leaves the N groups committed after it in flight). (Without the frame's
    scalars, whose one-block task has copies of its own, every block has the same copy groups.)"""
    from framefuse.compiler import codegen, simplify

    monkeypatch.setattr(simplify, "COMPOSE_INPUT_PRODUCTS", False)
    kernel = generate_source(_prepared("min_gru").fused, grid=16)
    body = kernel.source[kernel.source.index("ffk_step(") :]
    waits = [int(w) for w in re.findall(r"ffk_prefetch_wait<(\d+)>", body)]
    assert len(waits) >= 3
    position = 0
    for j, later in enumerate(waits):
        at = body.index(f"ffk_prefetch_wait<{later}>", position)
        # the prologue's loop commits PROLOGUE_GROUPS groups, every later issue point one
        committed = min(len(waits), codegen.PROLOGUE_GROUPS) + body.count("ffk_prefetch_commit();", 0, at) - 1
        assert committed == min(len(waits), codegen.PROLOGUE_GROUPS + j)
        assert later == committed - j - 1  # exactly this task's group has to have landed
        position = at + 1


@needs_cxx
def test_the_emulators_header_is_precompiled_once_and_read_by_the_compile(tmp_path, monkeypatch):
    """emulate's g++ reads emu.h from a precompiled header kept under the kernel cache, one per
    header, compiler and flags, built once (a second call finds it); a cache that cannot be
    written means no precompiled header, not a failure."""
    import subprocess

    from framefuse.compiler import emulate as emu

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path / "cache"))
    flags = ["-std=c++20", "-O1", "-pthread", "-w"]
    folder = emu._precompiled_header(cxx_compiler(), flags)
    assert folder is not None and (folder / "emu.h").read_bytes() == emu.EMU_HEADER.read_bytes()
    built = (folder / "emu.h.gch").stat().st_mtime_ns
    assert emu._precompiled_header(cxx_compiler(), flags) == folder
    assert (folder / "emu.h.gch").stat().st_mtime_ns == built
    assert emu._precompiled_header(cxx_compiler(), [*flags, "-g"]) != folder  # other flags, another header
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted(
        {folder.name, emu._precompiled_header(cxx_compiler(), [*flags, "-g"]).name}
    )

    source = tmp_path / "kernel.cpp"
    source.write_text('#include "emu.h"\nint main() { return 0; }\n')
    shown = subprocess.run(
        [cxx_compiler(), *flags, "-I", str(folder), "-H", "-fsyntax-only", str(source)], capture_output=True, text=True
    )
    assert shown.returncode == 0 and f"! {folder / 'emu.h.gch'}" in shown.stderr  # "!": the header was used

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path / "file" / "cache"))
    assert emu._precompiled_header(cxx_compiler(), flags) is None


@needs_cxx
def test_emulated_copies_land_only_at_their_wait(tmp_path):
    """The emulator lands a cp.async copy only when its thread waits for the copy's commit group,
    the latest the hardware may: a wait that leaves one group too many in flight reads shared
    memory before its copy and the result is wrong (NaN), as it could be on a GPU."""
    import dataclasses

    program = lower_program(_prepared("attention").fused)
    kernel = generate(schedule(program, grid=16, threads=64))
    feeds = _feeds(program, np.random.default_rng(2))
    frames = {n: feeds[n][None] for n in program.inputs}
    state = {n: feeds[n] for n in program.states}
    outputs, _ = emulate(kernel, frames, state, steps=1, workdir=tmp_path / "exact")
    expected = naive.run(program, feeds)
    for name in kernel.output_names:
        _close(outputs[name][0], expected[name], name, tol=1e-5)
    # every wait one group short: each task may read its prefetched rows before they land
    loose = re.sub(r"ffk_prefetch_wait<(\d+)>", lambda m: f"ffk_prefetch_wait<{int(m.group(1)) + 1}>", kernel.source)
    loose = loose.replace("ffk_prefetch_wait_n(", "ffk_prefetch_wait_n(1 + ")
    outputs, _ = emulate(dataclasses.replace(kernel, source=loose), frames, state, steps=1, workdir=tmp_path / "loose")
    assert any(not np.allclose(outputs[n][0], expected[n], atol=1e-4) for n in kernel.output_names)


def test_a_block_issues_its_copies_in_its_own_task_order():
    """A block's commit slots follow the tasks it runs: attention's output-projection blocks skip
    the tasks between theirs, so their KV-cache copies go in an earlier slot than the kernel-wide
    order would give them, and the task waits for a count read from its row of the table."""
    from framefuse.compiler import codegen

    assert codegen.PREFETCH_BY_BLOCK_ORDER
    kernel = generate(schedule(lower_program(_prepared("attention", FULL).fused), grid=132))
    tasks, groups, slots = kernel.schedule.tasks, kernel.layout.groups, kernel.layout.slots
    earlier = 0
    for j, t in enumerate(groups):
        for b in range(tasks[t].first, tasks[t].first + tasks[t].blocks):
            own = [g for g in groups[:j] if tasks[g].first <= b < tasks[g].first + tasks[g].blocks]
            assert slots[j, b] == len(own)  # the block's own earlier tasks with copies, no others
            earlier += int(slots[j, b] < j)
    assert earlier  # some blocks skip tasks: their copies are issued earlier than kernel order
    assert "ffk_prefetch_wait_n(" in kernel.source


def test_cheap_scalars_are_recomputed_not_given_a_phase():
    """A LayerNorm's 1/sqrt(var + eps) is recomputed by each reader once its two sums are
    arrays, and the normalization is folded into the products (simplify.FoldNorms): the task is
    stage, the sums beside the products, root (it had two phases more for the scalars and two
    for the normalized row and its copy)."""
    kernel = generate_source(_prepared("min_gru").fused, grid=16)
    # the second layer's scan (the first layer's 1/σ comes with the frame: simplify.PublishFrameScalars)
    layer = [t for t in kernel.schedule.tasks if "LinearScan" in t.root.label][1]
    assert layer.phases() == 4
    by_phase = {}
    for unit in layer.units.values():
        by_phase.setdefault(unit.phase, set()).add(unit.how)
    assert by_phase[2] == {"dot", "reduce"}
    assert not [u for u in layer.arrays() if u.node.size == 1 and u.how == "thread"]


def test_long_root_reductions_run_a_warp_per_element():
    """A delta-rule row reduces over the state's columns twice: with few rows a block, a warp
    takes each row and its lanes share the columns (the emulation test checks the values)."""
    source = generate_source(_prepared("delta_net", WIDE).fused, grid=16).source
    assert "a warp per element (reductions over its lanes)" in source
    assert "for (int e = lo_root + warp; e < hi_root; e += NWARPS)" in source


@needs_cxx
def test_the_ssm_root_over_16_states_runs_a_warp_per_channel_emulated(tmp_path):
    """Mamba's SSM update reduces over its 16 states (codegen.WARP_SPLIT_MIN, 16 since session
    68): with a few channels a block each channel takes a warp, a lane a state (the state stored by
    its lane), and the emulated kernel computes the interpreter's values."""
    from framefuse.compiler import codegen

    assert codegen.WARP_SPLIT_MIN == 16
    program = lower_program(_prepared("mamba").fused)
    kernel = generate(schedule(program, grid=32, threads=128))
    roots = [
        t
        for t, task in enumerate(kernel.schedule.tasks)
        if "a warp per element (reductions over its lanes)" in _task_source(kernel.source, t)
    ]
    assert roots and all("ssm_state(" in _task_source(kernel.source, t) for t in roots)
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


def _task_source(source: str, t: int) -> str:
    start = source.index(f"    // task {t}: ")
    end = source.find(f"    // task {t + 1}: ", start)
    return source[start : end if end > 0 else len(source)]


def _phases(task_source: str) -> list[str]:
    """The task's code split at its barriers (the first piece is its prefetch wait)."""
    return task_source.split("__syncthreads();")


WARP_LOOP = re.compile(r"for \(int e = \w+ \+ (warp|\(\(warp \+ (\d+)\) % NWARPS\)); e < hi\w+; e \+= NWARPS\)")


def test_warp_per_element_arrays_of_a_phase_start_on_different_warps():
    """A GRU cell's three gate products (2 rows a block each) and a LayerNorm's two sums run
    side by side on different warps, not one after another on warps 0 and 1 (the W·x products
    share their phase with the sums: the normalization is folded into them)."""
    kernel = generate_source(_prepared("gru", FULL).fused, grid=132)
    layer = _task_source(kernel.source, 2)
    assert "GRUSeq" in layer.splitlines()[0]
    for phase in _phases(layer):
        loops = WARP_LOOP.findall(phase)
        firsts = [0 if not shift else 8 - int(shift) for _, shift in loops]  # the warp of element 0
        assert len(set(firsts)) == len(firsts), f"two arrays start on one warp: {firsts}"
    counts = [(len(WARP_LOOP.findall(p)), p.count("ffk_warp_dot")) for p in _phases(layer)]
    assert (3, 3) in counts and (5, 3) in counts  # R·h; W·x beside the LayerNorm's two sums
    rotated = [p for p in _phases(layer) if len(WARP_LOOP.findall(p)) == 3]
    assert sorted(0 if not s else 8 - int(s) for _, s in WARP_LOOP.findall(rotated[0])) == [0, 2, 4]


def test_products_that_wait_for_nothing_run_before_the_staging():
    """An LSTM layer's recurrent products read the prefetched state, not a flagged value: they are
    computed before the phase's staging spins for the layer input, so they overlap its arrival."""
    kernel = generate_source(_prepared("lstm", FULL).fused, grid=132)
    layer = _task_source(kernel.source, 2)
    staging = [p for p in _phases(layer) if "ffk_ll_stage_n" in p]
    assert len(staging) == 1
    phase = staging[0]
    assert phase.count("ffk_warp_dot") == 4  # the four gates' R·h rows
    assert phase.rindex("ffk_warp_dot") < phase.index("ffk_ll_stage_n")


def test_kv_cache_is_read_as_a_view_of_the_state_and_the_new_row():
    """Readers of the attention KV cache take the old rows from the state and wait only for the
    new row: no task stages a whole cache (a Concat) from flag-tagged words."""
    from framefuse.compiler.schedule import frame_source

    sched = schedule(lower_program(_prepared("attention").fused), grid=16)
    for task in sched.tasks:
        for unit in task.arrays():
            if task.view.source_kind(unit.node) == "materialized" and frame_source(unit.node) is None:
                assert not isinstance(unit.node, Concat), f"{task.root.label} stages {unit.node.label}"


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("grid", [8, 132])
def test_every_computed_array_element_has_its_inputs_in_the_block(arch, grid):
    """Each array a block computes reads, for every element it computes, only elements that the
    block holds of the arrays it reads: an array's origin is aligned down to 4 floats, but the
    elements below its first needed one are not computed (xlstm's per-head sums were computed
    from the aligned origin and read other arrays' shared memory: racecheck's hazard on the H100)."""
    from framefuse.compiler.schedule import enumerate_pairs, needed_ranges

    sched = schedule(lower_program(_prepared(arch, WIDE).fused), grid=grid, threads=128)
    aligned_above = 0
    for task in sched.tasks:
        for unit in task.units.values():
            elements = max(unit.node.size, 1)
            aligned_above += int((unit.first != unit.lo).sum()) if unit.how != "root" else 0
            for occ in unit.occurrences:
                if task.view.kind(occ.node) not in ("array", "dot"):
                    continue
                dep = task.units[occ.node.id]
                pairs = enumerate_pairs(occ, unit.var, elements)
                lo, hi = needed_ranges(pairs, unit.first, unit.hi, elements, occ.node.size)
                reads = hi > lo
                where = f"{task.root.label}: {unit.node.label or unit.node} reads {occ.node.label or occ.node}"
                assert (lo[reads] >= dep.first[reads]).all() and (hi[reads] <= dep.hi[reads]).all(), where
    if arch == "xlstm":
        assert aligned_above  # the case that raced is in this schedule


def test_generating_twice_from_one_schedule_gives_one_source():
    """Code generation does not change the schedule it reads (the artifact round trip compiles the
    source of a fresh schedule and compares hashes)."""
    sched = schedule(lower_program(_prepared("xlstm", WIDE).fused), grid=8, threads=128)
    first = generate(sched)
    assert "for (int e = from" in first.source  # an array computed from above its aligned origin
    assert generate(sched).digest == first.digest


@needs_cxx
@pytest.mark.parametrize("arch", ["xlstm", "delta_net"])
def test_emulated_kernel_has_no_data_race(arch, tmp_path):
    """ThreadSanitizer over the emulated kernel (emulate(..., races=True)): the emulator's
    barriers, warp exchanges and flag words are the only synchronisation it sees, so a
    shared-memory access no barrier orders is reported with both source lines. It found xlstm's
    race on this machine; these two have the warp-per-element roots and per-head arrays."""
    program = lower_program(_prepared(arch, FULL).fused)  # the benchmark's size: where the race was
    kernel = generate(schedule(program, grid=8, threads=128))
    feeds = _feeds(program, np.random.default_rng(4))
    frames = {n: feeds[n][None] for n in program.inputs}
    state = {n: feeds[n] for n in program.states}
    try:
        outputs, _ = emulate(kernel, frames, state, steps=1, workdir=tmp_path, races=True)
    except CompileError as exc:
        if "could not compile" in str(exc) and "tsan" in str(exc).lower():
            pytest.skip(f"g++ cannot build with ThreadSanitizer here: {str(exc)[:200]}")
        raise
    expected = naive.run(program, feeds)
    for name in kernel.output_names:
        _close(outputs[name][0], expected[name], f"{arch} {name}", tol=1e-5)


def test_generated_source_is_the_same_for_the_same_graph():
    """The source (and so its hash, the NVRTC cache key, and what an artifact records) depends on
    the graph only: not on the process, nor on whether the engine's folding already ran."""
    from framefuse.engines.executor import GraphExecutor

    prepared = _prepared("lstm")
    first = generate_source(prepared.fused, grid=16)
    again = generate_source(prepared.fused, grid=16)
    folded = GraphExecutor(onnx.load(str(prepared.fused)), "cpu", "reference").folded_model()
    assert first.digest == again.digest == generate_source(folded, grid=16).digest


# -- nvcc ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize(
    "arch",
    [
        "min_gru",
        "mamba",
        "attention",
        "min_gru/sequence",
        "lstm/sequence",
        "delta_net/sequence",
        "mamba:fp16",
        "attention:bf16",
        "lstm/sequence:bf16",
        "gru:int8",
        "xlstm+views",
        "lstm+views",
        "mamba+fewer",
        "lstm+fewer",
        "xlstm/sequence+fewer",
        "mamba+levels",
        "delta_net+levels",
        "mamba+levels+xregs",
        "jamba+levels+xregs",
        "lstm/sequence+ahead4",
        "lstm/sequence+together",
        "lstm/sequence+helpers",
        "gru+tagged",
        "mamba/sequence+tagged",
        "mamba+fewer+split",
        "gated_ssm+split",
        "attention+fewer+early",
        "xlstm+early",
        "mamba+fewer+trace",
        "mamba+fewer+trace+copiesbetween",
        "min_gru+pollahead",
        "mamba+pollahead+pollcounts",
        "min_gru+replicas",
        "mamba+replicas+pollcounts",
        "gru+tworeplicas",
    ],
)
def test_generated_source_compiles_with_nvcc_for_sm80_sm89_sm90(arch, tmp_path, monkeypatch):
    """Both kernels of a model: ffk_step (a launch a frame) and ffk_resident (launched once); after
    a colon, the products' weight format (codegen.WEIGHT_FORMATS); +views: the stepkernel-views
    tactic's kernel (codegen.ALIAS_VIEWS); +fewer: the stepkernel-fewer-phases tactic's (views,
    codegen.PHASE_ONE_PASS and ROOT_IN_ARRAY_WARP); +levels: the stepkernel-fewer-levels tactic's
    (those, scheduled with products recomputed by the blocks that read them); +ahead4: a one-block
    recurrence's inputs loaded four positions ahead (codegen.RECUR_INPUTS_AHEAD); +together: its
    input words checked with one branch a position (codegen.RECUR_TAKE_TOGETHER); +helpers: taken
    by the block's threads past the cells (codegen.RECUR_INPUT_HELPERS); +xregs: a warp's rows of
    one long product with x in registers (codegen.DOT_X_IN_REGISTERS); +tagged: outputs as tagged
    words in host memory (codegen.TAGGED_OUTPUTS); +split: products of a recurrence's output as
    partial sums (simplify.SplitProducts, at the benchmark's size); +early: the frame's x published
    before its scalars (codegen.EARLY_FRAME_WORDS); +trace: the timeline trace's stamps
    (CompiledStep.timeline; the resident kernel's since session 68); +copiesbetween: the
    resident kernel's copies issued between its tasks (codegen.RESIDENT_COPIES_AT_START_GROUPS None;
    at the small size mamba has 10 or more commit groups, so the default issues them at start);
    +pollahead: the resident kernel's frame and go polls issued ahead of the stop check
    (codegen.RESIDENT_POLL_AHEAD); +pollcounts: the frame blocks' histogram of reads
    (codegen.RESIDENT_POLL_COUNTS); +replicas: the resident kernel's frame block replicated on a
    free block (codegen.RESIDENT_FRAMER_REPLICAS: the launched kernel is unchanged); +tworeplicas:
    on two (codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK 2)."""
    from framefuse.compiler import codegen
    from framefuse.compiler.engine import FAST_MATH_OPTIONS

    arch, poll_counts, _ = arch.partition("+pollcounts")
    if poll_counts:
        monkeypatch.setattr(codegen, "RESIDENT_POLL_COUNTS", True)
    arch, two, _ = arch.partition("+tworeplicas")
    if two:
        monkeypatch.setattr(codegen, "RESIDENT_REPLICAS_PER_FRAME_BLOCK", 2)
    arch, replicas, _ = arch.partition("+replicas")
    replicas = replicas or two
    if replicas:
        monkeypatch.setattr(codegen, "RESIDENT_FRAMER_REPLICAS", True)
    arch, poll_ahead, _ = arch.partition("+pollahead")
    if poll_ahead:
        monkeypatch.setattr(codegen, "RESIDENT_POLL_AHEAD", True)
    arch, between, _ = arch.partition("+copiesbetween")
    if between:
        monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", None)
    arch, trace, _ = arch.partition("+trace")
    arch, early, _ = arch.partition("+early")
    arch, split, _ = arch.partition("+split")
    arch, tagged, _ = arch.partition("+tagged")
    arch, xregs, _ = arch.partition("+xregs")
    arch, helpers, _ = arch.partition("+helpers")
    arch, together, _ = arch.partition("+together")
    arch, ahead, _ = arch.partition("+ahead4")
    arch, levels, _ = arch.partition("+levels")
    arch, fewer, _ = arch.partition("+fewer")
    fewer = fewer or levels
    arch, views, _ = arch.partition("+views")
    views = views or fewer
    arch, _, weight_format = arch.partition(":")
    arch, _, form = arch.partition("/")
    # (x in registers needs rows of 256 or more: the benchmark's size, where fewer-levels' replicated
    # x_proj is 48 rows of 512 a block at 132 blocks)
    size = FULL if xregs or split else SMALL
    prepared = prepare_cached(arch, size)[form] if form else _prepared(arch, size)
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ("80", "89", "90")]
    for resident in (False, True):
        kernel = generate_source(
            prepared.fused,
            grid=132,
            resident=resident,
            weight_format=weight_format or "fp32",
            alias_views=bool(views),
            one_pass=bool(fewer),
            recomputed_scalars=64 if fewer else None,
            replicated_dot_macs=1 << 15 if levels else None,
            inputs_ahead=4 if ahead else None,
            take_together=bool(together),
            input_helpers=bool(helpers),
            x_in_registers=bool(xregs),
            tagged_outputs=bool(tagged),
            split=bool(split),
            early_frame=bool(early),
            trace=bool(trace),
        )
        assert kernel.trace is bool(trace)
        if replicas:  # (on by default since session 72: only asked for here)
            assert kernel.frame_copies == ((3 if two else 2) if resident else 1)
        if arch == "mamba" and trace:  # 10 or more commit groups: the resident kernel's at frame start
            points = "copies, in flight while the tasks before it run" in kernel.source
            assert points is (not resident or bool(between))
        assert ("unsigned long long* __restrict__ ffk_trace" in kernel.source) is bool(trace)
        # every block stamps each task's entry, and the kernel's own row (entry, prologue, end)
        stamps = kernel.source.count("ffk_trace[(b * ")
        assert (stamps >= 3 * len(kernel.schedule.tasks) + 3) if trace else stamps == 0
        assert (kernel.describe()["split_products"] > 0) is bool(split)
        assert ("frame x words, published now" in kernel.source) is bool(early)
        # (the readers of 16 x 256 partial sums stage them 16 words a thread in flight)
        assert ("ffk_ll_stage_wide<NT, " in kernel.source) is bool(split)
        assert kernel.tagged_outputs is bool(tagged)
        assert ("ffk_store_host_word(out0 + " in kernel.source) is bool(tagged)
        assert kernel.settings.alias_views is bool(views) and kernel.settings.one_pass is bool(fewer)
        assert ("ffk_warp_dot_x<" in kernel.source.split('extern "C"')[-1]) is bool(xregs)
        assert kernel.describe()["replicated_dot_macs"] == (1 << 15 if levels else 0)
        assert ("loaded 4 positions ahead" in kernel.source) is bool(ahead)
        assert ("// one branch for the position's words" in kernel.source) is bool(together)
        assert ("threads past the cells take" in kernel.source) is bool(helpers)
        source = tmp_path / f"{kernel.name}.cu"
        source.write_text(kernel.source)
        result = subprocess.run(
            [
                "nvcc",
                "-fatbin",
                *FAST_MATH_OPTIONS,  # as the step kernel ships (compiler/engine.py)
                *gencode,
                "-Xptxas",
                "-warn-spills",
                "-o",
                str(source.with_suffix(".fatbin")),
                str(source),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "spill" not in result.stderr.lower(), result.stderr[-2000:]


# -- declines -------------------------------------------------------------------------------------------------


def _graph(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)])
    model.ir_version = 10
    return model


@needs_cxx
def test_a_recurrence_reads_its_input_part_through_a_view(tmp_path):
    """LiquidScan's window takes its input part as [B, T, 4H] (here a graph input, 2 batch rows):
    the loop reads it through the transposing view an element a thread (the waits side by side),
    and the emulated kernel computes the interpreter's values, the state carried in and out."""
    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(5)
    B, T, H = 2, 5, 4
    model = _graph(
        [
            helper.make_node(
                "LiquidScan", ["xg", "R", "state.h"], ["y", "next_state.h"], domain="framefuse", name="liquid0", ts=0.5
            )
        ],
        [
            helper.make_tensor_value_info("xg", f32, [B, T, 4 * H]),
            helper.make_tensor_value_info("state.h", f32, [B, H]),
        ],
        [
            helper.make_tensor_value_info("y", f32, [B, T, H]),
            helper.make_tensor_value_info("next_state.h", f32, [B, H]),
        ],
        [numpy_helper.from_array((0.5 * rng.standard_normal((4 * H, H))).astype(np.float32), "R")],
    )
    program = lower_onnx(model)
    assert program.counts()["recur"] == 1
    kernel = generate(schedule(program, grid=8, threads=64))
    assert "rcg" in kernel.source  # the view's element loop (codegen._recur)
    _emulate_against_interpreter(kernel, program, 2, tmp_path, races=True)


@needs_cxx
def test_a_recurrence_feeding_a_column_scan_compiles_into_one_kernel(tmp_path):
    """A hybrid window: an LSTM layer whose output is a minGRU-style layer's gate and input (a
    LinearScan run in columns, schedule.column_layouts storing what is around it in its walking
    order). The LSTM's loop reads its own h back position by position, so its output keeps its
    [T, B, S·H] order; the emulated kernel computes the interpreter's values."""
    from framefuse.compiler.ir import Recur

    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(3)
    t = 6
    inits = [numpy_helper.from_array((0.5 * rng.standard_normal((16, 4))).astype(np.float32), n) for n in "WR"]
    inits.append(numpy_helper.from_array(np.array([1, t, 4], np.int64), "shape"))
    model = _graph(
        [
            helper.make_node("LSTMSeq", ["X", "W", "R"], ["Y", "hN"], domain="framefuse", name="lstm0"),
            helper.make_node("Reshape", ["Y", "shape"], ["Yr"], name="flat"),
            helper.make_node("Sigmoid", ["Yr"], ["a"], name="gate"),
            helper.make_node(
                "LinearScan", ["a", "Yr", "state.h"], ["h", "next_state.h"], domain="framefuse", name="scan0"
            ),
        ],
        [helper.make_tensor_value_info("X", f32, [t, 1, 4]), helper.make_tensor_value_info("state.h", f32, [1, 4])],
        [
            helper.make_tensor_value_info("h", f32, [1, t, 4]),
            helper.make_tensor_value_info("next_state.h", f32, [1, 4]),
        ],
        inits,
    )
    program = lower_onnx(model)
    assert program.counts()["recur"] == 1 and program.counts()["scan"] == 1
    plan = schedule(program, grid=8, threads=64)
    assert not any(isinstance(plan.materialized.get(nid), Recur) for nid in plan.layouts)
    _emulate_against_interpreter(generate(plan), program, 1, tmp_path, races=True)


@needs_cxx
@pytest.mark.parametrize("op", ["DeltaRuleScan", "GatedDeltaRuleScan"])
def test_a_delta_rule_window_runs_each_state_row_through_its_positions(op, tmp_path):
    """A DeltaRuleScan / GatedDeltaRuleScan window with a carried state (given and returned) at odd
    sizes — 2 batch rows, 3 heads, Dk = 40 (more than a warp's lanes), Dv = 5, T = 7 — lowers to
    one ir.DeltaScan that matches the op's own reference (plugins/*/naive.py), and the emulated
    kernel (ThreadSanitizer) computes the interpreter's values, the rows of a head split over
    blocks."""
    import importlib

    import torch

    from framefuse.compiler import naive
    from framefuse.compiler.schedule import delta_split

    gated = op == "GatedDeltaRuleScan"
    B, H, T, Dk, Dv = 2, 3, 7, 40, 5
    rng = np.random.default_rng(11)
    feeds = {
        "q": rng.standard_normal((B, H, T, Dk)).astype(np.float32) / np.sqrt(Dk),
        "k": rng.standard_normal((B, H, T, Dk)).astype(np.float32) / np.sqrt(Dk),
        "v": rng.standard_normal((B, H, T, Dv)).astype(np.float32),
        "beta": rng.uniform(0.1, 0.9, (B, H, T)).astype(np.float32),
        "state.S": rng.standard_normal((B, H, Dk, Dv)).astype(np.float32),
    }
    names = ["q", "k", "v", "beta"]
    if gated:
        feeds["g"] = -rng.uniform(0.0, 0.5, (B, H, T)).astype(np.float32)
        names = ["q", "k", "v", "g", "beta"]
    f32 = TensorProto.FLOAT
    model = _graph(
        [helper.make_node(op, [*names, "state.S"], ["o", "next_state.S"], domain="framefuse", name="delta0")],
        [helper.make_tensor_value_info(n, f32, feeds[n].shape) for n in [*names, "state.S"]],
        [
            helper.make_tensor_value_info("o", f32, [B, H, T, Dv]),
            helper.make_tensor_value_info("next_state.S", f32, feeds["state.S"].shape),
        ],
    )
    program = lower_onnx(model)
    assert program.counts()["deltascan"] == 1
    module = importlib.import_module(
        f"framefuse.plugins.{'gated_delta_rule_scan' if gated else 'delta_rule_scan'}.naive"
    )
    o, S = module.reference(*[torch.from_numpy(feeds[n]).double() for n in names], torch.from_numpy(feeds["state.S"]))
    actual = naive.run(program, feeds)
    _close(actual["o"], o.numpy(), f"{op} o", tol=1e-5)
    _close(actual["next_state.S"], S.numpy(), f"{op} S", tol=1e-5)
    plan = schedule(program, grid=24, threads=64)
    (task,) = [t for t in plan.tasks if t.root.kind == "deltascan"]
    assert (task.chunk, task.blocks) == delta_split(task.root, 24, 64) == (2, 18)  # 3 blocks a head
    with pytest.raises(CompileError, match=r"delta0.*2 x 3 heads needs a block a head, more than the grid's 4"):
        schedule(program, grid=4, threads=64)
    # (the feeds above: random normal keys and β would make the state grow without bound)
    _emulate_against_interpreter(generate(plan), program, 1, tmp_path, races=True, feeds=feeds)


def test_a_nonlinear_window_longer_than_the_unroll_is_declined_naming_the_node(monkeypatch):
    """Without the recurrence loop (lower.RECUR_WINDOWS off) a window is unrolled, up to 8 positions."""
    from framefuse.compiler import lower
    from framefuse.compiler.lower import UNROLL_MAX_STEPS

    monkeypatch.setattr(lower, "RECUR_WINDOWS", False)

    f32 = TensorProto.FLOAT
    t = UNROLL_MAX_STEPS + 1
    model = _graph(
        [helper.make_node("LSTMSeq", ["X", "W", "R"], ["Y", "next_state.h"], domain="framefuse", name="lstm0")],
        [helper.make_tensor_value_info(n, f32, s) for n, s in (("X", [t, 1, 4]), ("W", [1, 16, 4]), ("R", [1, 16, 4]))],
        [
            helper.make_tensor_value_info("Y", f32, [t, 1, 1, 4]),
            helper.make_tensor_value_info("next_state.h", f32, [1, 1, 4]),
        ],
    )
    with pytest.raises(CompileError, match=rf"node 'lstm0' \(framefuse::LSTMSeq\).*{t} time steps.*at most"):
        lower_onnx(model)


def _linear_scan_window(t: int, width: int, batch: int = 1):
    f32 = TensorProto.FLOAT
    return _graph(
        [
            helper.make_node(
                "LinearScan", ["a", "b", "state.h"], ["h", "next_state.h"], domain="framefuse", name="scan0"
            )
        ],
        [
            helper.make_tensor_value_info(n, f32, s)
            for n, s in (("a", [batch, t, width]), ("b", [batch, t, width]), ("state.h", [batch, width]))
        ],
        [
            helper.make_tensor_value_info("h", f32, [batch, t, width]),
            helper.make_tensor_value_info("next_state.h", f32, [batch, width]),
        ],
    )


def test_a_window_too_large_for_one_recurrence_an_element_is_declined_naming_the_node(monkeypatch):
    """The bound of the row form (each element running its prefix); a scan run column by column
    has none."""
    from framefuse.compiler import lower, simplify

    monkeypatch.setattr(lower, "SCAN_MAX_ELEMENTS", 63)
    lower_onnx(_linear_scan_window(8, 9))  # columns: no bound
    monkeypatch.setattr(simplify, "SCAN_COLUMNS", False)
    lower_onnx(_linear_scan_window(7, 9))  # 63 elements: compiled
    with pytest.raises(CompileError, match=r"node 'scan0' \(framefuse::LinearScan\).*\[1, 8, 9\] has 72 elements"):
        lower_onnx(_linear_scan_window(8, 9))


@pytest.mark.parametrize("arch", ["mamba", "xlstm"])
def test_windows_past_the_row_bound_lower_to_column_scans(arch):
    """Mamba's and xlstm's T = 32 windows at embed 256 hold scans of more elements than the row
    form's bound (lower.SCAN_MAX_ELEMENTS): run column by column (their inputs broadcast along the
    columns) they lower, every scan along its last axis."""
    from framefuse.compiler import lower

    _, program = _sequence_program(arch, {"seq": 32, "seed": 0})
    scans = [n for n in program.nodes() if n.kind == "scan"]
    assert scans and all(n.axis == n.rank - 1 for n in scans)
    assert max(n.size for n in scans) > lower.SCAN_MAX_ELEMENTS


def _one_node_window(op: str, feeds: dict, outputs: dict, **attrs):
    f32 = TensorProto.FLOAT
    return _graph(
        [helper.make_node(op, list(feeds), list(outputs), domain="framefuse", name="op0", **attrs)],
        [helper.make_tensor_value_info(n, f32, list(v.shape)) for n, v in feeds.items()],
        [helper.make_tensor_value_info(n, f32, list(shape)) for n, shape in outputs.items()],
    )


@pytest.mark.parametrize("t,batch", [(2, 1), (9, 2)])
def test_selective_and_mlstm_windows_lower_to_scans_with_the_ops_reference(t, batch):
    """The two other scans the compiler runs over a window, each against the op's naive.py:
    SelectiveScan (one Scan over [B, T, D, N]) and MLSTMScan (the stabiliser, then C and n)."""
    import torch

    from framefuse.plugins.mlstm_scan.naive import reference as mlstm_reference
    from framefuse.plugins.selective_scan.naive import reference as ssm_reference

    rng = np.random.default_rng(t)

    def rand(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    d, n = 5, 3
    feeds = {
        "x": rand(batch, t, d),
        "dt": rand(batch, t, d, scale=0.5),
        "A": -np.abs(rand(d, n)),
        "B": rand(batch, t, n),
        "C": rand(batch, t, n),
        "D": rand(d),
        "z": rand(batch, t, d),
        "dt_bias": rand(d, scale=0.1),
        "h0": rand(batch, d, n),
    }
    program = lower_onnx(_one_node_window("SelectiveScan", feeds, {"y": (batch, t, d), "h": (batch, d, n)}))
    assert program.counts().get("scan") == 1
    got = naive.run(program, feeds)
    want = ssm_reference(*(torch.from_numpy(v).double() for v in feeds.values()))
    _close(got["y"], want[0].numpy(), "ssm y")
    _close(got["h"], want[1].numpy(), "ssm h_T")

    h, dk, dv = 2, 4, 3
    feeds = {
        "q": rand(batch, h, t, dk),
        "k": rand(batch, h, t, dk, scale=0.5),
        "v": rand(batch, h, t, dv),
        "i_pre": rand(batch, h, t),
        "f_pre": rand(batch, h, t, scale=2.0),
        "C0": rand(batch, h, dv, dk),
        "n0": rand(batch, h, dk),
        "m0": rand(batch, h),
    }
    outputs = {"h": (batch, h, t, dv), "C": (batch, h, dv, dk), "n": (batch, h, dk), "m": (batch, h)}
    program = lower_onnx(_one_node_window("MLSTMScan", feeds, outputs, eps=1e-6))
    assert program.counts().get("scan") == 3
    got = naive.run(program, feeds)
    want = mlstm_reference(*(torch.from_numpy(v).double() for v in feeds.values()), eps=1e-6)
    for name, value in zip(outputs, want):
        _close(got[name], value.numpy(), f"mlstm {name}")


@pytest.mark.parametrize("t,width,batch", [(2, 4, 1), (33, 5, 3), (64, 96, 1)])
def test_a_linear_scan_window_lowers_to_one_scan_with_the_ops_reference(t, width, batch):
    import torch

    from framefuse.plugins.linear_scan.naive import reference

    program = lower_onnx(_linear_scan_window(t, width, batch))
    assert program.counts().get("scan") == 1
    rng = np.random.default_rng(t)
    a = rng.uniform(-1, 1, (batch, t, width)).astype(np.float32)
    b = rng.standard_normal((batch, t, width)).astype(np.float32)
    h0 = rng.standard_normal((batch, width)).astype(np.float32)
    got = naive.run(program, {"a": a, "b": b, "state.h": h0})
    want_y, want_h = reference(
        torch.from_numpy(a).double(), torch.from_numpy(b).double(), torch.from_numpy(h0).double()
    )
    _close(got["h"], want_y.numpy(), "y")
    _close(got["next_state.h"], want_h.numpy(), "h_T")


def test_unknown_op_is_declined_naming_the_node():
    f32 = TensorProto.FLOAT
    model = _graph(
        [helper.make_node("TopK", ["x", "k"], ["y", "i"], name="top")],
        [helper.make_tensor_value_info("x", f32, [1, 8])],
        [helper.make_tensor_value_info("y", f32, [1, 2])],
        [numpy_helper.from_array(np.array([2], dtype=np.int64), "k")],
    )
    with pytest.raises(CompileError, match=r"node 'top' \(TopK\): op TopK has no lowering"):
        lower_onnx(model)


def test_half_precision_graph_is_declined_naming_the_cast():
    f32 = TensorProto.FLOAT
    model = _graph(
        [
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="to_half"),
            helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="to_float"),
        ],
        [helper.make_tensor_value_info("x", f32, [1, 8])],
        [helper.make_tensor_value_info("y", f32, [1, 8])],
    )
    with pytest.raises(CompileError, match=r"node 'to_half' \(Cast\): Cast to TensorProto.FLOAT16"):
        lower_onnx(model)
    # a precision build's graph lowers with widened storage: the computed value stays float32
    program = lower_onnx(model, widen_storage=True)
    x = np.array([[1 + 2**-13] * 8], np.float32)  # not an fp16 value: kept, not rounded
    assert np.array_equal(naive.run(program, {"x": x})["y"], x)


def test_widened_storage_reads_fp16_constants_as_the_values_they_hold():
    """A precision build's graph lowered with widened storage: an fp16 initializer, a Constant and
    a ConstantOfShape of fp16 values hold the float32 values they store (1 + 2**-10 is an fp16
    value, kept exactly), and a Cast of a float32 constant to fp16 rounds it (1 + 2**-12 is not:
    it becomes 1)."""
    f16, f32 = TensorProto.FLOAT16, TensorProto.FLOAT
    value = np.array([1 + 2**-10], np.float16)
    model = _graph(
        [
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(value, "kv")),
            helper.make_node("ConstantOfShape", ["shape"], ["c"], value=numpy_helper.from_array(value, "cv")),
            helper.make_node("Cast", ["fine"], ["rounded"], to=f16),
            helper.make_node("Add", ["w", "k"], ["wk"]),
            helper.make_node("Add", ["wk", "c"], ["wkc"]),
            helper.make_node("Add", ["wkc", "rounded"], ["sum"]),
            helper.make_node("Cast", ["sum"], ["sum32"], to=f32),
            helper.make_node("Add", ["x", "sum32"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", f32, [1, 4])],
        [helper.make_tensor_value_info("y", f32, [1, 4])],
        [
            numpy_helper.from_array(np.full((1, 4), 1 + 2**-10, np.float16), "w"),
            numpy_helper.from_array(np.array([1, 4], np.int64), "shape"),
            numpy_helper.from_array(np.array([1 + 2**-12], np.float32), "fine"),
        ],
    )
    program = lower_onnx(model, widen_storage=True)
    y = naive.run(program, {"x": np.zeros((1, 4), np.float32)})["y"]
    assert np.array_equal(y, np.full((1, 4), 3 * (1 + 2**-10) + 1, np.float32))


def test_dynamic_input_shape_is_declined():
    f32 = TensorProto.FLOAT
    model = _graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [helper.make_tensor_value_info("x", f32, ["batch", 8])],
        [helper.make_tensor_value_info("y", f32, ["batch", 8])],
    )
    with pytest.raises(CompileError, match="'x' has a dynamic shape"):
        lower_onnx(model)


@pytest.mark.parametrize(
    "tactic",
    [
        "stepkernel",
        "stepkernel-pieces",
        "stepkernel-fewer-blocks",
        "stepkernel-384-threads",
        "stepkernel-paced",
        "stepkernel-unframed",
        "stepkernel-skewed",
        "stepkernel-384-threads-skewed",
        "stepkernel-unrolled",
        "stepkernel-replica-cap",
        "stepkernel-384-threads-replica-cap",
        "stepkernel-512-threads",
        "stepkernel-lanes",
        "stepkernel-384-threads-ahead-4",
        "stepkernel-384-threads-ahead-8",
        "stepkernel-views",
        "stepkernel-fewer-phases",
        "stepkernel-384-threads-fewer-phases",
        "stepkernel-fewer-phases-early-frame",
        "stepkernel-fewer-levels",
    ],
)
def test_cpu_build_with_select_stepkernel_falls_back_with_a_note(tactic):
    """Without a GPU the engine cannot run the kernel (any of its tactics): the plan is used and
    the note says why."""
    from framefuse.engines.cuda_graph import CudaGraphEngine
    from framefuse.engines.fusion import STEPKERNELS

    assert tactic in STEPKERNELS
    prepared = _prepared("min_gru")
    engine = CudaGraphEngine(onnx.load(str(prepared.fused)), device="cpu", select=tactic)
    selection = engine.metadata["selection"]
    assert selection["chosen"] == "plan" and "needs a CUDA device" in selection["skipped"]


@needs_cxx
@pytest.mark.parametrize("one_pass", [False, True], ids=["lanes-by-row", "one-pass"])
@pytest.mark.parametrize("k, by_row, in_one_pass", [(64, 16, 4), (24, 8, 4), (10, 16, 4), (3, 4, 4), (1, 1, 1)])
def test_short_product_rows_run_in_lane_segments(k, by_row, in_one_pass, one_pass, monkeypatch, tmp_path):
    """A product whose rows are shorter than a warp's loads, with more rows a block than warps,
    gives each row a segment of lanes (codegen._dot_lanes / runtime ffk_seg_dot): float4 loads
    when the row is a multiple of 4 floats, single floats otherwise, rows past the end computed
    again and not stored; with SEGMENT_ONE_PASS, fewer lanes a row (down to 4) until the block's
    warps take its rows in one pass. The emulated kernel equals the interpreter; a product of a
    constant input is folded away at compile time (simplify.FoldConstants) and the kernel's output
    still includes it."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "SEGMENT_ONE_PASS", one_pass)
    lanes = in_one_pass if one_pass else by_row
    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(k)
    m = 37  # rows: 19 and 18 on two blocks of 2 warps, the last segment of a warp past the end
    model = _graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["p"]),
            helper.make_node("MatMul", ["zero", "r"], ["q"]),  # a constant input: folded
            helper.make_node("Add", ["p", "q"], ["s"]),
            helper.make_node("Tanh", ["s"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", f32, [1, k])],
        [helper.make_tensor_value_info("y", f32, [1, m])],
        [
            numpy_helper.from_array(rng.standard_normal((k, m)).astype(np.float32), "w"),
            numpy_helper.from_array(np.zeros((1, 5), np.float32), "zero"),
            numpy_helper.from_array(rng.standard_normal((5, m)).astype(np.float32), "r"),
        ],
    )
    program = lower_program(model)
    from framefuse.compiler.ir import Dot

    assert len([n for n in program.nodes() if isinstance(n, Dot)]) == 1, "the product of zeros was not folded"
    kernel = generate(schedule(program, grid=2, threads=64))
    assert f"dot products of {k}, {lanes} lanes per element" in kernel.source
    assert f"ffk_seg_dot<{k}, {lanes}, {'true' if k % 4 == 0 else 'false'}>" in kernel.source
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


def _product_graph(k: int, m: int, batch: int = 1, seed: int = 0):
    """y = tanh(x · w), x [batch, k], w [k, m]: one product array of m rows of k."""
    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(seed)
    return _graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Tanh", ["p"], ["y"])],
        [helper.make_tensor_value_info("x", f32, [batch, k])],
        [helper.make_tensor_value_info("y", f32, [batch, m])],
        [numpy_helper.from_array(rng.standard_normal((k, m)).astype(np.float32), "w")],
    )


@needs_cxx
@pytest.mark.parametrize("k", [256, 260, 1024])
def test_a_warps_rows_of_one_long_product_share_x_in_registers(k, tmp_path):
    """codegen.DOT_X_IN_REGISTERS (the x_in_registers code setting, off by default): a product
    whose elements all read one x row (batch 1), with rows of 256 to 1024 floats, a multiple of 4,
    and more rows a block than warps, is computed a warp per element with x loaded into registers
    once (runtime ffk_load_x / ffk_warp_dot_x), the rows' weights read alone; 260 floats leave
    lanes past the row's end in its last float4s. Emulated (float4 loads checked for alignment)
    equal to the interpreter; off, the source is the default one."""
    program = lower_program(_product_graph(k, 37, seed=k))  # 19 and 18 rows on two blocks of 2 warps
    sched = schedule(program, grid=2, threads=64)
    plain = generate(sched)
    assert plain.settings.x_in_registers is False and "ffk_warp_dot_x" not in plain.source.split('extern "C"')[-1]
    assert generate(sched, x_in_registers=False).source == plain.source
    kernel = generate(sched, x_in_registers=True)
    assert kernel.settings.x_in_registers is True and kernel.describe()["x_in_registers"] is True
    assert f"ffk_load_x<{k}>(xr, " in kernel.source and f"ffk_warp_dot_x<{k}>(xr, " in kernel.source
    assert "the one x row they share in registers" in kernel.source
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


@pytest.mark.parametrize(
    "k,m,batch,why",
    [
        (252, 37, 1, "a row shorter than DOT_X_MIN_K"),
        (1028, 37, 1, "a row longer than DOT_X_MAX_K (more registers than 8 float4s a lane)"),
        (258, 37, 1, "a row not a multiple of 4 floats"),
        (256, 37, 2, "two x rows (batch 2)"),
        (256, 2, 1, "no warp with two rows"),
    ],
)
def test_x_stays_in_shared_memory_where_registers_would_not_help(k, m, batch, why):
    program = lower_program(_product_graph(k, m, batch))
    kernel = generate(schedule(program, grid=2, threads=64), x_in_registers=True)
    assert "ffk_warp_dot_x<" not in kernel.source.split('extern "C"')[-1], why  # the kernel's body


@needs_cxx
def test_long_copies_can_be_issued_in_pieces_over_the_warps(tmp_path):
    """With ``copy_pieces`` (the build's stepkernel-pieces tactic), a prefetch copy longer than a
    piece (attention's KV cache range, 4032 floats, and its 2048-float weight copies) becomes
    consecutive copies of at most a piece that together cover the same floats, each issued by its
    own warp; the emulated kernel still equals the interpreter."""
    program = lower_program(_prepared("attention", FULL).fused)

    def copies(kernel):
        rows = kernel.layout.table[:, kernel.layout.segment_column :]
        return rows.reshape(rows.shape[0], -1, 4)  # per block: (smem offset, source, offset, floats)

    whole = generate(schedule(program, grid=16, threads=64))
    cut = generate(schedule(program, grid=16, threads=64), copy_pieces=1024)
    assert whole.settings.copy_pieces == 0 and cut.settings.copy_pieces == 1024
    before, after = copies(whole), copies(cut)
    assert before[:, :, 3].max() > 1024 and after[:, :, 3].max() <= 1024

    def spans(rows, origin):
        out = set()
        for offset, source, start, floats in rows:
            out |= {(int(source), int(start) + i, int(offset) - origin + i) for i in range(int(floats))}
        return out

    def origin(table):  # the prefetch region starts after the table row, which grew
        return int(table[:, :, 0][table[:, :, 3] > 0].min())

    # the same floats from the same places to the same places; the longer table row can leave a
    # late task's rows out of the shared-memory budget (read from global memory instead)
    assert set(cut.layout.prefetch) <= set(whole.layout.prefetch)
    assert set(cut.layout.leaf_prefetch) == set(whole.layout.leaf_prefetch)
    for b in range(before.shape[0]):
        assert spans(after[b], origin(after)) <= spans(before[b], origin(before))
    _emulate_against_interpreter(cut, program, 2, tmp_path)


def test_views_of_a_tasks_arrays_are_read_where_the_array_lies(monkeypatch):
    """generate(alias_views=True) (the build's stepkernel-views tactic; codegen.ALIAS_VIEWS the
    default, off): an array a task computes a thread an element as a view of another of its arrays
    at a constant offset (a product's input rows cut out of the staged frame) is not copied; its
    readers read the array (origin + offset), a phase earlier. With the setting off the source is
    the one it was, and the views' phases are the schedule's."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("min_gru").fused)
    sched = schedule(program, grid=3, threads=64)
    plain = generate(sched)
    assert not codegen.ALIAS_VIEWS and generate(sched, alias_views=False).source == plain.source
    assert not plain.settings.alias_views and not plain.describe()["alias_views"]
    views = generate(sched, alias_views=True)
    assert views.settings.alias_views and views.describe()["alias_views"]
    monkeypatch.setattr(codegen, "ALIAS_VIEWS", True)
    assert generate(sched).source == views.source
    gen = codegen.Generator(sched, settings=codegen.CodeSettings.of(alias_views=True))
    found = {t: v for t, v in gen.views.items() if v}
    assert found, "min_gru's first layer reads the frame's rows through views"
    for t, task_views in found.items():
        task = sched.tasks[t]
        for uid, (src, offset) in task_views.items():
            assert task.units[uid].how == "thread" and src in task.units and offset % 4 == 0
    # a reader's pointer into the viewed array (ids renumbered in the source): its origin + offset
    assert re.search(r"\(\(ffk_smem \+ \d+\) \+ \(lo\d+ \+ \d+ - lo\d+\)\)", views.source)
    assert not re.search(r"\(lo\d+ \+ \d+ - lo\d+\)", plain.source)
    # every view's copy and the phase it took are gone: fewer barriers, fewer phases
    assert views.kernel_phases < plain.kernel_phases
    assert views.source.count("__syncthreads();") == plain.source.count("__syncthreads();") - (
        plain.kernel_phases - views.kernel_phases
    )
    assert views.smem_bytes <= plain.smem_bytes  # the copies' arena slots go too


@needs_cxx
@pytest.mark.parametrize("arch", ARCHS)
def test_views_read_in_place_emulated_match_the_interpreter(arch, tmp_path):
    """The stepkernel-views kernel of every zoo architecture (each has views at this size: the
    frame's rows, a reshape before a product) against the interpreter over chained steps, the
    launched kernel and a resident session of it; ThreadSanitizer on three of them (a reader
    moved a phase up must still find the array's elements written before its barrier)."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared(arch).fused)
    sched = schedule(program, grid=3, threads=64)
    assert any(codegen.Generator(sched, settings=codegen.CodeSettings.of(alias_views=True)).views.values()), arch
    kernel = generate(sched, alias_views=True)
    _emulate_against_interpreter(kernel, program, 2, tmp_path / "launched", races=arch in ("min_gru", "xlstm", "lstm"))
    _emulate_against_interpreter(generate(sched, resident=True, alias_views=True), program, 3, tmp_path / "resident")


MEDIUM = {"model": {"embed": 64, "layers": 2}, "seq": 4, "seed": 0}


def _phase_passes(gen, sched, one_pass: bool) -> list[int]:
    """Passes of the block's warps that each phase's products and reductions take, over every
    regular task (codegen.Generator._one_pass_lanes with ``one_pass``, else each array's own lanes)."""
    from framefuse.compiler.schedule import ROOT

    found = []
    for t, task in enumerate(sched.tasks):
        if not isinstance(task.root, (Recur, DeltaScan, BodyLoop)):
            by_phase: dict = {}
            for key, unit in task.units.items():
                if key != ROOT and unit.node.id not in gen.views[t]:
                    by_phase.setdefault(gen.phases[t][id(unit)], []).append(unit)
            for units in by_phase.values():
                warp_units = [u for u in units if u.how in ("dot", "reduce") and u.span > 0]
                if warp_units:
                    chosen = gen._one_pass_lanes(units) if one_pass else {}
                    lanes = {
                        u.node.id: chosen.get(u.node.id)
                        or (gen._dot_lanes(u) if u.how == "dot" else gen._reduce_lanes(u))
                        for u in warp_units
                    }
                    warps = sum(-(-u.span // (32 // lanes[u.node.id])) for u in warp_units)
                    found.append(-(-warps // gen.nwarps))
    return found


def test_fewer_phases_settings_are_off_and_change_only_what_they_say(monkeypatch):
    """generate(one_pass=True) (with views, the build's stepkernel-fewer-phases tactic; the
    settings codegen.PHASE_ONE_PASS and ROOT_IN_ARRAY_WARP, both off by default): with them off the
    source is the plain one; on, a phase's products and reductions take no more passes of the
    block's warps than before and fewer where any took two (LSTM's layers at embed 64 on four
    warps), and a root that reads only its one product, element for element (mamba's x_proj tasks),
    is computed by the lanes that computed it: a phase and a barrier less a task."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("lstm", MEDIUM).fused)
    sched = schedule(program, grid=32, threads=128)
    plain = generate(sched)
    assert not codegen.PHASE_ONE_PASS and not codegen.ROOT_IN_ARRAY_WARP
    assert generate(sched, one_pass=False).source == plain.source
    assert not plain.settings.one_pass and not plain.describe()["one_pass"]
    fewer = generate(sched, one_pass=True)
    assert fewer.settings.one_pass and fewer.describe()["one_pass"] and fewer.source != plain.source
    monkeypatch.setattr(codegen, "PHASE_ONE_PASS", True)
    monkeypatch.setattr(codegen, "ROOT_IN_ARRAY_WARP", True)
    assert generate(sched).source == fewer.source
    monkeypatch.undo()
    gen = codegen.Generator(sched)
    before, after = (
        _phase_passes(gen, sched, False),
        _phase_passes(codegen.Generator(sched, settings=codegen.CodeSettings.of(one_pass=True)), sched, True),
    )
    assert len(before) == len(after) and all(a <= b for a, b in zip(after, before))
    assert max(before) > 1 and sum(after) < sum(before), (before, after)
    # the arrays whose lanes it cut start each on warps of their own (rotated loops)
    assert fewer.source.count("lanes per element") > plain.source.count("lanes per element")
    assert re.search(r"for \(int e0 = \w+ \+ \(\(warp \+ \d+\) % NWARPS\) \* \d+;", fewer.source)

    program = lower_program(_prepared("mamba", MEDIUM).fused)
    sched = schedule(program, grid=32, threads=128)
    plain = generate(sched)
    gen = codegen.Generator(sched, settings=codegen.CodeSettings.of(one_pass=True))
    fused = {t: uid for t, uid in gen.root_arrays.items() if uid is not None}
    assert len(fused) >= 2, "mamba's x_proj tasks publish their one product"
    for t, uid in fused.items():
        task = sched.tasks[t]
        assert task.units[uid].how in ("dot", "reduce") and uid in task.units[-1].deps
    fewer = generate(sched, one_pass=True)
    assert fewer.kernel_phases == plain.kernel_phases - len(fused)
    assert fewer.source.count("__syncthreads();") == plain.source.count("__syncthreads();") - len(fused)
    assert fewer.source.count("by the lane that computed its input") == len(fused)


@needs_cxx
@pytest.mark.parametrize("arch", ARCHS)
def test_fewer_phases_emulated_match_the_interpreter(arch, tmp_path):
    """The stepkernel-fewer-phases kernel (views, one pass of the warps a phase, roots computed by
    their one product's lanes) of every zoo architecture where it changes the source: embed 64 on
    32 blocks of three warps (a warp count not a power of two), launched and a resident session,
    against the interpreter; at the small size on 2 warps under ThreadSanitizer for three of them
    (two arrays' segments must never share a warp's pass, a root reads back only its lane's store)."""
    program = lower_program(_prepared(arch, MEDIUM).fused)
    sched = schedule(program, grid=32, threads=96, recomputed_scalars=64)  # as the tactic schedules
    kernel = generate(sched, one_pass=True, alias_views=True)
    assert kernel.source != generate(sched, alias_views=True).source, f"{arch}: nothing for the tactic to change"
    _emulate_against_interpreter(kernel, program, 2, tmp_path / "launched")
    _emulate_against_interpreter(
        generate(sched, resident=True, one_pass=True, alias_views=True), program, 3, tmp_path / "resident"
    )
    if arch in ("lstm", "mamba", "xlstm"):
        program = lower_program(_prepared(arch).fused)
        small = schedule(program, grid=3, threads=64)
        _emulate_against_interpreter(generate(small, one_pass=True), program, 2, tmp_path / "races", races=True)


def test_a_heads_few_scalars_are_recomputed_by_their_readers_when_scheduled_so(monkeypatch):
    """schedule(recomputed_scalars=64) (the stepkernel-fewer-phases tactics; RECOMPUTED_SCALARS,
    default 1): xLSTM's per-head GroupNorm computes σ, then 1 / σ, four elements each, as two
    arrays of their own (two phases of four threads); so scheduled, their readers recompute them.
    The default schedule is the one it was; the schedule records the setting."""
    from framefuse.compiler import schedule as scheduling

    program = lower_program(_prepared("xlstm", MEDIUM).fused)
    assert scheduling.RECOMPUTED_SCALARS == 1
    plain = schedule(program, grid=32, threads=128)
    assert plain.recomputed_scalars == 1 and plain.describe()["recomputed_scalars"] == 1
    assert generate(schedule(program, grid=32, threads=128, recomputed_scalars=1)).source == generate(plain).source
    fewer = schedule(program, grid=32, threads=128, recomputed_scalars=64)
    assert fewer.recomputed_scalars == 64 and scheduling.RECOMPUTED_SCALARS == 1  # for that schedule only

    def small_thread_arrays(sched):
        return sum(
            1
            for task in sched.tasks
            for key, unit in task.units.items()
            if key != -1
            and unit.how == "thread"
            and 1 < unit.node.size <= 64
            and not isinstance(unit.node, Map)
            and task.view.source_kind(unit.node) != "materialized"
        )

    assert small_thread_arrays(fewer) < small_thread_arrays(plain)
    assert generate(fewer).kernel_phases < generate(plain).kernel_phases
    monkeypatch.setattr(scheduling, "RECOMPUTED_SCALARS", 64)
    assert generate(schedule(program, grid=32, threads=128)).source == generate(fewer).source
    with pytest.raises(CompileError, match="recomputed_scalars must be at least 1"):
        schedule(program, grid=32, threads=128, recomputed_scalars=0)


def test_a_product_every_reader_block_needs_is_recomputed_by_them_when_scheduled_so():
    """schedule(replicated_dot_macs=...) (the stepkernel-fewer-levels tactics;
    REPLICATED_DOT_MACS, default 0): Mamba's x_proj, which every block of the SSM update needs
    whole, is otherwise published by tasks of its own a level before the update; so scheduled,
    each update block computes it, and its state is still stored once (by the update's task).
    The default schedule is the one it was; the schedule records the setting."""
    from framefuse.compiler import schedule as scheduling

    program = lower_program(_prepared("mamba", MEDIUM).fused)
    assert scheduling.REPLICATED_DOT_MACS == 0
    plain = schedule(program, grid=32, threads=128)
    assert plain.replicated_dot_macs == 0 and plain.describe()["replicated_dot_macs"] == 0
    assert generate(schedule(program, grid=32, threads=128, replicated_dot_macs=0)).source == generate(plain).source
    replicated = schedule(program, grid=32, threads=128, replicated_dot_macs=1 << 15)
    assert replicated.replicated_dot_macs == 1 << 15 and scheduling.REPLICATED_DOT_MACS == 0  # that schedule only
    assert replicated.describe()["replicated_dot_macs"] == 1 << 15

    def published_x_proj(sched):
        return [n for n in sched.materialized.values() if "x_proj" in (n.label or "")]

    assert published_x_proj(plain) and not published_x_proj(replicated)
    assert replicated.levels() <= plain.levels() - 2  # a level a layer
    # the price on a launched kernel: every update block copies x_proj's rows (Kernel.copied_floats)
    kernels = generate(plain), generate(replicated)
    assert 0 < kernels[0].copied_floats < kernels[1].copied_floats
    x_proj_rows = sum(n.rows.size for n in published_x_proj(plain))
    assert kernels[1].copied_floats - kernels[0].copied_floats >= x_proj_rows  # at least one more copy of them
    assert kernels[1].describe()["copied_bytes"] == 4 * kernels[1].copied_floats
    states = [n for n in program.outputs.values() if n.label and "SelectiveScan" in n.label]
    for sched in (plain, replicated):  # each state stored by exactly one task
        stored = [n.id for t in sched.tasks for n in [t.root, *t.side]]
        assert all(stored.count(n.id) == 1 for n in states)
    with pytest.raises(CompileError, match="replicated_dot_macs must be 0 or more"):
        schedule(program, grid=32, threads=128, replicated_dot_macs=-1)


@needs_cxx
@pytest.mark.parametrize("arch", ["mamba", "delta_net", "jamba"])
def test_fewer_levels_emulated_match_the_interpreter(arch, tmp_path):
    """The stepkernel-fewer-levels kernel (the fewer-phases settings, scheduled with products
    recomputed by the blocks that read them) of the zoo architectures whose levels it cuts: embed
    64 on 32 blocks of three warps, launched and a resident session, against the interpreter;
    mamba at the small size on 32 blocks of 2 warps under ThreadSanitizer (every block of the
    update computes x_proj into its own shared memory)."""
    program = lower_program(_prepared(arch, MEDIUM).fused)
    plain = schedule(program, grid=32, threads=96, recomputed_scalars=64)
    sched = schedule(program, grid=32, threads=96, recomputed_scalars=64, replicated_dot_macs=1 << 15)
    assert sched.levels() < plain.levels(), f"{arch}: no level for the tactic to cut"
    _emulate_against_interpreter(generate(sched, one_pass=True, alias_views=True), program, 2, tmp_path / "launched")
    _emulate_against_interpreter(
        generate(sched, resident=True, one_pass=True, alias_views=True), program, 3, tmp_path / "resident"
    )
    if arch == "mamba":
        program = lower_program(_prepared(arch).fused)
        # (on a few blocks x_proj's copies are too few to be published: 32 blocks, 8 -> 6 levels)
        small = schedule(program, grid=32, threads=64, replicated_dot_macs=1 << 15)
        assert small.levels() < schedule(program, grid=32, threads=64).levels()
        _emulate_against_interpreter(generate(small, one_pass=True), program, 2, tmp_path / "races", races=True)


@needs_cxx
@pytest.mark.parametrize("arch", SEQUENCE_ARCHS)
def test_fewer_phases_in_windows_emulated_match_the_interpreter(arch, tmp_path):
    """The same tactic on the zoo's sequence forms (T = 5; one pass of the warps a phase and the
    roots of their one product: every window has some), against the interpreter."""
    _, program = _sequence_program(arch, {**SMALL, "seq": 5})
    sched = schedule(program, grid=6, threads=64)
    kernel = generate(sched, one_pass=True)
    assert kernel.source != generate(sched).source, f"{arch}: nothing for the tactic to change"
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


@needs_cxx
@pytest.mark.parametrize("arch", ["lstm", "gru", "attention", "mamba", "xlstm"])
def test_generated_kernel_emulated_with_a_warp_count_not_a_power_of_two(arch, tmp_path):
    """The stepkernel-384-threads tactic runs 12 warps a block: the block's loops, warp staggering
    and reductions must not assume a power of two (here 3 warps, the small models' analogue)."""
    program = lower_program(_prepared(arch).fused)
    sched = schedule(program, grid=3, threads=96)
    _emulate_against_interpreter(generate(sched), program, 2, tmp_path)
    _emulate_against_interpreter(generate(sched, resident=True), program, 3, tmp_path)  # a resident session of it


@needs_cxx
@pytest.mark.parametrize("source_cost", [8, 1])
def test_short_reductions_recomputed_by_their_readers_under_emulation(source_cost, monkeypatch, tmp_path):
    """INLINE_REDUCE_EXTENT: a reduction over at most 32 cheap elements is recomputed by each reader
    instead of being an array of its own. Attention's output-projection task loses the softmax
    sum's phase with the default source cost of 1 (9 -> 8), the row max's too with 8 (9 -> 7), and
    the emulated kernel still computes what the interpreter does."""
    from framefuse.compiler import schedule as schedule_module

    assert (schedule_module.INLINE_REDUCE_EXTENT, schedule_module.INLINE_REDUCE_SOURCE_COST) == (32, 1)
    program = lower_program(_prepared("attention", FULL).fused)

    def output_projection_phases(sched):
        (task,) = [t for t in sched.tasks if t.root.label.startswith("node '/o_proj/MatMul'")]
        return task.phases()

    monkeypatch.setattr(schedule_module, "INLINE_REDUCE_EXTENT", 0)
    cached = output_projection_phases(schedule(program, grid=132))
    small = lower_program(_prepared("attention").fused)
    small_cached = output_projection_phases(schedule(small, grid=3, threads=64))
    monkeypatch.setattr(schedule_module, "INLINE_REDUCE_EXTENT", 32)
    monkeypatch.setattr(schedule_module, "INLINE_REDUCE_SOURCE_COST", source_cost)
    assert output_projection_phases(schedule(program, grid=132)) == cached - (2 if source_cost == 8 else 1)
    sched = schedule(small, grid=3, threads=64)
    assert output_projection_phases(sched) < small_cached
    _emulate_against_interpreter(generate(sched), small, 2, tmp_path)


@needs_cxx
def test_paired_walk_of_a_segmented_reduction_under_emulation(monkeypatch, tmp_path):
    """codegen.PAIRED_WALK (off by default, a measured alternative): attention's scores walk each
    row as position start + j and its partner half a row away; every position is read once and
    the emulated kernel computes what the interpreter does."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("attention", WIDE).fused)
    sched = schedule(program, grid=4, threads=64)  # the scores: a lane an element, 64 positions a row
    monkeypatch.setattr(codegen, "VECTOR_WALK", False)  # the pairs are an alternative to the scalar walk
    rotated = generate(sched).source
    monkeypatch.setattr(codegen, "PAIRED_WALK", True)
    paired = generate(sched)
    assert re.search(r"const int start\d+ = e % 32;", paired.source) and "const int start" not in rotated
    _emulate_against_interpreter(paired, program, 2, tmp_path)


@needs_cxx
@pytest.mark.parametrize("vector", [True, False])
def test_attention_scores_walk_float4s_under_emulation(vector, monkeypatch, tmp_path):
    """codegen.VECTOR_WALK: attention's q·k over a head (q staged, k from the prefetched cache or
    the new row, a Concat chosen once per element) reads float4s at proven 16-byte alignment; the
    emulator aborts on a misaligned float4, and both walks compute what the interpreter does."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("attention", FULL).fused)
    sched = schedule(program, grid=4, threads=64)
    monkeypatch.setattr(codegen, "VECTOR_WALK", vector)
    kernel = generate(sched)
    walks = re.findall(r"const float4 (\w+) = ffk_ld4\(p\d+ \+ c\d+\), (\w+) = ffk_ld4\(p\d+ \+ c\d+\);", kernel.source)
    # both layers' scores; the first layer's q is the frame's product times the LayerNorm's 1/σ,
    # a factor that does not depend on the position: it scales the sum once
    assert len(walks) == (2 if vector else 0), walks
    assert ("*= *p" in kernel.source) == vector
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


def test_the_float4_walk_is_refused_where_a_row_is_not_aligned(monkeypatch):
    """An operand whose row start is not 16-byte aligned (every shared-memory array moved 8 bytes)
    keeps the scalar walk: _vector_operands checks each base and every element's row start."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("attention", FULL).fused)
    sched = schedule(program, grid=4, threads=64)
    gen = codegen.Generator(sched)
    found = []
    for t, task in enumerate(sched.tasks):
        for unit in task.units.values():
            if unit.how == "reduce" and gen._reduce_lanes(unit) < codegen.WARP_LANES:
                var = ix.Var("e", unit.node.size)
                r = ix.Var("r", unit.node.extent)
                lanes = gen._reduce_lanes(unit)
                if gen._vector_operands(t, task, unit.node, var, r, lanes) is not None:
                    found.append((t, task, unit.node, var, r, lanes))
    assert len(found) == 2  # both layers' scores
    monkeypatch.setattr(gen, "arena_offset", gen.arena_offset + 2)  # every array 8 bytes off
    assert all(gen._vector_operands(t, task, node, var, r, lanes) is None for t, task, node, var, r, lanes in found)


@needs_cxx
@pytest.mark.parametrize("races", [False, True])
def test_row_followers_under_emulation(races, monkeypatch, tmp_path):
    """codegen.ROW_FOLLOWERS (off by default until measured): attention's softmax weights are
    computed by the warp of their row's max, after a __syncwarp, instead of in a phase of their own;
    one barrier fewer a layer, and the emulated kernel (with ThreadSanitizer: the warp's lanes read
    lane 0's store of the max only after the __syncwarp) computes what the interpreter does."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("attention", FULL).fused)
    sched = schedule(program, grid=3, threads=128)  # a warp per row max (at 64 threads: 16 lanes)
    plain = generate(sched)
    monkeypatch.setattr(codegen, "ROW_FOLLOWERS", True)
    rows = generate(sched)
    layers = len(re.findall(r"framefuse::Attention\) \[1, 4, 1\]: max over", rows.source))
    assert layers == 2 and rows.source.count("const int ffk_row = e;") == layers
    assert plain.source.count("__syncthreads();") - rows.source.count("__syncthreads();") == layers
    _emulate_against_interpreter(rows, program, 2, tmp_path, races=races)


@needs_cxx
def test_vector_reduce_under_emulation(monkeypatch, tmp_path):
    """codegen.VECTOR_REDUCE (off by default until measured): a thread's own sum whose factor is
    contiguous along the positions reads it four positions at a time (attention's softmax sum over
    a head's weights; P·V's weights, with the cached V rows at a stride of a row) over the longest
    prefix on which every factor has one source: P·V's V rows come from the cache up to the
    window's last position, so positions 28-31 stay in the scalar loop after it. Under emulation
    (a misaligned float4 aborts) it computes what the interpreter does."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("attention", {"model": {"embed": 256, "layers": 2}, "seq": 32, "seed": 0}).fused)
    sched = schedule(program, grid=3, threads=128)
    monkeypatch.setattr(codegen, "VECTOR_REDUCE", True)
    kernel = generate(sched)
    sums = re.findall(r"const float4 (\w+) = ffk_ld4\(p\d+ \+ c\d+\);", kernel.source)
    assert len(sums) == 4, sums  # per layer: P·V and the softmax sum
    assert len(re.findall(r"for \(int r\d+ = 28; r\d+ < 32; \+\+r\d+\)", kernel.source)) == 2  # P·V's rest
    _emulate_against_interpreter(kernel, program, 2, tmp_path)


@needs_cxx
@pytest.mark.parametrize(
    "arch,embed,seq,grid", [("attention", 256, 32, 132), ("attention", 64, 8, 5), ("jamba", 64, 8, 5)]
)
def test_skewed_sum_walk_under_emulation(arch, embed, seq, grid, tmp_path):
    """codegen.SKEWED_SUM_WALK (off by default; the build's tactics stepkernel-skewed and
    stepkernel-384-threads-skewed turn it on, engines.fusion): in the window's attention scores
    a thread per score walks q · k over the head, lane l reading key row l, rows a multiple of 32
    floats apart: one bank for the whole warp at every position. Element e starts at position
    e % n and wraps, so the lanes read different banks; only the scores are skewed (P·V reads V
    along the lanes already, one bank each; on few blocks the scores are a segmented reduction, whose
    lanes already start at different chunks). Under emulation it computes what the interpreter does."""
    _, program = _sequence_program(arch, {"model": {"embed": embed, "layers": 2}, "seq": seq, "seed": 0})
    sched = schedule(program, grid=grid, threads=128)
    plain = generate(sched)
    skewed = generate(sched, skewed_sums=True)
    assert skewed.describe()["skewed_sums"] and not plain.describe()["skewed_sums"]
    layers = 2 if arch == "attention" else 1  # jamba: one attention layer of two
    assert "SKEWED_SUM_WALK" not in plain.source
    scores = r"node 'Attention_\d+' \(framefuse::Attention\) \[1, 4, (\d+), \1\], a thread per element\n"
    walks = re.findall(scores + r"[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*see SKEWED_SUM_WALK", skewed.source)
    assert len(walks) == layers, walks
    # jamba's Mamba layer too: C · h over the state, lane l reading state row l, 16 floats apart
    assert skewed.source.count("// the first position, see SKEWED_SUM_WALK") == layers + (arch == "jamba")
    _emulate_against_interpreter(skewed, program, 1, tmp_path)


@pytest.mark.parametrize("arch", ["attention", "lstm", "mamba"])
def test_the_frame_task_runs_on_a_quiet_block(arch, monkeypatch):
    """schedule.FRAME_BLOCK_QUIET: the frame's one block runs no task before the frame's nor another
    task of its level, and copies no more for its next tasks than the block _place gave it
    (attention's first free block: the output projection's rows and both KV caches, 10214 floats)."""
    from framefuse.compiler import schedule as schedule_module
    from framefuse.compiler.ir import FrameConcat

    program = lower_program(_prepared(arch, FULL).fused)

    def frame_block(sched):
        i = next(i for i, t in enumerate(sched.tasks) if isinstance(t.root, FrameConcat))
        b = sched.tasks[i].first
        runs = [j for j, t in enumerate(sched.tasks) if t.first <= b < t.first + t.blocks]
        later = [sched.tasks[j] for j in runs if j > i][: schedule_module.FRAME_BLOCK_LOOKAHEAD]
        return i, b, runs, sum(schedule_module.block_copy_floats(t, b) for t in later)

    quiet = schedule(program, grid=132)
    i, b, runs, copies = frame_block(quiet)
    levels = quiet.task_levels()
    assert min(runs) == i and not any(levels[j] == levels[i] for j in runs if j != i)
    monkeypatch.setattr(schedule_module, "FRAME_BLOCK_QUIET", False)
    plain = schedule(program, grid=132)
    _, b0, _, copies0 = frame_block(plain)
    assert copies <= copies0 and quiet.levels() == plain.levels()
    if arch == "attention":
        assert copies0 > 8000 and copies < 1000, (b0, copies0, b, copies)


@needs_cxx
def test_the_frame_task_on_the_first_free_block_under_emulation(monkeypatch, tmp_path):
    """FRAME_BLOCK_QUIET off (the placement before session 21, a variant): still correct."""
    from framefuse.compiler import schedule as schedule_module

    monkeypatch.setattr(schedule_module, "FRAME_BLOCK_QUIET", False)
    program = lower_program(_prepared("lstm").fused)
    _emulate_against_interpreter(generate(schedule(program, grid=3, threads=64)), program, 2, tmp_path)


@needs_cxx
@pytest.mark.parametrize("how", ["argument", "setting"])
def test_a_task_copying_whole_caches_placed_on_fewer_blocks_under_emulation(how, monkeypatch, tmp_path):
    """schedule(replica_floats=) (the build's stepkernel-replica-cap tactics) and the module's
    REPLICA_FLOATS: attention's output projection, whose every block copies both KV caches whole,
    goes on fewer blocks, a larger share of the product's rows on each; the emulated kernel still
    computes what the interpreter does."""
    from framefuse.compiler import schedule as schedule_module

    program = lower_program(_prepared("attention", WIDE).fused)
    plain = schedule(program, grid=32, threads=64)
    heavy = {str(t.root): t.blocks for t in plain.tasks if schedule_module.replicated_floats(t) > 0}
    assert heavy and min(heavy.values()) > 2, heavy  # the output projections, over several blocks
    per_block = max(schedule_module.replicated_floats(t) for t in plain.tasks)
    assert schedule_module.replica_capped(plain, 2 * per_block)
    assert not schedule_module.replica_capped(plain, per_block * max(heavy.values()))  # nothing over this cap
    if how == "argument":
        capped = schedule(program, grid=32, threads=64, replica_floats=2 * per_block)
    else:
        monkeypatch.setattr(schedule_module, "REPLICA_FLOATS", 2 * per_block)
        capped = schedule(program, grid=32, threads=64)
    after = {str(t.root): t.blocks for t in capped.tasks if str(t.root) in heavy}
    assert after.keys() == heavy.keys() and all(blocks <= 2 for blocks in after.values()), after
    assert not schedule_module.replica_capped(capped, 2 * per_block)
    assert capped.levels() == plain.levels()
    _emulate_against_interpreter(generate(capped), program, 2, tmp_path)


def test_a_replica_cap_that_is_not_a_number_of_floats_is_refused():
    program = lower_program(_prepared("attention").fused)
    with pytest.raises(CompileError, match="replica_floats must be a positive number of floats, got 0"):
        schedule(program, grid=8, threads=64, replica_floats=0)


@needs_cxx
@pytest.mark.parametrize("arch", ["attention", "mamba", "lstm"])
def test_paced_copies_under_emulation(arch, monkeypatch, tmp_path):
    """codegen.PREFETCH_PACED (off by default, an experiment): each block issues a group's copies
    a task ahead in its own order; the wait of every task still covers its copies (the emulator
    lands a copy only at its wait, see test_emulated_copies_land_only_at_their_wait)."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared(arch, WIDE).fused)
    sched = schedule(program, grid=32, threads=64)
    plain = generate(sched)
    monkeypatch.setattr(codegen, "PREFETCH_PACED", True)
    paced = generate(sched)
    assert not np.array_equal(paced.ranges(), plain.ranges())  # some block's copies moved
    _emulate_against_interpreter(paced, program, 2, tmp_path)


@needs_cxx
@pytest.mark.parametrize(
    "level,ahead,frame_only", [(1, 1, True), (1, 1, False), (2, 0, False)], ids=["frame-block", "level-1", "level-2"]
)
def test_deferred_copies_under_emulation(level, ahead, frame_only, monkeypatch, tmp_path):
    """codegen.COPIES_AFTER_LEVEL / FRAME_BLOCK_COPIES_LATE (off by default, measured mixed on the
    H100): a block whose first task is at level 1 or 2 (or the frame's block alone) issues the
    copies of its far tasks only after its early tasks. Its commit points move later, never past
    the wait of their own task: the emulated kernel (a copy lands only at its wait) still matches
    the interpreter, and the frame's block of attention no longer issues the output projection's
    copies (weight rows and both KV caches) before the frame."""
    from framefuse.compiler import codegen
    from framefuse.compiler.schedule import frame_source

    program = lower_program(_prepared("attention").fused)
    sched = schedule(program, grid=16, threads=64)
    plain = generate(sched)
    if frame_only:
        monkeypatch.setattr(codegen, "FRAME_BLOCK_COPIES_LATE", True)
    else:
        monkeypatch.setattr(codegen, "COPIES_AFTER_LEVEL", level)
        monkeypatch.setattr(codegen, "COPIES_AHEAD_LEVELS", ahead)
    deferred = generate(sched)
    moved = (deferred.layout.slots != plain.layout.slots).any(axis=0)
    assert moved.sum() == 1 if frame_only else moved.sum() >= 4
    frame_block = next(t.first for t in sched.tasks if frame_source(t.root) is not None)
    levels, groups = sched.task_levels(), deferred.layout.groups
    own = [
        j
        for j, t in enumerate(groups)
        if sched.tasks[t].first <= frame_block < sched.tasks[t].first + sched.tasks[t].blocks
    ]
    early = [j for j in own if levels[groups[j]] <= level + ahead]
    far = [j for j in own if levels[groups[j]] > level + ahead]
    assert early and far
    # a commit point after the last early task's code: the one before the next group's task or later
    after_early = max(early) + codegen.PROLOGUE_GROUPS
    assert all(deferred.layout.slots[j, frame_block] >= after_early for j in far)
    assert not all(plain.layout.slots[j, frame_block] >= after_early for j in far)
    _emulate_against_interpreter(deferred, program, 2, tmp_path)


def test_a_tactic_that_changes_only_the_range_table_is_a_different_kernel(monkeypatch):
    """Paced copies move which commit point issues a block's copies: for min_gru at one block
    an SM (its in-projection a level of its own) only the range table changes, not the source. The
    build's selection tells tactics apart by Kernel.identity (source and table), so it still times
    this one instead of dropping it as "the same kernel"."""
    from framefuse.compiler import simplify

    monkeypatch.setattr(simplify, "COMPOSE_INPUT_PRODUCTS", False)
    program = lower_program(_prepared("min_gru", FULL).fused)
    sched = schedule(program, grid=132)
    plain, paced = generate(sched), generate(sched, paced_copies=True)
    assert plain.digest == paced.digest
    assert plain.identity != paced.identity
    assert generate(sched).identity == plain.identity
    assert paced.describe()["paced_copies"] and not plain.describe()["paced_copies"]


@pytest.mark.parametrize("arch", ["lstm", "attention", "delta_net"])
def test_the_first_layernorm_scale_is_published_with_the_frame(arch):
    """simplify.ComposeInputProducts makes the first layer's products products of the frame x;
    PublishFrameScalars puts the first LayerNorm's 1/σ (a scalar of x alone, |R·x + v|²) beside x
    in one value, which one block computes right after it reads x from host memory (the early read
    of the prologue). Every kernel is a level shorter than with the in-projection a level of its own
    (stepkernel-unframed), no other task reads host memory, and a scalar that would cost the block
    more than FRAME_SCALAR_MACS (delta_net's key norms, 16K multiply-adds) stays with its readers."""
    from framefuse.compiler.schedule import frame_source
    from framefuse.compiler.simplify import FRAME_SCALAR_MACS

    fused = _prepared(arch, FULL).fused  # the benchmark's size (at SMALL lstm's unframed kernel has 4 levels too)
    framed = schedule(lower_program(fused), grid=132)
    unframed = schedule(lower_program(fused, compose_input=False), grid=132)
    assert framed.levels() == unframed.levels() - 1
    (frame_task,) = [t for t in framed.tasks if frame_source(t.root) is not None]
    assert frame_task.blocks == 1 and not frame_task.reads  # waits for nothing: reads x itself
    assert frame_task.root.size == 64 + 1  # x and the one scalar within FRAME_SCALAR_MACS
    assert FRAME_SCALAR_MACS >= 64 * 64
    leaf = frame_source(frame_task.root)
    assert leaf.id not in framed.materialized  # x has no task of its own
    source = generate(framed).source
    body = source[source.index("ffk_step(") :]
    assert body.count("ffk_load_host(") == 1  # the prologue's read; the frame task uses its register
    assert not any(frame_source(t.root) is not None for t in unframed.tasks)


# -- ONNX Loop and Scan: a recurrence no rewrite matched, unrolled into the one program -----------------

CONTROL_FLOW_MODELS = {
    "elman-scan": lambda g: g.elman_scan(),
    "elman-scan-reversed-axis1": lambda g: g.elman_scan(reverse=True, axis=1),
    "mlp-cell-loop": lambda g: g.mlp_cell_loop(),
}


@pytest.mark.parametrize("roll", [True, False], ids=["rolled", "unrolled"])
@pytest.mark.parametrize("name", list(CONTROL_FLOW_MODELS))
def test_a_loop_or_scan_no_rewrite_matched_is_unrolled_into_the_program(name, roll, control_flow_graphs, monkeypatch):
    """A nonlinear recurrence as an ONNX Scan / Loop: the compiler lowers the node itself a body a
    position (T static; its API), and the rewrite copies the body into the graph (rewrite/unroll.py:
    what `framefuse build` compiles). Both programs match ONNX Runtime on the original graph
    through the interpreter: the Elman cell's copies rolled back into one recurrence
    (simplify.RollRecurrences), the MLP cell's into one loop over its body (simplify.RollBodies);
    with the settings off, their tanh once a position."""
    import onnxruntime as ort

    from framefuse.compiler import simplify
    from framefuse.rewrite import rewrite_model

    monkeypatch.setattr(simplify, "ROLL_RECURRENCES", roll)
    monkeypatch.setattr(simplify, "ROLL_BODIES", roll)
    model = CONTROL_FLOW_MODELS[name](control_flow_graphs)
    onnx.checker.check_model(model, full_check=True)
    fused, report = rewrite_model(model)
    assert not any(n.op_type in ("Scan", "Loop") for n in fused.graph.node), report.declined
    rng = np.random.default_rng(0)
    init = {i.name for i in model.graph.initializer}
    feeds = {
        vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
        for vi in model.graph.input
        if vi.name not in init
    }
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for how, graph in (("the node lowered", model), ("the rewrite's copies", fused)):
        program = lower_program(graph)
        counts = program.counts()
        if roll and name.startswith("elman"):
            assert counts.get("tanh", 0) == 0 and counts["recur"] == 1, (how, counts)
            assert any(note.startswith("rolled 6 unrolled positions of h = tanh") for note in program.notes), how
        elif roll:
            assert counts.get("tanh", 0) == 0 and counts["bodyloop"] == 1 and "recur" not in counts, (how, counts)
        else:
            assert counts["tanh"] == control_flow_graphs.STEPS and "recur" not in counts, (how, counts)
        actual = naive.run(program, feeds)
        for out, value in expected.items():
            _close(actual[out], value, f"{name} {out} ({how})", tol=1e-5)


def _same_values(program, rolled, seed):
    """The interpreter gives ``rolled`` the values of ``program`` for random inputs."""
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
    expected, actual = naive.run(program, feeds), naive.run(rolled, feeds)
    for name in program.outputs:
        _close(actual[name], expected[name], name, tol=1e-5)


@pytest.mark.parametrize(
    "layers",
    [(("tanh", True),), (("relu", False), ("sigmoid", True)), (("tanh", True), ("tanh", True), ("relu", True))],
    ids=["elman", "relu-sigmoid", "three-layers"],
)
def test_unrolled_elman_cells_roll_into_one_recurrence_a_layer(layers, control_flow_graphs):
    """simplify.RollRecurrences: each layer's chain of unrolled cells becomes one ir.Recur (its
    act as the ONNX RNN op's cell), a layer reading the one below's positions after it; the
    interpreter gives the unrolled program's values."""
    from framefuse.compiler.simplify import RollRecurrences

    program = control_flow_graphs.unrolled_cells(layers=layers)
    rolled = RollRecurrences(program).run()
    recurs = [n for n in rolled.nodes() if n.kind == "recur"]
    assert sorted(r.cell for r in recurs) == sorted(f"rnn_{act}" for act, _ in layers)
    assert all(r.steps == 5 for r in recurs)
    counts = rolled.counts()
    assert not any(counts.get(act) for act, _ in layers), counts
    assert counts["dot"] == 5 * len(layers)  # the input products only: R runs inside the loops
    _same_values(program, rolled, seed=1)


def test_a_first_position_without_a_product_starts_the_loop_from_zeros(control_flow_graphs):
    """torch's export of a loop over nn.RNNCell from a zero state folds the first position's h·Rᵀ
    away: h_1 = act(a_1). That cell becomes the loop's first position from zeros, so each layer is
    one recurrence over all its positions and no act is left outside."""
    from framefuse.compiler.simplify import RollRecurrences

    program = control_flow_graphs.unrolled_cells(layers=(("tanh", True), ("relu", False)), zero_start=True)
    rolled = RollRecurrences(program).run()
    assert [(r.cell, r.steps) for r in rolled.nodes() if r.kind == "recur"] == [("rnn_tanh", 5), ("rnn_relu", 5)]
    assert not rolled.counts().get("tanh") and not rolled.counts().get("relu")
    _same_values(program, rolled, seed=4)


def test_a_chain_whose_pre_activation_is_read_elsewhere_stays_unrolled(control_flow_graphs):
    """A value between the recurrent product and the act read by anything else (here a graph
    output) would be lost inside the loop: that chain is left as it is, the others still roll."""
    from framefuse.compiler.simplify import RollRecurrences

    program = control_flow_graphs.unrolled_cells(layers=(("tanh", True), ("relu", True)), tap=True)
    rolled = RollRecurrences(program).run()
    # the first layer's chain ends at its fourth position (the fifth's pre-activation is an output)
    assert [(r.cell, r.steps) for r in rolled.nodes() if r.kind == "recur"] == [("rnn_tanh", 4), ("rnn_relu", 5)]
    assert rolled.counts()["tanh"] == 1
    _same_values(program, rolled, seed=2)


def test_two_recurrences_that_read_each_other_stay_unrolled():
    """h_t = tanh(W·g_{t-1} + R·h_{t-1}) and g_t = relu(U·h_{t-1} + S·g_{t-1}): each chain's input
    part reads the other's positions, so neither can be a loop with its inputs computed before it:
    both are left as they are."""
    from framefuse.compiler.ir import Dot, Leaf, Program, ew
    from framefuse.compiler.simplify import RollRecurrences

    rng = np.random.default_rng(5)
    h0, g0 = Leaf("input", "h0", (2, 4)), Leaf("input", "g0", (2, 4))
    w, r, u, s = ((0.5 * rng.standard_normal((4, 4))).astype(np.float32) for _ in range(4))
    h, g = h0, g0
    for _ in range(4):
        h, g = ew("tanh", ew("add", Dot(g, w), Dot(h, r))), ew("relu", ew("add", Dot(h, u), Dot(g, s)))
    program = Program({"h0": h0, "g0": g0}, {}, {"h": h, "g": g}, {})
    assert len(RollRecurrences(program)._chains()) == 2  # R's chain and S's are found ...
    assert RollRecurrences(program).run() is program  # ... neither rolled


# -- simplify.RollBodies: any unrolled cell as one loop over its body (ir.BodyLoop), h and more carried --


def test_an_mlp_cell_loop_rolls_into_one_body_loop_matching_onnxruntime(control_flow_graphs):
    """The ONNX Loop of an MLP cell over [x_t, h] with a gate on h (not an Elman cell: RollRecurrences
    leaves it): the rewrite's copies roll into one ir.BodyLoop over all 6 positions from h0, its
    body the cell once over slot leaves (h and the position's x_t), the products' rows inside it;
    the interpreter matches ONNX Runtime on the original graph and the unrolled program exactly."""
    import onnxruntime as ort

    from framefuse.compiler.simplify import RollBodies, rolled_bodies
    from framefuse.rewrite import rewrite_model

    model = control_flow_graphs.mlp_cell_loop()
    fused, _ = rewrite_model(model)
    unrolled = lower_program(fused)
    rolled = lower_program(fused, roll_bodies=True)
    assert rolled_bodies(rolled) == 1 and rolled.counts()["bodyloop"] == 1, rolled.counts()
    (loop,) = [n for n in rolled.nodes() if n.kind == "bodyloop"]
    assert loop.steps == control_flow_graphs.STEPS and loop.h0.name == "h0"
    assert [n.kind for n in loop.slots] == ["leaf"] and loop.windows[0].shape[0] == loop.steps
    body_counts = {}
    for node in loop.body_nodes():
        key = node.op if node.kind == "ew" else node.kind
        body_counts[key] = body_counts.get(key, 0) + 1
    assert body_counts["dot"] == 2 and body_counts["tanh"] == 1 and body_counts["sigmoid"] == 1, body_counts
    assert "dot" not in rolled.counts() and "tanh" not in rolled.counts()  # nothing of the cell left outside
    rng = np.random.default_rng(3)
    feeds = {
        "h0": rng.standard_normal((2, 7)).astype(np.float32),
        "X": rng.standard_normal((2, 6, 5)).astype(np.float32),
    }
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    actual, plain = naive.run(rolled, feeds), naive.run(unrolled, feeds)
    for name, value in expected.items():
        _close(actual[name], value, name, tol=1e-5)
        assert np.array_equal(actual[name], plain[name]), name  # the same float64 arithmetic
    assert RollBodies(unrolled).run().counts()["bodyloop"] == 1  # the pass by itself, on the simplified program


@pytest.mark.parametrize("layers", [(("tanh", True),), (("relu", False), ("sigmoid", True))], ids=["one", "two"])
def test_elman_cells_roll_into_body_loops_too(layers, control_flow_graphs):
    """RollBodies by itself on the Elman cells RollRecurrences takes (which runs first, so this is
    only the general finder's check): one loop a layer over its positions, the input products left
    outside as windows, the second layer's windows reading the first loop."""
    from framefuse.compiler.simplify import RollBodies

    program = control_flow_graphs.unrolled_cells(steps=9, layers=layers)
    rolled = RollBodies(program).run()
    loops = [n for n in rolled.nodes() if n.kind == "bodyloop"]
    assert [loop.steps for loop in loops] == [9] * len(layers)
    assert rolled.counts()["dot"] == 9 * len(layers)  # the input products: R is inside the loops
    _same_values(program, rolled, seed=6)


def test_a_body_reading_a_position_further_back_stays_unrolled():
    """h_t = tanh(R·h_{t-1} + x_t) + 0.5·h_{t-2}: the body reads a position before the one it
    carries, which no loop carrying one value has: nothing is rolled."""
    from framefuse.compiler.ir import Dot, Leaf, Program, constant, ew, reshape, slice_axis
    from framefuse.compiler.simplify import RollBodies

    rng = np.random.default_rng(8)
    x = Leaf("input", "x", (7, 2, 4))
    r = (0.5 * rng.standard_normal((4, 4))).astype(np.float32)
    half = constant(np.full((2, 4), 0.5, np.float32))
    before, h = Leaf("input", "h0", (2, 4)), Leaf("input", "h1", (2, 4))
    for t in range(7):
        x_t = reshape(slice_axis(x, 0, t, 1, 1), (2, 4))
        before, h = h, ew("add", ew("tanh", ew("add", Dot(h, r), x_t)), ew("mul", half, before))
    inputs = {n.name: n for n in Program({}, {}, {"h": h}, {}).nodes() if isinstance(n, Leaf) and n.role == "input"}
    program = Program(inputs, {}, {"h": h}, {})
    assert [len(family) for family in RollBodies(program)._families()] == [7]  # R's copies are found ...
    assert RollBodies(program).run() is program  # ... and nothing rolled


@pytest.mark.parametrize(
    "variant,carried",
    [({}, 2), ({"gate_out": True}, 3), ({"normed": True}, 2)],
    ids=["lstm", "lstm-gate-read-a-position", "layernorm-lstm"],
)
def test_a_cell_carrying_h_and_c_rolls_into_one_body_loop(variant, carried, control_flow_graphs):
    """An LSTM cell written by hand (h and c carried; optionally a LayerNorm over the gates, or the
    forget gate also read by the graph every position): the body from h_{t-1} to h_t lets c_t out
    to the next position, so the loop carries [h, c] (and the gate) as one vector, and h_t, the
    last c and the gates are slices of the loop's positions. The chain cut at h (not at the
    products, which would carry the 4·hidden gates) is kept; the interpreter gives the unrolled
    program's values exactly."""
    from framefuse.compiler.simplify import RollBodies

    steps, batch, hidden = 6, 2, 5
    program = control_flow_graphs.unrolled_lstm_cells(steps, batch, hidden=hidden, **variant)
    rolled = RollBodies(program).run()
    (loop,) = [n for n in rolled.nodes() if n.kind == "bodyloop"]
    assert loop.steps == steps and loop.carried.shape == (1, carried * batch * hidden)
    assert [w.shape for w in loop.windows] == [(steps, batch, 4 * hidden)]  # the input products x_t·Wᵀ
    assert f"{carried} values carried as one" in rolled.notes[-1]
    assert "tanh" not in rolled.counts() and rolled.counts()["dot"] == steps  # only the input products outside
    rng = np.random.default_rng(4)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
    expected, actual = naive.run(program, feeds), naive.run(rolled, feeds)
    for name in program.outputs:
        assert np.array_equal(actual[name], expected[name]), name


@needs_cxx
@pytest.mark.parametrize(
    "variant",
    [{}, {"gate_out": True, "normed": True}, {"layers": 2}],
    ids=["lstm", "layernorm-lstm-gate-out", "two-layers"],
)
def test_a_body_loop_carrying_h_and_c_emulated_matches_the_interpreter(variant, control_flow_graphs, tmp_path):
    """The packed carry through the code generator: h_{t-1} and c_{t-1} are slices of the loop's
    carried vector (in shared memory), the body's root their concatenation; with two layers the
    second loop's window is the first loop's positions (staged a position ahead: a loop feeds it),
    the first's the input products (staged whole). The kernel under ThreadSanitizer over 3 chained
    frames equals the interpreter."""
    from framefuse.compiler.schedule import body_task_plan
    from framefuse.compiler.simplify import simplify

    program = simplify(control_flow_graphs.unrolled_lstm_cells(7, 2, hidden=6, **variant))
    loops = [n for n in program.nodes() if n.kind == "bodyloop"]
    assert len(loops) == variant.get("layers", 1)
    sched = schedule(program, grid=4, threads=64)
    tasks = [t for t in sched.tasks if t.root.kind == "bodyloop"]
    assert [t.blocks for t in tasks] == [1] * len(loops)
    assert [body_task_plan(t).whole for t in tasks] == [(0,), ()][: len(loops)]
    kernel = generate(sched, smem_limit_bytes=48 * 1024)
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)


@needs_cxx
def test_a_body_loop_kernel_emulated_matches_the_interpreter(control_flow_graphs, tmp_path):
    """The build rolls the MLP cell's copies (simplify.ROLL_BODIES) and schedules the loop as one
    task on one block (schedule.body_plan: its two products, then the new h, a level each); the
    generated kernel, run on the CPU under ThreadSanitizer over 3 chained frames, matches the
    interpreter, and the tactic stepkernel-unrolled (nothing rolled) still has the copies."""
    from framefuse.compiler import memo, simplify
    from framefuse.compiler.schedule import body_plan
    from framefuse.rewrite import rewrite_model

    assert simplify.ROLL_BODIES is True
    fused, _ = rewrite_model(control_flow_graphs.mlp_cell_loop())
    program = lower_program(fused)
    (loop,) = [n for n in program.nodes() if n.kind == "bodyloop"]
    plan = body_plan(loop)
    assert [n.kind for n in plan.kept] == ["dot", "dot", "ew"] and plan.levels == 3
    sched = schedule(program, grid=4, threads=64)
    (task,) = [t for t in sched.tasks if t.root is loop]
    assert task.blocks == 1
    kernel = generate(sched, smem_limit_bytes=48 * 1024)
    assert "body loop over 6 positions on one block" in kernel.source
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)
    assert "bodyloop" not in memo.cached_program(fused, roll_recurrences=False).counts()


@needs_cxx
@pytest.mark.parametrize(
    "steps,batch,width,hidden,product_body,weights,ahead",
    [
        (1, 1, 3, 5, False, "registers", False),
        (7, 3, 5, 33, False, "shared", True),  # 99 products on 64 threads: more than a round, no registers
        (7, 3, 5, 33, False, "global", False),
        (4, 2, 40, 7, True, "registers", True),
        (33, 1, 6, 4, True, "shared", False),
        (33, 1, 6, 4, True, "shared", True),
    ],
    ids=["T1", "odd-sizes", "odd-sizes-weights-in-global-memory", "product-body", "T33", "T33-ahead"],
)
def test_a_hand_built_body_loop_emulated_matches_the_interpreter(
    steps, batch, width, hidden, product_body, weights, ahead, control_flow_graphs, monkeypatch, tmp_path
):
    """Windows (a graph input's view, staged whole with batched flag-tagged loads; a computed one,
    staged whole too as no loop feeds it, or — ``ahead``: as if a loop fed it — a position ahead), a
    fixed input, a reduction of h inside the body, a body ending in a product, one position and
    many, odd sizes, the products' weights in registers, held in shared memory or read from global
    memory: the emulated kernel (under ThreadSanitizer) against the interpreter; NaN in a frame
    reaches the outputs it reaches there."""
    from framefuse.compiler import schedule as scheduling

    monkeypatch.setattr(scheduling, "BODY_HOLD_WEIGHTS", weights != "global")
    if weights != "registers":
        monkeypatch.setattr(scheduling, "BODY_REGISTER_WEIGHTS", 0)
    if ahead:
        monkeypatch.setattr(scheduling, "_fed_by_loop", lambda value: True)
    program = control_flow_graphs.hand_body_loop(steps, batch, width, hidden, product_body=product_body)
    kernel = generate(schedule(program, grid=3, threads=64), smem_limit_bytes=48 * 1024)
    products = 2 if product_body else 1
    expected = {
        "registers": f"weights: {products} product(s)' in registers, 0 product(s)'",
        "shared": f"weights: 0 product(s)' in registers, {products} product(s)' and 0 other(s) in shared memory",
        "global": "weights: 0 product(s)' in registers, 0 product(s)' and 0 other(s) in shared memory",
    }[weights]
    assert expected in kernel.source
    assert "window 0: whole" in kernel.source and "window 0: 1 run(s) of flag-tagged words" in kernel.source
    assert ("window 1: two rows" if ahead else "window 1: whole") in kernel.source
    _emulate_against_interpreter(kernel, program, 2, tmp_path, races=True)
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal(leaf.shape).astype(np.float32) for n, leaf in program.inputs.items()}
    feeds["x"][-1, 0, 0] = np.nan
    feeds["h0"][:] = 0.0
    outputs, _ = emulate(kernel, {n: v[None] for n, v in feeds.items()}, {}, steps=1, workdir=tmp_path / "nan")
    expected = naive.run(program, feeds)["y"]
    assert np.array_equal(np.isnan(outputs["y"][0]), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert np.allclose(outputs["y"][0][finite], expected[finite], atol=1e-5, rtol=1e-5)


@needs_cxx
def test_resident_kernel_of_a_body_loop_emulated(control_flow_graphs, tmp_path):
    """The resident kernel (a frame per bell, launched once) runs the body loop's task every frame:
    its weights reloaded into registers and shared memory, its windows staged again; every frame's
    outputs are the interpreter's on that frame alone, under ThreadSanitizer."""
    from framefuse.rewrite import rewrite_model

    fused, _ = rewrite_model(control_flow_graphs.mlp_cell_loop())
    program = lower_program(fused)
    assert program.counts()["bodyloop"] == 1 and not program.states
    kernel = generate(schedule(program, grid=4, threads=64), smem_limit_bytes=48 * 1024, resident=True)
    assert "ffk_resident(" in kernel.source and "body loop over 6 positions" in kernel.source
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)


def test_a_body_loop_over_shared_memory_is_declined_naming_it(control_flow_graphs):
    program = control_flow_graphs.hand_body_loop(3, 64, 8, 256, product_body=False)
    with pytest.raises(CompileError, match=r"hand.*needs \d+ bytes of shared memory a block"):
        schedule(program, grid=4, threads=64, smem_floats=4096)


def test_body_loop_checks_its_slots_and_shapes():
    from framefuse.compiler.ir import BodyLoop, Leaf, constant, ew

    h, u = Leaf("slot", "h", (2, 3)), Leaf("slot", "u", (2, 3))
    body = ew("tanh", ew("add", h, u))
    window, h0 = Leaf("input", "w", (5, 2, 3)), Leaf("input", "h0", (2, 3))
    loop = BodyLoop(body, h, [u], [window], [], [], h0)
    assert loop.shape == (5, 2, 3) and loop.inputs() == (window, h0)
    with pytest.raises(CompileError, match="a window of \\[4, 2, 4\\]"):
        BodyLoop(body, h, [u], [Leaf("input", "v", (4, 2, 4))], [], [], h0)
    with pytest.raises(CompileError, match="which no slot binds"):
        BodyLoop(ew("add", body, Leaf("slot", "stray", (2, 3))), h, [u], [window], [], [], h0)
    with pytest.raises(CompileError, match="differ"):
        BodyLoop(body, h, [u], [window], [], [], constant(np.zeros((3, 2), np.float32)))


@needs_cxx
def test_rolled_cells_run_as_loops_in_the_kernel(tmp_path, control_flow_graphs):
    """The two-layer rolled window, generated for 5 blocks and emulated with ThreadSanitizer, gives
    the interpreter's values."""
    from framefuse.compiler.simplify import simplify

    program = simplify(control_flow_graphs.unrolled_cells(layers=(("tanh", True), ("relu", True)), hidden=9))
    kernel = generate(schedule(program, grid=5, threads=64))
    assert kernel.source.count("// recurrence rnn_") == 2
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)


@needs_cxx
def test_an_unrolled_scan_runs_as_one_kernel_carrying_its_state(tmp_path, control_flow_graphs):
    """The Elman Scan as a step graph (h its state): the generated kernel, emulated over 3 steps
    on a grid of 6 blocks with ThreadSanitizer, computes the interpreter's values and carries h."""
    program = lower_program(control_flow_graphs.elman_scan(state=True))
    kernel = generate(schedule(program, grid=6, threads=64))
    assert kernel.source.count('extern "C" __global__') == 1
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)


@pytest.mark.parametrize(
    "make,match",
    [
        (
            lambda g: g.mlp_cell_loop(data_dependent_stop=True),
            r"node 'mlp_loop' \(Loop\): iteration 0: the loop's condition depends on the data",
        ),
        (lambda g: g.mlp_cell_loop(trip_count=False), r"node 'mlp_loop' \(Loop\): has no trip count M"),
    ],
    ids=["data-dependent-stop", "no-trip-count"],
)
def test_a_loop_without_a_static_trip_count_is_declined_naming_it(make, match, control_flow_graphs):
    with pytest.raises(CompileError, match=match):
        lower_program(make(control_flow_graphs))


def test_an_unrolled_loop_past_the_node_budget_is_declined_naming_it(monkeypatch, control_flow_graphs):
    from framefuse.compiler import lower

    monkeypatch.setattr(lower, "CONTROL_FLOW_MAX_NODES", 5 * control_flow_graphs.STEPS)
    with pytest.raises(CompileError, match=r"node 'elman_scan' \(Scan\): 6 iterations of a 6-node body"):
        lower_program(control_flow_graphs.elman_scan())


def test_a_failing_body_node_is_named_with_its_iteration(control_flow_graphs):
    model = control_flow_graphs.elman_scan()
    model.graph.node[0].attribute[0].g.node[4].op_type = "Erfinv"  # no such op anywhere
    with pytest.raises(
        CompileError, match=r"node 'elman_scan' \(Scan\) iteration 0: node '#4' \(Erfinv\): op Erfinv has no lowering"
    ):
        lower_program(model)


def test_bounding_pairs_keep_each_elements_least_and_greatest_index():
    """schedule.bounding_pairs: a loop variable the index only adds is enumerated at its two ends;
    each element's least and greatest index are those of the full enumeration. Under a division,
    a remainder or a guard the variable is kept whole (or the occurrence given up: None)."""
    from framefuse.compiler.schedule import Occurrence, _enumerate_pairs, bounding_pairs

    e, r, q = ix.Var("e", 12), ix.Var("r", 9), ix.Var("q", 3)
    cases = [
        ix.add(ix.mul(ix.floordiv(e, 4), 9), r),  # row e // 4 of a [3, 9] window, read along K
        ix.add(ix.add(ix.mul(e, 5), ix.mul(r, -2)), ix.mul(q, 40)),  # negative coefficient, two loops
        ix.add(ix.mod(ix.add(e, r), 7), q),  # r under a remainder: only q reduced
    ]
    for flat in cases:
        occ = Occurrence(None, flat, (r, q), ())
        full = _enumerate_pairs(occ, e, 12)
        bound = bounding_pairs(occ, e, 12)
        assert bound is not None and bound[0].size < full[0].size
        for elems, _ in (full, bound):
            assert set(elems.tolist()) == set(range(12))
        for i in range(12):
            assert full[1][full[0] == i].min() == bound[1][bound[0] == i].min()
            assert full[1][full[0] == i].max() == bound[1][bound[0] == i].max()
    only_nested = Occurrence(None, ix.mod(ix.add(e, r), 7), (r,), ())
    assert bounding_pairs(only_nested, e, 12) is None
    guarded = Occurrence(None, ix.add(e, r), (r,), ((r, 0, 4),))
    assert bounding_pairs(guarded, e, 12) is None


@needs_cxx
def test_a_window_product_too_large_to_enumerate_stages_only_its_rows(monkeypatch, tmp_path):
    """The input part of an LSTM window is one product over [T, K]: with its index combinations
    past ENUM_LIMIT (a 1024-wide layer at T = 32 is 33.5 M) each block still stages only the rows
    of the positions it computes (schedule.bounding_pairs), not the whole window (which overflowed
    shared memory at hidden 1024, or at 256 with T = 256); the emulated kernel computes the
    interpreter's values."""
    from framefuse.compiler import schedule as sched

    monkeypatch.setattr(sched, "ENUM_LIMIT", 8192)  # the window's products: 2,048 elements x K = 64
    _, program = _sequence_program("lstm", {"model": {"embed": 64, "layers": 1}, "seq": 8, "seed": 0})
    plan = schedule(program, grid=24, threads=128)
    staged = [a for t in plan.tasks for a in t.arrays() if a.how == "thread" and a.node.size >= 8 * 64]
    assert staged and max(a.storage for a in staged) <= 3 * 64  # the rows of its positions, of 8
    monkeypatch.setattr(sched, "bounding_pairs", lambda *args: None)
    whole = schedule(program, grid=24, threads=128)
    assert (
        max(a.storage for t in whole.tasks for a in t.arrays() if a.how == "thread" and a.node.size >= 8 * 64) >= 8 * 64
    )
    _emulate_against_interpreter(generate(plan), program, 1, tmp_path, races=True)


# -- the ONNX RNN op (nn.RNN's export): no fused op, lowered as it stands ----------------------------------


def _torch_rnn_program(nonlinearity, bidirectional, seq, batch, tmp_path):
    """nn.RNN (2 layers) exported as a window of ``seq`` frames; the rewrite leaves its ONNX RNN
    nodes as they are (declined: no fused op). Returns (program, source path, manifest)."""
    import json
    from pathlib import Path

    import torch
    from torch import nn

    from framefuse.exporter import export_model
    from framefuse.rewrite import rewrite_model

    class Layers(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.RNN(
                6, 9, num_layers=2, nonlinearity=nonlinearity, batch_first=True, bidirectional=bidirectional
            )

        def forward(self, x):
            return self.rnn(x)[0]

    torch.manual_seed(0)
    result = export_model(
        Layers().eval(),
        form="sequence",
        config={"batch": batch, "seq": seq, "in_features": 6, "seed": 0},
        out_dir=tmp_path,
        name="rnn",
        exporter="auto",
    )
    fused, report = rewrite_model(result.model_path)
    assert [n.op_type for n in fused.graph.node].count("RNN") == 2
    assert any("ONNX RNN (Elman)" in d.reason for d in report.declined)
    path = Path(result.directory) / "model.fused.onnx"
    onnx.save(fused, str(path))
    return lower_program(path), result.model_path, json.loads(Path(result.manifest_path).read_text())


@pytest.mark.parametrize(
    "nonlinearity,bidirectional,seq,batch", [("tanh", True, 7, 2), ("relu", False, 5, 1), ("tanh", True, 1, 1)]
)
def test_an_onnx_rnn_node_lowers_to_a_loop_a_direction(nonlinearity, bidirectional, seq, batch, tmp_path):
    """nn.RNN's ONNX RNN nodes (Elman: h = act(x·Wᵀ + h·Rᵀ + b)) lower to one ir.Recur a layer and
    direction over a window (the reverse direction reads and writes the window backwards), to the
    cell itself at T = 1; the interpreter matches ONNX Runtime on the export."""
    import onnxruntime as ort

    program, source, manifest = _torch_rnn_program(nonlinearity, bidirectional, seq, batch, tmp_path)
    loops = 2 * (2 if bidirectional else 1) if seq > 1 else 0
    assert program.counts().get("recur", 0) == loops
    x_name, y_name = manifest["inputs"][0]["name"], manifest["outputs"][0]["name"]
    x = np.random.default_rng(2).standard_normal(manifest["inputs"][0]["shape"]).astype(np.float32)
    expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run([y_name], {x_name: x})[0]
    _close(naive.run(program, {x_name: x})[y_name], expected, f"nn.RNN {nonlinearity} T={seq}", tol=1e-5)


@needs_cxx
def test_an_onnx_rnn_window_runs_as_a_loop_in_the_kernel(tmp_path):
    """The relu nn.RNN window's generated kernel, emulated (ThreadSanitizer) on 8 blocks, computes
    the interpreter's values: the Recur loop with the Elman cell."""
    program, _, _ = _torch_rnn_program("relu", True, 5, 2, tmp_path)
    kernel = generate(schedule(program, grid=8, threads=64))
    assert kernel.source.count("for (int rcs = 0; rcs < ") == 4
    _emulate_against_interpreter(kernel, program, 1, tmp_path, races=True)


def test_an_onnx_rnn_node_with_an_activation_per_direction_and_an_initial_state():
    """An ONNX RNN node as other exporters write it: Relu forward, Sigmoid backward, biases and an
    initial state given; the interpreter matches ONNX Runtime on Y and Y_h."""
    import onnxruntime as ort

    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(8)
    T, B, I, H = 6, 2, 3, 5
    node = helper.make_node(
        "RNN",
        ["x", "W", "R", "B", "", "h0"],
        ["Y", "Y_h"],
        name="elman",
        hidden_size=H,
        direction="bidirectional",
        activations=["Relu", "Sigmoid"],
    )
    model = _graph(
        [node],
        [helper.make_tensor_value_info("x", f32, [T, B, I]), helper.make_tensor_value_info("h0", f32, [2, B, H])],
        [helper.make_tensor_value_info("Y", f32, [T, 2, B, H]), helper.make_tensor_value_info("Y_h", f32, [2, B, H])],
        [
            numpy_helper.from_array(rng.standard_normal((2, H, I)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal((2, H, H)).astype(np.float32) * 0.5, "R"),
            numpy_helper.from_array(rng.standard_normal((2, 2 * H)).astype(np.float32), "B"),
        ],
    )
    feeds = {
        "x": rng.standard_normal((T, B, I)).astype(np.float32),
        "h0": rng.standard_normal((2, B, H)).astype(np.float32),
    }
    expected = dict(
        zip(
            ["Y", "Y_h"],
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds),
        )
    )
    program = lower_program(model)
    actual = naive.run(program, feeds)
    for name in ("Y", "Y_h"):
        _close(actual[name], expected[name], name, tol=1e-5)
    model.graph.node[0].attribute.append(helper.make_attribute("clip", 3.0))
    from framefuse.engines.ops import UnsupportedOpError

    # the engine's planner folds the graph before the lowering, and refuses it first
    with pytest.raises((CompileError, UnsupportedOpError), match=r"node 'elman' \(RNN\): clip is not supported"):
        lower_program(model)


@needs_cxx
@pytest.mark.parametrize("arch,embed,seq,grid", [("mamba", 64, 8, 32), ("xlstm", 64, 5, 64)])
def test_skewed_readouts_under_emulation(arch, embed, seq, grid, tmp_path):
    """The other sums the skew reaches in a window (stepkernel-skewed): Mamba's C · h over the
    state (state rows 16 floats apart) and xLSTM's readouts over the head; under emulation the
    kernel still computes what the interpreter does."""
    _, program = _sequence_program(arch, {"model": {"embed": embed, "layers": 2}, "seq": seq, "seed": 0})
    skewed = generate(schedule(program, grid=grid, threads=128), skewed_sums=True)
    assert skewed.source.count("// the first position, see SKEWED_SUM_WALK") >= 2  # a readout a layer
    _emulate_against_interpreter(skewed, program, 1, tmp_path)


@pytest.mark.parametrize("arch", ["min_gru", "lstm", "attention"])
def test_skewed_sums_leave_a_step_form_kernel_unchanged(arch):
    """At T = 1 no zoo sum reads one bank a warp (attention's step form scores a row of the cache
    per warp), so the skewed tactics generate the plain kernel's source and range table: the build
    drops them as duplicates (engines.fusion.apply_selection, by Kernel.identity) instead of timing
    the same kernel twice."""
    program = lower_program(_prepared(arch, FULL).fused)
    sched = schedule(program, grid=132)
    assert generate(sched, skewed_sums=True).identity == generate(sched).identity


def test_the_same_window_concatenated_in_two_shapes_is_summed_once():
    """Mamba's second convolution: the window [state, x] is concatenated once as [1, 8, 4] and once
    as [1, 1, 8, 4] (the same elements in the same order), each multiplied by the same kernel and
    summed over the window. MergeCommon keys a Concat by where its elements come from in its
    inputs' reshape-free bases, so the two Concats, their products and their sums are one each,
    and the interpreter's values are unchanged."""
    from framefuse.compiler.ir import Leaf, Program, concat, constant, ew, reduce, reshape
    from framefuse.compiler.simplify import MergeCommon

    rng = np.random.default_rng(3)
    state = Leaf("state", "conv", (1, 8, 3))
    x = Leaf("input", "x", (1, 8))
    kernel = constant(rng.standard_normal((1, 8, 4)).astype(np.float32))
    window = concat([state, reshape(x, (1, 8, 1))], axis=2)
    window4 = concat([reshape(state, (1, 1, 8, 3)), reshape(x, (1, 1, 8, 1))], axis=3)
    first = reduce("sum", ew("mul", window, kernel), [2], keepdims=False)
    second = reduce("sum", ew("mul", window4, reshape(kernel, (1, 1, 8, 4))), [3], keepdims=False)
    program = Program({"x": x}, {"conv": state}, {"a": first, "b": second}, {})
    assert program.counts()["concat"] == 2 and program.counts()["reduce"] == 2
    merged = MergeCommon(program).run()
    assert merged.counts()["concat"] == 1 and merged.counts()["reduce"] == 1
    feeds = {
        "x": rng.standard_normal((1, 8)).astype(np.float32),
        "conv": rng.standard_normal((1, 8, 3)).astype(np.float32),
    }
    expected, actual = naive.run(program, feeds), naive.run(merged, feeds)
    for name in ("a", "b"):
        assert np.array_equal(actual[name], expected[name]), name
    # a window of other elements (x before the state) stays a Concat of its own
    swapped = concat([reshape(x, (1, 1, 8, 1)), reshape(state, (1, 1, 8, 3))], axis=3)
    third = reduce("sum", ew("mul", swapped, reshape(kernel, (1, 1, 8, 4))), [3], keepdims=False)
    program = Program({"x": x}, {"conv": state}, {"a": first, "c": third}, {})
    assert MergeCommon(program).run().counts()["concat"] == 2


@pytest.mark.parametrize("warp_split_min,skews", [(16, 0), (32, 2)])
def test_mambas_short_window_readouts_are_warp_sums_not_skewed_walks(monkeypatch, warp_split_min, skews):
    """Mamba's sequence window at T = 7, batch 2 (embed 64): the skewed-sums tactic skewed its two
    readouts over the 16 states while a sum over 16 was a thread's loop; with codegen.WARP_SPLIT_MIN
    16 (session 68) each is a warp's sum, so nothing is left to skew (the GPU's tactic test expects
    no skew there)."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "WARP_SPLIT_MIN", warp_split_min)
    config = {"model": {"embed": 64, "layers": 2}, "seq": 7, "batch": 2, "seed": 5}
    prepared = prepare_cached("mamba", config)["sequence"]
    kernel = generate_source(prepared.fused, grid=132, threads=256, skewed_sums=True)
    assert kernel.source.count("see SKEWED_SUM_WALK") == skews


@needs_cxx
@pytest.mark.parametrize("arch", ["min_gru", "mamba", "xlstm"])
def test_resident_kernel_with_every_copy_issued_at_frame_start_emulated(monkeypatch, arch, tmp_path):
    """codegen.RESIDENT_COPIES_AT_START_GROUPS 0: the resident kernel issues every commit group's
    copies while the frame is awaited and none between its tasks; each task still waits for its
    own group (the emulated cp.async lands a copy only at the wait that covers it), and three
    chained frames under ThreadSanitizer equal the interpreter. The launched kernel is unchanged."""
    from framefuse.compiler import codegen

    program = lower_program(_prepared(arch).fused)
    sched = schedule(program, grid=5, threads=64)
    monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", None)
    launched = generate(sched).source
    assert "copies, in flight while the tasks before it run" in generate(sched, resident=True).source
    monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", 0)
    kernel = generate(sched, resident=True)
    assert "copies, in flight while the tasks before it run" not in kernel.source
    assert generate(sched).source == launched
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)


@needs_cxx
def test_resident_poll_counts_emulated(monkeypatch, tmp_path):
    """codegen.RESIDENT_POLL_COUNTS: the frame block's thread 0 passes a counter to its poll and adds
    each frame to one bin of the control words' histogram (ResidentStepBinding.frame_reads); the
    launched kernel counts nothing. min_gru's resident kernel with it, 5 blocks of 64 threads, three
    chained frames under ThreadSanitizer: equal to the interpreter, and the harness checks that the
    histogram counted every frame (a positive multiple of the frames: one count per frame block)."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_POLL_COUNTS", True)
    program = lower_program(_prepared("min_gru").fused)
    sched = schedule(program, grid=5, threads=64)
    kernel = generate(sched, resident=True)
    assert kernel.frame_reads and "ffk_count_reads(ffk_ctl + FFK_CTL_SMS + 5, ffk_reads)" in kernel.source
    assert "&ffk_stop_s, &ffk_reads)" in kernel.source
    launched = generate(sched)
    assert not launched.frame_reads and "ffk_reads" not in launched.source.split('extern "C"')[-1]
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)
    monkeypatch.setattr(codegen, "RESIDENT_POLL_COUNTS", False)
    assert not generate(sched, resident=True).frame_reads


@needs_cxx
@pytest.mark.parametrize("races", [False, True])
def test_resident_framer_replicas_emulated(monkeypatch, races, tmp_path):
    """codegen.RESIDENT_FRAMER_REPLICAS: min_gru on 14 blocks of 64 threads leaves blocks 12 and 13
    without a task; 12 leads, 13 runs the frame block's tasks as that block (b), polls the second
    copy of the words a delay behind it, and keeps its own counter and SM word. The kernel reads
    each input as 2 copies x 2 frames (Kernel.frame_copies, the emulated host writes both copies
    into the frame's half). Four chained frames equal the interpreter; under ThreadSanitizer three.
    With the setting off the resident source is what it was, and the launched kernel never
    changes (on since session 72). (Here the frame block stores flagged words only, each an atomic store in the
    emulator, so its replica's second store of each is no race; a frame block that stores state or
    outputs has its replica store the same floats unordered with its own: the same bits on the GPU,
    a report under ThreadSanitizer.)"""
    from framefuse.compiler import codegen

    program = lower_program(_prepared("min_gru").fused)
    sched = schedule(program, grid=14, threads=64)
    monkeypatch.setattr(codegen, "RESIDENT_FRAMER_REPLICAS", False)
    before, launched = generate(sched, resident=True).source, generate(sched).source
    assert "ffk_copy" not in before
    monkeypatch.setattr(codegen, "RESIDENT_FRAMER_REPLICAS", True)
    kernel = generate(sched, resident=True)
    framer = int(re.search(r"const bool ffk_framer = b == (\d+);", kernel.source).group(1))
    assert kernel.frame_copies == 2
    assert f"b = blockIdx.x == 13 ? {framer} : blockIdx.x;" in kernel.source
    assert "ffk_epoch_s = b == 12 ?" in kernel.source  # the leader: the first free block
    assert "const int ffk_copy = blockIdx.x == 13 ? 1 : 0;" in kernel.source
    assert f"ffk_spin_cycles({codegen.RESIDENT_REPLICA_DELAY})" in kernel.source
    assert "ffk_counters[blockIdx.x] = ffk_base + ffk_n;" in kernel.source
    assert generate(sched).source == launched
    _emulate_against_interpreter(kernel, program, 3 if races else 4, tmp_path, races=races)
    # no free block for the frame block: no replica
    assert generate(schedule(program, grid=5, threads=64), resident=True).frame_copies == 1
    monkeypatch.setattr(codegen, "RESIDENT_FRAMER_REPLICAS", False)
    assert generate(sched, resident=True).source == before


@needs_cxx
def test_resident_two_replicas_of_the_frame_block_emulated(monkeypatch, tmp_path):
    """codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK 2: min_gru on 15 blocks of 64 threads leaves 12, 13
    and 14 free; 12 leads, 14 and 13 poll copies 1 and 2 of the frame words (Kernel.frame_copies 3),
    a third and two thirds of a poll period behind the frame block; three chained frames under
    ThreadSanitizer equal the interpreter. Too few free blocks for two (14 blocks): none."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_FRAMER_REPLICAS", True)
    monkeypatch.setattr(codegen, "RESIDENT_REPLICAS_PER_FRAME_BLOCK", 2)
    program = lower_program(_prepared("min_gru").fused)
    kernel = generate(schedule(program, grid=15, threads=64), resident=True)
    framer = int(re.search(r"const bool ffk_framer = b == (\d+);", kernel.source).group(1))
    assert kernel.frame_copies == 3
    assert f"b = blockIdx.x == 14 ? {framer} : blockIdx.x == 13 ? {framer} : blockIdx.x;" in kernel.source
    assert "const int ffk_copy = blockIdx.x == 14 ? 1 : blockIdx.x == 13 ? 2 : 0;" in kernel.source
    step = round(2 * codegen.RESIDENT_REPLICA_DELAY / 3)
    assert f"ffk_spin_cycles(ffk_copy * {step})" in kernel.source
    assert "ffk_epoch_s = b == 12 ?" in kernel.source
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)
    assert generate(schedule(program, grid=14, threads=64), resident=True).frame_copies == 1


def test_resident_poll_ahead_defines_its_macro_in_the_resident_kernel_only(monkeypatch):
    """codegen.RESIDENT_POLL_AHEAD: the resident kernel defines FFK_POLL_AHEAD (runtime.cuh's
    ffk_poll_frame and ffk_wait_go then issue their next poll beside a relaxed read of the stop
    word), the launched kernel, which polls nothing, does not; off, neither does. (The emulator's
    polls are the reference semantics, unchanged by the macro: the GPU's resident tests and
    resident_variants.py's "poll-ahead", bit for bit the launched kernel, run the PTX.)"""
    from framefuse.compiler import codegen

    sched = schedule(lower_program(_prepared("min_gru").fused), grid=16)
    assert "#define FFK_POLL_AHEAD" not in generate(sched, resident=True).source
    monkeypatch.setattr(codegen, "RESIDENT_POLL_AHEAD", True)
    resident = generate(sched, resident=True).source
    assert "#define FFK_POLL_AHEAD 1" in resident
    assert resident.index("#define FFK_POLL_AHEAD 1") < resident.index("FFK_DEVICE float ffk_poll_frame(")
    assert "ffk_poll_frame(" in resident and "ffk_wait_go(" in resident
    assert "#define FFK_POLL_AHEAD" not in generate(sched).source


@pytest.mark.parametrize(
    "arch,grid,setting",
    [
        ("xlstm", 16, "paced"),
        ("mamba", 16, "paced"),
        ("attention", 5, "paced"),
        ("jamba", 132, "paced"),
        ("attention", 16, "COPIES_AFTER_LEVEL"),
        ("delta_net", 16, "FRAME_BLOCK_COPIES_LATE"),
    ],
)
def test_resident_copies_at_start_keep_the_launched_range_table(monkeypatch, arch, grid, setting):
    """A resident kernel that issues every commit group at frame start runs on its launched
    kernel's range table (CompiledStep.resident_fn refuses a resident kernel whose table differs):
    the paced and deferred commit points stay the launched kernel's (PROLOGUE_GROUPS). Session 70:
    xlstm's paced tactic on 16 SMs had a resident table of its own and test_resident's fewer-SMs
    case failed on the GPU."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", 0)
    fields = {}
    if setting == "paced":
        fields = {"paced_copies": True, "copy_pieces": 0}
    else:
        monkeypatch.setattr(codegen, setting, 1 if setting == "COPIES_AFTER_LEVEL" else True)
    sched = schedule(lower_program(_prepared(arch).fused), grid=grid)
    launched = generate(sched, **fields)
    resident = generate(sched, resident=True, **fields)
    assert "copies, in flight while the tasks before it run" not in resident.source
    assert np.array_equal(resident.ranges(), launched.ranges())
    # (every block records its SM at launch: ResidentStepBinding.block_sms)
    assert "ffk_ctl[FFK_CTL_SMS + b] = ffk_smid();" in resident.source
    assert "ffk_smid()" not in launched.source.split('extern "C"')[-1]


@needs_cxx
def test_resident_paced_copies_at_start_emulated(monkeypatch, tmp_path):
    """The paced tactic's resident kernel with every copy at frame start: its tasks wait for the
    groups the launched kernel's table gives them; xlstm on 5 blocks over three chained frames
    under ThreadSanitizer equals the interpreter."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", 0)
    program = lower_program(_prepared("xlstm").fused)
    sched = schedule(program, grid=5, threads=64)
    kernel = generate(sched, resident=True, paced_copies=True, copy_pieces=0)
    assert np.array_equal(kernel.ranges(), generate(sched, paced_copies=True, copy_pieces=0).ranges())
    _emulate_against_interpreter(kernel, program, 3, tmp_path, races=True)


def test_resident_copies_at_start_by_commit_groups(monkeypatch):
    """codegen.RESIDENT_COPIES_AT_START_GROUPS (10): at the benchmark's size the resident kernels
    with 10 or more commit groups (xlstm, attention, jamba, mamba) issue every copy while the
    frame is awaited; those with fewer (min_gru's 4) keep their commit points between tasks, as
    does every launched kernel."""
    from framefuse.compiler import codegen

    monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", 10)
    point = "copies, in flight while the tasks before it run"
    for arch, at_start in (("min_gru", False), ("mamba", True)):
        program = lower_program(_prepared(arch, FULL).fused)
        sched = schedule(program, grid=132)
        resident = generate(sched, resident=True)
        assert (len(resident.source.split(point)) == 1) is at_start, arch
        assert point in generate(sched).source
        monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", None)
        assert point in generate(sched, resident=True).source
        monkeypatch.setattr(codegen, "RESIDENT_COPIES_AT_START_GROUPS", 10)
