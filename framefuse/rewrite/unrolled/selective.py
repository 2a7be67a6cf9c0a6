"""SelectiveScan from an unrolled Mamba (S6) recurrence.

The chain must first be a linear recurrence h_t = a_t ⊙ h_{t−1} + b_t over a state [B, D, N]
(the affine proof of ``linear``). Its coefficients and read-out are then taken apart as products
of indexed factors (through Einsum without contraction, broadcast Mul, Unsqueeze, Transpose and
the frame slices), and must be exactly

    a_t[b,d,n] = exp(Δ_t[b,d] · A[d,n])        b_t[b,d,n] = Δ_t[b,d] · B_t[b,n] · x_t[b,d]
    y_t[b,d]   = Σ_n h_t[b,d,n] · C_t[b,n]     (an Einsum contraction, the only use of h_t
                                                  besides the next step)

with the same Δ in a_t and b_t and A constant over time. Δ is taken as given (delta_softplus = 0:
the model applied its softplus before the loop). The D skip and the z gate, computed on the whole
sequence after the loop, stay where they are. Anything else is declined with the part that did
not match, and the chain is left to the LinearScan pass.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, make_framefuse_node
from framefuse.rewrite.unrolled.chains import Chain
from framefuse.rewrite.unrolled.common import UnrolledPass
from framefuse.rewrite.unrolled.graphutil import const_value, producer, replace_producer
from framefuse.rewrite.unrolled.linear import affine

TIME = "T"


def _einsum(node: gs.Node):
    equation = node.attrs.get("equation", "")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if "->" not in equation or "..." in equation:
        return None
    lhs, rhs = equation.split("->")
    return lhs.split(","), rhs


class _Factors:
    """Take a tensor apart into a product of (tensor, axis labels) factors."""

    def __init__(self, tl, shapes):
        self.tl = tl
        self.shapes = shapes

    def labels_for(self, t: gs.Tensor, out_labels: tuple, out_shape: tuple) -> tuple:
        """Labels of an operand broadcast (right-aligned) into an output with ``out_labels``."""
        shape = self.shapes.need_shape(t)
        offset = len(out_shape) - len(shape)
        if offset < 0:
            raise Decline(f"operand {t.name!r} has a higher rank than its product")
        # A size-1 axis broadcasts when the product is wider there; when both are 1 (B = 1) only
        # provenance tells: a tensor computed from constants alone has no batch axis at all.
        constant = self.tl.is_constant(t)
        return tuple(
            None if d == 1 and (out_shape[offset + i] != 1 or constant) else out_labels[offset + i]
            for i, d in enumerate(shape)
        )

    def split(self, t: gs.Tensor, labels: tuple) -> list[tuple[gs.Tensor, tuple]]:
        src = self.tl.slices.get(t.name)
        if src is not None:  # frame t of a whole-sequence tensor: the whole tensor, time labelled
            inner = list(labels)
            if src.keepdim:
                inner[src.axis] = TIME
            else:
                inner.insert(src.axis, TIME)
            return self.split(src.source, tuple(inner))
        node = producer(t)
        if node is None:
            return [(t, labels)]
        shape = self.shapes.shape(t)
        if node.op == "Einsum":
            terms = _einsum(node)
            if terms is not None:
                lhs, rhs = terms
                if set("".join(lhs)) <= set(rhs) and len(rhs) == len(labels):  # a pure product
                    mapping = dict(zip(rhs, labels))
                    found = []
                    for term, operand in zip(lhs, node.inputs):
                        found += self.split(operand, tuple(mapping[c] for c in term))
                    return found
        if node.op == "Mul" and shape is not None:
            found = []
            for operand in node.inputs:
                found += self.split(operand, self.labels_for(operand, labels, shape))
            return found
        if node.op == "Unsqueeze":
            axes = const_value(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")
            if axes is not None:
                # An axis the graph itself inserts has size 1 whatever the batch is: the factor is
                # constant along it, so its label (even "b" when B = 1 makes the sizes agree) goes.
                axes = {int(a) % len(labels) for a in np.asarray(axes).reshape(-1)}
                return self.split(node.inputs[0], tuple(lb for i, lb in enumerate(labels) if i not in axes))
        if node.op == "Expand" and shape is not None:
            inner = self.shapes.shape(node.inputs[0])
            if inner is not None and len(inner) == len(shape):
                return self.split(
                    node.inputs[0], tuple(None if d == 1 and shape[i] != 1 else labels[i] for i, d in enumerate(inner))
                )
        if node.op == "Cast" and self.shapes.dtype(node.inputs[0]) == self.shapes.dtype(t):
            return self.split(node.inputs[0], labels)
        if node.op == "Transpose":
            perm = list(node.attrs.get("perm", reversed(range(len(labels)))))
            inner = [None] * len(labels)
            for out_axis, in_axis in enumerate(perm):
                inner[in_axis] = labels[out_axis]
            return self.split(node.inputs[0], tuple(inner))
        if node.op == "Identity":
            return self.split(node.inputs[0], labels)
        return [(t, labels)]

    def exp_argument(self, t: gs.Tensor, labels: tuple):
        """The factors of E when ``t`` is (a frame of) exp(E)."""
        src = self.tl.slices.get(t.name)
        if src is not None:
            inner = list(labels)
            if src.keepdim:
                inner[src.axis] = TIME
            else:
                inner.insert(src.axis, TIME)
            return self.exp_argument(src.source, tuple(inner))
        node = producer(t)
        if node is not None and node.op == "Exp":
            return self.split(node.inputs[0], labels)
        return None


class SelectiveScanPass(UnrolledPass):
    name = "unrolled-selective-scan"
    op_type = "SelectiveScan"

    def accepts(self, chain: Chain, tl) -> bool:
        shape = tl.shapes.shape(chain.states[-1])
        if shape is None or len(shape) != 3:
            return False
        try:
            a_expr, _ = affine(chain.structural_links[0])
        except Decline:
            return False
        return (
            a_expr is not None
            and a_expr[0] == "leaf"
            and _Factors(tl, tl.shapes).exp_argument(a_expr[1], ("b", "d", "n")) is not None
        )

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:
        tl, shapes = lifter.tl, lifter.shapes
        state_shape = shapes.need_shape(chain.states[-1])
        if shapes.dtype(chain.states[-1]) != np.float32:
            raise Decline("the selective-scan state is not float32")
        bsz, dim, nstate = state_shape
        if chain.first_frame:
            raise Decline(f"the recurrence starts at frame {chain.first_frame}")
        state_labels = ("b", "d", "n")
        a_expr, b_expr = affine(chain.structural_links[0])
        if a_expr is None or a_expr[0] != "leaf" or b_expr is None or b_expr[0] != "leaf":
            raise Decline("h_t is not a_t ⊙ h_(t-1) + b_t with single-tensor a_t and b_t")
        fac = _Factors(tl, shapes)
        a_leaf, b_leaf = a_expr[1], b_expr[1]
        exponent = fac.exp_argument(a_leaf, fac.labels_for(a_leaf, state_labels, state_shape))
        if exponent is None:
            raise Decline("a_t is not exp(Δ_t ⊗ A)")
        b_factors = fac.split(b_leaf, fac.labels_for(b_leaf, state_labels, state_shape))

        def kind(labels):
            named = {lb for lb in labels if lb is not None}
            return frozenset(named - {TIME})

        deltas = [f for f in exponent if kind(f[1]) in ({"b", "d"}, {"d"})]
        a_mats = [f for f in exponent if kind(f[1]) == {"d", "n"}]
        if (
            len(exponent) != 2
            or len(deltas) != 1
            or len(a_mats) != 1
            or TIME in a_mats[0][1]
            or tl.time_of(a_mats[0][0])
        ):
            raise Decline("a_t is not exp(Δ_t[b,d] · A[d,n]) with A constant over time")
        delta, a_mat = deltas[0], a_mats[0]
        same_delta = [f for f in b_factors if f[1] == delta[1] and self._same(f[0], delta[0], lifter)]
        if not same_delta:
            raise Decline("b_t does not contain the Δ of a_t")
        rest = [f for f in b_factors if f is not same_delta[0]]
        # B_t is the product of the factors over n, x_t of those over d (silu(x) = x·σ(x) is two).
        b_in = [f for f in rest if "n" in kind(f[1]) and "d" not in kind(f[1])]
        x_in = [f for f in rest if "n" not in kind(f[1])]
        if not b_in or not any("d" in kind(f[1]) for f in x_in) or len(b_in) + len(x_in) != len(rest):
            raise Decline("b_t is not Δ_t[b,d] · B_t[b,n] · x_t[b,d] with the Δ of a_t")
        readouts, c_factor = self._readouts(chain, lifter, fac, state_shape)
        steps = chain.steps
        x = self._product(x_in, ("b", TIME, "d"), (bsz, steps, dim), lifter, emit)
        dt = self._materialize(delta, ("b", TIME, "d"), (bsz, steps, dim), lifter, emit)
        b_seq = self._product(b_in, ("b", TIME, "n"), (bsz, steps, nstate), lifter, emit)
        c_seq = self._materialize(c_factor, ("b", TIME, "n"), (bsz, steps, nstate), lifter, emit)
        a_dn = self._materialize(a_mat, ("d", "n"), (dim, nstate), lifter, emit)
        h0 = chain.states[0]
        h0_value = const_value(h0)
        h0_in = None if h0_value is not None and not np.any(h0_value) else h0
        if h0_in is not None and shapes.shape(h0) != state_shape:
            h0_in = emit.expand(h0_in, state_shape, np.float32)
        y = gs.Variable(ctx.unique_name("selective_scan_y"), dtype=np.float32, shape=[bsz, steps, dim])
        h_last = gs.Variable(ctx.unique_name("selective_scan_h_last"), dtype=np.float32, shape=list(state_shape))
        node = make_framefuse_node(
            graph,
            ctx,
            "SelectiveScan",
            [x, dt, a_dn, b_seq, c_seq, None, None, None, h0_in],
            [y, h_last],
            {"delta_softplus": 0},
        )
        emit.new_nodes.append(node)
        for i, (form, readout) in enumerate(readouts):
            y_i = emit.gather(y, i, 1, (bsz, dim), np.float32)
            if form == "matmul":  # h @ C[..., None] keeps a trailing size-1 axis
                y_i = emit.unsqueeze(y_i, [2], (bsz, dim, 1), np.float32)
            replace_producer(readout, y_i, graph, emit)
        replace_producer(chain.states[-1], h_last, graph, emit)
        return {
            "node": node,
            "steps": steps,
            "state_shape": list(state_shape),
            "absorbed": ["discretisation", "C read-out"],
        }

    @staticmethod
    def _same(a, b, lifter) -> bool:
        if a.name == b.name:
            return True
        try:
            return lifter.key(a) == lifter.key(b)
        except Decline:
            return False

    def _readouts(self, chain, lifter, fac, state_shape):
        """y_t = Σ_n h_t[b,d,n] C_t[b,n] for every h_t, and the C factor of step 0. Written as an
        Einsum (``bdn,bn->bd``) or as a MatMul by a column (``h @ C_t[..., None]`` → [b,d,1], as
        transformers' Mamba slow path does), possibly after casts of h to its own type."""
        link_nodes = {id(n) for link in chain.links for n in link.nodes()}
        shapes = lifter.shapes
        bsz, _, nstate = state_shape
        readouts, c_factors = [], []
        for i, state in enumerate(chain.states[1:], start=1):
            if i < len(chain.states) - 1 and state in lifter.tl.graph.outputs:
                raise Decline(f"intermediate state {state.name!r} is a graph output")
            found = None
            for node, h in self._state_readers(state, link_nodes, shapes):
                if found is not None:
                    raise Decline(f"state {state.name!r} has a second read-out ({node.op} node {node.name!r})")
                terms = _einsum(node) if node.op == "Einsum" else None
                if node.op == "MatMul" and len(node.inputs) == 2 and node.inputs[0] is h:
                    c = node.inputs[1]
                    c_shape = shapes.shape(c)
                    if c_shape is None or len(c_shape) not in (2, 3) or c_shape[-2:] != (nstate, 1):
                        raise Decline(
                            f"MatMul {node.name!r} multiplies the state by {c.name!r} {c_shape}, not by a "
                            f"column C_t[..., {nstate}, 1]"
                        )
                    batch = (
                        ()
                        if len(c_shape) == 2
                        else (("b" if c_shape[0] == bsz and not (bsz != 1 and c_shape[0] == 1) else None),)
                    )
                    found = ("matmul", node.outputs[0])
                    c_factors.append((c, (*batch, "n", None)))
                    continue
                if terms is None or len(node.inputs) != 2 or node.inputs[0] is not h:
                    raise Decline(
                        f"state {state.name!r} is read by {node.op} node {node.name!r}, not only by "
                        "the next step and the read-out Σ_n h[b,d,n] C[b,n]"
                    )
                (h_term, c_term), out_term = terms
                if len(h_term) != 3 or out_term != h_term[:2] or set(c_term) != {h_term[0], h_term[2]}:
                    raise Decline(f"Einsum {node.name!r} ({','.join(terms[0])}->{out_term}) is not Σ_n h[b,d,n] C[b,n]")
                mapping = dict(zip(h_term, ("b", "d", "n")))
                found = ("einsum", node.outputs[0])
                c_factors.append((node.inputs[1], tuple(mapping[c] for c in c_term)))
            if found is None:
                raise Decline(f"state {state.name!r} has no read-out Σ_n h C")
            readouts.append(found)
        if len({(lifter.key(c), lb) for c, lb in c_factors}) != 1:
            raise Decline("the read-outs use different C at different steps")
        return readouts, c_factors[0]

    @staticmethod
    def _state_readers(state, link_nodes, shapes):
        """(node, tensor it reads) for every reader of ``state`` outside the chain, looking through
        casts of h to its own type and Identity nodes."""
        stack = [state]
        while stack:
            t = stack.pop()
            for node in t.outputs:
                if id(node) in link_nodes:
                    continue
                if node.op == "Identity" or node.op == "Cast" and shapes.dtype(node.outputs[0]) == shapes.dtype(t):
                    stack.append(node.outputs[0])
                    continue
                yield node, t

    def _product(self, factors, want, full, lifter, emit) -> gs.Tensor:
        result = None
        for factor in factors:
            value = self._materialize(factor, want, full, lifter, emit)
            result = value if result is None else emit.node("Mul", [result, value], full, np.float32)
        return result

    def _materialize(self, factor, want: tuple, full: tuple, lifter, emit) -> gs.Tensor:
        """The factor laid out as ``want`` (labels) and broadcast to ``full``."""
        tensor, labels = factor
        shapes = lifter.shapes
        if TIME not in labels and lifter.tl.time_of(tensor):  # a per-step tensor: lift it
            tensor, labels = lifter.lift(tensor), (TIME, *labels)
            shape = (lifter.steps, *shapes.need_shape(factor[0]))
        else:
            shape = shapes.need_shape(tensor)
        if TIME in labels and shape[labels.index(TIME)] != lifter.steps:
            raise Decline(f"{tensor.name!r} has {shape[labels.index(TIME)]} frames, the recurrence {lifter.steps}")
        keep = [i for i, lb in enumerate(labels) if lb is not None]
        if len(keep) != len(labels):  # drop size-1 broadcast axes
            drop = [i for i in range(len(labels)) if i not in keep]
            shape = tuple(shape[i] for i in keep)
            tensor = emit.node("Squeeze", [tensor, emit.ints(drop)], shape, np.float32)
            labels = tuple(labels[i] for i in keep)
        if any(lb not in want for lb in labels):
            raise Decline(f"{tensor.name!r} has axes {labels}, expected a subset of {want}")
        order = [lb for lb in want if lb in labels]
        perm = [labels.index(lb) for lb in order]
        tensor = emit.transpose(tensor, perm, tuple(shape[p] for p in perm), np.float32)
        missing = [i for i, lb in enumerate(want) if lb not in labels]
        if missing:
            tensor = emit.unsqueeze(tensor, missing, None, np.float32)
        if shapes.dtype(factor[0]) not in (None, np.float32):
            tensor = emit.node("Cast", [tensor], None, np.float32, attrs={"to": 1})
        return emit.expand(tensor, full, np.float32)
