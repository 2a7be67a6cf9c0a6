"""ToySilu on the GPU: checks, output allocation, the launch on the caller's stream (never
synchronising). One thread an element: grid ⌈n / 256⌉, block 256."""

from __future__ import annotations

import pathlib

from framefuse.plugins import cuda
from framefuse.plugins.checks import check_outputs, check_storage_dtype, check_tensor
from toy_ops.toy_silu.schema import OP, SCHEMA

SOURCE = pathlib.Path(__file__).with_name("toy_silu.cu")
THREADS = 256


def launch(inputs, attrs=None, outputs=None, stream=None):
    """[y] = ToySilu(x). outputs: [y] preallocated, or None to allocate."""
    import torch

    SCHEMA.check_arity(len(inputs))
    SCHEMA.attrs_with_defaults(attrs)  # no attributes: rejects unknown ones
    x = check_tensor(OP, "x", inputs[0])
    check_storage_dtype(OP, "x", x)
    (shape,) = SCHEMA.infer_shapes([tuple(x.shape)], {})
    if outputs is None:
        y = torch.empty(shape, dtype=x.dtype, device=x.device)
    else:
        (y,) = check_outputs(OP, list(outputs), [("y", shape, x.dtype)], x.device)
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
