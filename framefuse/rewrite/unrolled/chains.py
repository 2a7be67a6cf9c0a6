"""Loop-carried chains h_0 → h_1 → … → h_T of an unrolled recurrence, and their step templates.

A *template* is the expression of h_t in terms of h_{t−1}: the nodes between them, with h_{t−1}
as the hole and every maximal subexpression that does not depend on h_{t−1} as a leaf. Two steps
are copies of one another when their templates have the same *signature* (same ops, same
attributes, leaves with the same time-free key, see ``lift.Lifter.key``). That is how the chain
is found structurally:

- sequence form: the state candidates of the Timeline (tensors consumed by a later step) are
  linked to the candidate of the previous step they depend on; the first link's template is
  matched backwards against h_1 to find h_0 (a zeros constant or a state input) and forwards
  from h_{T−1} to find h_T (consumed only by the stack, or a ``next_state`` output);
- step form (T = 1): the graph input ``state.<name>`` and the graph output ``next_state.<name>``.

Each link is checked: same signature as the first, and every leaf of step i reads frame i only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline
from framefuse.rewrite.unrolled.graphutil import (
    const_key,
    const_value,
    descendants,
    is_framefuse,
    producer,
    split_span,
)
from framefuse.rewrite.unrolled.lift import Lifter, node_key
from framefuse.rewrite.unrolled.timeline import Timeline

STATE_IN_PREFIX = "state."
# Ops that only move data; a state path through nothing else (a causal-conv shift register, a
# KV-cache append, the plumbing around a fused node) is not a per-step recurrent computation.
DATA_MOVEMENT = {
    "Concat",
    "Slice",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Transpose",
    "Cast",
    "Identity",
    "Gather",
    "Expand",
    "Split",
    "Flatten",
    "Pad",
    "Constant",
}
STATE_OUT_PREFIX = "next_state."


@dataclass
class Tmpl:
    kind: str  # "hole" | "leaf" | "node"
    tensor: gs.Tensor
    node: gs.Node | None = None
    children: list[Tmpl] = field(default_factory=list)

    def walk(self) -> list[Tmpl]:
        """Every distinct sub-template once (templates share sub-templates: a DAG)."""
        seen: dict[int, Tmpl] = {}
        stack = [self]
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen[id(t)] = t
            stack.extend(t.children)
        return list(seen.values())

    def nodes(self) -> list[gs.Node]:
        found: dict[int, gs.Node] = {}
        for t in self.walk():
            if t.kind == "node":
                found[id(t.node)] = t.node
        return list(found.values())

    def leaves(self) -> list[gs.Tensor]:
        return list({t.tensor.name: t.tensor for t in self.walk() if t.kind == "leaf"}.values())


def template(
    v: gs.Tensor,
    hole: gs.Tensor,
    depends: set[str] | None = None,
    graph: gs.Graph | None = None,
    order: dict[str, int] | None = None,
) -> Tmpl:
    """h_t = ``v`` in terms of h_(t-1) = ``hole``. A constant hole (zeros h_0) also stands for
    the other constants of ``graph`` with its value (the exporter writes one per use). With the
    graph's topological ``order`` (Timeline.order), whether a tensor depends on the hole is found
    by walking back from it no further than the hole's position, instead of collecting every
    tensor downstream of the hole: one step's nodes rather than the rest of the graph, which made
    the rewrite quadratic in T and layers (mamba, T = 256, 4 layers: 3.5 min)."""
    hole_value = const_value(hole)
    hole_key = const_key(hole_value) if hole_value is not None else None
    if depends is None and hole_key is None and order is not None:
        depends = _DependsOn(hole, order)
    if depends is None:
        depends = descendants(hole)
        if hole_key is not None and graph is not None:
            for t in graph.tensors().values():
                value = const_value(t)
                if value is not None and value.shape == hole_value.shape and const_key(value) == hole_key:
                    depends |= descendants(t)
    memo: dict[str, Tmpl] = {}

    def is_hole(t: gs.Tensor) -> bool:
        if t is hole or t.name == hole.name:
            return True
        # A constant h_0 (zeros) is written once per use by the exporter.
        if hole_key is not None:
            value = const_value(t)
            return value is not None and const_key(value) == hole_key
        return False

    def build(t: gs.Tensor) -> Tmpl:
        if t.name in memo:
            return memo[t.name]
        if is_hole(t):
            result = Tmpl("hole", t)
        elif (
            not (depends.depends_on(t) if isinstance(depends, _DependsOn) else t.name in depends) or producer(t) is None
        ):
            result = Tmpl("leaf", t)
        else:
            node = producer(t)
            result = Tmpl("node", t, node, [build(i) if i.name else Tmpl("leaf", i) for i in node.inputs])
        memo[t.name] = result
        return result

    return build(v)


class _DependsOn:
    """``depends_on(t)``: whether ``t`` is computed from ``hole`` (the same answer as
    ``t.name in descendants(hole)``), found by a backward walk bounded by the topological
    position of the hole's producer: nothing before it can depend on it."""

    def __init__(self, hole: gs.Tensor, order: dict[str, int]):
        self.hole = hole.name
        self.floor = order.get(hole.name, -1)
        self.order = order
        self.memo: dict[str, bool] = {hole.name: True}

    def depends_on(self, t: gs.Tensor) -> bool:
        memo, order, floor = self.memo, self.order, self.floor
        if t.name in memo:
            return memo[t.name]
        stack = [(t, False)]
        while stack:
            cur, expanded = stack.pop()
            if cur.name in memo:
                continue
            node = producer(cur)
            if node is None or order.get(cur.name, -1) <= floor:
                memo[cur.name] = False
                continue
            inputs = [i for i in node.inputs if i.name]
            if expanded:
                memo[cur.name] = any(memo.get(i.name, False) for i in inputs)
                continue
            stack.append((cur, True))
            stack.extend((i, False) for i in inputs if i.name not in memo)
        return memo[t.name]


