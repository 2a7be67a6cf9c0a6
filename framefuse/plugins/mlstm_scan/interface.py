"""Python entry of the MLSTMScan kernel: checks, output allocation, launch.

As DeltaRuleScan: `mlstm_scan_<dtype>_k32|k64|k128` holds Dk ≤ 32, 64, 128 columns of each row of
C (and a copy of n) in registers; grid (B·H, ⌈Dv / rows⌉) with 64, 32, 16 rows per block.
"""

from __future__ import annotations

import math
import pathlib

import torch

from framefuse.plugins import cuda
from framefuse.plugins.checks import OpArgumentError, prepare
from framefuse.plugins.mlstm_scan.schema import MAX_DK, OP, SCHEMA, check_shapes

SOURCE = pathlib.Path(__file__).with_name("mlstm_scan.cu")
THREADS = 128
VARIANTS = ((32, 64), (64, 32), (128, 16))  # (largest Dk, rows of C per block)


def variant(Dk: int) -> tuple[int, int]:
    for max_dk, rows in VARIANTS:
        if Dk <= max_dk:
            return max_dk, rows
    raise OpArgumentError(f"{OP}: key dim Dk={Dk} is larger than the kernel supports ({MAX_DK})")


def _check_attrs(attrs) -> None:
    if not math.isfinite(attrs["eps"]):
        raise OpArgumentError(f"{OP}: attribute eps={attrs['eps']!r} must be finite")


def launch(inputs, attrs=None, outputs=None, stream=None) -> list[torch.Tensor]:
    """[h, C_last, n_last, m_last] = MLSTMScan(q, k, v, i_pre, f_pre[, C0, n0, m0]) on the GPU;
    attrs: eps. outputs: the four preallocated, or None to allocate. Never synchronises."""
    call = prepare(SCHEMA, inputs, attrs, outputs, shape_rule=check_shapes, attr_rule=_check_attrs)
    eps = float(call.attrs["eps"])
    q, k, v, i_pre, f_pre, *states = call.inputs
    outs = call.outputs
    dtype, device = call.dtype, call.device
    B, H, T, Dk, Dv = (call.dims[n] for n in ("B", "H", "T", "Dk", "Dv"))
    max_dk, rows = variant(Dk)

    kernel = cuda.get_kernel(SOURCE, f"mlstm_scan_{cuda.dtype_suffix(dtype)}_k{max_dk}", device=device.index)
    kernel.launch(
        (B * H, (Dv + rows - 1) // rows),
        (THREADS,),
        [
            cuda.ptr(q),
            cuda.ptr(k),
            cuda.ptr(v),
            cuda.ptr(i_pre),
            cuda.ptr(f_pre),
            *(cuda.ptr(x) for x in states),
            *(cuda.ptr(x) for x in outs),
            cuda.i32(B * H),
            cuda.i32(T),
            cuda.i32(Dk),
            cuda.i32(Dv),
            cuda.f32(eps),
        ],
        stream=stream,
        op=OP,
        detail=f"q {list(q.shape)} v {list(v.shape)} {str(dtype).removeprefix('torch.')}",
    )
    return outs


def mlstm_scan(q, k, v, i_pre, f_pre, C0=None, n0=None, m0=None, *, eps=0.0, out=None, stream=None):
    """Stabilised mLSTM recurrence on the GPU; returns (h, C_last, n_last, m_last).
    eps: added to the read-out's denominator. out: optional preallocated (h, C_last, n_last, m_last)."""
    h, C, n, m = launch(
        [q, k, v, i_pre, f_pre, C0, n0, m0],
        {"eps": eps},
        outputs=None if out is None else list(out),
        stream=stream,
    )
    return h, C, n, m
