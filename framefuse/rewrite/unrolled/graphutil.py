"""Small helpers over an onnx-graphsurgeon graph: constant values, static shapes, re-wiring.

New nodes are added through ``framefuse.rewrite.builder.GraphBuilder``.

The unrolled-recurrence passes reason about exported graphs whose shapes are static (the
exporter fixes batch and time), so every helper here works with concrete shapes and declines
(``Decline``) when one is unknown rather than guessing.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import DOMAIN, Decline
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.util import const_value, producer  # noqa: F401  (re-exported to the passes)


def split_span(node: gs.Node, output: gs.Tensor, length: int, sizes=None) -> tuple[int, int, int] | None:
    """(axis, start, stop) of the part ``output`` of a Split ``node`` takes from an axis of
    ``length``: sizes from its second input (``sizes``, opset 13+), its ``split`` attribute, or
    equal parts; None when they do not add up."""
    if sizes is None:
        sizes = node.attrs.get("split")
    n = len(node.outputs)
    if sizes is None:
        if length % n:
            return None
        sizes = [length // n] * n
    edges = np.cumsum([0, *[int(v) for v in np.asarray(sizes).reshape(-1)]])
    if edges[-1] != length or len(edges) != n + 1:
        return None
    k = node.outputs.index(output)
    return int(node.attrs.get("axis", 0)), int(edges[k]), int(edges[k + 1])


def const_key(value: np.ndarray) -> tuple:
    """A hashable identity of a constant by value (exports repeat the same constant per step)."""
    value = np.ascontiguousarray(value)
    digest = hashlib.sha1(value.tobytes()).hexdigest()
    return ("const", str(value.dtype), tuple(value.shape), digest)


def is_framefuse(node: gs.Node) -> bool:
    return node.domain == DOMAIN


class Shapes:
    """Static shapes and element types of every tensor, from ONNX shape inference.

    Tensors created by the passes carry their shape/dtype on the gs.Variable itself; those win.
    """

    def __init__(self, graph: gs.Graph):
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        self.dtypes: dict[str, np.dtype | None] = {}
        self._read(self._infer(graph))
        if any(self.shapes.get(t.name) is None for n in graph.nodes for t in n.outputs if not is_framefuse(n)):
            # Reshape targets computed from Shape ops (an unfolded export): fold a copy, infer again.
            try:
                import onnxruntime as ort

                ort.set_default_logger_severity(3)
                model = gs.export_onnx(graph, do_type_check=False)
                model.ir_version = min(model.ir_version, 10)
                model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
                folded = gs.import_onnx(model).fold_constants(fold_shapes=True, error_ok=True).cleanup()
                found = Shapes.__new__(Shapes)
                found.shapes, found.dtypes = {}, {}
                found._read(self._infer(folded))
                for name, shape in found.shapes.items():
                    if self.shapes.get(name) is None:
                        self.shapes[name] = shape
                        self.dtypes.setdefault(name, found.dtypes.get(name))
            except Exception:  # noqa: BLE001 - best effort, as above
                pass

    @staticmethod
    def _infer(graph: gs.Graph) -> list:
        try:
            model = gs.export_onnx(graph, do_type_check=False)
            model.ir_version = min(model.ir_version, 10)
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
            return list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
        except Exception:  # noqa: BLE001 - inference is best effort; missing shapes make passes decline
            return []

    def _read(self, infos) -> None:
        for info in infos:
            ttype = info.type.tensor_type
            if not ttype.HasField("shape"):
                continue
            dims = []
            for dim in ttype.shape.dim:
                dims.append(dim.dim_value if dim.HasField("dim_value") else None)
            self.shapes[info.name] = None if any(d is None for d in dims) else tuple(dims)
            if ttype.elem_type:
                self.dtypes[info.name] = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)

    def shape(self, t: gs.Tensor) -> tuple[int, ...] | None:
        if isinstance(t, gs.Constant):
            return tuple(t.shape)
        value = const_value(t)
        if value is not None:
            return tuple(value.shape)
        if t.shape is not None and all(isinstance(d, int) and d >= 0 for d in t.shape):
            return tuple(int(d) for d in t.shape)
        return self.shapes.get(t.name)

    def need_shape(self, t: gs.Tensor, why: str = "") -> tuple[int, ...]:
        shape = self.shape(t)
        if shape is None:
            raise Decline(f"shape of tensor {t.name!r} is not static{' (' + why + ')' if why else ''}")
        return shape

    def dtype(self, t: gs.Tensor) -> np.dtype | None:
        if isinstance(t, gs.Constant):
            return np.dtype(t.dtype)
        if t.dtype is not None:
            try:
                return np.dtype(t.dtype)
            except TypeError:
                pass
        return self.dtypes.get(t.name)


def replace_producer(target: gs.Variable, new_source: gs.Variable, graph: gs.Graph, emit: GraphBuilder) -> None:
    """Make ``target`` (keeping its name, so graph outputs and consumers stay wired) be computed
    by an Identity of ``new_source`` instead of by its old producer."""
    target.inputs.clear()
    source_node = producer(new_source)
    if (
        source_node is not None
        and source_node in emit.new_nodes
        and not new_source.outputs
        and len(source_node.outputs) == 1
        and new_source not in graph.outputs
    ):
        target.dtype = target.dtype or new_source.dtype
        source_node.outputs[0] = target  # the new node computes ``target`` directly
        return
    node = gs.Node(op="Identity", name=emit.unique_name("Identity"), inputs=[new_source], outputs=[target])
    graph.nodes.append(node)
    emit.new_nodes.append(node)


def tensors_between(source: gs.Tensor, sink: gs.Tensor) -> tuple[set[str], list[gs.Node]]:
    """Names of the tensors that depend on ``source`` and feed ``sink``, and the nodes between."""
    down = descendants(source)
    nodes: dict[int, gs.Node] = {}
    seen: set[str] = set()
    stack = [sink]
    while stack:
        t = stack.pop()
        if t.name in seen or t.name not in down:
            continue
        seen.add(t.name)
        node = producer(t)
        if node is None or t is source:
            continue
        nodes[id(node)] = node
        stack.extend(node.inputs)
    return seen, list(nodes.values())


def descendants(source: gs.Tensor, stop: set[str] | None = None, through_fused: bool = True) -> set[str]:
    """Names of ``source`` and of every tensor computed from it (not looking past ``stop``, nor
    past framefuse nodes unless ``through_fused``)."""
    seen = {source.name}
    stack = [source]
    while stack:
        t = stack.pop()
        if stop and t.name in stop:
            continue
        for node in t.outputs:
            if not through_fused and is_framefuse(node):
                continue
            for out in node.outputs:
                if out.name not in seen:
                    seen.add(out.name)
                    stack.append(out)
    return seen
