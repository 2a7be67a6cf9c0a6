"""The cuda-graph engine's executor on the CPU: every zoo graph against ONNX Runtime, the op table's
ONNX semantics op by op, build-time errors, the engine artifact (stale / foreign refusal), and the
Polygraphy runner interface."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from framefuse.engines.artifact import ForeignArtifactError, StaleArtifactError
from framefuse.engines.base import EngineBuildError
from framefuse.engines.cuda_graph import CudaGraphEngine, build_engine, load_engine, read_artifact, save_engine
from framefuse.engines.ops import UnsupportedOpError
from framefuse.models import ARCHITECTURES
from framefuse.runtime.pipeline import prepare_cached

SMALL = {"model": {"embed": 32, "layers": 2}, "seq": 6, "seed": 0}
TOL = 1e-5
STEPS = 3  # step-form graphs are run this many frames, the state fed back


def _ort(model_or_path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _random_feeds(prepared, rng):
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in prepared.input_shapes().items()}


def _compare_with_ort(engine_source, prepared):
    """Run the engine (CPU) on ``engine_source`` and ORT on the original graph; for the step
    form, STEPS frames with each side's state fed back into itself."""
    rng = np.random.default_rng(1)
    engine = CudaGraphEngine(engine_source, device="cpu")
    session = _ort(prepared.onnx)
    names = [o.name for o in session.get_outputs()]
    feeds = _random_feeds(prepared, rng)
    for name in feeds:
        if name.startswith("state."):
            feeds[name] = np.zeros_like(feeds[name])
    ours_feeds = dict(feeds)
    for _ in range(STEPS if prepared.form == "step" else 1):
        expected = dict(zip(names, session.run(names, feeds)))
        actual = engine.run(ours_feeds)
        for name in names:
            np.testing.assert_allclose(
                actual[name], expected[name], rtol=TOL, atol=TOL, err_msg=f"{prepared.arch} {name}"
            )
        x = rng.standard_normal(feeds["x"].shape).astype(np.float32)
        feeds = {"x": x, **{f"state.{n}": expected[f"next_state.{n}"] for n in prepared.state_names}}
        ours_feeds = {"x": x, **{f"state.{n}": actual[f"next_state.{n}"] for n in prepared.state_names}}
    return engine


# ---------------------------------------------------------------------------------------------
# every zoo graph


