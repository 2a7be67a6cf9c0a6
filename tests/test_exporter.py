"""framefuse.exporter: torch → ONNX in sequence and step form, checked, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from framefuse.config import load_config, model_config
from framefuse.errors import FrameFuseError, ParityError
from framefuse.exporter import (
    ExportError,
    NoStepFormError,
    OutputDirError,
    ShapeError,
    UnsupportedOperatorError,
    export_forms,
    export_model,
)
from framefuse.exporter import export as export_module
from framefuse.models.base import FrameModel


class TinyRecurrent(FrameModel):
    """A small gated linear recurrence with a sequence and a step form (written for these tests)."""

    arch = "tiny_recurrent"

    def __init__(self, config: dict):
        super().__init__(config)
        hidden = int(config.get("embed", 16))
        self.hidden = hidden
        self.gate = nn.Linear(self.in_features, hidden)
        self.value = nn.Linear(self.in_features, hidden)
        self.head = nn.Linear(hidden, self.out_features)

    def state_names(self):
        return ["h"]

    def init_state(self, batch, device=None, dtype=torch.float32):
        return (torch.zeros(batch, self.hidden, device=device, dtype=dtype),)

    def _update(self, x_t, h):
        a = torch.sigmoid(self.gate(x_t))
        return a * h + (1 - a) * torch.tanh(self.value(x_t))

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden)
        ys = []
        for t in range(x.shape[1]):
            h = self._update(x[:, t], h)
            ys.append(self.head(h))
        return torch.stack(ys, dim=1)

    def step(self, x_t, state):
        (h,) = state
        h = self._update(x_t, h)
        return self.head(h), (h,)


class SequenceOnly(nn.Module):
    def __init__(self, in_features=8, out_features=4):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.proj(x)


class Lgamma(nn.Module):
    def forward(self, x):
        return torch.lgamma(x.abs() + 1.0)


class Noisy(nn.Module):
    """Adds fresh random noise: the exported RandomUniformLike cannot reproduce torch's draw."""

    def forward(self, x):
        return x + torch.rand_like(x)


SMALL = {"arch": None, "model": {"embed": 16, "layers": 1}, "batch": 1, "seq": 6, "in_features": 8, "out_features": 4}


def tiny(seed: int = 0) -> TinyRecurrent:
    torch.manual_seed(seed)
    return TinyRecurrent({"in_features": 8, "out_features": 4, "embed": 16}).eval()


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def run_onnx(path: Path, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# --------------------------------------------------------------------------------------------
# sequence and step form
# --------------------------------------------------------------------------------------------


def test_sequence_form_artifact(tmp_path):
    model = tiny()
    result = export_model(model, form="sequence", config=SMALL, out_dir=tmp_path)

    assert result.name == "tiny_recurrent" and result.form == "sequence"
    assert result.directory == tmp_path / "tiny_recurrent"
    assert listing(tmp_path) == ["tiny_recurrent", "tiny_recurrent/manifest.json", "tiny_recurrent/model.onnx"]

    proto = onnx.load(str(result.model_path))
    assert [i.name for i in proto.graph.input] == ["x"]
    assert [o.name for o in proto.graph.output] == ["y"]
    dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 6, 8]  # static shapes from the config
    assert proto.ir_version <= 10
    assert {op.domain: op.version for op in proto.opset_import}[""] == 17
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["framefuse.arch"] == "tiny_recurrent"
    assert meta["framefuse.form"] == "sequence"
    assert json.loads(meta["framefuse.input_shape"]) == [1, 6, 8]
    assert json.loads(meta["framefuse.state_names"]) == []
    assert json.loads(meta["framefuse.config"])["seq"] == 6
    assert meta["framefuse.version"]

    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["sha256"] == hashlib.sha256(result.model_path.read_bytes()).hexdigest()
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 6, 8], "dtype": "float32"}]
    assert manifest["outputs"] == [{"name": "y", "shape": [1, 6, 4], "dtype": "float32"}]
    assert manifest["opset"] == 17 and manifest["form"] == "sequence" and manifest["arch"] == "tiny_recurrent"
    assert manifest["parity"]["passed"] is True
    assert manifest["parity"]["outputs"]["y"]["max_abs"] <= 1e-4
    assert set(manifest["versions"]) >= {"torch", "onnx", "onnxruntime", "framefuse"}
    assert manifest["config"]["model"]["embed"] == 16
    assert manifest["created"]

    # the written file itself, on an input the exporter never saw, matches torch
    x = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(123))
    (y,) = run_onnx(result.model_path, {"x": x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), atol=1e-5, rtol=1e-4)


