"""Where the time steps of an unrolled loop are, and which tensors carry state between them.

A Python loop ``for t in range(T)`` exported by TorchScript leaves T copies of the step subgraph.
Each copy reads its frame through a *slice source*: ``Gather(X, t, axis)`` (``x[:, t]``) or
``Slice(X, t, t+1, axis)`` (``x[:, t:t+1]``) of a tensor X that is itself computed once for the
whole sequence. Every tensor gets the set of time indices of the slice sources it depends on;
the step of a tensor is the largest of them. A tensor consumed by a node of a later step is
loop-carried state (h_t feeding step t+1), unless the consumer is the *collector* that stacks the
per-step outputs (``Concat`` of size-1 slices, i.e. ``torch.stack``).

A loop over the frames backwards (``for t in reversed(range(T))``, the reverse half of a
bidirectional layer) reads frame T−1 first: every one of its states depends on frame T−1, so all
of them fall in that last step. ``Timeline(graph, reverse=True)`` numbers the frames from the end
(frame index i is time T−1−i), and the backward loop is then a forward one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.unrolled.graphutil import Shapes, const_value, is_framefuse, producer

# Ops whose output is known statically even when their input is per-step.
_STATIC_OUTPUT_OPS = {"Shape", "Size"}


@dataclass(frozen=True)
class SliceSource:
    source: gs.Tensor  # the whole-sequence tensor X
    axis: int  # non-negative axis of X that is the time axis
    time: int
    keepdim: bool  # Slice keeps a size-1 axis, Gather drops it


class Timeline:
    """Time indices of every tensor of ``graph`` (which it toposorts)."""

    def __init__(self, graph: gs.Graph, shapes: Shapes | None = None, *, reverse: bool = False):
        graph.toposort()
        self.graph = graph
        self.reverse = reverse
        self.shapes = shapes or Shapes(graph)
        self.times: dict[str, frozenset[int]] = {}
        self.slices: dict[str, SliceSource] = {}
        self.order: dict[str, int] = {}  # tensor name -> topological position of its producer
        self._constant_memo: dict[str, bool] = {}
        self._families = self._frame_families()
        for position, node in enumerate(self.graph.nodes):
            for out in node.outputs:
                self.order[out.name] = position
            self._visit(node)

    # -- classification -------------------------------------------------------------------------
    def time_of(self, t: gs.Tensor) -> frozenset[int]:
        return self.times.get(t.name, frozenset())

    def step(self, t: gs.Tensor) -> int:
        times = self.time_of(t)
        return max(times) if times else -1

    def is_static(self, t: gs.Tensor) -> bool:
        return not self.time_of(t)

    def is_constant(self, t: gs.Tensor) -> bool:
        """Computed from constants only (no graph input)."""
        if isinstance(t, gs.Constant):
            return True
        if t.name in self._constant_memo:
            return self._constant_memo[t.name]
        node = producer(t)
        # Shapes are static here (the exporter fixes every dimension): a Shape is a constant.
        result = node is not None and (
            node.op in _STATIC_OUTPUT_OPS or all(self.is_constant(i) for i in node.inputs if i.name)
        )
        self._constant_memo[t.name] = result
        return result

    def local_descendants(self, source: gs.Tensor) -> set[str]:
        """``descendants`` of ``source`` within the unrolled loops: the walk stops at time-free
        tensors (the full stack of a loop's outputs is a whole-sequence tensor), so a later loop
        that reads that stack is not taken as part of this one's steps."""
        memo = self.__dict__.setdefault("_local_memo", {})
        if source.name in memo:
            return memo[source.name]
        seen = {source.name}
        stack = [source]
        while stack:
            t = stack.pop()
            for node in t.outputs:
                for out in node.outputs:
                    if out.name not in seen and self.time_of(out):
                        seen.add(out.name)
                        stack.append(out)
        memo[source.name] = seen
        return seen

    def _visit(self, node: gs.Node) -> None:
        source = self._slice_source(node)
        if source is not None:
            self.slices[node.outputs[0].name] = source
            self.times[node.outputs[0].name] = frozenset({source.time})
            return
        if node.op in _STATIC_OUTPUT_OPS:
            return
        if self.is_collector(node) and self._full_stack(node):
            # The stack of all per-step outputs is a whole-sequence tensor, like the input: a later
            # loop over it (the next layer) slices it frame by frame again.
            return
        times: frozenset[int] = frozenset()
        for t in node.inputs:
            times = times | self.time_of(t)
        if times:
            for out in node.outputs:
                self.times[out.name] = times

    def _frame_families(self) -> set[tuple[str, int]]:
        """(tensor, axis) pairs that an unrolled loop reads frame by frame: every index of the axis
        is taken by a Gather/Slice of one frame. ``x[..., 0]`` alone (one channel of two) is not
        a frame. Where some loop has T ≥ 2 frames, only families of the most common length T
        count (a size-1 axis or a 4-wide conv window is not the time axis then)."""
        taken: dict[tuple[str, int], set[int]] = {}
        sizes: dict[tuple[str, int], int] = {}
        for node in self.graph.nodes:
            found = self._frame_read(node)
            if found is not None:
                key = (node.inputs[0].name, found[0])
                taken.setdefault(key, set()).add(found[1])
                sizes[key] = found[2]
        complete = {key: sizes[key] for key, idx in taken.items() if idx == set(range(sizes[key]))}
        lengths = [n for n in complete.values() if n >= 2]
        if lengths:
            common = max(set(lengths), key=lambda n: (lengths.count(n), n))
            return {key for key, n in complete.items() if n == common}
        return set(complete)

    def _frame_read(self, node: gs.Node):
        """(axis, index, axis size) when ``node`` reads one index of an axis of its input."""
        if is_framefuse(node) or not node.inputs or node.op not in ("Gather", "Slice"):
            return None
        source = self._slice_source(node, check_family=False)
        if source is None:
            return None
        return source.axis, source.time, self.shapes.shape(source.source)[source.axis]

    def _slice_source(self, node: gs.Node, check_family: bool = True) -> SliceSource | None:
        source = self._slice_candidate(node)
        if source is not None and check_family and (source.source.name, source.axis) not in self._families:
            return None
        return source

    def _slice_candidate(self, node: gs.Node) -> SliceSource | None:
        if is_framefuse(node) or not node.inputs:
            return None
        data = node.inputs[0]
        if self.time_of(data) or self.is_constant(data):
            return None
        shape = self.shapes.shape(data)
        if shape is None:
            return None
        if node.op == "Gather":
            index = const_value(node.inputs[1])
            if index is None or index.ndim != 0 or not np.issubdtype(index.dtype, np.integer):
                return None
            axis = int(node.attrs.get("axis", 0)) % len(shape)
            return SliceSource(data, axis, self._time(int(index) % shape[axis], shape[axis]), keepdim=False)
        if node.op == "Slice" and len(node.inputs) >= 3:
            starts, ends = const_value(node.inputs[1]), const_value(node.inputs[2])
            axes = const_value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else None
            steps = const_value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else None
            if starts is None or ends is None or starts.size != 1 or ends.size != 1:
                return None
            if len(node.inputs) > 3 and node.inputs[3].name and axes is None:
                return None
            if steps is not None and (steps.size != 1 or int(steps.reshape(-1)[0]) != 1):
                return None
            axis = int(axes.reshape(-1)[0]) if axes is not None else 0
            axis %= len(shape)
            size = shape[axis]
            start = int(starts.reshape(-1)[0])
            end = int(ends.reshape(-1)[0])
            start = max(0, min(size, start + size if start < 0 else start))
            end = max(0, min(size, end + size if end < 0 else end))
            if end - start != 1:
                return None
            return SliceSource(data, axis, self._time(start, size), keepdim=True)
        return None

    def _time(self, index: int, size: int) -> int:
        """The time of frame ``index`` of an axis of ``size`` frames (from the end when reversed)."""
        return size - 1 - index if self.reverse else index

    def frame_count(self) -> int:
        """How many frame-read families the graph has (no loop over frames when 0)."""
        return len(self._families)

    # -- loop-carried state --------------------------------------------------------------------
    def _full_stack(self, node: gs.Node) -> bool:
        """The collector's inputs are the steps 0..n-1 in order (step i reads frames up to i)."""
        steps = [self.step(t) for t in node.inputs]
        return steps == list(range(len(steps)))

    def is_collector(self, node: gs.Node) -> bool:
        """``torch.stack``/``torch.cat`` of per-step outputs: a Concat of equal-shaped inputs that
        each have size 1 along the concat axis."""
        if node.op != "Concat" or len(node.inputs) < 2:
            return False
        shapes = [self.shapes.shape(t) for t in node.inputs]
        if any(s is None for s in shapes) or len(set(shapes)) != 1:
            return False
        axis = int(node.attrs.get("axis", 0)) % len(shapes[0])
        return shapes[0][axis] == 1

    def state_candidates(self, minimal: bool = True) -> list[gs.Tensor]:
        """Tensors consumed by a node of a later step (other than a collector), in topo order;
        with ``minimal``, only those not derived from another candidate of the same step."""
        found: dict[str, gs.Tensor] = {}
        for node in self.graph.nodes:
            if is_framefuse(node) or self.is_collector(node):
                continue
            out_step = max((self.step(o) for o in node.outputs), default=-1)
            for t in node.inputs:
                if not t.name or t.name in self.slices or self.is_static(t):
                    continue
                if self.step(t) < out_step:
                    found[t.name] = t
        cands = sorted(found.values(), key=lambda t: self.order.get(t.name, -1))
        if not minimal:
            return cands
        # Something computed from h_t alone before the next frame is read (tanh(W h_t), o⊙tanh(c_t))
        # is consumed by the next step too, but the state is h_t: keep only candidates that do not
        # derive from another candidate of the same step.
        by_step: dict[int, list[gs.Tensor]] = {}
        for c in cands:
            by_step.setdefault(self.step(c), []).append(c)
        kept = []
        for c in cands:
            peers = [p for p in by_step[self.step(c)] if p is not c]
            if not any(c.name in self.local_descendants(p) for p in peers):
                kept.append(c)
        return kept
