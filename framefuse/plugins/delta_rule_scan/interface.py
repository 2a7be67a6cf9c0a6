"""Python entry of the DeltaRuleScan kernel: checks, output allocation, launch.

The kernel instantiation is chosen by Dk: `delta_rule_scan_<dtype>_k32|k64|k128` keeps Dk ≤ 32,
64, 128 columns of each row of S in registers (2, 4, 8 lanes per row × 16 columns); a block
holds 64, 32, 16 rows of S, and the grid is (B·H, ⌈Dv / rows⌉).
"""

from __future__ import annotations

import pathlib

import torch

from framefuse.plugins import cuda
from framefuse.plugins.checks import OpArgumentError, prepare
from framefuse.plugins.delta_rule_scan.schema import MAX_DK, OP, SCHEMA, check_shapes

SOURCE = pathlib.Path(__file__).with_name("delta_rule_scan.cu")
THREADS = 128
# (largest Dk, rows of S per block) of each instantiation, smallest first
VARIANTS = ((32, 64), (64, 32), (128, 16))


def variant(Dk: int) -> tuple[int, int]:
    """(instantiation Dk, rows per block) for a key dim Dk."""
    for max_dk, rows in VARIANTS:
        if Dk <= max_dk:
            return max_dk, rows
    raise OpArgumentError(f"{OP}: key dim Dk={Dk} is larger than the kernel supports ({MAX_DK})")


def launch(inputs, attrs=None, outputs=None, stream=None) -> list[torch.Tensor]:
    """[o, S_last] = DeltaRuleScan(q, k, v, beta[, S0]) on the GPU. outputs: [o, S_last]
    preallocated, or None to allocate. Launches on `stream` and never synchronises."""
    call = prepare(SCHEMA, inputs, attrs, outputs, shape_rule=check_shapes)
    q, k, v, beta, S0 = call.inputs
    o, S_last = call.outputs
    dtype, device = call.dtype, call.device
    B, H, T, Dk, Dv = (call.dims[n] for n in ("B", "H", "T", "Dk", "Dv"))
    max_dk, rows = variant(Dk)

    kernel = cuda.get_kernel(SOURCE, f"delta_rule_scan_{cuda.dtype_suffix(dtype)}_k{max_dk}", device=device.index)
    kernel.launch(
        (B * H, (Dv + rows - 1) // rows),
        (THREADS,),
        [
            cuda.ptr(q),
            cuda.ptr(k),
            cuda.ptr(v),
            cuda.ptr(beta),
            cuda.ptr(S0),
            cuda.ptr(o),
            cuda.ptr(S_last),
            cuda.i32(B * H),
            cuda.i32(T),
            cuda.i32(Dk),
            cuda.i32(Dv),
        ],
        stream=stream,
        op=OP,
        detail=f"q {list(q.shape)} v {list(v.shape)} {str(dtype).removeprefix('torch.')}",
    )
    return [o, S_last]


def delta_rule_scan(q, k, v, beta, S0=None, *, out=None, stream=None):
    """DeltaNet recurrence on the GPU; returns (o [B,H,T,Dv], S_last [B,H,Dk,Dv] float32).
    out: optional preallocated (o, S_last)."""
    o, S_last = launch([q, k, v, beta, S0], outputs=None if out is None else list(out), stream=stream)
    return o, S_last
