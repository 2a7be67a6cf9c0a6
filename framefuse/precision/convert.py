"""fp16 / bf16 storage conversion of a framefuse graph, and the ``convert_model`` entry for every precision.

fp16 is onnxconverter-common's ``convert_float_to_float16`` (the converter ONNX Runtime's own tools
use): it retypes initializers, Constant values and ``value_info``, and inserts the boundary Casts
around the ops and nodes it is told to leave in fp32. We only decide *what* stays fp32:

- ``KEEP_FP32_OPS``: norm statistics (LayerNormalization, ReduceMean, Pow, Sqrt, Reciprocal of
  RMSNorm), softmax, and the range-hungry gate maths (Exp, Log, Softplus); the standard RNN ops
  (GRU / LSTM / RNN) whose hidden state accumulates inside the op;
- the **state recurrence**: every node on a path from a ``state.<name>`` input to its
  ``next_state.<name>`` output, so the recurrent state is carried and accumulated in fp32 frame after
  frame (in a fused graph that is mostly data movement around the framefuse nodes);
- the policy head: the GEMM that writes ``y`` (:func:`policy_head`);
- a framefuse op that exponentiates an input (its schema marks it ``exponentiated``: the mLSTM's
  gate pre-activations) and the nodes that compute that input back to its product
  (:func:`exponent_chains`): the same range-hungry gate maths as Exp, inside a fused op;
- anything the caller lists (``keep_fp32``: op types or node names).

framefuse nodes are given to the converter as fp32 nodes, then their storage-dtype inputs/outputs
(schema dtype ``T``) are switched to the low dtype so the kernels run their fp16/bf16 paths, while
their ``float32`` inputs/outputs (states, A/D/biases) stay fp32, as framefuse/plugins/OPS.md says.
The Cast pairs this leaves (fp16 → fp32 → fp16) are removed: that round trip is exact.

bf16: onnxconverter-common has no bf16 converter, and NVIDIA ModelOpt's AutoCast (which has one) pulls
in a large dependency set we did not want for a CPU build step. So bf16 reuses the fp16 converter's
decisions exactly: the fp16 graph is retyped (every FLOAT16 → BFLOAT16, Cast targets included), and
each converted initializer is re-rounded from its *original fp32 value* (round to nearest even), so no
weight passes through fp16's narrower range. Graph inputs and outputs stay fp32 (``keep_io_types``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from framefuse.config import INT8_MODES, PRECISIONS
from framefuse.engines.registry import get_kind
from framefuse.precision.errors import PrecisionError

FRAMEFUSE_DOMAIN = "framefuse"

KEEP_FP32_OPS = (
    "LayerNormalization",
    "ReduceMean",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "Softmax",
    "LogSoftmax",
    "Exp",
    "Log",
    "Softplus",
    "GRU",
    "LSTM",
    "RNN",
)
_LOW = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def convert_model(
    model: onnx.ModelProto,
    precision: str,
    *,
    calib=None,
    config: Mapping | None = None,
    keep_fp32: Iterable[str] = (),
    int8_mode: str | None = None,
) -> onnx.ModelProto:
    """``model`` in ``precision``: "fp32" returns it unchanged; "fp16"/"bf16" storage conversion
    (:func:`to_low_precision`); "int8" (:func:`framefuse.precision.quantize.quantize_int8`) in one of
    :data:`INT8_MODES` (:func:`int8_mode_of`): "weights", int8 weights per output channel and fp32
    activations and state (the default: no calibration, the state stays accurate), or "qdq", weights
    and activations through Q/DQ calibrated on ``calib`` (a .npz path or a mapping of arrays, leading
    axis = frames) or on inputs drawn from ``config``'s seed. ``keep_fp32`` (or
    ``config["keep_fp32"]``): extra op types / node names left in fp32. Raises PrecisionError /
    CalibrationError; never writes."""
    if not isinstance(model, onnx.ModelProto):
        if isinstance(model, (str, Path)):
            model = _load(Path(model))
        else:
            raise PrecisionError(f"convert_model needs an onnx.ModelProto or a path, got {type(model).__name__}")
    if precision not in PRECISIONS:
        raise PrecisionError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    keep = list(keep_fp32) + list((config or {}).get("keep_fp32") or []) + policy_head(model)
    if int8_mode is not None and precision != "int8":
        raise PrecisionError(f"an int8 mode is for precision int8, not {precision}")
    if precision == "fp32":
        if calib is not None:
            raise PrecisionError("a calibration file is for precision int8, not fp32")
        return model
    _check_float_graph(model, precision)
    if precision in _LOW:
        if calib is not None:
            raise PrecisionError(f"a calibration file is for precision int8, not {precision}")
        return to_low_precision(model, precision, keep_fp32=keep)
    from framefuse.precision.quantize import quantize_int8

    mode = int8_mode_of(int8_mode, config, calib=calib)
    return quantize_int8(model, calib=calib, config=config, keep_fp32=keep, weights_only=mode == "weights")


def int8_candidates(model: onnx.ModelProto, config: Mapping | None = None) -> list[str]:
    """The names (as quantize_int8 names the nodes) of the products a weight-only int8 build of
    ``model`` quantizes: the MatMul / Gemm nodes with a constant weight outside the state
    recurrence, the policy head and the config's ``keep_fp32`` left out, then the framefuse ops'
    weight matrices (``LSTMSeq_10:W``, quantize.op_weight_name). Naming some of them in
    ``keep_fp32`` keeps them in float32 (the build's accuracy fallback)."""
    from framefuse.precision.quantize import _named, op_weight_name, op_weights, weight_gemms

    keep = list((config or {}).get("keep_fp32") or []) + policy_head(model)
    named = _named(model)
    return [node.name for node in weight_gemms(named, keep)] + [
        op_weight_name(node, index) for node, index in op_weights(named, keep)
    ]


def int8_mode_of(int8_mode: str | None, config: Mapping | None = None, *, calib=None) -> str:
    """The int8 mode a build runs: ``int8_mode`` when given, else ``config["int8_mode"]`` (or the
    older ``config["int8_weights_only"]``), else "qdq" when a calibration set is given (it calibrates
    activations; nothing else reads it) and "weights" otherwise. A calibration set with mode
    "weights" is refused: it would be silently ignored."""
    config = config or {}
    mode = int8_mode
    if mode is None and "int8_mode" in config:
        mode = config["int8_mode"]
    if mode is None and "int8_weights_only" in config:
        mode = "weights" if config["int8_weights_only"] else "qdq"
    if mode is None:
        mode = "qdq" if calib is not None else "weights"
    if mode not in INT8_MODES:
        raise PrecisionError(f"unknown int8 mode {mode!r}: use one of {', '.join(INT8_MODES)}")
    if mode == "weights" and calib is not None:
        raise PrecisionError(
            "a calibration file calibrates activations, which int8 mode 'weights' leaves in fp32: "
            "drop it, or use int8 mode 'qdq'"
        )
    return mode


def policy_head(model: onnx.ModelProto, output: str = "y") -> list[str]:
    """Name of the node that writes the policy output (its last GEMM, through Identity/Reshape-like
    nodes), kept in fp32 / out of int8: one small GEMM, and the one whose rounding flips the argmax
    of near-tied logits (small zoo models, bf16: 99.3 % → 99.7 % argmax agreement over 1000 frames)."""
    producers = _producers(model.graph)
    node = producers.get(output)
    while node is not None and node.op_type in ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast"):
        node = producers.get(node.input[0])
    if node is None or node.op_type not in ("Gemm", "MatMul", "Add") or not node.name:
        return []
    return [node.name]


def unsupported_reason(engine: str, precision: str) -> str | None:
    """None when ``engine`` can run graphs of ``precision``; else one line saying why not."""
    if precision not in PRECISIONS:
        return f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}"
    return get_kind(engine).unsupported_precision(precision)