def signature(tm: Tmpl, lifter: Lifter, memo: dict | None = None):
    memo = {} if memo is None else memo
    if id(tm) not in memo:
        memo[id(tm)] = _signature(tm, lifter, memo)
    return memo[id(tm)]


def _signature(tm: Tmpl, lifter: Lifter, memo: dict):
    if tm.kind == "hole":
        return ("H",)
    if tm.kind == "leaf":
        if not tm.tensor.name:
            return ("L", None)
        try:
            return ("L", lifter.key(tm.tensor))
        except Decline:
            return ("L!", tm.tensor.name)
    return (
        "N",
        node_key(tm.node),
        tm.node.outputs.index(tm.tensor),
        tuple(signature(c, lifter, memo) for c in tm.children),
    )


def match_backward(tm: Tmpl, w: gs.Tensor, lifter: Lifter, binding: dict) -> bool:
    """Whether ``w`` is computed like ``tm`` (one step earlier); binds the hole to h_0."""
    memo = binding.setdefault("_memo", {})
    key = (id(tm), w.name)
    if key not in memo:
        memo[key] = _match_backward(tm, w, lifter, binding)
    return memo[key]


def _match_backward(tm: Tmpl, w: gs.Tensor, lifter: Lifter, binding: dict) -> bool:
    if tm.kind == "hole":
        bound = binding.get("hole")
        if bound is not None and bound.name != w.name:
            # The exporter writes one Constant per use: equal constants are the same h_0.
            a, b = const_value(bound), const_value(w)
            return a is not None and b is not None and const_key(a) == const_key(b)
        binding["hole"] = w
        return True
    if tm.kind == "leaf":
        if not tm.tensor.name or not w.name:
            return tm.tensor.name == w.name
        try:
            return lifter.key(tm.tensor) == lifter.key(w)
        except Decline:
            return False
    node = producer(w)
    if node is None or node_key(node) != node_key(tm.node) or len(node.inputs) != len(tm.children):
        if _is_noop_cast(tm, lifter) and match_backward(tm.children[0], w, lifter, binding):
            return True  # h.to(h.dtype) in later steps, folded away where h_0 is a constant
        return _match_folded(tm, w, binding)
    if node.outputs.index(w) != tm.node.outputs.index(tm.tensor):
        return False
    return all(match_backward(c, i, lifter, binding) for c, i in zip(tm.children, node.inputs))


