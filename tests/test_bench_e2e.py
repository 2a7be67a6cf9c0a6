"""bench/e2e.py on the CPU: every section that runs without a GPU, --quick, tiny sizes; the JSON
fields the published report relies on, the GPU-only peers skipped with a reason, and --merge."""

from __future__ import annotations

import json

import pytest

from framefuse.runtime.bench_cli import load_e2e

PRECISIONS = ["fp32", "fp16", "bf16", "int8"]


@pytest.fixture(scope="module")
def e2e():
    return load_e2e()


@pytest.fixture(scope="module")
def smoke(e2e, tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_e2e")
    out = root / "out"
    status = e2e.main(
        [
            "--device",
            "cpu",
            "--quick",
            "--section",
            "all",
            "--archs",
            "min_gru",
            "--models",
            "torch_gru_bidir",
            "--embed",
            "16",
            "--seq",
            "3",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--accuracy-frames",
            "20",
            "--out",
            str(out),
            "--work",
            str(root / "work"),
        ]
    )
    assert status == 0
    return out, json.loads((out / "e2e.json").read_text())


def test_quick_run_is_marked_not_for_publication(smoke):
    out, results = smoke
    assert results["quick"] is True and results["publication"] == "quick: not for publication"
    assert "quick: not for publication" in (out / "e2e.md").read_text()
    assert results["sections"] == ["zoo", "real", "precision"]
    for key in ("gpu", "torch_version", "onnxruntime_version"):
        assert key in results["environment"]
    assert results["created"] and results["config"]["iters"] == 3


def _check_engine_rows(e2e, rows, expected_T):
    assert {r["T"] for r in rows} == expected_T
    for row in rows:
        engines = row["engines"]
        for name in ("framefuse", "framefuse_unfused", "torch_eager", "ort_cpu"):
            assert "p50_us" in engines[name] and "p99_us" in engines[name], f"{name}: {engines[name]}"
            assert engines[name]["max_abs_err_vs_ort"] < 1e-4
            assert "speedup_vs_best_peer" in engines[name]
        for name in e2e.GPU_ONLY:  # CUDA graph, both compile peers, the floor
            assert engines[name] == {"skipped": "no GPU"}, name
        selection = engines["framefuse"]["selection"]
        assert selection["chosen"] == "plan" and "skipped" in selection  # no timing without a GPU
        assert "build_s" in engines["framefuse"]
        assert row["best_peer"] in e2e.PEERS and row["best_peer_p50_us"] > 0
        assert isinstance(row["speedup_vs_best_peer"], float) and isinstance(row["below_best_peer"], bool)
        assert row["kernels"] == {"skipped": "no GPU"}


def test_zoo_rows(e2e, smoke):
    _, results = smoke
    _check_engine_rows(e2e, results["rows"], {1, 3})
    assert {r["form"] for r in results["rows"]} == {"step", "sequence"}


def test_real_rows(e2e, smoke):
    out, results = smoke
    _check_engine_rows(e2e, results["real_rows"], {3, 1})
    assert all(r["section"] == "real" and r["arch"] == "torch_gru_bidir" for r in results["real_rows"])
    assert "length-1 sequence" in (out / "e2e.md").read_text()


def test_precision_rows(smoke):
    out, results = smoke
    rows = {r["precision"]: r for r in results["precision_rows"]}
    assert sorted(rows) == sorted(PRECISIONS)
    for precision, row in rows.items():
        assert "error" not in row, f"{precision}: {row.get('error')}"
        assert row["p50_us"] > 0 and row["p99_us"] >= row["p50_us"]
        if precision != "fp32":
            acc = row["accuracy"]
            assert acc["frames"] == 20 and acc["policy_output"] == "y"
            assert acc["max_abs_policy"] is not None and 0.0 <= acc["argmax_agreement"] <= 1.0
            assert isinstance(acc["passed"], bool)
        # an architecture's precisions timed in the same interleaved rounds
        assert row["rounds"] == len(row["round_p50_us"]) >= 1
        assert row["speedup_vs_fp32"] == pytest.approx(rows["fp32"]["p50_us"] / row["p50_us"])
    table = (out / "e2e.md").read_text()
    assert "| min_gru | bf16 |" in table and "argmax agreement" in table
    assert "Precision rows slower than fp32 in the same rounds:" in table


def test_precision_gate_cell_names_what_the_int8_fallback_kept(e2e):
    """The gate column: what `framefuse build` ships (with the products its int8 fallback kept in
    float32, from the build's report) or a refusal."""
    from framefuse.precision.accuracy import AccuracyReport

    report = AccuracyReport(
        reference="model.fused.onnx",
        candidate="model.fused.int8.onnx",
        precision="int8",
        form="step",
        frames=20,
        seed=0,
        tolerance=0.1,
        policy_output="y",
        argmax_agreement=0.996,
        kept_fp32=["/in_proj/Gemm", "/o_proj/MatMul"],
    )
    acc = e2e.accuracy_summary(AccuracyReport.from_dict(report.to_dict()))  # as read back from its JSON
    assert acc["kept_fp32"] == ["/in_proj/Gemm", "/o_proj/MatMul"] and acc["passed"]
    assert e2e._gate_cell({"accuracy": acc}) == "yes (fp32: /in_proj/Gemm, /o_proj/MatMul)"
    assert e2e._gate_cell({"accuracy": dict(acc, kept_fp32=[])}) == "yes"
    assert e2e._gate_cell({"accuracy": acc, "refused": "int8 build rejected"}) == "no"
    assert e2e._gate_cell({"accuracy": dict(acc, passed=False)}) == "no"


def test_markdown_states_rows_below_the_best_peer(smoke):
    out, _ = smoke
    table = (out / "e2e.md").read_text()
    assert "| rank | architecture | category | ms |" in table
    assert "below 1.0× of the best peer" in table
    assert "floor" in table
    assert "× mapped floor" in table and "µs / level" in table


def test_row_ratios_to_both_floors_and_the_cost_of_a_level(e2e):
    """A row's multiples of the copy floor and of the mapped floor, and the step kernel's cost per
    dependency level from its profiled kernel time (synthetic timings: no GPU here)."""
    row = {
        "engines": {
            "framefuse": {
                "p50_us": 20.0,
                "p99_us": 24.0,
                "stepkernel": {"levels": 8},
                "kernels": {"kernels_per_call": 1.0, "kernel_us_per_call": 12.0},
            },
            "torch_cuda_graph": {"p50_us": 50.0, "p99_us": 60.0, "kernels": {"kernels_per_call": 9.0}},
            "floor": {"p50_us": 16.0, "p99_us": 20.0},
            "mapped_floor": {"p50_us": 8.0, "p99_us": 12.0},
            "mapped_floor_done": {"p50_us": 6.25, "p99_us": 10.0},
        }
    }
    e2e.finish_row(row)
    e2e.profile_row(
        row,
        e2e.Settings(iters=1, warmup=0, device="cuda", compile_forms=(), replays=(), profile_calls=5, quick=False),
        type("Dev", (), {"type": "cuda"})(),
    )
    assert row["speedup_vs_best_peer"] == 2.5 and row["best_peer"] == "torch_cuda_graph"
    assert row["floor_multiple"] == 1.25 and row["mapped_floor_multiple"] == 2.5
    assert "speedup_vs_best_peer" not in row["engines"]["mapped_floor"]  # a floor is not a peer
    assert row["mapped_floor_done_p50_us"] == 6.25 and row["mapped_floor_done_multiple"] == 3.2
    assert "speedup_vs_best_peer" not in row["engines"]["mapped_floor_done"]
    assert row["engines"]["framefuse"]["stepkernel"]["us_per_level"] == 1.5
    assert row["kernels"]["framefuse"]["kernels_per_call"] == 1.0


def test_merge_keeps_every_section(e2e, smoke, tmp_path):
    _, results = smoke
    zoo = dict(results, sections=["zoo"], real_rows=[], precision_rows=[], quick=False)
    zoo.pop("publication")
    rest = dict(results, sections=["real", "precision"], rows=[])
    paths = []
    for name, part in (("zoo", zoo), ("rest", rest)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(part))
        paths.append(str(path))
    merged = e2e.merge(paths, tmp_path / "merged")
    assert merged["sections"] == ["zoo", "real", "precision"]
    assert len(merged["rows"]) == len(results["rows"]) and len(merged["real_rows"]) == len(results["real_rows"])
    assert len(merged["precision_rows"]) == len(results["precision_rows"])
    assert merged["quick"] is True and merged["publication"] == "quick: not for publication"
    assert (tmp_path / "merged" / "e2e.md").is_file()


def test_a_merge_names_the_run_of_every_row_and_drops_gaps_another_run_filled(e2e, smoke, tmp_path):
    """Issue 17's merged benchmark says which rows came from which run, through an older merge
    too, and a unit one run could not time is no longer listed as not run once another run has
    its rows."""
    _, results = smoke
    results = dict(results, real_rows=[], precision_rows=[])
    step_row = next(r for r in results["rows"] if r["T"] == 1)
    seq_row = next(r for r in results["rows"] if r["T"] != 1)
    config = dict(results["config"], forms=["step", "sequence"])
    first = dict(results, config=config, rows=[step_row], not_run=["zoo min_gru"], created="run-1")
    second = dict(results, config=config, rows=[seq_row], not_run=["zoo xlstm"], created="run-2")
    paths = []
    for name, part in (("first", first), ("second", second)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(part))
        paths.append(str(path))
    older = e2e.merge(paths, tmp_path / "older")
    assert {(r["T"], r["run"]["file"]) for r in older["rows"]} == {(1, paths[0]), (seq_row["T"], paths[1])}
    # min_gru's T = 1 and T = 32 rows are both here now; xlstm's are not
    assert older["not_run"] == [f"zoo xlstm ({paths[1]})"]
    # the architectures no run has a row for, at each T the report has, tried or not
    assert "zoo xlstm T=1" in older["missing"] and f"zoo attention T={seq_row['T']}" in older["missing"]
    assert not any("min_gru" in m for m in older["missing"])
    # an older merge's rows without a run are traced to the file they came from
    for row in older["rows"]:
        del row["run"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    engines = step_row["engines"]
    remeasured = dict(step_row, engines=dict(engines, framefuse=dict(engines["framefuse"], p50_us=1.0)))
    later = dict(results, rows=[remeasured], not_run=[], created="run-3")
    (tmp_path / "later.json").write_text(json.dumps(later))
    merged = e2e.merge([str(tmp_path / "older.json"), str(tmp_path / "later.json")], tmp_path / "merged")
    runs = {r["T"]: r["run"]["file"] for r in merged["rows"]}
    assert runs == {1: str(tmp_path / "later.json"), seq_row["T"]: paths[1]}
    text = (tmp_path / "merged" / "e2e.md").read_text()
    assert f"Rows by run: {tmp_path / 'later.json'}: min_gru T = 1; {paths[1]}: min_gru T = {seq_row['T']}." in text
    assert f"not run (time budget): zoo xlstm ({paths[1]})" in text
    assert "rows measured run-2 to run-3" in text  # the runs behind the rows, not the first file's date


def test_a_merge_of_real_rows_at_one_T_and_zoo_rows_at_another_names_the_real_rows_it_lacks(e2e, smoke, tmp_path):
    """The H200 benchmark merges T = 1 real-model runs with T = 32 zoo runs: the real models' T = 32
    rows are missing from it and the report says so (they were not named before)."""
    _, results = smoke
    seq_row = next(r for r in results["rows"] if r["T"] != 1)
    real_step = next(r for r in results["real_rows"] if r["T"] == 1)
    zoo_part = dict(results, rows=[seq_row], real_rows=[], precision_rows=[], not_run=[], created="run-1")
    real_part = dict(results, rows=[], real_rows=[real_step], precision_rows=[], not_run=[], created="run-2")
    paths = []
    for name, part in (("zoo", zoo_part), ("real", real_part)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(part))
        paths.append(str(path))
    merged = e2e.merge(paths, tmp_path / "merged")
    assert f"real {real_step['arch']} T={seq_row['T']}" in merged["missing"]
    assert f"zoo {seq_row['arch']} T=1" in merged["missing"]
    assert f"real {real_step['arch']} T=1" not in merged["missing"]
    assert f"zoo {seq_row['arch']} T={seq_row['T']}" not in merged["missing"]
    # a zoo-only report does not list every real model as missing
    alone = e2e.merge(paths[:1], tmp_path / "zoo-only")
    assert not any(m.startswith("real ") for m in alone["missing"])


def test_the_png_has_a_panel_per_section_and_T_real_models_included(e2e, smoke, tmp_path, monkeypatch):
    """A report of real models only (the T = 32 runs of issue 17) gets its PNG too: a panel per
    section and T; a report with no rows writes none (and removes a stale one)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    _, results = smoke
    real_only = dict(results, rows=[], precision_rows=[])
    assert real_only["real_rows"]
    panels = []
    real_subplots = plt.subplots

    def subplots(rows, cols, **kwargs):
        panels.append(cols)
        return real_subplots(rows, cols, **kwargs)

    monkeypatch.setattr(plt, "subplots", subplots)
    assert e2e.plot(real_only, tmp_path / "real.png") is None
    assert (tmp_path / "real.png").stat().st_size > 0
    assert panels == [len({r["T"] for r in real_only["real_rows"]})]
    assert e2e.plot(results, tmp_path / "all.png") is None
    assert panels[-1] == len({r["T"] for r in results["rows"]}) + len({r["T"] for r in results["real_rows"]})
    stale = tmp_path / "none.png"
    stale.write_bytes(b"old")
    assert e2e.plot(dict(results, rows=[], real_rows=[]), stale) is None and not stale.exists()


def test_a_full_run_never_skips_a_compile_peer(e2e, tmp_path):
    with pytest.raises(SystemExit, match="never skips"):
        e2e.main(["--device", "cpu", "--compile", "step", "--archs", "min_gru", "--out", str(tmp_path)])


def test_forms_pick_the_rows_and_a_bad_form_is_refused(e2e, tmp_path):
    # a long T = --seq row can run in a call of its own (and be merged): it still holds every peer
    argv = ["--device", "cpu", "--quick", "--archs", "min_gru", "--embed", "16", "--seq", "3"]
    argv += ["--iters", "2", "--warmup", "1", "--profile-calls", "0", "--work", str(tmp_path / "work")]
    assert e2e.main([*argv, "--forms", "sequence", "--out", str(tmp_path / "seq")]) == 0
    results = json.loads((tmp_path / "seq" / "e2e.json").read_text())
    assert [row["T"] for row in results["rows"]] == [3] and results["config"]["forms"] == ["sequence"]
    _check_engine_rows(e2e, results["rows"], {3})
    with pytest.raises(SystemExit, match="--forms: unknown"):
        e2e.main([*argv, "--forms", "steps", "--out", str(tmp_path / "bad")])


def test_engines_are_timed_in_interleaved_rounds_and_a_failure_stays_its_own(e2e):
    """measure_rounds: each engine's warm-up, then rounds in which every engine runs a block of
    iters / rounds calls in turn (so all of them sample the same windows of the host); an engine
    that raises is reported as its exception and the others finish."""
    order = []

    def engine(name, fail_at=None):
        def call(i):
            if fail_at is not None and len([n for n in order if n == name]) == fail_at:
                raise RuntimeError(f"{name} broke")
            order.append(name)
            return i

        return call

    timed = e2e.measure_rounds(
        {"a": engine("a"), "b": engine("b"), "c": engine("c", fail_at=4)}, iters=7, warmup=1, rounds=3
    )
    # warm-up (one each), then blocks of 3, 2, 2 calls, the order rotated each round (abc, bca,
    # cab); c raises on its 5th call (its first of round 2, before it records) and is left out
    # from then on
    assert "".join(order) == "abc" + "aaabbbccc" + "bbaa" + "aabb"
    assert isinstance(timed["c"], RuntimeError)
    for name in "ab":
        assert timed[name]["iters"] == 7 and timed[name]["rounds"] == 3
        assert len(timed[name]["round_p50_us"]) == 3
        assert timed[name]["p50_us"] > 0


def test_the_report_says_how_engines_were_timed(smoke):
    out, results = smoke
    assert results["config"]["rounds"] == 3  # --iters 3: no more rounds than calls
    assert "timed in 3 interleaved rounds" in (out / "e2e.md").read_text()
    for row in results["rows"]:
        for name, entry in row["engines"].items():
            if "p50_us" in entry:
                assert entry["rounds"] == (1 if name == "framefuse_resident" else 3), (name, entry)


def test_prebuild_builds_the_named_engines_in_order_times_nothing_and_cannot_be_merged(e2e, tmp_path, monkeypatch):
    # --prebuild fills the compile caches for a row whose builds outlast one device call
    built = []
    real_make_ort = e2e.make_ort

    def make_ort(*args, **kwargs):
        built.append("ort_cpu")
        return real_make_ort(*args, **kwargs)

    monkeypatch.setattr(e2e, "make_ort", make_ort)
    monkeypatch.setattr(e2e, "measure_rounds", lambda *a, **k: pytest.fail("--prebuild timed an engine"))
    argv = ["--device", "cpu", "--quick", "--archs", "min_gru", "--embed", "16", "--seq", "3", "--forms", "sequence"]
    argv += ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "pre")]
    assert e2e.main([*argv, "--prebuild", "ort_cpu,torch_eager,torch_compile"]) == 0
    results = json.loads((tmp_path / "pre" / "e2e.json").read_text())
    assert results["prebuild"] == ["ort_cpu", "torch_eager", "torch_compile"]
    assert results["publication"] == e2e.PREBUILD_NOTE
    assert e2e.PREBUILD_NOTE in (tmp_path / "pre" / "e2e.md").read_text()
    (row,) = results["rows"]
    assert list(row["prebuild"]) == ["ort_cpu", "torch_eager", "torch_compile"] and built == ["ort_cpu"]
    assert row["prebuild"]["ort_cpu"]["setup_s"] >= 0 and "skipped" in row["prebuild"]["torch_compile"]  # no GPU
    assert "us_per_step" not in json.dumps(row) and row["engines"].get("ort_cpu") is None
    with pytest.raises(SystemExit, match="--prebuild run"):
        e2e.main(["--merge", str(tmp_path / "pre" / "e2e.json"), "--out", str(tmp_path / "merged")])
    with pytest.raises(SystemExit, match="--prebuild: unknown engine"):
        e2e.main([*argv, "--prebuild", "torch_compiled"])


def test_measure_rounds_rotates_the_order_and_drops_a_failing_engine(e2e):
    """Each round times every engine's block of calls in turn, starting one engine later than the
    round before; every engine gets the same frame indices; one that raises is left out after."""
    order: list[str] = []
    frames: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def engine(name):
        def call(i):
            if not order or order[-1] != name:
                order.append(name)
            frames[name].append(i)

        return call

    def broken(i):
        if i >= 2:  # the warm-up passes, the second round fails
            raise RuntimeError("lost the device")

    timed = e2e.measure_rounds(
        {"a": engine("a"), "b": engine("b"), "c": engine("c"), "x": broken}, iters=6, warmup=1, rounds=3
    )
    assert order == ["a", "b", "c"] + ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # warm-up, 3 rounds
    assert all(f == [0, 0, 1, 2, 3, 4, 5] for f in frames.values())  # warm-up 0, then rounds 0-1, 2-3, 4-5
    assert all(timed[n]["rounds"] == 3 and timed[n]["iters"] == 6 for n in "abc")
    assert isinstance(timed["x"], RuntimeError)
    assert e2e.measure_rounds({}, iters=4, warmup=1, rounds=2) == {}


def test_merge_takes_later_rows_and_says_where_the_runs_differ(e2e, smoke, tmp_path):
    """--merge: a row of a later file replaces the earlier one's; runs timed in a fixed order (before
    the rotation) and rotated ones merged give a settings line that claims no order, and a note;
    runs of different GPUs are refused."""
    out, results = smoke
    assert results["config"]["round_order"] == e2e.ROUND_ORDER
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps(results))
    older = json.loads(json.dumps(results))
    del older["config"]["round_order"]  # a run from before the rotation
    (row,) = [r for r in older["precision_rows"] if r["precision"] == "bf16"]
    row["p50_us"] = 123.0
    second.write_text(json.dumps(older))

    same = e2e.merge([str(first), str(first)], tmp_path / "same")
    assert same["config"]["round_order"] == e2e.ROUND_ORDER
    assert "in an order rotated each round" in (tmp_path / "same" / "e2e.md").read_text()

    merged = e2e.merge([str(first), str(second)], tmp_path / "merged")
    (bf16,) = [r for r in merged["precision_rows"] if r["precision"] == "bf16"]
    assert bf16["p50_us"] == 123.0 and len(merged["precision_rows"]) == len(results["precision_rows"])
    assert merged["config"]["round_order"] is None
    assert any("round_order" in note for note in merged["notes"])
    assert "rotated" not in (tmp_path / "merged" / "e2e.md").read_text()

    other = json.loads(json.dumps(results))
    other["environment"]["gpu"] = "another GPU"
    second.write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="different GPUs"):
        e2e.merge([str(first), str(second)], tmp_path / "refused")


def test_a_frame_gap_runs_before_every_timed_call_and_the_report_says_so(e2e, smoke, tmp_path):
    """--frame-gap BYTES: a framegap.CacheSweep before every timed call of every engine (not the
    warm-up), off the clock; the config records the bytes, the settings line says them, children
    get the flag, a bad value is refused in one line, and a merge with back-to-back runs warns."""
    order: list[str] = []

    def engine(name):
        return lambda i: order.append(name)

    timed = e2e.measure_rounds(
        {"a": engine("a"), "b": engine("b")}, iters=4, warmup=1, rounds=2, between=lambda: order.append("gap")
    )
    assert order == ["a", "b"] + ["gap", "a"] * 2 + ["gap", "b"] * 2 + ["gap", "b"] * 2 + ["gap", "a"] * 2
    assert timed["a"]["iters"] == timed["b"]["iters"] == 4
    order.clear()
    e2e.measure(engine("a"), iters=3, warmup=2, between=lambda: order.append("gap"))
    assert order == ["a", "a"] + ["gap", "a"] * 3

    argv = ["--device", "cpu", "--quick", "--archs", "min_gru", "--embed", "16", "--seq", "3", "--forms", "step"]
    argv += ["--iters", "2", "--warmup", "1", "--profile-calls", "0", "--work", str(tmp_path / "work")]
    assert e2e.main([*argv, "--frame-gap", "1M", "--frame-hz", "500", "--out", str(tmp_path / "gap")]) == 0
    results = json.loads((tmp_path / "gap" / "e2e.json").read_text())
    assert results["config"]["frame_gap_bytes"] == 1 << 20 and results["config"]["frame_hz"] == 500.0
    report = (tmp_path / "gap" / "e2e.md").read_text()
    assert "1 MiB written before every timed call" in report and "calls paced at 500 Hz" in report
    out, back_to_back = smoke
    assert back_to_back["config"]["frame_gap_bytes"] == 0
    assert "written before every timed call" not in (out / "e2e.md").read_text()
    with pytest.raises(SystemExit, match="--frame-gap='lots'"):
        e2e.main([*argv, "--frame-gap", "lots", "--out", str(tmp_path / "bad")])
    with pytest.raises(SystemExit, match="--frame-hz -1"):
        e2e.main([*argv, "--frame-hz", "-1", "--out", str(tmp_path / "bad")])

    import argparse

    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    child = e2e.child_argv(
        parser.parse_args(["--frame-gap", "32M", "--frame-hz", "60"]), "zoo", "min_gru", tmp_path, tmp_path
    )
    assert child[child.index("--frame-gap") + 1] == "32M" and float(child[child.index("--frame-hz") + 1]) == 60

    older = json.loads(json.dumps(results))
    del older["config"]["frame_gap_bytes"], older["config"]["frame_hz"]  # a run from before: back to back
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps(results))
    second.write_text(json.dumps(older))
    merged = e2e.merge([str(first), str(second)], tmp_path / "merged")
    assert any("frame_gap_bytes, frame_hz" in note for note in merged["notes"])
    assert merged["config"]["frame_gap_bytes"] is None and merged["config"]["frame_hz"] is None  # claims neither
    report = (tmp_path / "merged" / "e2e.md").read_text()
    assert "written before every timed call" not in report and "paced" not in report
