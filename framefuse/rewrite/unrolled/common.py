"""What every unrolled-recurrence pass shares: the find → prove → lift → replace loop, the
re-wiring of the old per-step states, the lifting of stacked per-step outputs, and the count of
per-step recurrent ops left in a graph."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Declined, Match, PassResult, RewriteContext
from framefuse.rewrite.unrolled.chains import DATA_MOVEMENT, Chain, find_chains
from framefuse.rewrite.unrolled.graphutil import (
    Emitter,
    NotLiftable,
    is_framefuse,
    replace_producer,
    tensors_between,
)
from framefuse.rewrite.unrolled.lift import Lifter
from framefuse.rewrite.unrolled.timeline import Timeline

MAX_ROUNDS = 256


def _discard(graph: gs.Graph, nodes: list[gs.Node]) -> None:
    """Take back nodes emitted for a candidate that was then declined."""
    ids = {id(n) for n in nodes}
    for node in nodes:
        node.inputs.clear()
        node.outputs.clear()
    graph.nodes = [n for n in graph.nodes if id(n) not in ids]


class UnrolledPass:
    """Base of the passes: subclasses set ``name``, ``op_type`` and implement
    ``accepts(chain, tl)`` (cheap structural filter) and ``rewrite_chain`` (raise NotLiftable to
    decline; emit nodes through ``emit`` only, and re-wire the states last)."""

    name = "unrolled"
    op_type = ""
    report_problems = False  # chain-finding problems are reported once, by the LinearScan pass

    def accepts(self, chain: Chain, tl: Timeline) -> bool:
        return True

    def find(self, tl: Timeline):
        """The chains this pass tries, and the problems found on the way (default: the one-state
        loop-carried chains of ``chains.find_chains``; a pass whose steps carry several states
        finds its own)."""
        return find_chains(tl)

    def rewrite_chain(self, graph, ctx, chain, lifter, emit) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, graph: gs.Graph, ctx: RewriteContext) -> PassResult:
        result = PassResult()
        for _ in range(MAX_ROUNDS):
            tl = Timeline(graph)
            chains, problems = self.find(tl)
            declined: list[Declined] = []
            fused = False
            for chain in chains:
                if not self.accepts(chain, tl):
                    continue
                before = {n.name for n in graph.nodes}
                emit = Emitter(graph, ctx, prefix=ctx.unique_name(self.op_type or self.name))
                lifter = Lifter(tl, emit, chain.steps, chain.first_frame)
                try:
                    detail = self.rewrite_chain(graph, ctx, chain, lifter, emit)
                except NotLiftable as exc:
                    _discard(graph, emit.new_nodes)
                    declined.append(Declined(self.name, chain.where(), str(exc)))
                    continue
                node = detail.pop("node")
                restack(graph, ctx)
                graph.cleanup().toposort()
                after = {n.name for n in graph.nodes}
                detail["form"] = chain.form
                result.matches.append(Match(self.name, self.op_type, node.name, sorted(before - after), detail))
                fused = True
                break
            if not fused:
                result.declined.extend(declined)
                if self.report_problems:
                    result.declined.extend(Declined(self.name, p.where, p.reason) for p in problems)
                break
        return result


def emit_state_outputs(
    graph: gs.Graph, emit: Emitter, chain: Chain, per_step: gs.Tensor | None, last: gs.Tensor, state_shape
) -> None:
    """Re-wire h_1 .. h_T: h_i becomes slice i−1 of the fused op's time-major output ``per_step``
    and h_T its final state, so every old consumer (the stack, per-step read-outs, ``next_state``
    outputs) now reads the fused result and the old chain is dead."""
    states = chain.states
    for i in range(1, len(states) - 1):
        replace_producer(states[i], emit.gather(per_step, i - 1, 0, tuple(state_shape), None), graph, emit)
    final = states[-1]
    if per_step is not None and final.outputs:
        # Consumers of h_T read it as the last per-step slice, like h_1 .. h_{T-1}, so that a
        # stack of all of them lifts; a next_state output takes the op's final state.
        sliced = emit.gather(per_step, len(states) - 2, 0, tuple(state_shape), None)
        for node in list(final.outputs):
            for k, t in enumerate(node.inputs):
                if t is final:
                    node.inputs[k] = sliced
    replace_producer(final, last, graph, emit)


def restack(graph: gs.Graph, ctx: RewriteContext) -> int:
    """Lift every ``torch.stack`` of per-step tensors (Concat of size-1 slices of steps 0..T−1 that
    are copies of one computation) into that computation over all steps. Returns how many."""
    count = 0
    for _ in range(MAX_ROUNDS):
        graph.cleanup().toposort()
        tl = Timeline(graph)
        done = False
        for node in list(graph.nodes):
            if not tl.is_collector(node):
                continue
            inputs = node.inputs
            if [tl.time_of(t) for t in inputs] != [frozenset({i}) for i in range(len(inputs))]:
                continue
            emit = Emitter(graph, ctx, prefix=ctx.unique_name("restack"))
            lifter = Lifter(tl, emit, len(inputs))
            try:
                keys = [lifter.key(t) for t in inputs]
                # A first step left outside a fused scan (computed around a constant h_0) is
                # stacked in front of the lifted copies of the others.
                head = 1 if len(set(keys[1:])) == 1 and keys[0] != keys[1] and len(inputs) > 2 else 0
                if len(set(keys[head:])) != 1:
                    continue
                if head:
                    lifter = Lifter(tl, emit, len(inputs) - 1, first_frame=1)
                lifted = lifter.lift(inputs[head])
                shape = tl.shapes.need_shape(inputs[0])
                out_shape = tl.shapes.need_shape(node.outputs[0])
                dtype = tl.shapes.dtype(inputs[0])
                if head:
                    first = emit.unsqueeze(inputs[0], [0], (1, *shape), dtype)
                    lifted = emit.node("Concat", [first, lifted], (len(inputs), *shape), dtype, attrs={"axis": 0})
            except NotLiftable:
                _discard(graph, emit.new_nodes)
                continue
            axis = int(node.attrs.get("axis", 0)) % len(shape)
            perm = [*range(1, axis + 1), 0, *range(axis + 1, len(shape) + 1)]
            moved_shape = (*shape[:axis], len(inputs), *shape[axis:])
            moved = emit.transpose(lifted, perm, moved_shape, tl.shapes.dtype(inputs[0]))
            out = node.outputs[0]
            replace_producer(out, emit.reshape(moved, out_shape, tl.shapes.dtype(inputs[0])), graph, emit)
            count += 1
            done = True
            break
        if not done:
            break
    return count


def remaining_recurrence_ops(graph: gs.Graph) -> int:
    """Per-timestep recurrent ops left in ``graph``: the nodes on loop-carried chains (between the
    state of one step and the next, or between a ``state.X`` input and its ``next_state.X``
    output) that were not fused. Data movement only (a KV-cache append) is not counted."""
    tl = Timeline(graph)
    counted: dict[int, gs.Node] = {}
    cands = tl.state_candidates(minimal=False)  # every carried tensor (xLSTM's C and n too)
    for c in cands:
        for p in cands:
            if tl.step(p) == tl.step(c) - 1 and c.name in tl.local_descendants(p):
                for node in tensors_between(p, c)[1]:
                    if not is_framefuse(node):
                        counted[id(node)] = node
    outputs = {o.name: o for o in graph.outputs}
    for gi in graph.inputs:
        if not gi.name.startswith("state."):
            continue
        go = outputs.get("next_state." + gi.name[len("state.") :])
        if go is None:
            continue
        nodes = tensors_between(gi, go)[1]
        if any(is_framefuse(n) for n in nodes):
            continue
        for node in nodes:
            if node.op not in DATA_MOVEMENT:
                counted[id(node)] = node
    return len(counted)


def lift_leaf(lifter: Lifter, emit: Emitter, leaf: gs.Tensor) -> tuple[gs.Tensor, tuple[int, ...]]:
    """A per-step input of the recurrence over all steps, time-major ``[T, *shape]``: lifted when it
    reads the frames, broadcast over T when it does not (the step form's frame, a constant)."""
    shape = lifter.shapes.need_shape(leaf)
    full = (lifter.steps, *shape)
    if lifter.tl.time_of(leaf):
        return lifter.lift(leaf), full
    dtype = lifter.dtype(leaf)
    lifted = emit.unsqueeze(leaf, [0], (1, *shape), dtype)
    if lifter.steps != 1:
        lifted = emit.expand(lifted, full, dtype)
    return lifted, full