def _is_noop_cast(tm: Tmpl, lifter: Lifter) -> bool:
    if tm.kind != "node" or len(tm.children) != 1:
        return False
    return lifter._is_noop(tm.node)


FOLDED_ZEROS_SUFFIX = "/initial_state_zeros"
_NUMPY_OPS = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Neg": np.negative,
    "Identity": lambda v: v,
    "Exp": np.exp,
    "Tanh": np.tanh,
    "Log": np.log,
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "Relu": lambda v: np.maximum(v, 0),
    "Softplus": lambda v: np.log1p(np.exp(v)),
}


def _gemm(node: gs.Node, a, b, c=None):
    at = node.attrs
    a = a.T if int(at.get("transA", 0)) else a
    b = b.T if int(at.get("transB", 0)) else b
    out = float(at.get("alpha", 1.0)) * (a @ b)
    return out if c is None else out + float(at.get("beta", 1.0)) * c


def _split(node: gs.Node, output: gs.Tensor, x, sizes=None):
    axis = int(node.attrs.get("axis", 0))
    span = split_span(node, output, x.shape[axis], sizes)
    return None if span is None else np.take(x, np.arange(span[1], span[2]), axis=axis)


def evaluate_template(tm: Tmpl, hole_value: np.ndarray, leaves: dict | None = None, memo: dict | None = None):
    """Value of a template (numpy) with the hole bound to ``hole_value`` and its leaves to their
    constants, or to ``leaves[tensor name]`` for the ones that are not constants; None when an
    op or a leaf has no value here."""
    memo = {} if memo is None else memo
    if id(tm) in memo:
        return memo[id(tm)]
    if tm.kind == "hole":
        return hole_value
    if tm.kind == "leaf":
        value = (leaves or {}).get(tm.tensor.name)
        return const_value(tm.tensor) if value is None else value
    # ops with attributes that a folded first step holds (a GRU cell's recurrent Gemm and Split)
    attr_ops = {"Gemm", "MatMul", "Split"}
    fn = _NUMPY_OPS.get(tm.node.op)
    if tm.node.op not in attr_ops and (fn is None or tm.node.attrs):
        return None
    args = [evaluate_template(c, hole_value, leaves, memo) for c in tm.children]
    if any(a is None for a in args):
        return None
    memo[id(tm)] = value = _apply(tm, fn, args)
    return value


def _apply(tm: Tmpl, fn, args):
    with np.errstate(all="ignore"):
        try:
            if tm.node.op == "Gemm":
                return _gemm(tm.node, *args)
            if tm.node.op == "MatMul":
                return np.matmul(*args)
            if tm.node.op == "Split":
                return _split(tm.node, tm.tensor, *args)
        except (ValueError, IndexError):  # shapes that do not fit the value tried: not this template
            return None
        return fn(*args)


def _match_folded(tm: Tmpl, w: gs.Tensor, binding: dict) -> bool:
    """The first step of a loop from a constant initial state may have been constant-folded
    (a_0 ⊙ 0 with a constant a_0 is a constant 0): match a constant ``w`` against the template
    evaluated with h_0 = 0."""
    value = const_value(w)
    if value is None or binding.get("hole") is not None and const_value(binding["hole"]) is None:
        return False
    hole = binding.get("hole")
    hole_value = const_value(hole) if hole is not None else np.zeros(value.shape, value.dtype)
    result = evaluate_template(tm, hole_value)
    if result is None or np.shape(result) != value.shape or not np.allclose(result, value, rtol=0, atol=0):
        return False
    if hole is None:
        binding["hole"] = gs.Constant(f"{w.name}{FOLDED_ZEROS_SUFFIX}", np.zeros(value.shape, value.dtype))
    return True


