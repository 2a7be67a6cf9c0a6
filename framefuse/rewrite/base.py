"""The shape every rewrite pass has, what a pass reports, and the driver of the graph passes.

A pass finds one pattern in a plain exported graph and replaces each occurrence with one node of
the ``framefuse`` domain. A pass that is unsure leaves the graph alone and says why: it raises
:class:`Decline` with the reason, and the report gets a ``Declined`` row naming the pass and the
node. Every pass but the unrolled-recurrence family (``rewrite/unrolled``, whose driver walks
chains of per-step copies over several rounds) is an :class:`AnchoredPass`: the anchors it tries,
one rewrite of an anchor, and this one loop around them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import onnx_graphsurgeon as gs

DOMAIN = "framefuse"


@dataclass
class Match:
    pass_name: str
    op_type: str  # the framefuse op that replaced the pattern
    node_name: str  # name of the new node
    removed: list[str]  # names of the nodes it replaced
    detail: dict = field(default_factory=dict)


@dataclass
class Declined:
    pass_name: str
    where: str  # node name(s) of the candidate
    reason: str


@dataclass
class PassResult:
    matches: list[Match] = field(default_factory=list)
    declined: list[Declined] = field(default_factory=list)


@dataclass
class RewriteContext:
    opset: int = 17
    metadata: dict = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=itertools.count)

    def unique_name(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter)}"


class Decline(Exception):
    """A pass leaves this candidate alone: the message is the reason the report gives (the driver
    adds the pass's name and the node)."""


class NotACandidate(Exception):
    """The anchor is not the pass's pattern after all (nothing to report)."""


def node_label(node: gs.Node) -> str:
    return node.name or f"<unnamed {node.op}>"


class RewritePass(Protocol):
    name: str

    def run(self, graph: gs.Graph, ctx: RewriteContext) -> PassResult: ...


def make_framefuse_node(
    graph: gs.Graph,
    ctx: RewriteContext,
    op_type: str,
    inputs: list[gs.Tensor | None],
    outputs: list[gs.Variable],
    attrs: dict | None = None,
) -> gs.Node:
    """Append one framefuse node; ``None`` inputs become empty optional inputs."""
    ins = [t if t is not None else gs.Variable.empty() for t in inputs]
    # Trailing absent optionals are dropped, as ONNX allows.
    while ins and isinstance(ins[-1], gs.Variable) and ins[-1].name == "":
        ins.pop()
    node = gs.Node(
        op=op_type, name=ctx.unique_name(op_type), domain=DOMAIN, attrs=dict(attrs or {}), inputs=ins, outputs=outputs
    )
    graph.nodes.append(node)
    return node


class AnchoredPass:
    """The driver of a graph pass: it tries each of ``anchors(graph)`` in turn with ``rewrite``,
    which returns the Match (a list of them, None for nothing done, or a ``Declined`` row when it
    changed the graph without fusing anything, as UnrollLoopsPass does), raises :class:`Decline`
    (reported as ``Declined(name, where(anchor), reason(anchor, exc))``) or
    :class:`NotACandidate` (nothing reported).

    ``anchors`` is a generator, so an anchor is looked at after the rewrites before it; one that
    an earlier rewrite removed is skipped by the generator itself. ``tidy`` says when the driver
    cleans up and sorts the graph: ``"match"`` after each match, ``"attempt"`` after each anchor
    tried, ``"end"`` once at the end when something matched, ``None`` never (the pipeline cleans
    up after every pass). ``sort_first``: sort the graph before the anchors are looked for.
    """

    name = "pass"
    reason_prefix = ""  # put before every reason in the report ("log-space linear scan: ")
    tidy: str | None = None
    sort_first = False

    def anchors(self, graph: gs.Graph) -> Iterable:  # pragma: no cover - abstract
        raise NotImplementedError

    def rewrite(
        self, graph: gs.Graph, ctx: RewriteContext, anchor
    ) -> Match | list[Match] | Declined | None:  # pragma: no cover
        raise NotImplementedError

    def where(self, anchor) -> str:
        return node_label(anchor)

    def reason(self, anchor, exc: Decline) -> str:
        return f"{self.reason_prefix}{exc}"

    def run(self, graph: gs.Graph, ctx: RewriteContext) -> PassResult:
        result = PassResult()
        if self.sort_first:
            graph.toposort()
        for anchor in self.anchors(graph):
            try:
                found = self.rewrite(graph, ctx, anchor)
            except NotACandidate:
                continue
            except Decline as exc:
                result.declined.append(Declined(self.name, self.where(anchor), self.reason(anchor, exc)))
                if self.tidy == "attempt":
                    graph.cleanup().toposort()
                continue
            if isinstance(found, Declined):  # the graph changed, nothing fused: the report says how
                result.declined.append(found)
                continue
            matches = found if isinstance(found, list) else [found] if found is not None else []
            result.matches.extend(matches)
            if self.tidy == "attempt" or (self.tidy == "match" and matches):
                graph.cleanup().toposort()
        if self.tidy == "end" and result.matches:
            graph.cleanup().toposort()
        return result
