"""Hand-built ONNX graphs with a recurrence left as a Loop / Scan node (no rewrite pattern matches
their bodies), and IR programs of unrolled Elman cells (``unrolled_cells``): the step compiler's
control-flow lowering and its rolling of unrolled cells are tested on them on the CPU
(tests/test_compiler.py) and on the GPU (tests/gpu/test_stepkernel.py), through the
``control_flow_graphs`` fixture of tests/conftest.py."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

BATCH, FEATURES, HIDDEN, STEPS = 2, 5, 7, 6


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def elman_scan(*, reverse=False, axis=0, state=False):
    """h' = tanh(x_t·W + h·U + b) as an ONNX Scan (the output stacked along ``axis``, optionally
    in reverse); ``state``: h is the step graph's state.h / next_state.h."""
    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(3)
    B, F, H, T = BATCH, FEATURES, HIDDEN, STEPS
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x_t", "W"], ["xw"]),
            helper.make_node("MatMul", ["h_in", "U"], ["hu"]),
            helper.make_node("Add", ["xw", "hu"], ["s"]),
            helper.make_node("Add", ["s", "b"], ["s2"]),
            helper.make_node("Tanh", ["s2"], ["h_out"]),
            helper.make_node("Identity", ["h_out"], ["y_t"]),
        ],
        "elman",
        [helper.make_tensor_value_info("h_in", f32, [B, H]), helper.make_tensor_value_info("x_t", f32, [B, F])],
        [helper.make_tensor_value_info("h_out", f32, [B, H]), helper.make_tensor_value_info("y_t", f32, [B, H])],
    )
    h0, hT = ("state.h", "next_state.h") if state else ("h0", "h_final")
    seq = [T, B] if axis == 0 else [B, T]
    scan = helper.make_node(
        "Scan",
        [h0, "x"],
        [hT, "y"],
        num_scan_inputs=1,
        body=body,
        name="elman_scan",
        scan_input_axes=[axis],
        scan_output_axes=[axis],
        scan_input_directions=[int(reverse)],
        scan_output_directions=[int(reverse)],
    )
    return _model(
        [scan],
        [helper.make_tensor_value_info(h0, f32, [B, H]), helper.make_tensor_value_info("x", f32, [*seq, F])],
        [helper.make_tensor_value_info(hT, f32, [B, H]), helper.make_tensor_value_info("y", f32, [*seq, H])],
        [
            numpy_helper.from_array((0.5 * rng.standard_normal((F, H))).astype(np.float32), "W"),
            numpy_helper.from_array((0.5 * rng.standard_normal((H, H))).astype(np.float32), "U"),
            numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "b"),
        ],
    )


def mlp_cell_loop(*, data_dependent_stop=False, trip_count=True):
    """An MLP over [x_t, h] with a gate, as an ONNX Loop over t: x_t = X[:, t] gathered by the
    iteration number from the enclosing graph (outer scope)."""
    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(4)
    B, F, H, T = BATCH, FEATURES, HIDDEN, STEPS
    stop = (
        [
            helper.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
        ]
        if data_dependent_stop
        else [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    )
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["X", "i"], ["x_t"], axis=1),
            helper.make_node("Concat", ["x_t", "h_in"], ["xh"], axis=-1),
            helper.make_node("MatMul", ["xh", "A"], ["u"]),
            helper.make_node("Relu", ["u"], ["r"]),
            helper.make_node("MatMul", ["r", "C"], ["v"]),
            helper.make_node("Sigmoid", ["v"], ["z"]),
            helper.make_node("Mul", ["z", "h_in"], ["zh"]),
            helper.make_node("Tanh", ["v"], ["tv"]),
            helper.make_node("Add", ["zh", "tv"], ["h_out"]),
            *stop,
            helper.make_node("Identity", ["h_out"], ["y_t"]),
        ],
        "mlp_cell",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", f32, [B, H]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", f32, [B, H]),
            helper.make_tensor_value_info("y_t", f32, [B, H]),
        ],
    )
    loop = helper.make_node(
        "Loop", ["M" if trip_count else "", "go", "h0"], ["h_final", "y"], body=body, name="mlp_loop"
    )
    return _model(
        [loop],
        [helper.make_tensor_value_info("h0", f32, [B, H]), helper.make_tensor_value_info("X", f32, [B, T, F])],
        [helper.make_tensor_value_info("h_final", f32, [B, H]), helper.make_tensor_value_info("y", f32, [T, B, H])],
        [
            numpy_helper.from_array(np.array(T, np.int64), "M"),
            numpy_helper.from_array(np.array(True), "go"),
            numpy_helper.from_array(np.array(1e9, np.float32), "limit"),
            numpy_helper.from_array((0.4 * rng.standard_normal((F + H, 2 * H))).astype(np.float32), "A"),
            numpy_helper.from_array((0.4 * rng.standard_normal((2 * H, H))).astype(np.float32), "C"),
        ],
    )


