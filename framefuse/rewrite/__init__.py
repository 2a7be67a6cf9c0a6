"""Graph rewrites: find recurrences and attention in a plain exported ONNX graph and replace each
with one node of the ``framefuse`` domain (see ``framefuse/plugins/OPS.md``)."""

from framefuse.rewrite.base import (
    DOMAIN,
    AnchoredPass,
    Decline,
    Declined,
    Match,
    NotACandidate,
    PassResult,
    RewriteContext,
    RewritePass,
)
from framefuse.rewrite.pipeline import RewriteError, default_passes, rewrite_model
from framefuse.rewrite.report import RewriteReport

__all__ = [
    "DOMAIN",
    "AnchoredPass",
    "Decline",
    "Declined",
    "Match",
    "NotACandidate",
    "PassResult",
    "RewriteContext",
    "RewriteError",
    "RewritePass",
    "RewriteReport",
    "default_passes",
    "rewrite_model",
]
