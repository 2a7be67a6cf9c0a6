"""Chunked (parallel) forms of a scan that no pass mapped: reported, by name.

A chunked scan has no per-step loop: the decay between positions s ≤ t of a chunk is
exp(Σ_{s<u≤t} log a_u), computed for all pairs at once as a *segment sum* of a CumSum
(``cumsum[t] − cumsum[s]``, masked to t ≥ s) and passed through Exp, and the chunks are chained
through a short loop over the chunk states. Mamba2's SSD is mapped to SelectiveScan by
``framefuse.rewrite.ssd`` (which proves it on random inputs first); any segment sum still in the
graph after that (a form that check rejected, the chunked linear-attention family) is reported
here with the CumSum and Exp named, instead of passing silently as "nothing to fuse".
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from framefuse.rewrite.base import AnchoredPass, Decline, RewriteContext
from framefuse.rewrite.unrolled.graphutil import is_framefuse

# What may sit between the CumSum and the Exp of a segment sum (broadcasts, the pairwise
# difference, the causal mask, a transpose of the chunk axes).
_SEGSUM_PATH = {
    "Sub",
    "Where",
    "Unsqueeze",
    "Expand",
    "Reshape",
    "Transpose",
    "Slice",
    "Gather",
    "Mul",
    "CumSum",
    "Cast",
    "Identity",
    "Squeeze",
    "Add",
    "Neg",
}
_DEPTH = 8


class ChunkedScanReportPass(AnchoredPass):
    """Anchors: (CumSum, Exp) of each segment sum left (one per Exp); each is declined."""

    name = "unrolled-chunked-scan"

    def anchors(self, graph: gs.Graph):
        seen_exp: set[str] = set()
        for node in list(graph.nodes):
            if node.op != "CumSum" or is_framefuse(node):
                continue
            exp = _segment_exp(node)
            if exp is None or exp.name in seen_exp:
                continue
            seen_exp.add(exp.name)
            yield node, exp

    def where(self, anchor) -> str:
        cumsum, exp = anchor
        return f"CumSum {cumsum.name!r} → Exp {exp.name!r}"

    def rewrite(self, graph: gs.Graph, ctx: RewriteContext, anchor):
        raise Decline(
            "a chunked (parallel) scan: the decays are exp of segment sums of a cumulative sum rather "
            "than a per-step recurrence, and no pass mapped it (Mamba2's SSD, the chunked delta rule "
            "and gated linear attention are mapped by chunked-ssd, chunked-delta-rule and chunked-gla, "
            "whose declines say why not here); export the model's per-step "
            "path (a loop over time) to fuse it"
        )


def _segment_exp(cumsum: gs.Node) -> gs.Node | None:
    """The Exp reached from ``cumsum`` through a pairwise difference (a Sub) within _DEPTH nodes."""
    frontier = [(cumsum.outputs[0], False)]
    for _ in range(_DEPTH):
        nxt = []
        for t, subtracted in frontier:
            for node in t.outputs:
                if node.op == "Exp" and subtracted:
                    return node
                if node.op in _SEGSUM_PATH and node.outputs:
                    nxt.append((node.outputs[0], subtracted or node.op == "Sub" or node.op == "CumSum"))
        frontier = nxt
    return None
