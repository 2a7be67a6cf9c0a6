"""Python entry of the WKVScan kernel: checks, output allocation, launch.

One thread per (batch, channel): grid (B·⌈C / 128⌉,), block 128 (see wkv_scan.cu).
"""

from __future__ import annotations

import pathlib

import torch

from framefuse.plugins import cuda
from framefuse.plugins.checks import check_outputs, check_storage_dtype, check_tensor
from framefuse.plugins.wkv_scan.schema import OP, SCHEMA, check_shapes

SOURCE = pathlib.Path(__file__).with_name("wkv_scan.cu")
THREADS = 128
_STATES = ("num0", "den0", "max0")


def launch(inputs, attrs=None, outputs=None, stream=None) -> list[torch.Tensor]:
    """[y, num_last, den_last, max_last] = WKVScan(k, v, w, u[, num0, den0, max0]) on the GPU.
    outputs: preallocated in that order, or None to allocate. Launches on `stream`, never
    synchronises."""
    inputs = list(inputs)
    SCHEMA.check_arity(len(inputs))
    inputs += [None] * (len(SCHEMA.inputs) - len(inputs))
    SCHEMA.attrs_with_defaults(attrs)  # no attributes: rejects unknown ones
    k = check_tensor(OP, "k", inputs[0])
    check_storage_dtype(OP, "k", k)
    dtype, device = k.dtype, k.device
    v = check_tensor(OP, "v", inputs[1], dtype=dtype, device=device)
    w = check_tensor(OP, "w", inputs[2], dtype=torch.float32, device=device)
    u = check_tensor(OP, "u", inputs[3], dtype=torch.float32, device=device)
    states = [
        None if x is None else check_tensor(OP, name, x, dtype=torch.float32, device=device)
        for name, x in zip(_STATES, inputs[4:7])
    ]
    s = check_shapes([tuple(x.shape) if x is not None else None for x in (k, v, w, u, *states)])
    B, T, C = s["B"], s["T"], s["C"]

    specs = [("y", (B, T, C), dtype)] + [(name, (B, C), torch.float32) for name in ("num_last", "den_last", "max_last")]
    if outputs is None:
        outs = [torch.empty(shape, dtype=dt, device=device) for _, shape, dt in specs]
    else:
        outs = check_outputs(OP, list(outputs), specs, device)

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