def test_step_form_artifact(tmp_path):
    model = tiny()
    result = export_model(model, form="step", config=SMALL, out_dir=tmp_path)
    assert result.name == "tiny_recurrent-step"

    proto = onnx.load(str(result.model_path))
    assert [i.name for i in proto.graph.input] == ["x", "state.h"]
    assert [o.name for o in proto.graph.output] == ["y", "next_state.h"]
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["framefuse.form"] == "step"
    assert json.loads(meta["framefuse.state_names"]) == ["h"]
    assert json.loads(meta["framefuse.input_shape"]) == [1, 8]
    manifest = json.loads(result.manifest_path.read_text())
    assert [i["name"] for i in manifest["inputs"]] == ["x", "state.h"]
    assert manifest["inputs"][1]["shape"] == [1, 16]
    assert set(manifest["parity"]["outputs"]) == {"y", "next_state.h"}

    # running the step graph frame by frame reproduces the torch sequence form
    gen = torch.Generator().manual_seed(7)
    xs = torch.randn(1, 6, 8, generator=gen)
    state = np.zeros((1, 16), dtype=np.float32)
    session = ort.InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    ys = []
    for t in range(6):
        y, state = session.run(["y", "next_state.h"], {"x": xs[:, t].numpy(), "state.h": state})
        ys.append(y)
    with torch.no_grad():
        np.testing.assert_allclose(np.stack(ys, axis=1), model(xs).numpy(), atol=1e-5, rtol=1e-4)


def test_export_is_deterministic(tmp_path):
    a = export_model(tiny(), form="sequence", config=SMALL, out_dir=tmp_path / "a")
    b = export_model(tiny(), form="sequence", config=SMALL, out_dir=tmp_path / "b")
    assert a.sha256 == b.sha256
    assert a.model_path.read_bytes() == b.model_path.read_bytes()


def test_opset_name_and_input_shape_options(tmp_path):
    cfg = {**SMALL, "opset": 18}
    result = export_model(tiny(), form="sequence", config=cfg, out_dir=tmp_path, name="mine", input_shape=(2, 3, 8))
    assert result.directory == tmp_path / "mine"
    proto = onnx.load(str(result.model_path))
    assert {op.domain: op.version for op in proto.opset_import}[""] == 18
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 8]
    assert result.manifest["config"]["batch"] == 2 and result.manifest["config"]["seq"] == 3


