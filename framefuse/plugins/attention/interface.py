"""Python entry of the Attention kernels: checks, output allocation, kernel choice, launch.

Kernel choice (see attention.cu):
- Tq == 1 (the step form): `attention_decode_*` — one block per (batch, head), keys split over
  lane groups;
- fp16/bf16 on sm_80+ with 16-byte aligned q, k, v, o: `attention_mma_*` — tensor cores;
- otherwise (fp32, sm_75, unaligned views): `attention_simt_*` — CUDA cores, fp32 throughout.
Head dims other than 32/64/128 run the reference on the GPU (OPS.md), on the same stream.
"""

from __future__ import annotations

import contextlib
import math
import pathlib

import torch

from framefuse.plugins import cuda
from framefuse.plugins.attention.naive import reference
from framefuse.plugins.attention.schema import KERNEL_HEAD_DIMS, OP, SCHEMA, check_shapes, mask_layout
from framefuse.plugins.checks import OpArgumentError, check_attr_range, prepare

SOURCE = pathlib.Path(__file__).with_name("attention.cu")
THREADS = 128
MMA_ROWS = 64  # query rows per block of attention_mma
SIMT_ROWS = 32  # query rows per block of attention_simt


def _aligned16(*tensors) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def kernel_name(dtype: torch.dtype, head_dim: int, Tq: int, cc: tuple[int, int], aligned: bool) -> tuple[str, int]:
    """(entry name, query rows per block) of the kernel that serves these arguments."""
    suffix = cuda.dtype_suffix(dtype)
    if Tq == 1:
        return f"attention_decode_{suffix}_d{head_dim}", 1
    if dtype != torch.float32 and tuple(cc) >= (8, 0) and aligned:
        return f"attention_mma_{suffix}_d{head_dim}", MMA_ROWS
    return f"attention_simt_{suffix}_d{head_dim}", SIMT_ROWS


@contextlib.contextmanager
def _on_stream(stream, device):
    """Run torch ops on `stream` (None: torch's current stream)."""
    if stream is None:
        yield
        return
    if isinstance(stream, torch.cuda.Stream):
        torch_stream = stream
    else:
        torch_stream = torch.cuda.ExternalStream(cuda.stream_handle(stream), device=device)
    with torch.cuda.stream(torch_stream):
        yield


def launch(inputs, attrs=None, outputs=None, stream=None) -> list[torch.Tensor]:
    """o = Attention(q, k, v[, mask]) on the GPU. inputs in schema order (mask may be None or left
    out); attrs: scale (default 1/√Dh), causal (0/1); outputs: [o] preallocated, or None to
    allocate. Launches on `stream` (None: torch's current stream) and never synchronises."""
    call = prepare(SCHEMA, inputs, attrs, outputs, shape_rule=check_shapes, also_float32=("mask",))
    q, k, v, mask = call.inputs
    (o,) = call.outputs
    dtype, device = call.dtype, call.device
    B, Hq, Hkv, Tq, Tk, Dh = (call.dims[n] for n in ("B", "Hq", "Hkv", "Tq", "Tk", "Dh"))

    scale = call.attrs["scale"] if call.attrs["scale"] is not None else 1.0 / math.sqrt(Dh)
    causal = call.attrs["causal"]
    check_attr_range(OP, "causal", causal, choices=(0, 1))
    if not math.isfinite(scale):
        raise OpArgumentError(f"{OP}: scale={scale!r} must be finite")

    if Dh not in KERNEL_HEAD_DIMS:
        # OPS.md: other head dims use the reference (torch ops on the same stream; allocates).
        with _on_stream(stream, device):
            (result,) = reference(q, k, v, mask, scale=scale, causal=causal)
            o.copy_(result)
        return [o]

    cc = cuda.device_properties(device.index)["cc"]
    name, rows = kernel_name(dtype, Dh, Tq, cc, _aligned16(q, k, v, o))
    kernel = cuda.get_kernel(SOURCE, name, device=device.index)
    n_qtiles = (Tq + rows - 1) // rows
    mask_batch_stride, mask_head_stride = (0, 0) if mask is None else mask_layout(mask.shape, B, Hq, Tq, Tk)
    kernel.launch(
        (n_qtiles * B * Hq,),
        (THREADS,),
        [
            cuda.ptr(q),
            cuda.ptr(k),
            cuda.ptr(v),
            cuda.ptr(mask),
            cuda.ptr(o),
            cuda.i32(B),
            cuda.i32(Hq),
            cuda.i32(Hkv),
            cuda.i32(Tq),
            cuda.i32(Tk),
            cuda.i64(mask_batch_stride),
            cuda.i64(mask_head_stride),
            cuda.i32(1 if mask is not None and mask.dtype == torch.float32 else 0),
            cuda.f32(scale),
            cuda.i32(causal),
        ],
        stream=stream,
        op=OP,
        detail=f"q {list(q.shape)} k {list(k.shape)} {str(dtype).removeprefix('torch.')} causal={causal}",
    )
    return [o]


def attention(q, k, v, mask=None, *, scale: float | None = None, causal: bool = False, out=None, stream=None):
    """softmax(scale·q kᵀ + mask) v on the GPU; returns o [B, Hq, Tq, Dh] (written into `out` if given)."""
    attrs = {"scale": scale, "causal": int(bool(causal))}
    (o,) = launch([q, k, v, mask], attrs, outputs=None if out is None else [out], stream=stream)
    return o
