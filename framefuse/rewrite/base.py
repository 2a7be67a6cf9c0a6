"""The shape every rewrite pass has, and what a pass reports.

A pass finds one pattern in a plain exported graph and replaces each occurrence with one node of
the ``framefuse`` domain. A pass that is unsure leaves the graph alone and says why (``Declined``).
"""

from __future__ import annotations

import itertools
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
