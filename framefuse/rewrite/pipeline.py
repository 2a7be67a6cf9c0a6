"""rewrite_model: load an exported ONNX graph, run the rewrite passes, return the fused graph.

Order: load → check → shape inference → constant folding (so that scales, masks and shapes the
exporter computes at run time become constants the passes can read) → the passes (ONNX
LSTM/GRU nodes, attention, Loop/Scan, then the unrolled-recurrence passes of
``framefuse.rewrite.unrolled``) → cleanup → toposort → export → shape inference.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from framefuse.errors import FrameFuseError
from framefuse.plugins import registry
from framefuse.plugins.registry import DOMAIN, VERSION
from framefuse.rewrite.attention import AttentionPass, OnnxAttentionPass
from framefuse.rewrite.base import PassResult, RewriteContext
from framefuse.rewrite.chunked_delta import ChunkedDeltaRulePass
from framefuse.rewrite.chunked_gla import ChunkedGLAPass
from framefuse.rewrite.logscan import LogSpaceScanPass
from framefuse.rewrite.loops import LoopScanPass
from framefuse.rewrite.normalize import normalize_graph
from framefuse.rewrite.report import RewriteReport
from framefuse.rewrite.rnn_nodes import RnnNodePass
from framefuse.rewrite.ssd import ChunkedSSDPass
from framefuse.rewrite.steps import chained_step_nodes
from framefuse.rewrite.unroll import UnrollLoopsPass
from framefuse.rewrite.unrolled import PASSES as UNROLLED_PASSES
from framefuse.rewrite.unrolled import remaining_recurrence_ops
from framefuse.rewrite.util import cancel_unsqueeze_squeeze

# ONNX IR version the rewritten model is written with at most (ONNX Runtime 1.31 reads ≤ 13;
# 10 is what onnx 1.16+ and every engine we target understand).
MAX_IR_VERSION = 10
FOLD_SIZE_THRESHOLD = 64 << 20
PER_TIMESTEP_ONNX_OPS = ("LSTM", "GRU", "RNN", "Loop", "Scan")
_DEFAULT_DOMAINS = ("", "ai.onnx", None)
# Domains whose ops ONNX itself defines (checked against onnx.defs).
_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")


class RewriteError(FrameFuseError):
    """The input graph cannot be rewritten (unreadable, invalid, or uses unknown ops)."""


def load_model(model_or_path) -> tuple[onnx.ModelProto, str]:
    """(model, label) from a ModelProto, a path, or bytes; errors name the file."""
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, model_or_path.graph.name or "<model>"
    if isinstance(model_or_path, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model_or_path)), "<bytes>"
        except Exception as exc:  # noqa: BLE001 - protobuf raises several types
            raise RewriteError(f"cannot parse ONNX model from bytes: {exc}") from exc
    path = Path(os.fspath(model_or_path))
    if not path.is_file():
        raise RewriteError(f"ONNX model file not found: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - protobuf DecodeError, OSError, ...
        raise RewriteError(
            f"cannot read ONNX model {path}: not a valid ONNX protobuf ({type(exc).__name__}: {exc})"
        ) from exc
    if len(model.graph.node) == 0 and not model.graph.output:
        raise RewriteError(f"cannot read ONNX model {path}: the file holds no graph (empty or not an ONNX model)")
    return model, str(path)


def _opset_versions(model: onnx.ModelProto) -> dict[str, int]:
    return {(imp.domain or ""): imp.version for imp in model.opset_import}


def check_known_ops(model: onnx.ModelProto, label: str) -> None:
    """Every node is an ONNX op of the model's opset or a framefuse op; else an error naming it."""
    versions = _opset_versions(model)

    def visit(graph: onnx.GraphProto, where: str):
        for node in graph.node:
            domain = node.domain or ""
            name = node.name or f"<unnamed {node.op_type}>"
            if domain == DOMAIN:
                if not registry.is_framefuse_node(domain, node.op_type):
                    raise RewriteError(
                        f"{label}: node {name!r} uses op {node.op_type!r} of domain {DOMAIN!r}, which framefuse "
                        f"does not define (known: {', '.join(registry.OP_TYPES)})"
                    )
            elif domain in _ONNX_DOMAINS:
                version = versions.get("" if domain == "ai.onnx" else domain)
                if version is None:
                    raise RewriteError(
                        f"{label}: node {name!r} uses domain {domain or 'ai.onnx'!r} but the model "
                        f"does not import it (opset_import)"
                    )
                try:
                    onnx.defs.get_schema(node.op_type, version, domain)
                except Exception:  # noqa: BLE001 - SchemaError when unknown
                    raise RewriteError(
                        f"{label}: node {name!r}{where} uses op {node.op_type!r}, which is not an ONNX op of "
                        f"domain {domain or 'ai.onnx'!r} at opset {version} (and not a framefuse op)"
                    ) from None
            else:
                raise RewriteError(
                    f"{label}: node {name!r}{where} uses op {node.op_type!r} of unknown domain {domain!r}: "
                    f"neither ONNX nor framefuse ({DOMAIN!r}) defines it"
                )
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g, f" (in the body of {name!r})")
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        visit(g, f" (in a body of {name!r})")

    visit(model.graph, "")


