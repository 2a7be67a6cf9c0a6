"""LSTMSeq from an LSTM cell stepped in a Python loop (``nn.LSTMCell``, or its equations by hand).

Each step must be exactly (torch's and ONNX's LSTM, no peepholes):

    i = σ(x·W_iᵀ + b_i + h·U_iᵀ + c_i)   f = σ(…_f)   g = tanh(…_g)   o = σ(…_o)
    c' = f ⊙ c + i ⊙ g                    h' = o ⊙ tanh(c')

each pre-activation a linear layer of the frame x_t plus one of h_{t−1} (Gemm, or MatMul [+ Add]),
one per gate or one for all four split along the features (``nn.LSTMCell``'s export: the two
products added, then split in four). Two states cross from step to step, so the chain finder's
one-hole chains do not see the loop: the cells are found from their cell-state update instead
(an Add of f ⊙ c and i ⊙ g whose tanh, gated by a sigmoid, is h'), linked step to step through
c, and checked:

- the steps after the first are matched structurally against the cell equations on their template
  in h_{t−1} (the cell state c_{t−1} a leaf of it), the parameters assembled in LSTMSeq's layout
  (gates i, o, f, c) and every step evaluated on random h, c and x against the assembled LSTM step;
- the first step, whose recurrent products a loop from zeros has folded into constants, is
  evaluated on a random frame (and random initial states where they are graph inputs) against the
  same LSTM step.

A loop over the frames backwards (the reverse half of a bidirectional layer) runs the op over the
frames reversed. A loop that is not this LSTM is declined naming the step and the difference,
never mis-fused.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, make_framefuse_node
from framefuse.rewrite.unrolled.chains import STATE_IN_PREFIX, Chain, Tmpl, evaluate_template, template
from framefuse.rewrite.unrolled.common import UnrolledPass, emit_state_outputs, lift_leaf
from framefuse.rewrite.unrolled.graphutil import (
    const_key,
    const_value,
    descendants,
    producer,
    replace_producer,
)
from framefuse.rewrite.unrolled.match import gate_preactivation, graph_linear, last_axis_span, op, pairs

CHECK_TOLERANCE = 1e-5  # each step against the assembled LSTM step, random inputs (float64)
GATES = ("i", "o", "f", "c")  # LSTMSeq's (ONNX's) gate order; "c" is the candidate g


def _lstm_gate(tm: Tmpl):
    """A gate's pre-activation: (frame tensor, W, b, U, c) for x·Wᵀ + b + h·Uᵀ + c, or rows of the
    four gates' sum taken by a Split along the features (``nn.LSTMCell``); else None."""
    found = gate_preactivation(tm)
    if found is not None:
        return found
    if op(tm) != "Split" or not tm.children:
        return None
    inner = gate_preactivation(tm.children[0])
    if inner is None:
        return None
    frame, w, b, u, c = inner
    sizes = None
    if len(tm.children) > 1:
        if tm.children[1].kind != "leaf":
            return None
        sizes = const_value(tm.children[1].tensor)
    span = last_axis_span(tm.node, tm.tensor, w.shape[0], sizes)
    if span is None:
        return None
    lo, hi = span
    return frame, w[lo:hi], b[lo:hi], u[lo:hi], c[lo:hi]


def _act(tm: Tmpl, kind: str):
    return _lstm_gate(tm.children[0]) if op(tm) == kind and tm.children else None


def match_lstm(root: Tmpl):
    """({gate: (frame, W, b, U, c)}, the c_{t−1} leaf) for h' = o ⊙ tanh(f ⊙ c + i ⊙ g) in terms of
    h_{t−1} (the hole), or a reason string."""
    reason = "the step is not an LSTM update o ⊙ tanh(f ⊙ c + i ⊙ g) with gates linear in x_t and h_(t-1)"
    for o_tm, tanh_tm in pairs(root, "Mul"):
        o = _act(o_tm, "Sigmoid")
        if o is None or op(tanh_tm) != "Tanh":
            continue
        for keep, write in pairs(tanh_tm.children[0], "Add"):
            for f_tm, c_tm in pairs(keep, "Mul"):
                f = _act(f_tm, "Sigmoid")
                if f is None or c_tm.kind != "leaf":
                    continue
                for i_tm, g_tm in pairs(write, "Mul"):
                    i, g = _act(i_tm, "Sigmoid"), _act(g_tm, "Tanh")
                    if i is not None and g is not None:
                        return {"i": i, "o": o, "f": f, "c": g}, c_tm
    return reason


