"""fp16 / bf16 / int8 graphs on the cuda-graph engine (GPU): the framefuse kernels' fp16/bf16 paths
against the same graph run by the torch references, the 1000-frame accuracy report against fp32,
and the per-step latency of each precision (printed with -s, quoted in the precision note).
Skipped without a GPU."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
import torch

from framefuse.engines.cuda_graph import CudaGraphEngine
from framefuse.precision import accuracy_report, convert_model
from framefuse.runtime.pipeline import prepare_cached

pytestmark = pytest.mark.gpu

# The benchmark's configuration: each config file's defaults (embed 256, 2 layers), T = 32.
CONFIG = {"seq": 32, "seed": 0}
ARCHS = ["mamba", "gated_ssm", "lstm", "attention", "min_gru", "xlstm"]
LOW = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Kernel vs torch reference on the *same* converted graph: both see the same low-precision inputs,
# so the gap is the kernels' arithmetic (fp32 accumulation) and output rounding only.
KERNEL_VS_REFERENCE = {"fp16": 5e-3, "bf16": 3e-2, "int8": 5e-3}


def _prepared(arch):
    prepared = prepare_cached(arch, CONFIG)["step"]
    assert prepared.fused is not None, prepared.fused_error
    return prepared


def _feeds(prepared, rng):
    return {
        n: rng.standard_normal(s).astype(np.float32) if not n.startswith("state.") else np.zeros(s, np.float32)
        for n, s in prepared.input_shapes().items()
    }


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_run_the_low_precision_graph(arch, precision):
    prepared = _prepared(arch)
    model = onnx.load(str(prepared.fused))
    converted = convert_model(model, precision, config=prepared.manifest["config"])
    gpu = CudaGraphEngine(converted, device="cuda")  # framefuse nodes through their CUDA kernels
    cpu = CudaGraphEngine(converted, device="cpu", framefuse_impl="reference")
    if precision in LOW:
        # The kernels get storage-dtype inputs: the fp16/bf16 path, not fp32.
        ff_steps = [s for s in gpu.default_plan.steps if not getattr(s, "standard", True)]
        assert ff_steps, "no framefuse node in the plan"
    rng = np.random.default_rng(11)
    feeds = _feeds(prepared, rng)
    ours, ref = dict(feeds), dict(feeds)
    tol = KERNEL_VS_REFERENCE[precision]
    for _ in range(5):  # a few frames, each side carrying its own state
        a, b = gpu.run(ours), cpu.run(ref)
        for name in b:
            assert a[name].dtype == np.float32
            scale = float(np.abs(b[name]).max()) + 1.0
            assert np.abs(a[name] - b[name]).max() <= tol * scale, (arch, precision, name)
        x = rng.standard_normal(feeds["x"].shape).astype(np.float32)
        ours = {"x": x, **{n: a["next_" + n] for n in feeds if n.startswith("state.")}}
        ref = {"x": x, **{n: b["next_" + n] for n in feeds if n.startswith("state.")}}


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("arch", ["mamba", "gated_ssm", "lstm", "attention"])
def test_accuracy_report_on_the_gpu(arch, precision, tmp_path):
    prepared = _prepared(arch)
    model = onnx.load(str(prepared.fused))
    tol = prepared.manifest["config"]["tolerance"][precision]
    converted = convert_model(model, precision, config=prepared.manifest["config"])
    engine = CudaGraphEngine(converted, device="cuda")
    report = accuracy_report(model, engine, frames=1000, precision=precision, tolerance=tol)
    report.write(tmp_path / f"accuracy.{precision}.json")
    print(f"\n{arch} {precision} on {torch.cuda.get_device_name()}\n{report.table()}")
    assert report.frames == 1000 and all(np.isfinite(o.max_abs) for o in report.outputs)
    if precision == "fp16":
        assert report.passed, report.failures()
    elif precision == "bf16":
        assert all(o.passed for o in report.outputs), report.failures()


def _step_latency_us(engine, feeds, iters=300) -> float:
    binding = engine.binding()
    for name, value in feeds.items():
        binding.host_in[name][...] = value
    for _ in range(20):
        binding.launch()
        binding.sync()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        binding.launch()
        binding.sync()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def _check_precision_graph(label: str, graph) -> None:
    """The converted graph holds what the row's label says it does."""
    from onnx import TensorProto

    weights = {init.data_type for init in graph.graph.initializer if np.prod(init.dims) >= 64}
    ops = {node.op_type for node in graph.graph.node}
    if label == "fp32":
        assert weights == {TensorProto.FLOAT}, weights
    elif label == "fp16":
        assert TensorProto.FLOAT16 in weights, weights
    elif label == "bf16":
        assert TensorProto.BFLOAT16 in weights, weights
    elif label == "int8-w":
        assert TensorProto.INT8 in weights and "DequantizeLinear" in ops and "QuantizeLinear" not in ops, (weights, ops)
    elif label == "int8-qdq":
        assert "QuantizeLinear" in ops and "DequantizeLinear" in ops, ops


@pytest.mark.parametrize("arch", ["mamba", "gated_ssm", "lstm"])
def test_precision_latency_column(arch):
    """Per-step latency of each precision (and int8 weight-only: dequantised once at load, vs int8
    Q/DQ: activations fake-quantised every frame), printed beside the 1000-frame accuracy. Each
    row measures what its label says: the graph holds weights of that precision (int8 weight-only:
    int8 weights and no activation quantisation; Q/DQ: activations quantised), the engine built
    from it ran every frame of the report, the fp32 row reproduces the reference and each low
    precision's error is within what its arithmetic allows."""
    prepared = _prepared(arch)
    model = onnx.load(str(prepared.fused))
    config = prepared.manifest["config"]
    feeds = _feeds(prepared, np.random.default_rng(0))
    variants = {
        "fp32": model,
        "fp16": convert_model(model, "fp16"),
        "bf16": convert_model(model, "bf16"),
        "int8-w": convert_model(model, "int8", config=config, int8_mode="weights"),
        "int8-qdq": convert_model(model, "int8", config=config, int8_mode="qdq"),
    }
    rows = []
    for label, graph in variants.items():
        engine = CudaGraphEngine(graph, device="cuda")
        latency = _step_latency_us(engine, feeds)
        precision = label.split("-")[0]
        report = accuracy_report(
            model, engine, frames=1000, precision=precision, tolerance=config["tolerance"][precision]
        )
        y = next(o for o in report.outputs if o.name == "y")
        rows.append((label, latency, y.max_abs, report.argmax_agreement))
        _check_precision_graph(label, graph)
        assert report.frames == 1000 and {o.name for o in report.outputs} >= {"y"}
        assert np.isfinite(latency) and latency > 0
        for output in report.outputs:
            assert np.isfinite(output.max_abs), (label, output)
            if label == "fp32":  # the reference graph itself on the same engine
                assert output.passed, (label, output)
    # the errors rank as the formats' precisions do: fp32 < fp16 (10 mantissa bits) < bf16 (7)
    error = {label: err for label, _, err, _ in rows}
    assert error["fp32"] < error["fp16"] < error["bf16"], error
    assert error["fp32"] < error["int8-w"], error
    print(f"\n{arch} on {torch.cuda.get_device_name()} (batch 1, step form)")
    for label, latency, err, agree in rows:
        print(f"  {label:<9} {latency:8.1f} us/step   y max|diff| {err:.3g}   argmax agree {100 * agree:.2f}%")