def _check_and_infer(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise RewriteError(f"{label}: invalid ONNX model: {str(exc).strip().splitlines()[0]}") from exc
    try:
        # strict: a shape mismatch (e.g. MatMul of [2,3] by [4,5]) is an error here, not a crash later.
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - InferenceError and friends
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RewriteError(f"{label}: shape inference failed (inconsistent shapes or types): {msg}") from exc


def _infer_loose(model: onnx.ModelProto, notes: list[str] | None = None) -> onnx.ModelProto:
    """Shape inference that skips what it cannot infer (framefuse nodes have no ONNX schema).
    Should it fail outright, the model is kept as it is (still valid, fewer value_infos) and the
    failure is noted in the report."""
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        if notes is not None:
            notes.append(f"shape inference of the rewritten graph failed: {type(exc).__name__}: {exc}")
        return model


# The graph passes in the order they run, before the unrolled-recurrence family (its own ordered
# list, rewrite.unrolled.PASSES). A new pattern is one class and one entry here. UnrollLoopsPass
# after LoopScanPass: it copies out the bodies of the Loop / Scan nodes LoopScanPass left.
GRAPH_PASSES = (
    RnnNodePass,
    OnnxAttentionPass,
    AttentionPass,
    LoopScanPass,
    UnrollLoopsPass,
    LogSpaceScanPass,
    ChunkedSSDPass,
    ChunkedDeltaRulePass,
    ChunkedGLAPass,
)


def default_passes() -> list:
    """New instances of the passes in their order: GRAPH_PASSES, then rewrite.unrolled.PASSES (a
    pass may keep state while it runs, so two rewrites never share one)."""
    return [cls() for cls in (*GRAPH_PASSES, *UNROLLED_PASSES)]


def count_remaining(graph: gs.Graph, notes: list[str] | None = None) -> dict[str, int]:
    """Per-timestep ops still in `graph`: ONNX LSTM/GRU/RNN/Loop/Scan nodes plus the unrolled
    per-timestep chains that ``framefuse.rewrite.unrolled.remaining_recurrence_ops`` counts."""
    counts = {op: 0 for op in PER_TIMESTEP_ONNX_OPS}
    for node in graph.nodes:
        if node.op in counts and node.domain in _DEFAULT_DOMAINS:
            counts[node.op] += 1
    counts["unrolled"] = int(remaining_recurrence_ops(graph))
    # A loop the passes never recognised must not read as 0: the graph's own repeated, chained step
    # structure is counted independently (framefuse.rewrite.steps) and the larger count is kept.
    try:
        independent = chained_step_nodes(graph)
    except Exception as exc:  # noqa: BLE001 - a counting failure is reported, never silently 0
        independent = []
        if notes is not None:
            notes.append(f"the independent per-step count failed ({type(exc).__name__}: {exc})")
    passes_count = sum(v for k, v in counts.items() if k.startswith("unrolled"))
    if len(independent) > passes_count:
        counts["unrolled"] = counts.get("unrolled", 0) + len(independent) - passes_count
        if notes is not None:
            names = ", ".join(sorted({n.name for n in independent})[:3])
            notes.append(
                f"{len(independent)} ops are chained copies of one step (e.g. {names}) although no pass "
                "recognised their loop: counted as per-timestep ops left"
            )
    return counts


def _fold(graph: gs.Graph, notes: list[str]) -> gs.Graph:
    """Constant-fold (ONNX Runtime evaluates constant subgraphs, shapes included). A failure is
    noted in the report: the passes still run, they just see fewer constants."""
    try:
        import onnxruntime as ort

        ort.set_default_logger_severity(3)  # folding runs ORT; its optimiser warnings are noise
        # Tensors over 64 MiB stay computed at run time rather than bloating the file.
        graph.fold_constants(fold_shapes=True, error_ok=True, size_threshold=FOLD_SIZE_THRESHOLD).cleanup()
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        notes.append(f"constant folding failed ({type(exc).__name__}: {exc}); passes ran on the unfolded graph")
    return graph


def rewrite_model(model_or_path, *, passes=None, fold_constants: bool = True):
    """Rewrite a plain exported ONNX graph into one that uses framefuse ops.

    Returns ``(onnx.ModelProto, RewriteReport)``. Raises ``RewriteError`` (a FrameFuseError) for
    unreadable files, invalid models, ops neither ONNX nor framefuse defines, and inconsistent
    shapes.
    """
    model, label = load_model(model_or_path)
    check_known_ops(model, label)
    model = _check_and_infer(model, label)
    report = RewriteReport(source=label, nodes_before=len(model.graph.node))
    original_ir = model.ir_version
    original_opset = _opset_versions(model)
    metadata = {p.key: p.value for p in model.metadata_props}

    graph = gs.import_onnx(model)
    if fold_constants:
        graph = _fold(graph, report.notes)
        # Re-infer so every tensor the folding touched has a shape again.
        graph = gs.import_onnx(_infer_loose(_export(graph, original_ir), report.notes))
    normalize_graph(graph, report.notes)

    ctx = RewriteContext(opset=original_opset.get("", 17), metadata=metadata)
    # a pass class (as the ordered lists hold them) runs as a new instance of its own
    passes = default_passes() if passes is None else [p() if isinstance(p, type) else p for p in passes]
    for p in passes:
        result: PassResult = p.run(graph, ctx)
        report.passes.append(p.name)
        report.matches.extend(result.matches)
        report.declined.extend(result.declined)
        graph.cleanup(remove_unused_graph_inputs=False)

    cancel_unsqueeze_squeeze(graph)
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    report.remaining_per_timestep_ops = count_remaining(graph, report.notes)

    out = _export(graph, original_ir)
    # The fused graph always declares the framefuse domain, so tools can tell it was rewritten.
    if not any(imp.domain == DOMAIN for imp in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(DOMAIN, VERSION))
    out = _infer_loose(out, report.notes)
    del out.metadata_props[:]
    for key, value in {**metadata, "framefuse.rewritten": "1"}.items():
        out.metadata_props.add(key=key, value=value)
    report.nodes_after = len(out.graph.node)
    return out, report


def _export(graph: gs.Graph, ir_version: int) -> onnx.ModelProto:
    model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = min(ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    return model