# -- finding the cells: their cell-state updates, linked through c ---------------------------------


class Cell:
    """One step's c' = f ⊙ c + i ⊙ g and h' = o ⊙ tanh(c') (tensors only; matched later)."""

    def __init__(self, c_old: gs.Tensor, c_new: gs.Tensor, h_new: gs.Tensor):
        self.c_old, self.c_new, self.h_new = c_old, c_new, h_new


def _made_by(t: gs.Tensor, *ops: str) -> bool:
    node = producer(t)
    return node is not None and node.op in ops


def _cell_at(tanh: gs.Node) -> Cell | None:
    """The cell whose h' = σ(·) ⊙ tanh(c') reads this Tanh, when c' is an Add of two products,
    one of a sigmoid and c (anything not an activation), the other of a sigmoid and a tanh."""
    c_new = tanh.inputs[0]
    add = producer(c_new)
    if add is None or add.op != "Add" or len(add.inputs) != 2 or len(tanh.outputs[0].outputs) != 1:
        return None
    mul = tanh.outputs[0].outputs[0]
    if mul.op != "Mul" or not any(_made_by(t, "Sigmoid") for t in mul.inputs if t is not tanh.outputs[0]):
        return None
    c_old = None
    for term in add.inputs:
        node = producer(term)
        if node is None or node.op != "Mul" or len(node.inputs) != 2:
            return None
        a, b = node.inputs
        plain = [t for t in (a, b) if not _made_by(t, "Sigmoid", "Tanh")]
        if len(plain) == 1 and any(_made_by(t, "Sigmoid") for t in (a, b)):
            if c_old is not None:
                return None
            c_old = plain[0]
    return None if c_old is None else Cell(c_old, c_new, mul.outputs[0])


def find_cells(tl) -> list[Cell]:
    return [cell for node in tl.graph.nodes if node.op == "Tanh" and (cell := _cell_at(node)) is not None]


def find_step_cells(tl, cells: list[Cell]) -> list[tuple[Cell, gs.Tensor]]:
    """Step-form cells (one frame, the states in and out by name): (cell, the ``state.`` input its
    gates read as h) for each cell whose c is a ``state.`` input and whose step, in that input,
    is an LSTM update reading c (a later layer's cell also reads the earlier layers' states,
    through its frame)."""
    inputs = [t for t in tl.graph.inputs if t.name.startswith(STATE_IN_PREFIX)]
    found = []
    for cell in cells:
        if cell.c_old not in inputs:
            continue
        for h_in in inputs:
            if h_in is cell.c_old or cell.h_new.name not in descendants(h_in):
                continue
            matched = match_lstm(template(cell.h_new, h_in))
            if not isinstance(matched, str) and matched[1].tensor.name == cell.c_old.name:
                found.append((cell, h_in))
                break
    return found


def find_cell_chains(tl, cells: list[Cell] | None = None) -> list[list[Cell]]:
    """Runs of cells each reading the previous one's c' as its c (at least two steps)."""
    cells = find_cells(tl) if cells is None else cells
    by_c_old: dict[str, list[Cell]] = {}
    for cell in cells:
        by_c_old.setdefault(cell.c_old.name, []).append(cell)
    produced = {cell.c_new.name for cell in cells}
    runs = []
    for cell in cells:
        if cell.c_old.name in produced:
            continue
        run = [cell]
        while len(by_c_old.get(run[-1].c_new.name, [])) == 1:
            run.append(by_c_old[run[-1].c_new.name][0])
        if len(run) >= 2:
            runs.append(run)
    return runs


# -- the check ---------------------------------------------------------------------------------------


def lstm_step(x, h, c, w, u, bias):
    """One LSTM step (float64) in LSTMSeq's layout: gates i, o, f, c."""
    hidden = u.shape[1]
    gates = x @ w.T + bias[: 4 * hidden] + h @ u.T + bias[4 * hidden :]
    i, o, f, g = (gates[:, k * hidden : (k + 1) * hidden] for k in range(4))
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    c_new = sig(f) * c + sig(i) * np.tanh(g)
    return sig(o) * np.tanh(c_new), c_new