def _load(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise PrecisionError(f"{path}: no such ONNX file")
    try:
        return onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - onnx raises several types for a bad file
        raise PrecisionError(f"{path}: not a readable ONNX model ({exc})") from exc


def _check_float_graph(model: onnx.ModelProto, precision: str) -> None:
    """Conversion starts from the fp32 export; converting a converted graph again would stack casts
    and quantizers, so it is refused."""
    label = model.graph.name or "<model>"
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            raise PrecisionError(
                f"{label}: node {node.name or node.op_type} is already quantized; convert the fp32 graph"
            )
    for init in model.graph.initializer:
        if init.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            raise PrecisionError(
                f"{label}: initializer {init.name} is {TensorProto.DataType.Name(init.data_type)} already; "
                f"convert the fp32 graph to {precision}"
            )


# ---------------------------------------------------------------------------------------------
# graph helpers


def _producers(graph) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output if out}


def _consumers(graph) -> dict[str, list[onnx.NodeProto]]:
    table: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                table.setdefault(name, []).append(node)
    return table


def state_pairs(model: onnx.ModelProto) -> dict[str, str]:
    """``next_state.<n>`` output → ``state.<n>`` input, for the step form (empty otherwise)."""
    inputs = {i.name for i in model.graph.input}
    pairs = {}
    for out in model.graph.output:
        if out.name.startswith("next_state."):
            source = "state." + out.name[len("next_state.") :]
            if source in inputs:
                pairs[out.name] = source
    return pairs


