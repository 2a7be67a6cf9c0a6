"""Small onnx-graphsurgeon helpers shared by the rewrite passes.

The passes read an exported graph after constant folding and shape inference, so most tensors
have a static shape and a dtype; these helpers answer the questions a pass keeps asking
("what produced this tensor?", "is it a constant, and what is its value?", "who else reads it?").
New nodes are added through ``framefuse.rewrite.builder.GraphBuilder``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import node_label  # noqa: F401  (U.node_label in every pass)

FLOAT_DTYPES = (np.float32, np.float16, np.float64)


def producer(t: gs.Tensor) -> gs.Node | None:
    """The node that writes `t`, or None for graph inputs and constants."""
    return t.inputs[0] if len(t.inputs) == 1 else None


def producer_op(t: gs.Tensor, *op_types: str) -> gs.Node | None:
    """`producer(t)` if it is a default-domain node of one of `op_types`, else None."""
    node = producer(t)
    if node is not None and node.op in op_types and node.domain in ("", "ai.onnx", None):
        return node
    return None


def strip_identity(t: gs.Tensor) -> gs.Tensor:
    """The tensor behind any chain of Identity nodes writing `t`."""
    while True:
        node = producer_op(t, "Identity")
        if node is None:
            return t
        t = node.inputs[0]


def const_value(t: gs.Tensor | None) -> np.ndarray | None:
    """The value of `t` if it is a constant (an initializer or the output of a Constant node)."""
    if t is None:
        return None
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    node = producer(t)
    if node is not None and node.op == "Constant" and not node.inputs:
        for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
            if key in node.attrs:
                value = node.attrs[key]
                return np.asarray(value.values if isinstance(value, gs.Constant) else value)
    return None


def scalar_value(t: gs.Tensor | None) -> float | None:
    """The float value of a constant with exactly one element (any rank), else None."""
    value = const_value(t)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(()))


def static_shape(t: gs.Tensor | None) -> tuple[int, ...] | None:
    """The shape of `t` if every dimension is a known int, else None."""
    if t is None:
        return None
    if isinstance(t, gs.Constant):
        return tuple(int(d) for d in t.values.shape)
    shape = t.shape
    if shape is None or any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def np_dtype(t: gs.Tensor | None):
    """numpy dtype of `t` (None when unknown)."""
    if t is None:
        return None
    if isinstance(t, gs.Constant):
        return t.values.dtype
    if t.dtype is None:
        return None
    try:
        return np.dtype(t.dtype)
    except TypeError:
        return None


def consumers(t: gs.Tensor) -> list[gs.Node]:
    return list(t.outputs)


def is_graph_output(graph: gs.Graph, t: gs.Tensor) -> bool:
    return any(o is t for o in graph.outputs)


def only_consumer(graph: gs.Graph, t: gs.Tensor, node: gs.Node) -> bool:
    """True when `node` is the one reader of `t` and `t` is not a graph output, i.e. the tensor
    disappears once `node` is replaced."""
    return len(t.outputs) == 1 and t.outputs[0] is node and not is_graph_output(graph, t)


def is_empty(t: gs.Tensor | None) -> bool:
    """An absent optional input (empty name)."""
    return t is None or (isinstance(t, gs.Variable) and t.name == "")


def replace_tensor(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor) -> None:
    """Make every reader of `old` read `new` instead (graph outputs keep their name: when `old`
    is a graph output, an Identity writes it from `new`)."""
    for node in list(old.outputs):
        for i, t in enumerate(node.inputs):
            if t is old:
                node.inputs[i] = new
    for t in graph.outputs:
        if t is old:
            # Keep the graph output's name: the producer of `old` is about to die, so `old` gets
            # an Identity from `new` as its new writer.
            old.inputs.clear()
            graph.nodes.append(gs.Node(op="Identity", name=f"{old.name}_identity", inputs=[new], outputs=[old]))


def detach_outputs(node: gs.Node) -> None:
    """Disconnect `node` from its outputs so that cleanup() removes it (and its now-dead inputs)."""
    node.outputs.clear()


def cancel_unsqueeze_squeeze(graph: gs.Graph) -> int:
    """Remove Unsqueeze(axes=a) → Squeeze(axes=a) pairs that the rewrites leave behind (a fused
    node's [T,B,H] output re-shaped to ONNX's [T,1,B,H] and squeezed back by the exporter's code).
    Returns how many Squeeze nodes were bypassed."""
    count = 0
    for sq in list(graph.nodes):
        if sq.op != "Squeeze" or not sq.inputs:
            continue
        unsq = producer_op(sq.inputs[0], "Unsqueeze")
        if unsq is None or len(unsq.inputs) < 2 or len(sq.inputs) < 2:
            continue
        a1, a2 = const_value(unsq.inputs[1]), const_value(sq.inputs[1])
        if a1 is None or a2 is None or a1.tolist() != a2.tolist() or len(a1) != 1 or a1[0] < 0:
            continue
        out = sq.outputs[0]
        replace_tensor(graph, out, unsq.inputs[0])
        sq.outputs.clear()
        count += 1
    return count


def drop_derived(found: list[gs.Tensor], given: set[str], inside: set[str], lead: tuple[int, ...]) -> list[gs.Tensor]:
    """``found`` (from inputs_outside) less the tensors computed from the others and ``given``
    alone: with T equal to a head width, the chunk machinery's q·exp(cumulative g) has q's shape
    and sits outside the region, so the walk up from an output stops at it beside q and g."""
    kept = []
    for t in found:
        node = producer(t)
        rest = given | {o.name for o in found if o is not t}
        if node is None or any(inputs_outside(i, rest, inside, lead, lead_too=True) for i in node.inputs if i.name):
            kept.append(t)
    return kept


def fitted_scale(got: list[np.ndarray], expected: list[np.ndarray]) -> tuple[float, float]:
    """(s, error): the scale s that best maps ``expected[0]`` onto ``got[0]`` (least squares; the
    reference code's q·d^−½ the cut may sit above), and the worst relative error of s·expected
    against got over every trial. A pass that checks a region against a reference on random
    trials fits the scale on the first and so checks it on the others."""
    scale = float((got[0] * expected[0]).sum() / max((expected[0] ** 2).sum(), 1e-30))
    error = max(float((np.abs(g - scale * e) / (1 + np.abs(scale * e))).max()) for g, e in zip(got, expected))
    return scale, error


def evaluate_cut(graph: gs.Graph, cut: dict, outputs: list[gs.Tensor]) -> list[np.ndarray]:
    """The graph's own nodes from the tensors named in ``cut`` to ``outputs``, run by ONNX Runtime
    on a cut copy of the graph with those tensors fed the given values (float64 results). Raises
    when ``outputs`` need anything besides ``cut`` and constants: a pass proves a pattern by
    running what the graph computes there on random inputs."""
    import onnxruntime as ort

    sub = graph.copy()
    tensors = sub.tensors()
    inputs = [tensors[name] for name in cut]
    for t in inputs:
        t.inputs.clear()
    sub.inputs, sub.outputs = inputs, [tensors[t.name] for t in outputs]
    sub.cleanup()
    model = gs.export_onnx(sub)
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {name: np.asarray(value, dtype=np.float32) for name, value in cut.items()}
    return [r.astype(np.float64) for r in session.run(None, feeds)]


def _extends(shape, lead: tuple[int, ...]) -> bool:
    """``shape`` is ``lead`` and one more axis."""
    return shape is not None and len(shape) == len(lead) + 1 and tuple(shape[: len(lead)]) == tuple(lead)


def unsqueezed_products(t: gs.Tensor) -> list[tuple[gs.Tensor, gs.Node]]:
    """(x, Mul) for every product x · t[..., None] in the graph where x has t's shape and one more
    axis (Mamba2's x·dt, the delta rule's k·β and v·β)."""
    lead = static_shape(t)
    found = []
    for reader in consumers(t):
        if reader.op != "Unsqueeze" or lead is None:
            continue
        for mul in consumers(reader.outputs[0]):
            if mul.op != "Mul" or len(mul.inputs) != 2:
                continue
            other = mul.inputs[1] if mul.inputs[0] is reader.outputs[0] else mul.inputs[0]
            if _extends(static_shape(other), lead):
                found.append((other, mul))
    return found


def inputs_outside(
    out: gs.Tensor, given: set[str], inside: set[str], lead: tuple[int, ...], *, lead_too: bool = False
) -> list[gs.Tensor]:
    """What ``out`` is computed from besides the ``given`` tensors and constants: walking up from
    it, the first tensors outside a region (``inside``, tensor names) whose shape is ``lead`` and
    one more axis (Mamba2's B and C, [B, T, K]; the delta rule's q, [B, H, T, Dk]) or, with
    ``lead_too``, ``lead`` itself (the gated delta rule's log-decays, [B, H, T]), and any graph
    input reached (which makes ``out`` not a function of the region's inputs)."""
    found: dict[str, gs.Tensor] = {}
    seen, stack = set(), [out]
    while stack:
        t = stack.pop()
        if t.name in seen or t.name in given or isinstance(t, gs.Constant) or const_value(t) is not None:
            continue
        seen.add(t.name)
        shape = static_shape(t)
        if t.name not in inside and (_extends(shape, lead) or (lead_too and shape == tuple(lead))):
            found[t.name] = t
            continue
        node = producer(t)
        if node is None:
            found[t.name] = t
            continue
        stack.extend(i for i in node.inputs if i.name)
    return list(found.values())
