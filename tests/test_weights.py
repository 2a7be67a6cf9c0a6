"""The zoo's weights: trained on the synthetic game task (cached by config hash) or the seeded init,
a user's checkpoint loaded over any model, and the manifest and the accuracy gate saying which."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from framefuse.config import load_config, model_config
from framefuse.exporter import export_forms
from framefuse.exporter.errors import ModelLoadError
from framefuse.exporter.loading import build_zoo_model, describe_weights, zoo_model
from framefuse.models import training

TINY = {"model": {"embed": 16, "layers": 1}, "seq": 4, "seed": 0}


@pytest.fixture(autouse=True)
def weights_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEFUSE_WEIGHTS_CACHE", str(tmp_path / "weights-cache"))
    return tmp_path / "weights-cache"


def _run(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_the_task_is_deterministic_and_needs_memory():
    task = training.GameTask(in_features=12, out_features=32, seed=3)
    x, actions = task.episodes(4, 200, seed=1)
    again, same = task.episodes(4, 200, seed=1)
    assert x.shape == (4, 200, 12) and x.dtype == np.float32 and actions.shape == (4, 200)
    np.testing.assert_array_equal(x, again)
    np.testing.assert_array_equal(actions, same)
    assert not np.array_equal(task.episodes(4, 200, seed=2)[1], actions)
    assert actions.min() >= 0 and actions.max() < 32
    # The action is held from one bounce to the next: it changes on few frames, so it is a memory
    # of an event, not a function of the current frame alone.
    changes = (np.diff(actions, axis=1) != 0).mean()
    assert 0.05 < changes < 0.8
    assert len(np.unique(actions)) > 10


def test_training_lowers_the_loss_and_is_cached_by_config(weights_cache):
    cfg = load_config(arch="lstm", overrides={"embed": 16, "layers": 1})
    model = build_zoo_model("lstm", model_config(cfg), 0)
    state, summary = training.trained_state_dict("lstm", model, model_config(cfg), 0, training.task_for(cfg))
    assert summary["cached"] is False and summary["loss_last"] < summary["loss_first"] - 1.0
    files = list(weights_cache.glob("lstm-*.pt"))
    assert len(files) == 1
    fresh = build_zoo_model("lstm", model_config(cfg), 0)
    again, summary2 = training.trained_state_dict("lstm", fresh, model_config(cfg), 0, training.task_for(cfg))
    assert summary2["cached"] is True and summary2["loss_last"] == summary["loss_last"]
    for name, value in state.items():
        assert torch.equal(value, again[name]), name
    other = {**model_config(cfg), "embed": 8}
    assert training.cache_key("lstm", other, 0) != training.cache_key("lstm", model_config(cfg), 0)


def test_export_trains_by_default_and_says_so(tmp_path):
    (result,) = export_forms("min_gru", forms=["step"], config=TINY, out_dir=tmp_path)
    weights = result.manifest["weights"]
    assert weights["source"] == "trained" and weights["loss_last"] < weights["loss_first"]
    assert "trained on the synthetic game task" in describe_weights(weights)
    (plain,) = export_forms("min_gru", forms=["step"], config={**TINY, "weights": "random"}, out_dir=tmp_path / "r")
    assert plain.manifest["weights"] == {"source": "random", "seed": 0}
    trained_model = onnx.load(str(result.model_path))
    random_model = onnx.load(str(plain.model_path))
    differ = [
        a.name
        for a, b in zip(trained_model.graph.initializer, random_model.graph.initializer)
        if a.raw_data != b.raw_data
    ]
    assert differ  # the exported graph carries the trained weights
    # The torch model the references and peers build has the exported weights.
    model = zoo_model("min_gru", result.manifest["config"])
    x = torch.randn(1, result.manifest["inputs"][0]["shape"][1])
    state = model.init_state(1)
    with torch.no_grad():
        y, _ = model.step(x, state)
    feeds = {"x": x.numpy(), **{f"state.{n}": s.numpy() for n, s in zip(model.state_names(), state)}}
    np.testing.assert_allclose(_run(result.model_path, feeds)[0], y.numpy(), atol=1e-5, rtol=1e-5)


def test_a_manifest_from_before_the_weights_key_rebuilds_the_seeded_init(tmp_path, weights_cache):
    (result,) = export_forms("min_gru", forms=["step"], config={**TINY, "weights": "random"}, out_dir=tmp_path)
    old_config = {k: v for k, v in result.manifest["config"].items() if k not in ("weights", "checkpoint")}
    model = zoo_model("min_gru", old_config)
    init = build_zoo_model(
        "min_gru", model_config(load_config(arch="min_gru", overrides={"embed": 16, "layers": 1})), 0
    )
    for name, value in init.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert not weights_cache.exists() or not any(weights_cache.iterdir())  # nothing was trained


def test_a_checkpoint_is_loaded_over_the_model(tmp_path):
    cfg = load_config(arch="gru", overrides={"embed": 16, "layers": 1})
    donor = build_zoo_model("gru", model_config(cfg), 5)  # other seed: other weights
    path = tmp_path / "mine.pt"
    torch.save({"state_dict": donor.state_dict()}, path)
    (result,) = export_forms(
        "gru", forms=["sequence"], config={**TINY, "checkpoint": str(path)}, out_dir=tmp_path / "out"
    )
    weights = result.manifest["weights"]
    assert weights["source"] == "checkpoint" and weights["path"] == str(path) and len(weights["sha256"]) == 64
    x = torch.randn(1, 4, cfg["in_features"])
    with torch.no_grad():
        expected = donor.eval()(x).numpy()
    np.testing.assert_allclose(_run(result.model_path, {"x": x.numpy()})[0], expected, atol=1e-5, rtol=1e-5)


def test_bad_checkpoints_are_one_clear_line(tmp_path):
    cfg = {**TINY}
    model_cfg = load_config(arch="gru", overrides={"embed": 16, "layers": 1})
    good = build_zoo_model("gru", model_config(model_cfg), 0).state_dict()
    cases = {
        "missing": (tmp_path / "nope.pt", "checkpoint not found"),
        "not torch": (tmp_path / "text.pt", "not a readable torch checkpoint"),
        "wrong keys": (tmp_path / "keys.pt", "does not fit the model (missing:"),
        "wrong shape": (tmp_path / "shape.pt", "shape mismatch"),
        "not a dict": (tmp_path / "list.pt", "expected a state_dict"),
    }
    (tmp_path / "text.pt").write_text("hello")
    torch.save({"other." + k: v for k, v in good.items()}, tmp_path / "keys.pt")
    torch.save(
        {k: torch.zeros(v.shape[0] + 1, *v.shape[1:]) if v.ndim else v for k, v in good.items()}, tmp_path / "shape.pt"
    )
    torch.save([1, 2, 3], tmp_path / "list.pt")
    for label, (path, message) in cases.items():
        with pytest.raises(ModelLoadError) as info:
            export_forms("gru", forms=["sequence"], config={**cfg, "checkpoint": str(path)}, out_dir=tmp_path / label)
        text = str(info.value)
        assert message in text and str(path) in text and "\n" not in text, (label, text)
        assert not (tmp_path / label).exists() or not any((tmp_path / label).iterdir()), label


def test_the_command_line_takes_weights_and_checkpoint(tmp_path, capsys):
    from framefuse.cli import main

    base = ["export", "--arch", "min_gru", "--form", "step", "--embed", "16", "--layers", "1", "--seq", "4"]
    assert main([*base, "-o", str(tmp_path / "a"), "--weights", "random"]) == 0
    manifest = json.loads((tmp_path / "a" / "min_gru-step" / "manifest.json").read_text())
    assert manifest["weights"]["source"] == "random"
    assert "weights: seeded random init" in capsys.readouterr().out
    assert main([*base, "-o", str(tmp_path / "b"), "--checkpoint", str(tmp_path / "none.pt")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint not found" in err and len([x for x in err.splitlines() if x.startswith("framefuse")]) == 1


def test_the_gate_of_a_trained_model_runs_on_the_task_frames(tmp_path, capsys):
    from framefuse.cli import main

    (result,) = export_forms("gru", forms=["step"], config=TINY, out_dir=tmp_path)
    folder = result.directory
    argv = ["build", str(folder), "--engine", "onnxruntime", "--precision", "fp16", "--accuracy-frames", "100"]
    assert main([*argv, "-q", "--accuracy-tolerance", "1"]) == 0
    report = json.loads((folder / "accuracy.fp16.json").read_text())
    assert any("synthetic game task" in note for note in report["notes"])
    assert any(note.startswith("weights: trained") for note in report["notes"])
    assert report["margins"]["p50"] > 0 and report["drift"]
