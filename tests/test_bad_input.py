"""Bad input from the outside (issue 15): each case gets one line naming the problem and a
non-zero exit, no traceback, nothing half-written. Table-driven over the CLI and the Python API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from framefuse.cli import main
from framefuse.runtime.pipeline import prepare_cached
from framefuse.runtime.session import Session, SessionError

SMALL = {"model": {"embed": 32, "layers": 1}, "seq": 4, "seed": 0}


@pytest.fixture(scope="module")
def step_folder() -> Path:
    return prepare_cached("min_gru", SMALL)["step"].directory


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, step_folder) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    noise = root / "noise.onnx"
    noise.write_bytes(np.random.default_rng(0).bytes(300))
    truncated = root / "truncated.onnx"
    truncated.write_bytes((step_folder / "model.onnx").read_bytes()[:2000])
    return {"noise": noise, "truncated": truncated, "missing_dir": root / "no" / "such" / "folder"}


# (name, argv with {step}, {noise}, {truncated}, {missing_dir} filled in, exit status, fragment of the message)
CLI_CASES = [
    ("run on random bytes", ["run", "{noise}", "--device", "cpu", "--frames", "2"], 2, "not a readable ONNX model"),
    ("run on a truncated file", ["run", "{truncated}", "--device", "cpu", "--frames", "2"], 2, "not a readable ONNX"),
    ("run --hz -1", ["run", "{step}", "--device", "cpu", "--hz", "-1"], 2, "argument --hz: expected a number >= 0"),
    ("run --budget-ms 0", ["run", "{step}", "--device", "cpu", "--budget-ms", "0"], 2, "argument --budget-ms"),
    ("run --budget-ms -1", ["run", "{step}", "--device", "cpu", "--budget-ms", "-1"], 2, "argument --budget-ms"),
    ("run --frames 0", ["run", "{step}", "--device", "cpu", "--frames", "0"], 2, "a positive integer"),
    ("run --budget-ms nan", ["run", "{step}", "--device", "cpu", "--budget-ms", "nan"], 2, "argument --budget-ms"),
    (
        "run --json into a missing folder",
        ["run", "{step}", "--device", "cpu", "--frames", "2", "--json", "{missing_dir}/loop.json"],
        2,
        "does not exist",
    ),
    ("build --accuracy-frames -5", ["build", "{step}", "--accuracy-frames", "-5"], 2, "argument --accuracy-frames"),
    ("build --accuracy-tolerance 0", ["build", "{step}", "--accuracy-tolerance", "0"], 2, "--accuracy-tolerance"),
    ("check --tolerance -1", ["check", "{step}", "--tolerance", "-1"], 2, "argument --tolerance"),
    ("check a broken file", ["check", "{noise}", "--against", "{step}/model.onnx"], 2, "not a readable ONNX model"),
]


@pytest.mark.parametrize("name,argv,status,fragment", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_is_one_line_and_a_non_zero_exit(name, argv, status, fragment, step_folder, bad_files, capsys):
    paths = {"step": step_folder, **bad_files}
    argv = [a.format(**paths) for a in argv]
    assert main(argv) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert fragment in errors[0], err
    assert not bad_files["missing_dir"].exists()  # nothing created on the way out


def test_cli_stops_quietly_when_its_reader_goes_away(step_folder):
    """`framefuse ... | head`: the reader closes the pipe; the tool stops without a traceback,
    with the status of a process ended by SIGPIPE."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "framefuse", "run", str(step_folder), "--device", "cpu", "--frames", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # before the child has imported anything, so its first write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.fixture(scope="module")
def session(step_folder):
    return Session.load(step_folder, engine="onnxruntime", device="cpu")


