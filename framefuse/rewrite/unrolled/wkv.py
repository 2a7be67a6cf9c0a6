"""WKVScan from an unrolled RWKV-4 WKV recurrence (transformers' `rwkv_linear_attention_cpu`).

Each step must be, with p the running max, num/den the scaled numerator/denominator, w and u
tensors that do not depend on time and k_t, v_t per-step inputs (commutative operand orders
accepted; one computation written twice, as exporters do, counts as one):

    q = max(p, k_t + u);  y_t = (exp(p − q)·num + exp(k_t + u − q)·v_t) / (exp(p − q)·den + exp(k_t + u − q))
    p' = max(p + w, k_t); num' = exp(p + w − p')·num + exp(k_t − p')·v_t;  den' = exp(p + w − p')·den + exp(k_t − p')

Steps are found from their read-outs y_t (the Div) and chained through (p, num, den): step t+1
reads exactly the p', num', den' of step t. The last step's state update may be absent (the final
state unused). The read-outs become the op's y, the last p', num', den' its final states. Loops
that do not have this exact form are left alone; a chain of such steps that cannot be fused
(intermediate states read elsewhere, inputs not the same computation at every step, shapes) is
declined with the reason.

This pass finds its steps itself instead of from ``chains.find_chains``: the loop-carried tensor
that the chain finder picks depends on how the exporter shared p + w between uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.plugins.wkv_scan.schema import MAX_INIT
from framefuse.rewrite.base import Decline, Declined, Match, PassResult, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.common import MAX_ROUNDS, UnrolledPass, _discard, lift_leaf, restack
from framefuse.rewrite.unrolled.graphutil import const_value, producer, replace_producer
from framefuse.rewrite.unrolled.lift import Lifter, node_key
from framefuse.rewrite.unrolled.timeline import Timeline

F32 = np.float32


def _prod(t: gs.Tensor, op_type: str, shapes=None):
    """The ``op_type`` node producing ``t``, looking through Identity and same-type Casts."""
    node = producer(t)
    while (
        node is not None
        and node.inputs
        and (
            node.op == "Identity"
            or (
                node.op == "Cast"
                and shapes is not None
                and shapes.dtype(node.inputs[0]) is not None
                and shapes.dtype(node.inputs[0]) == shapes.dtype(t)
            )
        )
    ):
        t = node.inputs[0]
        node = producer(t)
    return node if node is not None and node.op == op_type else None


def _time_slice(t: gs.Tensor, shapes):
    """(X, i) when ``t`` is (a Cast/Identity of) Gather(X, i, axis=1) with a constant scalar i and
    X [B, T, C]: frame i of a whole-sequence tensor, whatever the frames X itself depends on (the
    output of an earlier, unfused layer reads every frame)."""
    node = producer(t)
    while node is not None and node.op in ("Cast", "Identity") and node.inputs:
        node = producer(node.inputs[0])
    if node is None or node.op != "Gather" or len(node.inputs) != 2:
        return None
    index = const_value(node.inputs[1])
    x_shape = shapes.shape(node.inputs[0])
    if index is None or index.ndim != 0 or x_shape is None or len(x_shape) != 3:
        return None
    if int(node.attrs.get("axis", 0)) % 3 != 1:
        return None
    return node.inputs[0], int(index) % x_shape[1]


class _Same:
    """Whether two tensors hold the same computation: the same tensor, per-step tensors with the
    same time-free key, equal constants, or (for state-dependent values the exporter wrote twice,
    e.g. p + w) the same op on the same inputs."""

    def __init__(self, lifter: Lifter):
        self.lifter = lifter
        self._memo: dict[tuple[str, str], bool] = {}

    def __call__(self, a: gs.Tensor, b: gs.Tensor, depth: int = 4) -> bool:
        if a is b or (a.name and a.name == b.name):
            return True
        memo_key = (a.name, b.name)
        if memo_key in self._memo:
            return self._memo[memo_key]
        result = False
        va, vb = const_value(a), const_value(b)
        if va is not None or vb is not None:
            result = va is not None and vb is not None and va.shape == vb.shape and np.array_equal(va, vb)
        else:
            try:
                result = self.lifter.key(a) == self.lifter.key(b)
            except Decline:
                result = False
            if not result and depth > 0:
                na, nb = producer(a), producer(b)
                result = (
                    na is not None
                    and nb is not None
                    and node_key(na) == node_key(nb)
                    and len(na.inputs) == len(nb.inputs)
                    and na.outputs.index(a) == nb.outputs.index(b)
                    and all(self(x, y, depth - 1) for x, y in zip(na.inputs, nb.inputs))
                )
        self._memo[memo_key] = result
        return result


@dataclass
class WKVStep:
    y: gs.Tensor
    p_old: gs.Tensor
    num_old: gs.Tensor
    den_old: gs.Tensor
    k: gs.Tensor
    v: gs.Tensor
    u: gs.Tensor
    frame: int
    nodes: list[gs.Node] = field(default_factory=list)
    # the state update (absent on a last step whose final state is unused)
    w: gs.Tensor | None = None
    p_new: gs.Tensor | None = None
    num_new: gs.Tensor | None = None
    den_new: gs.Tensor | None = None
    folded_pw: gs.Tensor | None = None  # a constant p + w the exporter folded (w then from other steps)


class WKVScanPass(UnrolledPass):
    name = "unrolled-wkv-scan"
    op_type = "WKVScan"

    # -- matching -----------------------------------------------------------------------------
    def _both(self, t, op_type):
        node = _prod(t, op_type, self.shapes)
        if node is None or len(node.inputs) != 2:
            return []
        a, b = node.inputs
        return [(a, b, node), (b, a, node)]

    def _exp_sub(self, t):
        """(a, b, nodes) when ``t`` = exp(a − b)."""
        ex = _prod(t, "Exp", self.shapes)
        sub = _prod(ex.inputs[0], "Sub", self.shapes) if ex is not None else None
        if sub is None:
            return None
        return sub.inputs[0], sub.inputs[1], [ex, sub]

    def _frame(self, t: gs.Tensor, tl: Timeline) -> int | None:
        """The frame a per-step input reads: its time-axis slice index, else its single timeline frame."""
        sliced = _time_slice(t, self.shapes)
        if sliced is not None:
            return sliced[1]
        times = tl.time_of(t)
        return next(iter(times)) if len(times) == 1 else None

    def _match_output(self, y: gs.Tensor, tl: Timeline):
        div = _prod(y, "Div", self.shapes)
        if div is None:
            return None
        same = self.same
        numer, denom = div.inputs
        for a1, a2, add_n in self._both(numer, "Add"):
            for e1, num_old, mul1 in self._both(a1, "Mul"):
                es = self._exp_sub(e1)
                if es is None:
                    continue
                p_old, q, e1_nodes = es
                for pp, ku, mx in self._both(q, "Max"):
                    if not same(pp, p_old):
                        continue
                    for k_t, u, add_ku in self._both(ku, "Add"):
                        if tl.time_of(u) or self._frame(k_t, tl) is None:
                            continue
                        for e2, v_t, mul2 in self._both(a2, "Mul"):
                            es2 = self._exp_sub(e2)
                            if es2 is None or not same(es2[1], q) or not same(es2[0], ku):
                                continue
                            if self._frame(v_t, tl) != self._frame(k_t, tl):
                                continue
                            for b1, b2, add_d in self._both(denom, "Add"):
                                if not same(b2, e2):
                                    continue
                                for e1b, den_old, mul3 in self._both(b1, "Mul"):
                                    if same(e1b, e1):
                                        nodes = [div, add_n, mul1, *e1_nodes, mx, add_ku, mul2, *es2[2], add_d, mul3]
                                        for extra in (producer(es2[0]), producer(e1b), producer(b2)):
                                            if extra is not None:
                                                nodes.append(extra)
                                        frame = self._frame(k_t, tl)
                                        return WKVStep(y, p_old, num_old, den_old, k_t, v_t, u, frame, nodes)
        return None

    def _match_update(self, step: WKVStep, max_nodes, tl: Timeline) -> bool:
        same = self.same
        for mx in max_nodes:
            for a, kk in ((mx.inputs[0], mx.inputs[1]), (mx.inputs[1], mx.inputs[0])):
                if not same(kk, step.k):
                    continue
                # p + w, or its value when the exporter folded a constant first p + w
                folded = const_value(a) is not None and const_value(step.p_old) is not None
                options = (
                    [(None, None)]
                    if folded
                    else [
                        (w, add_w)
                        for pp, w, add_w in self._both(a, "Add")
                        if not tl.time_of(w) and same(pp, step.p_old)
                    ]
                )
                for w, add_w in options:
                    p_new = mx.outputs[0]
                    e1 = e2 = None
                    nodes = [mx, add_w] if add_w is not None else [mx]
                    for sub in p_new.outputs:
                        if sub.op != "Sub" or sub.inputs[1] is not p_new:
                            continue
                        exps = [n for n in sub.outputs[0].outputs if n.op == "Exp"]
                        if not exps:
                            continue
                        if e1 is None and same(sub.inputs[0], a):
                            e1 = exps[0].outputs[0]
                            nodes += [sub, exps[0], producer(sub.inputs[0])]
                        elif e2 is None and same(sub.inputs[0], step.k):
                            e2 = exps[0].outputs[0]
                            nodes += [sub, exps[0]]
                    if e1 is None or e2 is None:
                        continue
                    num_new = den_new = None
                    for mul in e1.outputs:
                        if mul.op != "Mul":
                            continue
                        old = mul.inputs[1] if mul.inputs[0] is e1 else mul.inputs[0]
                        for add in mul.outputs[0].outputs:
                            if add.op != "Add":
                                continue
                            rest = add.inputs[1] if add.inputs[0] is mul.outputs[0] else add.inputs[0]
                            if (
                                num_new is None
                                and same(old, step.num_old)
                                and any(same(e, e2) and same(v, step.v) for e, v, _ in self._both(rest, "Mul"))
                            ):
                                num_new = add.outputs[0]
                                nodes += [mul, add, producer(rest)]
                            elif den_new is None and same(old, step.den_old) and same(rest, e2):
                                den_new = add.outputs[0]
                                nodes += [mul, add]
                    if num_new is None or den_new is None:
                        continue
                    step.w, step.p_new, step.num_new, step.den_new = w, p_new, num_new, den_new
                    step.folded_pw = a if folded else None
                    step.nodes += [n for n in nodes if n is not None]
                    return True
        return False

    def _sequences(self, graph: gs.Graph, tl: Timeline):
        steps = []
        for node in graph.nodes:
            if node.op == "Div" and len(node.outputs) == 1:
                step = self._match_output(node.outputs[0], tl)
                if step is not None:
                    steps.append(step)
        if not steps:
            return [], []
        all_max = [n for n in graph.nodes if n.op == "Max" and len(n.inputs) == 2]
        for step in steps:
            near = [n for n in step.k.outputs if n.op == "Max" and len(n.inputs) == 2]
            if not self._match_update(step, near, tl):
                self._match_update(step, all_max, tl)
        by_p_old = {s.p_old.name: s for s in steps}
        sequences, problems = [], []
        followed = {id(by_p_old[s.p_new.name]) for s in steps if s.p_new is not None and s.p_new.name in by_p_old}
        for start in steps:
            if id(start) in followed:
                continue
            seq = [start]
            while seq[-1].p_new is not None and seq[-1].p_new.name in by_p_old:
                nxt = by_p_old[seq[-1].p_new.name]
                if nxt.num_old.name != seq[-1].num_new.name or nxt.den_old.name != seq[-1].den_new.name:
                    problems.append(
                        Declined(
                            self.name,
                            f"{start.y.name} …",
                            f"step at frame {nxt.frame} does not read num/den of the step before",
                        )
                    )
                    break
                seq.append(nxt)
            sequences.append(seq)
        return sequences, problems

    # -- the pass -----------------------------------------------------------------------------
    def run(self, graph: gs.Graph, ctx) -> PassResult:
        result = PassResult()
        for _ in range(MAX_ROUNDS):
            tl = Timeline(graph)
            self.shapes = tl.shapes
            self.same = _Same(Lifter(tl, None, 0))
            sequences, declined = self._sequences(graph, tl)
            fused = False
            for seq in sequences:
                where = f"{seq[0].p_old.name} → {(seq[-1].p_new or seq[-1].y).name} ({len(seq)} steps)"
                before = {n.name for n in graph.nodes}
                emit = GraphBuilder(graph, ctx, prefix=ctx.unique_name(self.op_type))
                lifter = Lifter(tl, emit, len(seq), seq[0].frame)
                try:
                    detail = self._replace(graph, ctx, seq, lifter, emit)
                except Decline as exc:
                    _discard(graph, emit.new_nodes)
                    declined.append(Declined(self.name, where, str(exc)))
                    continue
                node = detail.pop("node")
                restack(graph, ctx)
                graph.cleanup().toposort()
                after = {n.name for n in graph.nodes}
                detail["form"] = "sequence" if len(seq) > 1 else "step"
                result.matches.append(Match(self.name, self.op_type, node.name, sorted(before - after), detail))
                fused = True
                break
            if not fused:
                result.declined.extend(declined)
                break
        return result

    def _replace(self, graph, ctx, seq: list[WKVStep], lifter: Lifter, emit: GraphBuilder) -> dict:
        shapes = self.shapes
        steps = len(seq)
        for i, step in enumerate(seq):
            if step.frame != seq[0].frame + i:
                raise Decline(f"step {i} reads frame {step.frame}, expected {seq[0].frame + i}")
            if i < steps - 1 and step.p_new is None:
                raise Decline(f"step {i} has no state update p' = max(p + w, k)")
        whole = {}  # k/v as whole-sequence tensors X [B, T, C] when every step reads a slice of X
        for name in ("k", "v"):
            slices = [_time_slice(getattr(s, name), shapes) for s in seq]
            if all(sl is not None and sl[0] is slices[0][0] for sl in slices):
                whole[name] = slices[0][0]
            elif len({lifter.key(getattr(s, name)) for s in seq}) != 1:
                raise Decline(f"the per-step {name} is not the same computation at every step")
        if not all(self.same(s.u, seq[0].u) for s in seq):
            raise Decline("time_first u is not the same at every step")
        ws = [s.w for s in seq if s.w is not None]
        if ws and not all(self.same(w, ws[0]) for w in ws):
            raise Decline("the decay w is not the same at every step")
        for i, s in enumerate(seq):
            if s.folded_pw is None:
                continue
            w_value = const_value(ws[0]) if ws else None
            if w_value is None:
                raise Decline(f"step {i}: p + w was folded to a constant and w is not a constant")
            with np.errstate(all="ignore"):
                expected = (const_value(s.p_old).astype(F32) + w_value.astype(F32)).astype(F32)
            got = const_value(s.folded_pw)
            try:
                expected = np.broadcast_to(expected, got.shape)
            except ValueError as exc:
                raise Decline(f"step {i}: folded p + w has shape {list(got.shape)}") from exc
            if not np.array_equal(expected, got):
                raise Decline(f"step {i}: the folded constant {s.folded_pw.name!r} is not p + w")
        k_shape = shapes.need_shape(seq[0].k)
        if len(k_shape) != 2:
            raise Decline(f"k_t must be [B, C], got {list(k_shape)}")
        b, c = k_shape
        for t in (seq[0].v, seq[0].y):
            if shapes.need_shape(t) != (b, c):
                raise Decline(f"{t.name!r} has shape {shapes.shape(t)}, expected [{b}, {c}]")
        for t in (seq[0].k, seq[0].v, seq[0].y):
            if shapes.dtype(t) != F32:
                raise Decline(f"{t.name!r} is {shapes.dtype(t)}, not float32 (lower the precision after the rewrite)")
        # Intermediate states must be read only by the matched steps.
        inside = {id(n) for s in seq for n in s.nodes}
        for s in seq[:-1]:
            for t in (s.p_new, s.num_new, s.den_new):
                if t in graph.outputs:
                    raise Decline(f"intermediate state {t.name!r} is a graph output")
                for consumer in t.outputs:
                    if id(consumer) not in inside:
                        raise Decline(
                            f"intermediate state {t.name!r} is also read by {consumer.op} node {consumer.name!r}"
                        )

        def channels(t, what):  # a [C] float32 vector of a time-free tensor
            shape = shapes.need_shape(t)
            if shape == (c,):
                out = t
            elif int(np.prod(shape)) == c and (not shape or shape[-1] == c):
                out = emit.reshape(t, (c,), F32)
            elif int(np.prod(shape)) == 1:
                out = emit.expand(emit.reshape(t, (1,), F32), (c,), F32)
            else:
                raise Decline(f"{what} has shape {list(shape)}, not one value per channel ({c})")
            if shapes.dtype(t) != F32:
                out = emit.node("Cast", [out], (c,), F32, attrs={"to": 1})
            return out

        def sequence(name):  # [B, steps, C] float32
            x = whole.get(name)
            if x is None:
                lifted, _ = lift_leaf(lifter, emit, getattr(seq[0], name))
                return emit.transpose(lifted, [1, 0, 2], (b, steps, c), F32)
            x_shape = shapes.need_shape(x)
            if x_shape[0] != b or x_shape[2] != c:
                raise Decline(f"{name} source {x.name!r} has shape {list(x_shape)}, expected [{b}, T, {c}]")
            if x_shape[1] != steps:
                start = seq[0].frame
                x = emit.node(
                    "Slice",
                    [x, emit.ints([start]), emit.ints([start + steps]), emit.ints([1])],
                    (b, steps, c),
                    shapes.dtype(x),
                )
            if shapes.dtype(whole[name]) != F32:
                x = emit.node("Cast", [x], (b, steps, c), F32, attrs={"to": 1})
            return x

        k_in, v_in = sequence("k"), sequence("v")
        u_in = channels(seq[0].u, "time_first u")
        if ws:
            w_in = channels(ws[0], "the decay w")
        else:  # T = 1 with no state update: w does not matter
            w_in = emit.const(np.zeros(c, F32))

        def initial(t, default):
            value = const_value(t)
            if value is not None and np.all(value == default):
                return None
            shape = shapes.need_shape(t)
            try:
                np.broadcast_shapes(shape, (b, c))
            except ValueError as exc:
                raise Decline(f"initial state {t.name!r} of shape {list(shape)} is not [B, C]") from exc
            if shapes.dtype(t) != F32:
                raise Decline(f"initial state {t.name!r} is not float32")
            return t if shape == (b, c) else emit.expand(t, (b, c), F32)

        first = seq[0]
        states = [initial(first.num_old, 0.0), initial(first.den_old, 0.0), initial(first.p_old, MAX_INIT)]
        outs = [
            gs.Variable(ctx.unique_name(f"wkv_{n}"), dtype=F32, shape=list(s))
            for n, s in (("y", (b, steps, c)), ("num_last", (b, c)), ("den_last", (b, c)), ("max_last", (b, c)))
        ]
        node = make_framefuse_node(graph, ctx, "WKVScan", [k_in, v_in, w_in, u_in, *states], outs)
        emit.new_nodes.append(node)
        for i, step in enumerate(seq):
            replace_producer(step.y, emit.gather(outs[0], i, 1, (b, c), F32), graph, emit)
        last = seq[-1]
        if last.p_new is not None:
            replace_producer(last.num_new, outs[1], graph, emit)
            replace_producer(last.den_new, outs[2], graph, emit)
            replace_producer(last.p_new, outs[3], graph, emit)
        return {"node": node, "steps": steps, "state_shape": [b, c]}
