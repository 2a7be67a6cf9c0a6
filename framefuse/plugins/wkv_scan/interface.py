"""Python entry of the WKVScan kernel: checks, output allocation, launch.

One thread per (batch, channel): grid (B·⌈C / 128⌉,), block 128 (see wkv_scan.cu).
"""

from __future__ import annotations

import pathlib

import torch

from framefuse.plugins import cuda
from framefuse.plugins.checks import prepare
from framefuse.plugins.wkv_scan.schema import OP, SCHEMA, check_shapes

SOURCE = pathlib.Path(__file__).with_name("wkv_scan.cu")
THREADS = 128


def launch(inputs, attrs=None, outputs=None, stream=None) -> list[torch.Tensor]:
    """[y, num_last, den_last, max_last] = WKVScan(k, v, w, u[, num0, den0, max0]) on the GPU.
    outputs: preallocated in that order, or None to allocate. Launches on `stream`, never
    synchronises."""
    call = prepare(SCHEMA, inputs, attrs, outputs, shape_rule=check_shapes)
    k, v, w, u, *states = call.inputs
    outs = call.outputs
    dtype, device = call.dtype, call.device
    B, T, C = (call.dims[n] for n in ("B", "T", "C"))

    kernel = cuda.get_kernel(SOURCE, f"wkv_scan_{cuda.dtype_suffix(dtype)}", device=device.index)
    kernel.launch(
        (B * ((C + THREADS - 1) // THREADS),),
        (THREADS,),
        [
            cuda.ptr(k),
            cuda.ptr(v),
            cuda.ptr(w),
            cuda.ptr(u),
            *(cuda.ptr(x) for x in states),
            *(cuda.ptr(x) for x in outs),
            cuda.i32(B),
            cuda.i32(T),
            cuda.i32(C),
        ],
        stream=stream,
        op=OP,
        detail=f"k {list(k.shape)} {str(dtype).removeprefix('torch.')}",
    )
    return outs


def wkv_scan(k, v, w, u, num0=None, den0=None, max0=None, *, out=None, stream=None):
    """RWKV-4 WKV on the GPU; returns (y [B,T,C], num_last, den_last, max_last [B,C] float32).
    w is the per-step log decay −exp(time_decay), u the time_first bonus. out: optional
    preallocated (y, num_last, den_last, max_last)."""
    return tuple(launch([k, v, w, u, num0, den0, max0], outputs=None if out is None else list(out), stream=stream))
