"""LSTMSeq: ONNX LSTM (forward, gates i, o, f, c) as one persistent kernel. See plugins/OPS.md."""

from framefuse.plugins.lstm_seq.interface import launch, lstm_seq, workspace_size
from framefuse.plugins.lstm_seq.naive import reference
from framefuse.plugins.lstm_seq.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "lstm_seq", "workspace_size"]
