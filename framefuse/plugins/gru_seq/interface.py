"""GRUSeq on the GPU: one GEMM for the input projection of all steps, then the persistent kernel
(shared with LSTMSeq: lstm_seq/interface.py, lstm_seq/persistent_rnn.cuh). Never synchronises."""

from __future__ import annotations

import pathlib

import torch

from framefuse.plugins.gru_seq.schema import SCHEMA
from framefuse.plugins.lstm_seq import interface as _lstm_interface

SOURCE = pathlib.Path(__file__).resolve().parent / "gru_seq.cu"


def workspace_size(T: int, B: int, I: int, H: int, dtype: torch.dtype) -> int:
    """float32 elements of the workspace (see lstm_seq.workspace_size)."""
    return _lstm_interface.workspace_size(T, B, I, H, dtype, gates=3)


def launch(inputs, attrs=None, outputs=None, stream=None, workspace=None):
    """GRUSeq on the GPU. inputs: (X, W, R, bias|None, h0|None); outputs (Y, h_last) are allocated
    unless given. workspace: optional float32 CUDA tensor of at least `workspace_size(...)` elements."""
    return _lstm_interface.launch_gated_rnn(
        SCHEMA.name, SCHEMA, 3, SOURCE, "gru_seq", inputs, attrs or {}, outputs, stream, workspace
    )


def gru_seq(X, W, R, bias=None, h0=None, *, out=None, workspace=None, stream=None):
    """(Y [T,B,H], h_last [B,H]) of an ONNX-semantics GRU (linear_before_reset=1) on CUDA tensors."""
    return tuple(launch([X, W, R, bias, h0], {}, out, stream, workspace))
