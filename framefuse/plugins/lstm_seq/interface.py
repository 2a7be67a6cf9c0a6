"""LSTMSeq on the GPU: the input projection X W^T for all steps as one GEMM (torch/cuBLAS on the
caller's stream, into an fp32 workspace), then one persistent kernel for the recurrence
(persistent_rnn.cuh, planning in persistent.py). Never synchronises.

The same code serves GRUSeq (gru_seq/interface.py) through `launch_gated_rnn`.
"""

from __future__ import annotations

import pathlib

import torch

from framefuse.plugins import checks
from framefuse.plugins.lstm_seq import persistent
from framefuse.plugins.lstm_seq.schema import SCHEMA

SOURCE = pathlib.Path(__file__).resolve().parent / "lstm_seq.cu"


def workspace_size(T: int, B: int, I: int, H: int, dtype: torch.dtype, gates: int = 4) -> int:
    """float32 elements of the workspace: the projection [T*B, G*H], plus fp32 copies of X and W
    for fp16/bf16 storage (cuBLAS then accumulates and writes in fp32)."""
    n = T * B * gates * H
    if dtype != torch.float32:
        n += T * B * I + gates * H * I
    return n


def launch_gated_rnn(op, schema, gates, source, prefix, inputs, attrs, outputs, stream, workspace):
    """Shared body of LSTMSeq / GRUSeq `launch` (LSTM when the schema has a c0 input)."""
    has_cell = len(schema.inputs) == 6
    call = checks.prepare(schema, inputs, attrs, outputs)
    X, W, R, bias, h0 = call.inputs[:5]
    c0 = call.inputs[5] if has_cell else None
    outputs = call.outputs
    device, dtype = call.device, call.dtype
    T, B, I, H = (call.dims[n] for n in ("T", "B", "I", "H"))
    if B < 1 or H < 1 or I < 1:
        raise checks.OpArgumentError(f"{op}: B, H and I must be >= 1, got B={B} H={H} I={I}")

    need = workspace_size(T, B, I, H, dtype, gates)
    if workspace is None:
        workspace = torch.empty(max(need, 1), dtype=torch.float32, device=device)
    else:
        workspace = checks.check_tensor(op, "workspace", workspace, dtype=torch.float32, device=device)
        if workspace.numel() < need:
            raise checks.OpArgumentError(
                f"{op}: argument workspace: needs {need} float32 elements for T={T} B={B} I={I} H={H}, "
                f"got {workspace.numel()}"
            )
        workspace = workspace.reshape(-1)

    rows, cols = T * B, gates * H
    xg = workspace[: rows * cols].view(rows, cols)
    with persistent.torch_stream_context(stream):
        if rows > 0:
            if dtype == torch.float32:
                torch.mm(X.view(rows, I), W.t(), out=xg)
            else:
                # fp32 copies so cuBLAS accumulates and writes fp32 (the reference's math on the
                # same rounded inputs); the copies live in the workspace, no allocation.
                x32 = workspace[rows * cols : rows * cols + rows * I].view(rows, I)
                w32 = workspace[rows * cols + rows * I : need].view(cols, I)
                x32.copy_(X.view(rows, I))
                w32.copy_(W)
                torch.mm(x32, w32.t(), out=xg)
        persistent.launch_recurrence(
            op,
            source,
            prefix,
            gates,
            xg=xg,
            xg_sb=cols,
            xg_st=B * cols,
            R=R,
            bias=bias,
            h0=h0,
            c0=c0,
            y=outputs[0],
            y_sb=H,
            y_st=B * H,
            h_last=outputs[1],
            c_last=outputs[2] if has_cell else None,
            T=T,
            B=B,
            H=H,
            ts=1.0,
            stream=stream,
        )
    return outputs


def launch(inputs, attrs=None, outputs=None, stream=None, workspace=None):
    """LSTMSeq on the GPU. inputs: (X, W, R, bias|None, h0|None, c0|None); outputs (Y, h_last,
    c_last) are allocated unless given. workspace: optional float32 CUDA tensor of at least
    `workspace_size(T, B, I, H, dtype)` elements (allocated per call when None)."""
    return launch_gated_rnn(SCHEMA.name, SCHEMA, 4, SOURCE, "lstm_seq", inputs, attrs or {}, outputs, stream, workspace)


def lstm_seq(X, W, R, bias=None, h0=None, c0=None, *, out=None, workspace=None, stream=None):
    """(Y [T,B,H], h_last [B,H], c_last [B,H]) of an ONNX-semantics LSTM on CUDA tensors."""
    return tuple(launch([X, W, R, bias, h0, c0], {}, out, stream, workspace))