@dataclass
class Chain:
    states: list[gs.Tensor]  # h_0, h_1, ..., h_T
    links: list[Tmpl]  # links[i]: h_{i+1} in terms of h_i
    form: str  # "sequence" | "step"
    first_frame: int = 0  # frame read by the first link (> 0 when the exporter folded a first step)
    coupled_with: list[str] = field(default_factory=list)  # other recurrent states the steps read
    # The first step was constant-folded (h_0 = 0 made part of it constant): it was matched against
    # the later steps numerically, so its template is not a structural copy of theirs.
    folded_first: bool = False
    # The Timeline the chain was found in: a loop over the frames backwards is found in the
    # reversed one (its first_frame and its lifted frames count from the end)
    timeline: Timeline | None = None

    @property
    def structural_links(self) -> list[Tmpl]:
        return self.links[1:] if self.folded_first else self.links

    @property
    def steps(self) -> int:
        return len(self.links)

    def where(self) -> str:
        return f"{self.states[0].name} → {self.states[-1].name} ({self.steps} step{'s' if self.steps != 1 else ''})"

    def nodes(self) -> list[gs.Node]:
        found: dict[int, gs.Node] = {}
        for link in self.links:
            for node in link.nodes():
                found[id(node)] = node
        return list(found.values())


@dataclass
class ChainProblem:
    where: str
    reason: str


def _same_shape(tl: Timeline, a: gs.Tensor, b: gs.Tensor) -> bool:
    sa, sb = tl.shapes.shape(a), tl.shapes.shape(b)
    return sa is not None and sa == sb


def find_chains(tl: Timeline, *, loops_only: bool = False) -> tuple[list[Chain], list[ChainProblem]]:
    """Every loop-carried chain of ``tl``'s graph; candidates that are not consistent chains are
    returned as problems (with the reason) only when their steps do depend on each other.
    ``loops_only``: the chains of its state candidates only (not the states a collector stacks,
    not the step form's state inputs), as the reversed Timeline's search wants."""
    lifter = Lifter(tl, None, 0)
    cands = tl.state_candidates()
    desc = {c.name: tl.local_descendants(c) for c in cands}
    by_step: dict[int, list[gs.Tensor]] = {}
    for c in cands:
        by_step.setdefault(tl.step(c), []).append(c)
    preds: dict[str, list[gs.Tensor]] = {}
    for c in cands:
        preds[c.name] = [p for p in by_step.get(tl.step(c) - 1, []) if c.name in desc[p.name]]
    succs: dict[str, list[gs.Tensor]] = {c.name: [] for c in cands}
    for c in cands:
        if len(preds[c.name]) == 1:
            succs[preds[c.name][0].name].append(c)
    chains: list[Chain] = []
    problems: list[ChainProblem] = []
    starts = [c for c in cands if len(preds[c.name]) != 1]
    for start in starts:
        seq = [start]
        while len(succs[seq[-1].name]) == 1:
            seq.append(succs[seq[-1].name][0])
        chain, problem = _complete(tl, lifter, seq)
        if chain is not None:
            chains.append(chain)
        elif problem is not None:
            problems.append(problem)
    if loops_only:
        return chains, problems
    # Loops whose carried tensor is not the loop variable (a static decay makes a ⊙ h_t the
    # tensor that crosses into the next step): the per-step outputs a collector stacks, when each
    # depends on the previous one, are the states.
    in_chains = {s.name for c in chains for s in c.states}
    for node in tl.graph.nodes:
        if not tl.is_collector(node):
            continue
        seq = [_uncollect(t) for t in node.inputs]
        if len(seq) < 2 or any(t.name in in_chains for t in seq):
            continue
        if not all(seq[i].name in descendants(seq[i - 1]) for i in range(1, len(seq))):
            continue
        chain, problem = _complete(tl, lifter, seq, has_last=True)
        if chain is not None:
            chains.append(chain)
            in_chains |= {s.name for s in chain.states}
        elif problem is not None:
            problems.append(problem)
    used = {c.states[0].name for c in chains} | {c.states[-1].name for c in chains}
    chains_step, problems_step = _state_pairs(tl, lifter, used)
    return chains + chains_step, problems + problems_step


