"""bench/rnn_sizes.py on the CPU: --dry-run exports, rewrites and generates the kernel of every
configuration of a tiny grid (the IR interpreter against ONNX Runtime on each), the report's
table and count of rows slower than cuDNN, and the --set override's refusals."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest


@pytest.fixture(scope="module")
def rnn_sizes(bench_script):
    return bench_script("rnn_sizes")


def test_dry_run_generates_every_configurations_kernel(rnn_sizes, tmp_path, monkeypatch):
    from framefuse.compiler import schedule

    monkeypatch.setattr(schedule, "RECUR_MAX_BLOCKS", schedule.RECUR_MAX_BLOCKS)  # restored after --set
    status = rnn_sizes.main(
        [
            "--dry-run",
            "--out",
            str(tmp_path),
            "--kinds",
            "LSTM,GRU,RNN",
            "--hidden",
            "16",
            "--seq",
            "1,5",
            "--set",
            "schedule.RECUR_MAX_BLOCKS=4",
        ]
    )
    assert status == 0
    rows = [json.loads(line) for line in (tmp_path / "rnn_sizes.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["T"], r["dirs"]) for r in rows] == [
        (k, t, d) for k in ("LSTM", "GRU", "RNN") for t in (1, 5) for d in (1, 2)
    ]
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert row["fused_ops"] == ([] if row["kind"] == "RNN" else [f"{row['kind']}Seq"])
        assert row["settings"] == {"schedule.RECUR_MAX_BLOCKS": 4}
        assert row["run"]["dry_run"] is True and row["run"]["select"] == "stepkernel"
        assert row["kernel"]["tasks"] >= 1 and row["kernel"]["smem_bytes"] > 0
        assert row["interpreter_max_abs_err_vs_ort"] < 1e-5
        # T > 1: the recurrence is a loop over the positions (one ir.Recur a direction)
        assert row["kernel"]["counts"].get("recur", 0) == (row["dirs"] if row["T"] > 1 else 0)


def test_report_counts_the_rows_slower_than_cudnn_and_names_failures(rnn_sizes):
    def row(hidden, ours, cudnn):
        return {
            "kind": "LSTM",
            "hidden": hidden,
            "T": 32,
            "dirs": 1,
            "name": f"lstm-h{hidden}",
            "speedup_vs_cudnn": cudnn / ours,
            "selection": "stepkernel",
            "engines": {"framefuse": {"p50_us": ours, "max_abs_err_vs_ort": 1e-7}, "cudnn": {"p50_us": cudnn}},
        }

    broken = {
        "kind": "GRU",
        "hidden": 64,
        "T": 1,
        "dirs": 2,
        "name": "gru-h64",
        "error": "CompileError: x",
        "engines": {},
    }
    args = type("A", (), {"select": "stepkernel", "iters": 10, "rounds": 2})()
    text = rnn_sizes.markdown([row(64, 20.0, 40.0), row(1024, 90.0, 60.0), broken], {"gpu": "G"}, args, {})
    assert "| LSTM | 64 | 32 | 1 | 20.0 | 40.0 |" in text and "2.00×" in text and "0.67×" in text
    assert "slower than cuDNN: **1 of 3**" in text
    assert "- gru-h64: CompileError: x" in text


def _timed_row(kind, hidden, seq, dirs, ours, cudnn, gpu="NVIDIA H100 80GB HBM3"):
    run = {"gpu": gpu, "torch_version": "2.11", "select": "time", "iters": 1000, "rounds": 5, "dry_run": False}
    return {
        "kind": kind,
        "hidden": hidden,
        "T": seq,
        "dirs": dirs,
        "name": f"{kind.lower()}-h{hidden}-t{seq}-d{dirs}",
        "settings": {},
        "run": run,
        "speedup_vs_cudnn": cudnn / ours,
        "selection": "stepkernel-384-threads",
        "engines": {"framefuse": {"p50_us": ours, "max_abs_err_vs_ort": 1e-7}, "cudnn": {"p50_us": cudnn}},
    }


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_merge_puts_several_runs_in_one_table_in_grid_order(rnn_sizes, tmp_path):
    """--merge: the rows of two calls in the grid's order, the runs named, the grid's missing
    configurations listed, jsonl and md written whole; the rows' own timings kept."""
    first = _jsonl(tmp_path / "a.jsonl", [_timed_row("GRU", 64, 256, 1, 100.0, 150.0)])
    second = _jsonl(
        tmp_path / "b.jsonl", [_timed_row("LSTM", 1024, 32, 2, 290.0, 380.0), _timed_row("LSTM", 64, 1, 1, 13.0, 29.0)]
    )
    out = tmp_path / "merged"
    assert rnn_sizes.main(["--merge", first, second, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "rnn_sizes.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows] == ["lstm-h64-t1-d1", "lstm-h1024-t32-d2", "gru-h64-t256-d1"]
    text = (out / "rnn_sizes.md").read_text()
    assert "**NVIDIA H100 80GB HBM3**" in text and "`--select time`" in text
    assert f"Merged from 2 runs, each row from one: {first}, {second}." in text
    assert "| LSTM | 1024 | 32 | 2 | 290.0 | 380.0 |" in text and "slower than cuDNN: **0 of 3**" in text
    assert "not run (33): LSTM 64 / 1 / 2, " in text and "GRU 64 / 256 / 1," not in text
    assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize(
    "second,message",
    [
        ([_timed_row("GRU", 64, 256, 1, 1.0, 1.0)], "gru-h64-t256-d1 is in both"),
        ([_timed_row("GRU", 64, 32, 1, 1.0, 1.0, gpu="NVIDIA H200")], "has gpu 'NVIDIA H200', .* has 'NVIDIA H100"),
        ([{k: v for k, v in _timed_row("GRU", 64, 32, 1, 1.0, 1.0).items() if k != "run"}], "does not say which GPU"),
    ],
)
def test_merge_refuses_rows_measured_differently_or_twice_with_one_line(rnn_sizes, tmp_path, second, message):
    first = _jsonl(tmp_path / "a.jsonl", [_timed_row("GRU", 64, 256, 1, 100.0, 150.0)])
    with pytest.raises(SystemExit, match=message):
        rnn_sizes.main(["--merge", first, _jsonl(tmp_path / "b.jsonl", second), "--out", str(tmp_path / "m")])
    assert not (tmp_path / "m").exists()
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: not a JSON row"):
        rnn_sizes.main(["--merge", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "m")])


@pytest.mark.parametrize(
    "setting,message",
    [
        ("schedule.NO_SUCH_SETTING=1", "has no setting NO_SUCH_SETTING"),
        ("schedule.RECUR_MAX_BLOCKS=lots", "is not a Python literal"),
        ("RECUR_MAX_BLOCKS", "expected MODULE.NAME=VALUE"),
    ],
)
def test_a_bad_setting_is_refused_with_one_line(rnn_sizes, setting, message, monkeypatch):
    from framefuse.compiler import schedule

    monkeypatch.setattr(schedule, "RECUR_MAX_BLOCKS", schedule.RECUR_MAX_BLOCKS)
    with pytest.raises(SystemExit, match=message):
        rnn_sizes.apply_settings([setting])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_grids_largest_window_generates_within_shared_memory(rnn_sizes, kind, tmp_path):
    """hidden 1024, T = 256, both directions: the window's input product stages only its blocks'
    rows (schedule.bounding_pairs), so the kernel fits the H100's shared memory (before: 1 MB a
    block, declined)."""
    entry = rnn_sizes.export_window(kind, 1024, 256, 2, tmp_path)
    row: dict = {}
    kernel = rnn_sizes.dry_run(entry, row)
    assert row["kernel"]["counts"]["recur"] == 2
    assert row["kernel"]["smem_bytes"] <= 227 * 1024
    if shutil.which("nvcc") is None:
        return
    # R read from global memory each position (not held: 4·1024 rows a layer): the loop's other path
    from framefuse.compiler.engine import FAST_MATH_OPTIONS

    source = tmp_path / "rnn.cu"
    source.write_text(kernel.source)
    result = subprocess.run(
        [
            "nvcc",
            "-cubin",
            *FAST_MATH_OPTIONS,
            "-arch=sm_90",
            "-Xptxas",
            "-warn-spills",
            "-o",
            str(tmp_path / "rnn.cubin"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "spill" not in result.stderr.lower(), result.stderr[-2000:]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler to emulate the generated kernel")
@pytest.mark.parametrize("kind,directions", [("GRU", 1), ("LSTM", 1), ("GRU", 2)])
def test_a_window_kernel_writes_the_graph_output_emulated(rnn_sizes, kind, directions, tmp_path):
    """The benchmark's own export at a small size, its generated kernel emulated on the CPU
    against the interpreter. A one-direction GRU's output is a reshape of the recurrence itself,
    so the loop must store it to the host (it once stored only the flag-tagged copy: the H100
    read back an unwritten window, max abs error 0.84)."""
    import numpy as np

    from framefuse.compiler import lower_program, naive
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import emulate
    from framefuse.compiler.schedule import schedule

    window = rnn_sizes.export_window(kind, 12, 6, directions, tmp_path)
    program = lower_program(window["fused"])
    assert program.counts().get("recur") == directions
    kernel = generate(schedule(program, grid=8, threads=64))
    x = np.random.default_rng(3).standard_normal(program.inputs["x"].shape).astype(np.float32)
    outputs, _ = emulate(kernel, {"x": x[None]}, {}, steps=1, workdir=tmp_path / "emu", races=True)
    expected = naive.run(program, {"x": x})["y"]
    assert np.isfinite(outputs["y"][0]).all(), "the kernel left output elements unwritten"
    assert float(np.abs(outputs["y"][0] - expected).max()) < 1e-5


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler to emulate the generated kernel")
@pytest.mark.parametrize("share", [False, True])
def test_two_directions_of_a_wide_recurrence_share_the_grid_emulated(rnn_sizes, share, monkeypatch, tmp_path):
    """schedule.RECUR_WIDE_SHARE_LEVEL: a bidirectional layer whose R is held over more blocks than
    RECUR_MAX_BLOCKS (a GRU at hidden 1024 on the H100) gives each direction the half of the grid the
    placement shares out, so the two run side by side on disjoint blocks; off, each takes the whole
    grid and they run one after the other. Either way the emulated kernel (ThreadSanitizer)
    computes the interpreter's values."""
    import numpy as np

    from framefuse.compiler import lower_program, naive
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import emulate
    from framefuse.compiler.ir import Recur

    monkeypatch.setattr(sched, "RECUR_SMEM_FLOATS", 64)  # one unit a block at most: wide
    monkeypatch.setattr(sched, "RECUR_MAX_BLOCKS", 2)
    monkeypatch.setattr(sched, "RECUR_WIDE_SHARE_LEVEL", share)
    window = rnn_sizes.export_window("GRU", 12, 5, 2, tmp_path)
    program = lower_program(window["fused"])
    plan = sched.schedule(program, grid=12, threads=64)
    loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
    assert len(loops) == 2 and all(sched.recur_held(t.root, t.chunk, t.stage_limit) for t in loops)
    spans = [set(range(t.first, t.first + t.blocks)) for t in loops]
    if share:
        assert [t.blocks for t in loops] == [6, 6] and not spans[0] & spans[1]
    else:
        assert [t.blocks for t in loops] == [12, 12]
    kernel = generate(plan)
    x = np.random.default_rng(4).standard_normal(program.inputs["x"].shape).astype(np.float32)
    outputs, _ = emulate(kernel, {"x": x[None]}, {}, steps=1, workdir=tmp_path / "emu", races=True)
    assert float(np.abs(outputs["y"][0] - naive.run(program, {"x": x})["y"]).max()) < 1e-5


def _shrink_hybrid_recurrences(monkeypatch) -> None:
    """The schedule's recurrence bounds shrunk so that an LSTM's two directions at hidden 32 on 8
    blocks hold R as hidden 1024's do on the H100: split between registers and shared memory."""
    from framefuse.compiler import schedule as sched

    for name, value in [
        ("RECUR_SMEM_FLOATS", 64),
        ("RECUR_MAX_BLOCKS", 2),
        ("RECUR_WIDE_SHARE_LEVEL", True),
        ("RECUR_REGISTER_WEIGHTS", 8),
        ("RECUR_ARENA_RESERVE", 0),
    ]:
        monkeypatch.setattr(sched, name, value)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler to emulate the generated kernel")
def test_r_split_between_registers_and_shared_memory_emulated(rnn_sizes, monkeypatch, tmp_path):
    """schedule.RECUR_HYBRID: where R does not fit the arena even over the blocks a direction gets
    (an LSTM's two directions at hidden 1024 on the H100), each thread keeps the first
    RECUR_REGISTER_WEIGHTS of its K split in registers and only the rest sits in shared memory;
    the two directions still run side by side, and the emulated kernel (ThreadSanitizer) computes
    the interpreter's values."""
    import numpy as np

    from framefuse.compiler import lower_program, naive
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import emulate
    from framefuse.compiler.ir import Recur

    _shrink_hybrid_recurrences(monkeypatch)
    window = rnn_sizes.export_window("LSTM", 32, 5, 2, tmp_path)
    program = lower_program(window["fused"])

    def plans(hybrid):
        monkeypatch.setattr(sched, "RECUR_HYBRID", hybrid)
        plan = sched.schedule(program, grid=8, threads=64, smem_floats=500)
        loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
        return plan, loops, [sched.recur_plan(t.root, t.chunk, t.stage_limit, t.threads) for t in loops]

    # off: 8 units a block would need 1448 floats for all of R, more than the arena's 1000, so each
    # direction takes the whole grid (4 units a block) and the two run one after the other
    _, loops, off = plans(False)
    assert [t.blocks for t in loops] == [8, 8] and not any(p.hybrid for p in off)
    schedule_on, loops, on = plans(True)
    assert [t.blocks for t in loops] == [4, 4] and loops[0].first != loops[1].first
    assert all(p.held and p.hybrid and (p.kc, p.kr) == (16, 8) for p in on)
    assert all(sched.task_smem_floats(t) <= 1000 for t in loops)
    kernel = generate(schedule_on)
    assert kernel.source.count("the rest of the split from shared memory") == 2
    x = np.random.default_rng(5).standard_normal(program.inputs["x"].shape).astype(np.float32)
    outputs, _ = emulate(kernel, {"x": x[None]}, {}, steps=1, workdir=tmp_path / "emu", races=True)
    assert float(np.abs(outputs["y"][0] - naive.run(program, {"x": x})["y"]).max()) < 1e-5


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler to emulate the generated kernel")
def test_an_uneven_k_split_gives_way_to_one_that_keeps_weights_in_registers_emulated(rnn_sizes, monkeypatch, tmp_path):
    """schedule.RECUR_DIVISOR_SPLIT with RECUR_HYBRID: a GRU block's 12 product rows over 64 threads
    take 5 K splits, which do not divide hidden 32 (7 weights a split, no registers); 4 splits of 8
    do, and put each thread's first RECUR_REGISTER_WEIGHTS in registers, the rest in shared memory
    (where all of R would have fit: fewer shared-memory reads a position). The emulated kernel
    (ThreadSanitizer) computes the interpreter's values."""
    import numpy as np

    from framefuse.compiler import lower_program, naive
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.emulate import emulate
    from framefuse.compiler.ir import Recur

    monkeypatch.setattr(sched, "RECUR_SMEM_FLOATS", 400)  # 4 units a block, all of R held
    monkeypatch.setattr(sched, "RECUR_REGISTER_WEIGHTS", 4)
    window = rnn_sizes.export_window("GRU", 32, 5, 1, tmp_path)
    program = lower_program(window["fused"])

    def plans(even):
        monkeypatch.setattr(sched, "RECUR_HYBRID", even)
        monkeypatch.setattr(sched, "RECUR_DIVISOR_SPLIT", even)
        plan = sched.schedule(program, grid=8, threads=64, smem_floats=2000)
        loops = [t for t in plan.tasks if isinstance(t.root, Recur)]
        return plan, [sched.recur_plan(t.root, t.chunk, t.stage_limit, t.threads) for t in loops]

    _, off = plans(False)
    assert [(p.held, p.rows, p.splits, p.kc, p.kr) for p in off] == [(True, 12, 5, 7, 0)]
    schedule_on, on = plans(True)
    assert [(p.held, p.rows, p.splits, p.kc, p.kr) for p in on] == [(True, 12, 4, 8, 4)]
    kernel = generate(schedule_on)
    assert kernel.source.count("the rest of the split from shared memory") == 1
    x = np.random.default_rng(6).standard_normal(program.inputs["x"].shape).astype(np.float32)
    outputs, _ = emulate(kernel, {"x": x[None]}, {}, steps=1, workdir=tmp_path / "emu", races=True)
    assert float(np.abs(outputs["y"][0] - naive.run(program, {"x": x})["y"]).max()) < 1e-5


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler to emulate the generated kernel")
def test_the_512_thread_tactic_widens_only_kernels_with_a_hybrid_recurrence_emulated(rnn_sizes, monkeypatch, tmp_path):
    """The build's stepkernel-512-threads tactic (prepare_step's hybrid_threads): where the plain
    schedule holds a recurrence's R partly in registers (schedule.hybrid_recurrences: nn.LSTM's two
    directions at hidden 1024 on the H100, here shrunk as in the test above), the kernel is
    scheduled and generated for the wider blocks, and the emulated kernel (ThreadSanitizer)
    computes the interpreter's values; where none is (RECUR_HYBRID off), the tactic's source is the
    plain kernel's, so the build has no second candidate to compile and time."""
    import numpy as np

    from framefuse.compiler import lower_program, memo, naive
    from framefuse.compiler import schedule as sched
    from framefuse.compiler.emulate import emulate
    from framefuse.compiler.engine import STATIC_SMEM_RESERVE, prepare_step

    _shrink_hybrid_recurrences(monkeypatch)
    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path / "cache"))
    window = rnn_sizes.export_window("LSTM", 32, 5, 2, tmp_path)
    program = lower_program(window["fused"])
    # a GPU of 8 SMs whose schedule bound on a task's arrays is the test above's 500 floats
    props = {"cc": (9, 0), "sm_count": 8, "max_shared_per_block_optin": STATIC_SMEM_RESERVE + 4000, "name": "test"}

    def sources(hybrid):
        monkeypatch.setattr(sched, "RECUR_HYBRID", hybrid)
        memo.clear()  # the schedules depend on the patched constants
        plain = prepare_step(program, props, threads=64)
        wide = prepare_step(program, props, threads=64, hybrid_threads=128)
        return plain, wide

    plain, wide = sources(False)
    assert not sched.hybrid_recurrences(plain.schedule)
    assert wide.kernel.digest == plain.kernel.digest and wide.threads == plain.threads == 64

    plain, wide = sources(True)
    assert len(sched.hybrid_recurrences(plain.schedule)) == 2 and plain.threads == 64
    assert wide.threads == 128 and wide.kernel.digest != plain.kernel.digest
    assert wide.schedule.threads == 128 and plain.schedule.threads == 64
    x = np.random.default_rng(7).standard_normal(program.inputs["x"].shape).astype(np.float32)
    outputs, _ = emulate(wide.kernel, {"x": x[None]}, {}, steps=1, workdir=tmp_path / "emu", races=True)
    assert float(np.abs(outputs["y"][0] - naive.run(program, {"x": x})["y"]).max()) < 1e-5
    memo.clear()
