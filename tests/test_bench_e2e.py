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