def _uncollect(t: gs.Tensor) -> gs.Tensor:
    """The per-step tensor behind a collector input (``h.unsqueeze(1)`` → h)."""
    node = producer(t)
    while node is not None and node.op in ("Unsqueeze", "Reshape", "Identity") and node.inputs:
        t = node.inputs[0]
        node = producer(t)
    return t


def _forward(tl: Timeline, lifter: Lifter, last: gs.Tensor, accept) -> gs.Tensor | None:
    depends = descendants(last)
    want = tl.step(last) + 1
    for name in sorted(depends, key=lambda n: tl.order.get(n, -1)):
        if name == last.name:
            continue
        node_out = _tensor_by_name(tl, name)
        if node_out is None or tl.step(node_out) != want or not _same_shape(tl, node_out, last):
            continue
        if accept(node_out, template(node_out, last, depends)):
            return node_out
    return None


def _tensor_by_name(tl: Timeline, name: str) -> gs.Tensor | None:
    cache = getattr(tl, "_tensor_cache", None)
    if cache is None:
        cache = tl.graph.tensors()
        tl._tensor_cache = cache
    return cache.get(name)


def _collected(tl: Timeline, t: gs.Tensor) -> bool:
    """``t`` is a per-step output: stacked by a collector (directly or after an Unsqueeze/Reshape)
    or a graph output."""
    if t in tl.graph.outputs:
        return True
    for node in t.outputs:
        if tl.is_collector(node):
            return True
        if node.op in ("Unsqueeze", "Reshape", "Identity") and any(
            tl.is_collector(n) for out in node.outputs for n in out.outputs
        ):
            return True
    return False


def _paths(tm: Tmpl):
    """One path (child indices from the root) to every distinct node of the template."""
    seen = set()
    queue = [((), tm)]
    while queue:
        prefix, t = queue.pop(0)
        if id(t) in seen:
            continue
        seen.add(id(t))
        yield prefix, t
        for k, child in enumerate(t.children):
            if child.kind == "node":
                queue.append((prefix + (k,), child))


def _at(tm: Tmpl, path) -> Tmpl:
    for k in path:
        tm = tm.children[k]
    return tm


def _cut_phases(tl: Timeline, seq: list[gs.Tensor], collected_only: bool):
    """The loop-carried tensors found (consumed by the next step) may sit at another point of the
    step than the loop variable: ``h = tanh(W h) + x_t`` carries tanh(W h_t) into step t+1, a static
    decay makes a ⊙ h_t the carried tensor. Yield the same chain cut elsewhere: at each *cut* of
    the step (a tensor every path from h_{t-1} to h_t goes through), the tensors at that position
    in every step (with ``collected_only``, only cuts that the loop stacks as its outputs)."""
    if len(seq) < 2:
        return
    links = [template(seq[i + 1], seq[i], order=tl.order) for i in range(len(seq) - 1)]
    for path, sub in _paths(links[0]):
        if not path:
            continue
        if seq[0] in template(seq[1], sub.tensor, order=tl.order).leaves():
            continue  # some path from h_{t-1} bypasses it
        shifted = []
        for link in links:
            try:
                shifted.append(_at(link, path).tensor)
            except (IndexError, AttributeError):
                shifted = []
                break
        if shifted and (not collected_only or all(_collected(tl, t) for t in shifted)):
            yield shifted