# (name, frame maker over the expected shape, None when accepted else a fragment of the error)
FRAME_CASES = [
    ("float32", lambda shape: np.full(shape, 0.1, dtype=np.float32), None),
    ("float16 widens exactly", lambda shape: np.full(shape, 0.5, dtype=np.float16), None),
    ("float64 holding float32 values", lambda shape: np.full(shape, 0.25, dtype=np.float64), None),
    ("small integers", lambda shape: np.ones(shape, dtype=np.int64), None),
    ("booleans", lambda shape: np.ones(shape, dtype=bool), None),
    ("float64 1e300", lambda shape: np.full(shape, 1e300), "does not convert exactly to float32"),
    ("float64 0.1", lambda shape: np.full(shape, 0.1), "does not convert exactly to float32"),
    ("int64 2**25 + 1", lambda shape: np.full(shape, 2**25 + 1, dtype=np.int64), "does not convert exactly"),
    ("complex", lambda shape: np.ones(shape, dtype=np.complex64), "dtype complex64"),
    ("strings", lambda shape: np.full(shape, "a"), "dtype <U1"),
    ("objects", lambda shape: np.full(shape, None, dtype=object), "dtype object"),
]


@pytest.mark.parametrize("name,make,fragment", FRAME_CASES, ids=[c[0] for c in FRAME_CASES])
def test_frame_dtype_rule(name, make, fragment, session):
    """Frames of another dtype than float32 are converted only when every value converts exactly
    (docs: README, Session.step); otherwise SessionError names the dtype and the value."""
    shape = session._frame_specs[session.frame_inputs[0]].shape
    frame = make(shape)
    if fragment is None:
        expected = session.step(frame.astype(np.float32), copy=True)
        session.reset()
        got = session.step(frame, copy=True)
        session.reset()
        np.testing.assert_array_equal(got, expected)
    else:
        with pytest.raises(SessionError, match=None) as info:
            session.step(frame)
        assert fragment in str(info.value)
        assert "\n" not in str(info.value)


@pytest.fixture()
def empty_model(tmp_path) -> Path:
    import onnx
    from onnx import helper

    path = tmp_path / "empty" / "model.onnx"
    path.parent.mkdir()
    onnx.save(
        helper.make_model(helper.make_graph([], "empty", [], []), opset_imports=[helper.make_opsetid("", 17)]), path
    )
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "{p}", "--device", "cpu"],
        ["build", "{p}", "--device", "cpu", "--engine", "cuda-graph"],
        ["run", "{p}", "--device", "cpu"],
    ],
)
def test_a_graph_with_no_outputs_is_refused(argv, empty_model, capsys):
    assert main([a.format(p=empty_model) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "the graph has no outputs" in err and "Traceback" not in err
    assert sorted(p.name for p in empty_model.parent.iterdir()) == ["model.onnx"]  # nothing written


def test_export_refuses_a_forward_without_a_batch_axis(tmp_path, capsys):
    source = tmp_path / "scalar_net.py"
    source.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.l = torch.nn.Linear(8, 4)\n"
        "    def forward(self, x):\n"
        "        return self.l(x).sum()\n"
        "def make_model():\n"
        "    return M()\n"
    )
    out = tmp_path / "out"
    assert main(["export", "--model", f"{source}:make_model", "--input-shape", "1,4,8", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "returned y of shape []" in err and "Traceback" not in err
    assert not out.exists()


def test_rewrite_takes_the_artifact_folder_and_writes_readable_files(tmp_path):
    import shutil

    folder = tmp_path / "art"
    shutil.copytree(prepare_cached("min_gru", SMALL)["step"].directory, folder)
    (folder / "model.fused.onnx").unlink(missing_ok=True)
    assert main(["rewrite", str(folder), "-q"]) == 0
    fused = folder / "model.fused.onnx"
    assert fused.is_file()
    umask = os.umask(0)
    os.umask(umask)
    assert fused.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open() would, like export's files


def test_calibration_from_a_npy_when_the_graph_has_one_frame_input(tmp_path, step_folder):
    import onnx

    from framefuse.precision.calibration import CalibrationError, load_calibration

    model = onnx.load(str(step_folder / "model.onnx"))
    (name,) = [i.name for i in model.graph.input if not i.name.startswith("state.")]
    shape = [d.dim_value for d in next(i for i in model.graph.input if i.name == name).type.tensor_type.shape.dim]
    frames = np.random.default_rng(0).standard_normal((5, *shape)).astype(np.float32)
    np.save(tmp_path / "calib.npy", frames)
    loaded = load_calibration(tmp_path / "calib.npy", model)
    assert list(loaded) == [name] and np.array_equal(loaded[name], frames)
    two = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Add", ["a", "b"], ["y"])],
            "two",
            [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 4]) for n in ("a", "b")],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
        )
    )
    np.save(tmp_path / "two.npy", np.zeros((3, 1, 4), np.float32))
    with pytest.raises(CalibrationError, match=r"a \.npy holds one unnamed array"):
        load_calibration(tmp_path / "two.npy", two)