def recurrence_nodes(model: onnx.ModelProto) -> set[int]:
    """Indices of the nodes on a path from a state input to its next-state output."""
    graph = model.graph
    pairs = state_pairs(model)
    if not pairs:
        return set()
    consumers = _consumers(graph)
    producers = _producers(graph)
    index = {id(node): i for i, node in enumerate(graph.node)}
    result: set[int] = set()
    for out_name, in_name in pairs.items():
        forward: set[int] = set()
        stack = [in_name]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, []):
                forward.add(index[id(node)])
                stack.extend(o for o in node.output if o)
        backward: set[int] = set()
        stack = [out_name]
        seen = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            node = producers.get(name)
            if node is not None:
                backward.add(index[id(node)])
                stack.extend(i for i in node.input if i)
        result |= forward & backward
    return result


def exponent_chains(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes an fp16 / bf16 build keeps in float32 because a framefuse op exponentiates
    what they compute: every framefuse node with an input its schema marks ``exponentiated`` (the
    mLSTM's gate pre-activations), and, for each such input, the nodes that compute it back to and
    including the product that starts it (the gate's projection and its bias; data movement on the
    way). Why: the converter keeps Exp in float32 for its range, and an exponential gate inside a
    fused op is the same math: exp(i_pre - m) turns bf16's 2^-9 relative rounding of a
    pre-activation of size ~10 into a few per cent of the gate (xlstm's bf16 build failed the accuracy
    gate on next_state.l0_C by 2.91 with every product, and the op, kept in float32; passes with
    these chains kept, 2026-12-01). Nodes must be named (to_low_precision names them first)."""
    from framefuse.plugins.registry import get_op

    graph = model.graph
    producers = _producers(graph)
    kept: list[str] = []
    for node in graph.node:
        if node.domain != FRAMEFUSE_DOMAIN:
            continue
        try:
            specs = get_op(node.op_type).SCHEMA.inputs
        except Exception:  # noqa: BLE001 - an unknown op is reported by the conversion itself
            continue
        marked = [name for spec, name in zip(specs, node.input) if spec.exponentiated and name]
        if not marked:
            continue
        kept.append(node.name)
        stack = list(marked)
        while stack:
            producer = producers.get(stack.pop())
            if producer is None or producer.name in kept:
                continue
            kept.append(producer.name)
            if producer.op_type in ("MatMul", "Gemm") and producer.domain in ("", "ai.onnx"):
                continue  # the gate's projection: its own inputs are the layer's shared activations
            stack.extend(name for name in producer.input if name)
    return kept


def _framefuse_dtypes(node: onnx.NodeProto) -> tuple[list[str], list[str]]:
    """Schema dtype ("T" or "float32") per input / output of a framefuse node."""
    from framefuse.plugins.registry import get_op

    try:
        schema = get_op(node.op_type).SCHEMA
    except Exception as exc:  # noqa: BLE001 - unknown op: the registry's own error is clear
        raise PrecisionError(f"node {node.name or node.op_type}: unknown framefuse op {node.op_type} ({exc})") from exc
    return [s.dtype for s in schema.inputs], [s.dtype for s in schema.outputs]


def _unique(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
        for attr in node.attribute:
            if attr.name == "to":
                return int(attr.i)
    return None


# ---------------------------------------------------------------------------------------------
# fp16 / bf16


def to_low_precision(model: onnx.ModelProto, precision: str, *, keep_fp32: Iterable[str] = ()) -> onnx.ModelProto:
    """fp16 or bf16 storage conversion (see the module docstring for what stays fp32)."""
    if precision not in _LOW:
        raise PrecisionError(f"to_low_precision converts to fp16 or bf16, not {precision!r}")
    from onnxconverter_common import float16

    keep = set(keep_fp32)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    graph = work.graph
    # The converter's block lists go by node name: give every node one.
    taken = {n.name for n in graph.node if n.name}
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = _unique(f"{node.op_type}_{i}", taken)
    _inline_constant_identities(graph)
    recurrence = recurrence_nodes(work)
    keep |= set(exponent_chains(work))
    block_nodes = [
        node.name
        for i, node in enumerate(graph.node)
        if i in recurrence or node.domain == FRAMEFUSE_DOMAIN or node.name in keep or node.op_type in keep
    ]
    block_ops = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(KEEP_FP32_OPS) | (keep & _op_types(graph)))
    blocked_names, blocked_ops = set(block_nodes), set(block_ops)
    _split_mixed_initializers(graph, lambda node: node.name in blocked_names or node.op_type in blocked_ops)
    originals = {
        init.name: numpy_helper.to_array(init) for init in graph.initializer if init.data_type == TensorProto.FLOAT
    }
    try:
        with warnings.catch_warnings():
            # The converter warns about every value it clamps into fp16's range; the accuracy
            # report is where such losses are measured.
            warnings.simplefilter("ignore")
            converted = float16.convert_float_to_float16(
                work,
                keep_io_types=True,
                op_block_list=block_ops,
                node_block_list=block_nodes,
            )
    except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions
        raise PrecisionError(f"{model.graph.name or '<model>'}: fp16 conversion failed: {exc}") from exc
    _keep_output_types(converted.graph, model.graph)
    _framefuse_storage(converted.graph, TensorProto.FLOAT16, keep)
    _drop_cast_round_trips(converted.graph)
    if precision == "bf16":
        _retype_bf16(converted.graph, originals)
    _drop_dead_casts(converted)
    onnx.checker.check_model(converted)
    return converted


def _inline_constant_identities(graph) -> None:
    """``Identity(initializer)`` becomes an initializer of its own (a copy under the Identity's
    output name). The torchscript exporter writes a weight shared by several modules (equal
    LayerNorm parameters) as one initializer and Identity nodes; the converter then keeps the
    initializer fp32 for a kept-fp32 reader but declares the Identity's output fp16, and ONNX
    Runtime refuses the graph (issue 19). As separate initializers each follows its own readers."""
    inits = {i.name: i for i in graph.initializer}
    outputs = {o.name for o in graph.output} | _subgraph_reads(graph)
    copies = []
    kept = []
    for node in graph.node:
        if (
            node.op_type == "Identity"
            and node.domain in ("", "ai.onnx")
            and node.input[0] in inits
            and node.output[0] not in outputs
        ):
            copy = TensorProto()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = node.output[0]
            copies.append(copy)
        else:
            kept.append(node)
    if not copies:
        return
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(copies)
    names = {c.name for c in copies}
    vis = [vi for vi in graph.value_info if vi.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(vis)


def _split_mixed_initializers(graph, kept_fp32) -> None:
    """An fp32 initializer read both by nodes kept in fp32 and by nodes the converter converts gets
    a copy for the kept ones: the converter retypes an initializer for all of its readers or none,
    and a shared one left fp32 reaches a converted node without a Cast (ONNX Runtime: "Type
    parameter (T) ... bound to different types")."""
    inits = {i.name: i for i in graph.initializer if i.data_type == TensorProto.FLOAT}
    sub = _subgraph_reads(graph)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            if name in inits and name not in sub:
                readers.setdefault(name, []).append(node)
    taken = {i.name for i in graph.initializer} | {
        n for node in graph.node for n in list(node.input) + list(node.output)
    }
    for name, nodes in readers.items():
        kept = [node for node in nodes if kept_fp32(node)]
        if not kept or len(kept) == len(nodes):
            continue
        copy = TensorProto()
        copy.CopyFrom(inits[name])
        copy.name = _unique(f"{name}/fp32", taken)
        graph.initializer.append(copy)
        for node in kept:
            for k, value in enumerate(node.input):
                if value == name:
                    node.input[k] = copy.name


def _subgraph_reads(graph) -> set[str]:
    """Every name read inside the subgraphs (Loop / If / Scan bodies) of ``graph``'s nodes."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                names |= {name for inner in sub.node for name in inner.input} | _subgraph_reads(sub)
    return names


def _op_types(graph) -> set[str]:
    return {node.op_type for node in graph.node}


def _framefuse_storage(graph, low: int, keep: set[str] = frozenset()) -> None:
    """Switch the ``T`` inputs/outputs of framefuse nodes (left fp32 by the converter) to ``low``:
    a Cast to ``low`` in front of each T input, and each T output renamed and cast back to fp32
    under its old name (the round trips with the converter's Casts are removed afterwards)."""
    taken = {name for node in graph.node for name in list(node.input) + list(node.output)}
    taken |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.domain != FRAMEFUSE_DOMAIN or node.name in keep or node.op_type in keep:
            new_nodes.append(node)
            continue
        in_dtypes, out_dtypes = _framefuse_dtypes(node)
        for k, name in enumerate(node.input):
            if name and k < len(in_dtypes) and in_dtypes[k] == "T":
                cast_out = _unique(f"{name}/to_low", taken)
                new_nodes.append(
                    helper.make_node("Cast", [name], [cast_out], to=low, name=_unique(f"{node.name}/cast_in{k}", taken))
                )
                graph.value_info.append(helper.make_tensor_value_info(cast_out, low, None))
                node.input[k] = cast_out
        new_nodes.append(node)
        for k, name in enumerate(node.output):
            if name and k < len(out_dtypes) and out_dtypes[k] == "T":
                low_name = _unique(f"{name}/low", taken)
                node.output[k] = low_name
                graph.value_info.append(helper.make_tensor_value_info(low_name, low, None))
                new_nodes.append(
                    helper.make_node(
                        "Cast",
                        [low_name],
                        [name],
                        to=TensorProto.FLOAT,
                        name=_unique(f"{node.name}/cast_out{k}", taken),
                    )
                )
    del graph.node[:]
    graph.node.extend(new_nodes)
    _set_value_type(graph, {n.output[0]: TensorProto.FLOAT for n in new_nodes if _cast_to(n) == TensorProto.FLOAT})


def _keep_output_types(graph, original) -> None:
    """The converter ends a blocked node that feeds a graph output with a Cast to fp16 even under
    ``keep_io_types``; a graph output keeps its declared type, taken from the Cast's *input* (so a
    value kept fp32 is not rounded on its way out). Internal consumers of that output (a state that
    is also used in the frame) keep the low-precision value they were converted for."""
    declared = {o.name: o.type.tensor_type.elem_type for o in original.output}
    producers = _producers(graph)
    taken = {name for node in graph.node for name in list(node.input) + list(node.output)}
    added = []
    for out in graph.output:
        want = declared.get(out.name)
        node = producers.get(out.name)
        if want is None or node is None:
            continue
        out.type.tensor_type.elem_type = want
        to = _cast_to(node)
        if to in (None, want):
            continue
        low_name = _unique(f"{out.name}/low", taken)
        node.output[0] = low_name
        for other in graph.node:
            for k, name in enumerate(other.input):
                if name == out.name:
                    other.input[k] = low_name
        added.append(
            helper.make_node("Cast", [node.input[0]], [out.name], to=want, name=_unique(f"{out.name}/out_cast", taken))
        )
    graph.node.extend(added)


def _set_value_type(graph, types: Mapping[str, int]) -> None:
    for vi in graph.value_info:
        if vi.name in types:
            vi.type.tensor_type.elem_type = types[vi.name]


def _elem_types(graph) -> dict[str, int]:
    types = {
        v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info) + list(graph.output)
    }
    types.update({i.name: i.data_type for i in graph.initializer})
    for node in graph.node:
        to = _cast_to(node)
        if to is not None:
            types[node.output[0]] = to
    return types


def _drop_cast_round_trips(graph) -> None:
    """Remove the converter's Cast pairs between nodes that agree on a dtype.

    ``low(fp32(x_low))`` → ``x_low``: exact (every fp16 / bf16 value is an fp32 value). ``fp32(low(x_fp32))``
    → ``x_fp32``: the converter puts that pair on every edge between two nodes it keeps in fp32 (e.g.
    a framefuse state output feeding the next_state Identity), which would round the recurrent state
    to fp16 / bf16 every frame; both ends being fp32 is exactly what keep-fp32 asked for. Repeats
    until nothing changes (chains of Casts); a Cast that writes a graph output is rewired, not removed."""
    outputs = {o.name for o in graph.output}
    low = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    changed = True
    while changed:
        changed = False
        producers = _producers(graph)
        types = _elem_types(graph)
        rename: dict[str, str] = {}
        for node in graph.node:
            to = _cast_to(node)
            if to is None:
                continue
            inner = producers.get(node.input[0])
            inner_to = _cast_to(inner) if inner is not None else None
            if inner_to is None or {to, inner_to} not in ({TensorProto.FLOAT, t} for t in low):
                continue
            if types.get(inner.input[0]) != to:
                continue
            if node.output[0] in outputs:
                node.input[0] = inner.input[0]
                changed = True
            else:
                rename[node.output[0]] = inner.input[0]
        for node in graph.node:
            for k, name in enumerate(node.input):
                if name in rename:
                    node.input[k] = rename[name]
                    changed = True


def _drop_dead_casts(model: onnx.ModelProto) -> None:
    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        used = {name for node in graph.node for name in node.input} | outputs
        keep = [n for n in graph.node if _cast_to(n) is None or n.output[0] in used]
        if len(keep) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(keep)
    live = {name for node in graph.node for name in list(node.input) + list(node.output)}
    vis = [vi for vi in graph.value_info if vi.name in live]
    del graph.value_info[:]
    graph.value_info.extend(vis)


def _bf16_tensor(values: np.ndarray, name: str) -> TensorProto:
    import torch

    bits = torch.from_numpy(np.array(values, dtype=np.float32, copy=True)).to(torch.bfloat16).view(torch.int16)
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = TensorProto.BFLOAT16
    tensor.dims.extend(values.shape)
    tensor.raw_data = bits.numpy().tobytes()
    return tensor


def _retype_bf16(graph, originals: Mapping[str, np.ndarray]) -> None:
    """The fp16 graph's decisions, in bf16: FLOAT16 → BFLOAT16 everywhere, weights re-rounded from fp32."""
    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT16:
            source = originals.get(init.name)
            values = source if source is not None else numpy_helper.to_array(init).astype(np.float32)
            graph.initializer[i].CopyFrom(_bf16_tensor(values, init.name))
    for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            vi.type.tensor_type.elem_type = TensorProto.BFLOAT16
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.BFLOAT16
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.CopyFrom(_bf16_tensor(numpy_helper.to_array(attr.t).astype(np.float32), attr.t.name))
