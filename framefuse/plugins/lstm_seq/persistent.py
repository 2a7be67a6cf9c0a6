"""Launch planning for the persistent recurrent kernel (persistent_rnn.cuh), shared by LSTMSeq,
GRUSeq and LiquidScan.

Paths (chosen per call from the device and the sizes; the choice is cached):

- cluster (compute capability >= 9.0 and H >= CLUSTER_MIN_HIDDEN): one 8-block thread-block
  cluster per batch group; block r owns hidden units [r*HB, (r+1)*HB), HB = ceil(H/8), and keeps
  its G*HB rows of R in shared memory; h_t is exchanged through distributed shared memory with one
  cluster barrier per step. On an H100 (227 KiB opt-in shared memory, one batch row per group)
  R stays in shared memory up to H = 320 (LSTM, fp32 storage) / 460 (LSTM, fp16/bf16),
  370 / 530 for GRU (3 gates).
- single block (compute capability < 9.0, or H < CLUSTER_MIN_HIDDEN): one block per batch group
  owns all H units; R stays in shared memory up to H ≈ 64-100 (fp32) on an A100-class GPU.
- either path with R too large for shared memory uses the `_rg` entry, which reads R from global
  memory (L2) every step: same results, slower.

Batch rows are split into independent groups (grid.y), at most one group per NB SMs so all
groups can run at once; a group handles BB = ceil(B / groups) rows.
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass

from framefuse.plugins import cuda as ffcuda
from framefuse.plugins.checks import OpArgumentError

KERNEL_THREADS = 512  # must match ffrnn::kThreads
CLUSTER_BLOCKS = 8  # must match ffrnn::kClusterBlocks
CLUSTER_MIN_HIDDEN = 64  # below this one block does the whole step faster than a cluster barrier

# Tests only: force a path, (cluster, r_in_smem), e.g. (False, False) for the single-block
# R-from-global entry, which no H100 size reaches otherwise. Clear `_plans` after changing it.
FORCED_PATH: tuple[bool, bool] | None = None


def _round4(x: int) -> int:
    return (x + 3) // 4 * 4


@dataclass(frozen=True)
class RnnPlan:
    entry: str  # kernel function name
    grid: tuple[int, int, int]
    block: int
    shared_mem: int
    BB: int  # batch rows per group
    HB: int  # hidden units per block
    KS: int  # K splits of the mat-vec
    KC: int  # columns per K split (multiple of 4)
    cluster: bool
    r_in_smem: bool


def k_split(G: int, HB: int, H: int) -> tuple[int, int]:
    """(KS, KC): how the block's threads split the mat-vec columns (mirrors persistent_rnn)."""
    HP = _round4(H)
    NQ = _round4(G * HB) // 4
    QT = min(NQ, KERNEL_THREADS)
    KS = max(1, min(KERNEL_THREADS // QT, HP // 4))
    KC = _round4(math.ceil(HP / KS))
    KS = math.ceil(HP / KC)
    return KS, KC


def smem_bytes(G: int, H: int, HB: int, BB: int, KS: int, elem_size: int, r_in_smem: bool) -> int:
    """Dynamic shared memory of one block (mirrors the layout in persistent_rnn.cuh)."""
    HP = _round4(H)
    NRP = _round4(G * HB)
    NRPS = NRP + 4
    BBP = 1 if BB == 1 else _round4(BB)
    floats = 2 * BBP * HP + KS * BBP * NRP + _round4(BBP * HB) + 2 * _round4(G * HB)
    return floats * 4 + (HP * NRPS * elem_size if r_in_smem else 0)


def plan(op: str, prefix: str, G: int, B: int, H: int, dtype_suffix: str, elem_size: int, props: dict) -> RnnPlan:
    """Pick path, batch grouping and shared memory for one call (see the module doc)."""
    cluster = tuple(props["cc"]) >= (9, 0) and H >= CLUSTER_MIN_HIDDEN
    if FORCED_PATH is not None:
        cluster = FORCED_PATH[0]
    NB = CLUSTER_BLOCKS if cluster else 1
    HB = math.ceil(H / NB)
    KS, KC = k_split(G, HB, H)
    limit = int(props["max_shared_per_block_optin"])
    groups = min(B, max(1, int(props["sm_count"]) // NB))
    BB = math.ceil(B / groups)
    r_in_smem = smem_bytes(G, H, HB, BB, KS, elem_size, True) <= limit
    if FORCED_PATH is not None:
        r_in_smem = r_in_smem and FORCED_PATH[1]
    if not r_in_smem:
        # fewer batch rows per group shrink the h buffers; R then comes from global memory anyway
        while BB > 1 and smem_bytes(G, H, HB, BB, KS, elem_size, False) > limit:
            BB = math.ceil(BB / 2)
        if smem_bytes(G, H, HB, BB, KS, elem_size, False) > limit:
            raise OpArgumentError(
                f"{op}: hidden size H={H} is too large for the persistent kernel on {props.get('name', 'this GPU')} "
                f"(needs {smem_bytes(G, H, HB, 1, KS, elem_size, False)} bytes of shared memory per block, "
                f"the limit is {limit})"
            )
    groups = math.ceil(B / BB)
    name = f"{prefix}_cluster_{dtype_suffix}" if cluster else f"{prefix}_{dtype_suffix}"
    if not r_in_smem:
        name += "_rg"
    return RnnPlan(
        entry=name,
        grid=(NB, groups, 1),
        block=KERNEL_THREADS,
        shared_mem=smem_bytes(G, H, HB, BB, KS, elem_size, r_in_smem),
        BB=BB,
        HB=HB,
        KS=KS,
        KC=KC,
        cluster=cluster,
        r_in_smem=r_in_smem,
    )


_plans: dict[tuple, RnnPlan] = {}


def cached_plan(op: str, prefix: str, G: int, B: int, H: int, dtype, device_index: int) -> RnnPlan:
    key = (prefix, G, B, H, str(dtype), device_index)
    found = _plans.get(key)
    if found is None:
        suffix = ffcuda.dtype_suffix(dtype)
        elem = 4 if suffix == "f32" else 2
        found = plan(op, prefix, G, B, H, suffix, elem, ffcuda.device_properties(device_index))
        _plans[key] = found
    return found


def launch_recurrence(
    op: str,
    source: pathlib.Path,
    prefix: str,
    G: int,
    *,
    xg,
    xg_sb: int,
    xg_st: int,
    R,
    bias,
    h0,
    c0,
    y,
    y_sb: int,
    y_st: int,
    h_last,
    c_last,
    T: int,
    B: int,
    H: int,
    ts: float,
    stream,
) -> RnnPlan:
    """Launch the persistent kernel on `stream` (never synchronises)."""
    device_index = R.device.index if R.device.index is not None else ffcuda.current_device()
    p = cached_plan(op, prefix, G, B, H, R.dtype, device_index)
    kernel = ffcuda.get_kernel(source, p.entry, device=device_index)
    args = [
        ffcuda.ptr(xg),
        ffcuda.i64(xg_sb),
        ffcuda.i64(xg_st),
        ffcuda.ptr(R),
        ffcuda.ptr(bias),
        ffcuda.ptr(h0),
        ffcuda.ptr(c0),
        ffcuda.ptr(y),
        ffcuda.i64(y_sb),
        ffcuda.i64(y_st),
        ffcuda.ptr(h_last),
        ffcuda.ptr(c_last),
        ffcuda.i32(T),
        ffcuda.i32(B),
        ffcuda.i32(H),
        ffcuda.i32(p.BB),
        ffcuda.i32(p.HB),
        ffcuda.i32(p.KS),
        ffcuda.i32(p.KC),
        ffcuda.f32(ts),
    ]
    kernel.launch(
        p.grid,
        p.block,
        args,
        shared_mem=p.shared_mem,
        stream=stream,
        op=op,
        detail=f"T={T} B={B} H={H} dtype={str(R.dtype).removeprefix('torch.')} path={p.entry}",
    )
    return p


def torch_stream_context(stream):
    """A context manager that makes torch ops run on `stream` (None/int handle/torch stream)."""
    import contextlib

    import torch

    if stream is None:
        return contextlib.nullcontext()
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    handle = ffcuda.stream_handle(stream)
    if handle == torch.cuda.current_stream().cuda_stream:
        return contextlib.nullcontext()
    if handle == 0:
        return torch.cuda.stream(torch.cuda.default_stream())
    return torch.cuda.stream(torch.cuda.ExternalStream(handle))
