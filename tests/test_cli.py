"""The framefuse command line: subcommand table, errors as one line, bad input for export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from framefuse import cli
from framefuse.cli import main

REPO = Path(__file__).resolve().parent.parent

USER_MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TinyNet(nn.Module):
        def __init__(self, in_features=8, out_features=4):
            super().__init__()
            self.inp = nn.Linear(in_features, 16)
            self.out = nn.Linear(16, out_features)

        def forward(self, x):
            return self.out(torch.tanh(self.inp(x)))


    class TinyStep(TinyNet):
        def state_names(self):
            return ["h"]

        def init_state(self, batch):
            return (torch.zeros(batch, 16),)

        def step(self, x_t, state):
            (h,) = state
            h = 0.5 * h + torch.tanh(self.inp(x_t))
            return self.out(h), (h,)

        def forward(self, x):
            h = torch.zeros(x.shape[0], 16)
            ys = []
            for t in range(x.shape[1]):
                y, (h,) = self.step(x[:, t], (h,))
                ys.append(y)
            return torch.stack(ys, 1)


    def make(config):
        return TinyNet(config["in_features"], config["out_features"])


    def make_fixed():
        return TinyNet(8, 4)


    def make_step(config):
        return TinyStep(config["in_features"], config["out_features"])


    def make_number():
        return 42


    def make_lgamma():
        class Lgamma(nn.Module):
            def forward(self, x):
                return torch.lgamma(x.abs() + 1.0)

        return Lgamma()


    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "user_models.py"
    path.write_text(USER_MODELS)
    return path


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def assert_one_error(capsys, rc: int, *needles: str, code: int = 2) -> str:
    captured = capsys.readouterr()
    lines = error_lines(captured.err)
    assert rc == code, captured.err
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("framefuse: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------------------------
# help and the subcommand table
# --------------------------------------------------------------------------------------------


def test_help_lists_every_command_with_examples(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command, _module in cli.COMMANDS:
        assert command in out
    assert "examples:" in out and "framefuse export --arch min_gru" in out


def test_export_help_explains_the_options(capsys):
    assert main(["export", "--help"]) == 0
    out = capsys.readouterr().out
    for option in (
        "--arch",
        "--model",
        "--input-shape",
        "--form",
        "--config",
        "--out-dir",
        "--name",
        "--opset",
        "--seed",
        "--embed",
        "--layers",
        "--seq",
        "--batch",
    ):
        assert option in out, option
    assert "min_gru" in out and "mamba" in out  # the architectures are listed
    assert "examples:" in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert "framefuse 0." in capsys.readouterr().out


def test_commands_table_names_the_pipeline():
    assert [c for c, _ in cli.COMMANDS] == ["export", "rewrite", "check", "build", "run", "bench"]
    assert dict(cli.COMMANDS)["export"] == "framefuse.exporter.cli"


def test_missing_stage_module_becomes_a_placeholder(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", [("ghost", "framefuse.no_such_stage.cli"), ("half", "framefuse.config")])
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "ghost" in out and "not available yet" in out
    assert_one_error(capsys, main(["ghost", "--whatever", "x"]), "'framefuse ghost' is not available yet")
    # a module that exists but has no register(subparsers) is reported, not silently dropped
    assert_one_error(capsys, main(["half"]), "defines no register(subparsers)")


def test_stage_modules_register_themselves(monkeypatch, capsys):
    stage = types.ModuleType("framefuse_fake_stage")
    calls = []

    def register(subparsers):
        parser = subparsers.add_parser("fake", help="a fake stage")
        parser.add_argument("--value", type=int, required=True)

        def run(args):
            calls.append((args.value, args.quiet))
            return 0

        parser.set_defaults(func=run)

    stage.register = register
    monkeypatch.setitem(sys.modules, "framefuse_fake_stage", stage)
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(cli, "COMMANDS", [("fake", "framefuse_fake_stage")])
    assert main(["fake", "--value", "3"]) == 0
    assert main(["-q", "fake", "--value", "4"]) == 0
    assert main(["fake", "--value", "5", "--quiet"]) == 0
    assert calls == [(3, False), (4, True), (5, True)]


def test_framefuse_error_is_one_line_and_keyboard_interrupt_is_130(monkeypatch, capsys):
    from framefuse.errors import FrameFuseError, ParityError

    def failing(kind):
        def register(subparsers):
            def run(_args):
                if kind == "error":
                    raise FrameFuseError("first line\nsecond line")
                if kind == "parity":
                    raise ParityError("mismatch")
                raise KeyboardInterrupt

            subparsers.add_parser(kind).set_defaults(func=run)

        module = types.ModuleType(f"stage_{kind}")
        module.register = register
        return module

    for kind in ("error", "parity", "interrupt"):
        monkeypatch.setitem(sys.modules, f"stage_{kind}", failing(kind))
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(cli, "COMMANDS", [(k, f"stage_{k}") for k in ("error", "parity", "interrupt")])

    line = assert_one_error(capsys, main(["error"]), "first line second line")
    assert line == "framefuse: error: first line second line"
    assert_one_error(capsys, main(["parity"]), "mismatch", code=3)
    assert main(["interrupt"]) == 130
    assert "interrupted" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# export: success
# --------------------------------------------------------------------------------------------


def test_export_zoo_model_both_forms(tmp_path, capsys):
    out = tmp_path / "art"
    rc = main(["export", "--arch", "min_gru", "--embed", "32", "--seq", "4", "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == ["min_gru", "min_gru-step"]
    manifest = json.loads((out / "min_gru-step" / "manifest.json").read_text())
    assert manifest["config"]["model"]["embed"] == 32 and manifest["config"]["seq"] == 4
    # the summary table names both artifacts and where they are
    assert "min_gru-step" in captured.out and "sequence" in captured.out and "step" in captured.out
    assert str(out / "min_gru" / "model.onnx") in captured.out


def test_export_user_model_with_options(model_file, tmp_path, capsys):
    out = tmp_path / "art"
    rc = main(
        [
            "export",
            "--model",
            f"{model_file}:make",
            "--input-shape",
            "2,5,8",
            "--out-features",
            "3",
            "--name",
            "mine",
            "--opset",
            "18",
            "--seed",
            "4",
            "-o",
            str(out),
            "--quiet",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    # --quiet prints only the artifact path; no step form: the sequence form alone
    assert captured.out.strip().splitlines() == [str(out / "mine" / "model.onnx")]
    manifest = json.loads((out / "mine" / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == [2, 5, 8] and manifest["outputs"][0]["shape"] == [2, 5, 3]
    assert manifest["opset"] == 18 and manifest["config"]["seed"] == 4 and manifest["arch"] == "TinyNet"


def test_export_user_model_default_form_notes_the_missing_step(model_file, tmp_path, capsys):
    rc = main(["export", "--model", f"{model_file}:make_fixed", "--input-shape", "1,4,8", "-o", str(tmp_path / "a")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "has no step form" in captured.err
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["TinyNet"]


def test_export_user_step_model(model_file, tmp_path, capsys):
    rc = main(
        [
            "export",
            "--model",
            f"{model_file}:make_step",
            "--form",
            "step",
            "--in-features",
            "8",
            "-o",
            str(tmp_path / "a"),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "a" / "TinyStep-step" / "manifest.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == ["x", "state.h"]
    assert [o["name"] for o in manifest["outputs"]] == ["y", "next_state.h"]


# --------------------------------------------------------------------------------------------
# export: bad input → one line, non-zero exit, nothing written
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, extra, needles",
    [
        ("{file}:nope", [], ["has no 'nope'", "make_step"]),
        ("{file}:make_number", [], ["returned int, not a torch.nn.Module"]),
        ("{file}:NOT_CALLABLE", [], ["not a factory"]),
        ("{file}", [], ["FILE.py:FACTORY"]),
        ("{dir}/missing.py:make", [], ["model file not found", "missing.py"]),
        ("{file}:make", ["--in-features", "8", "--input-shape", "1,4,8"], ["--input-shape", "--in-features"]),
        ("{file}:make_fixed", ["--input-shape", "1,4,9"], ["[1, 4, 9]"]),
        ("{file}:make_lgamma", [], ["aten::lgamma"]),
        ("{file}:make", ["--form", "step"], ["TinyNet", "step form"]),
    ],
    ids=[
        "missing-factory",
        "not-a-module",
        "not-callable",
        "no-factory",
        "missing-file",
        "shape-clash",
        "wrong-shape",
        "unsupported-op",
        "no-step",
    ],
)
def test_export_bad_user_model(model_file, tmp_path, capsys, spec, extra, needles):
    out = tmp_path / "art"
    spec = spec.format(file=model_file, dir=tmp_path)
    rc = main(["export", "--model", spec, *extra, "-o", str(out)])
    assert_one_error(capsys, rc, *needles)
    assert not out.exists()


def test_export_syntax_error_and_import_error_files(tmp_path, capsys):
    bad_syntax = tmp_path / "bad_syntax.py"
    bad_syntax.write_text("def make(:\n    pass\n")
    bad_import = tmp_path / "bad_import.py"
    bad_import.write_text("import framefuse_no_such_module_xyz\n\ndef make():\n    pass\n")
    out = tmp_path / "art"
    assert_one_error(
        capsys,
        main(["export", "--model", f"{bad_syntax}:make", "-o", str(out)]),
        "syntax error at line 1",
        "bad_syntax.py",
    )
    assert_one_error(
        capsys,
        main(["export", "--model", f"{bad_import}:make", "-o", str(out)]),
        "ModuleNotFoundError",
        "framefuse_no_such_module_xyz",
        "bad_import.py",
    )
    assert not out.exists()


def test_export_unknown_arch(tmp_path, capsys):
    rc = main(["export", "--arch", "mambaa", "-o", str(tmp_path / "art")])
    assert_one_error(capsys, rc, "unknown architecture 'mambaa'", "did you mean 'mamba'", "min_gru")
    assert not (tmp_path / "art").exists()


def test_export_unwritable_output_folder(tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    rc = main(["export", "--arch", "min_gru", "--embed", "16", "-o", str(blocker / "art")])
    assert_one_error(capsys, rc, "cannot write artifacts", "is a file")


def test_export_bad_config_file_names_file_and_key(tmp_path, capsys):
    config = tmp_path / "my.yaml"
    config.write_text("arch: gru\nmodel:\n  hidden: 64\n")
    rc = main(["export", "--arch", "gru", "--config", str(config), "-o", str(tmp_path / "art")])
    assert_one_error(capsys, rc, str(config), "'model.hidden'")


def test_export_usage_errors_are_argparse_errors(capsys):
    assert main(["export"]) == 2  # neither --arch nor --model
    assert "one of the arguments --arch --model is required" in capsys.readouterr().err
    assert main(["export", "--arch", "gru", "--input-shape", "1,2"]) == 2
    assert "B,T,F" in capsys.readouterr().err
    assert main(["export", "--arch", "gru", "--embed", "0"]) == 2
    assert "positive integer" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# as a real process
# --------------------------------------------------------------------------------------------


def _run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "framefuse", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_python_dash_m_framefuse_export_and_errors(model_file, tmp_path):
    ok = _run_module(
        "export", "--model", f"{model_file}:make_fixed", "--input-shape", "1,4,8", "-o", "art", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "art" / "TinyNet" / "model.onnx").is_file()
    assert "TinyNet" in ok.stdout
    assert "Traceback" not in ok.stderr and "Warning" not in ok.stderr

    bad = _run_module("export", "--model", f"{model_file}:make_lgamma", "-o", "bad", cwd=tmp_path)
    assert bad.returncode == 2
    lines = error_lines(bad.stderr)
    assert len(lines) == 1 and lines[0].startswith("framefuse: error: ") and "aten::lgamma" in lines[0], bad.stderr
    assert bad.stdout == ""  # no TorchScript graph dump
    assert not (tmp_path / "bad").exists()


# --------------------------------------------------------------------------------------------
# build --engine / run / check (the engine family)
# --------------------------------------------------------------------------------------------


def _step_folder(tmp_path: Path, arch: str = "min_lstm") -> Path:
    from framefuse.runtime.pipeline import prepare_cached

    prepared = prepare_cached(arch, {"model": {"embed": 32, "layers": 2}, "seq": 6, "seed": 0})["step"]
    folder = tmp_path / f"{arch}-step"
    folder.mkdir()
    for name in ("model.onnx", "model.fused.onnx", "manifest.json"):
        source = prepared.directory / name
        (folder / name).write_bytes(source.read_bytes())
    return folder


def test_build_run_check_with_the_onnxruntime_engine(tmp_path, capsys):
    folder = _step_folder(tmp_path)
    assert main(["build", str(folder), "--engine", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {folder / 'engine.ort'}" in out and "onnxruntime engine of" in out and "model.onnx" in out
    assert "providers" in out and "CPUExecutionProvider" in out  # the runner's summary
    metadata = json.loads((folder / "engine.ort").read_text())
    assert metadata["source"]["relative_path"] == "model.onnx"  # the original graph, not the fused one
    report = tmp_path / "loop.json"
    argv = ["run", str(folder), "--engine", "onnxruntime", "--frames", "20", "--hz", "0", "--check-finite"]
    assert main([*argv, "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["engine"] == "onnxruntime" and data["latency"]["count"] == 20 and data["output_finite"]
    assert "(onnxruntime engine)" in capsys.readouterr().out
    # check: the fused graph and the engine, each against ONNX Runtime on the original graph
    assert main(["check", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "model.fused.onnx: parity PASS" in out and "engine.ort (onnxruntime): parity PASS" in out
    assert (folder / "parity-report.onnxruntime.json").is_file() and (folder / "parity-report.json").is_file()
    assert main(["check", str(folder / "engine.ort")]) == 0
    assert main(["check", str(folder), "--engine", "cuda-graph"]) == 2
    assert "no engine.ffe" in capsys.readouterr().err


def test_build_cuda_graph_on_the_cpu_and_check_it(tmp_path, capsys):
    folder = _step_folder(tmp_path, "gated_ssm")
    assert main(["build", str(folder), "--engine", "cuda-graph", "--device", "cpu"]) == 0
    assert (folder / "engine.ffe").is_file() and "cuda-graph engine of" in capsys.readouterr().out
    assert main(["check", str(folder / "engine.ffe"), "--device", "cpu"]) == 0
    assert "engine.ffe (cuda-graph): parity PASS" in capsys.readouterr().out


def test_build_json_prints_the_metadata_the_artifact_holds(tmp_path, capsys):
    """`framefuse build --json` prints what the backend wrote beside the artifact, whichever backend
    (each save() leaves it on the runner; the command names no engine)."""
    from framefuse.engines.cuda_graph import read_artifact

    folder = _step_folder(tmp_path)
    assert main(["build", str(folder), "--engine", "onnxruntime", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((folder / "engine.ort").read_text())
    assert main(["build", str(folder), "--engine", "cuda-graph", "--device", "cpu", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written, _graph = read_artifact(folder / "engine.ffe")
    assert printed == json.loads(json.dumps(written, default=str)) and printed["source"]["relative_path"]


def test_build_dumps_the_step_kernel_source_without_a_gpu(tmp_path, capsys):
    """`framefuse build --dump-source DIR` on a machine without a GPU writes the generated source
    the build would compile (for --grid blocks), named by its hash, and says which NVRTC options
    the build compiles it with."""
    from framefuse.compiler.engine import FAST_MATH_OPTIONS

    folder = _step_folder(tmp_path, "gru")
    dump = tmp_path / "dump"
    argv = ["build", str(folder), "--engine", "cuda-graph", "--device", "cpu", "--dump-source", str(dump)]
    assert main([*argv, "--grid", "8"]) == 0
    (source,) = dump.glob("stepkernel-*.cu")
    text = source.read_text()
    assert 'extern "C" __global__' in text and "ffk_step(" in text
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert f"wrote {source} for 8 blocks" in said and " ".join(FAST_MATH_OPTIONS) in said


def _the_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("framefuse: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_build_errors_are_one_line(tmp_path, capsys):
    import importlib.util

    folder = _step_folder(tmp_path)
    (folder / "model.onnx").unlink()
    # ONNX Runtime builds the original graph: without it, say so (the fused one only with --fused).
    assert main(["build", str(folder), "--engine", "onnxruntime"]) == 2
    assert "no model.onnx" in _the_error(capsys.readouterr().err)
    assert main(["build", str(folder / "model.fused.onnx"), "--engine", "onnxruntime"]) == 2
    assert "framefuse nodes" in _the_error(capsys.readouterr().err)
    assert main(["build", str(folder), "--engine", "onnxruntime", "--fused", "-q"]) == 0
    assert main(["build", str(folder), "--engine", "onnxruntime", "--framefuse-impl", "reference"]) == 2
    assert "option of the cuda-graph engine" in _the_error(capsys.readouterr().err)
    assert main(["build", str(folder), "--engine", "tvm"]) == 2  # argparse: not a choice
    if importlib.util.find_spec("tensorrt") is None and importlib.util.find_spec("tensorrt_rtx") is None:
        assert main(["build", str(folder), "--engine", "tensorrt"]) == 2
        assert "tensorrt" in _the_error(capsys.readouterr().err)
    elif importlib.util.find_spec("tensorrt") is None:
        # TensorRT for RTX builds the folder's fused graph (its plugin layers in a child process)
        assert main(["build", str(folder), "--engine", "tensorrt", "--out", str(tmp_path / "trt"), "-q"]) == 0
        assert (tmp_path / "trt" / "engine.plan").is_file()
        capsys.readouterr()
    if importlib.util.find_spec("framefuse.precision") is None:
        assert main(["build", str(folder), "--engine", "cuda-graph", "--device", "cpu", "--precision", "fp16"]) == 2
        assert "not available yet" in _the_error(capsys.readouterr().err)


def test_make_help_lists_every_target():
    import re
    import shutil

    if shutil.which("make") is None:
        pytest.skip("no make")
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-zA-Z][a-zA-Z_-]*):", makefile, flags=re.M))
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    listed = {line.split()[0] for line in out.splitlines()[1:] if line.strip()}
    assert targets == listed, f"targets without a `## ` line: {sorted(targets - listed)}"
    phony = set(re.search(r"^\.PHONY:(.*)$", makefile, flags=re.M).group(1).split())
    assert phony == targets


def test_build_precision_calls_convert_model_first(tmp_path, monkeypatch, capsys):
    """The wiring of --precision: convert_model(model, precision, calib=, config=) runs before the
    backend's build, its graph is saved beside as model.<precision>.onnx and recorded as the
    artifact's source, with the precision in the metadata. (A stand-in convert_model here: the
    real one belongs to framefuse.precision.)"""
    import onnx

    folder = _step_folder(tmp_path)
    calls = []

    def convert_model(model, precision, *, calib=None, config=None, int8_mode=None):
        calls.append((precision, calib, config, int8_mode))
        converted = onnx.ModelProto.FromString(model.SerializeToString())
        converted.metadata_props.add(key="converted", value=precision)
        return converted

    fake = types.ModuleType("framefuse.precision")
    fake.convert_model = convert_model
    fake.unsupported_reason = lambda engine, precision: None
    fake.int8_mode_of = lambda mode, config, calib=None: mode or ("qdq" if calib else "weights")
    monkeypatch.setitem(sys.modules, "framefuse.precision", fake)
    calib = tmp_path / "frames.npz"
    calib.write_bytes(b"")
    argv = ["build", str(folder), "--engine", "onnxruntime", "--precision", "int8", "--calib", str(calib)]
    assert main([*argv, "--accuracy-frames", "0"]) == 0  # the stand-in has no accuracy report
    assert len(calls) == 1 and calls[0][:2] == ("int8", str(calib)) and calls[0][2]["seed"] == 0
    assert calls[0][3] == "qdq"  # a calibration file asks for calibrated activations
    converted = folder / "model.int8.onnx"
    assert {p.key: p.value for p in onnx.load(str(converted)).metadata_props}["converted"] == "int8"
    metadata = json.loads((folder / "engine.ort").read_text())
    assert metadata["precision"] == "int8" and metadata["source"]["relative_path"] == "model.int8.onnx"
    assert main(["build", str(folder), "--engine", "onnxruntime", "--calib", str(calib)]) == 2
    assert "--calib is for --precision int8" in _the_error(capsys.readouterr().err)