def test_both_forms_of_a_zoo_model_by_name(tmp_path):
    results = export_forms("min_gru", forms=None, config={"model": {"embed": 32}, "seq": 4}, out_dir=tmp_path)
    assert [(r.name, r.form) for r in results] == [("min_gru", "sequence"), ("min_gru-step", "step")]
    assert results[1].manifest["state_names"] == ["l0_h", "l1_h"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["min_gru", "min_gru-step"]


def test_auto_forms_of_a_model_without_step_is_sequence_only(tmp_path):
    results = export_forms(SequenceOnly(), forms=None, config=SMALL, out_dir=tmp_path)
    assert [r.form for r in results] == ["sequence"]
    assert results[0].arch == "SequenceOnly"


def test_reexport_replaces_the_artifact_without_leftovers(tmp_path):
    first = export_model(tiny(0), form="sequence", config=SMALL, out_dir=tmp_path)
    second = export_model(tiny(1), form="sequence", config=SMALL, out_dir=tmp_path)
    assert first.sha256 != second.sha256
    assert json.loads(second.manifest_path.read_text())["sha256"] == second.sha256
    assert listing(tmp_path) == ["tiny_recurrent", "tiny_recurrent/manifest.json", "tiny_recurrent/model.onnx"]


# --------------------------------------------------------------------------------------------
# failures leave nothing behind
# --------------------------------------------------------------------------------------------


def test_step_form_of_a_model_without_step(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(NoStepFormError, match="SequenceOnly"):
        export_model(SequenceOnly(), form="step", config=SMALL, out_dir=out)
    assert not out.exists()


def test_both_forms_write_nothing_when_the_step_form_fails(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(NoStepFormError):
        export_forms(SequenceOnly(), forms=["sequence", "step"], config=SMALL, out_dir=out)
    assert not out.exists()


def test_wrong_input_shape_names_the_shape(tmp_path):
    with pytest.raises(ShapeError) as err:
        export_model(
            SequenceOnly(in_features=8), form="sequence", config={**SMALL, "in_features": 5}, out_dir=tmp_path / "o"
        )
    assert "[1, 6, 5]" in str(err.value)
    assert not (tmp_path / "o").exists()


def test_unsupported_operator_is_named_and_nothing_is_printed(tmp_path, capfd):
    with pytest.raises(UnsupportedOperatorError) as err:
        export_model(Lgamma(), form="sequence", config=SMALL, out_dir=tmp_path / "o")
    assert "aten::lgamma" in str(err.value) and "opset 17" in str(err.value)
    captured = capfd.readouterr()
    # torch's exporter would dump its whole TorchScript graph here; framefuse keeps it quiet
    assert "Torch IR graph" not in captured.out + captured.err
    assert not (tmp_path / "o").exists()


def test_parity_failure_names_the_output_and_the_difference(tmp_path):
    with pytest.raises(ParityError) as err:
        export_model(Noisy(), form="sequence", config=SMALL, out_dir=tmp_path / "o")
    message = str(err.value)
    assert "output 'y'" in message and "max abs" in message and "max rel" in message
    assert err.value.exit_code == 3
    assert not (tmp_path / "o").exists()


def test_output_folder_that_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OutputDirError, match="is a file"):
        export_model(tiny(), form="sequence", config=SMALL, out_dir=blocker / "sub")
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write to a read-only folder")
def test_read_only_output_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OutputDirError, match="not writable"):
            export_model(tiny(), form="sequence", config=SMALL, out_dir=folder / "art")
    finally:
        folder.chmod(0o700)


def test_failure_while_renaming_restores_everything(tmp_path, monkeypatch):
    out = tmp_path / "art"
    old = export_model(tiny(0), form="sequence", config=SMALL, out_dir=out)
    old_bytes = old.model_path.read_bytes()

    real_rename = os.rename
    calls = []

    def failing_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 3:  # backup old seq, move new seq into place, then fail on the step form
            raise OSError(28, "No space left on device")
        return real_rename(src, dst)

    monkeypatch.setattr(export_module.os, "rename", failing_rename)
    with pytest.raises(OutputDirError, match="No space left on device"):
        export_forms(tiny(1), forms=["sequence", "step"], config=SMALL, out_dir=out)
    monkeypatch.setattr(export_module.os, "rename", real_rename)

    # the old artifact is back, byte for byte, and no temp or backup folder is left
    assert listing(out) == ["tiny_recurrent", "tiny_recurrent/manifest.json", "tiny_recurrent/model.onnx"]
    assert (out / "tiny_recurrent" / "model.onnx").read_bytes() == old_bytes


def test_failed_write_removes_the_folders_it_created(tmp_path, monkeypatch):
    def no_space(self, data):
        raise OSError(28, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", no_space)
    with pytest.raises(OutputDirError):
        export_model(tiny(), form="sequence", config=SMALL, out_dir=tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()


def test_bad_arguments():
    with pytest.raises(ExportError, match="unknown form 'stepp'"):
        export_model(tiny(), form="stepp", config=SMALL, out_dir="unused")
    with pytest.raises(ExportError, match="plain folder name"):
        export_model(tiny(), form="sequence", config=SMALL, out_dir="unused", name="../escape")
    with pytest.raises(FrameFuseError, match="unknown architecture 'mambo'"):
        export_model("mambo", form="sequence", out_dir="unused")
    with pytest.raises(ShapeError, match="B,T,F"):
        export_model(tiny(), form="sequence", config=SMALL, out_dir="unused", input_shape=(1, 6))


def test_step_model_with_inconsistent_state_names(tmp_path):
    class Broken(TinyRecurrent):
        def state_names(self):
            return ["h", "c"]

    torch.manual_seed(0)
    with pytest.raises(ExportError, match=r"2 names \['h', 'c'\] but init_state\(\) gives 1"):
        export_model(Broken({"in_features": 8, "out_features": 4}), form="step", config=SMALL, out_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------------------------
# the whole zoo at the default config
# --------------------------------------------------------------------------------------------

try:
    from framefuse.models import ARCHITECTURES as ZOO
except ImportError:  # the zoo is not importable: the test below reports that instead of passing
    ZOO = ["<zoo not importable>"]


@pytest.mark.parametrize("arch", ZOO)
def test_zoo_architecture_exports_in_both_forms_at_the_default_config(arch, tmp_path):
    from framefuse.exporter.loading import build_zoo_model

    started = time.perf_counter()
    # The default config with the seeded init: training is timed and tested on its own below.
    results = export_forms(arch, forms=["sequence", "step"], config={"weights": "random"}, out_dir=tmp_path)
    cfg = load_config(arch=arch)
    assert cfg["model"]["embed"] == 256 and cfg["model"]["layers"] == 2 and cfg["seq"] == 32
    for result in results:
        assert result.parity["passed"] and result.parity["tolerance"] == 1e-4
        for name, report in result.parity["outputs"].items():
            assert report["max_abs"] <= 1e-4, (arch, result.form, name, report)

    # independent check of the written sequence graph on a fresh input
    model = build_zoo_model(arch, model_config(cfg), cfg["seed"])
    x = torch.randn(1, 32, 64, generator=torch.Generator().manual_seed(99))
    (y,) = run_onnx(results[0].model_path, {"x": x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), atol=1e-4, rtol=1e-4)
    assert time.perf_counter() - started < 60


# --------------------------------------------------------------------------------------------
# exporters: torchscript, dynamo, auto
# --------------------------------------------------------------------------------------------


class Diff(nn.Module):
    """``aten::diff`` (as in transformers' mask code) has no TorchScript ONNX symbolic."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(torch.diff(x, dim=1, prepend=x[:, :1]))


def _mha() -> nn.Module:
    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    return SelfAttention().eval()


def _static_dims(values) -> list[str]:
    """Names of values with a missing or symbolic dim."""
    return [
        v.name
        for v in values
        if not v.type.tensor_type.HasField("shape")
        or any(not d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
    ]


def test_dynamo_exporter_writes_the_graph_the_pipeline_expects(tmp_path):
    result = export_model(tiny(), form="sequence", config=SMALL, out_dir=tmp_path, exporter="dynamo")
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["exporter"] == {"requested": "dynamo", "used": "dynamo", "failed": {}}
    model = onnx.load(str(result.model_path))
    assert model.ir_version <= export_module.MAX_IR_VERSION
    assert not model.functions
    opset = {o.domain: o.version for o in model.opset_import}
    assert opset[""] >= export_module.MIN_DYNAMO_OPSET and manifest["opset"] == opset[""]
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["y"]
    assert _static_dims([*model.graph.input, *model.graph.output]) == []
    onnx.checker.check_model(model, full_check=True)
    x = torch.randn(1, 6, 8)
    with torch.no_grad():
        expected = tiny()(x).numpy()
    np.testing.assert_allclose(run_onnx(result.model_path, {"x": x.numpy()})[0], expected, atol=1e-5, rtol=1e-5)


def test_auto_falls_back_to_dynamo_and_says_why(tmp_path):
    with pytest.raises(UnsupportedOperatorError, match="aten::diff"):
        export_model(Diff(), form="sequence", config=SMALL, out_dir=tmp_path / "ts", exporter="torchscript")
    assert not (tmp_path / "ts").exists()
    result = export_model(Diff(), form="sequence", config=SMALL, out_dir=tmp_path / "auto")
    info = json.loads(result.manifest_path.read_text())["exporter"]
    assert info["requested"] == "auto" and info["used"] == "dynamo"
    assert list(info["failed"]) == ["torchscript"] and "aten::diff" in info["failed"]["torchscript"]
    assert result.parity["passed"]


def test_auto_prefers_torchscript_when_it_works(tmp_path):
    result = export_model(tiny(), form="sequence", config=SMALL, out_dir=tmp_path)
    assert result.manifest["exporter"] == {"requested": "auto", "used": "torchscript", "failed": {}}


def test_every_exporter_failing_names_each_failure(tmp_path):
    with pytest.raises(ParityError) as err:
        export_model(Noisy(), form="sequence", config=SMALL, out_dir=tmp_path / "o")
    assert "torchscript exporter:" in str(err.value) and "dynamo exporter:" in str(err.value)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_multihead_attention_exports_with_its_fast_path_off_and_restored(exporter, tmp_path):
    mha = torch.backends.mha
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(True)
    try:
        result = export_model(_mha(), form="sequence", config=SMALL, out_dir=tmp_path, exporter=exporter)
        assert mha.get_fastpath_enabled() is True
        ops = {n.op_type for n in onnx.load(str(result.model_path)).graph.node}
        assert "Softmax" in ops and result.manifest["exporter"]["used"] == exporter
        # Restored after a failure too.
        with pytest.raises(ShapeError):
            export_model(
                _mha(), form="sequence", config={**SMALL, "in_features": 5}, out_dir=tmp_path / "bad", exporter=exporter
            )
        assert mha.get_fastpath_enabled() is True
    finally:
        mha.set_fastpath_enabled(before)


def test_unknown_exporter_is_refused():
    with pytest.raises(ExportError, match="unknown exporter 'onnxscript'.*torchscript, dynamo, auto"):
        export_model(tiny(), form="sequence", config=SMALL, out_dir="unused", exporter="onnxscript")


def test_cli_exporter_option_says_which_exporter_was_used(tmp_path, capsys):
    from framefuse.cli import main

    model_file = tmp_path / "net.py"
    model_file.write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.proj = nn.Linear(8, 4)\n\n"
        "    def forward(self, x):\n        return self.proj(torch.diff(x, dim=1, prepend=x[:, :1]))\n\n"
        "def make_model(config=None):\n    return Net()\n"
    )
    argv = ["export", "--model", f"{model_file}:make_model", "--input-shape", "1,6,8", "-o", str(tmp_path / "out")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "exported with the dynamo exporter (--exporter auto); the torchscript exporter failed:" in out
    assert "aten::diff" in out
    assert main([*argv, "--exporter", "torchscript"]) != 0
    assert main([*argv, "--exporter", "dynamo", "--name", "d"]) == 0
    assert json.loads((tmp_path / "out" / "d" / "manifest.json").read_text())["exporter"]["used"] == "dynamo"
