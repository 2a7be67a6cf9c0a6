"""What every unrolled-recurrence pass shares: the find → prove → lift → replace loop, the
re-wiring of the old per-step states, the lifting of stacked per-step outputs, and the count of
per-step recurrent ops left in a graph."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, Declined, Match, PassResult, RewriteContext
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.chains import DATA_MOVEMENT, Chain, find_chains
from framefuse.rewrite.unrolled.graphutil import (
    const_value,
    is_framefuse,
    producer,
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
    ``accepts(chain, tl)`` (cheap structural filter) and ``rewrite_chain`` (raise Decline to
    decline; emit nodes through ``emit`` only, and re-wire the states last)."""

    name = "unrolled"
    op_type = ""
    report_problems = False  # chain-finding problems are reported once, by the LinearScan pass

    def accepts(self, chain: Chain, tl: Timeline) -> bool:
        return True

    def find(self, tl: Timeline):
        """The chains this pass tries, and the problems found on the way (default: the one-state
        loop-carried chains of ``chains.find_chains``, over the frames forwards and then
        backwards; a pass whose steps carry several states finds its own)."""
        chains, problems = find_chains(tl)
        return chains + backward_chains(tl), problems

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
                if not self.accepts(chain, chain.timeline or tl):
                    continue
                before = {n.name for n in graph.nodes}
                emit = GraphBuilder(graph, ctx, prefix=ctx.unique_name(self.op_type or self.name))
                lifter = Lifter(chain.timeline or tl, emit, chain.steps, chain.first_frame)
                try:
                    detail = self.rewrite_chain(graph, ctx, chain, lifter, emit)
                except Decline as exc:
                    _discard(graph, emit.new_nodes)
                    declined.append(Declined(self.name, chain.where(), str(exc)))
                    continue
                node = detail.pop("node")
                restack(graph, ctx)
                collapse_gathered_stacks(graph, ctx)
                graph.cleanup().toposort()
                after = {n.name for n in graph.nodes}
                detail["form"] = chain.form
                if chain.timeline is not None and chain.timeline.reverse:
                    detail["direction"] = "reverse"  # a loop over the frames backwards
                result.matches.append(Match(self.name, self.op_type, node.name, sorted(before - after), detail))
                fused = True
                break
            if not fused:
                result.declined.extend(declined)
                if self.report_problems:
                    result.declined.extend(Declined(self.name, p.where, p.reason) for p in problems)
                break
        return result


def backward_chains(tl: Timeline) -> list[Chain]:
    """The chains of loops over the frames backwards: found in the reversed Timeline, where they
    run forwards (a forward loop has no chain there: each of its states depends on frame 0,
    which is the last time). Problems are not reported from it: the forward search reports a
    graph's."""
    if not tl.frame_count():
        return []
    reversed_tl = Timeline(tl.graph, tl.shapes, reverse=True)
    chains, _ = find_chains(reversed_tl, loops_only=True)
    for chain in chains:
        chain.timeline = reversed_tl
    return chains


def emit_state_outputs(
    graph: gs.Graph, emit: GraphBuilder, chain: Chain, per_step: gs.Tensor | None, last: gs.Tensor, state_shape
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
            emit = GraphBuilder(graph, ctx, prefix=ctx.unique_name("restack"))
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
            except Decline:
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


def _gathered_frame(t: gs.Tensor, axis: int):
    """(Y, its axis, index) when ``t`` is Unsqueeze(Gather(Y, a constant index, that axis)) with the
    size-1 axis put back at ``axis`` (one frame of a fused op's per-step output, stacked)."""
    unsqueeze = producer(t)
    if unsqueeze is None or unsqueeze.op != "Unsqueeze" or len(unsqueeze.inputs) != 2:
        return None
    axes = const_value(unsqueeze.inputs[1])
    rank = len(t.shape) if t.shape is not None else None
    if axes is None or axes.size != 1 or rank is None or int(axes.reshape(())) % rank != axis:
        return None
    gather = producer(unsqueeze.inputs[0])
    if gather is None or gather.op != "Gather" or len(gather.inputs) != 2:
        return None
    index = const_value(gather.inputs[1])
    data = gather.inputs[0]
    if index is None or index.ndim != 0 or data.shape is None or len(data.shape) != rank:
        return None
    data_axis = int(gather.attrs.get("axis", 0)) % rank
    return data, data_axis, int(index) % int(data.shape[data_axis])


def collapse_gathered_stacks(graph: gs.Graph, ctx: RewriteContext) -> int:
    """A ``torch.stack`` of every frame of one tensor, one Gather a frame (the states of a fused
    loop re-wired to its per-step output, see ``emit_state_outputs``): that tensor with its time
    axis moved to the stack's, reversed first when the frames are stacked last to first (a
    backward loop's outputs stacked in frame order). Returns how many stacks it replaced."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "Concat" or len(node.inputs) < 2 or node.outputs[0].shape is None:
            continue
        rank = len(node.outputs[0].shape)
        axis = int(node.attrs.get("axis", 0)) % rank
        frames = [_gathered_frame(t, axis) for t in node.inputs]
        if any(f is None for f in frames) or len({(id(f[0]), f[1]) for f in frames}) != 1:
            continue
        data, data_axis, _ = frames[0]
        indices = [f[2] for f in frames]
        length = int(data.shape[data_axis])
        if indices == list(range(length)):
            backwards = False
        elif indices == list(range(length - 1, -1, -1)):
            backwards = True
        else:
            continue
        emit = GraphBuilder(graph, ctx, prefix=ctx.unique_name("stack_of_frames"))
        dtype = data.dtype
        if backwards:
            data = emit.node(
                "Slice",
                [data, emit.ints([-1]), emit.ints([-(1 << 62)]), emit.ints([data_axis]), emit.ints([-1])],
                tuple(data.shape),
                dtype,
            )
        perm = [a for a in range(rank) if a != data_axis]
        perm.insert(axis, data_axis)
        out = node.outputs[0]
        moved = emit.transpose(data, perm, tuple(out.shape), dtype)
        if moved is frames[0][0]:
            moved = emit.node("Identity", [moved], tuple(out.shape), dtype)
        replace_producer(out, moved, graph, emit)
        count += 1
    if count:
        graph.cleanup().toposort()
    return count


def remaining_recurrence_ops(graph: gs.Graph) -> int:
    """Per-timestep recurrent ops left in ``graph``: the nodes on loop-carried chains (between the
    state of one step and the next, or between a ``state.X`` input and its ``next_state.X``
    output) that were not fused. Data movement only (a KV-cache append) is not counted."""
    tl = Timeline(graph)
    counted: dict[int, gs.Node] = {}
    # loops over the frames forwards, then backwards (the reversed Timeline)
    for timeline in (tl, Timeline(graph, tl.shapes, reverse=True)) if tl.frame_count() else (tl,):
        cands = timeline.state_candidates(minimal=False)  # every carried tensor (xLSTM's C and n too)
        for c in cands:
            for p in cands:
                if timeline.step(p) == timeline.step(c) - 1 and c.name in timeline.local_descendants(p):
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


def lift_leaf(lifter: Lifter, emit: GraphBuilder, leaf: gs.Tensor) -> tuple[gs.Tensor, tuple[int, ...]]:
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
