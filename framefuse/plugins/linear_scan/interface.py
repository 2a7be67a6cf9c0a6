"""LinearScan on the GPU: input checks, algorithm choice and the cuda-python launch.

Algorithm choice (`plan`), with C = B·D channels, S = the GPU's SM count:
  * sequential — one thread per channel (vector of channels) walks T with the state in a
    register. Used when C ≥ S·512 (enough independent channels to keep every SM's memory pipe
    busy: this design reads a and b once, the minimum traffic) or when T < 64 (too few steps for
    splitting T to pay for its extra pass and block-wide scan; the game-loop step T = 1 and short
    windows land here).
  * chunked — otherwise: T is split into NC chunks of ≥ 16 steps so that C·NC threads approach
    S·2048 (a full GPU), with at most 1024 threads per block. Costs one extra read of a and b
    (mostly from L2) for T-fold more parallelism.
"""

from __future__ import annotations

import math
import pathlib

from framefuse.plugins import cuda
from framefuse.plugins.checks import OpArgumentError, prepare
from framefuse.plugins.linear_scan.schema import OP, SCHEMA

SOURCE = pathlib.Path(__file__).with_name("linear_scan.cu")

SEQ_BLOCK = 128  # threads per block of the sequential kernel (matches __launch_bounds__)
MIN_CHUNKED_STEPS = 64  # below this T the sequential kernel is used
MIN_CHUNK_LEN = 16  # fewest steps per chunk
SEQ_CHANNELS_PER_SM = 512  # C ≥ S·512: sequential already fills the GPU
CHUNK_THREADS_PER_SM = 2048  # target C·NC for the chunked kernel
MAX_CHUNK_THREADS = 1024  # block size limit of the chunked kernel (matches the .cu)

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def plan(
    batch: int,
    steps: int,
    channels: int,
    dtype: str,
    sm_count: int,
    *,
    algorithm: str | None = None,
    chunk_len: int | None = None,
    alignment: int = 16,
) -> dict:
    """Launch plan (pure Python, no GPU needed).

    dtype: "float32" | "float16" | "bfloat16". alignment: the largest power of two dividing every
    tensor's byte address (16 for fresh torch allocations). algorithm forces "sequential" or
    "chunked"; chunk_len forces the chunk length of the chunked kernel.
    Returns a dict with algorithm, kernel (entry name), grid, block and the extra int args.
    """
    if algorithm not in (None, "sequential", "chunked"):
        raise OpArgumentError(f"{OP}: algorithm={algorithm!r} must be 'sequential', 'chunked' or None")
    itemsize = _ITEMSIZE[dtype]
    suffix = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    n_channels = batch * channels
    if algorithm is None:
        use_chunked = steps >= MIN_CHUNKED_STEPS and n_channels < sm_count * SEQ_CHANNELS_PER_SM
        algorithm = "chunked" if use_chunked else "sequential"

    if algorithm == "chunked" and steps >= 2:
        # CH channels per block: a warp row of ≥ 32 bytes (one full sector) per time step
        ch = min(32 // itemsize, _pow2_ceil(n_channels))
        if chunk_len is None:
            nc_target = math.ceil(sm_count * CHUNK_THREADS_PER_SM / max(n_channels, 1))
            nc = max(1, min(nc_target, MAX_CHUNK_THREADS // ch, steps // MIN_CHUNK_LEN))
            chunk_len = math.ceil(steps / nc)
        chunk_len = max(1, int(chunk_len))
        nc = math.ceil(steps / chunk_len)  # every chunk non-empty: the last one ends at T-1
        if nc > MAX_CHUNK_THREADS // ch:
            raise OpArgumentError(
                f"{OP}: chunk_len={chunk_len} gives {nc} chunks, more than {MAX_CHUNK_THREADS // ch} per block"
            )
        if nc >= 2:
            return {
                "algorithm": "chunked",
                "kernel": f"linear_scan_chunked_{suffix}",
                "grid": (math.ceil(n_channels / ch), 1, 1),
                "block": (ch, nc, 1),
                "chunk_len": chunk_len,
                "extra": (chunk_len,),
            }

    # sequential: widest vector (≤ 16 bytes) that divides D and the tensors' alignment
    vec = 1
    for candidate in (8, 4, 2):
        nbytes = candidate * itemsize
        if nbytes <= 16 and channels % candidate == 0 and alignment % nbytes == 0:
            vec = candidate
            break
    lanes = n_channels // vec
    return {
        "algorithm": "sequential",
        "kernel": f"linear_scan_seq_v{vec}_{suffix}",
        "grid": (max(1, math.ceil(lanes / SEQ_BLOCK)), 1, 1),
        "block": (SEQ_BLOCK, 1, 1),
        "vec": vec,
        "extra": (),
    }


def _alignment(*tensors) -> int:
    align = 16
    for t in tensors:
        if t is not None:
            ptr = t.data_ptr()
            while align > 1 and ptr % align:
                align //= 2
    return align


def launch(inputs, attrs=None, outputs=None, stream=None, *, algorithm=None, chunk_len=None):
    """LinearScan kernel entry (see OPS.md): inputs [a, b, h0|None] → [h, h_last].

    Writes into `outputs` when given (no allocation), launches on `stream` (None → torch's current
    stream) and never synchronises. algorithm / chunk_len override `plan`'s choice (tests, benches).
    """
    import torch

    call = prepare(SCHEMA, inputs, attrs, outputs)
    a, b, h0 = call.inputs
    h, h_last = call.outputs
    batch, steps, channels = a.shape
    if outputs is not None:
        for name, t in (("a", a), ("b", b)):
            if h.numel() and h.data_ptr() == t.data_ptr():
                raise OpArgumentError(f"{OP}: output h must not share memory with input {name}")
    if batch * channels == 0:
        return [h, h_last]
    if batch * channels >= 2**31:
        raise OpArgumentError(f"{OP}: B*D = {batch * channels} channels exceeds the kernel's int32 range")

    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    props = cuda.device_properties(device)
    dtype = str(a.dtype).removeprefix("torch.")
    p = plan(
        batch,
        steps,
        channels,
        dtype,
        props["sm_count"],
        algorithm=algorithm,
        chunk_len=chunk_len,
        alignment=_alignment(a, b, h),
    )
    kernel = cuda.get_kernel(SOURCE, p["kernel"], device=device)
    args = [
        cuda.ptr(a),
        cuda.ptr(b),
        cuda.ptr(h0),
        cuda.ptr(h),
        cuda.ptr(h_last),
        cuda.i32(batch),
        cuda.i32(steps),
        cuda.i32(channels),
        *[cuda.i32(v) for v in p["extra"]],
    ]
    kernel.launch(
        p["grid"],
        p["block"],
        args,
        stream=stream,
        op=OP,
        detail=f"a={list(a.shape)} {dtype}, h0={'given' if h0 is not None else 'zeros'}, {p['algorithm']}",
    )
    return [h, h_last]


def linear_scan(a, b, h0=None, *, out=None, stream=None):
    """h_t = a_t * h_{t-1} + b_t on the GPU. Returns (h [B,T,D] in a's dtype, h_last [B,D] float32).

    out: optional preallocated (h, h_last). Asynchronous on `stream` (default: torch's current).
    """
    h, h_last = launch([a, b, h0], {}, outputs=None if out is None else list(out), stream=stream)
    return h, h_last