@pytest.mark.parametrize("form", ["sequence", "step"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_executor_matches_onnxruntime_on_original_graph(arch, form):
    prepared = prepare_cached(arch, SMALL)[form]
    engine = _compare_with_ort(prepared.onnx, prepared)
    # Shapes are static: every shape computation was folded at build time.
    assert not any(
        step.op_type in ("Shape", "Size", "Constant", "ConstantOfShape") for step in engine.default_plan.steps
    )


@pytest.mark.parametrize("form", ["sequence", "step"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_executor_matches_onnxruntime_on_fused_graph(arch, form):
    """The rewritten graph, framefuse nodes through their references, vs ORT on the original."""
    prepared = prepare_cached(arch, SMALL)[form]
    assert prepared.fused is not None, f"rewrite failed: {prepared.fused_error}"
    engine = _compare_with_ort(prepared.fused, prepared)
    assert engine.framefuse_impl == "reference"


def test_every_zoo_op_type_is_in_the_table():
    """What the zoo's exports contain (both forms, every arch) is exactly what the table must cover."""
    from framefuse.engines.ops import OPS

    seen = set()
    for arch in ARCHITECTURES:
        for prepared in prepare_cached(arch, SMALL).values():
            seen |= {n.op_type for n in onnx.load(str(prepared.onnx)).graph.node if n.domain in ("", "ai.onnx")}
    assert seen, "no zoo graphs were exported"
    assert seen <= set(OPS), f"ops the zoo exports but the engine lacks: {sorted(seen - set(OPS))}"


# ---------------------------------------------------------------------------------------------
# single ops against ONNX Runtime (ONNX semantics: broadcasting, negative axes, opset-13+ inputs)


def _single_op_model(op, inputs, outputs, attrs=None, initializers=(), opset=17):
    """inputs: [(name, np.ndarray)] fed at run time; initializers: [(name, np.ndarray)] constants."""
    node = helper.make_node(
        op, [n for n, _ in inputs] + [n for n, _ in initializers], [n for n, _ in outputs], **(attrs or {})
    )
    elem = {
        np.dtype(np.float32): TensorProto.FLOAT,
        np.dtype(np.int64): TensorProto.INT64,
        np.dtype(bool): TensorProto.BOOL,
    }
    graph = helper.make_graph(
        [node],
        "single",
        [helper.make_tensor_value_info(n, elem[a.dtype], list(a.shape)) for n, a in inputs],
        [helper.make_tensor_value_info(n, dtype, None) for n, dtype in outputs],
        [onnx.numpy_helper.from_array(a, n) for n, a in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


F = TensorProto.FLOAT
I64 = TensorProto.INT64
rng0 = np.random.default_rng(0)
x234 = rng0.standard_normal((2, 3, 4)).astype(np.float32)
x1x4 = rng0.standard_normal((1, 4)).astype(np.float32)
i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731

OP_CASES = {
    "slice_negative_step": (
        "Slice",
        [("x", x234)],
        [("y", F)],
        {},
        [("s", i64(-1, 3)), ("e", i64(-100, 0)), ("a", i64(-1, 1)), ("st", i64(-2, -1))],
    ),
    "slice_clamped": ("Slice", [("x", x234)], [("y", F)], {}, [("s", i64(1)), ("e", i64(1000)), ("a", i64(2))]),
    "gather_negative_indices": (
        "Gather",
        [("x", x234)],
        [("y", F)],
        {"axis": -2},
        [("i", np.array([[-1, 0], [1, -3]], dtype=np.int64))],
    ),
    "gather_scalar_index": ("Gather", [("x", x234)], [("y", F)], {"axis": 1}, [("i", np.array(-1, dtype=np.int64))]),
    "scatter_nd_rows": (
        "ScatterND",
        [("x", x234)],
        [("y", F)],
        {},
        [("i", np.array([[0, 1], [1, -1]], dtype=np.int64)), ("u", rng0.standard_normal((2, 4)).astype(np.float32))],
    ),
    "scatter_nd_add_repeated": (
        "ScatterND",
        [("x", x234)],
        [("y", F)],
        {"reduction": "add"},
        [("i", np.array([[1], [1]], dtype=np.int64)), ("u", rng0.standard_normal((2, 3, 4)).astype(np.float32))],
    ),
    "expand_bidirectional": ("Expand", [("x", x1x4)], [("y", F)], {}, [("shape", i64(3, 1))]),
    "split_sizes": ("Split", [("x", x234)], [("a", F), ("b", F)], {"axis": -1}, [("split", i64(1, 3))]),
    "split_equal": ("Split", [("x", x234)], [("a", F), ("b", F)], {"axis": 2}, []),
    "squeeze_all_ones": ("Squeeze", [("x", x1x4)], [("y", F)], {}, []),
    "unsqueeze_negative": ("Unsqueeze", [("x", x234)], [("y", F)], {}, [("axes", i64(-1, 0))]),
    "reshape_zero_and_minus_one": ("Reshape", [("x", x234)], [("y", F)], {}, [("shape", i64(0, -1))]),
    "transpose_default": ("Transpose", [("x", x234)], [("y", F)], {}, []),
    "reduce_sum_axes_input": ("ReduceSum", [("x", x234)], [("y", F)], {"keepdims": 0}, [("axes", i64(-1, 0))]),
    "reduce_sum_noop": ("ReduceSum", [("x", x234)], [("y", F)], {"noop_with_empty_axes": 1}, []),
    "reduce_mean_attr": ("ReduceMean", [("x", x234)], [("y", F)], {"axes": [1]}, []),
    "reduce_max_all": ("ReduceMax", [("x", x234)], [("y", F)], {"keepdims": 0}, []),
    "softmax_axis": ("Softmax", [("x", x234)], [("y", F)], {"axis": 1}, []),
    "pad_constant": (
        "Pad",
        [("x", x234)],
        [("y", F)],
        {},
        [("pads", i64(0, 1, 2, 0, 0, 1)), ("v", np.array(1.5, np.float32))],
    ),
    "pad_edge": ("Pad", [("x", x234)], [("y", F)], {"mode": "edge"}, [("pads", i64(0, 0, 2, 0, 0, 1))]),
    "trilu_lower": ("Trilu", [("x", x234)], [("y", F)], {"upper": 0}, [("k", i64(1))]),
    "cumsum_exclusive_reverse": (
        "CumSum",
        [("x", x234)],
        [("y", F)],
        {"exclusive": 1, "reverse": 1},
        [("axis", i64(-1))],
    ),
    "gemm_trans_alpha_beta": (
        "Gemm",
        [("a", rng0.standard_normal((4, 3)).astype(np.float32))],
        [("y", F)],
        {"transA": 1, "alpha": 0.5, "beta": 2.0},
        [
            ("b", rng0.standard_normal((4, 5)).astype(np.float32)),
            ("c", rng0.standard_normal((1, 5)).astype(np.float32)),
        ],
    ),
    "gemm_linear": (
        "Gemm",
        [("a", x1x4)],
        [("y", F)],
        {"transB": 1},
        [("b", rng0.standard_normal((5, 4)).astype(np.float32)), ("c", rng0.standard_normal(5).astype(np.float32))],
    ),
    "conv1d_depthwise_causal": (
        "Conv",
        [("x", x234.transpose(0, 2, 1).copy())],
        [("y", F)],
        {"group": 4, "pads": [2, 0], "kernel_shape": [3]},
        [("w", rng0.standard_normal((4, 1, 3)).astype(np.float32)), ("b", rng0.standard_normal(4).astype(np.float32))],
    ),
    "einsum": (
        "Einsum",
        [("x", x234)],
        [("y", F)],
        {"equation": "bij,jk->bik"},
        [("w", rng0.standard_normal((4, 5)).astype(np.float32))],
    ),
    "where_broadcast": (
        "Where",
        [("x", x234)],
        [("y", F)],
        {},
        [("a", np.array([1.0, -2.0, 3.0, 4.0], np.float32)), ("b", np.array(0.5, np.float32))],
    ),
    "max_variadic_broadcast": ("Max", [("x", x234)], [("y", F)], {}, [("a", x1x4), ("b", np.array(0.1, np.float32))]),
    "pow_int_exponent": ("Pow", [("x", x234)], [("y", F)], {}, [("e", np.array(2, np.int64))]),
    "clip_inputs": (
        "Clip",
        [("x", x234)],
        [("y", F)],
        {},
        [("lo", np.array(-0.5, np.float32)), ("hi", np.array(0.5, np.float32))],
    ),
    "layernorm_axis": (
        "LayerNormalization",
        [("x", x234)],
        [("y", F)],
        {"axis": -2, "epsilon": 1e-3},
        [
            ("s", rng0.standard_normal((3, 4)).astype(np.float32)),
            ("b", rng0.standard_normal((3, 4)).astype(np.float32)),
        ],
    ),
    "softplus": ("Softplus", [("x", (x234 * 30).astype(np.float32))], [("y", F)], {}, []),
    "div_int_truncates": (
        "Div",
        [("x", np.array([-7, 7, -8], np.int64))],
        [("y", I64)],
        {},
        [("d", np.array([2, -2, 3], np.int64))],
    ),
    "isnan_and": ("IsNaN", [("x", np.array([np.nan, 1.0, -np.inf], np.float32))], [("y", TensorProto.BOOL)], {}, []),
}


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_single_op_matches_onnxruntime(case):
    op, inputs, outputs, attrs, inits = OP_CASES[case]
    if op == "Where":  # Where(cond, a, b): the condition is computed from x
        inputs = [("x", x234 > 0)]
    model = _single_op_model(op, inputs, outputs, attrs, inits)
    feeds = {n: a for n, a in inputs}
    expected = _ort(model).run(None, feeds)
    actual = CudaGraphEngine(model, device="cpu").run(feeds)
    for (name, _), want in zip(outputs, expected):
        got = actual[name]
        assert got.shape == want.shape, f"{case}: {name} shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{case}: {name} dtype {got.dtype} != {want.dtype}"
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=case)


def test_onnx_lstm_gru_and_rnn_nodes_match_onnxruntime_bidirectional():
    """ONNX LSTM/GRU/RNN nodes the rewrite leaves alone run too (every direction, with biases and
    initial states), so the engine can also run unfused graphs."""
    rng = np.random.default_rng(3)
    T, B, I, H = 5, 2, 3, 4
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    cases = (
        ("LSTM", 4, {}),
        ("GRU", 3, {"linear_before_reset": 1}),
        ("GRU", 3, {}),
        ("RNN", 1, {}),  # nn.RNN's export (Elman, tanh)
        ("RNN", 1, {"activations": ["Relu", "Sigmoid"]}),
    )
    for op, gates, extra in cases:
        D = 2
        consts = [
            ("W", rng.standard_normal((D, gates * H, I)).astype(np.float32)),
            ("R", rng.standard_normal((D, gates * H, H)).astype(np.float32)),
            ("B", rng.standard_normal((D, 2 * gates * H)).astype(np.float32)),
        ]
        names = ["x", "W", "R", "B", "", "h0"] + (["c0"] if op == "LSTM" else [])
        h0 = rng.standard_normal((D, B, H)).astype(np.float32)
        c0 = rng.standard_normal((D, B, H)).astype(np.float32)
        outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
        node = helper.make_node(op, names, outs, hidden_size=H, direction="bidirectional", **extra)
        inputs = [helper.make_tensor_value_info("x", F, [T, B, I]), helper.make_tensor_value_info("h0", F, [D, B, H])]
        feeds = {"x": x, "h0": h0}
        if op == "LSTM":
            inputs.append(helper.make_tensor_value_info("c0", F, [D, B, H]))
            feeds["c0"] = c0
        graph = helper.make_graph(
            [node],
            "rnn",
            inputs,
            [helper.make_tensor_value_info(o, F, None) for o in outs],
            [onnx.numpy_helper.from_array(a, n) for n, a in consts],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        expected = _ort(model).run(outs, feeds)
        actual = CudaGraphEngine(model, device="cpu").run(feeds)
        for name, want in zip(outs, expected):
            np.testing.assert_allclose(actual[name], want, rtol=1e-5, atol=1e-5, err_msg=f"{op} {extra} {name}")


# ---------------------------------------------------------------------------------------------
# build-time errors


def test_unknown_ops_fail_at_build_time_naming_each_node():
    x = helper.make_tensor_value_info("x", F, [2, 3])
    y = helper.make_tensor_value_info("y", F, [2, 3])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="fine"),
        helper.make_node("Hardmax", ["a"], ["b"], name="my_hardmax"),
        helper.make_node("Frobnicate", ["b"], ["y"], name="my_custom", domain="com.example"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(UnsupportedOpError) as info:
        build_engine(model, device="cpu")
    message = str(info.value)
    assert "my_hardmax" in message and "Hardmax" in message
    assert "my_custom" in message and "com.example" in message
    assert "fine" not in message


def test_unknown_framefuse_op_and_unsupported_attribute_fail_at_build_time():
    x = helper.make_tensor_value_info("x", F, [2, 1, 3])
    nodes = [
        helper.make_node("NoSuchScan", ["x"], ["a"], name="bad_scan", domain="framefuse"),
        helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="clipped_lstm", hidden_size=2, clip=1.0),
    ]
    consts = [
        onnx.numpy_helper.from_array(np.zeros((1, 8, 3), np.float32), "W"),
        onnx.numpy_helper.from_array(np.zeros((1, 8, 2), np.float32), "R"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", F, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)])
    with pytest.raises(UnsupportedOpError) as info:
        build_engine(model, device="cpu")
    message = str(info.value)
    assert "bad_scan" in message and "NoSuchScan" in message
    assert "clipped_lstm" in message and "clip" in message


def test_data_dependent_shape_is_a_build_error():
    """A Reshape whose target shape is computed from the input's values cannot be captured."""
    x = helper.make_tensor_value_info("x", F, [2, 3])
    nodes = [
        helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
        helper.make_node("ReduceMax", ["xi"], ["m"], keepdims=1, axes=[0, 1]),
        helper.make_node("Reshape", ["x", "m"], ["y"], name="dynamic_reshape"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(EngineBuildError, match="dynamic_reshape.*must be known when the engine is built"):
        build_engine(model, device="cpu")


def test_dynamic_input_shape_is_a_build_error():
    x = helper.make_tensor_value_info("x", F, ["batch", 3])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", F, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(EngineBuildError, match="'x' has a dynamic or unknown shape"):
        build_engine(model, device="cpu")
    engine = build_engine(model, device="cpu", input_shapes={"x": (4, 3)})  # explicit shapes are fine
    assert engine.input_specs["x"].shape == (4, 3)


def test_cuda_device_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    prepared = prepare_cached("min_gru", SMALL)["sequence"]
    with pytest.raises(EngineBuildError, match="no CUDA GPU"):
        build_engine(prepared.onnx, device="cuda")


# ---------------------------------------------------------------------------------------------
# the engine artifact


def test_artifact_roundtrip_and_metadata(tmp_path):
    prepared = prepare_cached("mamba", SMALL)["sequence"]
    source = tmp_path / "model.onnx"
    source.write_bytes(prepared.onnx.read_bytes())
    engine = build_engine(source, device="cpu", out=tmp_path)
    target = tmp_path / "engine.ffe"
    assert target.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.ffe", "model.onnx"], "temporary files left behind"
    metadata, graph = read_artifact(target)
    import framefuse

    assert metadata["framefuse_version"] == framefuse.__version__
    assert metadata["torch_version"] == torch.__version__
    assert metadata["device"] == "cpu" and metadata["gpu_name"] is None
    assert metadata["source"]["relative_path"] == "model.onnx"
    import hashlib

    assert metadata["source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    # The stored graph is the planned one: no shape computations left.
    assert not any(n.op_type in ("Shape", "Constant", "ConstantOfShape") for n in graph.graph.node)
    assert len(graph.graph.node) == len(engine.default_plan.steps)
    feeds = {"x": np.random.default_rng(0).standard_normal(engine.input_specs["x"].shape).astype(np.float32)}
    loaded = load_engine(target)
    np.testing.assert_array_equal(loaded.run(feeds)["y"], engine.run(feeds)["y"])
    expected = _ort(prepared.onnx).run(["y"], feeds)[0]
    np.testing.assert_allclose(_ort(graph).run(["y"], feeds)[0], expected, rtol=TOL, atol=TOL)
    # Saving again replaces the artifact in place.
    save_engine(engine, target, source=source)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.ffe", "model.onnx"]


def test_stale_artifact_is_refused(tmp_path):
    prepared = prepare_cached("min_gru", SMALL)["sequence"]
    source = tmp_path / "model.onnx"
    source.write_bytes(prepared.onnx.read_bytes())
    build_engine(source, device="cpu", out=tmp_path)
    model = onnx.load(str(source))
    model.metadata_props.add(key="edited", value="1")
    onnx.save(model, str(source))
    with pytest.raises(StaleArtifactError, match="stale.*changed since the build.*framefuse build"):
        load_engine(tmp_path / "engine.ffe")
    load_engine(tmp_path / "engine.ffe", check_source=False)  # explicitly allowed
    build_engine(source, device="cpu", out=tmp_path)  # a rebuild makes it fresh again
    load_engine(tmp_path / "engine.ffe")


def _rewrite_metadata(target, **changes):
    with zipfile.ZipFile(target) as zf:
        metadata = json.loads(zf.read("metadata.json"))
        graph = zf.read("graph.onnx")
    metadata.update(changes)
    with zipfile.ZipFile(target, "w") as zf:
        zf.writestr("metadata.json", json.dumps(metadata))
        zf.writestr("graph.onnx", graph)


def test_foreign_artifacts_are_refused(tmp_path, monkeypatch):
    prepared = prepare_cached("min_gru", SMALL)["sequence"]
    target = build_engine(prepared.onnx, device="cpu").save(tmp_path / "a.ffe")
    _rewrite_metadata(target, framefuse_version="0.0.1")
    with pytest.raises(ForeignArtifactError, match="built by framefuse 0.0.1"):
        load_engine(target)

    target = build_engine(prepared.onnx, device="cpu").save(tmp_path / "b.ffe")
    _rewrite_metadata(target, device="cuda", gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    if not torch.cuda.is_available():
        with pytest.raises(ForeignArtifactError, match="no CUDA GPU here"):
            load_engine(target)
    cpu_target = build_engine(prepared.onnx, device="cpu").save(tmp_path / "c.ffe")
    # Another GPU architecture: pretend this machine has an sm_86 GPU.
    import framefuse.engines.artifact as artifact

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        artifact,
        "device_description",
        lambda device: {"device": "cuda", "gpu_name": "NVIDIA GeForce RTX 3090", "compute_capability": "8.6"},
    )
    with pytest.raises(ForeignArtifactError, match=r"compute capability 9\.0.*RTX 3090.*8\.6"):
        load_engine(target)
    # A CPU artifact asked to run on cuda is foreign too.
    with pytest.raises(ForeignArtifactError, match="built for cpu"):
        load_engine(cpu_target, device="cuda")


def test_not_an_artifact(tmp_path):
    from framefuse.engines.artifact import ArtifactError

    bad = tmp_path / "engine.ffe"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ArtifactError, match="not a framefuse engine artifact"):
        load_engine(bad)
    with pytest.raises(ArtifactError, match="no engine artifact"):
        load_engine(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# Polygraphy: the engine is a runner, compared with ONNX Runtime by composition


def test_polygraphy_comparator_engine_vs_onnxruntime():
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, DataLoader, SimpleCompareFunc

    prepared = prepare_cached("gated_ssm", SMALL)["step"]
    source = prepared.fused or prepared.onnx
    runners = [
        OnnxrtRunner(SessionFromOnnx(str(prepared.onnx), providers=["CPUExecutionProvider"])),
        CudaGraphEngine(source, device="cpu"),
    ]
    results = Comparator.run(runners, data_loader=DataLoader(iterations=2, seed=0))
    accuracy = Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=TOL, rtol=TOL))
    assert bool(accuracy), "the engine differs from ONNX Runtime"
    ours = results[runners[1].name]
    assert len(ours) == 2 and set(ours[0]) == {o["name"] for o in prepared.manifest["outputs"]}


def test_replays_count_the_native_host_path_launches_of_live_and_gone_bindings():
    """engine.replays adds the frames engines/hostpath.c launched for the engine's step bindings
    (their FrameState counts them): while the binding lives and after it is gone."""
    from framefuse.engines.hostpath import FrameState

    prepared = prepare_cached("min_gru", SMALL)["step"]
    engine = build_engine(prepared.fused, device="cpu")
    engine.replays += 2
    first, second = FrameState(), FrameState()
    engine.count_native_launches(first)
    engine.count_native_launches(second)
    first.launches, second.launches = 5, 7
    assert engine.replays == 14
    engine.replays += 1  # a Python-path launch beside them
    assert engine.replays == 15
    engine.forget_native_launches(first)
    first.launches = 100  # a state let go no longer counts
    assert engine.replays == 15
    second.launches += 1
    assert engine.replays == 16