def _frame_products(tm: Tmpl, frame: gs.Tensor, x: np.ndarray, skip: set[str]) -> dict:
    """The template's non-constant leaves (but ``skip``) as linear layers of ``frame`` at ``x``."""
    leaves = {}
    for t in tm.walk():
        if t.kind != "leaf" or t.tensor.name in skip or const_value(t.tensor) is not None:
            continue
        lin = graph_linear(t.tensor)
        if lin is None or lin[0].name != frame.name:
            raise Decline(f"the step input {t.tensor.name} is not a linear layer of the frame")
        leaves[t.tensor.name] = x @ lin[1].T.astype(np.float64) + lin[2]
    return leaves


class LSTMCellPass(UnrolledPass):
    name = "unrolled-lstm-cell"
    op_type = "LSTMSeq"

    def find(self, tl):
        """One chain a run of cells: states [h_0 (a placeholder), h_1 … h_T], links[k] the
        template of h_{k+1} in h_k for k ≥ 1 (links[0], the first step's, in its cell state);
        in the step form states [state.h, h'] and the one link in state.h."""
        cells = find_cells(tl)
        chains = []
        for run in find_cell_chains(tl, cells):
            links = [template(run[0].h_new, run[0].c_old, order=tl.order)]
            links += [template(b.h_new, a.h_new, order=tl.order) for a, b in zip(run, run[1:])]
            h0 = gs.Constant(f"the LSTM cells from {run[0].h_new.name}", np.zeros(1, np.float32))
            chain = Chain([h0, *[cell.h_new for cell in run]], links, "sequence")
            times = tl.time_of(run[-1].h_new)  # every frame the loop reads (a reversed loop's too)
            chain.first_frame = min(times) if times else 0
            chain.cells = run  # type: ignore[attr-defined]
            chains.append(chain)
        for cell, h_in in find_step_cells(tl, cells):
            chain = Chain([h_in, cell.h_new], [template(cell.h_new, h_in)], "step")
            chain.cells = [cell]  # type: ignore[attr-defined]
            chains.append(chain)
        return chains, []

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:
        shapes = lifter.shapes
        tl = lifter.tl
        run: list[Cell] = chain.cells  # type: ignore[attr-defined]
        reference = chain.links[-1]
        found = match_lstm(reference)
        if isinstance(found, str):
            raise Decline(f"step {len(run) - 1} ({run[-1].h_new.name}): {found}")
        gates, _ = found
        if len({g[0].name for g in gates.values()}) != 1:
            raise Decline("the LSTM gates read different inputs (expected one frame x_t)")
        state_shape = shapes.need_shape(run[-1].h_new)
        if len(state_shape) != 2 or shapes.dtype(run[-1].h_new) != np.float32:
            raise Decline(f"LSTM state must be float32 [B, H], got {state_shape}")
        if shapes.shape(run[-1].c_new) != state_shape:
            raise Decline(f"the cell state {run[-1].c_new.name} is not [B, H] = {list(state_shape)}")
        batch, hidden = state_shape
        frame = gates["i"][0]
        frame_shape = shapes.need_shape(frame)
        if len(frame_shape) != 2 or frame_shape[0] != batch:
            raise Decline(f"the LSTM frame must be [B, I] with B = {batch}, got {list(frame_shape)}")
        in_features = frame_shape[1]
        for label, (_, w, b, u, c) in gates.items():
            if w.shape != (hidden, in_features) or u.shape != (hidden, hidden) or {b.shape, c.shape} != {(hidden,)}:
                raise Decline(
                    f"the LSTM {label} gate's weights are {list(w.shape)} and {list(u.shape)}, expected "
                    f"[{hidden}, {in_features}] and [{hidden}, {hidden}]"
                )
        w = np.concatenate([gates[g][1] for g in GATES]).astype(np.float32)
        u = np.concatenate([gates[g][3] for g in GATES]).astype(np.float32)
        bias = np.concatenate([gates[g][2] for g in GATES] + [gates[g][4] for g in GATES]).astype(np.float32)
        error, frames = self._check_steps(chain, run, w, u, bias, batch, hidden, in_features)
        reverse = False
        if chain.form == "step":  # the states are the graph's state.h and state.c inputs
            h0, c0 = chain.states[0], run[0].c_old
        else:
            h0, c0, frame0, error0 = self._check_first(tl, run, w, u, bias, batch, hidden, in_features, gates)
            error = max(error, error0)
            times = [sorted(tl.time_of(t)) for t in (frame0, *frames)]
            first, count = chain.first_frame, len(times)
            if times == [[first + count - 1 - k] for k in range(count)]:
                reverse = True  # a backward loop (the reverse half of a bidirectional layer)
            elif times != [[first + k] for k in range(count)]:
                raise Decline(f"the LSTM steps do not read one frame each, in order, from frame {first}: {times}")
        for cell in run[:-1]:
            outside = [n.name for n in cell.c_new.outputs if not _inside(n, run)]
            if outside:
                raise Decline(f"the cell state {cell.c_new.name} is read outside the loop ({outside[0]})")
        steps = len(run)
        x_tm, x_shape = lift_leaf(lifter, emit, frame)  # [T, B, I], the frames in time order
        if reverse:  # the op's steps in the loop's order: its Y and final states are the cells'
            x_tm = emit.node(
                "Slice",
                [x_tm, emit.ints([steps - 1]), emit.ints([-steps - 1]), emit.ints([0]), emit.ints([-1])],
                x_shape,
                np.float32,
            )
        inputs = [x_tm, emit.const(w), emit.const(u), emit.const(bias)]
        if h0 is not None or c0 is not None:
            for given in (h0, c0):
                if given is None:
                    inputs.append(emit.const(np.zeros(state_shape, np.float32)))
                elif shapes.shape(given) != tuple(state_shape):
                    inputs.append(emit.expand(given, tuple(state_shape), np.float32))
                else:
                    inputs.append(given)
        y = gs.Variable(ctx.unique_name("lstm_cell_y"), dtype=np.float32, shape=[steps, batch, hidden])
        h_last = gs.Variable(ctx.unique_name("lstm_cell_h_last"), dtype=np.float32, shape=[batch, hidden])
        c_last = gs.Variable(ctx.unique_name("lstm_cell_c_last"), dtype=np.float32, shape=[batch, hidden])
        node = make_framefuse_node(graph, ctx, "LSTMSeq", inputs, [y, h_last, c_last], {})
        emit.new_nodes.append(node)
        emit_state_outputs(graph, emit, chain, y if steps > 1 else None, h_last, state_shape)
        replace_producer(run[-1].c_new, c_last, graph, emit)  # a returned c_T reads the op's
        return {
            "node": node,
            "steps": steps,
            "state_shape": list(state_shape),
            "initial_state": "zeros" if h0 is None and c0 is None else "given",
            "direction": "reverse" if reverse else "forward",
            "check_max_abs_diff": error,
        }

    def _check_steps(self, chain, run, w, u, bias, batch, hidden, in_features):
        """Every step after the first on random h, c and x against the assembled LSTM step: (max
        |difference|, each step's frame)."""
        rng = np.random.default_rng(0)
        worst = 0.0
        frames = []
        # the sequence form's first link is in its cell state (checked by _check_first)
        first = 0 if chain.form == "step" else 1
        for k, link in enumerate(chain.links[first:], start=first):
            found = match_lstm(link)
            if isinstance(found, str):
                raise Decline(f"step {k}: {found}")
            gates, c_leaf = found
            if c_leaf.tensor.name != run[k].c_old.name:
                raise Decline(f"step {k}: its c is {c_leaf.tensor.name}, not the previous step's cell state")
            frame = gates["i"][0]
            if len({g[0].name for g in gates.values()}) != 1:
                raise Decline(f"step {k}: the LSTM gates read different inputs (expected one frame x_t)")
            frames.append(frame)
            for _ in range(2):
                h, c = rng.standard_normal((2, batch, hidden))
                x = rng.standard_normal((batch, in_features))
                leaves = _frame_products(link, frame, x, {c_leaf.tensor.name})
                leaves[c_leaf.tensor.name] = c
                actual = evaluate_template(link, h, leaves)
                if actual is None:
                    raise Decline(f"step {k}: the LSTM check cannot evaluate the step on random inputs")
                expected, _ = lstm_step(x, h, c, w, u, bias)
                worst = max(worst, float(np.abs(np.broadcast_to(actual, expected.shape) - expected).max()))
            if not worst <= CHECK_TOLERANCE:
                raise Decline(f"step {k} differs from the LSTM it matched by {worst:.3g} on random inputs")
        return worst, frames

    def _check_first(self, tl, run, w, u, bias, batch, hidden, in_features, gates):
        """The first step, evaluated from its frame on random inputs against the LSTM step: (h_0
        tensor or None for zeros, c_0 tensor or None for zeros, its frame, max |difference|). Its
        frame is what its product with the later steps' input weights reads; its recurrent
        products, unless a loop from zeros folded them, read h_0."""
        first = run[0]
        frame = _first_frame(tl, first, gates)
        if frame is None:
            raise Decline("the first LSTM step reads no linear layer of a frame like the later steps")
        tm = template(first.h_new, frame, order=tl.order)
        c0 = None if _zero(first.c_old) else first.c_old
        h_products = {}  # leaf name -> (U, c) of a linear layer of h_0
        h0 = None
        for t in tm.walk():
            if t.kind != "leaf" or const_value(t.tensor) is not None or t.tensor.name == first.c_old.name:
                continue
            lin = graph_linear(t.tensor)
            if lin is None or (h0 is not None and lin[0].name != h0.name):
                raise Decline(f"the first LSTM step reads {t.tensor.name} besides its frame, h_0 and c_0")
            h0 = lin[0]
            h_products[t.tensor.name] = (lin[1].astype(np.float64), lin[2])
        h0_value = const_value(h0) if h0 is not None else None
        rng = np.random.default_rng(1)
        worst = 0.0
        for _ in range(2):
            x = rng.standard_normal((batch, in_features))
            if h0 is None:
                h = np.zeros((batch, hidden))
            elif h0_value is not None:
                h = np.broadcast_to(h0_value, (batch, hidden)).astype(np.float64)
            else:
                h = rng.standard_normal((batch, hidden))
            c = rng.standard_normal((batch, hidden)) if c0 is not None and const_value(c0) is None else None
            if c is None:
                c = np.zeros((batch, hidden)) if c0 is None else np.broadcast_to(const_value(c0), (batch, hidden))
            leaves = {name: h @ u_.T + b_ for name, (u_, b_) in h_products.items()}
            if c0 is not None and const_value(c0) is None:
                leaves[c0.name] = c
            actual = evaluate_template(tm, x, leaves)
            if actual is None:
                raise Decline("the LSTM check cannot evaluate the first step on random inputs")
            expected, _ = lstm_step(x, h, c, w, u, bias)
            worst = max(worst, float(np.abs(np.broadcast_to(actual, expected.shape) - expected).max()))
        if not worst <= CHECK_TOLERANCE:
            raise Decline(f"the first step differs from the LSTM of the later ones by {worst:.3g} on random inputs")
        if h0 is not None and h0_value is not None and not np.any(h0_value):
            h0 = None
        return h0, c0, frame, worst


def _zero(t: gs.Tensor) -> bool:
    value = const_value(t)
    return value is not None and not np.any(value)


def _inside(node: gs.Node, run: list[Cell]) -> bool:
    """Whether ``node`` belongs to the loop's cells (reads a cell state on the way to an h')."""
    hs = {cell.h_new.name for cell in run} | {cell.c_new.name for cell in run}
    return any(out.name in hs or bool(descendants(out) & hs) for out in node.outputs)


def _weight_key(node: gs.Node):
    value = const_value(node.inputs[1]) if node.op in ("Gemm", "MatMul") and len(node.inputs) > 1 else None
    return None if value is None else const_key(value)


def _first_frame(tl, first: Cell, gates: dict) -> gs.Tensor | None:
    """The input of the first step's product with the later steps' input weights (compared by
    value: the exporter gives each use of a shared initializer its own Identity)."""
    frame = gates["i"][0]
    keys = {key for consumer in frame.outputs if (key := _weight_key(consumer)) is not None}
    reach = None
    for node in tl.graph.nodes:
        if _weight_key(node) in keys and first.c_new.name in descendants(node.outputs[0]):
            if reach is not None and reach.name != node.inputs[0].name:
                return None
            reach = node.inputs[0]
    return reach