def unrolled_cells(
    steps=5, batch=2, features=3, hidden=6, layers=(("tanh", True),), seed=0, tap=False, zero_start=False
):
    """A window of ``layers`` unrolled Elman cells as the lowering leaves a Python loop over
    nn.RNNCell: per position h = act((x_t·Wᵀ + b) + h·Rᵀ), layer l > 0 reading layer l − 1's h_t;
    ``tap``: the first layer's pre-activation at the last position is a graph output too;
    ``zero_start``: h starts at zero and the first position has no product (torch's export folds it)."""
    from framefuse.compiler.ir import Dot, Leaf, Program, broadcast_to, concat, ew, reshape, slice_axis

    rng = np.random.default_rng(seed)
    x = Leaf("input", "x", (steps, batch, features))
    inputs = [reshape(slice_axis(x, 0, t, 1, 1), (batch, features)) for t in range(steps)]
    outputs = {}
    for layer, (act, bias) in enumerate(layers):
        width = features if layer == 0 else hidden
        # scaled as nn.RNNCell initialises them, so that a relu layer stays finite over long windows
        w = (rng.standard_normal((hidden, width)) / np.sqrt(width)).astype(np.float32)
        r = (0.9 * rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
        b = Leaf("weight", f"b{layer}", (hidden,), rng.standard_normal(hidden).astype(np.float32))
        h = Leaf("input", f"h0_{layer}", (batch, hidden))
        states = []
        for t, inp in enumerate(inputs):
            a = Dot(inp, w)
            if bias:
                a = ew("add", a, broadcast_to(b, (batch, hidden)))
            pre = a if zero_start and t == 0 else ew("add", a, Dot(h, r))
            h = ew(act, pre)
            states.append(h)
            if tap and layer == 0 and t == steps - 1:
                outputs["pre"] = pre
        inputs = states
        outputs[f"h_{layer}"] = h
    outputs["y"] = concat([reshape(h, (1, batch, hidden)) for h in inputs], 0)
    leaves = {}
    for node in Program({}, {}, outputs, {}).nodes():
        if isinstance(node, Leaf) and node.role == "input":
            leaves[node.name] = node
    return Program(leaves, {}, outputs, {})


def unrolled_lstm_cells(steps=6, batch=2, features=3, hidden=5, *, gate_out=False, normed=False, layers=1, seed=0):
    """A window of unrolled LSTM cells written by hand (no fused op matches what the lowering
    leaves): per position g = x_t·Wᵀ + h·Rᵀ (with ``normed`` a LayerNorm over g's row), c = σ(f)·c
    + σ(i)·tanh(ĝ), h = σ(o)·tanh(c), from h0 and c0 inputs; outputs every h_t, the last c and,
    with ``gate_out``, every position's forget gate σ(f) too (a value the graph reads a position,
    carried by nobody). ``layers`` > 1 stacks the cells, layer l reading layer l − 1's h_t (the
    outputs are the last layer's)."""
    from framefuse.compiler.ir import Leaf, Program, concat, reshape, slice_axis

    rng = np.random.default_rng(seed)
    x = Leaf("input", "x", (steps, batch, features))
    below = [reshape(slice_axis(x, 0, t, 1, 1), (batch, features)) for t in range(steps)]
    for layer in range(layers):
        below, hs, gates, c = _lstm_layer(rng, below, batch, hidden, layer, normed)
    outputs = {"y": concat(hs, 0), "c": c}
    if gate_out:
        outputs["forget"] = concat(gates, 0)
    leaves = {n.name: n for n in Program({}, {}, outputs, {}).nodes() if isinstance(n, Leaf) and n.role == "input"}
    return Program(leaves, {}, outputs, {})


def _lstm_layer(rng, inputs, batch, hidden, layer, normed):
    from framefuse.compiler.ir import Dot, Leaf, broadcast_to, constant, ew, mean, reshape, slice_axis

    width = inputs[0].shape[-1]
    w = (rng.standard_normal((4 * hidden, width)) / np.sqrt(width)).astype(np.float32)
    r = (rng.standard_normal((4 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    suffix = f"_{layer}" if layer else ""
    h, c = Leaf("input", f"h0{suffix}", (batch, hidden)), Leaf("input", f"c0{suffix}", (batch, hidden))
    states, hs, gates = [], [], []
    for x_t in inputs:
        g = ew("add", Dot(x_t, w), Dot(h, r))
        if normed:
            centred = ew("sub", g, broadcast_to(mean(g, [1], True), g.shape))
            var = mean(ew("mul", centred, centred), [1], True)
            g = ew("mul", centred, broadcast_to(ew("reciprocal", ew("sqrt", ew("add", var, constant(1e-5)))), g.shape))
        i, f, cand, o = (slice_axis(g, 1, k * hidden, 1, hidden) for k in range(4))
        forget = ew("sigmoid", f)
        c = ew("add", ew("mul", forget, c), ew("mul", ew("sigmoid", i), ew("tanh", cand)))
        h = ew("mul", ew("sigmoid", o), ew("tanh", c))
        states.append(h)
        hs.append(reshape(h, (1, batch, hidden)))
        gates.append(reshape(forget, (1, batch, hidden)))
    return states, hs, gates, c


def hand_body_loop(steps, batch, width, hidden, *, product_body):
    """A program of one BodyLoop built by hand: two windows, a fixed input, h0 an input; the body a
    product of [u_t, h] through a weight, a row sum of h (a reduction), tanh; with
    ``product_body`` the body itself is a product (its last step a Dot)."""
    from framefuse.compiler.ir import BodyLoop, Dot, Leaf, Program, Reduce, broadcast_to, concat, ew, reshape

    rng = np.random.default_rng(5)
    h, u, v, f = (
        Leaf("slot", "h", (batch, hidden)),
        Leaf("slot", "u", (batch, width)),
        Leaf("slot", "v", (batch, hidden)),
        Leaf("slot", "f", (batch, hidden)),
    )
    w_in = (0.4 * rng.standard_normal((hidden, width + hidden))).astype(np.float32)
    mixed = Dot(concat([u, h], 1), w_in, label="w_in")
    row = broadcast_to(reshape(Reduce("sum", h, [1]), (batch, 1)), (batch, hidden))
    cell = ew("tanh", ew("add", ew("add", mixed, ew("mul", v, row)), f))
    if product_body:
        cell = Dot(cell, (0.5 * rng.standard_normal((hidden, hidden))).astype(np.float32), label="w_out")
    x = Leaf("input", "x", (steps, batch, width))
    gate = Leaf("input", "g", (steps, batch, hidden))
    fixed = Leaf("input", "b", (batch, hidden))
    h0 = Leaf("input", "h0", (batch, hidden))
    loop = BodyLoop(cell, h, [u, v], [x, ew("sigmoid", gate)], [f], [ew("mul", fixed, fixed)], h0, label="hand")
    inputs = {leaf.name: leaf for leaf in (x, gate, fixed, h0)}
    return Program(inputs, {}, {"y": loop}, {})
