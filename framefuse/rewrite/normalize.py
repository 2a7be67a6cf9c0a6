"""Undo what exporters leave that hides a graph's structure, keeping its semantics exactly.

Run by ``rewrite_model`` right after constant folding, before any pass looks for patterns:

- ``Identity`` (chains too): consumers read the input directly.
- ``Cast`` to the type its input already has (transformers' ``.float()`` / ``.to(dtype)`` in an
  fp32 model): bypassed, so a recurrence or a Softmax → MatMul is seen through it.
- ``Dropout`` in inference (no ``training_mode`` input or a constant false one, mask unused):
  an identity.
- ``Transpose`` whose perm is the identity: bypassed; a negative perm entry (torch's
  ``permute(0, -1, ...)`` as the TorchScript exporter writes it, which the ONNX checker rejects)
  becomes ``entry + rank``.

A node whose output is a graph output is kept (its name is the model's interface). Every change
is counted; ``rewrite_model`` puts the counts in the report's notes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs


def _all_nodes(graph: gs.Graph) -> Iterator[gs.Node]:
    """Nodes of the graph and of every subgraph (Loop/Scan/If bodies), which may read outer tensors."""
    for node in graph.nodes:
        yield node
        for value in node.attrs.values():
            if isinstance(value, gs.Graph):
                yield from _all_nodes(value)


def _np_dtype(onnx_type: int):
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(onnx_type)))
    except (TypeError, ValueError, KeyError):
        return None


def _same_dtype(tensor: gs.Tensor, onnx_type: int) -> bool:
    if tensor.dtype is None:
        return False
    target = _np_dtype(onnx_type)
    try:
        return target is not None and np.dtype(tensor.dtype) == target
    except TypeError:  # an onnx-only type (bfloat16, float8) gs keeps as a TensorProto enum
        return tensor.dtype == onnx_type


def _is_false_constant(tensor: gs.Tensor) -> bool:
    return isinstance(tensor, gs.Constant) and tensor.values.size == 1 and not bool(tensor.values.reshape(-1)[0])


def _passthrough(node: gs.Node) -> str | None:
    """The kind of no-op ``node`` is (its first output equals its first input), or None."""
    op = node.op
    if op == "Identity" and len(node.inputs) == 1:
        return "Identity"
    if op == "Cast" and node.inputs and "to" in node.attrs and _same_dtype(node.inputs[0], node.attrs["to"]):
        return "no-op Cast"
    if op == "Dropout" and node.inputs:
        training = node.inputs[2] if len(node.inputs) > 2 else None
        mask_used = len(node.outputs) > 1 and bool(node.outputs[1].outputs)
        if (training is None or training.name == "" or _is_false_constant(training)) and not mask_used:
            return "inference Dropout"
    if op == "Transpose" and node.inputs:
        perm = node.attrs.get("perm")
        if perm is not None and list(perm) == list(range(len(perm))):
            return "identity Transpose"
    return None


def _fix_negative_perm(node: gs.Node) -> bool:
    perm = node.attrs.get("perm")
    if perm is None or all(p >= 0 for p in perm):
        return False
    rank = len(perm)
    fixed = [int(p) + rank if p < 0 else int(p) for p in perm]
    if sorted(fixed) != list(range(rank)):
        return False  # not a permutation either way; the checker names it
    node.attrs["perm"] = fixed
    return True


def normalize_graph(graph: gs.Graph, notes: list[str] | None = None) -> Counter:
    """Normalise ``graph`` in place (see the module docstring); returns the count of each change
    and, with ``notes``, appends one line describing them."""
    counts: Counter = Counter()
    graph_outputs = {id(t) for t in graph.outputs}
    replace: dict[int, gs.Tensor] = {}

    for node in _all_nodes(graph):
        if node.op == "Transpose" and _fix_negative_perm(node):
            counts["negative Transpose perm"] += 1

    for node in list(graph.nodes):
        kind = _passthrough(node)
        if kind is None or not node.outputs:
            continue
        out = node.outputs[0]
        if id(out) in graph_outputs:
            continue
        replace[id(out)] = node.inputs[0]
        counts[kind] += 1

    if replace:

        def resolve(tensor: gs.Tensor) -> gs.Tensor:
            seen = 0
            while id(tensor) in replace and seen <= len(replace):
                tensor, seen = replace[id(tensor)], seen + 1
            return tensor

        for node in _all_nodes(graph):
            for i, tensor in enumerate(node.inputs):
                if id(tensor) in replace:
                    node.inputs[i] = resolve(tensor)
        graph.cleanup(remove_unused_graph_inputs=False)

    if notes is not None and counts:
        notes.append("normalized before the passes: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return counts


def normalize_model(model: onnx.ModelProto, notes: list[str] | None = None) -> tuple[onnx.ModelProto, Counter]:
    """:func:`normalize_graph` on a ModelProto (the IR version and metadata are kept)."""
    graph = gs.import_onnx(model)
    counts = normalize_graph(graph, notes)
    out = gs.export_onnx(graph, do_type_check=False)
    out.ir_version = model.ir_version
    out.metadata_props.extend(model.metadata_props)
    return out, counts


def fix_negative_transpose_perms(model: onnx.ModelProto) -> int:
    """Rewrite negative Transpose perm entries in place on the proto (before the ONNX checker,
    which rejects them); returns how many nodes changed. Touches nothing else."""
    changed = 0

    def visit(graph: onnx.GraphProto) -> None:
        nonlocal changed
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        visit(sub)
            if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
                continue
            for attr in node.attribute:
                if attr.name == "perm" and any(p < 0 for p in attr.ints):
                    rank = len(attr.ints)
                    fixed = [p + rank if p < 0 else p for p in attr.ints]
                    if sorted(fixed) == list(range(rank)):
                        del attr.ints[:]
                        attr.ints.extend(fixed)
                        changed += 1

    visit(model.graph)
    return changed