def test_ctrl_c_while_a_library_imports_is_an_interruption(monkeypatch, capsys):
    """onnxruntime turns a Ctrl-C during its import into an ImportError: still exit 130, one line."""
    import framefuse.runtime.cli as run_cli

    def interrupted(_args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ImportError("onnxruntime failed to import") from exc

    monkeypatch.setattr(run_cli, "run", interrupted)
    assert main(["run", "somewhere"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "framefuse: interrupted"


def test_ctrl_c_during_run_reports_the_frames_so_far(monkeypatch, step_folder, capsys):
    """Ctrl-C in the game loop: the latency report of the frames stepped so far, then exit 130."""
    original = Session.step
    calls = {"n": 0}

    def step(self, frame, **kw):
        calls["n"] += 1
        if calls["n"] == 10 + 7:  # 10 warm-up frames, then 6 timed ones, then ^C
            raise KeyboardInterrupt
        return original(self, frame, **kw)

    monkeypatch.setattr(Session, "step", step)
    assert main(["run", str(step_folder), "--device", "cpu", "--hz", "0", "--frames", "50"]) == 130
    captured = capsys.readouterr()
    assert "6 frames" in captured.out and "step latency" in captured.out
    assert "interrupted after 6 of 50 frames" in captured.err and "Traceback" not in captured.err


RUNNERS = {
    "ort_session": (
        "from framefuse.plugins.ort_bridge import ort_session\n"
        "session = ort_session(str(fused))\n"
        "feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)"
        " for i in session.get_inputs()}\n"
        "run = lambda: session.run(None, feeds)\n"
    ),
    "Session.step on the onnxruntime engine": (
        "from framefuse.runtime.session import Session\n"
        "session = Session.load(fused, engine='onnxruntime', device='cpu', fused=True)\n"
        "shape = session._frame_specs[session.frame_inputs[0]].shape\n"
        "run = lambda: session.step(np.zeros(shape, np.float32))\n"
    ),
}


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_ctrl_c_inside_a_framefuse_op_in_onnx_runtime_does_not_abort(runner, tmp_path):
    """A SIGINT while a framefuse op's Python reference runs inside ONNX Runtime used to abort the
    process (pybind11::error_already_set, exit 134): it is now held until the run returns, then
    raised as KeyboardInterrupt. In a subprocess, so a regression cannot take pytest down."""
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import signal, sys\n"
        "import numpy as np\n"
        "from framefuse.plugins.registry import get_op\n"
        "from framefuse.runtime.pipeline import prepare_cached\n"
        f"fused = prepare_cached('min_gru', {SMALL!r})['step'].fused\n"
        + RUNNERS[runner]
        + "module = get_op('LinearScan')\n"
        "reference = module.reference\n"
        "def interrupted(*args, **kwargs):\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "    return reference(*args, **kwargs)\n"
        "module.reference = interrupted\n"
        "try:\n"
        "    run()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after the run')\n"
        "    sys.exit(0)\n"
        "print('not interrupted')\n"
        "sys.exit(1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "interrupted after the run" in proc.stdout


@pytest.mark.parametrize("which", ["noise", "truncated"])
@pytest.mark.parametrize("engine", [None, "onnxruntime", "cuda-graph"])
def test_session_load_of_a_broken_onnx_file_is_a_framefuse_error(which, engine, bad_files):
    from framefuse.errors import FrameFuseError

    with pytest.raises(FrameFuseError, match="not a readable ONNX model") as info:
        Session.load(bad_files[which], engine=engine, device="cpu")
    assert "\n" not in str(info.value)
