"""GRUSeq: ONNX GRU (forward, gates z, r, h, linear_before_reset=1) as one persistent kernel.
See plugins/OPS.md."""

from framefuse.plugins.gru_seq.interface import gru_seq, launch, workspace_size
from framefuse.plugins.gru_seq.naive import reference
from framefuse.plugins.gru_seq.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "gru_seq", "workspace_size"]