def _anchors(tl: Timeline, c: gs.Tensor, depth: int = 8):
    """Tensors c is computed from with h-independent other inputs in the same step (a_t ⊙ h_t →
    h_t): other places where a two-step loop's single carried tensor may be cut."""
    for _ in range(depth):
        node = producer(c)
        if node is None:
            return
        timed = [t for t in node.inputs if t.name and tl.time_of(t)]
        if len(timed) != 1 or tl.step(timed[0]) != tl.step(c) or timed[0].name in tl.slices:
            return
        c = timed[0]
        yield c


def _complete(
    tl: Timeline, lifter: Lifter, seq: list[gs.Tensor], has_last: bool = False
) -> tuple[Chain | None, ChainProblem | None]:
    """Chain through the loop-carried tensors ``seq`` (h_1 ...), completed with h_0 and h_T, trying
    the other phases of the step when the carried tensors are not the loop variable;
    ``has_last``: ``seq`` already ends with h_T (the states a collector stacks)."""
    if has_last:
        attempts = [seq]
    else:
        attempts = [*_cut_phases(tl, seq, collected_only=True), seq]
        if len(seq) >= 2:
            attempts += list(_cut_phases(tl, seq, collected_only=False))
        else:
            attempts += [[u] for u in _anchors(tl, seq[0])]
    first_problem = None
    tried = set()
    for attempt in attempts:
        names = tuple(t.name for t in attempt)
        if names in tried:
            continue
        tried.add(names)
        chain, problem = _complete_once(tl, lifter, attempt, has_last)
        if chain is not None:
            return chain, None
        first_problem = first_problem or problem
    return None, first_problem


def _complete_once(
    tl: Timeline, lifter: Lifter, seq: list[gs.Tensor], has_last: bool
) -> tuple[Chain | None, ChainProblem | None]:
    where = f"{seq[0].name} … {seq[-1].name}"
    found_pair = False
    if len(seq) >= 2:
        ref = template(seq[1], seq[0], order=tl.order)
        ref_sig = signature(ref, lifter)
        links = [ref]
        for i in range(1, len(seq) - 1):
            link = template(seq[i + 1], seq[i], order=tl.order)
            if signature(link, lifter) != ref_sig:
                return None, ChainProblem(
                    where,
                    f"step {i + 1} ({seq[i + 1].name}) is not computed like step 1 "
                    f"({seq[1].name}): the unrolled steps are not copies of one step",
                )
            links.append(link)
    else:
        found = {}

        def accept(v, tm):
            binding: dict = {}
            if match_backward(tm, seq[0], lifter, binding) and "hole" in binding:
                found["h0"] = binding["hole"]
                return True
            return False

        nxt = _forward(tl, lifter, seq[0], accept)
        if nxt is None:
            return None, None  # not a recurrence: no later step depends on it the same way
        ref = template(nxt, seq[0], order=tl.order)
        ref_sig = signature(ref, lifter)
        links = [ref]
        found_pair = True
        seq = seq + [nxt]  # the only candidate is h_1 of a two-step loop: nxt is h_T
    # h_0: the tensor the first step uses where later steps use h_{t-1}.
    binding: dict = {}
    if not match_backward(ref, seq[0], lifter, binding) or "hole" not in binding:
        return None, ChainProblem(
            where,
            f"the first step ({seq[0].name}) is not computed like the later steps "
            "(no initial state h_0 found in the same position)",
        )
    h0 = binding["hole"]
    # The step that produced h_0 may itself be a copy (the loop's first state was not a
    # candidate): walk back while it is.
    while tl.time_of(h0):
        earlier: dict = {}
        if not match_backward(ref, h0, lifter, earlier) or "hole" not in earlier:
            break
        seq = [h0, *seq]
        links = [template(seq[1], seq[0], order=tl.order), *links]
        h0 = earlier["hole"]
    first = template(seq[0], h0, graph=tl.graph)
    # h_T: the tensor of the last step computed like the others, from h_{T-1}.
    if found_pair or has_last:
        states = [h0, *seq]
        links = [first, *links]
    else:
        last = seq[-1]
        h_last = _forward(tl, lifter, last, lambda v, tm: signature(tm, lifter) == ref_sig)
        if h_last is None:
            return None, ChainProblem(where, f"no final step computed like the others after {last.name}")
        states = [h0, *seq, h_last]
        links = [first, *links, template(h_last, last, order=tl.order)]
    if len({s.name for s in states}) != len(states):
        return None, None  # a tensor feeding itself through a later step is no chain of states
    chain = Chain(states, links, "sequence", folded_first=h0.name.endswith(FOLDED_ZEROS_SUFFIX))
    problem = check_frames(tl, chain)
    if problem:
        return None, ChainProblem(chain.where(), problem)
    return chain, None


