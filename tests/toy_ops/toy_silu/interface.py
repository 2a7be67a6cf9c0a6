"""ToySilu on the GPU: checks, output allocation, the launch on the caller's stream (never
synchronising). One thread an element: grid ⌈n / 256⌉, block 256."""

from __future__ import annotations

import pathlib

from framefuse.plugins import cuda
from framefuse.plugins.checks import prepare
from toy_ops.toy_silu.schema import OP, SCHEMA

SOURCE = pathlib.Path(__file__).with_name("toy_silu.cu")
THREADS = 256


def launch(inputs, attrs=None, outputs=None, stream=None):
    """[y] = ToySilu(x). outputs: [y] preallocated, or None to allocate."""
    call = prepare(SCHEMA, inputs, attrs, outputs)
    (x,), (y,) = call.inputs, call.outputs
    n = x.numel()
    if n:
        kernel = cuda.get_kernel(SOURCE, f"toy_silu_{cuda.dtype_suffix(x.dtype)}", device=x.device.index)
        kernel.launch(
            ((n + THREADS - 1) // THREADS,),
            (THREADS,),
            [cuda.ptr(x), cuda.ptr(y), cuda.i64(n)],
            stream=stream,
            op=OP,
            detail=f"x {list(x.shape)} {str(x.dtype).removeprefix('torch.')}",
        )
    return [y]
