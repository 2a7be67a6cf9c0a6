"""README "Adding an op", followed literally (issue 22): the op's folder (`tests/toy_ops/toy_silu/`:
schema, reference, CUDA kernel, launch; found by the registry with no list to edit), one rewrite
pattern (`ToySiluPass` below) and its entry in the ordered pass list, and the op rewrites, builds,
runs on the CPU executor and passes `framefuse check` against ONNX Runtime, and TensorRT gets its Python plugin, touching no other file.
The step compiler declines a graph holding it, naming the op, until the op's lowering (one
function, `lower_toy_silu` below) is added to its table; then the interpreter and the generated
kernel (emulated on the CPU) compute what ONNX Runtime does. The kernel compiles with nvcc here;
it runs on the GPU in tests/gpu/test_adding_an_op_gpu.py."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from framefuse.compiler import CompileError, ir, lower_program, naive
from framefuse.compiler import lower as compiler_lower
from framefuse.compiler.codegen import generate
from framefuse.compiler.emulate import compiler as cxx_compiler
from framefuse.compiler.emulate import emulate
from framefuse.compiler.schedule import schedule
from framefuse.parity import ort_session
from framefuse.plugins import build_kernels, registry
from framefuse.rewrite import pipeline
from framefuse.rewrite.base import AnchoredPass, Decline, Match, NotACandidate, make_framefuse_node
from framefuse.rewrite.util import producer_op, static_shape

TESTS = Path(__file__).resolve().parent
OP = "ToySilu"


class ToySiluPass(AnchoredPass):
    """x · sigmoid(x) over a [B, T, D] tensor → ToySilu (the rewrite pattern of the README's steps)."""

    name = "toy-silu"
    tidy = "end"

    def anchors(self, graph):
        return [node for node in graph.nodes if node.op == "Mul"]

    def rewrite(self, graph, ctx, mul):
        for x, gate in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            sigmoid = producer_op(gate, "Sigmoid")
            if sigmoid is not None and sigmoid.inputs[0] is x:
                break
        else:
            raise NotACandidate
        shape = static_shape(x)
        if shape is None or len(shape) != 3:
            raise Decline(f"{OP} takes [B, T, D]; {x.name} has shape {shape}")
        y = mul.outputs[0]
        mul.outputs.clear()
        node = make_framefuse_node(graph, ctx, OP, [x], [y])
        return Match(self.name, OP, node.name, [mul.name, sigmoid.name])


def lower_toy_silu(ctx, ins):
    """ToySilu for the step compiler: its inputs as IR nodes → its outputs."""
    x = compiler_lower.as_node(ins[0], ctx.label)
    return [ir.ew("mul", x, ir.ew("sigmoid", x, label=ctx.label), label=ctx.label)]


class SiluMLP(nn.Module):
    """One SiLU the pattern fuses ([1, T, 16]) and one it declines (rank 2)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(nn.functional.silu(self.up(x))), nn.functional.silu(x.mean(1))


@pytest.fixture
def toy_op(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    found = registry.add_op_package("toy_ops")
    yield found
    registry.remove_op_package("toy_ops")


@pytest.fixture
def toy_pass(monkeypatch):
    monkeypatch.setattr(pipeline, "GRAPH_PASSES", (*pipeline.GRAPH_PASSES, ToySiluPass))


@pytest.fixture
def folder(tmp_path):
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            SiluMLP().eval(),
            (torch.randn(1, 4, 8),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y", "z"],
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, tmp_path / "model.onnx")
    return tmp_path


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)}


def test_the_op_folder_is_found_without_a_list(toy_op):
    assert toy_op == (OP,)
    assert OP in registry.OP_TYPES and registry.is_framefuse_node("framefuse", OP)
    module = registry.get_op(OP)
    assert module.SCHEMA.name == OP and module.SCHEMA.input_names == ("x",)
    x = torch.tensor([[[-30.0, -1.0, 0.0, 2.0]]])
    (y,) = module.reference(x)
    np.testing.assert_allclose(y.numpy(), (x * torch.sigmoid(x)).numpy(), rtol=1e-6)
    assert registry.has_kernel(OP)


def test_without_its_folder_the_op_does_not_exist():
    assert OP not in registry.OP_TYPES
    with pytest.raises(registry.UnknownOpError, match="unknown framefuse op 'ToySilu'"):
        registry.get_op(OP)


def test_a_folder_whose_op_name_cannot_be_read_is_named(tmp_path, monkeypatch):
    package = tmp_path / "broken_ops"
    (package / "odd").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "odd" / "schema.py").write_text("SCHEMA = OpSchema(name=make_name())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert registry.add_op_package("broken_ops") == ()
        with pytest.raises(registry.UnknownOpError, match="odd/schema.py: OpSchema\\(name=...\\) is neither"):
            registry.get_op("Odd")
    finally:
        registry.remove_op_package("broken_ops")
        registry.UNREADABLE.pop(str(package / "odd" / "schema.py"), None)


def test_the_new_op_rewrites_builds_and_checks(toy_op, toy_pass, folder, capsys):
    from framefuse.cli import main

    assert main(["rewrite", str(folder / "model.onnx")]) == 0
    fused = onnx.load(folder / "model.fused.onnx")
    assert [n.op_type for n in fused.graph.node if n.domain == "framefuse"] == [OP]
    assert "Mul" in [n.op_type for n in fused.graph.node]  # the rank-2 SiLU stays as it was
    report = json.loads((folder / "rewrite-report.json").read_text())
    assert [(m["pass_name"], m["op_type"]) for m in report["matches"]] == [("toy-silu", OP)]
    (declined,) = [d for d in report["declined"] if d["pass_name"] == "toy-silu"]
    assert declined["where"] == "/Mul_1" and "ToySilu takes [B, T, D]" in declined["reason"]
    assert json.loads((folder / "parity-report.json").read_text())["passed"] is True

    # ONNX Runtime runs the op through its reference (the custom-op bridge)
    expected = ort_session(folder / "model.onnx").run(None, _feeds())
    got = ort_session(fused, fused=True).run(None, _feeds())
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    capsys.readouterr()
    assert main(["build", str(folder), "--engine", "cuda-graph", "--device", "cpu"]) == 0
    assert f"{OP}=1" in capsys.readouterr().out
    assert main(["check", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "engine.ffe (cuda-graph): parity PASS" in out and "model.fused.onnx: parity PASS" in out


def test_the_step_compiler_names_the_op_until_it_has_a_lowering(toy_op, toy_pass, folder, monkeypatch, tmp_path):
    from framefuse.cli import main

    assert main(["rewrite", str(folder / "model.onnx")]) == 0
    fused = folder / "model.fused.onnx"
    with pytest.raises(CompileError, match="op ToySilu has no lowering in the step compiler"):
        lower_program(fused)

    monkeypatch.setitem(compiler_lower.FRAMEFUSE, OP, lower_toy_silu)
    program = lower_program(fused)
    expected = dict(zip(("y", "z"), ort_session(folder / "model.onnx").run(None, _feeds())))
    interpreted = naive.run(program, _feeds())
    for name in ("y", "z"):
        np.testing.assert_allclose(interpreted[name], expected[name], rtol=1e-5, atol=1e-6)
    if cxx_compiler() is None:
        pytest.skip("no C++ compiler to emulate the generated kernel (the interpreter was checked)")
    kernel = generate(schedule(program, grid=2, threads=64))
    outputs, _ = emulate(kernel, {"x": _feeds()["x"][None]}, {}, steps=1, workdir=tmp_path)
    for name in ("y", "z"):
        np.testing.assert_allclose(outputs[name][0], expected[name], rtol=1e-5, atol=1e-6)


def test_tensorrt_gets_a_plugin_for_the_op_registered_after_the_others(toy_op):
    trt = pytest.importorskip("tensorrt_rtx")
    from framefuse.plugins import tensorrt_plugins

    classes = tensorrt_plugins.plugin_classes(trt)
    assert set(classes) == set(registry.OP_TYPES) and OP in classes
    tensorrt_plugins.register_creators(trt)
    creator = trt.get_plugin_registry().get_creator(OP, "1", "framefuse")
    assert creator is not None and creator.name == OP


@pytest.mark.skipif(build_kernels.find_nvcc() is None, reason="nvcc not found: the toy kernel is not compiled")
def test_the_op_kernel_compiles_with_nvcc(toy_op, tmp_path):
    source = TESTS / "toy_ops" / "toy_silu" / "toy_silu.cu"
    record = build_kernels.compile_one(build_kernels.find_nvcc(), source, (90,), tmp_path, quiet=False)
    assert record["ok"], record.get("error")
    assert Path(record["output"]).stat().st_size > 0
