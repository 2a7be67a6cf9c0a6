"""The TensorRT backend's builder for real, with TensorRT for RTX (a CPU-only build works): every zoo
architecture's unfused graph becomes a plan with metadata; corrupted, foreign and stale plans are
refused; every zoo architecture's fused graph (both forms) becomes a plan with framefuse plugin
layers, built in a child process that has the parser's library on LD_LIBRARY_PATH (tensorrt_rtx's
parser aborts a process where it cannot load ``libtensorrt_rtx.so`` by that name: pinned in
subprocesses, so a fixed tensorrt_rtx shows up here)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from framefuse.engines import artifact as _artifact
from framefuse.engines.base import EngineBuildError, EngineRunError
from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached

trt = pytest.importorskip("tensorrt_rtx")
fft = pytest.importorskip("framefuse.engines.tensorrt")

SMALL = {"model": {"embed": 64, "layers": 1}, "seq": 8, "seed": 0}
pytestmark = pytest.mark.skipif(
    fft._find_trt() is None or fft._find_trt()[1] != "tensorrt_rtx",
    reason="these facts are about tensorrt_rtx (full tensorrt is imported first here)",
)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_unfused_zoo_graph_builds_a_plan_with_metadata(arch, tmp_path):
    prepared = prepare_cached(arch, SMALL)["sequence"]
    lines = []
    runner = fft.build(prepared.onnx, out=tmp_path, log=lines.append)
    plan, meta_file = tmp_path / "engine.plan", tmp_path / "engine.plan.json"
    assert plan.is_file() and meta_file.is_file()
    meta = json.loads(meta_file.read_text())
    assert meta["flavour"] == "tensorrt_rtx" and meta["tensorrt_version"] == trt.__version__
    assert meta["plan_bytes"] == plan.stat().st_size == len(runner.plan) > 0
    assert meta["source"]["sha256"] == _artifact.sha256_file(prepared.onnx)
    assert meta["precision"] == "fp32" and meta["strongly_typed"] is True and meta["plugins"] == {}
    assert meta["compute_capability"] == "none (built without GPU)" or "." in meta["compute_capability"]
    assert [d["name"] for d in meta["inputs"]] == runner.input_names
    assert any("plan built" in line for line in lines)
    # no temporary files left behind by the atomic writes
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def lstm_plan(tmp_path_factory):
    prepared = prepare_cached("lstm", SMALL)
    folder = tmp_path_factory.mktemp("lstm-plan")
    source = folder / "model.onnx"
    source.write_bytes(prepared["sequence"].onnx.read_bytes())
    fft.build(source, out=folder)
    return folder, source


def test_load_checks_then_defers_the_gpu(lstm_plan):
    folder, _ = lstm_plan
    runner = fft.load(folder)
    assert runner.summary()["flavour"] == "tensorrt_rtx"
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(EngineRunError, match="NVIDIA GPU and there is none here"):
            runner.engine()


def test_corrupted_plan_is_refused(lstm_plan, tmp_path):
    folder, _ = lstm_plan
    for name in ("engine.plan", "engine.plan.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    data = bytearray((tmp_path / "engine.plan").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "engine.plan").write_bytes(bytes(data))
    with pytest.raises(_artifact.ArtifactError, match="corrupted or replaced"):
        fft.load(tmp_path, check_source=False)


def test_foreign_plans_are_refused(lstm_plan, tmp_path):
    folder, _ = lstm_plan
    (tmp_path / "engine.plan").write_bytes((folder / "engine.plan").read_bytes())
    with pytest.raises(_artifact.ForeignArtifactError, match="not built by framefuse"):
        fft.load(tmp_path)  # a plan without framefuse metadata
    meta = json.loads((folder / "engine.plan.json").read_text())
    for key, value, message in (
        ("tensorrt_version", "10.0.0", "built with tensorrt_rtx 10.0.0"),
        ("flavour", "tensorrt", "built with tensorrt "),
        ("format_version", 99, "artifact format 99"),
    ):
        (tmp_path / "engine.plan.json").write_text(json.dumps({**meta, key: value}))
        with pytest.raises(_artifact.ForeignArtifactError, match=message):
            fft.load(tmp_path, check_source=False)


def test_stale_plan_is_refused(tmp_path):
    prepared = prepare_cached("min_gru", SMALL)["sequence"]
    source = tmp_path / "model.onnx"
    source.write_bytes(prepared.onnx.read_bytes())
    fft.build(source, out=tmp_path / "out")
    with open(source, "ab") as f:
        f.write(b"\0")  # any change of the source's bytes
    with pytest.raises(_artifact.StaleArtifactError, match="stale"):
        fft.load(tmp_path / "out")
    assert fft.load(tmp_path / "out", check_source=False).input_names


def test_timing_cache_is_skipped_with_rtx(tmp_path):
    # tensorrt_rtx 1.7 warns "Timing cache operations are no-ops in TensorRT-RTX": none is written
    prepared = prepare_cached("gru", SMALL)["step"]
    lines = []
    runner = fft.build(prepared.onnx, out=tmp_path, log=lines.append)
    assert not (tmp_path / "timing.cache").exists() and runner.facts["timing_cache"] is None
    assert any("no-op in TensorRT for RTX" in line for line in lines), lines


# SelectiveScan's step form passes h0 without D, z and dt_bias: a plugin layer takes no empty input,
# so the layer gets its present inputs and a mask (a plan that builds shows the plugin read the mask:
# without it h0 would be taken for D and the shape rule would fail)
HOLES = {("mamba", "step"), ("jamba", "step")}


@pytest.mark.parametrize("form", ["step", "sequence"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_graph_builds_a_plan_with_framefuse_plugin_layers(arch, form, tmp_path):
    prepared = prepare_cached(arch, SMALL)[form]
    assert prepared.fused is not None
    ops = fft.framefuse_ops(_onnx_load(prepared.fused))
    assert ops, f"{arch} {form}: the fused graph has no framefuse node"
    lines = []
    runner = fft.build(prepared.fused, out=tmp_path, log=lines.append)
    meta = json.loads((tmp_path / "engine.plan.json").read_text())
    assert (tmp_path / "engine.plan").stat().st_size == meta["plan_bytes"] > 0
    assert sorted(meta["plugins"]) == sorted(ops) and runner.facts["plugins"] == meta["plugins"]
    packed = [line for line in lines if "present inputs and a mask" in line]
    if (arch, form) in HOLES:
        assert packed and "(SelectiveScan): optional input(s) D, z, dt_bias absent before h0" in packed[0], lines
    else:
        assert not packed, packed
    if not fft._parser_library_loadable():  # as in CI: the build ran in a child process
        assert "child process" in runner.facts["built_in"]
        assert any("building in a child process" in line for line in lines), lines


def test_fused_plan_for_the_players_gpus(tmp_path):
    """Compute capabilities 8.6, 8.9 and 12.0 (RTX 30, 40 and 50 series) in one plan."""
    prepared = prepare_cached("lstm", SMALL)["step"]
    runner = fft.build(prepared.fused, out=tmp_path, options={"compute_capabilities": ["SM86", "SM89", "SM120"]})
    assert runner.facts["plugins"] == {"LSTMSeq": "framefuse::LSTMSeq v1"}
    assert runner.facts["plan_bytes"] > 0


def test_fused_graph_without_a_parser_library_is_refused_with_the_reason(monkeypatch, tmp_path):
    prepared = prepare_cached("lstm", SMALL)["sequence"]

    def missing(trt=None):
        raise EngineBuildError("no libtensorrt_rtx.so.1 in /nowhere")

    monkeypatch.setattr(fft, "_parser_library_loadable", lambda: False)
    monkeypatch.setattr(fft, "rtx_parser_library_dir", missing)
    with pytest.raises(EngineBuildError, match=r"cannot build framefuse plugin nodes \(LSTMSeq\).*no libtensorrt_rtx"):
        fft.build(prepared.fused, out=tmp_path)
    assert not (tmp_path / "engine.plan").exists()


def test_a_build_process_that_dies_is_an_error_naming_the_signal(monkeypatch, tmp_path):
    prepared = prepare_cached("lstm", SMALL)["sequence"]
    monkeypatch.setattr(fft, "_parser_library_loadable", lambda: False)
    monkeypatch.setattr(fft, "_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    with pytest.raises(EngineBuildError, match="the TensorRT build process ended by SIGTERM"):
        fft.build(prepared.fused, out=tmp_path)
    assert not (tmp_path / "engine.plan").exists()


def _onnx_load(path):
    import onnx

    return onnx.load(str(path))


def test_bad_options_and_missing_library_messages(monkeypatch, tmp_path):
    prepared = prepare_cached("gru", SMALL)["step"]
    with pytest.raises(EngineBuildError, match="unknown tensorrt option"):
        fft.build(prepared.onnx, options={"workspce": 1})
    monkeypatch.setattr(fft, "_TRT", None)
    monkeypatch.setattr(fft, "_TRT_ERRORS", ["tensorrt: No module named 'tensorrt'"])
    reason = fft.unavailable_reason()
    assert "\n" not in reason and "pip install tensorrt" in reason and "pip install tensorrt-rtx" in reason
    with pytest.raises(EngineBuildError, match="pip install tensorrt"):
        fft.build(prepared.onnx, out=tmp_path)


# The parser facts, each in its own interpreter (one of them aborts it).
_PARSE = textwrap.dedent(
    """
    import sys, tensorrt_rtx as trt
    from onnx import helper, TensorProto
    from framefuse.plugins import tensorrt_plugins as tp
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
    node = helper.make_node("LinearScan", ["a", "b"], ["h", "h_last"], domain="framefuse")
    g = helper.make_graph([node], "g", [vi("a", [1, 4, 8]), vi("b", [1, 4, 8])], [vi("h", [1, 4, 8]), vi("h_last", [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)])
    if sys.argv[1] == "register":
        tp.register_creators(trt)
    logger = trt.Logger(trt.Logger.ERROR)
    net = trt.Builder(logger).create_network(0)
    parser = trt.OnnxParser(net, logger)
    print("parsed", parser.parse(m.SerializeToString()), flush=True)
    print("error", parser.get_error(0) if parser.num_errors else None, flush=True)
    """
)


def _parse_in_subprocess(mode: str, env: dict | None = None) -> subprocess.CompletedProcess:
    def no_core_dump():  # the abort must not leave a core file in CI's working tree
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return subprocess.run(
        [sys.executable, "-c", _PARSE, mode],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=no_core_dump,
        env=env,
    )


def _without_parser_library() -> dict:
    import os

    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ""
    return env


def test_rtx_parser_without_creators_names_the_missing_plugin():
    done = _parse_in_subprocess("plain")
    assert done.returncode == 0, done.stderr
    assert "parsed False" in done.stdout
    assert "Plugin not found, are the plugin name, version, and namespace correct?" in done.stdout


def test_rtx_parser_aborts_on_a_plugin_node_when_it_cannot_load_its_library_by_name():
    """If this fails, tensorrt_rtx may have fixed its parser: build_plan's child process is then unneeded."""
    done = _parse_in_subprocess("register", _without_parser_library())
    assert done.returncode == -6, (done.returncode, done.stdout, done.stderr)  # SIGABRT
    assert "terminate called without an active exception" in done.stderr
    assert "parsed" not in done.stdout


def test_rtx_parser_imports_a_plugin_node_with_the_link_on_ld_library_path():
    """The fact build_plan rests on: libtensorrt_rtx.so -> the wheel's .so.1, on LD_LIBRARY_PATH at start."""
    import os

    env = _without_parser_library()
    env["LD_LIBRARY_PATH"] = str(fft.rtx_parser_library_dir())
    done = _parse_in_subprocess("register", env)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "parsed True" in done.stdout, done.stdout
    assert os.path.realpath(os.path.join(env["LD_LIBRARY_PATH"], "libtensorrt_rtx.so")).endswith("libtensorrt_rtx.so.1")


def test_registry_finds_the_backend_and_modelproto_sources_are_kept(tmp_path):
    from framefuse.engines import registry

    assert registry.get_backend("tensorrt") is fft and registry.unavailable_reason("tensorrt") is None
    import onnx

    model = onnx.load(str(prepare_cached("min_gru", SMALL)["step"].onnx))
    runner = fft.build(model, out=tmp_path / "engine.plan", precision="fp32")
    assert registry.backend_for_artifact(tmp_path).name == "tensorrt"
    # the graph is written beside the plan, so staleness can be checked for a ModelProto too
    assert (tmp_path / "engine.plan.onnx").is_file()
    loaded = fft.load(tmp_path)
    assert loaded.input_specs == runner.input_specs and loaded.output_specs == runner.output_specs


def test_runner_uses_only_api_the_installed_library_has():
    # deserializing needs a GPU (here: "cudaError 35: CUDA driver version is insufficient"), so
    # the runtime path cannot run; at least every call it makes must exist in this TensorRT
    for cls, names in (
        (trt.Runtime, ["deserialize_cuda_engine"]),
        (
            trt.ICudaEngine,
            ["create_execution_context", "num_io_tensors", "get_tensor_name", "get_tensor_shape", "get_tensor_dtype"],
        ),
        (trt.IExecutionContext, ["set_input_shape", "set_tensor_address", "execute_async_v3"]),
        (
            trt.IBuilderConfig,
            [
                "set_memory_pool_limit",
                "create_timing_cache",
                "set_timing_cache",
                "builder_optimization_level",
                "num_compute_capabilities",
                "set_compute_capability",
            ],
        ),
    ):
        missing = [n for n in names if not hasattr(cls, n)]
        assert not missing, (cls.__name__, missing)


def test_packed_plugin_inputs_drop_the_holes_and_record_the_mask():
    from framefuse.plugins.tensorrt_plugins import PRESENT_FIELD

    prepared = prepare_cached("mamba", SMALL)["step"]
    model = _onnx_load(prepared.fused)
    before = model.SerializeToString()
    packed = fft.packed_plugin_inputs(model)
    assert model.SerializeToString() == before  # the caller's graph is untouched
    (node,) = [n for n in packed.graph.node if n.op_type == "SelectiveScan"]
    (original,) = [n for n in model.graph.node if n.op_type == "SelectiveScan"]
    assert list(node.input) == [name for name in original.input if name] and len(node.input) == 6
    (mask,) = [a.i for a in node.attribute if a.name == PRESENT_FIELD]
    assert mask == sum(1 << i for i, name in enumerate(original.input) if name) == 0b100011111
    # a graph without holes comes back as it is
    gru = _onnx_load(prepare_cached("gru", SMALL)["step"].fused)
    assert fft.packed_plugin_inputs(gru) is gru
