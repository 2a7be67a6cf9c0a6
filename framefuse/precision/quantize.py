"""int8 post-training quantization into explicit Q/DQ, with onnxruntime.quantization.

Why onnxruntime.quantization rather than NVIDIA ModelOpt's ONNX PTQ: it is already a dependency,
runs on the CPU, is maintained with ONNX Runtime (the reference engine), and writes the standard
QDQ form TensorRT's explicit-quantization mode consumes. ModelOpt would add a large dependency set
for the same Q/DQ graph at this size.

What is quantized: the GEMMs with a constant weight (``MatMul`` / ``Gemm`` whose second input is an
initializer): weights int8 per output channel, symmetric; activations int8 per tensor, symmetric
(zero point 0, as TensorRT requires), ranges from MinMax calibration. Left in float: framefuse nodes
(their kernels have no int8 path; in weight-only mode their weight matrices, OP_WEIGHTS, are int8
with a DequantizeLinear in front), the state recurrence (every node on a path from ``state.<n>`` to
``next_state.<n>``, as for fp16), the policy head (convert.policy_head), and anything in ``keep_fp32``.

Calibration runs the graph frame by frame on the CPU executor
(:class:`framefuse.engines.cuda_graph.CudaGraphEngine`, ``device="cpu"``) — ONNX Runtime's own
calibrator cannot run framefuse nodes — carrying the recurrent state as a real rollout does; the
min/max of every tensor the quantizer needs is handed to ``quantize_static`` through its
calibration cache (``calibration_cache_path``), so the quantizer itself is ORT's, unchanged.

``weights_only=True``: Q/DQ on the weights only (no activation quantization, no calibration
needed); a build that fails the accuracy gate keeps products in float32 through ``keep_fp32``
(framefuse.build.int8_fallback). In the cuda-graph engine a DequantizeLinear of a constant
is folded at planning time, so the weight is dequantised once at load: the run costs what fp32
costs, with int8 weight error.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from framefuse.precision import calibration
from framefuse.precision.convert import FRAMEFUSE_DOMAIN, recurrence_nodes
from framefuse.precision.errors import PrecisionError

QUANT_OPS = ("MatMul", "Gemm")
# The weight inputs of framefuse ops whose rows are the op's output channels (plugins/OPS.md: the
# LSTM's and GRU's W [gates·H, I] and R [gates·H, H], the liquid cell's R [4H, H]): each row is one
# dot product of the cell, so an int8 scale a row is the per-output-channel quantization the
# MatMul / Gemm weights get. Weight-only int8 only: the op reads the dequantized weight (its own
# kernels have no int8 path, ONNX Runtime and the CPU executor run the DequantizeLinear in front of
# it), while the step compiler reads the int8 rows (engines/fusion.PRECISION_ROWS). Without them
# an int8 lstm, gru or liquid build kept 70-99 % of its weight bytes in float32.
OP_WEIGHTS = {"LSTMSeq": {1: "W", 2: "R"}, "GRUSeq": {1: "W", 2: "R"}, "LiquidScan": {1: "R"}}


def weight_gemms(model: onnx.ModelProto, keep_fp32: Iterable[str] = ()) -> list[onnx.NodeProto]:
    """The MatMul / Gemm nodes with a constant fp32 weight that are not kept in float."""
    keep = set(keep_fp32)
    inits = {i.name: i for i in model.graph.initializer}
    recurrence = recurrence_nodes(model)
    nodes = []
    for i, node in enumerate(model.graph.node):
        if node.op_type not in QUANT_OPS or node.domain not in ("", "ai.onnx") or i in recurrence:
            continue
        if node.name in keep or node.op_type in keep or len(node.input) < 2:
            continue
        weight = inits.get(node.input[1])
        if weight is None or weight.data_type != TensorProto.FLOAT or len(weight.dims) != 2:
            continue
        if node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute):
            continue
        nodes.append(node)
    return nodes


def op_weight_name(node: onnx.NodeProto, index: int) -> str:
    """The product name of a framefuse op's weight input (``LSTMSeq_10:W``): what int8_candidates
    lists and ``keep_fp32`` takes, beside node names and op types."""
    return f"{node.name}:{OP_WEIGHTS[node.op_type][index]}"


def op_weights(model: onnx.ModelProto, keep_fp32: Iterable[str] = ()) -> list[tuple[onnx.NodeProto, int]]:
    """(node, input index) of every framefuse op weight of OP_WEIGHTS that is a constant 2-D fp32
    initializer and not kept in float (by its product name, the node's name or its op type)."""
    keep = set(keep_fp32)
    inits = {i.name: i for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.domain != FRAMEFUSE_DOMAIN or node.op_type not in OP_WEIGHTS:
            continue
        if node.name in keep or node.op_type in keep:
            continue
        for index in OP_WEIGHTS[node.op_type]:
            if index >= len(node.input) or op_weight_name(node, index) in keep:
                continue
            weight = inits.get(node.input[index])
            if weight is None or weight.data_type != TensorProto.FLOAT or len(weight.dims) != 2:
                continue
            found.append((node, index))
    return found


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    work = onnx.ModelProto()
    work.CopyFrom(model)
    taken = {n.name for n in work.graph.node if n.name}
    for i, node in enumerate(work.graph.node):
        if not node.name:
            name, k = f"{node.op_type}_{i}", 0
            while name in taken:
                k += 1
                name = f"{node.op_type}_{i}_{k}"
            node.name = name
            taken.add(name)
    return work


def quantize_int8(
    model: onnx.ModelProto,
    *,
    calib=None,
    config: Mapping | None = None,
    keep_fp32: Iterable[str] = (),
    weights_only: bool | None = None,
    frames: int = calibration.DEFAULT_FRAMES,
) -> onnx.ModelProto:
    """int8 Q/DQ graph of ``model`` (see the module docstring). ``calib``: a .npz path, a mapping of
    arrays (leading axis = frames), or None (seeded standard-normal frames). ``weights_only`` (None:
    ``convert.int8_mode_of``'s choice) skips activation quantization and calibration."""
    if weights_only is None:
        from framefuse.precision.convert import int8_mode_of

        weights_only = int8_mode_of(None, config, calib=calib) == "weights"
    work = _named(model)
    gemms = weight_gemms(work, keep_fp32)
    ops = op_weights(work, keep_fp32) if weights_only else []
    if not gemms and not ops:
        raise PrecisionError(
            f"{model.graph.name or '<model>'}: no MatMul/Gemm with a constant weight outside the state recurrence"
            + (" and no framefuse op weight" if weights_only else "")
            + "; nothing to quantize to int8"
        )
    if weights_only:
        return _weights_only(work, gemms, ops)
    arrays = calibration.resolve(calib, work, config=config, frames=frames)
    ranges = _calibrate(work, arrays, gemms)
    return _quantize_static(work, gemms, ranges)


def _activation_names(gemms: list[onnx.NodeProto]) -> list[str]:
    names = []
    for node in gemms:
        for name in (node.input[0], node.output[0]):
            if name not in names:
                names.append(name)
    return names


def _calibrate(model: onnx.ModelProto, arrays, gemms) -> dict[str, tuple[float, float]]:
    from framefuse.engines.cuda_graph import CudaGraphEngine

    wanted = _activation_names(gemms)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in wanted:
        if name not in existing:
            probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    engine = CudaGraphEngine(probe, device="cpu")
    lo = {name: np.inf for name in wanted}
    hi = {name: -np.inf for name in wanted}
    for _feeds, outputs in calibration.iter_feeds(arrays, model, engine.run):
        for name in wanted:
            value = outputs[name]
            if not np.isfinite(value).all():
                raise PrecisionError(f"calibration: tensor {name} is NaN/Inf on a calibration frame")
            lo[name] = min(lo[name], float(value.min()))
            hi[name] = max(hi[name], float(value.max()))
    return {name: (lo[name], hi[name]) for name in wanted}


def _quantize_static(model: onnx.ModelProto, gemms, ranges) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    data = TensorsData(
        CalibrationMethod.MinMax,
        {name: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for name, (lo, hi) in ranges.items()},
    )
    excluded = [n.name for n in model.graph.node if n.domain == FRAMEFUSE_DOMAIN]
    with tempfile.TemporaryDirectory(prefix="framefuse-int8-") as tmp:
        cache = Path(tmp) / "ranges.json"
        save_tensors_data(data, cache)
        source, target = Path(tmp) / "model.onnx", Path(tmp) / "model.int8.onnx"
        onnx.save(model, str(source))
        logger = logging.getLogger()
        level = logger.level
        logger.setLevel(logging.ERROR)  # ORT logs every tensor it cannot find a range for at INFO/WARNING
        try:
            quantize_static(
                str(source),
                str(target),
                calibration_data_reader=None,
                calibration_cache_path=cache,
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(QUANT_OPS),
                nodes_to_quantize=[n.name for n in gemms],
                nodes_to_exclude=excluded,
                per_channel=True,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options={
                    "ActivationSymmetric": True,
                    "WeightSymmetric": True,
                    # MatMul weights are [K, N]: one scale per output column.
                    "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},
                },
            )
        except Exception as exc:  # noqa: BLE001 - ORT raises plain exceptions
            raise PrecisionError(f"{model.graph.name or '<model>'}: int8 quantization failed: {exc}") from exc
        finally:
            logger.setLevel(level)
        return onnx.load(str(target))


def _weights_only(model: onnx.ModelProto, gemms, ops=()) -> onnx.ModelProto:
    """Per-output-channel symmetric int8 weights + DequantizeLinear; activations untouched. ``ops``:
    framefuse op weights (op_weights), one scale a row."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    done: dict[tuple[str, int], str] = {}
    new_nodes = []

    def dequantized(wname: str, axis: int) -> str:
        if (wname, axis) in done:
            return done[(wname, axis)]
        w = numpy_helper.to_array(inits[wname]).astype(np.float32)
        amax = np.abs(w).max(axis=1 - axis)
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        shape = [1, 1]
        shape[axis] = -1
        q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        stem = wname if not any(k[0] == wname for k in done) else f"{wname}_axis{axis}"
        qname, sname, zname, dname = (f"{stem}_quantized", f"{stem}_scale", f"{stem}_zero_point", f"{stem}_dq")
        graph.initializer.extend(
            [
                numpy_helper.from_array(q, qname),
                numpy_helper.from_array(scale, sname),
                numpy_helper.from_array(np.zeros(scale.shape, np.int8), zname),
            ]
        )
        new_nodes.append(
            helper.make_node(
                "DequantizeLinear", [qname, sname, zname], [dname], name=f"{stem}_DequantizeLinear", axis=axis
            )
        )
        done[(wname, axis)] = dname
        return dname

    for node in gemms:
        trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
        node.input[1] = dequantized(node.input[1], 0 if trans_b else 1)  # the output-channel axis
    for node, index in ops:
        node.input[index] = dequantized(node.input[index], 0)  # a row per output channel
    replaced = {name for name, _axis in done}
    still_used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in still_used or i.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = new_nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain in ("", "ai.onnx") and o.version >= 13 for o in model.opset_import):
        raise PrecisionError("per-channel DequantizeLinear needs opset ≥ 13")
    onnx.checker.check_model(model)
    return model
