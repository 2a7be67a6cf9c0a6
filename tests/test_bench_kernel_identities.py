"""bench/kernel_identities.py: every tactic's kernel hashed, two runs compared (the byte-for-byte
check of a compiler refactor), on a small grid without a GPU."""

import json


def test_kernel_identities_cover_every_tactic_and_the_comparison_names_what_differs(
    bench_script, tmp_path, monkeypatch, capsys
):
    from framefuse.engines.fusion import stepkernel_tactics

    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path / "cache"))
    ki = bench_script("kernel_identities")
    out = tmp_path / "ids.json"
    assert ki.main(["--archs", "gru", "--embed", "32", "--grid", "8", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    tactics = len(stepkernel_tactics("fp32")) * 2 + len(stepkernel_tactics("fp16"))
    twins = 2 * len(ki.RESIDENT_TWINS)
    variants = 2 * len(ki.RECURRENCE_VARIANTS)
    assert len(found) == tactics + twins + variants
    plain = found["gru/step/fp32/stepkernel"]
    assert len(plain["identity"]) == 64 and plain["describe"]["grid"] == 8
    assert found["gru/step/fp32/stepkernel/resident"]["identity"] != plain["identity"]
    helpers = found["gru/window64/helpers/launched"]["describe"]
    assert (
        helpers["input_helpers"] is True and found["gru/window64/plain/launched"]["describe"]["input_helpers"] is False
    )
    # the same run twice is the same; a changed kernel and a missing one are named
    assert ki.main(["--compare", str(out), str(out)]) == 0
    changed = dict(found)
    changed["gru/step/fp32/stepkernel"] = dict(plain, identity="0" * 64)
    del changed["gru/window64/lanes/resident"]
    other = tmp_path / "changed.json"
    other.write_text(json.dumps(changed))
    capsys.readouterr()
    assert ki.main(["--compare", str(out), str(other)]) == 1
    printed = capsys.readouterr().out
    assert "only in the first: gru/window64/lanes/resident" in printed
    assert "gru/step/fp32/stepkernel: source or range table" in printed
    assert "2 difference(s)" in printed
