"""MLSTMScan from an unrolled xLSTM mLSTM cell (stabilised exponential gating).

Found from its stabiliser chain m_t = max(logσ(f_t) + m_{t−1}, i_t) (a loop-carried chain of its
own); each step must then have exactly, with f' = exp(logσ(f_t) + m_{t−1} − m_t) and
i' = exp(i_t − m_t) broadcast over the trailing axes:

    C_t = f'·C_{t−1} + i'·(v_t ⊗ k_t)      n_t = f'·n_{t−1} + i'·k_t
    h_t = (C_t q_t) / (max(|n_t · q_t|, exp(−m_t)) + ε)     (ε a scalar constant, 0 when absent)

(commutative operand orders accepted; logσ as Log(Sigmoid(f)) or −Softplus(−f)). Two layouts:
the [B, H] one above (m [B, H], C = v⊗k [Dv, Dk], C q and Σ n·q) and transformers' xLSTM
(`mlstm_recurrent_step_native`: m [B, H, 1], C = k⊗v [Dk, Dv] as MatMul(k[..., None], v[..., None, :]),
read-outs qᵀC and qᵀn as MatMuls), whose C is transposed into and out of the op. Casts to the
float32 the state already is (`.to(dtype_state)`) are seen through. The read-outs h_t become the
op's output h, the last C, n, m its final states. Anything else is declined with the part that
did not match.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, make_framefuse_node
from framefuse.rewrite.unrolled.chains import Chain
from framefuse.rewrite.unrolled.common import UnrolledPass, lift_leaf
from framefuse.rewrite.unrolled.graphutil import const_value, producer, replace_producer
from framefuse.rewrite.unrolled.match import op, pairs

_BCAST = ("Unsqueeze", "Reshape")


def _node(t: gs.Tensor, op_type: str):
    node = producer(t)
    return node if node is not None and node.op == op_type else None


def _both(t: gs.Tensor, op_type: str):
    """Operand pairs (both orders) of the binary op producing ``t``."""
    node = _node(t, op_type)
    if node is None or len(node.inputs) != 2:
        return []
    a, b = node.inputs
    return [(a, b), (b, a)]


def _is_identity_cast(node) -> bool:
    """A Cast to float32 of a float32 tensor (transformers' `.to(dtype_state)`): a no-op."""
    return (
        node is not None
        and node.op == "Cast"
        and node.attrs.get("to") == onnx.TensorProto.FLOAT
        and node.inputs[0].dtype == np.float32
    )


def _uncast(t: gs.Tensor) -> gs.Tensor:
    """``t`` before the identity Casts that produced it."""
    node = producer(t)
    while _is_identity_cast(node):
        t = node.inputs[0]
        node = producer(t)
    return t


def _consumers(t: gs.Tensor):
    """The nodes reading ``t`` directly or through identity Casts (those Casts excluded)."""
    for node in list(t.outputs):
        if _is_identity_cast(node):
            yield from _consumers(node.outputs[0])
        else:
            yield node


def _strip(t: gs.Tensor) -> gs.Tensor:
    """``t`` before the Unsqueeze/Reshape that broadcast it (f'[..., None, None] → f') and the
    identity Casts around them."""
    t = _uncast(t)
    node = producer(t)
    while node is not None and node.op in _BCAST:
        t = _uncast(node.inputs[0])
        node = producer(t)
    return t


def _same(a: gs.Tensor, b: gs.Tensor) -> bool:
    return a.name == b.name


def _same_value(a: gs.Tensor, b: gs.Tensor) -> bool:
    """The same tensor up to identity Casts."""
    return _uncast(a).name == _uncast(b).name


class _Keys:
    def __init__(self, lifter):
        self.lifter = lifter

    def same(self, a: gs.Tensor, b: gs.Tensor) -> bool:
        if a.name == b.name:
            return True
        try:
            return self.lifter.key(a) == self.lifter.key(b)
        except Decline:
            return False


def _logsigmoid_arg(t: gs.Tensor):
    """f when ``t`` = logσ(f): Log(Sigmoid(f)) or Neg(Softplus(Neg(f)))."""
    log = _node(t, "Log")
    if log is not None:
        sig = _node(log.inputs[0], "Sigmoid")
        return sig.inputs[0] if sig is not None else None
    neg = _node(t, "Neg")
    if neg is not None:
        sp = _node(neg.inputs[0], "Softplus")
        inner = _node(sp.inputs[0], "Neg") if sp is not None else None
        return inner.inputs[0] if inner is not None else None
    return None


class MLSTMScanPass(UnrolledPass):
    name = "unrolled-mlstm-scan"
    op_type = "MLSTMScan"

    def accepts(self, chain: Chain, tl) -> bool:
        return op(chain.structural_links[0]) == "Max"

    # -- the stabiliser ---------------------------------------------------------------------------
    def _match_m(self, link):
        for added, i_pre in pairs(link, "Max"):
            for logf, hole in pairs(added, "Add"):
                if hole.kind == "hole" and logf.kind == "leaf" and i_pre.kind == "leaf":
                    return logf.tensor, i_pre.tensor, added.tensor
        return None

    def _gate(self, m_new, numerator_ok, keys):
        """exp(X − m_new) for the X that ``numerator_ok`` accepts."""
        for node in _consumers(m_new):
            if node.op == "Sub" and _same_value(node.inputs[1], m_new) and numerator_ok(node.inputs[0]):
                for consumer in node.outputs[0].outputs:
                    if consumer.op == "Exp":
                        return consumer.outputs[0]
        return None

    def _update(self, f_act, i_act, rank, shapes, state_shape):
        """new = bcast(f')·old + bcast(i')·Y with ``old`` of the state's shape; (new, old, Y)."""
        seen = set()
        stack = [f_act]
        while stack:  # f' and its broadcast versions
            t = stack.pop()
            for node in t.outputs:
                if node.op in _BCAST:
                    stack.append(node.outputs[0])
                elif node.op == "Mul" and id(node) not in seen:
                    seen.add(id(node))
                    other = node.inputs[1] if _same(node.inputs[0], t) else node.inputs[0]
                    if shapes.shape(other) != state_shape:
                        continue
                    for add in node.outputs[0].outputs:
                        if add.op != "Add" or shapes.shape(add.outputs[0]) != state_shape:
                            continue
                        rest = add.inputs[1] if _same(add.inputs[0], node.outputs[0]) else add.inputs[0]
                        for gate, y in _both(rest, "Mul"):
                            if _same(_strip(gate), i_act):
                                return add.outputs[0], other, y
        return None

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:
        shapes = lifter.shapes
        keys = _Keys(lifter)
        m_shape = shapes.need_shape(chain.states[-1])
        if shapes.dtype(chain.states[-1]) != np.float32:
            raise Decline("the mLSTM state is not float32 (lower the precision after the rewrite)")
        # transformers keeps m (and the gates) as [B, H, 1]; the op's are [B, H].
        keepdim = len(m_shape) == 3 and m_shape[2] == 1
        if len(m_shape) != 2 and not keepdim:
            raise Decline(f"mLSTM stabiliser m must be [B, H] or [B, H, 1], got {m_shape}")
        b, h = m_shape[:2]
        steps = chain.steps
        per_step = {"q": [], "k": [], "v": [], "i": [], "logf": []}
        c_states, n_states, readouts, epsilons, layouts = [], [], [], [], []
        c_prev = n_prev = None
        for i, link in enumerate(chain.links):
            m_old, m_new = chain.states[i], chain.states[i + 1]
            found = self._match_m(link) if not (chain.folded_first and i == 0) else None
            if found is None:
                raise Decline("the stabiliser is not m_t = max(logσ(f_t) + m_(t-1), i_t)")
            logf, i_pre, added = found

            def is_f_arg(x, logf=logf, m_old=m_old, added=added):  # logσ(f) + m_(t-1)
                return _same(x, added) or any(keys.same(p, logf) and _same_value(q, m_old) for p, q in _both(x, "Add"))

            f_act = self._gate(m_new, is_f_arg, keys)
            i_act = self._gate(m_new, lambda x, i_pre=i_pre: keys.same(x, i_pre), keys)
            if f_act is None or i_act is None:
                raise Decline(f"step {i}: no gates f' = exp(logσ(f) + m_(t-1) − m_t), i' = exp(i − m_t)")
            c_found = n_found = None
            # C (rank 4) and n (rank 3) updates, found from the gates.
            for candidate_shape in self._state_shapes(f_act, shapes, b, h):
                hit = self._update(f_act, i_act, len(candidate_shape), shapes, candidate_shape)
                if hit is None:
                    continue
                if len(candidate_shape) == 4 and c_found is None:
                    c_found = hit
                elif len(candidate_shape) == 3 and n_found is None:
                    n_found = hit
            if c_found is None or n_found is None:
                raise Decline(f"step {i}: no C_t = f'·C + i'·v⊗k and n_t = f'·n + i'·k updates")
            c_new, c_old, outer = c_found
            n_new, n_old, k_n = n_found
            carried = (c_prev is None or _same_value(c_old, c_prev)) and (n_prev is None or _same_value(n_old, n_prev))
            if not carried:
                raise Decline(f"step {i}: C/n are not carried from the previous step")
            v_t, k_t, transposed = self._outer(outer, k_n, shapes, keys, (b, h, *shapes.need_shape(c_new)[2:]), i)
            dv, dk = shapes.need_shape(c_new)[2:][::-1] if transposed else shapes.need_shape(c_new)[2:]
            readout, q_t, eps = self._readout(c_new, n_new, m_new, shapes, keys, (b, h, dv, dk), transposed)
            layouts.append(transposed)
            per_step["q"].append(q_t)
            per_step["k"].append(k_t)
            per_step["v"].append(v_t)
            per_step["i"].append(i_pre)
            per_step["logf"].append(logf)
            c_states.append((c_old, c_new))
            n_states.append((n_old, n_new))
            readouts.append(readout)
            epsilons.append(eps)
            c_prev, n_prev = c_new, n_new
        for name, tensors in per_step.items():
            if len({lifter.key(t) for t in tensors}) != 1:
                raise Decline(f"the per-step {name} is not the same computation at every step")
        if len(set(layouts)) != 1:
            raise Decline("the C layout (v⊗k or k⊗v) differs between steps")
        transposed = layouts[0]
        if len(set(epsilons)) != 1:
            raise Decline(f"the read-out's ε differs between steps ({sorted(set(epsilons))}); MLSTMScan has one eps")
        for state in [c for _, c in c_states[:-1]] + [n for _, n in n_states[:-1]] + chain.states[1:-1]:
            if state in graph.outputs:
                raise Decline(f"intermediate state {state.name!r} is a graph output")

        def heads_major(leaf, tail):  # [T, B, H, *tail] -> [B, H, T, *tail]
            lifted, _ = lift_leaf(lifter, emit, leaf)
            rank = 3 + len(tail)
            return emit.transpose(lifted, [1, 2, 0, *range(3, rank)], (b, h, steps, *tail), np.float32)

        def gate(leaf):  # [B, H, T]; transformers' [B, H, 1] gates lose their unit axis
            if not keepdim:
                return heads_major(leaf, ())
            return emit.reshape(heads_major(leaf, (1,)), (b, h, steps), np.float32)

        q = heads_major(per_step["q"][0], (dk,))
        k = heads_major(per_step["k"][0], (dk,))
        v = heads_major(per_step["v"][0], (dv,))
        i_gate = gate(per_step["i"][0])
        f_gate = gate(self._f_pre(per_step["logf"][0], lifter, emit))

        def initial(t, shape):
            value = const_value(t)
            if value is not None and not np.any(value):
                return None
            return emit.expand(t, shape, np.float32) if shapes.shape(t) != shape else t

        if transposed:  # C kept as [Dk, Dv]: the op's C0 is its transpose
            c0 = initial(c_states[0][0], (b, h, dk, dv))
            c0 = None if c0 is None else emit.transpose(c0, [0, 1, 3, 2], (b, h, dv, dk), np.float32)
        else:
            c0 = initial(c_states[0][0], (b, h, dv, dk))
        n0 = initial(n_states[0][0], (b, h, dk))
        if keepdim:
            m0 = initial(chain.states[0], (b, h, 1))
            m0 = None if m0 is None else emit.reshape(m0, (b, h), np.float32)
        else:
            m0 = initial(chain.states[0], (b, h))
        outs = [
            gs.Variable(ctx.unique_name(f"mlstm_{n}"), dtype=np.float32, shape=list(s))
            for n, s in (
                ("h", (b, h, steps, dv)),
                ("C_last", (b, h, dv, dk)),
                ("n_last", (b, h, dk)),
                ("m_last", (b, h)),
            )
        ]
        # eps only when the model has one, so graphs without it keep the attribute-free node.
        attrs = {"eps": epsilons[0]} if epsilons[0] != 0.0 else {}
        node = make_framefuse_node(graph, ctx, "MLSTMScan", [q, k, v, i_gate, f_gate, c0, n0, m0], outs, attrs)
        emit.new_nodes.append(node)
        for i, readout in enumerate(readouts):
            replace_producer(readout, emit.gather(outs[0], i, 2, (b, h, dv), np.float32), graph, emit)
        c_last = emit.transpose(outs[1], [0, 1, 3, 2], (b, h, dk, dv), np.float32) if transposed else outs[1]
        m_last = emit.reshape(outs[3], (b, h, 1), np.float32) if keepdim else outs[3]
        replace_producer(c_states[-1][1], c_last, graph, emit)
        replace_producer(n_states[-1][1], outs[2], graph, emit)
        replace_producer(chain.states[-1], m_last, graph, emit)
        detail = {"node": node, "steps": steps, "state_shape": [b, h, dv, dk]}
        if transposed or keepdim:  # reported only when not the op's own layout
            detail["layout"] = f"m {'[B, H, 1]' if keepdim else '[B, H]'}, C = {'k⊗v' if transposed else 'v⊗k'}"
        return detail

    def _outer(self, outer, k_n, shapes, keys, c_shape, i):
        """(v_t, k_t, transposed) of the C update's outer product: v⊗k ([Dv, Dk]) as a broadcast
        Mul of v[..., None] and k[..., None, :], or k⊗v ([Dk, Dv], transposed) as transformers'
        MatMul(k[..., None], v[..., None, :]) (or a Mul); which factor is k is decided by n's key."""
        b, h, rows, cols = c_shape
        node = producer(outer)
        if node is None or node.op not in ("Mul", "MatMul") or len(node.inputs) != 2:
            raise Decline(f"step {i}: the C update's input is not an outer product of v_t and k_t")
        orders = [tuple(node.inputs)] if node.op == "MatMul" else _both(outer, "Mul")
        for col, row in orders:  # col [B, H, rows, 1], row [B, H, 1, cols]
            if shapes.shape(col) != (b, h, rows, 1) or shapes.shape(row) != (b, h, 1, cols):
                continue
            col_u, row_u = _node(_uncast(col), "Unsqueeze"), _node(_uncast(row), "Unsqueeze")
            if col_u is None or row_u is None:
                continue
            col_t, row_t = col_u.inputs[0], row_u.inputs[0]
            if keys.same(row_t, k_n):
                return col_t, row_t, False
            if keys.same(col_t, k_n):
                return row_t, col_t, True
            raise Decline(f"step {i}: C and n are updated with different keys")
        raise Decline(f"step {i}: the C update's input is not v_t ⊗ k_t (nor k_t ⊗ v_t)")

    def _state_shapes(self, f_act, shapes, b, h):
        """The shapes of the states that f' gates (via its broadcast Muls)."""
        found = []
        stack = [f_act]
        while stack:
            t = stack.pop()
            for node in t.outputs:
                if node.op in _BCAST:
                    stack.append(node.outputs[0])
                elif node.op == "Mul":
                    shape = shapes.shape(node.outputs[0])
                    if shape and shape[:2] == (b, h) and len(shape) in (3, 4) and shape not in found:
                        found.append(shape)
        return found

    def _readout(self, c_new, n_new, m_new, shapes, keys, dims, transposed):
        """h_t = (C_t q_t) / (max(|n_t·q_t|, exp(−m_t)) + ε): (h_t, q_t, ε). C_t q_t is
        MatMul(C, q[..., None]) for C [Dv, Dk], MatMul(q[..., None, :], C) for C [Dk, Dv]."""
        b, h, dv, dk = dims
        for node in _consumers(c_new):
            if node.op != "MatMul":
                continue
            if transposed:
                q_vec, c_in, q_shape = node.inputs[0], node.inputs[1], (b, h, 1, dk)
            else:
                c_in, q_vec, q_shape = node.inputs[0], node.inputs[1], (b, h, dk, 1)
            unsq = _node(_uncast(q_vec), "Unsqueeze")
            if not _same_value(c_in, c_new) or unsq is None or shapes.shape(q_vec) != q_shape:
                continue
            q_t = unsq.inputs[0]
            for sq in _consumers(node.outputs[0]):
                if sq.op != "Squeeze" or shapes.shape(sq.outputs[0]) != (b, h, dv):
                    continue
                for div in _consumers(sq.outputs[0]):
                    if div.op != "Div" or not _same_value(div.inputs[0], sq.outputs[0]):
                        continue
                    if shapes.shape(div.inputs[1]) != (b, h, 1):  # one denominator per (b, h)
                        continue
                    den, eps = self._split_eps(_strip(div.inputs[1]))
                    for absval, floor in _both(den, "Max"):
                        ab = _node(_uncast(absval), "Abs")
                        ex = _node(_uncast(floor), "Exp")
                        neg = _node(ex.inputs[0], "Neg") if ex is not None else None
                        if ab is None or neg is None or not _same_value(neg.inputs[0], m_new):
                            continue
                        if self._is_nq(ab.inputs[0], n_new, q_t, shapes, keys, (b, h, dk)):
                            return div.outputs[0], q_t, eps
        raise Decline("no read-out h_t = (C_t q_t) / (max(|n_t·q_t|, exp(−m_t)) [+ ε]) of the state")

    @staticmethod
    def _is_nq(dot, n_new, q_t, shapes, keys, dims) -> bool:
        """``dot`` = n_t·q_t per (b, h): ReduceSum(n·q) over the last axis ([B, H]) or the
        Squeeze of MatMul(q[..., None, :], n[..., None]) (either factor first; [B, H, 1])."""
        b, h, dk = dims
        dot = _uncast(dot)
        red = _node(dot, "ReduceSum")
        if red is not None:
            return shapes.shape(dot) == (b, h) and any(
                _same_value(x, n_new) and keys.same(y, q_t) for x, y in _both(red.inputs[0], "Mul")
            )
        sq = _node(dot, "Squeeze")
        mm = _node(_uncast(sq.inputs[0]), "MatMul") if sq is not None else None
        if mm is None or shapes.shape(dot) not in ((b, h, 1), (b, h)):
            return False
        row, col = mm.inputs
        if shapes.shape(row) != (b, h, 1, dk) or shapes.shape(col) != (b, h, dk, 1):
            return False
        row_u, col_u = _node(_uncast(row), "Unsqueeze"), _node(_uncast(col), "Unsqueeze")
        if row_u is None or col_u is None:
            return False
        r, c = row_u.inputs[0], col_u.inputs[0]
        return (keys.same(r, q_t) and _same_value(c, n_new)) or (_same_value(r, n_new) and keys.same(c, q_t))

    @staticmethod
    def _split_eps(den: gs.Tensor) -> tuple[gs.Tensor, float]:
        """(max, ε) when ``den`` = max + ε with ε a scalar constant (transformers' xLSTM adds 1e-6);
        (den, 0.0) otherwise (the Max match that follows then decides)."""
        for x, c in _both(den, "Add"):
            value = const_value(c)
            if value is not None and value.size == 1 and _node(x, "Max") is not None:
                return x, float(value.reshape(-1)[0])
        return den, 0.0

    def _f_pre(self, logf: gs.Tensor, lifter, emit) -> gs.Tensor:
        """The per-step f_pre whose logσ the step uses (MLSTMScan applies logσ itself)."""
        arg = _logsigmoid_arg(logf)
        if arg is not None:
            return arg
        node = producer(logf)
        whole = _logsigmoid_arg(node.inputs[0]) if node is not None and node.op == "Gather" else None
        if whole is None:
            raise Decline(f"the forget gate {logf.name!r} is not logσ(f_pre)")
        # logf_t = Gather(logσ(F), t): the same frame of F.
        sliced = emit.node(
            "Gather", [whole, node.inputs[1]], lifter.shapes.shape(logf), np.float32, attrs=dict(node.attrs)
        )
        src = lifter.tl.slices.get(logf.name)
        if src is not None:
            lifter.tl.slices[sliced.name] = type(src)(whole, src.axis, src.time, src.keepdim)
            lifter.tl.times[sliced.name] = frozenset({src.time})
        return sliced
