"""SelectiveScan on the GPU: input checks, kernel variant choice and the cuda-python launch.

Variant choice (`plan`): a group of G threads owns one channel and each thread keeps NPT of its N
states in registers. N ≤ 128 → NPT = 4, G = the power of two ≥ N/4 (more threads per channel
shortens the per-step critical path, which is what a batch-1 game loop waits on); 128 < N ≤ 256 →
G = 32, NPT = 8. A block of 128 threads serves 128/G channels of one batch row; time is
sequential within a block (Mamba layers have D·B ≥ a few hundred channels, which fills the grid).
"""

from __future__ import annotations

import math
import pathlib

from framefuse.plugins import cuda
from framefuse.plugins.checks import OpArgumentError, Prepared, prepare
from framefuse.plugins.selective_scan.schema import MAX_STATE, OP, SCHEMA

SOURCE = pathlib.Path(__file__).with_name("selective_scan.cu")

THREADS = 128  # per block (matches the .cu)
TIME_CHUNK = 16  # TC in the .cu: steps of B/C staged in shared memory at once
MAX_GRID_Y = 65535  # batch rows beyond this are looped inside the kernel


def plan(batch: int, steps: int, channels: int, nstate: int, dtype: str) -> dict:
    """Launch plan (pure Python): kernel entry, grid, block, dynamic shared memory."""
    if not 1 <= nstate <= MAX_STATE:
        raise OpArgumentError(f"{OP}: state size N={nstate} must be between 1 and {MAX_STATE}")
    suffix = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    if nstate <= 128:
        per_thread = 4
        group = 1 << max(0, (math.ceil(nstate / per_thread) - 1).bit_length())
    else:
        per_thread, group = 8, 32
    channels_per_block = THREADS // group
    return {
        "kernel": f"selective_scan_g{group}_n{per_thread}_{suffix}",
        "group": group,
        "per_thread": per_thread,
        "grid": (max(1, math.ceil(channels / channels_per_block)), max(1, min(batch, MAX_GRID_Y)), 1),
        "block": (THREADS, 1, 1),
        "shared_mem": 2 * TIME_CHUNK * nstate * 4,
    }


def checked(inputs, attrs=None, outputs=None, *, cuda: bool = True) -> Prepared:
    """The call checked against the schema, with its outputs (cuda=False lets CPU tests
    reach every check but the device type)."""
    return prepare(SCHEMA, inputs, attrs, outputs, attr_rule=_check_attrs, limits={"N": (1, MAX_STATE)}, cuda=cuda)


def _check_attrs(attrs) -> None:
    if attrs["delta_softplus"] not in (0, 1):
        raise OpArgumentError(f"{OP}: attribute delta_softplus={attrs['delta_softplus']} must be 0 or 1")


def launch(inputs, attrs=None, outputs=None, stream=None):
    """SelectiveScan kernel entry (see OPS.md): inputs [x, dt, A, B, C, D?, z?, dt_bias?, h0?] →
    [y, h_last]. Writes into `outputs` when given (no allocation); launches on `stream` (None →
    torch's current stream); never synchronises."""
    import torch

    call = checked(inputs, attrs, outputs)
    x, dt, A, Bm, Cm, Dskip, z, dt_bias, h0 = call.inputs
    y, h_last = call.outputs
    delta_softplus = call.attrs["delta_softplus"]
    batch, steps, channels = x.shape
    nstate = A.shape[1]
    if batch * channels == 0:
        return [y, h_last]

    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    dtype = str(x.dtype).removeprefix("torch.")
    p = plan(batch, steps, channels, nstate, dtype)
    kernel = cuda.get_kernel(SOURCE, p["kernel"], device=device)
    args = [
        cuda.ptr(x),
        cuda.ptr(dt),
        cuda.ptr(A),
        cuda.ptr(Bm),
        cuda.ptr(Cm),
        cuda.ptr(Dskip),
        cuda.ptr(z),
        cuda.ptr(dt_bias),
        cuda.ptr(h0),
        cuda.ptr(y),
        cuda.ptr(h_last),
        cuda.i32(batch),
        cuda.i32(steps),
        cuda.i32(channels),
        cuda.i32(nstate),
        cuda.i32(delta_softplus),
    ]
    kernel.launch(
        p["grid"],
        p["block"],
        args,
        shared_mem=p["shared_mem"],
        stream=stream,
        op=OP,
        detail=f"x={list(x.shape)} {dtype}, N={nstate}, z={'yes' if z is not None else 'no'}",
    )
    return [y, h_last]


def selective_scan(
    x, dt, A, B, C, D=None, z=None, dt_bias=None, h0=None, *, delta_softplus=True, out=None, stream=None
):
    """Mamba selective scan on the GPU. Returns (y [B,T,D] in x's dtype, h_last [B,D,N] float32).

    out: optional preallocated (y, h_last). Asynchronous on `stream` (default: torch's current).
    """
    y, h_last = launch(
        [x, dt, A, B, C, D, z, dt_bias, h0],
        {"delta_softplus": int(bool(delta_softplus))},
        outputs=None if out is None else list(out),
        stream=stream,
    )
    return y, h_last