def check_frames(tl: Timeline, chain: Chain) -> str | None:
    """Every leaf of step i reads frame first_frame + i only (or no frame); sets first_frame."""
    first_step = None
    for i, link in enumerate(chain.links):
        for leaf in link.leaves():
            times = tl.time_of(leaf)
            if not times:
                continue
            if len(times) > 1:
                return f"step {i} uses {leaf.name!r}, which depends on several frames {sorted(times)}"
            (t,) = times
            if first_step is None:
                first_step = t - i
            if t != first_step + i:
                return f"step {i} reads frame {t} through {leaf.name!r} (expected frame {first_step + i})"
    if first_step is not None and first_step < 0:
        return f"the recurrence starts before frame 0 (frame {first_step})"
    chain.first_frame = first_step or 0
    return None


def _state_pairs(tl: Timeline, lifter: Lifter, used: set[str]) -> tuple[list[Chain], list[ChainProblem]]:
    """Step-form chains: graph input ``state.X`` → graph output ``next_state.X``."""
    outputs = {o.name: o for o in tl.graph.outputs}
    pairs = []
    for gi in tl.graph.inputs:
        if not gi.name.startswith(STATE_IN_PREFIX):
            continue
        go = outputs.get(STATE_OUT_PREFIX + gi.name[len(STATE_IN_PREFIX) :])
        if go is None or go.name not in descendants(gi):
            continue
        link = template(go, gi)
        if all(n.op in DATA_MOVEMENT for n in link.nodes()):
            continue  # a shift register or a KV-cache append: data movement, not a recurrence
        pairs.append((gi, go, link))
    # What each recurrent state reaches without going through its own new value: a step that
    # reads the *old* value of another state is coupled to it (xLSTM's C reads m_{t-1}); one that
    # reads only new values (the next layer reads the new C, n, m) is not.
    new_values = {go.name for _, go, _ in pairs}
    recurrent = {gi.name: descendants(gi, stop=new_values, through_fused=False) for gi, go, _ in pairs}
    chains, problems = [], []
    for gi, go, link in pairs:
        if gi.name in used or go.name in used:
            continue
        chain = Chain([gi, go], [link], "step")
        if any(is_framefuse(n) for n in chain.nodes()):
            continue  # already fused
        chain.coupled_with = sorted(
            other
            for other, down in recurrent.items()
            if other != gi.name and any(leaf.name in down for leaf in link.leaves())
        )
        if not _same_shape(tl, gi, go):
            problems.append(
                ChainProblem(
                    chain.where(),
                    f"state {gi.name} {tl.shapes.shape(gi)} and {go.name} {tl.shapes.shape(go)} differ in shape",
                )
            )
            continue
        problem = check_frames(tl, chain)
        if problem:
            problems.append(ChainProblem(chain.where(), problem))
            continue
        chains.append(chain)
    return chains, problems
