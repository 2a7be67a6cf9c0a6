"""bench/stepkernel.py's --sweep variants on the CPU: +lanes, +aheadN, +together, +helpers and +xregs become their
rows' compile arguments, the code settings untouched (a row that cannot run here, without a GPU,
is reported, not raised), and an unknown variant is refused in one line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def stepkernel_bench():
    sys.path.insert(0, str(BENCH))  # the script imports its neighbours (rnn_sizes, e2e) by name
    try:
        spec = importlib.util.spec_from_file_location("framefuse_bench_stepkernel", BENCH / "stepkernel.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_a_sweep_variant_sets_its_settings_for_its_rows_only(stepkernel_bench, tmp_path, monkeypatch):
    from framefuse.compiler import codegen
    from framefuse.compiler import engine as compiler_engine

    seen = []

    class Refused(RuntimeError):
        pass

    def compiled_step(program, **kwargs):  # what the row would build
        seen.append(kwargs)
        raise Refused("no GPU here")

    monkeypatch.setattr(compiler_engine, "CompiledStep", compiled_step)
    rows = stepkernel_bench.sweep("rnn:LSTM/64/3/1+lanes+ahead4+together+helpers", tmp_path, [4], [128, 256])
    assert [row["arch"] for row in rows] == ["rnn:LSTM/64/3/1+lanes+ahead4+together+helpers"] * 2
    assert all("Refused: no GPU here" in row["error"] for row in rows)
    settings = [
        (k["threads"], k["lane_cells"], k["inputs_ahead"], k["take_together"], k["input_helpers"]) for k in seen
    ]
    assert settings == [(128, True, 4, True, True), (256, True, 4, True, True)]
    plain = stepkernel_bench.sweep("rnn:LSTM/64/3/1", tmp_path, [4], [256])
    assert "Refused" in plain[0]["error"] and set(seen[-1]) == {"device", "grid", "threads"}  # the defaults
    assert (codegen.RECUR_LANE_CELLS, codegen.RECUR_INPUTS_AHEAD, codegen.RECUR_TAKE_TOGETHER) == (False, 1, True)
    assert codegen.RECUR_INPUT_HELPERS is True
    # the defaults that are on are turned off by name (the ring as it was, to time against them)
    stepkernel_bench.sweep("rnn:LSTM/64/3/1+no-together+no-helpers", tmp_path, [4], [256])
    assert (seen[-1]["take_together"], seen[-1]["input_helpers"]) == (False, False)
    # a warp's rows of one long product with x in registers (codegen.DOT_X_IN_REGISTERS, off)
    assert codegen.DOT_X_IN_REGISTERS is False
    stepkernel_bench.sweep("rnn:LSTM/64/3/1+xregs", tmp_path, [4], [256])
    assert seen[-1]["x_in_registers"] is True
    stepkernel_bench.sweep("rnn:LSTM/64/3/1+no-xregs", tmp_path, [4], [256])
    assert seen[-1]["x_in_registers"] is False


@pytest.mark.parametrize("variant", ["ahead0", "ahead", "wide"])
def test_an_unknown_sweep_variant_is_refused(stepkernel_bench, tmp_path, variant):
    known = r"variants are \+lanes .*, \+aheadN .*, \+together / \+no-together .*, \+helpers / \+no-helpers .* and \+xregs / \+no-xregs"
    with pytest.raises(SystemExit, match=known):
        stepkernel_bench.sweep(f"rnn:LSTM/64/3/1+{variant}", tmp_path, [4], [256])
