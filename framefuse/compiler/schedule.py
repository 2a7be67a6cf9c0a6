"""Schedule a step program onto one persistent kernel: which values go through global memory,
which are recomputed, which are computed once per thread block into shared memory, and which
block does what.

The kernel is a grid of G blocks that all run the same list of **tasks** in the same order. A
task produces one *materialized* value (a graph output, a next state, or an intermediate that
several blocks read whole) and splits its elements across the blocks. Inside a task a block
works in phases separated by ``__syncthreads``:

- **arrays**: values the block needs whole or reads from many of its elements, computed once
  into shared memory for the index range the block needs (a Dot's input rows; a LayerNorm's
  mean; the attention scores of the heads the block serves). An array element is computed by a
  thread (elementwise), or by a warp (a reduction, or a dot product with a weight row);
- **root**: each thread computes some of the task's elements, everything else inlined
  (elementwise ops, data movement as index arithmetic, small reductions as loops), and stores
  them.

A value read across blocks is *materialized*: its task stores each element with the launch's
epoch beside it in one 64-bit word and a reader spins on that word until the epoch is the
current one (flag-tagged data: a block waits only for what it reads; there is no grid barrier).
What to materialize is decided from the graph outputs down, on concrete indices: each occurrence
of a value in a task has a symbolic index (:mod:`framefuse.compiler.iexpr`) that is evaluated with
numpy over the whole task, which says how many elements read each value element and which index
range each block needs. The rules:

- a Dot computed many times over by the blocks (every block needs its whole result) is
  materialized at the top of the single-reader elementwise chain above it (the residual sum
  rather than the bare product); when its only reader is one replicated array that reads each
  product element once, that array is materialized instead (the SSM output, not its Δ);
- a replicated array that costs more than ``REPLICATE_OPS`` operations per thread is materialized;
- a task over its shared-memory budget materializes its largest array.

A materialized value that is pure data movement over materialized values and leaves (a KV cache
shifted by one slot) is still read inline by other tasks, so nobody waits for its copy. A graph
output computed exactly once per element inside another task (an LSTM's c beside its h, the SSM
state beside its output) is stored there as a side store and has no task of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

import numpy as np

from framefuse.compiler import iexpr as ix
from framefuse.compiler.ir import (
    BodyLoop,
    CompileError,
    Concat,
    DeltaScan,
    Dot,
    Ew,
    FrameConcat,
    Leaf,
    Map,
    Node,
    PartialSums,
    Program,
    Recur,
    Reduce,
    Scan,
)
from framefuse.compiler.ops import EW

# An inline value read by more than one element is cached in shared memory when its inline cost
# (elementwise ops; a reduction counts its extent) reaches this, or when it is a reduction.
CACHE_COST = 8
# ...except a scalar this cheap (a LayerNorm's 1 / sqrt(var + eps) once its two sums are arrays)
# read by units of at most one element a thread: each reader recomputes it. Cached, it is a phase
# of its own, a barrier and a pass over shared memory (H100: 170-270 cycles each for the two
# scalars of min_gru's LayerNorms), to save a reader a sqrt and a division.
SCALAR_RECOMPUTE_COST = 32
# ... and so is an array of at most this many such scalars (a row's or a head's: xLSTM's GroupNorm
# over its four heads computes σ and then 1 / σ, four elements each, two phases of a few threads;
# delta_net's per-head norms likewise). 1 by default (timed on the H100 for single scalars only);
# the build's stepkernel-fewer-phases tactics schedule with 64 (schedule's recomputed_scalars):
# the zoo's step kernels at embed 256, with the tactic's code settings, 364 -> 354 phases
# (delta_net 49 -> 43, xlstm 61 -> 57)
RECOMPUTED_SCALARS = 1
# A reduction over at most this many elements, each of them this cheap to recompute (inline cost;
# 1: a plain read), with several results (attention's one a head; a row's scalar, a small
# LayerNorm's mean, was never timed), is recomputed by each reader instead of cached as an array
# of its own: attention's softmax sum over a 32-key window was a phase of its own. Device time on
# the H100 (bench/h100/2026-11-26-s16/, stepkernel_variants.py): attention 17.6-17.7 -> 16.35 us,
# Llama GQA 14.9-15.0 -> 14.57, GPT-2 14.23 -> 13.99, Jamba (zoo 17.9-18.2 -> 18.11, transformers
# 17.6-17.7 -> 17.48) within its noise; no other model's source changes. Recomputing the row max
# too (cost 8: the scaled, masked score) made attention slower, 17.9 -> 21.4 us. 0: every
# reduction read more than once is cached.
INLINE_REDUCE_EXTENT = 32
INLINE_REDUCE_SOURCE_COST = 1
# A Dot computed more than this many times over by the blocks ...
DOT_REDUNDANCY = 2.0
# ... is materialized, unless its whole redundant work is this small (multiply-adds).
DOT_SMALL_MACS = 1 << 14
# ... and kept where it is read, however many times over, when one block's share of it is at most
# this many multiply-adds (0: never). Published, a product that every block of its reader needs
# whole is a level of its own (mamba's x_proj, 48 rows of 512 read by each block of the SSM
# update: every layer's second level); recomputed, it costs each reader block its multiply-adds
# and its weight rows in shared memory (24,576 and 96 KB a block for x_proj at embed 256). Set
# for one schedule (schedule's replicated_dot_macs), the build's stepkernel-fewer-levels tactic
# (2^15). H100, session 53: slower than the published product in every zoo model it changes
# (mamba's recomputed x_proj phase 2,757-3,337 cycles against a level's ~1.3 us); see
# engines/fusion.STEPKERNEL_FEWER_LEVELS.
REPLICATED_DOT_MACS = 0
# A materialized value that sums a split product's partial sums (the residual stream after a split
# output projection) is kept, not recomputed by each of its readers, where the task that sums the
# partial sums anyway can store it (a side store: from a replicated array, by its first block):
# later readers then stage N words instead of P x N (min_gru's split head: 4,352 instead of 8,448).
# H100, session 65 (bench/h100/2026-12-06-s65/g18/, stepkernel_variants, device us a step, split /
# split with the sums kept): min_gru 9.89 / 9.40, gated_ssm 10.99 / 10.47, mamba 26.84 / 23.00,
# outputs equal (mamba within 1.8e-7). It changes only programs with split products (the split
# tactics, engines/fusion.SPLIT), which stay slower than fewer-phases for mamba (17.52) and level
# with it for min_gru (9.47) and gated_ssm (10.44), so untimed.
SPLIT_SUMS_KEPT = True
# ... (a product computed by at most this many blocks is published where it is computed)
FEW_BLOCKS = 8
# ... except a product of the frame itself needing at most this many a block: published, it is
# a level of its own right after the frame arrives, recomputed it is a phase of 16 multiply-adds a
# thread (the LayerNorm statistics of a composed in-projection, simplify.ComposeInputProducts)
INPUT_DOT_BLOCK_MACS = 1 << 12

# One schedule's values of RECOMPUTED_SCALARS and REPLICATED_DOT_MACS (schedule's recomputed_scalars and
# replicated_dot_macs), read where they apply instead of the module's: no module setting is
# changed while a schedule is built, so another thread's schedule keeps its own.
_SCHEDULE_SETTINGS: ContextVar[tuple[int, int] | None] = ContextVar("framefuse_schedule_settings", default=None)


def _recomputed_scalars() -> int:
    chosen = _SCHEDULE_SETTINGS.get()
    return RECOMPUTED_SCALARS if chosen is None else chosen[0]


def _replicated_dot_macs() -> int:
    chosen = _SCHEDULE_SETTINGS.get()
    return REPLICATED_DOT_MACS if chosen is None else chosen[1]


# A product needing more multiply-adds than this from one block is spread over the grid.
DOT_BLOCK_MACS = 1 << 14
# A product is stored by another task (a side store) only if that task computes at most this many
# of its multiply-adds on one block: attention's new K row was stored by the cache's task, 64 rows
# on the one block holding the new slot, while its readers waited (H100 trace: 2.8 us a layer).
ABSORB_DOT_MACS = 1 << 12
# A replicated array (several blocks compute it) costing more operations per thread than this
# is materialized.
REPLICATE_OPS = 512
# ... and so is one whose blocks each stage more than this many times its size of flagged values
STAGED_RATIO = 4
STAGED_MIN = 1024
SPARSE_COPY_RATIO = 8  # see _sparse_copy
# _sparse_copy for any staged value, not only one stored in another order (mamba's window: the
# output's task reads the convolution's [D, T] result a position at a time, and a block stages
# 16,352 floats of it for 125 elements). On since timed (H100 device time, session 25: mamba T = 32
# 72.3 -> 53.5 us, 62.8 -> 51.2 with 384 threads; jamba 60.7 -> 50.7; xlstm unchanged; every step
# kernel hashed identical).
SPARSE_COPY_ANY = True
ENUM_LIMIT = 1 << 23  # index combinations enumerated per occurrence before assuming the worst
THREADS = 256
WARP = 32
ROOT = -1  # the key of a task's root unit (array units are keyed by their node's id)
HOST_READ_CHUNK = 1024  # a graph input is read from host memory by as few blocks as this allows
# A graph output is written to host memory in chunks of this many floats a block: a model's head
# (LayerNorm + 32 products) on one block took 1.5-2 us; on 4 blocks min_gru's step is 0.5 us and
# mamba's 1 us shorter (H100); 4-float chunks measured the same as 8.
HOST_WRITE_CHUNK = 8
# A task whose blocks each copy the same state or weight values whole (attention's output
# projection: every block recomputes the attention over the window, so every block copies both
# KV caches, 8064 floats a layer) is placed on at most REPLICA_FLOATS / (those floats a block)
# blocks. None: no limit by default; the build's stepkernel-replica-cap tactics pass a cap
# (schedule's replica_floats, engines.fusion.REPLICA_CAP_FLOATS), timed against the plain kernel.
REPLICA_FLOATS: int | None = None
# The frame's task goes on the block that runs nothing before it and whose next tasks copy the
# fewest floats into shared memory: the block issues those copies in the kernel's prologue, before
# the frame's task (attention's frame block issued its output projection's 35 KB, ~2000 cycles,
# before computing the frame's products; session 20, probe-frame-block.log). False: the first
# free block of the frame's level (_place).
FRAME_BLOCK_QUIET = True
FRAME_BLOCK_LOOKAHEAD = 2  # the tasks after the frame's that count, on the candidate block
# A Scan element at position t reads its inputs at positions 0..t; the range analysis took every
# position (the loop variable's whole extent), so a block stages each input's whole window even
# where its elements sit early (min_gru's T = 32 window: 8,130 floats a block of each of two
# inputs, over every block; session 23's trace put ~11 us a layer on that phase). True: the
# bound s <= t is a guard, each block stages the prefix it reads. Timed (H100, session 24): 1.5-2 % faster
# in the row form, which no default kernel uses since column scans (simplify.SCAN_COLUMNS): off.
SCAN_PREFIX_RANGES = False


def column_scan(node: Node) -> bool:
    """A recurrence along its last axis over more than one position (simplify.ScanColumns): it
    gets a task of its own, each block whole columns, each thread a column whose positions it
    runs in order (codegen's column loop), O(T) instead of an element's O(t) prefix."""
    return isinstance(node, Scan) and node.axis == node.rank - 1 and node.steps > 1


# A nonlinear recurrence (ir.Recur) runs as a loop over its positions inside one task: block r of
# its blocks owns hidden units [r·HB, (r + 1)·HB) of every batch row and keeps their G·HB rows of R
# in shared memory for the whole window (at most RECUR_SMEM_FLOATS floats a block; more hidden units
# than that spread over more blocks, as many as RECUR_MAX_BLOCKS, past which R is read from global
# memory every position); a position's h is published as flag-tagged words and every block of the
# task stages all of it for the next position's product (no barrier: each waits for what it reads).
RECUR_SMEM_FLOATS = 16 * 1024
RECUR_MAX_BLOCKS = 32
# ... unless R fits shared memory over more blocks (hidden 512-1024: an LSTM's R at hidden 1024 is
# 16 MB, 128 KB a block over 128 blocks): then it is held over up to RECUR_WIDE_MAX_BLOCKS blocks
# (as many as the grid has: R's products are bound by shared-memory bandwidth, so the fewer units a
# block the shorter a position), each block's recurrence arena as large as the kernel's shared memory
# allows (recur_arena_floats). Read from global memory each position instead, the products were
# 73 us a position at hidden 1024 on the H100, cuDNN's 9.
RECUR_WIDE = True
RECUR_WIDE_MAX_BLOCKS = 128
RECUR_ARENA_RESERVE = 1024  # floats of a block's shared memory a wide recurrence leaves to the range table
# Wide recurrences of one dependency level (a bidirectional layer's two directions) take the blocks
# the placement shares out to them (half the grid each), where R is still held on them, so the
# directions run side by side instead of one after the other on the same 128 blocks (a GRU at hidden
# 1024 fits: 16 units a block; an LSTM's 16 units do not, see RECUR_HYBRID). (H100, nn.GRU hidden
# 1024 bidirectional, T = 32: 369 -> 361 us, T = 256: 2298 -> 2226; with RECUR_HYBRID and
# RECUR_DIVISOR_SPLIT below, 300 and 1864.)
RECUR_WIDE_SHARE_LEVEL = True
# A held recurrence's thread keeps its K split of a product row in registers when the split is at
# most this many weights (its other registers included, within the 255 a thread has at 256 threads).
# (H100, hidden 1024, T = 256, R over 128 blocks: 128 rather than 64 took the LSTM from 1659 to
# 1424 us and the GRU from 1447 to 1205; 196 registers, no spills.)
RECUR_REGISTER_WEIGHTS = 128
# R too large for the arena even over the wide blocks (an LSTM's two directions at hidden 1024 on 64
# blocks each: 256 KB a block) is split: the first RECUR_REGISTER_WEIGHTS of each thread's split in
# registers (read from global memory once), the rest in shared memory; and where all of R does fit,
# a split longer than the registers hold keeps its first RECUR_REGISTER_WEIGHTS there all the same
# (half the shared-memory reads). (H100, nn.LSTM hidden 1024 bidirectional: T = 32 460 -> 384 us,
# cuDNN 398; T = 256 2667 -> 2350, cuDNN 2769.)
RECUR_HYBRID = True
# See recur_plan: a K split that divides H into whole float4s, where the most splits do not, when it
# puts weights in registers. (H100, nn.GRU hidden 1024 bidirectional, 64 blocks a direction, 5 splits
# of 205 in shared memory -> 4 of 256, 128 in registers: T = 32 363 -> 303 us, cuDNN 362; T = 256
# 2225 -> 1864, cuDNN 2400.)
RECUR_DIVISOR_SPLIT = True
# The recurrences' tasks get blocks of their own at the grid's end (when they take at most half of
# it), so that layer l + 1 runs its position t beside layer l's position t + 1 (the wavefront): the
# tasks between them (the next layer's input products) run on the other blocks as each position's
# values arrive, instead of queueing behind a loop that holds its blocks for the whole window.
RECUR_OWN_BLOCKS = True


def _align4(n: int) -> int:
    return -(-n // 4) * 4


def _loop_task(root: Node, per_block: int, blocks: int, units_of: int, grid: int, first: int, view: TaskView, reads):
    """The task of a loop over positions (LOOPS) on ``blocks`` blocks from ``first``, each
    ``per_block`` of the root's ``units_of`` units; no units but its root (codegen writes the
    loop), its reads the materialized values under ``reads`` ((value, index) pairs)."""
    first = max(0, min(int(first), grid - blocks))
    units = {ROOT: Unit(root, "root", ix.Var("e0", max(root.size, 1)))}
    lo = np.full(grid, units_of, dtype=np.int64)
    lo[first : first + blocks] = np.arange(blocks) * per_block
    units[ROOT].lo, units[ROOT].hi = lo, np.minimum(lo + per_block, units_of)
    task = Task(root, units, per_block, blocks, view, 1, first)
    walk = Walk(view, units[ROOT])
    for value, index in reads:
        walk.visit(value, index, (), ())
    task.reads = {o.node.id for o in units[ROOT].occurrences if view.kind(o.node) == "materialized"}
    return task


def recur_arena_floats(smem_floats: int) -> int:
    """The most shared memory (floats) a recurrence's task may take a block: ``smem_floats`` bounds
    a task's arrays at half a block's shared memory (the engine's choice, the rest for the weight
    prefetch); a recurrence runs its whole window out of its arena, so it may take the whole,
    leaving the prefetch what remains."""
    return 2 * smem_floats - RECUR_ARENA_RESERVE


@dataclass(frozen=True)
class RecurPlan:
    """How a recurrence's block of ``per_block`` units holds R and splits its products (codegen's
    _recur): ``rows`` product rows (all batch rows) over ``splits`` K splits of ``kc`` each; a
    thread's first ``kr`` weights of its split in registers (0: none); ``held``: the rest of R in
    shared memory (else read from global memory each position)."""

    held: bool
    rows: int
    splits: int
    kc: int
    kr: int

    @property
    def hybrid(self) -> bool:
        """R split between registers (the first kr of each split) and shared memory (the rest)."""
        return 0 < self.kr < self.kc


def recur_plan(node: Recur, per_block: int, smem_floats: int | None = None, threads: int | None = None) -> RecurPlan:
    """R's place for blocks of ``per_block`` units: all of it in shared memory within
    RECUR_SMEM_FLOATS, or (RECUR_WIDE, ``smem_floats`` the schedule's bound on a task's arrays)
    within the whole arena with the loop's other parts, a thread's split also in registers when it
    has at most RECUR_REGISTER_WEIGHTS weights; failing that (RECUR_HYBRID) the first
    RECUR_REGISTER_WEIGHTS of each split in registers and only the rest in shared memory; else R is
    read from global memory. Registers need K splits of equal whole float4s: where the most splits
    the threads take do not divide H (a GRU's 48 rows over 256 threads: 5), fewer that do are
    taken when that puts weights in registers (RECUR_DIVISOR_SPLIT)."""
    rows, most = recur_rows(node, per_block)
    if threads:
        most = max(1, min(most, threads // rows))
    plan = _recur_plan_of(node, per_block, most, smem_floats, threads)
    if plan.kr or not (RECUR_DIVISOR_SPLIT and threads):
        return plan
    for splits in range(most - 1, 0, -1):
        if node.hidden % (4 * splits) == 0:
            even = _recur_plan_of(node, per_block, splits, smem_floats, threads)
            return even if even.kr else plan
    return plan


def _recur_plan_of(node: Recur, per_block: int, splits: int, smem_floats: int | None, threads: int | None) -> RecurPlan:
    """recur_plan for ``splits`` K splits."""
    H, G = node.hidden, node.gates
    rows, _ = recur_rows(node, per_block)
    kc = -(-H // splits)
    regs = 0
    if threads and kc * splits == H and kc % 4 == 0 and H % 4 == 0 and rows * splits <= threads:
        regs = min(kc, RECUR_REGISTER_WEIGHTS) // 4 * 4
    full = (per_block * G + 1) * H <= RECUR_SMEM_FLOATS + H
    if not full and RECUR_WIDE and smem_floats is not None:
        whole = RecurPlan(True, rows, splits, kc, 0)
        full = sum(n for _, n in recur_smem_parts(node, per_block, whole)) <= recur_arena_floats(smem_floats)
    if full:
        if RECUR_HYBRID and 0 < regs < kc:
            return RecurPlan(True, rows, splits, kc, regs)
        return RecurPlan(True, rows, splits, kc, regs if regs == kc else 0)
    if RECUR_HYBRID and RECUR_WIDE and smem_floats is not None and 0 < regs < kc:
        hybrid = RecurPlan(True, rows, splits, kc, regs)
        if sum(n for _, n in recur_smem_parts(node, per_block, hybrid)) <= recur_arena_floats(smem_floats):
            return hybrid
    return RecurPlan(False, rows, splits, kc, 0)


def recur_held(node: Recur, per_block: int, smem_floats: int | None = None, threads: int | None = None) -> bool:
    """Whether a recurrence's blocks of ``per_block`` units hold R on chip (recur_plan)."""
    return recur_plan(node, per_block, smem_floats, threads).held


def recur_split(
    node: Recur, grid: int, smem_floats: int | None = None, span: int | None = None, threads: int | None = None
) -> tuple[int, int, bool]:
    """(hidden units a block, blocks, R on chip) of a recurrence's task; ``smem_floats`` the
    schedule's bound on a task's arrays (None: no wide split, see RECUR_WIDE); ``span`` the blocks
    the placement offers a wide split beside the other tasks of its level (RECUR_WIDE_SHARE_LEVEL),
    taken only where R is still held on them; ``threads`` a block's (registers: recur_plan)."""
    H, G = node.hidden, node.gates
    per_block = min(H, max(1, RECUR_SMEM_FLOATS // (G * H)))
    blocks = -(-H // per_block)
    limit = max(1, min(RECUR_MAX_BLOCKS, grid))
    if blocks <= limit:
        return per_block, blocks, recur_held(node, per_block, smem_floats, threads)
    if RECUR_WIDE and smem_floats is not None:
        most = [min(grid, RECUR_WIDE_MAX_BLOCKS)]
        if RECUR_WIDE_SHARE_LEVEL and span:
            most.insert(0, min(most[0], span))
        for n in most:
            wide = -(-H // n)
            if recur_held(node, wide, smem_floats, threads):
                return wide, -(-H // wide), True
    per_block = -(-H // limit)
    return per_block, -(-H // per_block), recur_held(node, per_block, smem_floats, threads)


def recur_rows(node: Recur, per_block: int) -> tuple[int, int]:
    """(product rows of a recurrence's block over its batch rows, the most K splits its threads
    take them in): codegen's _recur splits the block's threads over rows x splits."""
    rows = node.batch * node.gates * per_block
    return rows, max(1, min(8, 1024 // rows))


def recur_smem_parts(node: Recur, per_block: int, plan: RecurPlan) -> list[tuple[str, int]]:
    """Shared memory of a recurrence's task (codegen's _recur), in floats, by part: R's rows of the
    block's units, transposed with an odd stride (when held; a hybrid plan only the weights past
    the registers' of each split); h of every batch row twice (the position read and the one
    staged); the products' parts; the position's input part of the block's units (twice, as h) and
    their cell values."""
    G, H, B = node.gates, node.hidden, node.batch
    rows, splits = recur_rows(node, per_block)
    if not plan.held:
        r_floats = 0
    elif plan.hybrid:
        r_floats = _align4(plan.splits * (plan.kc - plan.kr) * (G * per_block + 1))
    else:
        r_floats = _align4(H * (G * per_block + 1))
    return [
        ("R", r_floats),
        ("h", 2 * _align4(B * H)),
        ("P", _align4(rows * splits)),
        ("X", 2 * _align4(B * G * per_block)),
        ("C", _align4(B * per_block)),
    ]


def recur_smem_floats(node: Recur, per_block: int, smem_floats: int | None = None, threads: int | None = None) -> int:
    """Shared memory (floats) a block of a recurrence's task of ``per_block`` units takes."""
    plan = recur_plan(node, per_block, smem_floats, threads)
    return sum(n for _, n in recur_smem_parts(node, per_block, plan))


def _recur_task(
    root: Recur,
    materialized: dict,
    grid: int,
    first: int,
    layouts: dict | None,
    smem_floats: int | None,
    span: int | None = None,
    threads: int | None = None,
) -> Task:
    """The task of a recurrence: no units but its root (codegen writes its loop); it reads its
    inputs where they lie (flag-tagged words, leaves)."""
    per_block, blocks, _ = recur_split(root, grid, smem_floats, span, threads)
    view = TaskView(root, materialized, set(), (), (), layouts)
    variables = [ix.Var(f"r{a}", d) for a, d in enumerate((root.steps, root.batch, root.gates * root.hidden))]
    reads = [(root.xg, variables)] + [
        (init, variables[1:2] + [ix.Var("rk", root.hidden)]) for init in (root.h0, root.c0) if init is not None
    ]
    task = _loop_task(root, per_block, blocks, root.hidden, grid, first, view, reads)
    task.stage_limit = smem_floats  # R's place depends on both (recur_plan); rebuilt tasks keep them
    task.threads = threads
    return task


# A delta-rule window (ir.DeltaScan) runs as a task of its own: a warp a state row, each block the
# rows of one head (at most its warps' worth), which stage that head's k, q, v and gates for the
# whole window once and run the positions from shared memory.
LOOPS = (Recur, DeltaScan, BodyLoop)  # nodes whose task is a loop over positions that codegen writes itself


def delta_split(node: DeltaScan, grid: int, threads: int) -> tuple[int, int]:
    """(state rows a block, blocks) of a delta-rule window's task: a warp a row, each block within
    one head; more rows a block (its warps loop) where the heads' rows would not fit the grid."""
    batch, heads, dv = node.shape[:3]
    if batch * heads > grid:
        raise CompileError(
            f"{node.label or node}: a delta-rule window of {batch} x {heads} heads needs a block a head, "
            f"more than the grid's {grid}"
        )
    per_block = max(1, threads // WARP)
    while batch * heads * -(-dv // per_block) > grid and per_block < dv:
        per_block *= 2
    per_block = min(per_block, dv)
    return per_block, batch * heads * -(-dv // per_block)


def delta_smem_parts(node: DeltaScan) -> list[tuple[str, int]]:
    """Shared memory of a delta-rule window's task, by part (floats): the head's k and q over the
    window, its v, its gates."""
    steps, dk, dv = node.steps, node.k.shape[3], node.v.shape[3]
    return [("k", _align4(steps * dk)), ("q", _align4(steps * dk)), ("v", _align4(steps * dv))] + [
        (f"g{i}", _align4(steps)) for i in range(len(node.gates))
    ]


def _delta_task(root: DeltaScan, materialized: dict, grid: int, threads: int, first: int, layouts) -> Task:
    per_block, blocks = delta_split(root, grid, threads)
    view = TaskView(root, materialized, set(), (), (), layouts)
    reads = [(value, [ix.Var(f"d{a}", d) for a, d in enumerate(value.shape)]) for value in root.inputs()]
    return _loop_task(root, per_block, blocks, root.size, grid, first, view, reads)


# A loop over a general body (ir.BodyLoop, simplify.RollBodies: an MLP cell, a gate on h, a norm in
# the cell) runs as a task of one block: a position is its body evaluated out of shared memory, a
# phase (a barrier) per dependency level of the values the block keeps there (body_plan); h stays in
# shared memory between positions (two buffers). A level's products and reductions run side by side,
# a segment of lanes an element (the warps share the level's elements out rather than each warp
# taking its elements one after the other: every round of a warp is a shuffle reduction and, for
# weights read from global memory, a load's latency). The products' weights are held in shared memory
# for the window where they fit (BODY_HOLD_WEIGHTS), and a window that only moves a graph input's
# values, or that no loop feeds, is staged whole before the first position (BODY_WHOLE_WINDOWS);
# a window a loop feeds a position ahead (its rows arrive a position at a time).
BODY_HOLD_WEIGHTS = True
BODY_WHOLE_WINDOWS = True
BODY_WHOLE_WINDOW_FLOATS = 8192  # a window staged whole takes at most this much shared memory
# A product whose level runs in one round (every element's segment on the block at once) keeps each
# thread's part of its weight row in registers for the window, when that is at most this many floats
# (and the levels' together at most BODY_REGISTER_TOTAL): a multiply-add then reads only its operand
# from shared memory. (H200 trace, the MLP cell at T = 32: the level of its two products over [x, h]
# took 1200 cycles a position with both read from shared memory.)
BODY_REGISTER_WEIGHTS = 32
BODY_REGISTER_TOTAL = 64


@dataclass(frozen=True)
class BodyPlan:
    """How a body loop's block evaluates a position: ``kept`` the body nodes it computes into
    shared memory (every product and reduction; a product's operand that costs at least CACHE_COST
    operations to recompute; the body itself, the new h), in topological order; ``level`` their
    phase within the position (1 ...; the body's is the last); ``lanes`` per level the lanes a
    product or reduction element takes (a power of two); ``held`` product id -> the row stride of
    its weights held in shared memory, and weight leaf id -> 0 for the other weights held there (a
    bias read from global memory each position put an L2 round trip on its level: 1.4 us a position
    of the MLP cell on the H200); ``whole`` the windows staged whole; ``parts`` the task's
    shared memory (name, floats): h's two buffers, each window (two rows, or whole), each fixed
    input, each kept node but the body (unless a product), each held weight; ``registers`` level ->
    the weights a thread keeps in registers for the level's products (BODY_REGISTER_WEIGHTS), which
    are then not held in shared memory."""

    kept: tuple
    level: dict
    lanes: dict
    held: dict
    whole: tuple
    parts: tuple
    registers: dict = field(default_factory=dict)  # level -> floats a thread holds of its products' rows

    @property
    def levels(self) -> int:
        return max(self.level.values())


def _body_lanes(elements: list[tuple[int, int]], threads: int) -> int:
    """Lanes an element for a level's products and reductions ((elements, extent) each): the most
    (a power of two, at most 32, not past the longest extent) with every node's elements on whole
    warps and all of them on the block at once; 1 when they do not fit even so."""
    longest = max(extent for _, extent in elements)
    lanes = 1
    while lanes < min(WARP, longest):
        wider = 2 * lanes
        if sum(-(-n * wider // WARP) * WARP for n, _ in elements) > threads:
            break
        lanes = wider
    return lanes


def body_row_stride(k: int, lanes: int) -> int:
    """The row stride (floats) of a product's weights held in shared memory, read by segments of
    ``lanes`` lanes at consecutive k and consecutive rows a segment: congruent to ``lanes`` mod 32,
    so that the warp's lanes fall on 32 different banks."""
    return -(-k // WARP) * WARP + lanes % WARP


def body_plan(node: BodyLoop, threads: int = THREADS, limit: int | None = None) -> BodyPlan:
    """The plan of ``node``'s task on a block of ``threads`` threads within ``limit`` floats of
    shared memory (None: no limit on what is held; the values themselves must fit all the same)."""
    order = node.body_nodes()
    kept: set[int] = {n.id for n in order if isinstance(n, (Dot, Reduce))} | {node.body.id}
    while True:
        cost: dict[int, int] = {}
        for n in order:
            if isinstance(n, Leaf) or n.id in kept:
                cost[n.id] = 0
            elif isinstance(n, Map):
                cost[n.id] = cost[n.src.id]
            elif isinstance(n, Concat):
                cost[n.id] = max(cost[s.id] for s in n.srcs)
            elif isinstance(n, Ew):
                cost[n.id] = EW[n.op].cost + sum(cost[a.id] for a in n.args)
            else:
                raise CompileError(f"{node.label or node}: a body loop's body holds {n}, which it has no code for")
        more = {n.src.id for n in order if isinstance(n, Dot) and cost[n.src.id] >= CACHE_COST}
        if more <= kept:
            break
        kept |= more
    level: dict[int, int] = {}
    below: dict[int, int] = {}  # the highest level a node's inline inputs reach
    for n in order:
        reach = max((level.get(c.id, below.get(c.id, 0)) for c in n.inputs()), default=0)
        if n.id in kept:
            level[n.id] = reach + 1
        else:
            below[n.id] = reach
    lanes: dict[int, int] = {}
    for lv in sorted(set(level.values())):
        elements = [
            (n.size, n.k if isinstance(n, Dot) else n.extent)
            for n in order
            if level.get(n.id) == lv and isinstance(n, (Dot, Reduce))
        ]
        lanes[lv] = _body_lanes(elements, threads) if elements else 1
    whole = tuple(
        i
        for i, window in enumerate(node.windows)
        if BODY_WHOLE_WINDOWS and window.size <= BODY_WHOLE_WINDOW_FLOATS and _leaf_view(window)
    )
    parts = [("h", 2 * _align4(node.carried.size))]
    parts += [
        (f"u{i}", _align4(window.size) if i in whole else 2 * _align4(slot.size))
        for i, (slot, window) in enumerate(zip(node.slots, node.windows))
    ]
    parts += [(f"f{i}", _align4(slot.size)) for i, slot in enumerate(node.fixed_slots)]
    parts += [
        (f"n{n.id}", _align4(n.size))
        for n in order
        if n.id in kept and (n is not node.body or isinstance(n, (Dot, Reduce)))  # see codegen's _body_loop
    ]
    registers: dict[int, int] = {}
    for lv in sorted(lanes):
        members = [n for n in order if level.get(n.id) == lv and isinstance(n, (Dot, Reduce))]
        dots = [n for n in members if isinstance(n, Dot)]
        if not dots:
            continue
        per_warp = WARP // lanes[lv]
        rounds = -(-sum(-(-n.size // per_warp) * per_warp for n in members) // (threads // lanes[lv]))
        need = max(-(-n.k // lanes[lv]) for n in dots)
        if rounds == 1 and need <= BODY_REGISTER_WEIGHTS and sum(registers.values()) + need <= BODY_REGISTER_TOTAL:
            registers[lv] = need
    held: dict[int, int] = {}
    room = None if limit is None else limit - sum(n for _, n in parts)
    for n in order:  # the other weights the body reads (biases, a norm's scale), small, first
        if BODY_HOLD_WEIGHTS and isinstance(n, Leaf) and n.role == "weight":
            need = _align4(n.size)
            if room is None or need <= room:
                held[n.id] = 0
                parts.append((f"w{n.id}", need))
                room = None if room is None else room - need
    for n in order:
        if BODY_HOLD_WEIGHTS and isinstance(n, Dot) and level[n.id] not in registers:
            stride = body_row_stride(n.k, lanes[level[n.id]])
            need = _align4(n.n * stride)
            if room is None or need <= room:
                held[n.id] = stride
                parts.append((f"w{n.id}", need))
                room = None if room is None else room - need
    # A computed window that no loop feeds arrives all at once (its producers run over every
    # position together): staged whole too, in the shared memory the weights leave, so a position
    # does not wait on L2 for its rows (the LayerNorm LSTM's input products: ~700 of the 1,181
    # cycles of its last level a position on the H200).
    for i, (slot, window) in enumerate(zip(node.slots, node.windows)):
        if i in whole or not BODY_WHOLE_WINDOWS or window.size > BODY_WHOLE_WINDOW_FLOATS or _fed_by_loop(window):
            continue
        extra = _align4(window.size) - 2 * _align4(slot.size)
        if room is None or extra <= room:
            whole += (i,)
            parts[[name for name, _ in parts].index(f"u{i}")] = (f"u{i}", _align4(window.size))
            room = None if room is None else room - extra
    return BodyPlan(tuple(n for n in order if n.id in kept), level, lanes, held, whole, tuple(parts), registers)


def _fed_by_loop(value: Node) -> bool:
    """Whether a loop over positions (whose positions are published one after another) is among
    what ``value`` is computed from."""
    return any(isinstance(n, (*LOOPS, Scan)) for n in Program({}, {}, {"value": value}, {}).nodes())


def _body_task(
    root: BodyLoop, materialized: dict, grid: int, first: int, layouts, smem_floats: int | None, threads: int | None
) -> Task:
    view = TaskView(root, materialized, set(), (), (), layouts)
    reads = [(w, [ix.Var(f"b{a}", d) for a, d in enumerate(w.shape)]) for w in root.windows]
    reads += [(value, [ix.Var(f"b{a}", d) for a, d in enumerate(value.shape)]) for value in (*root.fixed, root.h0)]
    task = _loop_task(root, 1, 1, 1, grid, first, view, reads)
    task.stage_limit = smem_floats  # what the plan holds depends on both (body_plan)
    task.threads = threads
    return task


def body_task_plan(task: Task) -> BodyPlan:
    """The plan of a body loop's task (its threads and shared memory as scheduled)."""
    limit = None if task.stage_limit is None else recur_arena_floats(task.stage_limit)
    return body_plan(task.root, task.threads or THREADS, limit)


def recur_inputs(program: Program) -> dict[int, Node]:
    """The values a recurrence's loop reads that are computed (not leaves): materialized, so the
    loop waits on their flag-tagged words rather than computing them itself."""
    found: dict[int, Node] = {}
    for node in program.nodes():
        if isinstance(node, LOOPS):
            for value in node.inputs():
                # a body loop reads a window that only moves a graph input's values (x_t a position)
                # through the input's own flagged copy, a position at a time: no copy of its own
                if not isinstance(value, Leaf) and not (isinstance(node, BodyLoop) and _leaf_view(value)):
                    found[value.id] = value
    return found


def _leaf_view(node: Node) -> bool:
    """Map/Concat all the way down to leaves."""
    if isinstance(node, Leaf):
        return True
    if isinstance(node, Map):
        return _leaf_view(node.src)
    return isinstance(node, Concat) and all(_leaf_view(s) for s in node.srcs)


def stored_flat(node: Node, index: list, order: tuple) -> ix.IExpr:
    """Where element ``index`` of a value stored with its axes in ``order`` lies (see
    column_layouts)."""
    return ix.flatten([index[i] for i in order], [node.shape[i] for i in order])


def _walk_order(shape: tuple, index_of, target: Node) -> tuple | None:
    """The order of ``target``'s axes in which a reader of ``shape`` walks them (its last axis
    fastest) when ``index_of`` (reader index -> target index) maps each of them to one of the
    reader's axes, or None; None also when that is the target's own order."""
    variables = [ix.Var(f"o{j}", max(int(d), 1)) for j, d in enumerate(shape)]
    index = index_of(variables)
    keys = []
    for axis, expr in enumerate(index):
        if target.shape[axis] == 1:
            keys.append((-1, axis))  # a unit axis goes anywhere
        elif isinstance(expr, ix.Var) and expr in variables:
            keys.append((variables.index(expr), axis))
        else:
            return None
    positions = [k for k, _ in keys if k >= 0]
    if len(set(positions)) != len(positions):
        return None
    order = tuple(axis for _, axis in sorted(keys))
    long = [axis for axis in order if target.shape[axis] > 1]
    return None if long == sorted(long) else order


def column_layouts(program: Program, users: dict) -> dict[int, tuple]:
    """node id -> the order of axes its flag-tagged copy is stored in, for the values around a
    column scan: those its inputs are computed from elementwise and through data movement
    (min_gru's gate, a reshape of a sigmoid of the window's [T, D] product; mamba's Δ, broadcast
    over the state's columns), stored in the order the scan walks them, position fastest, so that
    a block owning a few columns stages one contiguous range instead of the hull of a few channels
    at every position (nearly the whole window); and the scan itself, stored back in the order its
    readers walk it (the window's [T, D], a row of which a product reads). Only values that
    nothing else reads. Stores and reads of such a value go through stored_flat; its own task
    computes it in its natural order."""
    found: dict[int, tuple] = {}
    for scan in program.nodes():
        if not column_scan(scan):
            continue
        readers = users.get(scan.id, [])
        if readers and all(isinstance(r, Map) for r in readers):
            orders = {_walk_order(r.shape, r.source_index, scan) for r in readers}
            if len(orders) == 1 and None not in orders:
                found[scan.id] = orders.pop()
        # the region below the inputs, through elementwise ops and data movement, each node with
        # its index as a function of the scan's
        region: dict[int, tuple] = {}
        pending = [(x, lambda index: index) for x in scan.xs]
        while pending:
            node, index_of = pending.pop()
            if node.id in region or isinstance(node, Leaf):
                continue
            region[node.id] = (node, index_of)
            if isinstance(node, Map):
                pending.append((node.src, lambda index, m=node, f=index_of: m.source_index(f(index))))
            elif isinstance(node, Ew):
                pending += [(arg, index_of) for arg in node.args if arg.shape == node.shape]
        for node, index_of in region.values():
            if isinstance(node, (Map, *LOOPS)) or node.id in found:
                continue  # (a recurrence's loop reads its own words back in [T, B, S·H] order)
            if any(r.id not in region and r.id != scan.id for r in users.get(node.id, [])):
                continue  # read elsewhere in its own order
            order = _walk_order(scan.shape, index_of, node)
            if order is not None:
                found[node.id] = order
    return found


@dataclass
class Occurrence:
    """``node`` read at ``flat`` (an IExpr over the unit's element var and loop vars), under
    ``guards`` (IExpr, lo, hi): lo ≤ g < hi."""

    node: Node
    flat: ix.IExpr
    loops: tuple
    guards: tuple


@dataclass
class Unit:
    """A value computed block-wide inside a task: ``how`` is "root" (thread per element,
    stored), "thread" (thread per element, into shared memory), "reduce" (warp per element) or
    "dot" (warp per element: a dot product with a weight row)."""

    node: Node
    how: str
    var: ix.Var
    occurrences: list = field(default_factory=list)
    lo: np.ndarray | None = None  # per block: the origin (arrays: the first needed, aligned down to 4)
    hi: np.ndarray | None = None  # per block: one past the last
    first: np.ndarray | None = None  # per block: the first element computed (arrays: the first needed)
    deps: set = field(default_factory=set)  # node ids of the units this unit reads
    phase: int = 0

    def _start(self) -> np.ndarray | None:
        return self.first if self.first is not None else self.lo

    @property
    def span(self) -> int:
        """The most elements one block computes."""
        start = self._start()
        if start is None or not len(start):
            return 0
        return int(max(0, int((self.hi - start).max())))

    @property
    def total(self) -> int:
        """The elements computed over all blocks."""
        start = self._start()
        return int(np.maximum(self.hi - start, 0).sum()) if start is not None else 0

    @property
    def storage(self) -> int:
        """The most floats one block's copy of the array takes (from its aligned origin)."""
        if self.lo is None or not len(self.lo):
            return 0
        return int(max(0, int((self.hi - self.lo).max())))


@dataclass
class Task:
    root: Node
    units: dict  # node id -> Unit (the root included)
    chunk: int  # root elements per block
    blocks: int  # blocks that have root elements
    view: TaskView
    min_chunk: int = 1
    first: int = 0  # the task's blocks are [first, first + blocks)
    side: list = field(default_factory=list)  # absorbed output nodes, stored while computing the root
    leaves: dict = field(default_factory=dict)  # state/weight leaf id -> (leaf, lo, hi) per block
    reads: set = field(default_factory=set)  # ids of the materialized nodes read
    stage_limit: int | None = None  # see build_task
    threads: int | None = None  # a block's threads (a recurrence's task: where R lives, recur_plan)

    @property
    def root_unit(self) -> Unit:
        return self.units[ROOT]

    def arrays(self) -> list[Unit]:
        return [u for u in self.units.values() if u.how != "root"]

    def phases(self) -> int:
        return 1 + max((u.phase for u in self.units.values()), default=0)


@dataclass
class Schedule:
    program: Program
    grid: int
    threads: int
    tasks: list
    materialized: dict  # node id -> Node
    destinations: dict  # node id -> [graph output names]
    ll_nodes: dict  # node id -> Node: materialized values read inside the launch (flag-tagged)
    producer: dict  # node id -> index of the task that stores it
    notes: list = field(default_factory=list)
    layouts: dict = field(default_factory=dict)  # node id -> its stored order of axes (column_layouts)
    replica_floats: int | None = None  # the cap it was scheduled under (see schedule)
    recomputed_scalars: int = 1  # the RECOMPUTED_SCALARS it was scheduled under (see schedule)
    replicated_dot_macs: int = 0  # the REPLICATED_DOT_MACS it was scheduled under (see schedule)

    def task_levels(self) -> list[int]:
        """Each task's dependency level: 1 + the deepest level of the tasks it waits on."""
        return _task_levels(self.tasks)

    def levels(self) -> int:
        """Dependency levels: the longest chain of tasks that wait on one another."""
        return max(self.task_levels(), default=0)

    def describe(self) -> dict:
        return {
            "grid": self.grid,
            "threads": self.threads,
            "tasks": len(self.tasks),
            "levels": self.levels(),
            "phases": sum(t.phases() for t in self.tasks),
            "flagged_values": len(self.ll_nodes),
            "side_stores": sum(len(t.side) for t in self.tasks),
            "split_products": sum(isinstance(t.root, PartialSums) for t in self.tasks),
            "replica_floats": self.replica_floats,
            "recomputed_scalars": self.recomputed_scalars,
            "replicated_dot_macs": self.replicated_dot_macs,
            "notes": list(self.notes),
        }


# -- how a task sees each node -----------------------------------------------------------------------


def is_pure_view(node: Node, materialized: dict, memo: dict | None = None) -> bool:
    """Map/Concat all the way down to leaves or materialized values (no arithmetic)."""
    memo = {} if memo is None else memo
    if node.id in memo:
        return memo[node.id]
    if isinstance(node, Map):
        src = node.src
        result = _device_leaf(src) or src.id in materialized or is_pure_view(src, materialized, memo)
    elif isinstance(node, Concat):
        result = all(_device_leaf(s) or s.id in materialized or is_pure_view(s, materialized, memo) for s in node.srcs)
    else:
        result = False
    memo[node.id] = result
    return result


def _host_leaf(node: Node) -> bool:
    return isinstance(node, Leaf) and node.role == "input"


def _device_leaf(node: Node) -> bool:
    """A leaf every block may read where it lies: not a graph input (host memory; read by the
    task that publishes it, see schedule())."""
    return isinstance(node, Leaf) and node.role != "input"


class TaskView:
    """How a task sees each node: its root, one of its arrays, a materialized value read from
    global memory, a leaf, a product computed by warps, or inline."""

    def __init__(
        self,
        root: Node,
        materialized: dict,
        arrays: set,
        inline_through: Iterable[int] = (),
        read_in_place: Iterable[int] = (),
        layouts: dict | None = None,
    ):
        self.root = root
        self.materialized = materialized
        self.arrays = arrays
        self.inline_through = set(inline_through)
        self.read_in_place = set(read_in_place)  # materialized values not staged (see build_task)
        self.layouts = layouts or {}  # see column_layouts
        self._views: dict = {}

    def flat(self, node: Node, index: list) -> ix.IExpr:
        """The flat index of ``node``'s element at ``index`` where this task reads it: a
        materialized value's flag-tagged copy (or a staged copy of it) in its stored order."""
        order = self.layouts.get(node.id)
        if order is not None and self.source_kind(node) == "materialized":
            return stored_flat(node, index, order)
        return ix.flatten(index, node.shape)

    def kind(self, node: Node) -> str:
        if node.id == self.root.id:
            return "dot" if isinstance(node, Dot) else "root"
        if node.id in self.arrays:
            return "array"
        return self.source_kind(node)

    def source_kind(self, node: Node) -> str:
        """Where the value comes from when it is not one of the task's arrays: an array of a
        materialized value or a leaf is a staged copy, loaded rather than recomputed. A graph
        input is materialized by its own task (one block reads host memory, see schedule())."""
        if isinstance(node, Leaf) and not (node.role == "input" and node.id in self.materialized):
            return "leaf"
        if node.id in self.materialized and node.id not in self.inline_through and node.id != self.root.id:
            if is_pure_view(node, self.materialized, self._views):
                return "inline"
            return "materialized"
        if isinstance(node, Dot):
            return "dot"
        return "inline"


def inline_cost(node: Node, view: TaskView, memo: dict) -> int:
    if node.id in memo:
        return memo[node.id]
    kind = view.kind(node)
    if kind not in ("inline", "root"):
        cost = 0
    elif isinstance(node, Map):
        cost = inline_cost(node.src, view, memo)
    elif isinstance(node, Concat):
        cost = max(inline_cost(s, view, memo) for s in node.srcs)
    elif isinstance(node, Ew):
        cost = EW[node.op].cost + sum(inline_cost(a, view, memo) for a in node.args)
    elif isinstance(node, Reduce):
        cost = node.extent * (1 + inline_cost(node.src, view, memo))
    elif isinstance(node, Scan):  # an element at position t runs the recurrence up to t: T/2 steps on average
        step = EW[node.op].cost + sum(inline_cost(x, view, memo) for x in node.xs)
        cost = inline_cost(node.init, view, memo) + (node.steps + 1) // 2 * step
    else:
        cost = 0
    memo[node.id] = cost
    return cost


# -- the symbolic walk -----------------------------------------------------------------------------------


def concat_branches(node: Concat, index: list):
    """(source, its index, guard or None) for each source a position along the axis can reach."""
    axis = node.axis
    pos = index[axis]
    for src, start, stop in zip(node.srcs, node.offsets[:-1], node.offsets[1:]):
        if pos.hi < start or pos.lo >= stop:
            continue
        sub = list(index)
        shifted = ix.add(pos, ix.const(-start))
        if pos.lo >= start and pos.hi < stop:
            sub[axis] = shifted
            yield src, sub, None
        else:
            sub[axis] = ix.Known(shifted, 0, stop - start - 1)
            yield src, sub, (pos, start, stop)


class Walk:
    """Collect every value occurrence reached from a unit's element: inline values are walked
    through; anything else (leaf, materialized, array, product) ends the walk there."""

    def __init__(self, view: TaskView, unit: Unit):
        self.view = view
        self.unit = unit
        self.seen: set = set()
        self.counter = 0

    def new_var(self, extent: int) -> ix.Var:
        self.counter += 1
        return ix.Var(f"r{self.counter}", max(int(extent), 1))

    def run(self) -> None:
        unit, node = self.unit, self.unit.node
        if unit.how == "dot":  # element (m, n) reads row m of the input whole
            k = self.new_var(node.k)
            flat = ix.add(ix.mul(ix.floordiv(unit.var, node.n), node.k), k)
            self.visit(node.src, ix.unflatten(flat, node.src.shape), (k,), ())
        elif unit.how == "reduce":
            r = self.new_var(node.extent)
            self.visit(node.src, node.source_index(ix.unflatten(unit.var, node.shape), r), (r,), ())
        elif unit.how == "root" and isinstance(node, Dot):
            self.visit(node, ix.unflatten(unit.var, node.shape), (), ())  # the product's own unit
        elif self.view.source_kind(node) in ("leaf", "materialized"):  # a staged copy
            self.unit.occurrences.append(Occurrence(node, unit.var, (), ()))
        else:
            self.expand(node, ix.unflatten(unit.var, node.shape), (), ())

    def visit(self, node: Node, index: list, loops: tuple, guards: tuple) -> None:
        flat = self.view.flat(node, index)
        key = (node.id, repr(flat), repr(guards))
        if key in self.seen:
            return
        self.seen.add(key)
        self.unit.occurrences.append(Occurrence(node, flat, loops, guards))
        if self.view.kind(node) == "inline":
            self.expand(node, index, loops, guards)

    def expand(self, node: Node, index: list, loops: tuple, guards: tuple) -> None:
        if isinstance(node, Map):
            self.visit(node.src, node.source_index(index), loops, guards)
        elif isinstance(node, Concat):
            for src, sub, guard in concat_branches(node, index):
                self.visit(src, sub, loops, guards + ((guard,) if guard else ()))
        elif isinstance(node, Ew):
            for arg in node.args:
                self.visit(arg, index, loops, guards)
        elif isinstance(node, Reduce):
            r = self.new_var(node.extent)
            self.visit(node.src, node.source_index(index, r), loops + (r,), guards)
        elif isinstance(node, Scan) and node.id == self.view.root.id and column_scan(node):
            # the column loop (codegen's _column_root) reads each position's inputs once, at its
            # own position
            for x in node.xs:
                self.visit(x, index, loops, guards)
            self.visit(node.init, node.init_index(index), loops, guards)
        elif isinstance(node, Scan):  # positions 0..t: the loop's variable spans the axis
            s = self.new_var(node.steps)
            inner = guards
            if SCAN_PREFIX_RANGES:  # only s <= t is read (codegen.Emitter._scan's loop bound)
                inner = guards + ((ix.add(index[node.axis], ix.mul(s, -1)), 0, node.steps),)
            for x in node.xs:
                self.visit(x, node.at(index, s), loops + (s,), inner)
            self.visit(node.init, node.init_index(index), loops, guards)


# -- numeric analysis -------------------------------------------------------------------------------------


# enumerate_pairs results by (index, guards, variable, elements): the schedule builds each task
# many times over (materialization rounds, absorptions, placement) with the same occurrences
# (mamba's T = 32 window: 4,557 enumerations of 343 distinct ones, 5.5 of its 6.4 s). At most
# PAIRS_MEMO_ELEMENTS elements are kept (two int64 arrays each); schedule() empties it when done.
PAIRS_MEMO_ELEMENTS = 1 << 24
_pairs_memo: dict = {}
_pairs_memo_size = 0


def enumerate_pairs(occ: Occurrence, var: ix.Var, elements: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(element, flat index) for every combination of the occurrence's variables that passes its
    guards; None when there are too many to enumerate. The arrays are read-only (kept for the next
    caller)."""
    global _pairs_memo_size
    key = (occ.flat, occ.guards, var, elements)
    if key in _pairs_memo:
        return _pairs_memo[key]
    found = _enumerate_pairs(occ, var, elements)
    size = 0 if found is None else found[0].size
    if _pairs_memo_size + size > PAIRS_MEMO_ELEMENTS:
        _pairs_memo.clear()
        _readers_memo.clear()
        _pairs_memo_size = 0
        _forget_extremes()
    if size <= PAIRS_MEMO_ELEMENTS:
        if found is not None:
            for array in found:
                array.setflags(write=False)
        _pairs_memo[key] = found
        _pairs_memo_size += size
    return found


def bounding_pairs(occ: Occurrence, var: ix.Var, elements: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(element, flat index) pairs holding each element's least and greatest flat index, for an
    occurrence too large to enumerate (enumerate_pairs None): a loop variable that the index only
    adds (c·v, not under a division, remainder or guard) reaches its extremes at v = 0 and
    v = extent − 1, so it is enumerated at those two values only. Enough for needed_ranges; not for
    counting readers. None when that still leaves too many combinations.

    A product of a [T, K] window (a 1024-wide LSTM's input part over 32 positions) reads row t at
    ``K·t + r``: 33.5 M combinations, past ENUM_LIMIT, made every block stage the whole window."""
    flat = occ.flat
    guarded: set = set()
    for g, _, _ in occ.guards:
        guarded |= set(ix.free_vars(g))
    terms = flat.terms if isinstance(flat, ix.Lin) else ((flat, 1),)
    nested: set = set()
    for atom, _ in terms:
        if not isinstance(atom, ix.Var):
            nested |= set(ix.free_vars(atom))
    direct = {atom: coef for atom, coef in terms if isinstance(atom, ix.Var)}
    corners = [v for v in direct if v != var and v not in nested and v not in guarded and v.extent > 2]
    if not corners:
        return None
    for v in corners:
        corner = ix.Var(f"{v.name}~ends", 2)  # 0 or extent − 1
        flat = ix.add(flat, ix.add(ix.mul(v, -direct[v]), ix.mul(corner, direct[v] * (v.extent - 1))))
    return enumerate_pairs(replace(occ, flat=flat), var, elements)


_pairs_kept = 0  # shared_enumerations() entered and not left: schedule() keeps the memo


@contextlib.contextmanager
def shared_enumerations():
    """Keep the enumerations (enumerate_pairs, shared_reads, the extremes) from one schedule to
    the next inside, emptied when the outermost is left: a build's tactics schedule the same
    program at other grids and widths, which enumerate many of the same occurrences (xlstm's
    T = 32 window: 8,568 enumerations over its six schedules)."""
    global _pairs_kept
    _pairs_kept += 1
    try:
        yield
    finally:
        _pairs_kept -= 1
        if not _pairs_kept:
            _forget_pairs()


def _forget_pairs() -> None:
    global _pairs_memo_size
    _pairs_memo.clear()
    _readers_memo.clear()
    _pairs_memo_size = 0
    _forget_extremes()


def _forget_extremes() -> None:
    global _extremes_size
    for key in [k for k in _readers_memo if k[0] == "extremes"]:
        del _readers_memo[key]
    _extremes_size = 0


def _enumerate_pairs(occ: Occurrence, var: ix.Var, elements: int) -> tuple[np.ndarray, np.ndarray] | None:
    free = set(ix.free_vars(occ.flat))
    for g, _, _ in occ.guards:
        free |= set(ix.free_vars(g))
    others = sorted((v for v in free if v != var), key=lambda v: v.name)
    total = elements
    for v in others:
        total *= v.extent
    if total > ENUM_LIMIT:
        return None
    # each variable along an axis of its own: the index arithmetic runs on the axes each term
    # depends on, broadcast to the whole grid only at the end (the grid in meshgrid's "ij" order)
    shape = (elements, *(v.extent for v in others))
    env = {}
    for axis, (v, extent) in enumerate(zip([var, *others], shape)):
        env[v] = np.arange(extent, dtype=np.int64).reshape([extent if a == axis else 1 for a in range(len(shape))])
    elems = np.broadcast_to(env[var], shape)
    flat = np.broadcast_to(ix.evaluate(occ.flat, env), shape)
    if not occ.guards:
        return elems.reshape(-1), flat.reshape(-1)
    mask = np.ones((1,) * len(shape), dtype=bool)
    for g, lo, hi in occ.guards:
        value = ix.evaluate(g, env)
        mask = mask & (value >= lo) & (value < hi)
    mask = np.broadcast_to(mask, shape)
    return elems[mask], flat[mask]


# shared_reads by the identity of its (read-only, memoized) pair arrays: the cache rounds of a
# task ask the same question of the same occurrences again (xlstm's T = 32 window: 5,467 calls,
# 9.3 of its 21 s of scheduling on a 2-core CPU). The arrays are kept with the answer so that their
# ids stay theirs; emptied with the pairs memo. needed_ranges' per-element extremes of the same
# arrays are kept beside them (_element_extremes), at most PAIRS_MEMO_ELEMENTS elements in all.
_readers_memo: dict = {}
_extremes_size = 0


def shared_reads(pairs: list, size: int) -> bool:
    """Whether some value element is read by more than one distinct element, over (element, flat)
    pair arrays (a value of ``size`` elements)."""
    if not pairs:
        return False
    arrays = [a for p in pairs for a in p]
    key = None
    if not any(a.flags.writeable for a in arrays):
        key = (size, *(id(a) for a in arrays))
        if key in _readers_memo:
            return _readers_memo[key][0]
    result = _shared_reads(pairs, size)
    if key is not None:
        _readers_memo[key] = (result, arrays)
    return result


def _shared_reads(pairs: list, size: int) -> bool:
    # one reader a value element: after writing each pair's element at its flat index (whichever
    # write lands last), every pair finds its own element there; a flat index read by two elements
    # holds one of them, and a pair of the other finds it. O(n), where counting the distinct
    # readers sorted every (element, flat) key (numpy's unique: 8.6 of xlstm's 20 s in it)
    owner = np.full(max(size, 1), -1, dtype=np.int64)
    for elems, flat in pairs:
        owner[flat] = elems
    return any(bool((owner[flat] != elems).any()) for elems, flat in pairs)


def root_ranges(
    elements: int, grid: int, min_chunk: int = 1, first: int = 0, span: int | None = None, align: int = 1
) -> tuple[int, int, int, np.ndarray, np.ndarray]:
    """(chunk, blocks, first, lo, hi): the root's elements in chunks over at most ``span`` (default:
    the grid) blocks [first, first + blocks), ``first`` moved down where they would run past the
    grid; a chunk is a multiple of ``align`` (a column scan's blocks own whole columns)."""
    blocks = max(1, min(span or grid, grid, elements))
    chunk = max(-(-elements // blocks) if elements else 1, min_chunk)
    chunk = -(-chunk // align) * align
    blocks = -(-elements // chunk) if elements else 0
    first = max(0, min(int(first), grid - blocks))
    lo = np.clip((np.arange(grid, dtype=np.int64) - first) * chunk, 0, elements)
    lo[:first] = elements
    hi = np.minimum(lo + chunk, elements)
    return chunk, blocks, first, lo, hi


def needed_ranges(pairs, unit_lo: np.ndarray, unit_hi: np.ndarray, elements: int, size: int):
    """Per block, [min, max + 1) of the flat indices read by the reading unit's elements in that
    block's range (lo = hi = 0 where nothing is read). ``pairs`` None: the whole value."""
    grid = len(unit_lo)
    active = unit_hi > unit_lo
    if pairs is None:
        return np.zeros(grid, dtype=np.int64), np.where(active, size, 0).astype(np.int64)
    elems, flat = pairs
    lo = np.zeros(grid, dtype=np.int64)
    hi = np.zeros(grid, dtype=np.int64)
    if elems.size == 0:
        return lo, hi
    per_min, per_max = _element_extremes(elems, flat, elements)
    blocks = np.nonzero(active)[0]
    a, z = unit_lo[blocks].astype(np.int64), unit_hi[blocks].astype(np.int64)
    # one pass over every block's [a, z) (a < z, z <= elements: the extremes end in a sentinel, so z
    # is an index): reduceat reduces [bounds[i], bounds[i + 1]) where that is not empty, so its even
    # results are the blocks' ranges in any order, overlapping or not; the odd ones are discarded
    bounds = np.stack([a, z], axis=1).reshape(-1)
    mins = np.minimum.reduceat(per_min, bounds)[0::2]
    maxs = np.maximum.reduceat(per_max, bounds)[0::2]
    read = maxs >= 0
    lo[blocks[read]] = mins[read]
    hi[blocks[read]] = maxs[read] + 1
    return lo, hi


def _element_extremes(elems: np.ndarray, flat: np.ndarray, elements: int) -> tuple[np.ndarray, np.ndarray]:
    """Per element, the least and greatest flat index it reads (int64 max / -1 where none), and
    one element past the last holding those (needed_ranges' sentinel); kept for memoized
    (read-only) pair arrays, as shared_reads' answers are: a task's rounds ask again."""
    key = None
    if not elems.flags.writeable and not flat.flags.writeable:
        key = ("extremes", elements, id(elems), id(flat))
        if key in _readers_memo:
            return _readers_memo[key][0]
    per_min = np.full(elements + 1, np.iinfo(np.int64).max, dtype=np.int64)
    per_max = np.full(elements + 1, -1, dtype=np.int64)
    pe, pf = elems, flat
    if elems.size > 1 and (elems[1:] < elems[:-1]).any():
        order = np.argsort(elems, kind="stable")
        elems, flat = elems[order], flat[order]
    # enumerate_pairs walks the element first: each element's indices are one run
    starts = np.flatnonzero(np.concatenate(([True], elems[1:] != elems[:-1])))
    per_min[elems[starts]] = np.minimum.reduceat(flat, starts)
    per_max[elems[starts]] = np.maximum.reduceat(flat, starts)
    global _extremes_size
    if key is not None and elements <= PAIRS_MEMO_ELEMENTS:
        if _extremes_size + elements > PAIRS_MEMO_ELEMENTS:
            _forget_extremes()
        _extremes_size += elements
        per_min.setflags(write=False)
        per_max.setflags(write=False)
        _readers_memo[key] = ((per_min, per_max), (pe, pf))
    return per_min, per_max


def hull(pieces: list, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block, the smallest range holding every non-empty piece."""
    lo = np.full(grid, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(grid, dtype=np.int64)
    for plo, phi in pieces:
        nonempty = phi > plo
        lo = np.where(nonempty, np.minimum(lo, plo), lo)
        hi = np.where(nonempty, np.maximum(hi, phi), hi)
    empty = hi == 0
    return np.where(empty, 0, lo), hi


# -- one task ---------------------------------------------------------------------------------------------


@dataclass
class Problem:
    node: Node  # what to materialize
    reason: str
    priority: int  # lower first: 0 redundant products, 1 costly replicated arrays, 2 shared memory,
    # 3 products computed by two tasks


def build_task(
    root: Node,
    materialized: dict,
    grid: int,
    threads: int,
    users: dict,
    outputs: set,
    *,
    inline_through: Iterable[int] = (),
    min_chunk: int = 1,
    first: int = 0,
    span: int | None = None,
    stage_limit: int | None = None,
    layouts: dict | None = None,
) -> tuple[Task, list[Problem]]:
    """The units of the task producing ``root``, their per-block ranges, and what should be
    materialized so that it runs well. ``min_chunk``: elements per block at least (a task that
    reads or writes host memory gives each block whole 128-byte lines). ``stage_limit``: the
    shared memory (floats) a block of the task may use; when the staged copies of materialized
    values alone exceed it, the largest copies are read in place (flag-waited loads) instead."""
    if isinstance(root, Recur):
        return _recur_task(root, materialized, grid, first, layouts, stage_limit, span, threads), []
    if isinstance(root, DeltaScan):
        return _delta_task(root, materialized, grid, threads, first, layouts), []
    if isinstance(root, BodyLoop):
        return _body_task(root, materialized, grid, first, layouts, stage_limit, threads), []
    read_in_place: set[int] = set()
    for _ in range(64):
        arrays: set[int] = set()
        for _ in range(64):
            view = TaskView(root, materialized, arrays, inline_through, read_in_place, layouts)
            units = _collect_units(view, root)
            extra = _cache_candidates(view, units, grid, threads)
            if not extra - arrays:
                break
            arrays |= extra
        else:
            raise CompileError(f"{root.label or root}: the shared-memory arrays did not settle")
        # (a split product's partial sums: whole rows of N a block, so its blocks compute disjoint
        # slices of its input, which hold the side stores computed there)
        align = root.steps if column_scan(root) else root.shape[-1] if isinstance(root, PartialSums) else 1
        chunk, blocks, first_block, lo, hi = root_ranges(root.size, grid, min_chunk, first, span, align)
        task = Task(root, units, chunk, blocks, view, min_chunk, first_block, stage_limit=stage_limit)
        task.units[ROOT].lo, task.units[ROOT].hi = lo, hi
        problems = _ranges(task, grid, threads, users, outputs)
        # A block's copy of a value is the hull of what its elements read: a channel-major
        # reader of a [T, C] value (mamba's convolution over its in-projection's window, the
        # transpose back) needs a few channels at every position, and the hull is nearly the
        # whole value (31,751 floats a block). When such copies alone overflow shared memory
        # (nothing left that materializing could shrink), the largest is read where it lies. A
        # product's input rows stay staged whatever this says (_collect_units), so a value once
        # chosen is not chosen again.
        staged = [
            u
            for u in task.arrays()
            if u.how == "thread" and view.source_kind(u.node) == "materialized" and u.node.id not in read_in_place
        ]
        sparse = {u.node.id for u in staged if _sparse_copy(task, u)}
        if sparse:
            read_in_place |= sparse
            continue
        if (
            stage_limit is None
            or task_smem_floats(task) <= stage_limit
            or not staged
            or any(u.node.id not in materialized for u in task.arrays())
        ):
            break
        read_in_place.add(max(staged, key=lambda u: u.storage).node.id)
    else:
        raise CompileError(f"{root.label or root}: the values read in place did not settle")
    task.reads = {o.node.id for u in units.values() for o in u.occurrences if view.kind(o.node) == "materialized"} | {
        u.node.id for u in task.arrays() if u.how == "thread" and view.source_kind(u.node) == "materialized"
    }
    return task, problems


def _sparse_copy(task: Task, staged: Unit) -> bool:
    """Whether a block's copy of a value stored in another order than its readers' (column_layouts:
    gated_ssm's gate, stored column by column for its scan, read a row at a time by the product
    beside it) would be mostly elements nobody reads: its hull is more than SPARSE_COPY_RATIO
    times what the units reading it compute, each element reading it once, outside any loop. Such
    a value is read where it lies, each thread waiting for its own element."""
    if (staged.node.id not in task.view.layouts and not SPARSE_COPY_ANY) or staged.storage < STAGED_MIN:
        return False
    readers = 0
    for unit in task.units.values():
        occs = [o for o in unit.occurrences if o.node.id == staged.node.id]
        if not occs or unit is staged:
            continue
        if unit.how not in ("root", "thread") or any(o.loops for o in occs):
            return False
        readers += max(unit.span, 1) * len(occs)
    return readers > 0 and staged.storage > SPARSE_COPY_RATIO * readers


def _collect_units(view: TaskView, root: Node) -> dict:
    units: dict[int, Unit] = {}
    pending = [(root, "root")]
    while pending:
        node, how = pending.pop()
        key = ROOT if how == "root" else node.id
        if key in units:
            continue
        if how == "dot" and view.kind(node.src) not in ("array", "dot"):
            view.arrays.add(node.src.id)  # a product's input rows always come from shared memory
        unit = Unit(node, how, ix.Var(f"e{len(units)}", max(node.size, 1)))
        units[key] = unit
        Walk(view, unit).run()
        for occ in unit.occurrences:
            kind = view.kind(occ.node)
            if kind in ("array", "dot"):
                unit.deps.add(occ.node.id)
                if occ.node.id not in units:
                    target = occ.node
                    if kind == "dot":
                        child = "dot"
                    elif isinstance(target, Reduce) and view.source_kind(target) == "inline":
                        child = "reduce"
                    else:  # elementwise, or a staged copy of a leaf or materialized value
                        child = "thread"
                    pending.append((target, child))
    return units


def _elements_a_block(unit: Unit, root_size: int, grid: int) -> int:
    """An upper bound on the elements of ``unit`` one block computes (before the ranges are
    known): an array may be needed whole by every block, the root is spread over the grid."""
    if unit.how == "root":
        return -(-root_size // grid)
    return max(unit.node.size, 1)


def _cache_candidates(view: TaskView, units: dict, grid: int = 1, threads: int = THREADS) -> set:
    """Inline values read by more than one element of a unit and costly enough to compute once.
    Only the lowest are returned (none of them reads another inline): a value above a cached
    reduction is cheap once the reduction is an array, so costs are judged again next round."""
    found: set[int] = set()
    memo: dict = {}
    framed = frame_source(view.root) is not None
    if framed:  # the frame is read from host memory once: a warp's loop over it reads a staged copy
        for unit in units.values():
            if unit.how not in ("root", "thread"):
                found.update(o.node.id for o in unit.occurrences if _host_leaf(o.node))
    for unit in units.values():
        # every flag-tagged value a task reads is staged into shared memory in its first phase,
        # all loads in flight at once: a wait inside a loop is one round trip per iteration, and
        # one in the root (a residual) is a round trip after the products (~0.3 us on the H100)
        for occ in unit.occurrences:
            if view.kind(occ.node) == "materialized" and occ.node.id not in view.read_in_place:
                found.add(occ.node.id)
    for unit in units.values():
        elements = max(unit.node.size, 1)
        by_node: dict[int, list] = {}
        for occ in unit.occurrences:
            if view.kind(occ.node) == "inline" and not isinstance(occ.node, (Map, Concat)):
                by_node.setdefault(occ.node.id, []).append(occ)
        few = _elements_a_block(unit, view.root.size, grid) <= threads
        split = split_input(view.root) if unit.how == "root" else None
        for node_id, occs in by_node.items():
            node = occs[0].node
            if split is not None and node_id == split.id:
                found.add(node_id)  # a slice of it a block, read by each of the N sums: computed once
                continue
            cost = inline_cost(node, view, memo)
            if cost < CACHE_COST and not isinstance(node, Reduce):
                continue
            if (
                isinstance(node, Reduce)
                and node.size > 1  # a row's scalar (a LayerNorm's sums at batch 1): not measured
                and node.extent <= INLINE_REDUCE_EXTENT
                and cost <= node.extent * (1 + INLINE_REDUCE_SOURCE_COST)
            ):
                continue
            if (
                few
                and node.size <= _recomputed_scalars()
                and cost <= SCALAR_RECOMPUTE_COST
                and not isinstance(node, Reduce)
            ):
                continue
            if framed and isinstance(node, Reduce) and node.extent >= WARP:
                found.add(node_id)  # a warp's reduction, not one thread's loop beside 64 copies
                continue
            pairs = [enumerate_pairs(o, unit.var, elements) for o in occs]
            if any(p is None for p in pairs) or shared_reads(pairs, node.size):
                found.add(node_id)
    nodes = {}
    for unit in units.values():
        for occ in unit.occurrences:
            nodes[occ.node.id] = occ.node
    return {
        nid
        for nid in found
        if view.source_kind(nodes[nid]) == "materialized" or not _reads_inline(nodes[nid], found - {nid}, view, {})
    }


def split_input(node: Node) -> Node | None:
    """The value a split product's partial sums multiply (simplify.SplitProducts: the first
    operand of its product, through its data movement), or None for anything else."""
    if not isinstance(node, PartialSums) or not isinstance(node.src, Ew) or node.src.op != "mul":
        return None
    value = node.src.args[0]
    while isinstance(value, Map):
        value = value.src
    return value


def _reads_inline(node: Node, targets: set, view: TaskView, memo: dict) -> bool:
    """Whether ``node``'s inline computation reaches one of ``targets``."""
    if node.id in memo:
        return memo[node.id]
    result = False
    for child in node.inputs():
        if child.id in targets:
            result = True
        elif view.kind(child) == "inline" and _reads_inline(child, targets, view, memo):
            result = True
        if result:
            break
    memo[node.id] = result
    return result


def _ranges(task: Task, grid: int, threads: int, users: dict, outputs: set) -> list[Problem]:
    units, view = task.units, task.view
    order = _order_units(units)  # readers before what they read
    needs: dict[int, list] = {}
    reads_by: dict[int, list] = {}  # dot id -> [(reader unit, pairs)]
    for unit in order:
        if unit.how != "root":
            first, unit.hi = hull(needs.get(unit.node.id, []), grid)
            # the origin aligned down, so float4 reads of an array's rows stay aligned; the
            # elements between it and the first needed one are not computed (nor their inputs
            # staged: computing them read other arrays' shared memory, a race in xlstm's kernel)
            unit.first, unit.lo = first, (first // 4) * 4
        else:
            unit.first = unit.lo
        elements = max(unit.node.size, 1)
        for occ in unit.occurrences:
            kind = view.kind(occ.node)
            if kind not in ("array", "dot"):
                continue
            pairs = enumerate_pairs(occ, unit.var, elements)
            bounds = pairs if pairs is not None else bounding_pairs(occ, unit.var, elements)
            needs.setdefault(occ.node.id, []).append(
                needed_ranges(bounds, unit.first, unit.hi, elements, occ.node.size)
            )
            if kind == "dot":
                reads_by.setdefault(occ.node.id, []).append((unit, pairs))
    # the ranges of the state and weight leaves each block reads (prefetched at kernel start)
    leaf_needs: dict[int, list] = {}
    leaf_nodes: dict[int, Leaf] = {}
    for unit in order:
        elements = max(unit.node.size, 1)
        for occ in unit.occurrences:
            node = occ.node
            if isinstance(node, Leaf) and node.role in ("state", "weight") and view.kind(node) in ("leaf", "array"):
                if view.kind(node) == "array" and occ.node.id == unit.node.id:
                    pairs = (np.arange(elements), np.arange(elements))  # a staged copy reads itself 1:1
                else:
                    pairs = enumerate_pairs(occ, unit.var, elements)
                    pairs = pairs if pairs is not None else bounding_pairs(occ, unit.var, elements)
                leaf_needs.setdefault(node.id, []).append(
                    needed_ranges(pairs, unit.first, unit.hi, elements, node.size)
                )
                leaf_nodes[node.id] = node
    task.leaves = {nid: (leaf_nodes[nid], *hull(pieces, grid)) for nid, pieces in leaf_needs.items()}
    problems: list[Problem] = []
    memo: dict = {}
    for unit in units.values():
        if unit.how == "root":
            continue
        node = unit.node
        replication = unit.total / max(node.size, 1)
        if unit.how == "dot":
            redundant = (unit.total - node.size) * node.k
            per_block = unit.span * node.k
            if per_block > DOT_BLOCK_MACS and replication <= DOT_REDUNDANCY and task.blocks < min(grid, task.root.size):
                # few blocks would do all of it (a task kept on few blocks for host writes):
                # its own task spreads it over the grid
                problems.append(
                    Problem(
                        materialize_point(node, users, outputs),
                        f"{node.label or node}: {per_block} multiply-adds on one block",
                        0,
                    )
                )
            elif (
                replication > DOT_REDUNDANCY
                and redundant > DOT_SMALL_MACS
                and not (per_block <= INPUT_DOT_BLOCK_MACS and reads_graph_input(node))
                and per_block > _replicated_dot_macs()
            ):
                readers = {id(u): u for u, _ in reads_by.get(node.id, [])}
                target = materialize_point(node, users, outputs)
                # a product that many blocks need whole, read once per element by one replicated
                # array, is best published as that array (mamba's SSM output, not its delta); a
                # product replicated over a few blocks (a head on a handful of blocks) is published
                # where it is computed anyway, at the top of its elementwise chain
                if len(readers) == 1 and replication >= FEW_BLOCKS:
                    (reader,) = readers.values()
                    pairs = [p for u, p in reads_by[node.id] if u is reader]
                    if (
                        reader.how != "root"
                        and reader.total > 2 * max(reader.node.size, 1)
                        and all(p is not None for p in pairs)
                        and not shared_reads(pairs, node.size)
                    ):
                        target = reader.node
                problems.append(
                    Problem(target, f"{node.label or node} computed {replication:.1f} times over by the blocks", 0)
                )
        elif replication > 2 and view.source_kind(node) == "inline":
            per_thread = unit.span * max(inline_cost_of_unit(unit, view, memo), 1) / threads
            staged = 0
            elements = max(node.size, 1)
            for d in unit.deps:
                dep = units.get(d)
                if dep is None or dep.how != "thread" or view.source_kind(dep.node) != "materialized":
                    continue
                if isinstance(dep.node, PartialSums):
                    continue  # its readers sum it: publishing the sum would be the level it saves
                pairs = [enumerate_pairs(o, unit.var, elements) for o in unit.occurrences if o.node.id == d]
                # only a partitioned reduction (each staged value read by one element) counts:
                # it is cheaper spread over the grid; a value every element reads is not
                if pairs and all(p is not None for p in pairs) and not shared_reads(pairs, dep.node.size):
                    staged += dep.span
            if per_thread > REPLICATE_OPS:
                problems.append(
                    Problem(node, f"replicated in {int(replication)} blocks, {per_thread:.0f} ops a thread", 1)
                )
            elif staged > STAGED_RATIO * max(unit.span, 1) and staged > STAGED_MIN:
                # every block would load a large flagged value to reduce it: computing the array
                # once, spread over the grid, and publishing it is cheaper
                problems.append(
                    Problem(node, f"replicated in {int(replication)} blocks, each staging {staged} values", 1)
                )
    return problems


def inline_cost_of_unit(unit: Unit, view: TaskView, memo: dict) -> int:
    node = unit.node
    if unit.how == "reduce":
        return node.extent * (1 + inline_cost(node.src, view, memo))
    if unit.how == "dot":
        return node.k
    if isinstance(node, Map):
        return inline_cost(node.src, view, memo)
    if isinstance(node, Concat):
        return max(inline_cost(s, view, memo) for s in node.srcs)
    if isinstance(node, Ew):
        return 1 + sum(inline_cost(a, view, memo) for a in node.args)
    return 1


def _order_units(units: dict) -> list[Unit]:
    """Units ordered readers first (the root first); each unit's phase is one more than the
    latest phase of what it reads."""
    order: list[Unit] = []
    state: dict[int, int] = {}

    def visit(uid: int) -> None:
        if state.get(uid) == 2:
            return
        if state.get(uid) == 1:
            raise CompileError(f"{units[uid].node}: shared-memory arrays read one another in a cycle")
        state[uid] = 1
        for dep in sorted(units[uid].deps):
            if dep != uid:
                visit(dep)
        state[uid] = 2
        order.append(units[uid])

    for uid in sorted(units):
        visit(uid)
    for unit in order:  # dependencies first
        unit.phase = 1 + max((units[d].phase for d in unit.deps), default=-1)
    order.reverse()
    return order


def task_smem_limit(task: Task, smem_floats: int) -> int:
    """The shared memory (floats) a block of ``task`` may take: ``smem_floats``, a recurrence's
    arena more (recur_arena_floats)."""
    return recur_arena_floats(smem_floats) if isinstance(task.root, (Recur, BodyLoop)) else smem_floats


def task_smem_floats(task: Task) -> int:
    """Shared memory of a task's arrays, in floats (each array padded to 4 floats)."""
    if isinstance(task.root, Recur):
        return recur_smem_floats(task.root, task.chunk, task.stage_limit, task.threads)
    if isinstance(task.root, DeltaScan):
        return sum(n for _, n in delta_smem_parts(task.root))
    if isinstance(task.root, BodyLoop):
        return sum(n for _, n in body_task_plan(task).parts)
    return sum(_align4(u.storage) for u in task.arrays())


# -- the whole program ---------------------------------------------------------------------------------------


def consumers(program: Program) -> dict[int, list[Node]]:
    users: dict[int, list[Node]] = {}
    for node in program.nodes():
        for child in node.inputs():
            users.setdefault(child.id, []).append(node)
    return users


def materialize_point(node: Node, users: dict, outputs: set) -> Node:
    """Climb from a product through the elementwise chain above it while each step has one
    reader of the same shape: the residual sum rather than the bare product. Not to a step whose
    other inputs lie deeper (more products and reductions below them) than the value climbed so
    far: the value would wait for them (an in-projection of the frame, read again as the residual
    of the layer after the first, would be published a level after the first layer instead of
    beside it)."""
    current = node
    memo: dict = {}
    while current.id not in outputs:
        readers = users.get(current.id, [])
        if len(readers) != 1:
            break
        up = readers[0]
        if not isinstance(up, Ew) or up.shape != current.shape:
            break
        depth = product_depth(current, memo)
        if any(product_depth(a, memo) > depth for a in up.args if a is not current):
            break
        current = up
    return current


def product_depth(node: Node, memo: dict) -> int:
    """The most products and reductions on a path from the leaves to ``node`` (a frame with its
    scalars counts as the input it publishes)."""
    stack = [node]
    while stack:
        top = stack[-1]
        if top.id in memo:
            stack.pop()
            continue
        if frame_source(top) is not None:
            memo[top.id] = 0
            stack.pop()
            continue
        pending = [a for a in top.inputs() if a.id not in memo]
        if pending:
            stack.extend(pending)
            continue
        below = max((memo[a.id] for a in top.inputs()), default=0)
        memo[top.id] = below + (1 if isinstance(top, (Dot, Reduce)) else 0)
        stack.pop()
    return memo[node.id]


def reads_graph_input(node: Dot) -> bool:
    """A product of a graph input itself (through data movement only; from the frame's
    published array too, see frame_source)."""
    src = node.src
    while isinstance(src, Map):
        src = src.src
    return _host_leaf(src) or frame_source(src) is not None


def frame_source(node: Node) -> Leaf | None:
    """The graph input whose published array ``node`` is, when it is one (simplify's
    PublishFrameScalars: ``FrameConcat([x, s1, ...])``, the s computed from x alone), else None."""
    if not isinstance(node, FrameConcat) or node.axis != 0 or not node.srcs:
        return None
    first = node.srcs[0]
    while isinstance(first, Map):
        first = first.src
    if not _host_leaf(first):
        return None
    return first


def framed_inputs(program: Program) -> dict[int, Node]:
    """Graph input id -> its frame node, for each input that nothing but its frame's own
    computation reads: the frame's task then reads the input from host memory itself, and the
    input has no task of its own."""
    found: dict[int, Node] = {}
    nodes = program.nodes()
    for node in nodes:
        leaf = frame_source(node)
        if leaf is None or leaf.id in found:
            continue
        inside: set[int] = set()
        stack = [node]
        while stack:
            top = stack.pop()
            if top.id in inside:
                continue
            inside.add(top.id)
            stack.extend(top.inputs())
        # every node computed from the input, up to the frame, lies inside the frame's computation
        depends: set[int] = {leaf.id}
        ok = True
        for other in nodes:
            if other.id == node.id or other.id == leaf.id:
                continue
            if any(a.id in depends for a in other.inputs()):
                if other.id not in inside:
                    ok = False
                    break
                depends.add(other.id)
        if ok:
            found[leaf.id] = node
    return found


def canonical_output(node: Node) -> Node:
    """An output that is a reshape of a value is that value (the same elements in the same
    order): one task and one stored copy serve both."""
    while isinstance(node, Map) and node.what.startswith("reshape"):
        node = node.src
    return node


def schedule(
    program: Program,
    *,
    grid: int,
    threads: int = THREADS,
    smem_floats: int = 40 * 1024,
    replica_floats: int | None = None,
    recomputed_scalars: int | None = None,
    replicated_dot_macs: int | None = None,
) -> Schedule:
    """Tasks, arrays and per-block ranges for a grid of ``grid`` blocks of ``threads`` threads;
    ``smem_floats`` bounds each task's arrays; ``replica_floats`` caps the floats that the blocks
    of a task copying the same values whole copy in all (None: REPLICA_FLOATS);
    ``recomputed_scalars``: arrays of at most this many cheap scalars are recomputed by their
    readers (None: RECOMPUTED_SCALARS); ``replicated_dot_macs``: a product is computed by each
    block that reads it, however many times over, where a block's share is at most this many
    multiply-adds (None: REPLICATED_DOT_MACS; 0: never)."""
    if threads % WARP or threads <= 0:
        raise CompileError(f"threads per block must be a positive multiple of {WARP}, got {threads}")
    if replica_floats is not None and replica_floats <= 0:
        raise CompileError(f"replica_floats must be a positive number of floats, got {replica_floats}")
    if recomputed_scalars is not None and recomputed_scalars < 1:
        raise CompileError(f"recomputed_scalars must be at least 1, got {recomputed_scalars}")
    if replicated_dot_macs is not None and replicated_dot_macs < 0:
        raise CompileError(f"replicated_dot_macs must be 0 or more multiply-adds, got {replicated_dot_macs}")
    chosen = (
        RECOMPUTED_SCALARS if recomputed_scalars is None else int(recomputed_scalars),
        REPLICATED_DOT_MACS if replicated_dot_macs is None else int(replicated_dot_macs),
    )
    token = _SCHEDULE_SETTINGS.set(chosen)
    try:
        sched = _schedule(
            program,
            grid=grid,
            threads=threads,
            smem_floats=smem_floats,
            replica_floats=REPLICA_FLOATS if replica_floats is None else replica_floats,
        )
        sched.recomputed_scalars, sched.replicated_dot_macs = chosen
        return sched
    finally:
        _SCHEDULE_SETTINGS.reset(token)
        if not _pairs_kept:
            _forget_pairs()


def _schedule(program: Program, *, grid: int, threads: int, smem_floats: int, replica_floats: int | None) -> Schedule:
    users = consumers(program)
    destinations: dict[int, list[str]] = {}
    materialized: dict[int, Node] = {}
    for name, node in program.outputs.items():
        node = canonical_output(node)
        destinations.setdefault(node.id, []).append(name)
        materialized[node.id] = node
    outputs = set(destinations)
    for node in program.nodes():
        if column_scan(node) or isinstance(node, LOOPS):
            materialized[node.id] = node
    pinned = recur_inputs(program)
    materialized.update(pinned)
    layouts = column_layouts(program, users)
    # Graph inputs live in pinned host memory; reads of the same bytes from every block are
    # serialised over PCIe, so each input has a task of its own whose blocks read whole lines
    # once and publish the values as flag-tagged words. Measured on the H100 (session 61,
    # host_roundtrip.cu's fan rows, a 256-word frame every block needs): relayed through L2 by
    # one block 3.2 us a round trip for 1 block, 4.2 us for 132; polled by every block itself
    # 18 us for 8 blocks, 97 us for 32, 579 us for 132.
    frames = framed_inputs(program)
    host_chunk: dict[int, int] = {}
    for leaf in program.inputs.values():
        source = frames.get(leaf.id, leaf)
        materialized[source.id] = source
        host_chunk[source.id] = HOST_READ_CHUNK
    for nid, names in destinations.items():
        if any(n not in program.state_of.values() for n in names):
            host_chunk[nid] = max(host_chunk.get(nid, 1), HOST_WRITE_CHUNK)
    # a split product's partial sums are published where their input is computed, a block for
    # each slice's N sums (simplify.SplitProducts): the block computes its slice of the input once
    for node in program.nodes():
        if isinstance(node, PartialSums):
            materialized[node.id] = node
            host_chunk[node.id] = max(host_chunk.get(node.id, 1), node.shape[-1])
    notes: list[str] = []
    for _ in range(512):
        tasks: dict[int, Task] = {}
        problems: list[Problem] = []
        for node in list(materialized.values()):
            task, found = build_task(
                node,
                materialized,
                grid,
                threads,
                users,
                outputs,
                min_chunk=host_chunk.get(node.id, 1),
                stage_limit=smem_floats,
                layouts=layouts,
            )
            tasks[node.id] = task
            problems += found
            if task_smem_floats(task) > task_smem_limit(task, smem_floats):
                arrays = [u for u in task.arrays() if u.node.id not in materialized]
                if not arrays:
                    raise CompileError(
                        f"{node.label or node}: needs {4 * task_smem_floats(task)} bytes of shared memory a block"
                    )
                largest = max(arrays, key=lambda u: u.span)
                problems.append(Problem(largest.node, f"shared memory ({4 * task_smem_floats(task)} B)", 2))
        problems += _shared_products(tasks, users, outputs)
        problems += _mostly_views(tasks, materialized)
        problems = [p for p in problems if p.node.id not in materialized]
        if not problems:
            break
        first = min(p.priority for p in problems)
        for p in problems:
            if p.priority == first and p.node.id not in materialized:
                materialized[p.node.id] = p.node
                notes.append(f"materialized {p.node.label or p.node}: {p.reason}")
    else:
        raise CompileError("the choice of materialized values did not settle")

    # Materializing is only ever added while the rules settle; one that a later choice made
    # unnecessary (silu(conv) once conv itself is materialized) costs a level. Drop each
    # non-output that its readers can compute without any rule firing again.
    # (SPLIT_SUMS_KEPT: a kept sum of partial sums and the values it adds to them stay, so that
    # the blocks that sum the partial sums can store it without computing those values again)
    sums = {nid for nid, node in materialized.items() if _sums_partials(node)} if SPLIT_SUMS_KEPT else set()
    kept_sums = _with_added_values(sums, materialized)
    for nid in sorted(materialized, reverse=True):
        node = materialized[nid]
        if (
            nid in outputs
            or nid in pinned
            or isinstance(node, PartialSums)
            or nid in kept_sums
            or isinstance(node, (Leaf, *LOOPS))
            or frame_source(node) is not None
            or column_scan(node)
        ):
            continue
        trial = {k: v for k, v in materialized.items() if k != nid}
        readers = [t for t in tasks.values() if nid in t.reads]
        ok = bool(readers)
        rebuilt = {}
        for task in readers:
            built, found = build_task(
                task.root,
                trial,
                grid,
                threads,
                users,
                outputs,
                min_chunk=task.min_chunk,
                stage_limit=task.stage_limit,
                layouts=layouts,
            )
            others = {**{k: v for k, v in tasks.items() if k != nid}, **rebuilt, task.root.id: built}
            found += _shared_products(others, users, outputs) + _mostly_views(others, trial)
            if any(p.node.id not in trial for p in found) or task_smem_floats(built) > task_smem_limit(
                built, smem_floats
            ):
                ok = False
                break
            rebuilt[task.root.id] = built
        if ok:
            materialized = trial
            tasks.pop(nid, None)
            tasks.update(rebuilt)
            notes.append(f"{node.label or node} computed where it is read (its materialization became unnecessary)")
    side_of = _absorb(tasks, materialized, outputs, grid, threads, users, layouts, first=sums)
    for nid in side_of:
        notes.append(
            f"{materialized[nid].label or materialized[nid]} stored by the task of "
            f"{materialized[side_of[nid]].label or materialized[side_of[nid]]}"
        )
    for host_id in set(side_of.values()):
        absorbed = [o for o, h in side_of.items() if h == host_id]
        host = tasks[host_id]
        task, _ = build_task(
            host.root,
            materialized,
            grid,
            threads,
            users,
            outputs,
            inline_through=absorbed,
            min_chunk=host.min_chunk,
            stage_limit=host.stage_limit,
            layouts=layouts,
        )
        task.side = [materialized[o] for o in absorbed]
        tasks[host_id] = task
    for out_id in side_of:
        tasks.pop(out_id, None)
    ordered = _place(
        _order_tasks(tasks, side_of), materialized, grid, threads, users, outputs, smem_floats, replica_floats
    )
    if FRAME_BLOCK_QUIET:
        ordered = _quiet_frame_block(ordered, materialized, grid, threads, users, outputs)
    producer: dict[int, int] = {}
    for i, task in enumerate(ordered):
        producer[task.root.id] = i
        for s in task.side:
            producer[s.id] = i
    read_ids = set().union(*(t.reads for t in ordered)) if ordered else set()
    read_ids |= {t.root.id for t in ordered if isinstance(t.root, Recur)}  # it reads its own h back
    ll_nodes = {nid: materialized[nid] for nid in sorted(read_ids)}
    return Schedule(
        program, grid, threads, ordered, materialized, destinations, ll_nodes, producer, notes, layouts, replica_floats
    )


def _task_levels(ordered: list) -> list[int]:
    produced_by: dict[int, int] = {}
    for i, task in enumerate(ordered):
        produced_by[task.root.id] = i
        for s in task.side:
            produced_by[s.id] = i
    level: list[int] = []
    for i, task in enumerate(ordered):
        before = [level[produced_by[n]] for n in task.reads if produced_by.get(n, i) < i]
        level.append(1 + max(before, default=0))
    return level


def _with_added_values(sums: set[int], materialized: dict) -> set[int]:
    """The materialized sums of partial sums ``sums`` (ids) and the materialized values they add
    to the partial sums (a residual stream's previous value)."""
    kept = set(sums)
    for nid in sums:
        stack = list(materialized[nid].inputs())
        while stack:
            n = stack.pop()
            if n.id in materialized:
                kept.add(n.id)
            elif isinstance(n, (Ew, Map)):
                stack.extend(n.inputs())
    return kept


def _sums_partials(node: Node) -> bool:
    """Whether ``node`` sums a product's partial sums (a Reduce over a PartialSums), through
    elementwise ops and data movement: each of its readers would stage P x N words."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        if isinstance(n, Reduce) and isinstance(n.src, PartialSums):
            return True
        if isinstance(n, (Ew, Map)):
            stack.extend(n.inputs())
    return False


def _place(
    ordered: list,
    materialized: dict,
    grid: int,
    threads: int,
    users: dict,
    outputs: set,
    smem_floats: int,
    replica_floats: int | None,
) -> list:
    """Tasks that do not wait on one another (one dependency level: attention's q, k and v,
    mamba's three x-projection slices) go on disjoint blocks, so they run side by side instead of
    one after another on the same blocks (measured on the H100: mamba's slices took 1.5 us each,
    in a row). Where their blocks exceed the grid, the grid is shared out (each task gets at most
    what it would use alone, the small ones first) and a task takes more elements a block: a
    block's warps are mostly idle at two rows a block anyway. A task whose arrays would then
    outgrow shared memory keeps its blocks."""
    level = _task_levels(ordered)
    wanted = [_replica_capped_blocks(task, replica_floats) for task in ordered]
    # the recurrences' own blocks, from the grid's end (RECUR_OWN_BLOCKS)
    own: dict[int, int] = {}
    end = grid
    recurs = [i for i, task in enumerate(ordered) if isinstance(task.root, (Recur, BodyLoop))]
    if RECUR_OWN_BLOCKS and recurs and sum(ordered[i].blocks for i in recurs) <= grid // 2:
        for i in recurs:
            end -= ordered[i].blocks
            own[i] = end
    spans: dict[int, int] = {}
    for lv in sorted(set(level)):
        members = sorted((i for i in range(len(ordered)) if level[i] == lv and i not in own), key=lambda i: wanted[i])
        remaining = end
        for n, i in enumerate(members):
            share = max(1, remaining // (len(members) - n))
            spans[i] = min(wanted[i], share)
            remaining = max(0, remaining - spans[i])
    placed = []
    offset, current = 0, None
    for i, task in enumerate(ordered):
        if i in own:
            moved = (
                task if task.first == own[i] else _moved(task, materialized, grid, threads, users, outputs, own[i], 0)
            )
            placed.append(moved)
            continue
        if level[i] != current:
            offset, current = 0, level[i]
        if offset + spans[i] > end:
            offset = 0
        first = offset
        offset += spans[i]
        if first == task.first and spans[i] == task.blocks:
            placed.append(task)
            continue
        moved = _moved(task, materialized, grid, threads, users, outputs, first, spans[i])
        placed.append(task if task_smem_floats(moved) > task_smem_limit(moved, smem_floats) else moved)
    return placed


def block_copy_floats(task: Task, b: int) -> int:
    """Floats of state, weight values and weight rows block ``b`` copies into shared memory for
    ``task`` (as codegen's prefetch would, before its shared-memory budget)."""
    if not task.first <= b < task.first + task.blocks:
        return 0
    total = 0
    for _leaf, lo, hi in task.leaves.values():
        if hi[b] > lo[b]:
            total += int(hi[b] - (lo[b] // 4) * 4)
    for unit in task.units.values():
        if unit.how != "dot" or unit.hi is None or unit.hi[b] <= unit.lo[b]:
            continue
        n = unit.node.n
        lo, hi = int(unit.lo[b]), int(unit.hi[b])
        cols = np.arange(lo, hi) % n
        rows = n if hi - lo >= n else int(cols.max() - cols.min() + 1)
        total += rows * unit.node.k
    return total


def _quiet_frame_block(ordered: list, materialized: dict, grid: int, threads: int, users: dict, outputs: set) -> list:
    """Move each one-block frame task (see FRAME_BLOCK_QUIET) to the block that runs no task
    before it nor another of its level and copies the fewest floats for its next
    FRAME_BLOCK_LOOKAHEAD tasks; the block _place gave it wins ties."""
    out = list(ordered)
    for i, task in enumerate(ordered):
        if not isinstance(task.root, FrameConcat) or task.blocks != 1:
            continue

        def cost(b: int, i: int = i) -> int:
            later = [t for t in out[i + 1 :] if t.first <= b < t.first + t.blocks][:FRAME_BLOCK_LOOKAHEAD]
            return sum(block_copy_floats(t, b) for t in later)

        level = _task_levels(out)
        # a block free of every task before it and of the other tasks of its level (see _place)
        busy = [t for j, t in enumerate(out) if j != i and (j < i or level[j] <= level[i])]
        free = [b for b in range(grid) if not any(t.first <= b < t.first + t.blocks for t in busy)]
        if task.first not in free:
            free.append(task.first)
        best = min(free, key=lambda b: (cost(b), b != task.first, b))
        if best == task.first:
            continue
        out[i] = _moved(task, materialized, grid, threads, users, outputs, best, 1)
    return out


def _moved(
    task: Task, materialized: dict, grid: int, threads: int, users: dict, outputs: set, first: int, span: int
) -> Task:
    """``task`` rebuilt on the blocks [first, first + span), with its side stores."""
    moved, _ = build_task(
        task.root,
        materialized,
        grid,
        threads,
        users,
        outputs,
        inline_through=[s.id for s in task.side],
        min_chunk=task.min_chunk,
        first=first,
        span=span,
        stage_limit=task.stage_limit,
        layouts=task.view.layouts,
    )
    moved.side = list(task.side)
    if not all(_computes_once(moved, s) for s in moved.side):
        return task  # on other blocks its side stores would be computed more than once, or not at all
    return moved


def replicated_floats(task: Task) -> int:
    """Floats of state and weight values a block of ``task`` copies that the task's blocks copy
    over more than twice their size in all: values each block reads whole, not a share of."""
    if task.blocks < 2:
        return 0
    total = 0
    for leaf, lo, hi in task.leaves.values():
        span = np.maximum(hi - lo, 0)[task.first : task.first + task.blocks]
        if span.size and int(span.sum()) > 2 * leaf.size:
            total += int(span.max())
    return total


def _replica_capped_blocks(task: Task, replica_floats: int | None) -> int:
    replicated = replicated_floats(task)
    if replica_floats is None or replicated == 0:
        return task.blocks
    return max(1, min(task.blocks, replica_floats // replicated))


def hybrid_recurrences(sched: Schedule) -> list[Recur]:
    """The recurrences of ``sched`` whose R its blocks hold split between registers and shared
    memory (RecurPlan.hybrid: a hidden size past what registers hold, e.g. nn.LSTM hidden 1024):
    where there is none, the build's stepkernel-512-threads tactic takes the plain schedule as its
    own instead of scheduling again."""
    found = []
    for task in sched.tasks:
        if isinstance(task.root, Recur) and recur_plan(task.root, task.chunk, task.stage_limit, task.threads).hybrid:
            found.append(task.root)
    return found


def replica_capped(sched: Schedule, replica_floats: int) -> bool:
    """Whether some task of ``sched`` copies the same values whole over more than ``replica_floats``
    floats in all, its blocks together (see schedule): where none does, the build's replica-cap
    tactics take the plain schedule as theirs instead of scheduling again."""
    return any(replicated_floats(task) * task.blocks > replica_floats for task in sched.tasks)


def _computed_parts(node: Node, materialized: dict, found: list) -> int:
    """Walk a data-movement tree (Map / Concat) down to leaves, materialized values and computed
    nodes; collect the computed ones in ``found``; return how many elements are pure views."""
    if isinstance(node, Leaf) or node.id in materialized:
        return node.size
    if isinstance(node, Map):
        return node.size if _computed_parts(node.src, materialized, found) >= node.src.size else 0
    if isinstance(node, Concat):
        return sum(_computed_parts(s, materialized, found) for s in node.srcs)
    found.append(node)
    return 0


def _mostly_views(tasks: dict, materialized: dict) -> list[Problem]:
    """A materialized value read by other tasks that is mostly data movement of leaves (a KV
    cache: the state shifted by one slot, then the new row) is read through as a view once its
    computed part is published by itself: readers take the old rows from the state (prefetched)
    and wait only for the new row, instead of staging the whole value (measured on the H100:
    attention's output projection spent 7 us staging both caches in every block)."""
    read = set().union(*(t.reads for t in tasks.values())) if tasks else set()
    problems = []
    for nid in sorted(read):
        node = materialized.get(nid)
        if node is None or not isinstance(node, (Map, Concat)) or nid not in tasks or frame_source(node) is not None:
            continue  # (a frame and its scalars are published together, by one block)
        found: list[Node] = []
        views = sum(_computed_parts(s, materialized, found) for s in node.inputs())  # Map: its source
        computed = sum(n.size for n in found)
        if found and views >= 2 * computed:
            for part in found:
                problems.append(Problem(part, f"the computed part of {node.label or node} (the rest is a view)", 3))
    return problems


def _shared_products(tasks: dict, users: dict, outputs: set) -> list[Problem]:
    """A product computed inside two tasks is materialized: one of them stores it (a side store,
    see _absorb) and the other reads it, instead of both computing it."""
    seen: dict[int, int] = {}
    problems = []
    for task in tasks.values():
        for unit in task.arrays():
            if unit.how == "dot" and unit.node.id != task.root.id:
                if reads_graph_input(unit.node) and unit.span * unit.node.k <= INPUT_DOT_BLOCK_MACS:
                    continue  # recomputed where read (see INPUT_DOT_BLOCK_MACS)
                seen[unit.node.id] = seen.get(unit.node.id, 0) + 1
    for task in tasks.values():
        for unit in task.arrays():
            if unit.how == "dot" and seen.get(unit.node.id, 0) > 1:
                point = materialize_point(unit.node, users, outputs)
                problems.append(
                    Problem(point, f"{unit.node.label or unit.node} computed in {seen[unit.node.id]} tasks", 3)
                )
    return problems


def _absorb(
    tasks: dict,
    materialized: dict,
    outputs: set,
    grid: int,
    threads: int,
    users: dict,
    layouts: dict,
    first: set = frozenset(),
) -> dict:
    """materialized value id -> id of the task that stores it as a side store (it computes every
    element exactly once anyway). A column scan's task, and a value stored in another order than
    its own (column_layouts), take no part: the column loop stores nothing but its scan. The values
    in ``first`` are tried first (SPLIT_SUMS_KEPT's sums, before the values they add to the partial
    sums go into their tasks)."""
    side_of: dict[int, int] = {}
    current = dict(tasks)  # host id -> its task as built with what it absorbed so far

    def absorbed_by(host_id: int) -> list[int]:
        return [o for o, h in side_of.items() if h == host_id]

    changed = True
    while changed:
        changed = False
        for out_id in sorted(tasks, key=lambda i: (i not in first, i)):
            if out_id in side_of:
                continue
            node = materialized[out_id]
            if isinstance(node, Leaf) or frame_source(node) is not None:
                continue  # a graph input is read from host memory by its own task only
            if column_scan(node) or isinstance(node, LOOPS) or out_id in layouts:
                continue
            # a host moves with what it stores (an LSTM's h with its c, into the residual sum
            # after it)
            carried = absorbed_by(out_id)
            for host_id in sorted(current):
                host = current[host_id]
                if (
                    host_id == out_id
                    or host_id in side_of
                    or out_id not in host.reads
                    or column_scan(host.root)
                    or isinstance(host.root, LOOPS)
                ):
                    continue
                trial, problems = build_task(
                    host.root,
                    materialized,
                    grid,
                    threads,
                    users,
                    outputs,
                    inline_through=absorbed_by(host_id) + [out_id] + carried,
                    min_chunk=host.min_chunk,
                    stage_limit=host.stage_limit,
                    layouts=layouts,
                )
                if problems or not all(_computes_once(trial, materialized[n]) for n in [out_id] + carried):
                    continue
                # the products the side store brings into the host (the stored value itself, or
                # the products under it: a normalization folded into a K row's product)
                added = sum(
                    u.span * u.node.k for u in trial.units.values() if u.how == "dot" and u.node.id not in host.units
                )
                # (a split product's partial sums need their input whole on their blocks anyway)
                if added > max(ABSORB_DOT_MACS, _replicated_dot_macs()) and not isinstance(host.root, PartialSums):
                    continue
                before = _levels_by_task(current, side_of)
                for moved in [out_id] + carried:
                    side_of[moved] = host_id
                if _has_cycle(current, side_of, trial, host_id) or _deepens(before, current, side_of, trial, host_id):
                    del side_of[out_id]
                    for moved in carried:
                        side_of[moved] = out_id
                    continue
                current[host_id] = trial
                current.pop(out_id, None)
                changed = True
                break
    return side_of


def array_partitioned(task: Task, unit: Unit) -> bool:
    """Whether the blocks of ``task`` compute disjoint ranges of the thread-per-element array
    ``unit`` (each element once in all): a split product's input, a slice a block
    (simplify.SplitProducts), whose graph outputs the array's own loop can store."""
    if unit.how != "thread" or unit.hi is None:
        return False
    start = unit._start()
    live = [(int(start[b]), int(unit.hi[b])) for b in range(len(unit.hi)) if unit.hi[b] > start[b]]
    live.sort()
    return bool(live) and all(a[1] <= b[0] for a, b in zip(live, live[1:]))


def array_replicated(task: Task, unit: Unit) -> bool:
    """Whether every block of ``task`` that computes the thread-per-element array ``unit`` computes
    all of it (a value every block of the task needs whole: the residual stream that a split
    product's readers sum), so its first such block can store it (SPLIT_SUMS_KEPT)."""
    if unit.how != "thread" or unit.hi is None:
        return False
    start = unit._start()
    live = [b for b in range(len(unit.hi)) if unit.hi[b] > start[b]]
    size = max(unit.node.size, 1)
    return bool(live) and all(int(start[b]) == 0 and int(unit.hi[b]) == size for b in live)


def replica_store_block(task: Task, unit: Unit) -> int:
    """The block that stores a replicated array's side store: the first that computes it."""
    start = unit._start()
    return next(b for b in range(len(unit.hi)) if unit.hi[b] > start[b])


def _computed_elements(task: Task, unit: Unit) -> np.ndarray:
    """The elements of ``unit`` its task computes: all of a root's; a partitioned array's ranges."""
    if unit.how == "root":
        return np.arange(max(task.root.size, 1), dtype=np.int64)
    start = unit._start()
    return np.concatenate(
        [np.arange(start[b], unit.hi[b], dtype=np.int64) for b in range(len(unit.hi)) if unit.hi[b] > start[b]]
    )


def _computes_once(task: Task, node: Node) -> bool:
    """Whether ``task`` computes every element of ``node`` exactly once, across blocks: inline in
    its root, or in a thread-per-element array whose blocks compute disjoint ranges of it."""
    own = task.units.get(node.id)
    if own is not None and own.how == "thread" and own.node is node and array_partitioned(task, own):
        # its own array (a split product's input): stored by the array's loop (codegen)
        return _computed_elements(task, own).size == node.size
    if SPLIT_SUMS_KEPT and own is not None and own.node is node and array_replicated(task, own):
        return _sums_partials(node)  # stored by the array's loop on one block (codegen)
    pairs = []
    for unit in task.units.values():
        for occ in unit.occurrences:
            if occ.node.id != node.id:
                continue
            if unit.how != "root" and not (unit.node.id != node.id and array_partitioned(task, unit)):
                return False
            elements = max(unit.node.size, 1)
            p = enumerate_pairs(occ, unit.var, elements)
            if p is None:
                return False
            if unit.how != "root":
                keep = np.isin(p[0], _computed_elements(task, unit))
                p = (p[0][keep], p[1][keep])
            pairs.append(p)
    if not pairs:
        return False
    flat = np.concatenate([p[1] for p in pairs]).astype(np.int64)
    return flat.size == node.size and bool((np.bincount(flat, minlength=node.size) == 1).all())


def _has_cycle(current: dict, side_of: dict, trial: Task, host_id: int) -> bool:
    """Whether storing the side stores in their hosts makes tasks wait on one another in a loop."""
    tasks = {tid: (trial if tid == host_id else task) for tid, task in current.items() if tid not in side_of}
    try:
        _order_tasks(tasks, side_of)
    except CompileError:
        return True
    return False


def _levels_by_task(current: dict, side_of: dict, trial: Task | None = None, host_id: int | None = None) -> dict:
    """Each task's dependency level with ``side_of``'s side stores in their hosts (``trial`` as
    the task of ``host_id``)."""
    tasks = {tid: (trial if tid == host_id else task) for tid, task in current.items() if tid not in side_of}
    produced_by = {tid: tid for tid in tasks}
    produced_by.update({out_id: host for out_id, host in side_of.items() if host in tasks})
    ordered = _order_tasks(tasks, side_of)
    by_id = {id(task): tid for tid, task in tasks.items()}
    level: dict[int, int] = {}
    for task in ordered:
        deps = {produced_by.get(nid) for nid in task.reads} - {None, by_id[id(task)]}
        level[by_id[id(task)]] = 1 + max((level[d] for d in deps if d in level), default=0)
    return level


def _deepens(before: dict, current: dict, side_of: dict, trial: Task, host_id: int) -> bool:
    """Whether a side store makes some task wait a level longer: a value stored by a host of a
    later level reaches its other readers later than its own task would have published it (xlstm's
    scaled key stored by the normalizer's task held the C·q task back a level, in both layers)."""
    after = _levels_by_task(current, side_of, trial, host_id)
    return any(after[tid] > before[tid] for tid in after if tid in before)


def _order_tasks(tasks: dict, side_of: dict) -> list:
    produced_by = {tid: tid for tid in tasks}
    for out_id, host in side_of.items():
        produced_by[out_id] = host
    order: list = []
    state: dict[int, int] = {}

    def visit(tid: int) -> None:
        if state.get(tid) == 2:
            return
        if state.get(tid) == 1:
            raise CompileError("tasks depend on one another in a cycle")
        state[tid] = 1
        for nid in sorted(tasks[tid].reads):
            dep = produced_by.get(nid)
            if dep is not None and dep != tid and dep in tasks:
                visit(dep)
        state[tid] = 2
        order.append(tasks[tid])

    for tid in sorted(tasks):
        visit(tid)
    # as soon as possible: by dependency level, so work that waits on nothing is not left at the end
    level: dict[int, int] = {}
    index = {id(task): i for i, task in enumerate(order)}
    by_id = {id(task): tid for tid, task in tasks.items()}
    for task in order:
        tid = by_id[id(task)]
        deps = [produced_by.get(nid) for nid in task.reads]
        level[tid] = 1 + max((level[d] for d in deps if d is not None and d != tid and d in level), default=0)
    return sorted(order, key=lambda task: (level[by_id[id(task)]], index[id(task)]))


__all__ = [
    "ROOT",
    "Schedule",
    "Task",
    "TaskView",
    "Unit",
    "canonical_output",
    "concat_branches",
    "schedule",
    "task_smem_floats",
]
