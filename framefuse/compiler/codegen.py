"""CUDA source for a scheduled step program: one persistent kernel, ``ffk_step``.

Layout of the generated kernel (one thread block per SM, all blocks run the same task list):

    start     each block reads its launch counter (the epoch), copies its row of the range
              table into shared memory, issues cp.async copies of every weight row its dot
              products will read (one commit group per task), and stages the graph inputs it
              reads from pinned host memory into shared memory
    task i    skipped by blocks with no elements in it; otherwise phases separated by
              __syncthreads: shared-memory arrays (thread per element, warp per reduction, warp
              per dot product), then the root: each thread computes its elements with
              everything else inlined, and stores them (graph outputs to mapped host memory,
              next states to device memory, values other blocks read as flag-tagged words)
    end       the block's launch counter is advanced

Expressions are generated from the IR with loop-invariant values hoisted: each value is
declared in the innermost loop whose variable its index uses (never outside a Concat's branch
test), so ``Σ_k S[v,k]·k_k`` inside the loop over the state's columns is computed once per row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

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
    Recur,
    Reduce,
    Scan,
)
from framefuse.compiler.naive import index_grid
from framefuse.compiler.ops import EW, c_float
from framefuse.compiler.schedule import (
    RECUR_REGISTER_WEIGHTS,
    ROOT,
    Schedule,
    Task,
    Unit,
    array_partitioned,
    array_replicated,
    body_row_stride,
    body_task_plan,
    bounding_pairs,
    column_scan,
    concat_branches,
    delta_smem_parts,
    enumerate_pairs,
    frame_source,
    recur_held,
    recur_plan,
    recur_smem_floats,
    recur_smem_parts,
    replica_store_block,
    stored_flat,
)

RUNTIME = Path(__file__).resolve().parent / "runtime.cuh"
KERNEL_NAME = "ffk_step"
RESIDENT_KERNEL_NAME = "ffk_resident"  # the same body in a loop over frames (see Generator._resident_loop)
# Storage of the products' weight rows (Dot units; the weights of recurrences, loop bodies, biases
# and other vectors stay float32): "fp32", or "fp16" / "bf16" read by the products and widened to
# float32 as they are read (fp32 accumulation), or "int8": symmetric per row (precision/quantize's
# weight-only scheme: scale max|w| / 127, 1 for a zero row), the row's scale in a 16-byte header
# before its values, the sum over the row scaled once. A narrow row is padded to 16 bytes
# (NARROW_ROW_ALIGN 16-bit elements, INT8_ROW_ALIGN int8 ones), so every row starts 16-byte aligned
# in the weight buffer and in shared memory: the prefetch copies stay whole 16-byte cp.async copies
# and a product reads four weights as one 8-byte (16-bit) or 4-byte (int8) load. A product whose
# rows the format cannot hold (beyond fp16's range; not finite, for int8) keeps float32 rows.
WEIGHT_FORMATS = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3}  # the FMT template argument of the dots
NARROW_ROW_ALIGN = 8
INT8_ROW_ALIGN = 16
INT8_HEADER_WORDS = 4  # the row's scale, then zeros to 16 bytes
FP16_MAX = 65504.0
REDUCE_INIT = {"sum": "0.0f", "prod": "1.0f", "max": "-__int_as_float(0x7f800000)", "min": "__int_as_float(0x7f800000)"}


class Code:
    """A block of C: ``head`` (None for a plain list) then items (lines or nested blocks)."""

    def __init__(self, head: str | None = None):
        self.head = head
        self.items: list = []

    def render(self, indent: int, out: list[str]) -> None:
        pad = "    " * indent
        if self.head is None:
            for item in self.items:
                if isinstance(item, Code):
                    item.render(indent, out)
                else:
                    out.append(pad + item)
            return
        *before, head = self.head.split("\n")  # a #pragma line before a loop
        out.extend(pad + line for line in before)
        out.append(pad + (head + " {" if head else "{"))
        for item in self.items:
            if isinstance(item, Code):
                item.render(indent + 1, out)
            else:
                out.append(pad + "    " + item)
        out.append(pad + "}")


@dataclass
class Scope:
    code: Code
    var: ix.Var | None = None
    guard: bool = False
    memo: dict = field(default_factory=dict)
    pos: int = 0
    lanes: bool = False  # a loop whose iterations are split over the lanes of a warp

    def insert(self, item) -> None:
        self.code.items.insert(self.pos, item)
        self.pos += 1

    def open_child(self, child: Code) -> None:
        self.code.items.insert(self.pos, child)  # later statements of this scope go before it

    def close_child(self, child: Code) -> None:
        self.pos = next(i for i, item in enumerate(self.code.items) if item is child) + 1


@dataclass
class Val:
    text: str
    free: frozenset


@dataclass
class Layout:
    """Where everything lives: offsets in the weight buffer (floats), the flag-tagged buffer
    (64-bit words), shared memory (floats) and the range table (ints per block)."""

    weights: dict = field(default_factory=dict)  # leaf id -> offset
    weight_arrays: list = field(default_factory=list)  # (offset, array)
    recur_by_k: dict = field(default_factory=dict)  # Recur id -> offset of R laid out per block by k
    weight_floats: int = 0
    narrow: dict = field(default_factory=dict)  # Dot id -> (offset in floats, 32-bit words a row): narrow rows
    ll: dict = field(default_factory=dict)  # node id -> offset
    ll_words: int = 0
    columns: list = field(default_factory=list)  # range-table columns: (task, unit id, "lo" | "hi" | "nlo")
    column_of: dict = field(default_factory=dict)
    table: np.ndarray | None = None  # [grid, columns] int32
    groups: list = field(default_factory=list)  # the tasks with prefetch copies, in kernel order
    slots: np.ndarray | None = None  # [groups, grid]: the commit slot of each group's copies, per block
    segment_column: int = 0  # the table column of the first copy (4 columns a copy)
    prefetch: dict = field(default_factory=dict)  # (task index, dot id) -> (smem offset, rows)
    leaf_prefetch: dict = field(default_factory=dict)  # (task index, leaf id) -> smem offset
    prefetch_floats: int = 0
    arena: dict = field(default_factory=dict)  # (task index, unit id) -> smem offset
    arena_floats: int = 0
    smem_floats: int = 0


def _align4(n: int) -> int:
    return -(-int(n) // 4) * 4


class Generator:
    def __init__(
        self,
        sched: Schedule,
        *,
        smem_limit_bytes: int = 200 * 1024,
        prefetch: bool = True,
        trace: bool = False,
        resident: bool = False,
        settings: CodeSettings | None = None,
    ):
        """``settings``: how the kernel is written (None: every module setting's value)."""
        self.settings = (settings or CodeSettings()).resolved()
        self.trace = trace
        self.resident = resident
        self.sched = sched
        self.program = sched.program
        self.grid = sched.grid
        self.threads = sched.threads
        self.nwarps = self.threads // 32
        self._warp_offset = 0  # the next warp-per-element array of the phase starts here (see _first_warp)
        self.layout = Layout()
        self.smem_limit = smem_limit_bytes // 4
        self.want_prefetch = prefetch
        self._phase_lanes: dict[int, int] = {}  # the current phase's lanes per element (see _one_pass_lanes)
        # per task: {array id: (the array it is a view of, offset)} and each unit's phase (by id(unit))
        self.views = {t: self._task_views(task) for t, task in enumerate(sched.tasks)}
        self.phases = {t: self._unit_phases(task, self.views[t]) for t, task in enumerate(sched.tasks)}
        # per task: the array whose warps compute the root (see _root_array), where one does
        self.root_arrays = {t: self._root_array(t, task) for t, task in enumerate(sched.tasks)}
        # a task's thread arrays whose blocks compute disjoint ranges store the task's side stores
        # computed in them (a split product's input and the state under it: each element once,
        # schedule._computes_once), in the array's own loop instead of where a reader reads them
        self.array_side: dict[int, set[int]] = {}
        # ... and a replicated array stored as a side store of its own (schedule.SPLIT_SUMS_KEPT:
        # the residual stream that a split product's readers sum) by one block: uid -> that block
        self.replica_side: dict[int, dict[int, int]] = {}
        for t, task in enumerate(sched.tasks):
            side = {s.id for s in task.side}
            for unit in task.arrays() if side else ():
                if array_partitioned(task, unit):
                    self.array_side.setdefault(t, set()).add(unit.node.id)
                elif unit.node.id in side and array_replicated(task, unit):
                    self.array_side.setdefault(t, set()).add(unit.node.id)
                    self.replica_side.setdefault(t, {})[unit.node.id] = replica_store_block(task, unit)
        self.headers: list[Path] = []
        self.input_names = list(self.program.inputs)
        self.state_names = list(self.program.states)
        self.output_names = [n for n in self.program.outputs if n not in self.program.state_of.values()]
        self.host_tasks: set[int] = set()  # tasks that read a graph input or write a graph output
        self.input_tasks: set[int] = set()  # tasks that read a graph input (from host memory)
        self.tagged_outputs = self.settings.tagged_outputs
        self.done_words = 0
        self.tagged = self.resident and RESIDENT_TAGGED_FRAMES
        self._framers: list[int] = []  # tagged: the blocks that poll their frame words (see _resident_loop)
        # (replica, frame block, copy of the frame words) triples: RESIDENT_FRAMER_REPLICAS
        self._replicas: list[tuple[int, int, int]] = []
        self._t = -1
        self._followers: dict[int, Unit] = {}  # the current task's (see _row_followers)
        self._early_x: int | None = None  # the current frame task's x size where it stored x early
        # EARLY_FRAME_WORDS: {frame task: x size} whose x words its threads store at entry, from the
        # registers they read the frame into (see _entry_frame)
        self.entry_frames = {
            t: task.root.srcs[0].size
            for t, task in enumerate(sched.tasks)
            if self.settings.early_frame and self._entry_frame(task)
        }
        self._plan()

    # -- layout -------------------------------------------------------------------------------------
    def _plan(self) -> None:
        lay = self.layout
        narrow = self._narrow_dots()
        for leaf in self.program.weights():
            dot = narrow.get(leaf.id)
            if dot is not None:
                words, row_words = narrow_rows(dot.rows, self.settings.weight_format)
                lay.narrow[dot.id] = (lay.weight_floats, row_words)
                lay.weight_arrays.append((lay.weight_floats, words))
                lay.weight_floats += _align4(words.size)
                continue
            lay.weights[leaf.id] = lay.weight_floats
            lay.weight_arrays.append((lay.weight_floats, leaf.array.reshape(-1)))
            lay.weight_floats += _align4(leaf.size)
        if RECUR_GLOBAL_ROWS_BY_K:
            for task in self.sched.tasks:
                if isinstance(task.root, Recur) and not recur_held(
                    task.root, task.chunk, task.stage_limit, task.threads
                ):
                    array = _recur_rows_by_k(task.root, task.chunk, task.blocks)
                    lay.recur_by_k[task.root.id] = lay.weight_floats
                    lay.weight_arrays.append((lay.weight_floats, array))
                    lay.weight_floats += _align4(array.size)
        for nid, node in self.sched.ll_nodes.items():
            lay.ll[nid] = lay.ll_words
            lay.ll_words += node.size
        # range-table columns: per block, each array's [lo, hi) and each product's first weight row
        columns: list[np.ndarray] = []
        dots: list[tuple[int, Unit, int]] = []
        for t, task in enumerate(self.sched.tasks):
            for unit in task.arrays():
                self._column(t, unit.node.id, "lo", unit.lo, columns)
                self._column(t, unit.node.id, "hi", unit.hi, columns)
                if (unit.first != unit.lo).any() and unit.node.id not in self.sched.ll_nodes:
                    # computed from the first needed element (a staged copy takes the whole range)
                    self._column(t, unit.node.id, "from", unit.first, columns)
                if unit.how == "dot":
                    nlo, nhi = self._rows(unit)
                    self._column(t, unit.node.id, "nlo", nlo, columns)
                    dots.append((t, unit, int((nhi - nlo).max()) if len(nlo) else 0))
        leaves: list[tuple[int, Leaf, int]] = []
        for t, task in enumerate(self.sched.tasks):
            for lid, (leaf, lo, hi) in sorted(task.leaves.items()):
                lo = np.where(hi > lo, (lo // 4) * 4, 0)
                self._column(t, lid, "plo", lo, columns)
                self._column(t, lid, "phi", hi, columns)
                leaves.append((t, leaf, int((hi - lo).max()) if len(lo) else 0))
        # the prefetch segments (smem offset, source, source offset, floats) come after the ranges,
        # in commit groups: room for every candidate, the ones not prefetched copy nothing
        n_groups = len({t for t, _, _ in leaves} | {t for t, _, _ in dots})
        n_ranges = len(columns)
        # per commit slot its copies' [first, end) rows, then per task's group the block's slot of
        # it (room for every candidate group: those that do not fit are not prefetched)
        lay.segment_column = n_ranges + 3 * n_groups
        n_copies = len(leaves) + len(dots)
        if self.settings.copy_pieces > 0:
            n_copies = sum(_piece_count(span, self.settings.copy_pieces) for _, _, span in leaves)
            n_copies += sum(
                _piece_count(rows * self._row_floats(unit.node), self.settings.copy_pieces) for _, unit, rows in dots
            )
        n_columns = lay.segment_column + 4 * n_copies
        # shared memory: the range row, weight prefetch, the task arena
        used = 0
        self.range_offset = used
        used += _align4(max(n_columns, 1))
        arena = 0
        for t, task in enumerate(self.sched.tasks):
            offset = 0
            for unit in sorted(task.arrays(), key=lambda u: u.node.id):
                if unit.node.id in self.views[t]:
                    continue  # read where the array it views lies
                lay.arena[(t, unit.node.id)] = offset
                offset += _align4(max(unit.storage, 1))
            if isinstance(task.root, Recur):
                offset = recur_smem_floats(task.root, task.chunk, task.stage_limit, task.threads)
            elif isinstance(task.root, DeltaScan):
                offset = sum(n for _, n in delta_smem_parts(task.root))
            elif isinstance(task.root, BodyLoop):
                offset = sum(n for _, n in body_task_plan(task).parts)
            arena = max(arena, offset)
        lay.arena_floats = arena
        budget = self.smem_limit - used - arena
        if budget < 0:
            raise CompileError(f"the step kernel needs {4 * (used + arena)} bytes of shared memory a block")
        self.prefetch_offset = used
        if self.want_prefetch:
            # state and weight values first (a state read sits on the critical path), then weight rows
            for t, leaf, span in leaves:
                need = _align4(span)
                if span == 0 or need > budget - lay.prefetch_floats:
                    continue
                lay.leaf_prefetch[(t, leaf.id)] = lay.prefetch_floats
                lay.prefetch_floats += need
            for t, unit, rows in dots:
                need = _align4(rows * self._row_floats(unit.node))
                if rows == 0 or need > budget - lay.prefetch_floats:
                    continue
                lay.prefetch[(t, unit.node.id)] = (lay.prefetch_floats, rows)
                lay.prefetch_floats += need
        self.arena_offset = self.prefetch_offset + lay.prefetch_floats
        lay.smem_floats = self.arena_offset + arena
        columns += self._segments(columns, n_columns)
        lay.table = np.stack(columns, axis=1).astype(np.int32) if columns else np.zeros((self.grid, 1), dtype=np.int32)

    def _narrow_dots(self) -> dict:
        """{weight leaf id: Dot} of the products whose rows are stored narrow: every product a task
        computes as a unit of dot products (_dot) whose rows the format holds, when the weight
        format is not fp32; with ``lossless_rows`` only those it stores exactly (stores_exactly)."""
        if self.settings.weight_format == "fp32":
            return {}
        keeps = stores_exactly if self.settings.lossless_rows else format_holds
        found = {}
        for task in self.sched.tasks:
            for unit in task.units.values():
                if unit.how == "dot" and keeps(unit.node.rows, self.settings.weight_format):
                    found[unit.node.weight.id] = unit.node
        return found

    def _row_floats(self, dot: Dot) -> int:
        """32-bit words a weight row of ``dot`` takes in the weight buffer and in shared memory."""
        narrow = self.layout.narrow.get(dot.id)
        return dot.k if narrow is None else narrow[1]

    def _weight_offset(self, dot: Dot) -> int:
        narrow = self.layout.narrow.get(dot.id)
        return self.layout.weights[dot.weight.id] if narrow is None else narrow[0]

    def _paced_points(self, own: list[int], n_groups: int) -> list[int]:
        """paced_copies (PREFETCH_PACED): the commit point of each of a block's own groups (indices into
        self.groups, in its task order): the last point before the block's own task
        PROLOGUE_GROUPS - 1 ahead of the group's, not the kernel's, so a block that skips tasks
        does not issue a later task's copies right after its first one. Points only move later
        than the unpaced k (own task k-P+1 is at least kernel group k-P+1) and stay distinct.
        The launched kernel's PROLOGUE_GROUPS, also for a resident kernel that issues every group
        at frame start: the range table is the launched kernel's (CompiledStep.resident_fn), and
        with all groups issued in order a task's wait counts its group by the table's slot."""
        last = n_groups - 1
        points = [0] * len(own)
        for k in reversed(range(len(own))):
            if k < PROLOGUE_GROUPS:
                want = k
            else:
                want = PROLOGUE_GROUPS - 1 + own[k - PROLOGUE_GROUPS + 1]
            cap = last if k == len(own) - 1 else points[k + 1] - 1
            points[k] = min(want, cap)
        return points

    def _deferred_points(
        self, own: list[int], points: list[int], b: int, levels: list[int], *, after_level=None, ahead=None
    ) -> list[int]:
        """COPIES_AFTER_LEVEL: when block b's first task is at most that level, its copies for its
        tasks more than COPIES_AHEAD_LEVELS levels past it are issued only once its tasks before
        them are done (at the first commit point after the last of those), not in the prologue
        or at points before them. Issuing a far task's copies (attention's output projection:
        35 KB of weight rows and KV cache) stalls the warps until the memory system takes them:
        on the H100 the frame block issued them for 2000 cycles before it could start the
        frame's task, which every other task waits for. The other groups' points stay; the
        deferred ones move later, stay distinct and are still issued before their own tasks,
        or nothing moves."""
        after_level = COPIES_AFTER_LEVEL if after_level is None else after_level
        ahead = COPIES_AHEAD_LEVELS if ahead is None else ahead
        tasks = [t for t in range(len(self.sched.tasks)) if self._runs(t, b)]
        if not tasks or levels[tasks[0]] > after_level:
            return points
        leading = []  # its first tasks, and those right after them
        for t in tasks:
            if levels[t] > after_level + ahead:
                break
            leading.append(t)
        last = leading[-1]
        keep = sum(1 for j in own if self.groups[j] <= last)
        after = [i for i, t in enumerate(self.groups) if t > last]
        if keep >= len(own) or not after:
            return points
        first_point = PROLOGUE_GROUPS - 1 + after[0]  # issued just before that task, after `last`
        moved = list(points[: len(own)])
        previous = moved[keep - 1] if keep else -1
        for k in range(keep, len(own)):
            p = max(moved[k], first_point, previous + 1)
            if p > min(own[k] + PROLOGUE_GROUPS - 1, len(self.groups) - 1):
                return points  # it would land after its own task: keep the block as it was
            moved[k] = previous = p
        return moved  # (the groups of tasks the block does not run copy nothing: no point)

    def _segments(self, columns: list, n_columns: int) -> list[np.ndarray]:
        """Per block, the prefetch copies of each commit group (a task's weight rows, state and
        weight ranges) as table columns after the ranges: the groups' first copies, then
        (shared-memory offset, source, source offset, floats) per copy; source 0 is the weights,
        1 + i state i. One loop in the kernel's prologue walks them: a copy per call site was ~20 %
        of min_gru's code, and the code is fetched again on every launch."""
        lay = self.layout
        grid = self.grid
        groups: dict[int, list[tuple]] = {}
        for (t, lid), offset in lay.leaf_prefetch.items():
            leaf, lo, hi = self.sched.tasks[t].leaves[lid]
            lo = np.where(hi > lo, (lo // 4) * 4, 0)
            if leaf.role == "state":
                source, base = 1 + self.state_names.index(leaf.name), 0
            else:
                source, base = 0, lay.weights[leaf.id]
            groups.setdefault(t, []).append((self.prefetch_offset + offset, source, base + lo, np.maximum(hi - lo, 0)))
        for (t, uid), (offset, rows) in lay.prefetch.items():
            unit = self.sched.tasks[t].units[uid]
            node = unit.node
            nlo = columns[lay.column_of[(t, uid, "nlo")]]
            nrows = np.where(unit.hi > unit.lo, np.minimum(node.n - nlo, rows), 0)
            row_floats = self._row_floats(node)
            base = self._weight_offset(node) + nlo * row_floats
            groups.setdefault(t, []).append((self.prefetch_offset + offset, 0, base, nrows * row_floats))
        # what the blocks copy in all a launch (a product recomputed by many blocks is copied by
        # each: the price of schedule.REPLICATED_DOT_MACS on a launched kernel)
        self.copied_floats = int(
            sum(np.sum(np.broadcast_to(entry[3], (grid,))) for entries in groups.values() for entry in entries)
        )
        if self.settings.copy_pieces > 0:
            groups = {
                t: [piece for entry in entries for piece in _pieces(entry, self.settings.copy_pieces)]
                for t, entries in groups.items()
            }
        self.groups = sorted(groups)
        self.group_column = len(columns)
        firsts = [0]
        segments: list[np.ndarray] = []
        for t in self.groups:
            for entry in groups[t]:
                segments += [np.broadcast_to(np.asarray(v, dtype=np.int64), (grid,)).copy() for v in entry]
            firsts.append(len(segments) // 4)
        # Commit slot k of a block carries the copies of the k-th task with copies that the block
        # runs (PREFETCH_BY_BLOCK_ORDER), so a block that skips tasks issues its later tasks'
        # copies earlier: attention's output-projection blocks waited 0.8 us for their KV cache
        # issued only after the task before theirs in the kernel, not in their own order.
        n_groups = len(self.groups)
        levels = self.sched.task_levels()
        frame_blocks = {t.first for t in self.sched.tasks if isinstance(t.root, FrameConcat) and t.blocks == 1}
        start = np.zeros((n_groups, grid), dtype=np.int64)
        end = np.zeros((n_groups, grid), dtype=np.int64)
        slots = np.tile(np.arange(n_groups, dtype=np.int64)[:, None], (1, grid))
        for b in range(grid):
            own = list(range(n_groups))
            if PREFETCH_BY_BLOCK_ORDER:
                own = [j for j, t in enumerate(self.groups) if self._runs(t, b)]
                ran = len(own)
                own += [j for j in range(n_groups) if j not in own]
            points = list(range(n_groups))
            if PREFETCH_BY_BLOCK_ORDER and self.settings.paced_copies:
                points = self._paced_points(own[:ran], n_groups)
            if PREFETCH_BY_BLOCK_ORDER and COPIES_AFTER_LEVEL > 0:
                points = self._deferred_points(own[:ran], points, b, levels)
            elif PREFETCH_BY_BLOCK_ORDER and FRAME_BLOCK_COPIES_LATE and b in frame_blocks:
                points = self._deferred_points(own[:ran], points, b, levels, after_level=1, ahead=1)
            for k, j in enumerate(own):
                if k >= len(points):
                    break
                start[points[k], b], end[points[k], b] = firsts[j], firsts[j + 1]
                slots[j, b] = points[k]
        lay.groups, lay.slots = list(self.groups), slots
        out = []
        for k in range(n_groups):
            out += [start[k], end[k]]
        out += [slots[j] for j in range(n_groups)]
        # room was kept for every candidate group; the ones that did not fit copy nothing
        out += [np.zeros(grid, dtype=np.int64)] * (self.layout.segment_column - self.group_column - len(out))
        out += segments
        out += [np.zeros(grid, dtype=np.int64)] * (n_columns - len(columns) - len(out))
        return out

    @property
    def prologue_groups(self) -> int:
        """Commit groups issued in the prologue: PROLOGUE_GROUPS, or in the resident kernel with
        RESIDENT_COPIES_AT_START_GROUPS every group."""
        if self.copies_at_start:
            return len(self.groups)
        return PROLOGUE_GROUPS

    @property
    def copies_at_start(self) -> bool:
        """The resident kernel issues every commit group while the frame is awaited."""
        least = RESIDENT_COPIES_AT_START_GROUPS
        return self.resident and least is not None and len(self.groups) >= least

    def _runs(self, t: int, b: int) -> bool:
        task = self.sched.tasks[t]
        return task.first <= b < task.first + task.blocks

    def _from(self, t: int, uid: int) -> str:
        """The first element of array ``uid`` that a block computes (its origin, unless aligning
        the origin moved it below the first element the block needs)."""
        return f"from{uid}" if (t, uid, "from") in self.layout.column_of else f"lo{uid}"

    def _column(self, t: int, uid: int, what: str, values: np.ndarray, columns: list) -> None:
        self.layout.column_of[(t, uid, what)] = len(columns)
        self.layout.columns.append((t, uid, what))
        columns.append(np.asarray(values, dtype=np.int64))

    def _rows(self, unit: Unit) -> tuple[np.ndarray, np.ndarray]:
        """Per block, the weight rows [nlo, nhi) a dot unit's elements use."""
        n = unit.node.n
        nlo = np.zeros(self.grid, dtype=np.int64)
        nhi = np.zeros(self.grid, dtype=np.int64)
        for b in range(self.grid):
            lo, hi = int(unit.lo[b]), int(unit.hi[b])
            if hi <= lo:
                continue
            if hi - lo >= n:
                nlo[b], nhi[b] = 0, n
            else:
                cols = np.arange(lo, hi) % n
                nlo[b], nhi[b] = int(cols.min()), int(cols.max()) + 1
        return nlo, nhi

    def task_phases(self) -> tuple[int, ...]:
        """The phases (runs of code between two barriers) each generated task runs: the distinct
        phases of its units, views left out (a loop task as the schedule counts it). The
        schedule's own count, Task.phases, is one more than the last phase, and a staged copy's
        phase is at least 1 (it reads its own flag-tagged words)."""
        counts = []
        for t, task in enumerate(self.sched.tasks):
            if isinstance(task.root, (Recur, DeltaScan, BodyLoop)):
                counts.append(task.phases())
                continue
            phase_of = self.phases[t]
            phases = len({phase_of[id(u)] for u in task.units.values() if u.node.id not in self.views[t]})
            counts.append(phases - (self.root_arrays[t] is not None))
        return tuple(counts)

    # -- source ---------------------------------------------------------------------------------------
    def source(self) -> str:
        outer = Code()
        body = outer
        if self.resident:
            body = self._resident_loop(outer)
        self._prologue(body)
        for t, task in enumerate(self.sched.tasks):
            if t in self.groups and self.groups.index(t) >= 1:
                ahead = self.groups.index(t) + self.prologue_groups - 1
                if ahead < len(self.groups):  # every block, in or out of the task: one commit each
                    body.items.append(f"// task {self.groups[ahead]}'s copies, in flight while the tasks before it run")
                    self._issue(body, str(ahead), str(ahead + 1))
            self._task(body, t, task)
        self._done(body)
        if self.resident:
            body.items += [
                "// this block is through the frame: the leader lets the next one in only when every block is",
                "// (a slow block may still read this frame's flagged words and state)",
                "ffk_prefetch_wait<0>();  // no copy of this frame may land in the next one's shared memory",
                "__syncthreads();",
            ]
            self._stamp(body, len(self.sched.tasks), 2)  # the frame's stamps: the last frame's stay
            body.items.append("if (tid == 0) ffk_block_finished(ffk_ctl);")
            outer.items.append(
                f"if (tid == 0) ffk_counters[{self._own_block()}] = ffk_base + ffk_n;  // the next launch goes on with the epochs"
            )
        else:
            self._stamp(body, len(self.sched.tasks), 2)
            body.items.append("if (tid == 0) ffk_counters[b] = ffk_count + 1;")
        lines: list[str] = []
        outer.render(1, lines)
        params = []
        for i, name in enumerate(self.input_names):
            if self.tagged and self._replicas:
                params.append(
                    f"const unsigned long long* __restrict__ ffk_in{i} /* {name}: (epoch << 32) | float bits, "
                    f"{self.frame_copies()} copies x 2 frames */"
                )
            elif self.tagged:
                params.append(f"const unsigned long long* __restrict__ in{i} /* {name}: (epoch << 32) | float bits */")
            else:
                params.append(f"const float* __restrict__ in{i} /* {name} */")
        for i, name in enumerate(self.output_names):
            if self.tagged_outputs:
                params.append(f"unsigned long long* __restrict__ out{i} /* {name}: (epoch << 32) | float bits */")
            else:
                params.append(f"float* __restrict__ out{i} /* {name} */")
        if self.resident:  # the two halves of each state: frame n reads half n % 2 and writes the other
            for i, name in enumerate(self.state_names):
                params.append(f"float* ffk_sa{i} /* {name}, the half read by the first frame */")
            for i, name in enumerate(self.state_names):
                params.append(f"float* ffk_sb{i} /* {name}, the other half */")
        else:
            for i, name in enumerate(self.state_names):
                params.append(f"const float* __restrict__ sin{i} /* {name} */")
            for i, name in enumerate(self.state_names):
                params.append(f"float* __restrict__ sout{i} /* {self.program.state_of[name]} */")
        params += [
            "const float* __restrict__ ffk_w",
            "unsigned long long* ffk_ll",
            "unsigned long long* __restrict__ ffk_counters",
            "const int* __restrict__ ffk_ranges",
            "unsigned* ffk_done",
        ]
        if self.resident:
            params += [
                "const unsigned* ffk_bell /* mapped host memory: the host's frame number, or FFK_BELL_STOP */",
                "unsigned* ffk_idle /* mapped host memory: the last frame every block is through */",
                "unsigned long long* ffk_ctl /* device memory, zero at launch: go epoch, stop, finished blocks, each block's SM */",
            ]
        if self.trace:
            params.append("unsigned long long* __restrict__ ffk_trace")
        header = self._header_comment()
        includes = [EXP_INTRINSIC]
        if self.resident and RESIDENT_POLL_AHEAD:
            includes.append("#define FFK_POLL_AHEAD 1")
        for path in [RUNTIME] + self.headers:
            includes.append(f"// ---- {path.parent.name}/{path.name}\n" + path.read_text())
        if self.tagged_outputs:
            includes.append(TAGGED_OUTPUT_STORE)
        name = RESIDENT_KERNEL_NAME if self.resident else KERNEL_NAME
        signature = f'extern "C" __global__ void __launch_bounds__({self.threads}, 1) {name}(\n    '
        signature += ",\n    ".join(params) + ") {"
        return "\n".join([header, *includes, "", signature, *lines, "}", ""])

    def _done(self, body: Code) -> None:
        """The blocks that read a frame from or write an output to host memory each raise a word
        in mapped host memory (``ffk_done``) once their host traffic is over: the host returns from
        the step when all of them are up, without waiting for the kernel to retire (measured on the
        H100: 8.7 us p50 against 10.7 for cuStreamSynchronize, one-kernel mapped graph). The rest
        of the kernel (next-state stores) is ordered before the next launch by the stream."""
        # with tagged outputs a block that only writes outputs raises no word: the host waits on
        # the output words themselves (TAGGED_OUTPUTS)
        tasks = self.input_tasks if self.tagged_outputs else self.host_tasks
        blocks = sorted(
            {
                b
                for t in tasks
                for b in range(self.sched.tasks[t].first, self.sched.tasks[t].first + self.sched.tasks[t].blocks)
            }
        )
        self.done_words = len(blocks)
        if not blocks:
            return
        runs = []  # (first block, last block, first slot)
        for lo, hi in _block_runs(blocks):
            runs.append((lo, hi, blocks.index(lo)))
        cond = " : ".join(
            f"(b >= {lo} && b <= {hi}) ? b - {lo - slot}" if lo != slot else f"(b >= {lo} && b <= {hi}) ? b"
            for lo, hi, slot in runs
        )
        body.items.append("// this block's frame reads and output stores are done: raise its word for the host")
        body.items.append(f"const int ffk_slot = {cond} : -1;")
        done = Code("if (ffk_slot >= 0)")
        # The barrier orders every thread's host stores before thread 0's system fence, and a fence
        # is cumulative (PTX memory model: it orders what its thread has observed, the barrier
        # included), so one fence a block does what one a thread did (H100: a fence in every
        # thread cost ~1 us a step, min_gru 13.0 -> 12.1 us without it).
        done.items += [
            "__syncthreads();",
            "if (tid == 0) {",
            "    __threadfence_system();",
            "    ffk_store_done(ffk_done + ffk_slot, epoch);",
            "}",
        ]
        body.items.append(done)

    def _header_comment(self) -> str:
        d = self.sched.describe()
        lines = [
            "// framefuse step kernel (generated by framefuse.compiler; edit the compiler, not this file)",
            f"// grid {self.grid} x {self.threads} threads, {d['tasks']} tasks, {d['levels']} dependency levels, "
            f"{4 * self.layout.smem_floats} B shared memory a block",
        ]
        for t, task in enumerate(self.sched.tasks):
            arrays = ", ".join(f"{u.how}:{_name(u.node)}" for u in task.arrays())
            side = f"; side stores {[s.label for s in task.side]}" if task.side else ""
            lines.append(
                f"//   task {t}: {_name(task.root)} {list(task.root.shape)} on {task.blocks} blocks"
                f"{f' from block {task.first}' if task.first else ''}"
                f"{'; arrays ' + arrays if arrays else ''}{side}"
            )
        for note in self.sched.notes:
            lines.append(f"//   {_STABLE_ID.sub('', note)}")
        return "\n".join(lines)

    def _entry(self, body: Code) -> None:
        # a frame block's replica (RESIDENT_FRAMER_REPLICAS) runs that block's tasks as that block
        block = "".join(f"blockIdx.x == {r} ? {f} : " for r, f, _ in self._replicas) + "blockIdx.x"
        body.items += [
            "FFK_SHARED_DECL",
            f"const int tid = threadIdx.x, b = {block};",
            "const int lane = tid & 31, warp = tid >> 5;",
            f"constexpr int NT = {self.threads}, NWARPS = NT / 32;",
            "(void)lane; (void)warp;",
        ]

    def _framer_blocks(self) -> list[int]:
        """The blocks whose tasks read the frame at entry (see _prologue)."""
        found = set()
        for task in self.sched.tasks:
            if self._framed_input(task) is not None or self._early_input(task):
                found.update(range(task.first, task.first + task.blocks))
        return sorted(found)

    def _leader(self) -> int:
        """The block whose thread 0 leads the frames: block 0, or with tagged frames the first
        block that does not read the frame (a leader's frame reads would wait for its bell); with
        the frame block's go as well (RESIDENT_FRAMER_GO, RESIDENT_LEADER_LAST), the one of those
        whose first task comes last (a block with none first), where that task's dependency level
        is later than the first one's: the leader may take the go a host round trip late, when a
        poll of the bell is in flight as it comes."""
        if not self.tagged:
            return 0
        framers = set(self._framer_blocks())
        candidates = [b for b in range(self.grid) if b not in framers]
        if not candidates:
            return 0
        if not (RESIDENT_FRAMER_GO and RESIDENT_LEADER_LAST):
            return candidates[0]
        tasks = self.sched.tasks
        levels = self.sched.task_levels()

        def joins(b: int) -> tuple[int, int]:  # (its first task's level, that task), a block with none last
            t = next((t for t, task in enumerate(tasks) if task.first <= b < task.first + task.blocks), None)
            return (len(tasks) + 1, len(tasks)) if t is None else (levels[t], t)

        last = max(candidates, key=lambda b: (*joins(b), -b))
        # a block joining at the same level as the first one is no later (xlstm: every block's first
        # task is at level 1 or 2; session 68 timed such a choice 0.2 us slower there)
        return last if joins(last)[0] > joins(candidates[0])[0] else candidates[0]

    def frame_copies(self) -> int:
        """Copies of the frame words the host writes: one, and one more for each replica of a frame
        block (RESIDENT_FRAMER_REPLICAS; known once the resident loop is written)."""
        return 1 + max((c for _, _, c in self._replicas), default=0)

    def _own_block(self) -> str:
        """The block's own index in the launch (its counter, its SM word): blockIdx.x where a
        replica runs another block's tasks as ``b``, else ``b`` (the same source as before)."""
        return "blockIdx.x" if self._replicas else "b"

    def _replica_pairs(self, leader: int, framers: list[int]) -> list[tuple[int, int, int]]:
        """RESIDENT_FRAMER_REPLICAS: (replica, frame block, copy) triples, RESIDENT_REPLICAS_PER_FRAME_BLOCK
        blocks with no task for each frame block, polling copies 1, 2, ... of the frame words, the
        last such blocks of the grid (never the leader); none where there are too few such blocks,
        and none in a traced kernel (a replica's stamps would land in its frame block's rows)."""
        if not (RESIDENT_FRAMER_REPLICAS and self.resident and self.tagged and framers) or self.trace:
            return []
        used = set()
        for task in self.sched.tasks:
            used.update(range(task.first, task.first + task.blocks))
        free = [b for b in reversed(range(self.grid)) if b not in used and b != leader]
        each = RESIDENT_REPLICAS_PER_FRAME_BLOCK
        if each < 1 or len(free) < each * len(framers):
            return []
        roles = [(framer, copy) for copy in range(1, each + 1) for framer in framers]
        return [(block, framer, copy) for block, (framer, copy) in zip(free, roles)]

    def _resident_loop(self, outer: Code) -> Code:
        """The resident kernel: launched once, it runs the step body once per frame the host
        rings in. The leader (a block's thread 0, see _leader) waits until every block is through
        the last frame, tells the host (``ffk_idle``), polls the host's bell in mapped memory and
        publishes the frame's epoch (or the stop) in device memory, where every block polls it.
        Only the leader reads the bell while idle (132 blocks polling one host line would
        serialise over PCIe). With tagged frames the blocks that read the frame do not wait for
        the go: once every block is through the last frame they poll their own frame words, which
        carry the epoch, and see the stop through the leader's stop word. The body is the
        launched kernel's, with the epoch from a loop counter instead of a launch counter; the
        state halves alternate as the launched graphs alternate them."""
        ncol = self.layout.table.shape[1]
        leader = self._leader()
        framers = self._framers = self._framer_blocks() if self.tagged else []
        self._replicas = self._replica_pairs(leader, framers)
        self._entry(outer)
        own = self._own_block()
        outer.items += [
            f"const unsigned long long ffk_base = ffk_counters[{own}];  // launches and frames before this launch",
            f"int* ffk_r = reinterpret_cast<int*>(ffk_smem + {self.range_offset});",
            f"for (int i = tid; i < {ncol}; i += NT) ffk_r[i] = ffk_ranges[b * {ncol} + i];",
            "unsigned long long ffk_n = 0;",
            f"if (tid == 0) ffk_ctl[FFK_CTL_SMS + {own}] = ffk_smid();  // where this launch placed the block (diagnostics)",
        ]
        if self._replicas:
            copies = " : ".join(f"blockIdx.x == {r} ? {c}" for r, _, c in self._replicas)
            outer.items.append(f"const int ffk_copy = {copies} : 0;  // the copy of the frame words this block polls")
        if framers:
            outer.items += ["FFK_RESIDENT_SHARED_DECL", "if (tid == 0) ffk_stop_s = 0u;"]
            outer.items.append(f"const bool ffk_framer = {_block_set(framers)};  // reads the frame at entry")
        loop = Code("#pragma unroll 1\nfor (;; ++ffk_n)")
        outer.items.append(loop)
        loop.items.append("const unsigned long long ffk_count = ffk_base + ffk_n;")
        if self._replicas:
            # each input: [copy 0 | copy 1 | ...] x [even frame | odd frame] (Kernel.frame_copies)
            for i, name in enumerate(self.input_names):
                loop.items.append(
                    f"const unsigned long long* __restrict__ in{i} = ffk_in{i} + (2 * ffk_copy + (int)(ffk_n & 1)) * {self.program.inputs[name].size};"
                )
        for i in range(len(self.state_names)):
            loop.items.append(
                f"const float* sin{i} = (ffk_n & 1) ? ffk_sb{i} : ffk_sa{i}; float* sout{i} = (ffk_n & 1) ? ffk_sa{i} : ffk_sb{i};"
            )
        early = RESIDENT_PREFETCH_EARLY and self.groups
        if early or framers:
            # Once every block is through the last frame, the state it wrote is final and the half
            # this frame writes is read by nobody: the first groups' copies are issued while the
            # frame is awaited, and a frame block may go as soon as its words are in.
            loop.items += [
                f"if (tid == 0) ffk_wait_finished(ffk_ctl, {self.grid}ull * ffk_n);",
                "__syncthreads();",
            ]
        if early:
            self._issue(loop, "0", str(min(self.prologue_groups, len(self.groups))))
        lead_fn = "ffk_lead_frame<true>" if framers and RESIDENT_FRAMER_GO else "ffk_lead_frame<false>"
        lead = f"{lead_fn}(ffk_ctl, ffk_bell, ffk_idle, {self.grid}ull * ffk_n, (unsigned)(ffk_n + 1), e)"
        others = "(ffk_framer ? e : ffk_wait_go(ffk_ctl, e))" if framers else "ffk_wait_go(ffk_ctl, e)"
        loop.items += [
            "if (tid == 0) {",
            "    const unsigned e = (unsigned)(ffk_count % 0xffffffffull) + 1u;",
            "    // the leader knows the answer it published; the others wait for it (0: stop)"
            + ("; a frame block polls its words" if framers else ""),
            f"    ffk_epoch_s = b == {leader} ? {lead}",
            f"                         : {others};",
            "}",
            "__syncthreads();",
            "if (ffk_epoch_s == 0) break;",
        ]
        return loop

    def _prologue(self, body: Code) -> None:
        lay = self.layout
        ncol = lay.table.shape[1]
        if not self.resident:
            self._entry(body)
        self._stamp(body, len(self.sched.tasks), 0)
        if self._counts_reads():
            body.items.append(
                "unsigned ffk_reads = 0;  // this thread's reads of its frame word (RESIDENT_POLL_COUNTS)"
            )
        if self._replicas:
            # copy c of k + 1 starts c / (k + 1) of a poll period (2 x RESIDENT_REPLICA_DELAY) late
            each = RESIDENT_REPLICAS_PER_FRAME_BLOCK
            delay = (
                str(RESIDENT_REPLICA_DELAY)
                if each == 1
                else f"ffk_copy * {round(2 * RESIDENT_REPLICA_DELAY / (each + 1))}"
            )
            body.items.append(
                f"if (ffk_copy) ffk_spin_cycles({delay});  "
                "// a replica's polls sample the host's words between its frame block's"
            )
        for t, task in enumerate(self.sched.tasks):
            leaf = self._framed_input(task)
            if leaf is not None:
                body.items += [
                    f"// task {t}'s frame element, read before anything else (its scalars are computed from it later)",
                    f"float ffk_host{t} = 0.0f;",
                    f"if ({_in_task(task)} && tid < {leaf.size})",
                    f"    ffk_host{t} = {self._frame_read(f'in{self.input_names.index(leaf.name)} + tid')};",
                ]
            if self._early_input(task):
                leaf = task.root
                at = f"in{self.input_names.index(leaf.name)} + {_block_in_task(task)} * {task.chunk} + tid"
                body.items += [
                    f"// task {t}'s frame element, read before anything else: the host round trip overlaps the prologue",
                    f"float ffk_host{t} = 0.0f;",
                    f"if ({_in_task(task)} && tid < {min(task.chunk, leaf.size)} && {_block_in_task(task)} * {task.chunk} + tid < {leaf.size})",
                    f"    ffk_host{t} = {self._frame_read(at)};",
                ]
        if self.resident and self._framers:
            body.items += [
                "// a frame block's poll ends with its words or with the stop",
                "if (ffk_framer) {",
                "    __syncthreads();",
                "    if (ffk_stop_s) break;",
                *(
                    [f"    if (tid == 0 && ffk_reads) ffk_count_reads(ffk_ctl + FFK_CTL_SMS + {self.grid}, ffk_reads);"]
                    if self._counts_reads()
                    else []
                ),
                *(
                    ["    if (tid == 0) ffk_go(ffk_ctl, ffk_epoch_s);  // the frame has begun"]
                    if RESIDENT_FRAMER_GO
                    else []
                ),
                "}",
            ]
        if self.resident:  # the epoch came with the go (see _resident_loop)
            body.items.append("const unsigned epoch = ffk_epoch_s;")
        else:
            body.items += [
                "unsigned long long ffk_count = 0;",
                "if (tid == 0) {",
                "    ffk_count = ffk_counters[b];",
                "    ffk_epoch_s = (unsigned)(ffk_count % 0xffffffffull) + 1u;  // never 0: the buffers start at 0",
                "}",
                f"int* ffk_r = reinterpret_cast<int*>(ffk_smem + {self.range_offset});",
                f"for (int i = tid; i < {ncol}; i += NT) ffk_r[i] = ffk_ranges[b * {ncol} + i];",
            ]
            body.items.append("__syncthreads();")
            body.items.append("const unsigned epoch = ffk_epoch_s;")
        # weight and state prefetch: one commit group per task that has any, the copies from the table
        if self.groups and not (self.resident and RESIDENT_PREFETCH_EARLY):
            first = min(self.prologue_groups, len(self.groups))
            body.items.append(
                f"// prefetch: the weight rows, state and weight ranges of the first {first} of {len(self.groups)} tasks "
                "(the others' are issued a task ahead of their use)"
            )
            self._issue(body, "0", str(first))
        # (after the copies are issued: the store waits for the frame's host read, which the
        # prologue's copies would otherwise wait behind; H100, session 66: with the store before
        # them, g26's kernels were 0.3-0.9 us slower for gru, lstm, attention, jamba, mamba, xlstm)
        for t, x_size in self.entry_frames.items():
            task = self.sched.tasks[t]
            body.items += [
                f"// task {t}'s frame x words, published now: its readers' products start on them while it computes the scalars of x",
                f"if ({_in_task(task)} && tid < {x_size})",
                f"    ffk_ll_store(ffk_ll + {self.layout.ll[task.root.id]} + tid, ffk_host{t}, epoch);",
            ]
        self._stamp(body, len(self.sched.tasks), 1)

    def _frame_read(self, at: str) -> str:
        """A frame element read at entry: once from host memory, or with tagged frames a poll of
        its word until it carries this frame's epoch (or the leader publishes the stop)."""
        if self.tagged:
            reads = ", &ffk_reads" if self._counts_reads() else ""
            return f"ffk_poll_frame({at}, ffk_epoch_s, ffk_ctl, &ffk_stop_s{reads})"
        return f"ffk_load_host({at})"

    def _counts_reads(self) -> bool:
        """RESIDENT_POLL_COUNTS: the frame blocks' thread 0 count their frames by the reads of host
        memory each took (a resident kernel with tagged frames read by frame blocks)."""
        return bool(RESIDENT_POLL_COUNTS and self.resident and self.tagged and self._framers)

    def _issue(self, body: Code, g0: str, g1: str) -> None:
        """cp.async copies of commit groups [g0, g1) from the range table, one commit each. A
        warp per copy: every thread walking every copy was a serial loop of ~35 table rows (H100:
        min_gru 15.65 -> 13.0 us, mamba 30.2 -> 23.1 with the copies shared out over the warps).
        (Every point a call of one __noinline__ function instead, session 69's ISSUE_CALL, was
        slower resident on all 11 zoo archs, p50 +0.2-1.4 us: session 70, g43.)"""
        weights = "ffk_n == 0" if self.resident and RESIDENT_WEIGHTS_ONCE else None
        body.items.append("#pragma unroll 1")
        body.items.append(self._issue_loop(g0, g1, weights))

    def _issue_loop(self, g0: str, g1: str, weights: str | None) -> Code:
        """The loop over groups [g0, g1); ``weights``: the C condition under which weight rows are
        copied too (None: always)."""
        sources = "ffk_w"
        for i in reversed(range(len(self.state_names))):
            sources = f"(src == {i + 1} ? sin{i} : {sources})"
        loop = Code(f"for (int g = {g0}; g < {g1}; ++g)")
        cond = "seg[3] > 0"
        if weights is not None:
            # the weight rows stay in their shared-memory region from the first frame on (no
            # other copy or array uses it); the state ranges change every frame
            cond = f"seg[3] > 0 && (src != 0 || {weights})"
        if PREFETCH_BY_WARP:
            first, step, call, extra = "warp", "NWARPS", "ffk_prefetch_lanes", ", lane"
        else:
            first, step, call, extra = "0", "1", "ffk_prefetch", ""
        loop.items += [
            f"for (int s = ffk_r[{self.group_column} + 2 * g] + {first}; s < ffk_r[{self.group_column} + 2 * g + 1]; s += {step}) {{",
            f"    const int* seg = ffk_r + {self.layout.segment_column} + 4 * s;",
            "    const int src = seg[1];",
            "    (void)src;",
            f"    if ({cond}) {call}(ffk_smem + seg[0], {sources} + seg[2], seg[3]{extra});",
            "}",
            "ffk_prefetch_commit();",
        ]
        return loop

    def _committed_by(self, t: int) -> int:
        """Commit groups every thread has committed when it reaches task t's wait: the prologue's
        PROLOGUE_GROUPS, then one issued before each later group's task (see source())."""
        j = self.groups.index(t)
        return min(len(self.groups), self.prologue_groups + j)

    # -- tasks -------------------------------------------------------------------------------------------
    def _stamp(self, code: Code, t: int, slot: int) -> None:
        """Timeline trace (trace=True): globaltimer at a task's entry (0), after its first phase
        (1: its inputs have arrived) and at its end (2), per block."""
        if self.trace:
            n = len(self.sched.tasks) + 1  # the last row is the kernel's own (entry, prologue done, end)
            code.items.append(f"if (tid == 0) ffk_trace[(b * {n} + {t}) * {TRACE_SLOTS} + {slot}] = ffk_globaltimer();")

    def _clock(self, code: Code, t: int, k: int) -> None:
        """Phase trace (trace=True): the SM clock at the start of phase k and at the task's end
        (the globaltimer ticks in 256 ns steps on the H100, too coarse for a phase)."""
        if self.trace and 3 + k < TRACE_SLOTS:
            n = len(self.sched.tasks) + 1
            code.items.append(f"if (tid == 0) ffk_trace[(b * {n} + {t}) * {TRACE_SLOTS} + {3 + k}] = clock64();")

    def _task(self, body: Code, t: int, task: Task) -> None:
        self._t = t
        code = Code(_on_blocks(task))
        body.items.append(f"// task {t}: {_name(task.root)} {list(task.root.shape)}")
        body.items.append(code)
        self._stamp(code, t, 0)
        if isinstance(task.root, (Recur, DeltaScan, BodyLoop)):
            if isinstance(task.root, Recur):
                self._recur(code, t, task)
            elif isinstance(task.root, DeltaScan):
                self._delta(code, t, task)
            else:
                self._body_loop(code, t, task)
            self._stamp(code, t, 1)
            self._stamp(code, t, 2)
            return
        arrays = task.arrays()
        if t in self.groups:
            # cp.async.wait_group covers this thread's own copies; the barrier after it makes every
            # thread's copies visible (and the previous task's readers of shared memory done)
            j = self.groups.index(t)
            slots = {int(self.layout.slots[j, b]) for b in range(task.first, task.first + task.blocks)}
            committed = self._committed_by(t)
            if len(slots) == 1:
                later = committed - slots.pop() - 1
                code.items.append(
                    f"ffk_prefetch_wait<{later}>();  // this task's prefetched rows and values have landed"
                )
            else:  # the task's blocks put its copies in different slots (see _segments)
                column = self.group_column + 2 * len(self.groups) + j
                code.items.append(
                    f"ffk_prefetch_wait_n({committed - 1} - ffk_r[{column}]);  // this task's prefetched rows and values have landed"
                )
            code.items.append("__syncthreads();")
        elif arrays:
            code.items.append("__syncthreads();  // the previous task's readers of shared memory are done")
        for unit in arrays:
            lo_col = self.layout.column_of[(t, unit.node.id, "lo")]
            hi_col = self.layout.column_of[(t, unit.node.id, "hi")]
            if unit.node.id in self.views[t]:  # its readers' index origin (see arr)
                code.items.append(f"const int lo{unit.node.id} = ffk_r[{lo_col}];")
                continue
            code.items.append(f"const int lo{unit.node.id} = ffk_r[{lo_col}], hi{unit.node.id} = ffk_r[{hi_col}];")
            from_col = self.layout.column_of.get((t, unit.node.id, "from"))
            if from_col is not None:
                code.items.append(f"const int from{unit.node.id} = ffk_r[{from_col}];")
        for (tt, lid), _offset in sorted(self.layout.leaf_prefetch.items()):
            if tt == t:
                code.items.append(f"const int plo{lid} = ffk_r[{self.layout.column_of[(t, lid, 'plo')]}];")
        root = task.units[ROOT]
        code.items.append(
            f"const int lo_root = {_block_in_task(task)} * {task.chunk}, hi_root = min(lo_root + {task.chunk}, {task.root.size});"
        )
        self._followers = self._row_followers(task) if ROW_FOLLOWERS else {}
        followed = {w.node.id for w in self._followers.values()}
        views = self.views[t]
        phase_of = self.phases[t]
        root_by = self.root_arrays[t]  # the array whose lanes compute the root, if one does
        phases = sorted(
            {
                phase_of[id(u)]
                for u in task.units.values()
                if u.node.id not in followed and u.node.id not in views and (u is not root or root_by is None)
            }
        )
        self._early_x = self.entry_frames.get(t)  # stored at entry (_prologue): the root stores the scalars
        early = (
            self._phase_frame_store(t, task, phases) if self.settings.early_frame and self._early_x is None else None
        )
        late = self._late_frame_scalars(t, task, phases) if self.settings.early_frame and FRAME_SCALARS_LATE else {}
        for k, phase in enumerate(phases):
            if phase != phases[0]:
                code.items.append("__syncthreads();")
                if phase == phases[1]:
                    self._stamp(code, t, 1)
            self._clock(code, t, k)
            if early is not None and phase == early[1]:
                self._early_x = early[0]
                self._early_frame_store(code, t, task, early[0])
            staged = [
                u
                for u in sorted(task.units.values(), key=lambda u: u.node.id)
                if phase_of[id(u)] == phase
                and u is not root
                and u.how == "thread"
                and task.view.source_kind(u.node) == "materialized"
            ]
            x_only = {u.node.id: late[u.node.id][0] for u in staged if u.node.id in late}
            # A phase's units do not read one another, so the ones that need no flagged value (an
            # LSTM's recurrent products on the prefetched state) are computed while the staged
            # values are still on their way, and the staging that waits for them comes after.
            if staged and not COMPUTE_BEFORE_STAGE:
                self._stage(code, t, staged, x_only)
            self._warp_offset = 0
            computed = [
                unit
                for unit in sorted(task.units.values(), key=lambda u: u.node.id)
                if phase_of[id(unit)] == phase
                and unit not in staged
                and unit.node.id not in followed
                and (unit is root or unit.node.id not in views)  # a view is read where its array lies
                and (unit is not root or root_by is None)  # else computed by its array's warps
            ]
            self._phase_lanes = self._one_pass_lanes(computed) if self.settings.phase_one_pass else {}
            for unit in computed:
                if unit is root:
                    self._root(code, t, task, unit)
                elif unit.how == "dot":
                    self._dot(code, t, task, unit)
                elif unit.how == "reduce":
                    self._reduce(code, t, task, unit)
                else:
                    self._thread(code, t, task, unit)
            if staged and COMPUTE_BEFORE_STAGE:
                self._stage(code, t, staged, x_only)
            for uid, (x_size, at) in late.items():
                if at == phase:
                    self._stage_scalars(code, t, task.units[uid], x_size)
        self._phase_lanes = {}
        self._early_x = None
        if len(phases) == 1:
            self._stamp(code, t, 1)
        self._clock(code, t, len(phases))
        self._stamp(code, t, 2)

    def _one_pass_lanes(self, units: list) -> dict[int, int]:
        """PHASE_ONE_PASS: {array id: lanes per element} for a phase's warp-per-element arrays
        (products and reductions) taken together, where fewer lanes an element let the block's
        warps take all of them in fewer passes: each array's elements then go to warps of their
        own (see _first_segment_warp). LSTM's second layer at embed 256 has ten such elements a
        block (eight products of 256, a LayerNorm's two sums) on eight warps: two passes of a
        warp each, one pass of half-warps. Empty (the plain phase) where that gains no pass."""
        warp_units = [u for u in units if u.how in ("dot", "reduce") and u.span > 0]
        if not warp_units:
            return {}
        own = {u.node.id: self._dot_lanes(u) if u.how == "dot" else self._reduce_lanes(u) for u in warp_units}
        kept = set(self._followers)  # a reduction its row's follower reads stays a warp an element
        # and a product with its x in registers (its warps take several rows each, see _x_in_registers)
        kept |= {u.node.id for u in warp_units if u.how == "dot" and self._x_in_registers(u)}

        def lanes_at(u: Unit, cap: int) -> int:
            return own[u.node.id] if u.node.id in kept else min(own[u.node.id], cap)

        def passes(cap: int) -> int:
            warps = sum(-(-u.span // (WARP_LANES // lanes_at(u, cap))) for u in warp_units)
            return -(-warps // self.nwarps)

        caps = [lanes for lanes in (32, 16, 8, 4, 2, 1) if lanes >= SEGMENT_MIN_LANES]
        best = min(caps, key=lambda lanes: (passes(lanes), -lanes))
        if passes(best) >= passes(WARP_LANES):
            return {}
        found = {}
        for u in warp_units:  # each array as many lanes an element as keep its warps those at the cap
            lanes = lanes_at(u, best)
            warps = -(-u.span // (WARP_LANES // lanes))
            while lanes < own[u.node.id] and -(-u.span // (WARP_LANES // (2 * lanes))) == warps:
                lanes *= 2
            found[u.node.id] = lanes
        return found

    def _first_segment_warp(self, unit: Unit, per_warp: int) -> str:
        """The warp that computes the first elements of a segmented array of a one-pass phase
        (see _one_pass_lanes): each array starts on the warp after the previous one's last, as
        _first_warp does for a warp an element."""
        offset = self._warp_offset
        self._warp_offset = (offset + -(-max(unit.span, 1) // per_warp)) % self.nwarps
        return "warp" if offset == 0 else f"((warp + {self.nwarps - offset}) % NWARPS)"

    def _root_array(self, t: int, task: Task) -> int | None:
        """ROOT_IN_ARRAY_WARP: the id of the task's one array of the phase before its root, when
        that array is a product or a reduction (a warp or a segment of lanes an element), the root
        reads nothing else of that phase and reads it element for element (root element e reads its
        element e alone), and every block's root elements are among the block's elements of it: the
        lane that stores element e computes root element e right after (_root_after), and the
        root's phase and its barrier go. Mamba's x_proj products, xLSTM's gate products: a task of
        a product whose root only publishes it."""
        if not self.settings.root_in_warp or isinstance(task.root, (Recur, DeltaScan, BodyLoop)):
            return None
        root = task.units[ROOT]
        if self._early_input(task) or column_scan(task.root) or self._warp_root(task, root):
            return None
        if isinstance(task.root, FrameConcat):
            return None
        views, phase_of = self.views[t], self.phases[t]
        arrays = [u for key, u in task.units.items() if key != ROOT and u.node.id not in views]
        if not arrays:
            return None
        last = max(phase_of[id(u)] for u in arrays)
        tail = [u for u in arrays if phase_of[id(u)] == last]
        if len(tail) != 1 or tail[0].how not in ("dot", "reduce") or tail[0].lo is None:
            return None
        (array,) = tail
        # nothing else of that phase: a view of the array (in its phase) reads other lanes' elements
        if any(phase_of[id(task.units[d])] >= last for d in root.deps if d != array.node.id and d in task.units):
            return None
        reads = [occ for occ in root.occurrences if occ.node.id == array.node.id]
        if not reads:
            return None
        for occ in reads:
            pairs = enumerate_pairs(occ, root.var, max(task.root.size, 1))
            if pairs is None or not np.array_equal(pairs[0], pairs[1]):
                return None
        lo_root = np.arange(task.blocks) * task.chunk
        hi_root = np.minimum(lo_root + task.chunk, task.root.size)
        span = slice(task.first, task.first + task.blocks)
        live = hi_root > lo_root
        if ((array._start()[span] > lo_root) | (array.hi[span] < hi_root))[live].any():
            return None
        return array.node.id

    def _root_after(self, loop: Code, t: int, task: Task, lane: str) -> None:
        """The root's element e computed and stored by the lane (``lane`` is its C condition)
        that has just stored element e of the root's one array (see _root_array): it reads that
        element back from its own store."""
        node = task.root
        guard = Code(f"if ({lane} && e >= lo_root && e < hi_root)")
        loop.items.append(f"// root {_name(node)} {list(node.shape)}: element e, by the lane that computed its input")
        loop.items.append(guard)
        em = Emitter(self, t, task, guard, side={s.id for s in task.side}, per_thread=True)
        var = ix.Var("e", max(node.size, 1))
        value = em.value(node, ix.unflatten(var, node.shape))
        for stmt in self.stores(node, "e", value.text, self.stored_c(node, var)):
            em.top.insert(em.once(stmt))

    def _row_followers(self, task: Task) -> dict:
        """Reduction unit id -> the thread unit of the next phase computed by the reduction's warp
        right after it (ROW_FOLLOWERS): a warp-per-element reduction over exactly a warp's 32
        positions (attention's row max over a 32-key window), followed by an elementwise unit over
        the same rows with one element a position (the softmax weights exp(s - max)) that reads
        nothing computed in the reduction's phase but the reduction. Lane l of the row's warp
        computes the row's element l after a __syncwarp: the follower's phase and its barrier go."""
        views = self.views[self._t]
        phase_of = self.phases[self._t]
        phases = sorted({phase_of[id(u)] for u in task.units.values() if u.node.id not in views})
        span = slice(task.first, task.first + task.blocks)
        found: dict[int, Unit] = {}
        taken: set[int] = set()
        for red in sorted(task.units.values(), key=lambda u: u.node.id):
            if red.how != "reduce" or red.node.extent != WARP_LANES or self._reduce_lanes(red) != WARP_LANES:
                continue
            k = phases.index(phase_of[id(red)])
            if k + 1 >= len(phases):
                continue
            same_phase = {u.node.id for u in task.units.values() if phase_of[id(u)] == phase_of[id(red)]}
            for w in sorted(task.units.values(), key=lambda u: u.node.id):
                if (
                    w.how != "thread"
                    or w.node.id in taken
                    or w.node.id in views
                    or phase_of[id(w)] != phases[k + 1]
                    or task.view.source_kind(w.node) == "materialized"
                    or tuple(w.node.shape) != tuple(red.node.shape) + (WARP_LANES,)
                    or (w.deps & same_phase) - {red.node.id}
                    or red.node.id not in w.deps
                    or w.lo is None
                    or red.lo is None
                ):
                    continue
                rows = np.maximum(red.hi[span] - red._start()[span], 0)
                if not (rows > 0).any():
                    continue
                live = rows > 0
                if (w._start()[span][live] != red._start()[span][live] * WARP_LANES).any():
                    continue
                if (w.hi[span][live] != red.hi[span][live] * WARP_LANES).any():
                    continue
                if (w.lo[span][live] != red.lo[span][live] * WARP_LANES).any():
                    continue
                found[red.node.id] = w
                taken.add(w.node.id)
                break
        return found

    def _follow_row(self, loop: Code, t: int, task: Task, w: Unit) -> None:
        """The follower of a warp-per-element reduction (see _row_followers), in its warp loop."""
        uid = w.node.id
        inner = Code("")
        loop.items += [
            "__syncwarp();  // lane 0's store of the row's value is seen by the warp's lanes",
            inner,
        ]
        inner.items.append("const int ffk_row = e;")
        body = Code("")
        inner.items.append(body)
        body.items.append(f"const int e = ffk_row * {WARP_LANES} + lane;  // the row's element at this lane")
        guard = Code(f"if (e < hi{uid})")
        body.items.append(f"// array {_name(w.node)} {list(w.node.shape)}, a lane per element, in the row's warp")
        body.items.append(guard)
        em = Emitter(self, t, task, guard)
        var = ix.Var("e", max(w.node.size, 1))
        value = em.value(w.node, ix.unflatten(var, w.node.shape), expand_self=True)
        em.top.insert(f"{self.arr(t, uid)}[e - lo{uid}] = {value.text};")

    def arr(self, t: int, uid: int) -> str:
        view = self.views[t].get(uid)
        if view is not None:  # element e of the view is element e + offset of the array
            src, offset = view
            return f"({self.arr(t, src)} + (lo{uid} + {offset} - lo{src}))"
        return f"(ffk_smem + {self.arena_offset + self.layout.arena[(t, uid)]})"

    def _arena_aligned(self, t: int, uid: int) -> bool:
        """Whether the array's own origin in shared memory is 16-byte aligned (a view's: its
        array's; its offset and both origins are multiples of 4 by _task_views)."""
        view = self.views[t].get(uid)
        if view is not None:
            return self._arena_aligned(t, view[0])
        return (self.arena_offset + self.layout.arena[(t, uid)]) % 4 == 0

    def _task_views(self, task: Task) -> dict[int, tuple[int, int]]:
        """ALIAS_VIEWS: {array id: (array id, offset)} for the task's arrays computed a thread an
        element as a view (a Map) of another of its arrays whose element e is that array's element
        e + offset, in the order the copy reads it (a staged value's stored order included). Its
        readers read that array instead, at origin + offset: the offset and both arrays' origins on
        every block of the task must be multiples of 4 (a product reads its rows as float4s)."""
        if not self.settings.alias_views or isinstance(task.root, (Recur, DeltaScan, BodyLoop)):
            return {}
        span = slice(task.first, task.first + task.blocks)
        found: dict[int, tuple[int, int]] = {}
        for key, unit in sorted(task.units.items()):
            node = unit.node
            if key == ROOT or unit.how != "thread" or not isinstance(node, Map):
                continue
            if task.view.source_kind(node) == "materialized" or node.id in self.sched.ll_nodes:
                continue  # a staged copy of a flag-tagged value is the array itself
            e = ix.Var("e", max(node.size, 1))
            index, under = node.source_index(ix.unflatten(e, node.shape)), node.src
            while under.id not in task.units and isinstance(under, Map) and task.view.kind(under) == "inline":
                index, under = under.source_index(index), under.src  # a chain of views, as Emitter.value reads it
            src = task.units.get(under.id)
            if src is None or src.how == "root" or src.lo is None or unit.lo is None:
                continue
            offset = ix.add(task.view.flat(under, index), ix.mul(e, -1))
            if not ix.is_const(offset) or ix.const_value(offset) % 4:
                continue
            if (unit.lo[span] % 4).any() or (src.lo[span] % 4).any():
                continue
            found[node.id] = (src.node.id, ix.const_value(offset))
        return found

    @staticmethod
    def _unit_phases(task: Task, views: dict) -> dict[int, int]:
        """Each unit's phase (by id(unit)): schedule's (one more than the latest phase of what it
        reads), with a view in its array's phase, so that its readers wait for the array only."""
        if not views:
            return {id(u): u.phase for u in task.units.values()}
        found: dict[int, int] = {}

        def of(key: int) -> int:
            if key not in found:
                unit = task.units[key]
                if key in views:
                    found[key] = of(views[key][0])
                else:
                    found[key] = 1 + max((of(d) for d in unit.deps if d != key), default=-1)
            return found[key]

        return {id(u): of(key) for key, u in task.units.items()}

    def _stage(self, code: Code, t: int, units: list, x_only: dict | None = None) -> None:
        """Staged copies of flag-tagged values, one call for all of a phase's, so that every
        thread's loads of all of them are in flight together; a frame copy in ``x_only`` (its
        id: the frame's x size) only up to its x words (its scalars come later, _stage_scalars)."""
        x_only = x_only or {}
        k = len(units)
        names = ", ".join(_name(u.node) for u in units)
        code.items.append(f"// arrays {names}: staged from flagged words")
        if x_only:
            code.items.append("// (of the frame: its x words alone, published before its scalars)")
        dst = ", ".join(self.arr(t, u.node.id) for u in units)
        src = ", ".join(f"ffk_ll + {self.layout.ll[u.node.id]} + lo{u.node.id}" for u in units)

        def count(uid: int) -> str:
            if uid in x_only:
                return f"max(min(hi{uid}, {x_only[uid]}) - lo{uid}, 0)"
            return f"hi{uid} - lo{uid}"

        num = ", ".join(count(u.node.id) for u in units)
        unroll = stage_unroll(units, self.threads)
        code.items += [
            "{",
            f"    float* const sd[{k}] = {{{dst}}};",
            f"    const unsigned long long* const ss[{k}] = {{{src}}};",
            f"    const int sn[{k}] = {{{num}}};",
            f"    ffk_ll_stage_n<NT, {k}>(sd, ss, sn, epoch);"
            if unroll == STAGE_UNROLL
            else f"    ffk_ll_stage_wide<NT, {k}, {unroll}>(sd, ss, sn, epoch);",
            "}",
        ]

    def _stage_scalars(self, code: Code, t: int, unit: Unit, x_size: int) -> None:
        """EARLY_FRAME_WORDS: a frame copy's words past its x (the scalars of x), staged at the end
        of the phase before their first reader, by the block's last threads (a phase's first
        warps take its first elements)."""
        uid = unit.node.id
        code.items += [
            f"// array {_name(unit.node)}: its words past x (the scalars), staged for the next phase",
            "{",
            f"    const int from = max(lo{uid}, {x_size});",
            f"    for (int j = NT - 1 - tid; j < hi{uid} - from; j += NT)",
            f"        {self.arr(t, uid)}[from - lo{uid} + j] = ffk_ll_wait(ffk_ll + {self.layout.ll[uid]} + from + j, epoch);",
            "}",
        ]

    def _early_frame_store(self, code: Code, t: int, task: Task, x_size: int) -> None:
        """EARLY_FRAME_WORDS: the frame task's root elements that are x itself, published at the
        start of the first phase after x's array (the root then stores only the scalars)."""
        node = task.root
        code.items.append(f"// root {_name(node)}: its x words, published before the scalars of x are computed")
        code.items.append(_ONCE)
        loop = Code(f"for (int e = lo_root + tid; e < min(hi_root, {x_size}); e += NT)")
        code.items.append(loop)
        em = Emitter(self, t, task, loop, per_thread=True)
        var = ix.Var("e", x_size)
        value = em.value(node.srcs[0], [var])
        for stmt in self.stores(node, "e", value.text, self.stored_c(node, var)):
            em.top.insert(em.once(stmt))

    def _phase_frame_store(self, t: int, task: Task, phases: list) -> tuple[int, int] | None:
        """EARLY_FRAME_WORDS where the frame's x words cannot be stored at entry (_entry_frame):
        (x size, the phase at whose start the frame task stores them), None where this task is not
        the frame's or nothing would be earlier than its root."""
        phase_of, root, node = self.phases[t], task.units[ROOT], task.root
        if (
            not isinstance(node, FrameConcat)
            or frame_source(node) is None
            or self.root_arrays[t] is not None
            or self._warp_root(task, root)
            or self._early_input(task)
            or node.id in self.sched.layouts
        ):
            return None
        chain, under = set(), node.srcs[0]
        while True:
            chain.add(under.id)
            if not isinstance(under, Map):
                break
            under = under.src
        feeding = [phase_of[id(u)] for key, u in task.units.items() if key != ROOT and u.node.id in chain]
        after = [p for p in phases if feeding and p > max(feeding)]
        if after and after[0] < phase_of[id(root)]:
            return node.srcs[0].size, after[0]
        return None

    def _late_frame_scalars(self, t: int, task: Task, phases: list) -> dict[int, tuple[int, int]]:
        """FRAME_SCALARS_LATE: {staged frame copy id: (x size, phase)}, the phase at whose end the
        copy's scalars are staged, where the copy's first readers read x alone and the first reader
        of a scalar comes at least two phases after the copy (its x words staged in the copy's own
        phase)."""
        late: dict[int, tuple[int, int]] = {}
        if self._followers:  # a follower's phase is its reduction's: not worked out here
            return late
        phase_of, views, root = self.phases[t], self.views[t], task.units[ROOT]
        root_by = self.root_arrays[t]
        for unit in task.units.values():
            frame = unit.node
            if (
                unit is root
                or unit.how != "thread"
                or task.view.source_kind(frame) != "materialized"
                or frame_source(frame) is None
                or frame.id in self.sched.layouts
                or frame.id in views
            ):
                continue
            x_size = frame.srcs[0].size
            # the units that read the copy's scalars: directly, or through a view read in place
            readers, scalar_views = [], {frame.id}
            changed = True
            while changed:
                changed = False
                for other in task.units.values():
                    if other is unit or other in readers:
                        continue
                    reads = False
                    for occ in other.occurrences:
                        if occ.node.id in scalar_views and occ.node.id != frame.id:
                            reads = True  # a view of the copy that reads a scalar, read in place
                        elif occ.node.id == frame.id:
                            elements = max(other.node.size, 1)
                            pairs = enumerate_pairs(occ, other.var, elements)
                            pairs = pairs if pairs is not None else bounding_pairs(occ, other.var, elements)
                            reads = reads or pairs is None or (pairs[1].size > 0 and int(pairs[1].max()) >= x_size)
                    if reads:
                        readers.append(other)
                        changed = True
                        if other.node.id in views:
                            scalar_views.add(other.node.id)
            computed = [u for u in readers if u.node.id not in views]
            if not computed:
                continue

            def phase(u: Unit) -> int:
                if u is root and root_by is not None:
                    return phase_of[id(task.units[root_by])]
                return phase_of[id(u)]

            first = min(phase(u) for u in computed)
            before = [p for p in phases if phase_of[id(unit)] < p < first]
            if before:
                late[frame.id] = (x_size, before[-1])
        return late

    def _thread(self, code: Code, t: int, task: Task, unit: Unit) -> None:
        uid = unit.node.id
        loop = Code(f"for (int e = {self._from(t, uid)} + tid; e < hi{uid}; e += NT)")
        code.items.append(f"// array {_name(unit.node)} {list(unit.node.shape)}, a thread per element")
        code.items.append(_ONCE)
        code.items.append(loop)
        stores = uid in self.array_side.get(t, ())
        replica = uid in self.replica_side.get(t, {})
        # a replicated array stores only itself here (the task's other side stores stay where
        # they are stored once), and every block computes it whole: one block stores it
        side = {uid} if replica else {s.id for s in task.side} if stores else None
        em = Emitter(self, t, task, loop, per_thread=True, side=side)
        if replica:
            em.store_guard = f"b == {self.replica_side[t][uid]}"
        var = ix.Var("e", max(unit.node.size, 1))
        value = em.value(unit.node, ix.unflatten(var, unit.node.shape), expand_self=True)
        em.top.insert(f"{self.arr(t, uid)}[e - lo{uid}] = {value.text};")

    def _first_warp(self, unit: Unit) -> str:
        """The warp that computes a warp-per-element array's first element. Each such array of
        a phase starts on the warp after the previous one's last, so a phase's few-element arrays
        (a GRU cell's three gate products of 2 rows a block, a LayerNorm's two sums) run side by
        side on different warps instead of one after another on warps 0 and 1 while the others
        wait at the barrier (H100 trace: gru's gate phase 1130 cycles, its LayerNorm's 886)."""
        offset = self._warp_offset if STAGGER_WARPS else 0
        self._warp_offset = (offset + max(unit.span, 1)) % self.nwarps
        if offset == 0:
            return "warp"
        return f"((warp + {self.nwarps - offset}) % NWARPS)"

    def _reduce_lanes(self, unit: Unit) -> int:
        """Lanes per element of a reduction array: a warp each while the block has at most a
        few elements a warp; with more (attention's 128 scores of 64 a block: 16 a warp, 4500
        cycles a warp each) the warps split into segments of fewer lanes, at most the extent."""
        if not SEGMENTED_REDUCE:
            return WARP_LANES
        lanes = WARP_LANES
        while lanes > 1 and (unit.span * lanes > self.threads or lanes >= 2 * unit.node.extent):
            lanes //= 2
        return lanes

    def _reduce(self, code: Code, t: int, task: Task, unit: Unit) -> None:
        lanes = self._phase_lanes.get(unit.node.id) or self._reduce_lanes(unit)
        if lanes < WARP_LANES:
            self._segmented_reduce(code, t, task, unit, lanes)
            return
        node: Reduce = unit.node
        uid = node.id
        code.items.append(
            f"// array {_name(node)} {list(node.shape)}: {node.op} over {node.extent}, a warp per element"
        )
        loop = Code(f"for (int e = {self._from(t, uid)} + {self._first_warp(unit)}; e < hi{uid}; e += NWARPS)")
        code.items.append(_ONCE)
        code.items.append(loop)
        em = Emitter(self, t, task, loop)
        var = ix.Var("e", max(node.size, 1))
        acc = em.fresh("acc")
        em.top.insert(f"float {acc} = {REDUCE_INIT[node.op]};")
        r = ix.Var(em.fresh("r"), node.extent)
        outer, inner = _lane_loop(r, em.fresh("j"), unroll=8)
        em.top.open_child(outer)
        em.stack.append(inner)
        value = em.value(node.src, node.source_index(ix.unflatten(var, node.shape), r))
        em.stack[-1].insert(_accumulate(node.op, acc, value.text))
        em.stack.pop()
        em.top.close_child(outer)
        em.top.insert(f"{acc} = ffk_warp_{node.op}({acc});")
        em.top.insert(f"if (lane == 0) {self.arr(t, uid)}[e - lo{uid}] = {acc};")
        if uid == self.root_arrays[t]:
            self._root_after(loop, t, task, "lane == 0")
        follower = self._followers.get(uid)
        if follower is not None:
            self._follow_row(loop, t, task, follower)

    def _segmented_reduce(self, code: Code, t: int, task: Task, unit: Unit, lanes: int) -> None:
        """A reduction array with ``lanes`` lanes per element, 32 / lanes elements a warp. The
        warp's trip count is uniform (the shuffles need every lane), so an element past the end
        computes nothing; each element starts its walk over the extent at its own offset, so the
        segments of a warp reading rows of one array hit different shared-memory banks."""
        node: Reduce = unit.node
        uid = node.id
        per_warp = WARP_LANES // lanes
        code.items.append(
            f"// array {_name(node)} {list(node.shape)}: {node.op} over {node.extent}, "
            f"{lanes} lane{'s' if lanes > 1 else ''} per element"
        )
        first = self._first_segment_warp(unit, per_warp) if uid in self._phase_lanes else "warp"
        loop = Code(
            f"for (int e0 = {self._from(t, uid)} + {first} * {per_warp}; e0 < hi{uid}; e0 += NWARPS * {per_warp})"
        )
        code.items.append(_ONCE)
        code.items.append(loop)
        shift = lanes.bit_length() - 1
        loop.items.append(f"const int e = e0 + (lane >> {shift}), sub = lane & {lanes - 1};")
        loop.items.append("(void)sub;")
        em = Emitter(self, t, task, loop)
        em.top.pos = len(loop.items)
        var = ix.Var("e", max(node.size, 1))
        acc = em.fresh("acc")
        em.top.insert(f"float {acc} = {REDUCE_INIT[node.op]};")
        guard = Code(f"if (e < hi{uid})")
        em.top.insert(guard)
        em.stack.append(Scope(guard, guard=True))
        r = ix.Var(em.fresh("r"), node.extent)
        trips = -(-node.extent // lanes)
        j = em.fresh("j")
        source_index = node.source_index(ix.unflatten(var, node.shape), r)
        operands = self._vector_operands(t, task, node, var, r, lanes) if VECTOR_WALK else None
        if operands is not None:
            self._vector_walk(em, node, acc, operands, lanes, j, r)
        elif PAIRED_WALK and trips % 2 == 0 and node.extent % WARP_LANES == 0:
            # Step j reads position start + j, which is a base plus a constant (its unrolled loads
            # take immediate offsets), and its partner in the other half, (start + j) -/+ half:
            # lanes * half is a multiple of 32 words, so both fall in the lane's own bank. The
            # single rotated walk ((j + e) mod trips) cost 10.4 instructions a product (attention's
            # scores, sm_90 SASS): an AND and two address computations per load.
            half = trips // 2
            start = em.fresh("start")
            em.stack[-1].insert(f"const int {start} = e % {half};")
            outer = Code(f"#pragma unroll {min(8, half)}\nfor (int {j} = 0; {j} < {half}; ++{j})")
            em.stack[-1].open_child(outer)
            mine = f"sub + {lanes} * ({start} + {j})"
            # the partner as the lane's own position plus a step of either sign: the compiler
            # keeps one address per array and adds the step, instead of a second index per array
            step = lanes * half
            partner = f"{mine} + ({start} + {j} < {half} ? {step} : {-step})"
            for position in (mine, partner):
                body = Code("")
                body.items.append(f"const int {r.name} = {position};")
                outer.items.append(body)
                em.stack.append(Scope(body, var=r, pos=len(body.items)))
                value = em.value(node.src, source_index)
                em.stack[-1].insert(_accumulate(node.op, acc, value.text))
                em.stack.pop()
            em.stack[-1].close_child(outer)
        else:
            walk = f"(({j} + e) & {trips - 1})" if trips & (trips - 1) == 0 else f"(({j} + e) % {trips})"
            outer = Code(f"#pragma unroll {min(8, trips)}\nfor (int {j} = 0; {j} < {trips}; ++{j})")
            outer.items.append(
                f"const int {r.name} = sub + {lanes} * {walk};" if trips > 1 else f"const int {r.name} = sub;"
            )
            body = outer
            if node.extent % lanes:
                body = Code(f"if ({r.name} < {node.extent})")
                outer.items.append(body)
            em.stack[-1].open_child(outer)
            em.stack.append(Scope(body, var=r, pos=len(body.items)))
            value = em.value(node.src, source_index)
            em.stack[-1].insert(_accumulate(node.op, acc, value.text))
            em.stack.pop()
            em.stack[-1].close_child(outer)
        em.stack.pop()
        em.top.insert(f"{acc} = ffk_seg_{node.op}<{lanes}>({acc});")
        em.top.insert(f"if (sub == 0 && e < hi{uid}) {self.arr(t, uid)}[e - lo{uid}] = {acc};")
        if uid == self.root_arrays[t]:
            self._root_after(loop, t, task, f"sub == 0 && e < hi{uid}")

    def _vector_operands(self, t: int, task: Task, node: Reduce, var: ix.Var, r: ix.Var, lanes: int) -> tuple | None:
        """For a segmented sum of products of two shared-memory rows contiguous and 16-byte
        aligned along the reduced axis (attention's q·k over a head: q staged, k from the
        prefetched cache or the new row), the two rows' pointer branches, and those of the
        factors that do not depend on the position (the first layer's q is the frame's product
        times its LayerNorm's 1/σ), which scale the sum once. None where anything is not so (the
        scalar walk then reads it). See _vector_factors."""
        if node.extent % (4 * lanes):
            return None
        found = self._vector_factors(t, task, node, ix.unflatten(var, node.shape), r)
        if found is None:
            return None
        operands = [branches for kind, branches, _ in found if kind == "float4"]
        scales = [branches for kind, branches, _ in found if kind == "scalar"]
        if len(operands) != 2 or len(operands) + len(scales) != len(found):
            return None
        return operands, scales

    def _vector_factors(self, t: int, task: Task, node: Reduce, index: list, r: ix.Var) -> list | None:
        """For a sum over r (attention's scores: q times the cached or new K row; P·V: the
        softmax weights times the cached V rows; the softmax sum: the weights alone), each factor of
        the summand's product (through the product tree and the views over it) as
        (kind, pointer branches, stride): "float4" where its positions are contiguous along r from a
        16-byte aligned start for every element, "strided" (a constant stride s: p[r * s]) or
        "scalar" (no r at all). None unless every factor resolves to shared memory and at least one
        reads float4s (checked numerically over every value of the index's variables)."""
        extent = r.extent  # the positions [0, r.extent) of the sum (a prefix of it, see Emitter._reduce)
        if node.op != "sum" or extent % 4:
            return None
        factors: list[tuple[Node, list]] = []

        def collect(n: Node, idx: list) -> None:
            if task.view.kind(n) == "inline" and isinstance(n, Ew) and n.op == "mul":
                for a in n.args:
                    collect(a, idx)
            elif task.view.kind(n) == "inline" and isinstance(n, Map):
                collect(n.src, n.source_index(idx))
            else:
                factors.append((n, idx))

        collect(node.src, node.source_index(index, r))
        resolved = []
        for factor, idx in factors:
            branches = self._pointer_branches(t, task, factor, idx, (), r)
            if branches is None:
                return None
            resolved.append(branches)
        names: set = set()
        for branches in resolved:
            for guards, _base, flat in branches:
                names |= ix.free_vars(flat)
                for pos, _start, _stop in guards:
                    names |= ix.free_vars(pos)
        names.discard(r)
        variables = sorted(names, key=lambda v: v.name)
        count = int(np.prod([v.extent for v in variables], dtype=np.int64)) if variables else 1
        if count * extent > VECTOR_CHECK_LIMIT:
            return None
        grids = np.meshgrid(*[np.arange(v.extent, dtype=np.int64) for v in variables], indexing="ij")
        env = {v: g.reshape(-1, 1) for v, g in zip(variables, grids)}
        positions = np.arange(extent, dtype=np.int64)[None, :]
        env[r] = positions
        found = []
        for branches in resolved:
            kinds = set()
            strides = set()
            for guards, _base, flat in branches:
                mask = np.ones((count, 1), dtype=bool)
                for pos, start, stop in guards:
                    value = np.broadcast_to(ix.evaluate(pos, env), (count, 1))
                    mask &= (value >= start) & (value < stop)
                where = np.broadcast_to(ix.evaluate(flat, env), (count, extent))[mask[:, 0]]
                if not where.size:
                    continue
                step = where - where[:, :1]
                stride = int(step[0, 1]) if extent > 1 else 0
                if (step != stride * positions).any():
                    return None
                strides.add(stride)
                if stride == 0:
                    kinds.add("scalar")
                elif stride == 1 and not (where[:, :1] % 4).any():
                    kinds.add("float4")
                else:
                    kinds.add("strided")
            if len(strides) > 1 or len(kinds) > 1:
                return None
            kind = kinds.pop() if kinds else "scalar"
            found.append((kind, branches, strides.pop() if strides else 0))
        if not any(kind == "float4" for kind, _, _ in found):
            return None
        return found

    def _pointer_branches(self, t: int, task: Task, node: Node, index: list, guards: tuple, r: ix.Var) -> list | None:
        """Where ``node``'s element at ``index`` lies in shared memory, per branch of the Concats
        on the way (none of them along ``r``): [(guards, (aligned base, origin), flat index)], the
        element at base + flat - origin (origin: the block's first element there, a multiple of 4)."""
        kind = task.view.kind(node)
        flat = task.view.flat(node, index)
        if isinstance(node, Leaf) and not (node.role == "input" and kind in ("materialized", "array")):
            offset = self.layout.leaf_prefetch.get((t, node.id))
            if node.role == "const" or offset is None or (self.prefetch_offset + offset) % 4:
                return None  # plo (the copy's origin) is a multiple of 4 by construction (_segments)
            return [(guards, (f"ffk_smem + {self.prefetch_offset + offset}", f"plo{node.id}"), flat)]
        if kind in ("array", "dot"):
            unit = task.units.get(node.id)
            if unit is None or unit.lo is None:
                return None
            los = unit.lo[task.first : task.first + task.blocks]
            if not self._arena_aligned(t, node.id) or (los % 4).any():
                return None
            return [(guards, (self.arr(t, node.id), f"lo{node.id}"), flat)]
        if kind != "inline":
            return None
        if isinstance(node, Map):
            return self._pointer_branches(t, task, node.src, node.source_index(index), guards, r)
        if isinstance(node, Concat):
            found = []
            for src, sub, guard in concat_branches(node, index):
                inner = guards
                if guard is not None:
                    if r in ix.free_vars(guard[0]):
                        return None
                    inner = guards + (guard,)
                branches = self._pointer_branches(t, task, src, sub, inner, r)
                if branches is None:
                    return None
                found += branches
            return found
        return None

    def _vector_walk(self, em: Emitter, node: Reduce, acc: str, found: tuple, lanes: int, j: str, r: ix.Var) -> None:
        """The sum of products of _vector_operands: a pointer per operand chosen once per element,
        then float4 loads. Lane ``sub`` reads chunks sub, sub + lanes, ... of the row, starting
        at the element's own chunk, so that the 8 lanes of a quarter warp (4 elements with 2
        lanes each for attention's scores) read 8 different 16-byte bank groups. The factors
        that do not depend on the position scale the lane's partial sum once."""
        operands, scales = found
        scope = em.stack[-1]
        trips = node.extent // (4 * lanes)
        pointers = _pointers(scope, em.fresh, operands + scales, r, "the pointers to the element's row start")
        walk = f"(({j} + e) & {trips - 1})" if trips & (trips - 1) == 0 else f"(({j} + e) % {trips})"
        loop = Code(f"#pragma unroll\nfor (int {j} = 0; {j} < {trips}; ++{j})")
        c = em.fresh("c")
        x, y = em.fresh("x"), em.fresh("y")
        loop.items += [
            f"const int {c} = 4 * (sub + {lanes} * {walk});" if trips > 1 else f"const int {c} = 4 * sub;",
            f"const float4 {x} = ffk_ld4({pointers[0]} + {c}), {y} = ffk_ld4({pointers[1]} + {c});",
            f"{acc} += {x}.x * {y}.x;",
            f"{acc} += {x}.y * {y}.y;",
            f"{acc} += {x}.z * {y}.z;",
            f"{acc} += {x}.w * {y}.w;",
        ]
        scope.insert(loop)
        for p in pointers[2:]:
            scope.insert(f"{acc} *= *{p};")

    def _dot_lanes(self, unit: Unit) -> int:
        """Lanes per element of a product array: a warp each, unless a row has fewer float4
        loads than half a warp has lanes (a row of 64 floats: 16) and the block has more rows
        than warps, so that segments of a warp take a row each (see ffk_seg_dot)."""
        if not SEGMENTED_DOT or unit.span <= self.nwarps or self._x_in_registers(unit):
            return WARP_LANES
        k = unit.node.k
        loads = k // 4 if k % 4 == 0 else k
        lanes = WARP_LANES
        while lanes > 1 and lanes >= 2 * loads:
            lanes //= 2
        # fewer lanes a row, more loads a lane, while the block's rows take more than one pass of
        # its warps: each pass is a chain of loads and shuffles (the frame's R·x, 64 rows of 64 on
        # one block at 16 lanes a row: four passes, 1600 cycles on the H100)
        while SEGMENT_ONE_PASS and lanes > SEGMENT_MIN_LANES and unit.span > self.nwarps * (WARP_LANES // lanes):
            lanes //= 2
        return lanes

    def _x_in_registers(self, unit: Unit) -> bool:
        """A product array computed a warp per element with its one x row held in registers
        (DOT_X_IN_REGISTERS): every element reads the same x (batch 1), the rows are long fp32
        rows and some warp of the block takes two or more of them."""
        node = unit.node
        return bool(
            self.settings.x_in_registers
            and node.size == node.n
            and node.k % 4 == 0
            and DOT_X_MIN_K <= node.k <= DOT_X_MAX_K
            and node.id not in self.layout.narrow
            and unit.span > self.nwarps
        )

    def _dot(self, code: Code, t: int, task: Task, unit: Unit) -> None:
        node: Dot = unit.node
        uid = node.id
        src = task.units[node.src.id]
        k = node.k
        lay = self.layout
        if self._x_in_registers(unit):
            self._dot_x_in_registers(code, t, task, unit)
            return
        lanes = self._phase_lanes.get(uid) or self._dot_lanes(unit)
        if lanes < WARP_LANES:
            per_warp = WARP_LANES // lanes
            code.items.append(
                f"// array {_name(node)} {list(node.shape)}: dot products of {k}, {lanes} lanes per element"
            )
            first = self._first_segment_warp(unit, per_warp) if uid in self._phase_lanes else "warp"
            loop = Code(
                f"for (int e0 = {self._from(t, uid)} + {first} * {per_warp}; e0 < hi{uid}; e0 += NWARPS * {per_warp})"
            )
            code.items.append(_ONCE)
            code.items.append(loop)
            # every lane takes part in the shuffles: a segment past the end computes row e0's
            # product again (in bounds) and stores nothing
            loop.items.append(f"const int sub = lane & {lanes - 1}, e1 = e0 + (lane >> {lanes.bit_length() - 1});")
            loop.items.append(f"const bool live = e1 < hi{uid};")
            loop.items.append("const int e = live ? e1 : e0;")
        else:
            code.items.append(f"// array {_name(node)} {list(node.shape)}: dot products of {k}, a warp per element")
            loop = Code(f"for (int e = {self._from(t, uid)} + {self._first_warp(unit)}; e < hi{uid}; e += NWARPS)")
            code.items.append(_ONCE)
            code.items.append(loop)
        loop.items.append(f"const int m = e / {node.n}, n = e % {node.n};")
        loop.items.append(f"const float* x = {self.arr(t, src.node.id)} + (m * {k} - lo{src.node.id});")
        pf = lay.prefetch.get((t, uid))
        narrow = lay.narrow.get(uid)
        row = self._row_floats(node)
        if pf is not None:
            col = lay.column_of[(t, uid, "nlo")]
            w = f"ffk_smem + {self.prefetch_offset + pf[0]} + (n - ffk_r[{col}]) * {row}"
        else:
            w = f"ffk_w + {self._weight_offset(node)} + n * {row}"
        aligned = "true" if k % 4 == 0 else "false"
        lane = "sub" if lanes < WARP_LANES else "lane"
        if narrow is None:
            loop.items.append(f"const float* w = {w};")
            call = (
                f"ffk_seg_dot<{k}, {lanes}, {aligned}>(x, w, sub)"
                if lanes < WARP_LANES
                else f"ffk_warp_dot<{k}, {aligned}>(x, w, lane)"
            )
        elif self.settings.weight_format == "int8":  # the row's narrow weights (see WEIGHT_FORMATS)
            loop.items.append(f"const unsigned char* w = reinterpret_cast<const unsigned char*>({w});")
            call = f"ffk_seg_dot_q<{k}, {lanes}, {aligned}>(x, w, {lane})"
        else:
            loop.items.append(f"const unsigned short* w = reinterpret_cast<const unsigned short*>({w});")
            call = (
                f"ffk_seg_dot_n<{k}, {lanes}, {aligned}, {WEIGHT_FORMATS[self.settings.weight_format]}>(x, w, {lane})"
            )
        loop.items.append(f"const float acc = {call};")
        live = " && live" if lanes < WARP_LANES else ""
        loop.items.append(f"if ({lane} == 0{live}) {self.arr(t, uid)}[e - lo{uid}] = acc;")
        if uid == self.root_arrays[t]:
            self._root_after(loop, t, task, f"{lane} == 0{live}")

    def _dot_x_in_registers(self, code: Code, t: int, task: Task, unit: Unit) -> None:
        node: Dot = unit.node
        uid = node.id
        src = task.units[node.src.id]
        k = node.k
        code.items.append(
            f"// array {_name(node)} {list(node.shape)}: dot products of {k}, a warp per element, "
            "the one x row they share in registers"
        )
        first = f"{self._from(t, uid)} + {self._first_warp(unit)}"
        block = Code("")  # a scope of its own: a phase may hold several such arrays
        code.items.append(block)
        block.items += [
            f"const int e_first = {first};",
            f"ffk_xregs<{k}> xr;",
            f"if (e_first < hi{uid}) ffk_load_x<{k}>(xr, {self.arr(t, src.node.id)} + (0 - lo{src.node.id}), lane);",
        ]
        loop = Code(f"for (int e = e_first; e < hi{uid}; e += NWARPS)")
        block.items.append(_ONCE)
        block.items.append(loop)
        pf = self.layout.prefetch.get((t, uid))
        if pf is not None:
            col = self.layout.column_of[(t, uid, "nlo")]
            w = f"ffk_smem + {self.prefetch_offset + pf[0]} + (e - ffk_r[{col}]) * {k}"
        else:
            w = f"ffk_w + {self._weight_offset(node)} + e * {k}"
        loop.items += [
            f"const float acc = ffk_warp_dot_x<{k}>(xr, {w}, lane);",
            f"if (lane == 0) {self.arr(t, uid)}[e - lo{uid}] = acc;",
        ]
        if uid == self.root_arrays[t]:
            self._root_after(loop, t, task, "lane == 0")

    def _early_input(self, task: Task) -> bool:
        """A task that republishes a graph input with at most one element a thread reads it at
        the kernel's entry (see _prologue)."""
        root = task.root
        return (
            isinstance(root, Leaf)
            and root.role == "input"
            and min(task.chunk, root.size) <= self.threads
            and not task.side
        )

    def _entry_frame(self, task: Task) -> bool:
        """EARLY_FRAME_WORDS: whether a frame task's x words can be stored at entry by the threads
        that read them (_framed_input: thread e holds element e), its root's element e < x size
        being x's flat element e (x a reshape of the input) in the root's own order."""
        node = task.root
        if not isinstance(node, FrameConcat) or self._framed_input(task) is None or node.id in self.sched.layouts:
            return False
        under = node.srcs[0]
        while isinstance(under, Map):
            if not under.what.startswith("reshape"):
                return False
            under = under.src
        return under is frame_source(node) and node.srcs[0].size == under.size

    def _framed_input(self, task: Task) -> Leaf | None:
        """The graph input a frame task (``FrameConcat([x, scalars of x])`` on one block, see
        schedule.framed_inputs) reads from host memory itself, when the block's threads can hold
        one element each."""
        leaf = frame_source(task.root)
        if leaf is None or leaf.id in self.sched.materialized or task.blocks != 1 or leaf.size > self.threads:
            return None
        starts = [u._start() for u in task.units.values() if u.how in ("root", "thread")]
        if any(s is None or int(s[task.first]) != 0 for s in starts):
            return None  # (every element loop of the task must start at element 0: e == tid)
        return leaf

    def _root(self, code: Code, t: int, task: Task, unit: Unit) -> None:
        node = task.root
        if self._early_input(task):
            self.host_tasks.add(t)
            self.input_tasks.add(t)
            code.items.append(f"// root {_name(node)} {list(node.shape)}: the element read at entry, published")
            early = Code("if (tid < hi_root - lo_root)")
            early.items.append("const int e = lo_root + tid;")
            early.items += self.stores(node, "e", f"ffk_host{t}")
            code.items.append(early)
            return
        if column_scan(node) and task.chunk % node.steps == 0 and not task.side:
            self._column_root(code, t, task)
            return
        warp = self._warp_root(task, unit)
        if warp:
            loop = Code("for (int e = lo_root + warp; e < hi_root; e += NWARPS)")
            code.items.append(
                f"// root {_name(node)} {list(node.shape)}, a warp per element (reductions over its lanes)"
            )
        elif self._early_x is not None:  # its x words are stored (_early_frame_store): the scalars
            loop = Code(f"for (int e = max(lo_root, {self._early_x}) + tid; e < hi_root; e += NT)")
            code.items.append(f"// root {_name(node)} {list(node.shape)}: the scalars of x, a thread per element")
        else:
            loop = Code("for (int e = lo_root + tid; e < hi_root; e += NT)")
            code.items.append(f"// root {_name(node)} {list(node.shape)}, a thread per element")
        code.items.append(_ONCE)
        code.items.append(loop)
        em = Emitter(self, t, task, loop, side={s.id for s in task.side}, lanes=warp, per_thread=not warp)
        var = ix.Var("e", max(node.size, 1))
        value = em.value(node, ix.unflatten(var, node.shape))
        for stmt in self.stores(node, "e", value.text, self.stored_c(node, var)):
            em.top.insert(em.once(stmt))

    def _column_root(self, code: Code, t: int, task: Task) -> None:
        """A column scan's root (schedule.column_scan): the block's elements are whole columns
        (its chunk a multiple of the positions); a thread takes a column and runs the recurrence
        through its positions in order, storing each, so a column costs T steps, not T(T+1)/2."""
        node = task.root
        steps = node.steps
        spec = EW[node.op]
        self.need_header(spec.header)
        code.items.append(
            f"// root {_name(node)} {list(node.shape)}: a thread per column, its {steps} positions in order"
        )
        code.items.append(_ONCE)
        loop = Code(f"for (int col = lo_root / {steps} + tid; col < hi_root / {steps}; col += NT)")
        code.items.append(loop)
        em = Emitter(self, t, task, loop)
        col = ix.Var("col", max(node.size // steps, 1))
        index = ix.unflatten(col, node.shape[:-1]) + [None]
        h = em.fresh("h")
        init = em.value(node.init, node.init_index(index))
        em.top.insert(f"float {h} = {init.text};")
        s = ix.Var(em.fresh("s"), steps)
        inner_code = Code(f"#pragma unroll 4\nfor (int {s.name} = 0; {s.name} < {steps}; ++{s.name})")
        scope = em.top
        scope.open_child(inner_code)
        inner = Scope(inner_code, var=s)
        em.stack.append(inner)
        at = node.at(index, s)
        items = [em.value(x, at).text for x in node.xs]
        inner.insert(f"{h} = {spec.c(node.step_args(items, h), node.params)};")
        flat = ix.flatten(at, node.shape)
        for stmt in self.stores(node, ix.to_c(flat), h, self.stored_c(node, flat)):
            inner.insert(stmt)
        em.stack.pop()
        scope.close_child(inner_code)

    def _value_into(self, t: int, task: Task, scope: Code, node: Node, index: list, target: str) -> None:
        """``target = value of node at index`` at the end of ``scope`` (a loop or guard whose own
        declarations bind the index's variables), everything it needs computed inside it."""
        em = Emitter(self, t, task, scope)
        em.stack[0].guard = True
        em.top.pos = len(em.top.code.items)  # after the scope's own declarations
        em.top.insert(f"{target} = {em.value(node, index).text};")

    @staticmethod
    def _stage_ranges(ranges: list, limit: int) -> list:
        """C staging flag-tagged ranges ``(dst, src, count)`` into shared memory: one call for up to
        ``limit`` of them (every thread's loads of all in flight together), else a call a range."""
        groups = [ranges] if len(ranges) <= limit else [[r] for r in ranges]
        out = []
        for group in groups:
            n = len(group)
            out += [
                "{",
                f"    float* const sd[{n}] = {{{', '.join(r[0] for r in group)}}};",
                f"    const unsigned long long* const ss[{n}] = {{{', '.join(r[1] for r in group)}}};",
                f"    const int sn[{n}] = {{{', '.join(r[2] for r in group)}}};",
                f"    ffk_ll_stage_n<NT, {n}>(sd, ss, sn, epoch);",
                "}",
            ]
        return out

    def _cell(self, node: Recur, xs: list[str], rs: list[str], c_var: str, h_prev: str) -> list[str]:
        """A recurrence cell's lines from each gate's input part ``xs`` and recurrent part ``rs``:
        ``const float h`` (and for an LSTM ``const float c``, written back into ``c_var``); a GRU
        reads the unit's previous h at ``h_prev``. Shared by _recur's loops."""
        if node.cell == "lstm":
            i_, o_, f_, g_ = (f"({x} + {r})" for x, r in zip(xs, rs))
            return [
                f"const float c = {EW['lstm_cell'].c([i_, f_, g_, c_var], ())};",
                f"const float h = {EW['lstm_hidden'].c([o_, 'c'], ())};",
                f"{c_var} = c;",
            ]
        if node.cell == "gru":
            args = [xs[0], rs[0], xs[1], rs[1], xs[2], rs[2], h_prev]
            return [f"const float h = {EW['gru_hidden'].c(args, ())};"]
        if node.cell.startswith("rnn_"):
            act = EW[node.cell.removeprefix("rnn_")]
            self.need_header(act.header)
            return [f"const float h = {act.c([f'({xs[0]} + {rs[0]})'], ())};"]
        args = [f"({x} + {r})" for x, r in zip(xs, rs)]
        return [f"const float h = {EW['liquid_hidden'].c(args, node.params)};"]

    def _recur(self, code: Code, t: int, task: Task) -> None:
        """A nonlinear recurrence (ir.Recur, schedule._recur_task): the block's hidden units of
        every batch row, the positions in order. Per position, one staging call brings h of the
        position before (all of it: every block's units, flag-tagged words) and this position's
        input part of the block's units; the block's threads split R's rows (held in shared memory,
        transposed so a warp reads consecutive rows at one k) and the K axis between them; then a
        thread per owned unit sums its rows' parts, applies the cell and publishes h (and c). Two
        barriers a position; the block waits only for the words it reads, so the next layer's task,
        on other blocks, runs position t while this one runs t + 1."""
        node: Recur = task.root
        G, S, H, B, T = node.gates, node.carried, node.hidden, node.batch, node.steps
        HB = task.chunk
        plan = recur_plan(node, HB, task.stage_limit, task.threads)
        held = plan.held
        rows, splits, kc, kr = plan.rows, plan.splits, plan.kc, plan.kr  # product rows x K splits of kc
        lay = self.layout
        w_rows = lay.weights[node.weight.id]
        w_bias = None if node.bias_weight is None else lay.weights[node.bias_weight.id]
        own = lay.ll[node.id]
        for op in ("lstm_cell", "lstm_hidden", "gru_hidden", "liquid_hidden"):
            self.need_header(EW[op].header)
        floats = recur_smem_parts(node, HB, plan)
        base = self.arena_offset
        offsets = {}
        for name, n in floats:
            offsets[name] = base
            base += n
        stride = G * HB + 1  # the transposed rows' stride: odd, so the one-time fill spreads over the banks
        direct = task.view.source_kind(node.xg) == "materialized" and node.xg.id not in self.sched.layouts
        # One block holds every unit (hidden 64): h never leaves shared memory, a thread per unit
        # loads its inputs of the next position a position ahead (RECUR_ONE_BLOCK)
        alone = RECUR_ONE_BLOCK and held and direct and task.blocks == 1 and HB >= H and B * H <= self.threads
        code.items += [
            f"// recurrence {node.cell} over {T} positions: this block's {HB} of {H} hidden units, "
            f"{'R in shared memory' if held else 'R read from global memory each position'}, "
            f"{rows} product rows x {splits} K splits",
            "__syncthreads();  // the previous task's readers of shared memory are done",
            f"const int ru0 = {_block_in_task(task)} * {HB}, rnu = min({HB}, {H} - ru0);",
            f"float* const rR = ffk_smem + {offsets['R']};  // R's rows of the block's units, [k][row]",
            f"float* const rH = ffk_smem + {offsets['h']};  // h of the position before, two buffers",
            f"float* const rP = ffk_smem + {offsets['P']};  // the products' parts, [split][row]",
            f"float* const rX = ffk_smem + {offsets['X']};  // the position's input part of the block's units, two buffers",
            f"float* const rC = ffk_smem + {offsets['C']};  // LSTM: c of the block's units",
            "(void)rR; (void)rX; (void)rC;",
        ]
        if plan.hybrid:  # only the weights past the registers' of each split: [split][k][row]
            rest = kc - kr
            load = Code(f"for (int i = tid; i < {G * HB * splits * rest}; i += NT)")
            load.items += [
                f"const int q = i / {splits * rest}, sk = i - q * {splits * rest}, j = q % {HB};",
                f"const int k = (sk / {rest}) * {kc} + {kr} + sk % {rest};",
                f"rR[sk * {stride} + q] = j < rnu ? __ldg(ffk_w + {w_rows} + ({H} * (q / {HB}) + ru0 + j) * {H} + k) : 0.0f;",
            ]
            code.items += [_ONCE, load]
        elif held:
            load = Code(f"for (int i = tid; i < {G * HB * H}; i += NT)")
            load.items += [
                f"const int q = i / {H}, k = i - q * {H}, j = q % {HB};",
                f"rR[k * {stride} + q] = j < rnu ? __ldg(ffk_w + {w_rows} + ({H} * (q / {HB}) + ru0 + j) * {H} + k) : 0.0f;",
            ]
            code.items += [_ONCE, load]
        b_var, k_var, u_var = ix.Var("rcb", B), ix.Var("rck", H), ix.Var("rcu", H)
        init = Code(f"for (int i = tid; i < {B * H}; i += NT)")
        init.items.append(f"const int rcb = i / {H}, rck = i - rcb * {H};")
        self._value_into(t, task, init, node.h0, [b_var, k_var], "rH[i]")
        code.items += [_ONCE, init]
        if node.c0 is not None:
            init_c = Code(f"for (int i = tid; i < {B * HB}; i += NT)")
            init_c.items.append(f"const int rcb = i / {HB}, rcu = ru0 + i - rcb * {HB};")
            guarded = Code("if (rcu < ru0 + rnu)")
            init_c.items.append(guarded)
            self._value_into(t, task, guarded, node.c0, [b_var, u_var], "rC[i]")
            code.items += [_ONCE, init_c]
        h_floats, x_floats = _align4(B * H), _align4(B * G * HB)
        xg = lay.ll[node.xg.id] if direct else None

        def x_word(position: str, g: int) -> str:  # the flagged word of gate g's input (alone)
            return f"ffk_ll + {xg} + ({position} * {B} + rcb) * {G * H} + {g * H} + rcu"

        lanes = recur_lanes(node, self.threads, self.settings.lane_cells) if alone else 0
        if lanes:
            self._recur_lane_loop(code, t, task, lanes, x_word, h_floats, w_bias, stride)
            return
        # the block's threads past the cells take the input words (RECUR_INPUT_HELPERS)
        # from the warp after the cells' last: a warp of cells and helpers would run both paths in turn
        first_helper = -(-B * H // 32) * 32
        helpers = alone and self.settings.input_helpers and self.threads > first_helper and HB == H
        ring = (
            _InputRing(G, T, x_word, self.settings.inputs_ahead, self.settings.take_together)
            if alone and not helpers
            else None
        )
        if helpers:
            take_in = _InputHelpers(B * G * H, B * H, first_helper, self.threads, T, f"ffk_ll + {xg}", x_floats)
            code.items += [
                f"const int rcb = tid / {H}, rcj = tid - rcb * {H}, rcu = rcj;",
                *take_in.first_positions(),
            ]
        elif alone:
            code.items += [
                f"// the inputs of the next position{ring.ahead_text} (a thread per unit)",
                ring.declaration,
                f"const int rcb = tid / {H}, rcj = tid - rcb * {H}, rcu = rcj;",
                f"if (tid < {B * H}) {{",
                *(f"    {line}" for line in ring.first_loads()),
                "}",
            ]
        code.items.append("__syncthreads();")
        # R's rows in registers (RECUR_REGISTER_WEIGHTS): a product then reads only h from shared
        # memory, a float4 a load, where held rows cost two loads a multiply-add (shared-memory
        # bound: 0.55 us a position for hidden 64's 256 rows on the H100)
        # (schedule.recur_plan; a hybrid plan keeps only the first kr of a split there)
        in_registers = kr > 0
        if in_registers:
            fill = Code(f"if (tid < {rows * splits})")
            if plan.hybrid:
                fill.items += [
                    f"const int fq = pr % {G * HB}, fj = fq % {HB};",
                    f"const float* const fw = ffk_w + {w_rows} + ({H} * (fq / {HB}) + ru0 + fj) * {H} + ps * {kc};",
                    "#pragma unroll",
                    f"for (int k = 0; k < {kr}; ++k) rw[k] = fj < rnu ? __ldg(fw + k) : 0.0f;",
                ]
            else:
                fill.items += [
                    "#pragma unroll",
                    f"for (int k = 0; k < {kc}; ++k) rw[k] = rR[(ps * {kc} + k) * {stride} + pr % {G * HB}];",
                ]
            code.items += [
                "// this thread's K split of one product row of R, in registers for the whole window",
                f"const int pr = tid % {rows}, ps = tid / {rows};",
                f"float rw[{kr}];",
                fill,
            ]
        # with helpers, inputs_ahead unrolls the position loop only (what gave the GRU its 10 % at
        # depth 8: its ring's takes wait on one scoreboard too)
        unroll = ring.ahead if ring else (min(self.settings.inputs_ahead, T) if helpers else 1)
        outer, loop = _position_loop(T, unroll)
        code.items += [_ONCE, outer]
        loop.items.append(f"const float* const hp = rH + (rcs & 1) * {h_floats};")
        # the staging: h before (from the second position on) and the input part, one call (alone:
        # nothing, h is already in shared memory and the inputs are loaded a position ahead)
        ranges = [
            (
                f"rH + (rcs & 1) * {h_floats} + {b * H}",
                f"ffk_ll + {own} + ((rcs - 1) * {B} + {b}) * {S * H}",
                f"rcs > 0 ? {H} : 0",
            )
            for b in range(B)
            if not alone
        ]
        if direct and not alone:
            ranges += [
                (
                    f"rX + (rcs & 1) * {x_floats} + {(b * G + g) * HB}",
                    f"ffk_ll + {xg} + (rcs * {B} + {b}) * {G * H} + {g * H} + ru0",
                    "rnu",
                )
                for b in range(B)
                for g in range(G)
            ]
        elif not direct:  # through a view (liquid's transposed window): an element a thread, the waits side by side
            fill = Code(f"for (int e = tid; e < {B * G * HB}; e += NT)")
            fill.items.append(f"const int rcb = e / {G * HB}, rcg = (e / {HB}) % {G}, rcj = e % {HB}, rcu = ru0 + rcj;")
            guarded = Code("if (rcj < rnu)")
            fill.items.append(guarded)
            index = [ix.Var("rcs", T), ix.Var("rcb", B), ix.add(ix.mul(ix.Var("rcg", G), H), ix.Var("rcu", H))]
            self._value_into(t, task, guarded, node.xg, index, f"rX[(rcs & 1) * {x_floats} + e]")
            loop.items += [_ONCE, fill]
        if ranges:
            loop.items += self._stage_ranges(ranges, RECUR_STAGE_RANGES)
            loop.items.append("__syncthreads();")
        if in_registers:
            prod = Code(f"if (tid < {rows * splits})")
            prod.items += [
                f"const float* const hv = hp + (pr / {G * HB}) * {H} + ps * {kc};",
                "float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;",
                "#pragma unroll",
                f"for (int k = 0; k < {kr}; k += 4) {{",
                "    const float4 v = ffk_ld4(hv + k);",
                "    a0 += rw[k] * v.x; a1 += rw[k + 1] * v.y; a2 += rw[k + 2] * v.z; a3 += rw[k + 3] * v.w;",
                "}",
            ]
            if plan.hybrid:
                prod.items += [
                    "// the rest of the split from shared memory",
                    f"const float* const rs = rR + ps * {(kc - kr) * stride} + pr % {G * HB};",
                    "#pragma unroll 8",
                    f"for (int k = 0; k < {kc - kr}; ++k) a0 += rs[k * {stride}] * hv[{kr} + k];",
                ]
            prod.items.append(f"rP[ps * {rows} + pr] = (a0 + a1) + (a2 + a3);")
        else:
            # the products: thread i takes row i % rows over the K split i / rows
            prod = Code(f"for (int i = tid; i < {rows * splits}; i += NT)")
            prod.items += [
                f"const int r = i % {rows}, s = i / {rows}, q = r % {G * HB}, j = q % {HB};",
                f"const float* const hv = hp + (r / {G * HB}) * {H};",
                f"const int k0 = s * {kc}, k1 = min(k0 + {kc}, {H});",
                "float acc = 0.0f;",
            ]
            if held:
                prod.items += [
                    "#pragma unroll 8",
                    f"for (int k = k0; k < k1; ++k) acc += rR[k * {stride} + q] * hv[k];",
                ]
            elif node.id in lay.recur_by_k:
                prod.items += [
                    "// R from global memory, the block's rows by k: a warp's loads at one k are consecutive",
                    f"const float* const w = ffk_w + {lay.recur_by_k[node.id]} + {_block_in_task(task)} * {H * G * HB} + q;",
                    "#pragma unroll 8",
                    f"for (int k = k0; k < k1; ++k) acc += __ldg(w + k * {G * HB}) * hv[k];",
                ]
            else:
                prod.items += [
                    f"const float* const w = ffk_w + {w_rows} + ({H} * (q / {HB}) + ru0 + j) * {H};",
                    "if (j < rnu)",
                    "    for (int k = k0; k < k1; ++k) acc += __ldg(w + k) * hv[k];",
                ]
            prod.items.append(f"rP[s * {rows} + r] = acc;")
        loop.items += [_ONCE, prod, "__syncthreads();"]
        if alone:
            cells = Code(f"if (tid < {B * H})")
            body = Code()
            cells.items += [
                "const int i = tid;",
                *(ring.take_and_reload() if ring else []),
                body,
            ]
        else:
            cells = Code(f"for (int i = tid; i < {B * HB}; i += NT)")
            cells.items.append(f"const int rcb = i / {HB}, rcj = i - rcb * {HB}, rcu = ru0 + rcj;")
            body = Code("if (rcj < rnu)")
            cells.items.append(body)
        em = Emitter(self, t, task, body)
        em.stack[0].guard = True
        em.top.pos = len(em.top.code.items)
        xs, rs = [], []
        for g in range(G):
            xs.append(f"rxv{g}" if ring else f"rX[(rcs & 1) * {x_floats} + rcb * {G * HB} + {g * HB} + rcj]")
            parts = " + ".join(f"rP[{s * rows} + rcb * {G * HB} + {g * HB} + rcj]" for s in range(splits))
            if w_bias is not None:
                parts += f" + __ldg(ffk_w + {w_bias} + {g * H} + rcu)"
            name = em.fresh("r")
            em.top.insert(f"const float {name} = {parts};")
            rs.append(name)
        # the recurrence's own elements (h, then c) in its flat order: its flag-tagged copy, and the
        # graph output when the recurrence is one (a one-direction GRU's Y is a reshape of it)
        flat = f"(rcs * {B} + rcb) * {S * H} + rcu"
        for line in self._cell(node, xs, rs, "rC[i]", f"hp[rcb * {H} + rcu]"):
            em.top.insert(line)
        if node.cell == "lstm":
            for line in self.stores(node, f"{flat} + {H}", "c"):
                em.top.insert(line)
        for line in self.stores(node, flat, "h"):
            em.top.insert(line)
        if alone:  # the next position's h, read from shared memory after the barrier
            em.top.insert(f"rH[((rcs + 1) & 1) * {h_floats} + rcb * {H} + rcu] = h;")
            loop.items += [cells, *(take_in.next_positions() if helpers else []), "__syncthreads();"]
        else:
            loop.items += [_ONCE, cells]

    def _recur_lane_loop(self, code: Code, t: int, task: Task, lanes: int, x_word, h_floats: int, w_bias, stride: int):
        """_recur's loop on one block holding every unit (RECUR_LANE_CELLS, recur_lanes): ``lanes``
        threads a unit, each with its K split of the unit's gate rows of R in registers; the
        lanes' sums meet through shuffles, every lane applies the cell (c stays in a register),
        its first lane publishes h. One barrier a position (h's two buffers in shared memory),
        where the thread-per-row loop has two and the products' parts in between."""
        node: Recur = task.root
        G, S, H, B, T = node.gates, node.carried, node.hidden, node.batch, node.steps
        KL, active = H // lanes, B * H * lanes
        ring = _InputRing(G, T, x_word, self.settings.inputs_ahead, self.settings.take_together)
        code.items += [
            f"// {lanes} lanes a unit: each holds its {KL} of K of the unit's {G} rows of R in registers; the sums",
            "// meet through shuffles and every lane applies the cell: one barrier a position",
            f"const int rcl = tid % {lanes}, rcg = tid / {lanes};",
            f"const int rcb = rcg / {H}, rcj = rcg - rcb * {H}, rcu = rcj;",
            f"{ring.declaration}  // the inputs of the next position{ring.ahead_text}",
            f"if (tid < {active}) {{",
            *(f"    {line}" for line in ring.first_loads()),
            "}",
            "__syncthreads();  // R, h and c in shared memory",
            f"float rw[{G * KL}];",
        ]
        fill = Code(f"if (tid < {active})")
        fill.items += [
            "#pragma unroll",
            f"for (int q = 0; q < {G * KL}; ++q) rw[q] = rR[(rcl * {KL} + q % {KL}) * {stride} + (q / {KL}) * {H} + rcj];",
        ]
        code.items.append(fill)
        if node.cell == "lstm":
            code.items.append(f"float rcc = tid < {active} ? rC[rcb * {H} + rcj] : 0.0f;  // c of the unit")
        if w_bias is not None:
            code.items += [
                f"const float rbg{g} = tid < {active} ? __ldg(ffk_w + {w_bias} + {g * H} + rcu) : 0.0f;"
                for g in range(G)
            ]
        outer, loop = _position_loop(T, ring.ahead)
        code.items += [_ONCE, outer]
        step = Code(f"if (tid < {active})")
        step.items += [
            f"const float* const hv = rH + (rcs & 1) * {h_floats} + rcb * {H} + rcl * {KL};",
            "float " + ", ".join(f"a{g} = 0.0f" for g in range(G)) + ";",
            "#pragma unroll",
            f"for (int k = 0; k < {KL}; k += 4) {{",
            "    const float4 v = ffk_ld4(hv + k);",
            *(
                f"    a{g} += rw[{g * KL} + k] * v.x; a{g} += rw[{g * KL} + k + 1] * v.y; "
                f"a{g} += rw[{g * KL} + k + 2] * v.z; a{g} += rw[{g * KL} + k + 3] * v.w;"
                for g in range(G)
            ),
            "}",
            "#pragma unroll",
            f"for (int o = {lanes // 2}; o > 0; o >>= 1) {{  // whole warps: {active} threads, {lanes} lanes a unit",
            *(f"    a{g} += __shfl_xor_sync(0xffffffffu, a{g}, o);" for g in range(G)),
            "}",
            *ring.take_and_reload(),
        ]
        body = Code()
        step.items.append(body)
        em = Emitter(self, t, task, body)
        em.stack[0].guard = True
        rs = [f"(a{g} + rbg{g})" if w_bias is not None else f"a{g}" for g in range(G)]
        xs = [f"rxv{g}" for g in range(G)]
        publish = Code("if (rcl == 0)")
        flat = f"(rcs * {B} + rcb) * {S * H} + rcu"
        for line in self._cell(node, xs, rs, "rcc", f"rH[(rcs & 1) * {h_floats} + rcb * {H} + rcu]"):
            em.top.insert(line)
        if node.cell == "lstm":
            publish.items += self.stores(node, f"{flat} + {H}", "c")
        publish.items += self.stores(node, flat, "h")
        publish.items.append(f"rH[((rcs + 1) & 1) * {h_floats} + rcb * {H} + rcu] = h;")
        body.items.append(publish)
        loop.items += [step, "__syncthreads();  // h of this position in shared memory, the other buffer free"]

    def _delta(self, code: Code, t: int, task: Task) -> None:
        """A delta-rule window (ir.DeltaScan, schedule._delta_task): the block's state rows of one
        head. The head's k, q, v and gates over the whole window are staged once (one call, every
        load in flight together); then a warp takes a row, its Dk values in the lanes' registers,
        and runs the positions in order: S·k and the updated row against q are reductions over
        the lanes, the update the op's own step function. No barrier inside the loop."""
        node: DeltaScan = task.root
        B, Hh, Dv, width = node.shape
        T, Dk = node.steps, node.k.shape[3]
        per_block = task.chunk
        per_head = -(-Dv // per_block)
        spec = EW[node.op]
        self.need_header(spec.header)
        lay = self.layout
        base = self.arena_offset
        offsets = {}
        for name, n in delta_smem_parts(node):
            offsets[name] = base
            base += n
        lanes = -(-Dk // 32)
        code.items += [
            f"// delta-rule window {node.op} over {T} positions: this block's {per_block} of {Dv} state rows "
            f"of one head, a warp a row",
            "__syncthreads();  // the previous task's readers of shared memory are done",
            f"const int dhead = {_block_in_task(task)} / {per_head}, di0 = ({_block_in_task(task)} % {per_head}) * {per_block};",
            f"const int dsb = dhead / {Hh}, dsh = dhead % {Hh};",
            "(void)dsb; (void)dsh;",
        ]
        b_var, h_var = ix.Var("dsb", B), ix.Var("dsh", Hh)
        pos = ix.Var("dst", T)
        sources = [("k", node.k, Dk), ("q", node.q, Dk), ("v", node.v, Dv)] + [
            (f"g{i}", gate, 0) for i, gate in enumerate(node.gates)
        ]
        ranges = []
        for name, value, inner in sources:
            n = T * max(inner, 1)
            direct = task.view.source_kind(value) == "materialized" and value.id not in self.sched.layouts
            if direct:
                ranges.append((f"ffk_smem + {offsets[name]}", f"ffk_ll + {lay.ll[value.id]} + dhead * {n}", str(n)))
                continue
            loop = Code(f"for (int e = tid; e < {n}; e += NT)")
            if inner:
                loop.items.append(f"const int dst = e / {inner}, dsj = e - dst * {inner};")
                index = [b_var, h_var, pos, ix.Var("dsj", inner)]
            else:
                loop.items.append("const int dst = e;")
                index = [b_var, h_var, pos]
            self._value_into(t, task, loop, value, index, f"ffk_smem[{offsets[name]} + e]")
            code.items += [_ONCE, loop]
        code.items += self._stage_ranges(ranges, len(ranges)) if ranges else []
        code.items.append("__syncthreads();")
        sK, sQ, sV = (f"(ffk_smem + {offsets[name]})" for name in ("k", "q", "v"))
        rows = Code(f"for (int dr = warp; dr < min({per_block}, {Dv} - di0); dr += NWARPS)")
        code.items += [_ONCE, rows]
        rows.items += ["const int dsi = di0 + dr;", f"float s[{lanes}];"]
        init = Code(f"for (int m = 0; m < {lanes}; ++m)")
        init.items.append("const int dsj = lane + 32 * m;")
        guarded = Code(f"if (dsj < {Dk})")
        init.items += ["s[m] = 0.0f;", guarded]
        self._value_into(t, task, guarded, node.init, [b_var, h_var, ix.Var("dsi", Dv), ix.Var("dsj", Dk)], "s[m]")
        rows.items += ["#pragma unroll", init]
        loop = Code(f"for (int dst = 0; dst < {T}; ++dst)")
        rows.items += [_ONCE, loop]
        gates = [f"ffk_smem[{offsets[f'g{i}']} + dst]" for i in range(len(node.gates))]
        loop.items += [
            f"const float* const kt = {sK} + dst * {Dk};",
            f"const float* const qt = {sQ} + dst * {Dk};",
            f"const float vi = {sV}[dst * {Dv} + dsi];",
            "float sk = 0.0f;",
            "#pragma unroll",
            f"for (int m = 0; m < {lanes}; ++m) if (lane + 32 * m < {Dk}) sk += s[m] * kt[lane + 32 * m];",
            "#pragma unroll",
            "for (int o = 16; o > 0; o >>= 1) sk += __shfl_xor_sync(0xffffffffu, sk, o);",
            "float o_ = 0.0f;",
            "#pragma unroll",
            f"for (int m = 0; m < {lanes}; ++m) {{",
            f"    if (lane + 32 * m < {Dk}) {{",
            f"        s[m] = {spec.c(['s[m]', *gates, 'kt[lane + 32 * m]', 'vi', 'sk'], ())};",
            "        o_ += s[m] * qt[lane + 32 * m];",
            "    }",
            "}",
            "#pragma unroll",
            "for (int o = 16; o > 0; o >>= 1) o_ += __shfl_xor_sync(0xffffffffu, o_, o);",
        ]
        row_flat = f"((dhead * {Dv} + dsi) * {width})"
        loop.items.append(Code("if (lane == 0)"))
        loop.items[-1].items += self.stores(node, f"{row_flat} + dst", "o_")
        final = Code(f"for (int m = 0; m < {lanes}; ++m)")
        final.items.append(Code(f"if (lane + 32 * m < {Dk})"))
        final.items[-1].items += self.stores(node, f"{row_flat} + {T} + lane + 32 * m", "s[m]")
        rows.items += ["#pragma unroll", final]

    def _body_loop(self, code: Code, t: int, task: Task) -> None:
        """A loop over a general body (ir.BodyLoop, schedule.body_plan) on the task's one block.
        Before the loop: the held weights, the fixed inputs, h0 and the windows (whole, or the
        first position's rows) into shared memory. Each position: the kept body values a level at
        a time (a barrier after each), a level's products and reductions side by side on segments
        of lanes (_body_warps), the rest a thread an element with everything not kept inlined; then
        the new h into the other buffer and its stores, beside the next position's rows of the
        windows not staged whole (into their other buffers), and a barrier."""
        node: BodyLoop = task.root
        plan = body_task_plan(task)
        T, H = node.steps, node.carried.size
        base = self.arena_offset
        offsets = {}
        for name, n in plan.parts:
            offsets[name] = base
            base += n
        h_floats = dict(plan.parts)["h"] // 2
        held_dots = sum(isinstance(n, Dot) and n.id in plan.held for n in plan.kept)
        in_registers = sum(isinstance(n, Dot) and plan.level[n.id] in plan.registers for n in plan.kept)
        code.items += [
            f"// body loop over {T} positions on one block: {len(plan.kept)} kept values in {plan.levels} "
            f"level(s) a position, h [{H}] in shared memory; weights: {in_registers} product(s)' in registers, "
            f"{held_dots} product(s)' and {len(plan.held) - held_dots} other(s) in shared memory",
            "__syncthreads();  // the previous task's readers of shared memory are done",
            f"float* const bH = ffk_smem + {offsets['h']};  // h of the position before, the new h: two buffers",
        ]
        places: dict[int, str] = {node.carried.id: "bh"}
        for i, slot in enumerate(node.slots):
            what = "whole" if i in plan.whole else "two rows"
            code.items.append(f"float* const bU{i} = ffk_smem + {offsets[f'u{i}']};  // window {i}: {what}")
            places[slot.id] = f"bu{i}"
        for i, slot in enumerate(node.fixed_slots):
            code.items.append(f"float* const bF{i} = ffk_smem + {offsets[f'f{i}']};  // fixed input {i}")
            places[slot.id] = f"bF{i}"
        for kept in plan.kept:
            if f"n{kept.id}" in offsets:
                code.items.append(f"float* const bN{kept.id} = ffk_smem + {offsets[f'n{kept.id}']};")
                places[kept.id] = f"bN{kept.id}"
        body_leaves = {n.id: n for n in node.body_nodes() if isinstance(n, Leaf)}
        for did, stride in plan.held.items():
            if did in body_leaves:  # a bias, a norm's scale: read in place from shared memory
                leaf = body_leaves[did]
                code.items.append(
                    f"float* const bL{did} = ffk_smem + {offsets[f'w{did}']};  // {leaf.label or leaf.name}"
                )
                load = Code(f"for (int i = tid; i < {leaf.size}; i += NT)")
                load.items.append(f"bL{did}[i] = __ldg(ffk_w + {self.layout.weights[did]} + i);")
                code.items += ["#pragma unroll 4", load]
                places[did] = f"bL{did}"
                continue
            dot = next(n for n in plan.kept if n.id == did)
            code.items.append(
                f"float* const bW{did} = ffk_smem + {offsets[f'w{did}']};  // weights of {_name(dot)}, rows of {stride}"
            )
            source = f"ffk_w + {self.layout.weights[dot.weight.id]}"
            if dot.k % 4 == 0:  # float4 loads, 8 in flight a thread (a load waited for one at a time: ~10 us)
                load = Code(f"for (int i = 4 * tid; i < {dot.n * dot.k}; i += 4 * NT)")
                load.items += [
                    f"const float4 q = __ldg(reinterpret_cast<const float4*>({source} + i));",
                    f"float* const d = bW{did} + (i / {dot.k}) * {stride} + i % {dot.k};",
                    "d[0] = q.x; d[1] = q.y; d[2] = q.z; d[3] = q.w;",
                ]
            else:
                load = Code(f"for (int i = tid; i < {dot.n * dot.k}; i += NT)")
                load.items.append(f"bW{did}[(i / {dot.k}) * {stride} + i % {dot.k}] = __ldg({source} + i);")
            code.items += ["#pragma unroll 8", load]

        def fill(scope: Code, value: Node, lead: list, target: str, size: int) -> None:
            loop = Code(f"for (int e = tid; e < {size}; e += NT)")
            index = lead + ix.unflatten(ix.Var("e", max(size, 1)), value.shape[len(lead) :])
            self._value_into(t, task, loop, value, index, f"{target}[e]")
            scope.items += [_ONCE, loop]

        for i, value in enumerate(node.fixed):
            fill(code, value, [], f"bF{i}", value.size)
        fill(code, node.h0, [], "bH", H)
        self._clock(code, t, 0)
        for i, (slot, window) in enumerate(zip(node.slots, node.windows)):
            runs = self._flagged_runs(task, window) if i in plan.whole else None
            if runs is not None:  # every thread's loads in flight together, not one round trip an element
                code.items.append(f"// window {i}: {len(runs)} run(s) of flag-tagged words, staged together")
                code.items += self._stage_ranges(
                    [(f"bU{i} + {dst}", f"ffk_ll + {src}", str(n)) for dst, src, n in runs], BODY_STAGE_RUNS
                )
            elif i in plan.whole:
                fill(code, window, [], f"bU{i}", window.size)
            else:
                fill(code, window, [ix.const(0)], f"bU{i}", slot.size)
        for lv, floats in sorted(plan.registers.items()):
            self._body_register_rows(code, lv, floats, [n for n in plan.kept if plan.level[n.id] == lv], plan)
        code.items.append("__syncthreads();")
        self._clock(code, t, 1)
        loop = Code(f"for (int bls = 0; bls < {T}; ++bls)")
        code.items += [_ONCE, loop]
        middle = Code(f"if (bls == {T // 2})")  # trace: the phases of the middle position
        self._clock(middle, t, 2)
        loop.items += [
            f"const float* const bh = bH + (bls & 1) * {h_floats};",
            f"float* const bn = bH + ((bls + 1) & 1) * {h_floats};",
        ]
        for i, slot in enumerate(node.slots):
            rows = slot.size if i in plan.whole else _align4(slot.size)
            loop.items.append(
                f"const float* const bu{i} = bU{i} + {'bls' if i in plan.whole else '(bls & 1)'} * {rows};"
            )
        warp_root = isinstance(node.body, (Dot, Reduce))  # a body that is a product: computed, then copied
        for level in range(1, plan.levels + warp_root):
            if level > 1 and self.trace:
                middle = Code(f"if (bls == {T // 2})")
                self._clock(middle, t, 1 + level)
                loop.items.append(middle)
            elif self.trace:
                loop.items.append(middle)
            members = [n for n in plan.kept if plan.level[n.id] == level]
            reducing = [n for n in members if isinstance(n, (Dot, Reduce))]
            if reducing:
                self._body_warps(loop, t, task, reducing, places, plan)
            for kept in members:
                if not isinstance(kept, (Dot, Reduce)):
                    self._body_thread_value(loop, t, task, kept, places, places[kept.id])
            loop.items.append("__syncthreads();")
        if self.trace:
            before = Code(f"if (bls == {T // 2})")
            self._clock(before, t, 1 + plan.levels + warp_root)
            loop.items.append(before)
        loop.items.append("// the new h, stored; the next position's window rows beside it")
        root = Code(f"for (int e = tid; e < {H}; e += NT)")
        em = _BodyEmitter(self, t, task, root, places)
        value = em.value(node.body, ix.unflatten(ix.Var("e", max(H, 1)), node.body.shape), expand_self=not warp_root)
        em.top.insert(f"bn[e] = {value.text};")
        for stmt in self.stores(node, f"bls * {H} + e", value.text):
            em.top.insert(stmt)
        loop.items += [_ONCE, root]
        ahead = [i for i in range(len(node.slots)) if i not in plan.whole]
        if ahead:
            nxt = Code(f"if (bls + 1 < {T})")
            nxt.items.append("const int blx = bls + 1;")
            for i in ahead:
                slot, window = node.slots[i], node.windows[i]
                fill(nxt, window, [ix.Var("blx", T)], f"(bU{i} + (blx & 1) * {_align4(slot.size)})", slot.size)
            loop.items.append(nxt)
        loop.items.append("__syncthreads();")
        if self.trace:
            last = Code(f"if (bls == {T // 2})")
            self._clock(last, t, 2 + plan.levels + warp_root)
            loop.items.append(last)
        self._clock(code, t, 3 + plan.levels + warp_root)

    def _flagged_runs(self, task: Task, value: Node) -> list[tuple[int, int, int]] | None:
        """``value``'s elements in order as runs of consecutive flag-tagged words ``(first element,
        first word, count)`` — a materialized value (or a graph input's flagged copy) read through
        views, or a Concat along the first axis of such — or None (a value computed on the way, a
        reordered copy, more than BODY_STAGE_RUNS runs)."""
        view = task.view
        if isinstance(value, Concat) and value.axis == 0 and view.source_kind(value) != "materialized":
            row = value.size // max(value.shape[0], 1)
            parts = [(src, off * row) for src, off in zip(value.srcs, value.offsets)]
        else:
            parts = [(value, 0)]
        runs: list[tuple[int, int, int]] = []
        for part, dst in parts:
            variables, env = index_grid(part.shape)
            node, index = part, list(variables)
            while isinstance(node, Map) and view.source_kind(node) != "materialized":
                node, index = node.src, node.source_index(index)
            if not (
                view.source_kind(node) == "materialized"
                and node.id in self.layout.ll
                and self.sched.layouts.get(node.id) is None
            ):
                return None
            words = np.broadcast_to(ix.evaluate(ix.flatten(index, node.shape), env), (part.size,)).astype(np.int64)
            if words.size == 0 or not np.array_equal(words, words[0] + np.arange(words.size)):
                return None
            first = self.layout.ll[node.id] + int(words[0])
            if runs and runs[-1][0] + runs[-1][2] == dst and runs[-1][1] + runs[-1][2] == first:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + int(words.size))
            else:
                runs.append((dst, first, int(words.size)))
        return runs if len(runs) <= BODY_STAGE_RUNS else None

    def _body_thread_value(self, code: Code, t: int, task: Task, node: Node, places: dict, target: str) -> None:
        loop = Code(f"for (int e = tid; e < {node.size}; e += NT)")
        em = _BodyEmitter(self, t, task, loop, places)
        value = em.value(node, ix.unflatten(ix.Var("e", max(node.size, 1)), node.shape), expand_self=True)
        em.top.insert(f"{target}[e] = {value.text};")
        code.items += [f"// kept {_name(node)} {list(node.shape)}, a thread an element", _ONCE, loop]

    @staticmethod
    def _body_segments(nodes: list, lanes: int) -> tuple[list[int], int]:
        """Where each node's elements start among a level's segments (whole warps a node), and
        the segments in all."""
        per_warp = WARP_LANES // lanes
        starts, total = [], 0
        for n in nodes:
            starts.append(total)
            total += -(-n.size // per_warp) * per_warp
        return starts, total

    def _body_register_rows(self, code: Code, level: int, floats: int, nodes: list, plan) -> None:
        """Each thread's part of its product row for a level whose products keep their weights in
        registers (schedule.BODY_REGISTER_WEIGHTS): read from global memory once, before the loop."""
        nodes = [n for n in nodes if isinstance(n, (Dot, Reduce))]
        lanes = plan.lanes[level]
        starts, total = self._body_segments(nodes, lanes)
        code.items.append(f"float bq{level}[{floats}];  // level {level}: this thread's weights of its product")
        block = Code("")
        block.items.append(f"const int bg = tid / {lanes}, bp = tid % {lanes};")
        for i, n in enumerate(nodes):
            end = starts[i + 1] if i + 1 < len(nodes) else total
            branch = Code(f"{'else ' if i else ''}if (bg < {end})")
            block.items.append(branch)
            if not isinstance(n, Dot):
                continue
            branch.items += [
                f"const int e = bg - {starts[i]};",
                f"const float* const w = ffk_w + {self.layout.weights[n.weight.id]} + (e % {n.n}) * {n.k};",
                "#pragma unroll",
                f"for (int j = 0; j < {floats}; ++j) bq{level}[j] = e < {n.size} && bp + {lanes} * j < {n.k} "
                f"? __ldg(w + bp + {lanes} * j) : 0.0f;",
            ]
        code.items.append(block)

    def _body_warps(self, code: Code, t: int, task: Task, nodes: list, places: dict, plan) -> None:
        """A level's products and reductions of a body, side by side: ``lanes`` lanes an element
        (schedule._body_lanes), each node's elements on warps of their own (so a warp's segments
        reduce with one op), the segment's lanes splitting the extent, combined by shuffles."""
        level = plan.level[nodes[0].id]
        lanes = plan.lanes[level]
        starts, total = self._body_segments(nodes, lanes)
        registers = level in plan.registers
        step = self.threads // lanes
        names = ", ".join(_name(n) for n in nodes)
        code.items.append(f"// kept {names}: {lanes} lane(s) an element, side by side")
        loop = Code(f"for (int bg0 = 0; bg0 < {total}; bg0 += {step})")
        code.items += [_ONCE, loop]
        loop.items.append(f"const int bg = bg0 + tid / {lanes}, bp = tid % {lanes};")
        for i, n in enumerate(nodes):
            end = starts[i + 1] if i + 1 < len(nodes) else total
            branch = Code(f"{'else ' if i else ''}if (bg < {end})")
            loop.items.append(branch)
            branch.items.append(f"const int e = bg - {starts[i]};")
            em = _BodyEmitter(self, t, task, branch, places)
            em.stack[0].guard = True
            em.top.pos = len(branch.items)
            var = ix.Var("e", max(n.size, 1))
            index = ix.unflatten(var, n.shape)
            acc = em.fresh("acc")
            if isinstance(n, Dot):
                op, extent = "sum", n.k
                if registers:
                    weights, read = f"bq{level}", "{w}[{j}]"
                elif n.id in plan.held:
                    weights = f"bW{n.id} + (e % {n.n}) * {body_row_stride(n.k, lanes)}"
                    read = "{w}[{r}]"
                else:
                    weights = f"ffk_w + {self.layout.weights[n.weight.id]} + (e % {n.n}) * {n.k}"
                    read = "__ldg({w} + {r})"
                if not registers:
                    em.top.insert(f"const float* const {acc}w = {weights};")
            else:
                op, extent = n.op, n.extent
            em.top.insert(f"float {acc} = {REDUCE_INIT[op]};")
            work = Code(f"if (e < {n.size})")
            em.top.insert(work)
            inner_em = _BodyEmitter(self, t, task, work, places)
            inner_em.names = em.names
            r, j = ix.Var(inner_em.fresh("r"), extent), inner_em.fresh("j")
            outer, inner = _lane_loop(r, j, unroll=None if registers else 8, lanes=lanes, lane="bp")
            inner_em.top.open_child(outer)
            inner_em.stack.append(inner)
            if isinstance(n, Dot):
                src = inner_em.value(n.src, index[:-1] + [r])
                term = f"{src.text} * {read.format(w=weights if registers else f'{acc}w', r=r.name, j=j)}"
            else:
                term = inner_em.value(n.src, n.source_index(index, r)).text
            inner_em.stack[-1].insert(_accumulate(op, acc, term))
            inner_em.stack.pop()
            inner_em.top.close_child(outer)
            if lanes > 1:
                em.top.insert(f"{acc} = ffk_seg_{op}<{lanes}>({acc});")
            em.top.insert(f"if (bp == 0 && e < {n.size}) {places[n.id]}[e] = {acc};")

    def stored_c(self, node: Node, flat) -> str | None:
        """C for where element ``flat`` (an IExpr) of ``node`` lies in its flag-tagged copy when
        that is stored in another order than its own (schedule.column_layouts), else None."""
        order = self.sched.layouts.get(node.id)
        if order is None:
            return None
        return ix.to_c(stored_flat(node, ix.unflatten(flat, node.shape), order))

    def _warp_root(self, task: Task, unit: Unit) -> bool:
        """A root whose elements each reduce over a long extent (a delta-rule row: S·k over the
        state's columns, then the updated row against q) with few elements a block runs a warp
        per element, the reductions split over the lanes, instead of a thread per element looping
        over the extent alone while the block's other warps idle (measured: 5 us a level)."""
        if task.chunk > 2 * (self.threads // 32):
            return False
        return any(occ.loops and occ.loops[0].extent >= WARP_SPLIT_MIN for occ in unit.occurrences)

    def stores(self, node: Node, flat: str, value: str, stored: str | None = None) -> list[str]:
        """The stores of element ``flat`` of ``node``: graph outputs and next states in their own
        order, the flag-tagged copy at ``stored`` (its stored order, see schedule.column_layouts;
        default ``flat``)."""
        out = []
        for name in self.sched.destinations.get(node.id, []):
            if name in self.output_names:
                self.host_tasks.add(self._t)
                if self.tagged_outputs:
                    out.append(f"ffk_store_host_word(out{self.output_names.index(name)} + ({flat}), {value}, epoch);")
                else:
                    out.append(f"out{self.output_names.index(name)}[{flat}] = {value};")
            else:
                state = next(s for s, o in self.program.state_of.items() if o == name)
                out.append(f"sout{self.state_names.index(state)}[{flat}] = {value};")
        if node.id in self.layout.ll:
            at = flat if stored is None else stored
            out.append(f"ffk_ll_store(ffk_ll + {self.layout.ll[node.id]} + {at}, {value}, epoch);")
        return out

    def need_header(self, path: Path | None) -> None:
        if path is not None and path not in self.headers:
            self.headers.append(path)


# An element loop runs once or twice a thread (or warp) at batch 1: unrolling it only adds code,
# and the code is fetched again on every launch (H100: ~0.04 us per KB of straight-line code).
_ONCE = "#pragma unroll 1"
BODY_STAGE_RUNS = 4  # a body loop's whole window staged with batched loads when it is at most this many runs
# a root reduction at least this long is split over a warp's lanes: 16 since session 68 (mamba's
# and jamba's SSM roots, 16 states, were a thread per channel; H100 resident p50 / p99 us, g37:
# mamba 16.9 / 18.0 against 17.3 / 19.3, jamba 15.3 / 16.1 against 15.4 / 16.3; no other zoo
# source changes)
WARP_SPLIT_MIN = 16
WARP_LANES = 32
SEGMENTED_REDUCE = True  # reduction arrays with more elements than a block's warps share the warps out
# A segmented reduction walks its extent in pairs of halves (see Generator._segmented_reduce):
# 7.9 instead of 10.4 instructions a product in attention's scores, but on the H100 (device time,
# bench/h100/2026-11-26-s17/variants-walk.json) attention 15.85/15.97 vs 16.10 us, GPT-2 13.57/13.56
# vs 13.44, Llama 14.32/14.44 vs 14.23, Jamba 18.16/18.06 vs 18.05: no consistent gain, so off
PAIRED_WALK = False
# A segmented sum of products of two shared-memory rows that are contiguous and 16-byte aligned
# along the reduced axis reads them as float4s (Generator._vector_walk): attention's scores
VECTOR_WALK = True
# A warp-per-element reduction over a warp's 32 positions computes the next phase's elementwise
# unit over its rows in the same warp (Generator._row_followers: attention's softmax weights beside
# its row max, a phase and a barrier less). Not measured yet on the GPU: off, variant `row-followers`
ROW_FOLLOWERS = False
# A task's shared-memory array that is a view of another of the task's arrays at a constant offset
# (a product's input rows cut out of the staged frame [x, scalars of x], or read through a reshape)
# is read where that array lies instead of being copied (Generator._task_views): the copy's phase
# and its barrier go, and its readers move a phase up (Generator._unit_phases). Statically, the
# zoo's step kernels at embed 256 on the H100's grid (Kernel.kernel_phases): 436 -> 399 phases in
# all (lstm and gru 18 -> 15, min_gru 21 -> 19, mamba 53 -> 49, xlstm 77 -> 69; 4 of the 37 because
# the recomputed phases put a staged copy beside the units that read nothing, not a phase after
# them); the zoo's sequence forms have no such view. Not timed alone on a GPU yet (only inside the
# stepkernel-fewer-phases tactics, see PHASE_ONE_PASS): off, the build's stepkernel-views tactic
# (generate(alias_views=True)) and stepkernel_variants.py's `alias-views`
ALIAS_VIEWS = False
# A phase's warp-per-element arrays (products, reductions) taken together run in fewer passes of
# the block's warps where fewer lanes an element allow it, each array on warps of its own
# (Generator._one_pass_lanes): a phase of ten products of 256 on eight warps was two passes of a
# warp a product, and is one of half-warps. Timed on a GPU only inside the build's
# stepkernel-fewer-phases tactics (generate(one_pass=True) with ROOT_IN_ARRAY_WARP and the views;
# H100, sessions 53-54: faster in every zoo step kernel, slower for Llama at T = 1 and the lstm
# window, engines/fusion.STEPKERNEL_FEWER_PHASES): off, a tactic the build times per model;
# stepkernel_variants.py's `phase-one-pass`, `one-pass`, `fewer-phases` time the parts
PHASE_ONE_PASS = False
# A task's root that reads, of the phase before it, only one product or reduction, element for
# element, is computed by the lane that stores that element (Generator._root_array): the root's
# phase and its barrier go (mamba's x_proj tasks, xLSTM's gate products: a root that publishes its
# product). Timed on a GPU only inside the stepkernel-fewer-phases tactics (see PHASE_ONE_PASS):
# off; variant `root-in-warp` times it alone
ROOT_IN_ARRAY_WARP = False
# ... and a thread's own sum over positions with a factor contiguous along them (attention's P·V
# and softmax sum read the weights four at a time, P·V over the prefix where V comes from the cache;
# Emitter._vector_sum). Not measured yet: off, variant `vector-reduce`
VECTOR_REDUCE = False
# A thread's own sum over positions whose reads put a warp's lanes on one shared-memory bank
# (attention's scores at T > 1: lane l reads key row l of a [T, 3·D] or [T, D] array, rows a
# multiple of 32 floats apart, so the 32 lanes wait on one bank each position) starts at position
# e % n and wraps (Emitter._reduce): the lanes read 32 different banks. The vector walk does the
# same with its float4 chunks. Off by default (H100, session 30: faster for the zoo's attention,
# Jamba and GPT-2 windows, slower for Llama's): the build times it as tactics (engines.fusion
# STEPKERNEL_SKEWED, STEPKERNEL_WIDE_SKEWED), which pass generate(skewed_sums=True)
SKEWED_SUM_WALK = False
SKEW_SAMPLE_WARPS = 16  # warps of consecutive elements whose banks _bank_skew checks
VECTOR_CHECK_LIMIT = 1 << 22  # elements x extent checked numerically for the float4 walk, at most
SEGMENTED_DOT = True  # product arrays of short rows, more rows than warps: segments of lanes a row
# A product array whose elements all read one x row (batch 1: a [1, N] product) and whose rows are
# long (DOT_X_MIN_K..DOT_X_MAX_K floats, a multiple of 4, fp32 weight rows) is computed a warp per
# element with x loaded into registers once per warp (ffk_load_x / ffk_warp_dot_x), instead of
# segments of a few lanes a row that each read x again: a row's product then reads only its 16-byte
# weight loads. Why: mamba's replicated x_proj phase (stepkernel-fewer-levels: 48 products of 512
# a block, 4 lanes a row in one pass) read x once per row and its rows 2048 bytes apart in one bank
# group, 2,757-3,337 cycles on the H100 (session 53) against ~800 for its 96 KB of weights alone.
# Measured slower but there (session 58, bench/h200/2026-12-06-s58/, H200 device time without /
# with): fewer-levels mamba 18.85 / 18.53 us, jamba 19.42 / 21.14, delta_net 19.10 / 20.25; the
# plain kernel on 16 blocks mamba 22.30 / 24.23, lstm 16.27 / 17.75, min_gru 11.12 / 11.42. A warp
# a row pays its five shuffles row after row; the segments' fewer loads were not what cost. Off.
DOT_X_IN_REGISTERS = False
DOT_X_MIN_K = 256  # a shorter row's x is a float4 or less a lane: nothing to save
DOT_X_MAX_K = 1024  # 8 float4s (32 registers) a lane
SEGMENT_ONE_PASS = True  # ... as few lanes a row as lets the block's warps take its rows in one pass
SEGMENT_MIN_LANES = 4  # ... but no fewer than this
COMPUTE_BEFORE_STAGE = True  # a phase's units that read no flagged value run before its staging
# The frame task publishes the frame's x words as soon as it holds them, before it computes the
# scalars of x (the first LayerNorm's 1 / sigma, simplify.PublishFrameScalars), so the tasks that
# read x alone (delta_net's in_proj and k_proj) no longer wait for the scalars' dot, sum and root
# phases (min_gru's frame block, H100 trace: 186 / 593 / 324 / 192 cycles). H100, session 66
# (bench/h100/2026-12-07-s66/g27/), device time of the fewer-phases kernel, without / with:
# delta_net 15.68, 15.54 / 14.55, 14.62 us, liquid 13.42, 14.08 / 13.26, 13.52, but gru 9.30,
# 9.32 / 9.75, 9.47, lstm 9.34, 9.35 / 9.41, 9.43, attention 13.72, 13.69 / 13.81, 13.78, mamba
# 17.82, 17.78 / 17.89, 17.97: off, the build's tactic stepkernel-fewer-phases-early-frame.
EARLY_FRAME_WORDS = False
# ... and a reader whose products read x while only a later phase reads the scalars stages the x
# words first and the scalars at the end of the phase before that reader (Generator._late_frame_scalars).
# Slower (g27, device time with it): gru 9.44, 9.27, lstm 9.92, 9.77, attention 14.00, 14.08,
# mamba 18.24, 18.18 us (against the figures above): off, variant `early-frame-late-scalars`.
FRAME_SCALARS_LATE = False
STAGGER_WARPS = True  # the warp-per-element arrays of a phase start on different warps (see _first_warp)
# commit groups issued in the prologue; each later one is issued before the task a group ahead of
# its own, so its copies are in flight while that task waits for its inputs
PROLOGUE_GROUPS = 2
# the resident kernel: every group's copies issued while the frame is awaited, none between its
# tasks, in a kernel with at least this many commit groups (None: never, 0: always). Each copy has
# a shared-memory region of its own and a frame reads the state the last one wrote (the other
# half), so the copies may land any time before their task. Why: session 69's resident trace of
# mamba had each block enter its next task ~0.25 us later for every commit point it passed after
# its last one (blocks 0-15 at +0.26 us, 16-31 +0.5, 32-47 +0.8-1.0 after Slice_2, though their
# copies then are a few state floats or weight rows the resident kernel skips).
# H100, p50 us with copies between tasks / all at start, 2 rounds each, two processes (session 69,
# bench/h100/2026-12-07-s69/g42/; session 70, bench/h100/2026-12-07-s70/g43/):
#   xlstm (15 groups) 19.9 -> 18.0, 19.2 -> 17.7; attention (13) 13.0 -> 12.7, 13.2 -> 12.8;
#   jamba (13) 14.9 -> 14.4, 15.0 -> 14.7; mamba (12) 17.5 -> 16.4, 17.6 -> 16.6;
#   but delta_net (9) 14.5 -> 14.9, 14.6 -> 14.9; gated_ssm (7) 9.8 -> 10.2; liquid (6) 12.1 -> 13.0,
#   12.0 -> 12.9; min_gru (4) 9.2 -> 9.8, 10.1 -> 11.0; min_lstm (4) 10.1 -> 11.4; gru and lstm (2)
#   mixed (7.8 -> 7.7, 9.0 -> 8.7; 9.4 -> 8.4). Every kernel with 10 or more groups gained in both
#   runs (and in g44's third, bench/h100/2026-12-07-s70/g44/), min_gru, liquid and delta_net (4-9)
#   lost in both, gated_ssm and min_lstm in the one run that had them.
RESIDENT_COPIES_AT_START_GROUPS: int | None = 10
# the resident kernel: weight rows copied into shared memory on the first frame only; the first
# groups' copies issued while the frame is awaited, not after it rang
RESIDENT_WEIGHTS_ONCE = True
RESIDENT_PREFETCH_EARLY = True
# the resident kernel's frame inputs are words (epoch << 32) | float bits in mapped host memory:
# the blocks that read the frame poll those words themselves instead of waiting for the go, which
# the leader publishes only after its own poll of the bell answered (one host round trip and one
# L2 hop less on the frame's path; see Generator._resident_loop)
# H200 (session 46, bench/h200/2026-12-04-s46): resident Session.step p50 lstm 11.0 -> 10.0 us, gru
# 10.6 -> 9.4, min_gru 12.5 -> 10.5, min_lstm 12.2 -> 11.0, attention 17.0 -> 16.6; outputs equal bit for bit
RESIDENT_TAGGED_FRAMES = True
# ... and a frame block publishes the go itself once its words are in, while the leader takes
# either its bell or that go: the resident trace (session 68, H100, bench/stepkernel.py
# --trace-resident) had the frame block through its task 1.8-2.6 us before the other blocks had
# the leader's go (mamba, xlstm, attention; jamba 0.5)
RESIDENT_FRAMER_GO = True
# ... and the leader is the block that joins the frame last (Generator._leader): its poll of the
# bell may be a host round trip long when the frame block's go comes (session 68's trace of mamba
# with the framer's go: block 0, the leader, entered the first 128-block task ~1 us after the rest).
# H100 (session 68, g37, resident p50 / p99 us, against the first frame-free block): min_gru 9.1 / 10.5
# against 9.7 / 10.3, lstm 8.3 / 9.2 against 8.8 / 9.5, attention 13.1 / 13.9 against 13.6 / 14.1,
# mamba 16.9 / 19.3 against 17.3 / 19.3: p50 0.2-0.6 lower on 10 of 11; xlstm 19.7 / 24.4 against
# 19.5 / 20.1, where every block joins at level 1 or 2 and the rule now keeps the first block
RESIDENT_LEADER_LAST = True
# A resident kernel's two waits for a frame issue their next poll before they look at the stop
# word (runtime.cuh's ffk_poll_frame, ffk_wait_go under FFK_POLL_AHEAD): a frame block's poll of
# its word in host memory was a read across PCIe (~2,465 cycles on the H100) and then an acquire
# of the stop word in L2, one after the other, so it sampled the host's word every ~3,000 cycles;
# every other block's wait for the go was two L2 acquires in turn. With the stop word read
# relaxed and in flight beside the next poll, a frame is seen up to an L2 round trip sooner. Why:
# the same resident kernel's p50 moves ~1.1 us between launches with every block on the same SM
# (session 71, g48); a frame landing just after a poll waits a whole poll period, and the host's
# loop and the kernel's settle into one phase per launch. Off: timed in session 72 (H100, g50, 6
# launches each), median p50 within 0.15 us of the default on all 11 archs, median p99 worse on five
# (xlstm 19.2 -> 21.5, liquid 15.9 -> 17.1). RESIDENT_FRAMER_REPLICAS is what took the phase on.
RESIDENT_POLL_AHEAD = False
# Diagnostics: each frame block's thread 0 counts, per frame, the reads of host memory its poll took
# before its word carried the frame's epoch, into FFK_POLL_BINS histogram words after the blocks'
# SM words (ResidentStepBinding.frame_reads(), bench/microbench/resident_spread.py --reads). Why:
# if a launch's ~1.1 us slower p50 (session 70-71) is the phase of the frame block's polls against
# the host's writes, a slow launch's frames take one read more than a fast one's. Off: it changes
# the timed code (one increment a read, one atomic a frame).
RESIDENT_POLL_COUNTS = False
# Each frame block has a replica: a block with no task of its own runs the frame block's tasks as
# that block (its index, ranges and copies), polling a second copy of the frame's words that the
# host writes beside the first, RESIDENT_REPLICA_DELAY cycles behind the frame block's first poll.
# Both write the same values (flagged words, state, outputs, the go), so whichever sees the frame
# first is the frame block; the later one's stores change nothing. The words are double-buffered
# by frame (Kernel.frame_copies: [copy 0 | copy 1] x [even | odd frame] an input), so the host's next
# frame never overwrites words a late copy has yet to read: it writes frame k + 2's only after frame
# k + 1 answered, which began after every block was through frame k. Why: a frame block samples its
# words once a poll period (a read across PCIe, then the stop word in L2); the host's write lands at
# one phase of it for a whole launch, and min_gru's launches whose frames took a second read ran
# 10.24-10.34 us p50 against 9.15-9.20 for those that took one (session 72, H100,
# bench/h100/2026-12-07-s72/g52). A second poller half a period behind halves that wait: H100,
# session 72, g54, 24 launches each (4 sessions x 3 launches, twice, alternating with the default),
# median / largest launch p50 us min_gru 10.26 / 10.38 -> 9.76 / 9.84, gru 8.93 / 9.26 -> 8.30 / 8.43,
# lstm 9.38 / 9.57 -> 8.78 / 8.97 (the fast launches' 9.2, 8.0, 8.3 unchanged), median p99 14.6 ->
# 13.9, 13.1 -> 13.0, 15.0 -> 12.9. Only kernels with as many free blocks (no task, not the leader)
# as frame blocks: min_gru, min_lstm, gru, lstm, liquid and mamba at the zoo's size on 132 SMs.
RESIDENT_FRAMER_REPLICAS = True
RESIDENT_REPLICA_DELAY = 1100  # cycles: about half the default poll period (H100)
# replicas of each frame block (the copies of the frame words are one more), their first polls
# spread evenly over a poll period; 2 untimed (PCIe carries one more poller's reads)
RESIDENT_REPLICAS_PER_FRAME_BLOCK = 1
# The kernel's graph outputs as words (epoch << 32) | float bits in mapped host memory, the way the
# resident kernel's frames come in: the host spins until every output word carries the step's
# epoch, so a block that writes outputs needs neither a system fence nor a done word (the blocks
# that read a frame keep theirs: the host may not overwrite a frame they still read). Why: on the
# H100 a frame in and 256 outputs back with a system fence and a done word took 4.29 us against
# 2.98 for the frame alone (bench/microbench/host_roundtrip.cu, session 61); a fence to host memory
# waits on its stores across PCIe. Off until timed (host_roundtrip.cu's out rows, then
# resident_variants.py's tagged-outputs): engines/stepkernel.py reads the outputs either way.
TAGGED_OUTPUTS = False
# ... its store, in the source only where it is used (the other kernels' sources stay as they were;
# emu.h has the emulator's)
TAGGED_OUTPUT_STORE = """#ifndef FFK_EMULATE
// a graph output's element in mapped host memory as one word, (epoch << 32) | the float's bits
// (codegen.TAGGED_OUTPUTS): the host takes it once it carries the step's epoch, so no fence orders
// it before anything. One aligned 64-bit store: the host never sees a new epoch on an old value.
__device__ __forceinline__ void ffk_store_host_word(unsigned long long* p, float v, unsigned epoch) {
    const unsigned long long w = ((unsigned long long)epoch << 32) | __float_as_uint(v);
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
#endif"""
# Every expf of the kernel, the step functions' included, is the hardware's __expf (2 + 1.17·|x| ulp;
# exp(±inf), NaN as expf), unless compiled with -DFFK_EXACT_MATH. With the compile options of
# engine.FAST_MATH_OPTIONS: H100, 0.1-1.2 us a step (bench/h100/2026-11-26-session/). Not
# --use_fast_math: it also makes powf NaN for a negative base (GPT-2's tanh GELU cubes x) and
# sinf/cosf inaccurate far from 0.
EXP_INTRINSIC = """#ifndef FFK_EXACT_MATH
#define expf(x) __expf(x)
#endif"""
# A prefetch copy longer than this many floats is issued as pieces of it, one a warp (0: one copy
# a warp whatever its length). Faster for some models and slower for others on the H200
# (bench/h200/2026-11-26-experiments/): a tactic of the build-time selection (COPY_PIECES_TACTIC
# in engines/fusion.py), not a default.
PREFETCH_PIECE_FLOATS = 0
PREFETCH_BY_WARP = True  # the prologue's copies shared out over the warps (one copy a warp)
PREFETCH_BY_BLOCK_ORDER = True  # a block's commit slots follow its own tasks (see _segments)
# ... and each is issued a task ahead in the block's own order (_paced_points), not the kernel's:
# faster for attention and the transformers, slower for xlstm and delta_net (H100, README), so a
# tactic of the build's selection (engines/fusion.STEPKERNEL_PACED), not a default
PREFETCH_PACED = False
# When a block's first task is at most this dependency level, its copies for the tasks more than
# COPIES_AHEAD_LEVELS levels past it wait until its tasks before them are done (_deferred_points);
# 0: every copy at the commit points above. Mixed on the H100 (session 20, README), so off
COPIES_AFTER_LEVEL = 0
COPIES_AHEAD_LEVELS = 1
# ... the same for the frame's block alone (level 1, one level ahead): mixed too, off
FRAME_BLOCK_COPIES_LATE = False
RECUR_STAGE_RANGES = 12  # a recurrence's position stages at most this many ranges in one call (else one a call)
# A recurrence whose R does not fit shared memory (schedule.recur_split: hidden 1024) reads it from
# global memory each position. Off: R's own rows, a thread a row streaming along k (a warp's 32
# loads at one k in 32 rows). On: a copy of R laid out per block by k ([block][k][gate row]), so a
# warp's loads at one k are consecutive (what the held rows do in shared memory). Not yet timed.
RECUR_GLOBAL_ROWS_BY_K = False
# A recurrence on one block keeps h in shared memory (no flagged round trip through L2 between its
# own positions) and loads each unit's next inputs a position ahead (see Generator._recur).
RECUR_ONE_BLOCK = True
# ... and splits each unit over a few lanes of one warp (each lane its K split of the unit's gate
# rows in registers, the sums exchanged by shuffles, the cell in every lane): one barrier a
# position instead of two, no products' parts through shared memory (Generator._recur_lane_loop).
# Off: slower on the H100 (session 54, bench/h100/2026-12-05-s54/: nn.LSTM hidden 64, T = 256,
# 132.9 -> 152.0 us device time); the build's stepkernel-lanes tactic still times it where it applies.
RECUR_LANE_CELLS = False
# How many positions ahead a one-block recurrence loads its inputs (the flag-tagged words of the
# input projection): 1 loads position t + 1 while t is computed, the load's L2 round trip hidden
# behind one position (~0.5 us at hidden 64, two barriers); more keep that many positions' loads
# in flight, a ring of registers (the position loop unrolled by as many, so a slot is a constant
# index). H100, session 55 (bench/h100/2026-12-05-s55/, device time at 256 / 384 threads, depth 1 /
# 2 / 4 / 8): nn.GRU hidden 64, T = 256 123.5 -> 120.6 / 118.2 / 111.1 us at 384 threads (-10 %), but
# nn.LSTM the same size 131.7 -> 129.6 / 129.9 / 162.2 (its depth-8 kernel spills): no depth wins
# at both, so 1 stays the default and the build times depths 4 and 8 at 384 threads
# (engines/fusion.py's stepkernel-384-threads-ahead-4 / -8). CodeSettings.inputs_ahead overrides it.
RECUR_INPUTS_AHEAD = 1
# A one-block recurrence's cell threads check that a position's G input words were current when
# loaded with one branch for all of them (ffk_ll_current, ffk_ll_value; the waits, rare, in the
# branch not taken) instead of ffk_ll_take's branch and reconvergence a word: ptxas for sm_90 gives
# each take ~7 instructions and ~25-30 cycles of fixed stalls on the position's critical path
# (~110 of a position's ~820 cycles for an LSTM's four words, bench/microbench/recur_position.cu
# and bench/h100/2026-12-05-s55/README.md). H100, session 57 (bench/h100/2026-12-06-s57/gpu8/,
# device time, 256 / 384 threads): nn.LSTM hidden 64, T = 256 133.2 / 131.8 -> 122.9 / 122.5 us,
# nn.GRU the same size 127.6 / 123.6 -> 117.1 / 115.9; with the ring 4 / 8 deep LSTM 118.5 / 116.2,
# GRU 105.4 / 95.3 (GRU ahead 8 alone 117.6 / 111.0): faster everywhere it was timed, so on. Where
# input helpers apply (below) the cells load nothing and this changes nothing; it is the ring's
# (the lanes loop, blocks without spare threads). CodeSettings.take_together overrides it.
RECUR_TAKE_TOGETHER = True
# Why a deeper ring did not pay for the LSTM: ptxas (sm_90) puts every ffk_ll_peek of the ring on one
# scoreboard, and a scoreboard counts loads that may return out of order, so the first use of any
# slot waits for all of them, the position loaded a position ago included (cuobjdump of the depth-4
# kernel: each take's ISETP waits on SB5, which the four peeks of the position before set). Instead
# the block's threads past the cells (192 of 256 at hidden 64; idle while the cells run) take each
# position's input words a position ahead into shared memory (the X buffers the one-block loop
# does not use otherwise): a helper peeks position t + 2 during position t's cells and takes it
# during t + 1's (a whole position, ~800 cycles, for the round trip, and its only outstanding loads
# then), and the cells read their inputs from shared memory with no branch of their own
# (_InputHelpers). The GRU's ring is on one scoreboard too (depth 8), so its 10 % there came from
# the position loop unrolled by 8; with helpers, inputs_ahead unrolls the loop and loads nothing
# ahead. H100, session 57 (bench/h100/2026-12-06-s57/gpu8/, device time, 256 / 384 threads): nn.LSTM
# hidden 64, T = 256 133.2 / 131.8 -> 118.3 / 112.1 us, unrolled by 4 107.4 / 106.0 (-20 %); nn.GRU
# 127.6 / 123.6 -> 111.2 / 107.3, unrolled by 8 102.7 / 97.3 (ahead 8 with the ring: 117.6 / 111.0):
# faster at both sizes and thread counts, so on (the build's stepkernel-384-threads-ahead-4 / -8
# tactics are these unrolled loops now). It applies where one block holds the whole recurrence
# with threads past its cells (hidden 64 at 256 / 384 threads, not hidden 256 at 256); elsewhere
# the ring. CodeSettings.input_helpers overrides it.
RECUR_INPUT_HELPERS = True


@dataclass(frozen=True)
class CodeSettings:
    """How a schedule's kernel is written: the generated-code choices a build tactic, a sweep or a
    test makes, carried as one value from the tactic's arguments (engines/fusion.STEPKERNELS)
    through engine.prepare_step and CompiledStep to generate, and kept by the Kernel (its
    resident twin and a reschedule over fewer SMs are generated with the same). A field left None
    takes its module setting's value when the kernel is generated (:meth:`resolved`).

    ``one_pass`` is not a field: :meth:`of` sets both ``phase_one_pass`` and ``root_in_warp``
    (the stepkernel-fewer-phases tactics), which stepkernel_variants.py also sets one at a time."""

    copy_pieces: int | None = None  # PREFETCH_PIECE_FLOATS: long prefetch copies cut into pieces
    paced_copies: bool | None = None  # PREFETCH_PACED: a group's copies a task ahead in the block's order
    skewed_sums: bool | None = None  # SKEWED_SUM_WALK: sums that share a bank start at their own position
    weight_format: str = "fp32"  # the products' weight rows (WEIGHT_FORMATS)
    lossless_rows: bool = False  # only the products whose rows the format stores exactly go narrow
    lane_cells: bool | None = None  # RECUR_LANE_CELLS: a one-block recurrence's units over lanes
    alias_views: bool | None = None  # ALIAS_VIEWS: views of a task's arrays read where those lie
    phase_one_pass: bool | None = None  # PHASE_ONE_PASS: a phase's arrays in fewer passes of the warps
    root_in_warp: bool | None = None  # ROOT_IN_ARRAY_WARP: a root computed by its one product's lanes
    inputs_ahead: int | None = None  # RECUR_INPUTS_AHEAD: a one-block recurrence's inputs loaded ahead
    take_together: bool | None = None  # RECUR_TAKE_TOGETHER: ... a position's words checked with one branch
    input_helpers: bool | None = None  # RECUR_INPUT_HELPERS: ... or taken by the threads past the cells
    x_in_registers: bool | None = None  # DOT_X_IN_REGISTERS: a warp's rows of one long product share x
    tagged_outputs: bool | None = None  # TAGGED_OUTPUTS: outputs as words the host checks, no fence
    early_frame: bool | None = None  # EARLY_FRAME_WORDS: the frame's x published before its scalars

    @classmethod
    def of(cls, settings: CodeSettings | None = None, **fields) -> CodeSettings:
        """``settings`` (or the defaults) with ``fields`` replaced, ``one_pass`` setting both one-pass
        fields; an unknown name is a CompileError that lists the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known - {"one_pass"})
        if unknown:
            raise CompileError(
                f"unknown code setting(s) {', '.join(unknown)}: expected one_pass or {', '.join(sorted(known))}"
            )
        if "one_pass" in fields:
            both = fields.pop("one_pass")
            fields.setdefault("phase_one_pass", both)
            fields.setdefault("root_in_warp", both)
        return dataclasses.replace(settings or cls(), **fields)

    def resolved(self) -> CodeSettings:
        """Every None replaced by its module setting's current value, and the values checked."""
        if self.weight_format not in WEIGHT_FORMATS:
            raise CompileError(f"weight format {self.weight_format!r}: expected one of {', '.join(WEIGHT_FORMATS)}")

        def pick(value, default, kind):
            return kind(default if value is None else value)

        code = CodeSettings(
            copy_pieces=pick(self.copy_pieces, PREFETCH_PIECE_FLOATS, int),
            paced_copies=pick(self.paced_copies, PREFETCH_PACED, bool),
            skewed_sums=pick(self.skewed_sums, SKEWED_SUM_WALK, bool),
            weight_format=self.weight_format,
            lossless_rows=bool(self.lossless_rows),
            lane_cells=pick(self.lane_cells, RECUR_LANE_CELLS, bool),
            alias_views=pick(self.alias_views, ALIAS_VIEWS, bool),
            phase_one_pass=pick(self.phase_one_pass, PHASE_ONE_PASS, bool),
            root_in_warp=pick(self.root_in_warp, ROOT_IN_ARRAY_WARP, bool),
            inputs_ahead=pick(self.inputs_ahead, RECUR_INPUTS_AHEAD, int),
            take_together=pick(self.take_together, RECUR_TAKE_TOGETHER, bool),
            input_helpers=pick(self.input_helpers, RECUR_INPUT_HELPERS, bool),
            x_in_registers=pick(self.x_in_registers, DOT_X_IN_REGISTERS, bool),
            tagged_outputs=pick(self.tagged_outputs, TAGGED_OUTPUTS, bool),
            early_frame=pick(self.early_frame, EARLY_FRAME_WORDS, bool),
        )
        if code.copy_pieces < 0 or code.copy_pieces % 4:
            raise CompileError(f"copy pieces must be a non-negative multiple of 4 floats, got {code.copy_pieces}")
        if code.inputs_ahead < 1:
            raise CompileError(f"a recurrence's inputs are loaded at least one position ahead, got {code.inputs_ahead}")
        return code

    @property
    def one_pass(self) -> bool:
        """Either one-pass setting on (what the kernel's describe() reports as ``one_pass``)."""
        return bool(self.phase_one_pass or self.root_in_warp)

    def describe(self) -> dict:
        """The settings as the kernel's describe() reports them (one_pass for the two one-pass fields)."""
        info = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del info["phase_one_pass"], info["root_in_warp"]
        info["one_pass"] = self.one_pass
        return info


# Loads each thread issues before it checks any when a block stages flagged words (runtime.cuh's
# ffk_ll_stage_n: about one L2 round trip per STAGE_UNROLL * threads words; ffk_ll_stage_wide for
# more) ...
STAGE_UNROLL = 4
# ... and at most this many where a phase stages a split product's partial sums (P x N words, 16 x
# 256 at the zoo's size: 4 round trips at 4 loads a thread of 256, 1 at 16). H100, session 62:
# split products with 4 were 1.6-2.1x slower in device time (min_gru 9.52 -> 15.66 us, mamba
# 18.14 -> 38.18), ~3 us a reading level, as four round trips would cost. Not timed yet.
STAGE_UNROLL_PARTIALS = 16
# ... where the phase stages at most this many values (ffk_ll_stage_wide finds a word's value by a
# chain of selects over them at each use: mamba's seven at 384 threads spilled 72-176 bytes)
STAGE_WIDE_RANGES = 3


def stage_unroll(units: list, threads: int) -> int:
    """The loads in flight a thread for one phase's staged ``units``: STAGE_UNROLL, or, where one is
    a split product's partial sums and there are at most STAGE_WIDE_RANGES, enough for the phase's
    words in one pass (a power of two up to STAGE_UNROLL_PARTIALS)."""
    if not any(isinstance(u.node, PartialSums) for u in units) or len(units) > STAGE_WIDE_RANGES:
        return STAGE_UNROLL
    per_block = sum(np.maximum(u.hi - u.lo, 0) for u in units if u.hi is not None)
    words = int(np.max(per_block)) if np.size(per_block) else 0
    unroll = STAGE_UNROLL
    while unroll < STAGE_UNROLL_PARTIALS and unroll * threads < words:
        unroll *= 2
    return unroll


class _InputRing:
    """The registers of a one-block recurrence's inputs loaded ahead (``ahead`` >= 1 positions,
    checked by CodeSettings.resolved, see RECUR_INPUTS_AHEAD): ``G`` gate words a position, for positions rcs .. rcs + ahead - 1;
    position p in slot p % ahead, which is the unrolled loop's ``rcd`` (see _position_loop).
    ``x_word(position, g)`` is the address of a word; ``together``: a position's words checked with
    one branch (RECUR_TAKE_TOGETHER). With ahead 1 the source is the one-slot form it always was."""

    def __init__(self, G: int, T: int, x_word, ahead: int, together: bool = False):
        self.G, self.T, self.x_word = G, T, x_word
        self.ahead = min(ahead, T) if T > 1 else 1
        self.together = together

    @property
    def ahead_text(self) -> str:
        return ", loaded a position ahead" if self.ahead == 1 else f", loaded {self.ahead} positions ahead"

    @property
    def declaration(self) -> str:
        return (
            f"unsigned long long rxw[{self.G}];"
            if self.ahead == 1
            else f"unsigned long long rxw[{self.ahead}][{self.G}];"
        )

    def _slot(self, g: int, d: str = "rcd") -> str:
        return f"rxw[{g}]" if self.ahead == 1 else f"rxw[{d}][{g}]"

    def first_loads(self) -> list[str]:
        """Positions 0 .. ahead - 1 into their slots, before the loop."""
        return [
            f"{self._slot(g, str(d))} = ffk_ll_peek({self.x_word(str(d), g)});"
            for d in range(self.ahead)
            for g in range(self.G)
        ]

    def take_and_reload(self) -> list:
        """Position rcs's values (rxv0 ...) out of its slot, which then loads position rcs + ahead."""
        later = f"(rcs + {self.ahead})"
        if self.together:
            values = Code("if (" + " & ".join(f"ffk_ll_current({self._slot(g)}, epoch)" for g in range(self.G)) + ")")
            values.items += [f"rxv{g} = ffk_ll_value({self._slot(g)});" for g in range(self.G)]
            waits = Code("else")  # a word was not current when it was loaded: wait for each
            waits.items += [
                f"rxv{g} = ffk_ll_take({self._slot(g)}, {self.x_word('rcs', g)}, epoch);" for g in range(self.G)
            ]
            takes = [
                "float " + ", ".join(f"rxv{g}" for g in range(self.G)) + ";  // one branch for the position's words",
                values,
                waits,
            ]
        else:
            takes = [
                f"const float rxv{g} = ffk_ll_take({self._slot(g)}, {self.x_word('rcs', g)}, epoch);"
                for g in range(self.G)
            ]
        return [
            *takes,
            f"if (rcs + {self.ahead} < {self.T}) {{",
            *(f"    {self._slot(g)} = ffk_ll_peek({self.x_word(later, g)});" for g in range(self.G)),
            "}",
        ]


class _InputHelpers:
    """A one-block recurrence's input words taken by the block's threads past the cells
    (RECUR_INPUT_HELPERS): ``words`` a position (the input projection's flag-tagged words at
    ``base`` + position * words, in the cells' order), the threads from ``first`` (a warp
    boundary at or past the ``cells``) to ``threads``, each its words e = helper + q * helpers
    in registers (``rxh[q]``); the values go to rX's two buffers of ``stride`` floats, position
    p in buffer p & 1, a position before the cells read them."""

    def __init__(self, words: int, cells: int, first: int, threads: int, T: int, base: str, stride: int):
        self.words, self.cells, self.first, self.helpers = words, cells, first, threads - first
        self.T, self.base, self.stride = T, base, stride
        self.per = -(-words // self.helpers)

    def _each(self, line) -> list[str]:
        """``line(q, e)`` for each of a helper's words, guarded where the last ones run out."""
        out = []
        for q in range(self.per):
            e = f"rhe + {q * self.helpers}" if q else "rhe"
            text = line(q, e)
            out.append(text if (q + 1) * self.helpers <= self.words else f"if ({e} < {self.words}) {text}")
        return out

    def _word(self, position: str, e: str) -> str:
        return f"{self.base} + {position} * {self.words} + {e}"

    def first_positions(self) -> list:
        """Before the loop: position 0's values into buffer 0 (waited for), position 1's words loaded."""
        pre = Code(f"if (tid >= {self.first})")
        pre.items += [
            f"const int rhe = tid - {self.first};",
            *self._each(lambda q, e: f"rX[{e}] = ffk_ll_wait({self._word('0', e)}, epoch);"),
        ]
        if self.T > 1:
            pre.items += self._each(lambda q, e: f"rxh[{q}] = ffk_ll_peek({self._word('1', e)});")
        return [
            f"// the inputs: the {self.helpers} threads past the cells take each position's {self.words} words a",
            "// position ahead into shared memory (rX's two buffers), so no cell waits on a load or a branch",
            f"unsigned long long rxh[{self.per}];  // a helper's words of the next position",
            pre,
        ]

    def next_positions(self) -> list:
        """Beside the cells of position rcs: position rcs + 1's values into its buffer, rcs + 2's
        words loaded (the helpers' only loads in flight until the next position takes them)."""
        # the else of the cells' if (tid < cells)
        helper = Code("else" if self.first == self.cells else f"else if (tid >= {self.first})")
        helper.items.append(f"const int rhe = tid - {self.first};")
        take = Code(f"if (rcs + 1 < {self.T})")
        take.items += self._each(
            lambda q, e: (
                f"rX[((rcs + 1) & 1) * {self.stride} + {e}] = ffk_ll_take(rxh[{q}], {self._word('(rcs + 1)', e)}, epoch);"
            )
        )
        load = Code(f"if (rcs + 2 < {self.T})")
        load.items += self._each(lambda q, e: f"rxh[{q}] = ffk_ll_peek({self._word('(rcs + 2)', e)});")
        helper.items += [take, load]
        return [helper]


def _position_loop(T: int, ahead: int) -> tuple[Code, Code]:
    """(the loop to insert, the block its body goes in) over positions ``rcs`` < T; unrolled by
    ``ahead`` > 1 (``rcd``, the position's slot of an _InputRing, a constant in each copy)."""
    if ahead <= 1:
        loop = Code(f"for (int rcs = 0; rcs < {T}; ++rcs)")
        return loop, loop
    outer = Code(f"for (int rcs0 = 0; rcs0 < {T}; rcs0 += {ahead})")
    inner = Code(f"#pragma unroll\nfor (int rcd = 0; rcd < {ahead}; ++rcd)")
    outer.items.append(inner)
    inner.items.append("const int rcs = rcs0 + rcd;")
    if T % ahead == 0:
        return outer, inner
    last = Code(f"if (rcs < {T})")  # the same for every thread of the block: its barriers stay whole
    inner.items.append(last)
    return outer, last


def recur_lanes(node: Recur, threads: int, enabled: bool | None = None) -> int:
    """Lanes a unit of a one-block recurrence when ``enabled`` (default RECUR_LANE_CELLS; the
    build's stepkernel-lanes tactic passes True) (0: not taken): the most, a power of two up to a
    warp, whose threads fit the block in whole warps, whose K splits are whole float4s and whose
    gate rows fit RECUR_REGISTER_WEIGHTS."""
    if not (RECUR_LANE_CELLS if enabled is None else enabled):
        return 0
    units, best, lanes = node.batch * node.hidden, 0, 2
    while lanes <= 32 and units * lanes <= threads:
        split = node.hidden // lanes
        if node.hidden % (4 * lanes) == 0 and node.gates * split <= RECUR_REGISTER_WEIGHTS and units * lanes % 32 == 0:
            best = lanes
        lanes *= 2
    return best


# How many weights of R a thread keeps in registers: schedule.RECUR_REGISTER_WEIGHTS (the arena's
# size depends on it). A pause between the re-polls of h at 128 blocks (__nanosleep 100 ns) was no
# faster on the H100 (hidden 1024, T = 256: 1696 / 1499 us against 1659 / 1447), so it was not kept.


def _recur_rows_by_k(node: Recur, per_block: int, blocks: int) -> np.ndarray:
    """R [G·H, H] as [block][k][g·HB + j]: row g·H + block·HB + j of R at k (zero past H)."""
    G, H = node.gates, node.hidden
    out = np.zeros((blocks, H, G * per_block), dtype=np.float32)
    rows = node.rows.reshape(G, H, H)  # [g][unit][k]
    for b in range(blocks):
        units = min(per_block, H - b * per_block)
        if units <= 0:
            continue
        part = rows[:, b * per_block : b * per_block + units, :]  # [g][j][k]
        for g in range(G):
            out[b, :, g * per_block : g * per_block + units] = part[g].T
    return out.reshape(-1)


TRACE_SLOTS = 16  # per block and task: 3 globaltimer stamps, then the SM clock at each phase
_STABLE_ID = re.compile(r"#\d+")
_NODE_VAR = re.compile(r"\b(lo|hi|plo|from)(\d+)\b")


def _name(node: Node) -> str:
    """A node in a comment: its ONNX label, else its kind and shape (never the process-wide id,
    which would make the source, and so its hash and the kernel cache, differ between runs)."""
    return node.label or f"{type(node).__name__}{list(node.shape)}"


def _renumber(source: str) -> str:
    """Variables named after node ids (lo123, hi123, plo123, from123) renumbered in order of appearance:
    the same program gives the same source in every process."""
    numbers: dict[str, int] = {}

    def repl(match):
        number = numbers.setdefault(match.group(2), len(numbers))
        return f"{match.group(1)}{number}"

    return _NODE_VAR.sub(repl, source)


def _lane_loop(r: ix.Var, j: str, *, unroll: int | None, lanes: int = 32, lane: str = "lane") -> tuple[Code, Scope]:
    """A loop over ``r`` in [0, extent) split over a warp's lanes (r = lane + 32·j), or over a
    segment of ``lanes`` lanes whose index in the segment is ``lane`` (a body loop's products,
    codegen's _body_warps), with a compile-time trip count: a loop starting at `lane` makes the
    compiler emit remainder code for any lane count (measured: a LayerNorm's two sums took ~940
    cycles, ~600 with this form). ``unroll`` None: unrolled whole (the trip's index addresses a
    register array). Returns the loop and the scope its body's statements go in."""
    extent = r.extent
    pragma = "#pragma unroll" if unroll is None else f"#pragma unroll {unroll}"
    loop = Code(f"{pragma}\nfor (int {j} = 0; {j} < {-(-extent // lanes)}; ++{j})")
    loop.items.append(f"const int {r.name} = {lane} + {lanes} * {j};")
    body = loop
    if extent % lanes:
        body = Code(f"if ({r.name} < {extent})")
        loop.items.append(body)
    return loop, Scope(body, var=r, pos=len(body.items), lanes=True)


def _in_task(task: Task) -> str:
    """The condition that block ``b`` is one of the task's."""
    if task.first:
        return f"b >= {task.first} && b < {task.first + task.blocks}"
    return f"b < {task.blocks}"


def _block_runs(blocks: list[int]) -> list[tuple[int, int]]:
    """Sorted block numbers as runs of consecutive ones, (first, last)."""
    runs: list[list[int]] = []
    for blk in blocks:
        if runs and runs[-1][1] == blk - 1:
            runs[-1][1] = blk
        else:
            runs.append([blk, blk])
    return [(lo, hi) for lo, hi in runs]


def _block_set(blocks: list[int]) -> str:
    """The condition that block ``b`` is one of ``blocks`` (sorted), as ranges."""
    runs = _block_runs(blocks)
    return " || ".join(f"b == {lo}" if lo == hi else f"(b >= {lo} && b <= {hi})" for lo, hi in runs) or "false"


def _on_blocks(task: Task) -> str:
    return f"if ({_in_task(task)})"


def _block_in_task(task: Task) -> str:
    return f"(b - {task.first})" if task.first else "b"


def _piece_count(floats: int, piece: int) -> int:
    return max(1, -(-int(floats) // piece))


def _narrow_bits(rows: np.ndarray, weight_format: str) -> np.ndarray:
    """The 16-bit patterns of ``rows`` (float32) in ``weight_format``, rounded to nearest even."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if weight_format == "fp16":
        with np.errstate(over="ignore"):  # beyond fp16's range: inf, as a cast would give
            return rows.astype(np.float16).view(np.uint16)
    if weight_format == "bf16":
        bits = rows.view(np.uint32).astype(np.uint64)
        nan = np.isnan(rows)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # to nearest, ties to even
        return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)  # a NaN stays a NaN
    raise CompileError(f"weight format {weight_format!r} is not a 16-bit format")


def quantized_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 rows, a scale a row (precision/quantize's weight-only scheme): (q [N, K]
    int8, scale [N] float32)."""
    rows = np.asarray(rows, dtype=np.float32)
    amax = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0], np.float32)
    scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.round(rows / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def format_holds(rows: np.ndarray, weight_format: str) -> bool:
    """Whether ``weight_format`` can store ``rows`` (fp16: within its range; int8: finite)."""
    if weight_format == "fp16":
        return bool((np.abs(rows[np.isfinite(rows)]) <= FP16_MAX).all())
    if weight_format == "int8":
        return bool(np.isfinite(rows).all())
    return True


# int8 rows count as stored exactly when they read back within this many float32 ulps of their
# row's largest magnitude: a weight-only int8 graph's dequantized rows q * s (precision/quantize,
# float32 products) re-quantize to the same q, with a scale within an ulp or two of s.
INT8_EXACT_ULPS = 8


def stores_exactly(rows: np.ndarray, weight_format: str) -> bool:
    """Whether ``weight_format`` stores ``rows`` without changing them: fp16 / bf16 when rounding
    is the identity (a precision build's graph already rounded them; NaN stays NaN), int8 when they
    are a row's scale times integers in [-127, 127] (up to INT8_EXACT_ULPS, see there)."""
    rows = np.asarray(rows, dtype=np.float32)
    if weight_format == "fp32":
        return True
    if not format_holds(rows, weight_format):
        return False
    back = rounded_rows(rows, weight_format)
    if weight_format != "int8":
        return bool(np.array_equal(back, rows, equal_nan=True))
    if not rows.size:
        return True
    bound = INT8_EXACT_ULPS * np.finfo(np.float32).eps * np.abs(rows).max(axis=1, keepdims=True)
    return bool((np.abs(back - rows) <= bound).all())


def rounded_rows(rows: np.ndarray, weight_format: str) -> np.ndarray:
    """``rows`` as the kernel reads them back from ``weight_format`` (float32; int8: q · scale)."""
    if weight_format == "int8":
        q, scale = quantized_rows(rows)
        return q.astype(np.float32) * scale[:, None]
    bits = _narrow_bits(rows, weight_format)
    if weight_format == "fp16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def narrow_rows(rows: np.ndarray, weight_format: str) -> tuple[np.ndarray, int]:
    """The weight rows [N, K] in ``weight_format`` as the kernel stores them, as float32 bit
    patterns, and the 32-bit words a row takes. fp16 / bf16: each row padded with zeros to
    NARROW_ROW_ALIGN elements, two a word (little-endian: element 2i in the low half); int8: a
    header of INT8_HEADER_WORDS words (the row's scale, then zeros), then the values padded with
    zeros to INT8_ROW_ALIGN, four a word."""
    n, k = rows.shape
    if weight_format == "int8":
        q, scale = quantized_rows(rows)
        width = -(-k // INT8_ROW_ALIGN) * INT8_ROW_ALIGN
        packed = np.zeros((n, 4 * INT8_HEADER_WORDS + width), dtype=np.uint8)
        packed[:, :4] = scale.astype("<f4").view(np.uint8).reshape(n, 4)
        packed[:, 4 * INT8_HEADER_WORDS : 4 * INT8_HEADER_WORDS + k] = q.view(np.uint8)
        return packed.reshape(-1).view(np.float32), packed.shape[1] // 4
    stride = -(-k // NARROW_ROW_ALIGN) * NARROW_ROW_ALIGN
    padded = np.zeros((n, stride), dtype=np.uint16)
    padded[:, :k] = _narrow_bits(rows, weight_format)
    return padded.reshape(-1).view(np.float32), stride // 2


def _pieces(entry: tuple, piece: int) -> list[tuple]:
    """A prefetch copy (shared-memory offset, source, source offsets, floats per block) as copies of
    at most ``piece`` floats each."""
    offset, source, base, length = entry
    length = np.asarray(length, dtype=np.int64)
    count = _piece_count(length.max(initial=0), piece)
    if count == 1:
        return [entry]
    return [(offset + j * piece, source, base + j * piece, np.clip(length - j * piece, 0, piece)) for j in range(count)]


def _rows_bound(lay: Layout, t: int, uid: int) -> int:
    return lay.prefetch[(t, uid)][1]


def _accumulate(op: str, acc: str, value: str) -> str:
    if op == "sum":
        return f"{acc} += {value};"
    if op == "prod":
        return f"{acc} *= {value};"
    return f"{acc} = ffk_{op}({acc}, {value});"


class Emitter:
    """C for the values of one unit's element, with hoisting (see the module docstring)."""

    def __init__(
        self,
        gen: Generator,
        t: int,
        task: Task,
        top: Code,
        side: set | None = None,
        lanes: bool = False,
        per_thread: bool = False,
    ):
        self.lanes = lanes  # a warp per element (see Generator._warp_root)
        self.per_thread = per_thread  # element e of a loop from the block's first element + tid
        self.gen = gen
        self.t = t
        self.task = task
        self.view = task.view
        self.stack: list[Scope] = [Scope(top)]
        self.side = side or set()
        self.store_guard: str | None = None  # a condition on the block for the side stores
        self.names = itertools.count()

    @property
    def top(self) -> Scope:
        return self.stack[0]

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self.names)}"

    def target(self, free: frozenset) -> int:
        level = 0
        for i, scope in enumerate(self.stack):
            if scope.guard or (scope.var is not None and scope.var in free):
                level = i
        return level

    def lookup(self, key):
        for scope in reversed(self.stack):
            if key in scope.memo:
                return scope.memo[key]
        return None

    def bind(self, key, text: str, free: frozenset, *, node: Node | None = None, flat: ix.IExpr | None = None) -> Val:
        level = self.target(free)
        scope = self.stack[level]
        name = self.fresh("v")
        scope.insert(f"const float {name} = {text};")
        val = Val(name, free)
        scope.memo[key] = val
        if node is not None and node.id in self.side:
            for stmt in self.gen.stores(node, ix.to_c(flat), name, self.gen.stored_c(node, flat)):
                stmt = stmt if self.store_guard is None else f"if ({self.store_guard}) {stmt}"
                scope.insert(self.once(stmt, level))
        return val

    def once(self, stmt: str, level: int = 0) -> str:
        """A store in a warp-per-element root: by lane 0, unless a lane-split loop already gives
        each lane its own element."""
        if self.lanes and not any(scope.lanes for scope in self.stack[: level + 1]):
            return f"if (lane == 0) {stmt}"
        return stmt

    def value(self, node: Node, index: list, *, expand_self: bool = False) -> Val:
        flat = ix.flatten(index, node.shape)
        key = (node.id, repr(flat))
        found = self.lookup(key)
        if found is not None:
            return found
        free = ix.free_vars(flat)
        gen = self.gen
        kind = self.view.source_kind(node) if expand_self else self.view.kind(node)
        # a graph input is a leaf only to the task that reads it from host memory; every other
        # task reads its flag-tagged copy (read inline from host memory by every block of a task,
        # the real models' kernels ran 10-90x slower host to host than on device inputs)
        if isinstance(node, Leaf) and not (node.role == "input" and kind in ("materialized", "array")):
            return self._leaf(node, flat, free, key)
        if kind == "materialized":
            at = ix.to_c(self.view.flat(node, index))
            return self.bind(key, f"ffk_ll_wait(ffk_ll + {gen.layout.ll[node.id]} + {at}, epoch)", free)
        if kind in ("array", "dot"):
            text = f"{gen.arr(self.t, node.id)}[{ix.to_c(self.view.flat(node, index))} - lo{node.id}]"
            stored = node.id in gen.array_side.get(self.t, ())  # by its array's loop
            return self.bind(key, text, free, node=None if stored else node, flat=flat)
        if isinstance(node, Map):
            val = self.value(node.src, node.source_index(index))
            if node.id in self.side:
                return self.bind(key, val.text, val.free | free, node=node, flat=flat)
            return val
        if isinstance(node, Concat):
            return self._concat(node, index, flat, free, key)
        if isinstance(node, Ew):
            spec = EW[node.op]
            gen.need_header(spec.header)
            args = [self.value(a, index) for a in node.args]
            deps = frozenset().union(free, *[a.free for a in args])
            return self.bind(key, spec.c([a.text for a in args], node.params), deps, node=node, flat=flat)
        if isinstance(node, Reduce):
            return self._reduce(node, index, flat, free, key)
        if isinstance(node, Scan):
            return self._scan(node, index, flat, free, key)
        if isinstance(node, Dot):
            raise CompileError(f"{node}: a product reached inline (the scheduler makes every product a unit)")
        raise CompileError(f"{node}: no code for {type(node).__name__}")

    def _leaf(self, node: Leaf, flat: ix.IExpr, free: frozenset, key) -> Val:
        gen = self.gen
        c = ix.to_c(flat)
        if node.role == "const":
            return Val(c_float(float(node.array)), frozenset())
        prefetched = gen.layout.leaf_prefetch.get((self.t, node.id))
        if prefetched is not None:
            return self.bind(key, f"ffk_smem[{gen.prefetch_offset + prefetched} + {c} - plo{node.id}]", free)
        if node.role == "weight":
            return self.bind(key, f"__ldg(ffk_w + {gen.layout.weights[node.id]} + {c})", free)
        if node.role == "state":
            # the resident kernel's state changes under it: no read-only (non-coherent) cache path
            load = "ffk_ld_cg" if gen.resident else "__ldg"
            return self.bind(key, f"{load}(sin{gen.state_names.index(node.name)} + {c})", free)
        gen.host_tasks.add(self.t)
        gen.input_tasks.add(self.t)
        framed = gen._framed_input(self.task)
        if framed is not None and framed.id == node.id and c == "e" and self.per_thread:
            # element e of a loop that starts at tid on the task's one block: read at entry
            return self.bind(key, f"ffk_host{self.t}", free)
        if gen.tagged:  # its own word's epoch: the frame's words arrive in no particular order
            return self.bind(key, f"ffk_load_host_tagged(in{gen.input_names.index(node.name)} + {c}, epoch)", free)
        return self.bind(key, f"ffk_load_host(in{gen.input_names.index(node.name)} + {c})", free)

    def _reduce(self, node: Reduce, index: list, flat, free: frozenset, key) -> Val:
        level = self.target(free)
        saved = self.stack
        self.stack = saved[: level + 1]
        scope = self.stack[-1]
        acc = self.fresh("acc")
        scope.insert(f"float {acc} = {REDUCE_INIT[node.op]};")
        r = ix.Var(self.fresh("r"), node.extent)
        split = self.lanes and level == 0 and node.extent >= WARP_SPLIT_MIN
        found, span = None, 0
        if VECTOR_REDUCE and not split:
            # the longest prefix of the positions, a multiple of 4, over which every factor reads
            # one source (P·V: the cached V rows up to the window's last position, the new row)
            for span in range(node.extent - node.extent % 4, max(node.extent // 2, 4) - 1, -4):
                prefix = ix.Var(r.name, span)
                found = self.gen._vector_factors(self.t, self.task, node, index, prefix)
                if found is not None:
                    break
        start = 0
        if found is not None:
            self._vector_sum(scope, acc, found, span, prefix)
            start = span  # the rest of the positions in the scalar loop, in order
        if start < node.extent:
            if split:  # a warp per root element: the lanes share the reduction, then a warp reduction
                loop, inner = _lane_loop(r, self.fresh("j"), unroll=2)
            else:
                count = node.extent - start
                skew = level == 0 and self.per_thread and node.op == "sum" and self._bank_skew(node, index, r, start)
                if skew:
                    k, q = self.fresh("k"), self.fresh("q")
                    scope.insert(f"const int {k} = e % {count};  // the first position, see SKEWED_SUM_WALK")
                    loop = Code(f"for (int {q} = 0; {q} < {count}; ++{q})")
                    inner = Scope(loop, var=r)
                    wrapped = f"({q} + {k} < {count} ? {q} + {k} : {q} + {k} - {count})"
                    inner.insert(f"const int {r.name} = {wrapped if not start else f'{start} + {wrapped}'};")
                else:
                    loop = Code(f"for (int {r.name} = {start}; {r.name} < {node.extent}; ++{r.name})")
                    inner = Scope(loop, var=r)
            scope.open_child(loop)
            self.stack.append(inner)
            val = self.value(node.src, node.source_index(index, r))
            self.stack[-1].insert(_accumulate(node.op, acc, val.text))
            self.stack.pop()
            scope.close_child(loop)
        if split:
            scope.insert(f"{acc} = ffk_warp_{node.op}({acc});")
        result = Val(acc, free)
        scope.memo[key] = result
        self.stack = saved
        if node.id in self.side:
            return self.bind(("side", key), acc, free, node=node, flat=flat)
        return result

    def _bank_skew(self, node: Reduce, index: list, r: ix.Var, start: int) -> bool:
        """Whether a thread's sum over positions start.. reads shared memory with fewer bank
        conflicts when element e starts at position e % n and wraps (SKEWED_SUM_WALK): every read
        of the summand that varies with the position, its flat index evaluated for warps of 32
        consecutive elements (a thread-per-element loop gives lane l element e0 + l), the most
        distinct words on one bank summed over the reads; at least halved, or no skew."""
        if not self.gen.settings.skewed_sums:
            return False
        count = node.extent - start
        if count < 2:
            return False
        flats: list = []

        def collect(n: Node, idx: list) -> bool:
            kind = self.view.kind(n)
            if kind == "inline":
                if isinstance(n, Ew):
                    return all(collect(a, idx) for a in n.args)
                if isinstance(n, Map):
                    return collect(n.src, n.source_index(idx))
                return False  # a Concat, a nested reduction or scan: not analysed
            if not (isinstance(n, Leaf) and n.role == "const"):
                flat = self.view.flat(n, idx)
                if r in ix.free_vars(flat):
                    flats.append(flat)
            return True

        if not collect(node.src, node.source_index(index, r)) or not flats:
            return False
        names = frozenset().union(*(ix.free_vars(f) for f in flats)) - {r}
        if len(names) != 1 or next(iter(names)).name != "e":
            return False
        (e,) = names
        warps = min(SKEW_SAMPLE_WARPS, -(-e.extent // WARP_LANES))
        elements = np.arange(warps * WARP_LANES, dtype=np.int64).reshape(warps, WARP_LANES)
        elements = np.where(elements < e.extent, elements, elements[:, :1])  # a short last warp
        served = {"plain": 0, "skewed": 0}  # the words of the busiest bank, summed
        for position in (0, count // 2):
            walks = {
                "plain": np.full_like(elements, start + position),
                "skewed": start + (position + elements % count) % count,
            }
            for walk, positions in walks.items():
                for flat in flats:
                    words = np.broadcast_to(ix.evaluate(flat, {e: elements, r: positions}), elements.shape)
                    served[walk] += sum(int(np.bincount(np.unique(row) % WARP_LANES).max()) for row in words)
        return 2 * served["skewed"] <= served["plain"]

    def _scan(self, node: Scan, index: list, flat, free: frozenset, key) -> Val:
        """The recurrence from its initial value through positions 0..t of the element's own t:
        each element is independent of the others (no carried value between threads), at the cost
        of the earlier positions' steps recomputed per element."""
        level = self.target(free)
        saved = self.stack
        self.stack = saved[: level + 1]
        scope = self.stack[-1]
        spec = EW[node.op]
        self.gen.need_header(spec.header)
        h = self.fresh("h")
        init = self.value(node.init, node.init_index(index))
        scope.insert(f"float {h} = {init.text};")
        s = ix.Var(self.fresh("s"), node.steps)
        loop = Code(f"for (int {s.name} = 0; {s.name} <= {ix.to_c(index[node.axis])}; ++{s.name})")
        inner = Scope(loop, var=s)
        scope.open_child(loop)
        self.stack.append(inner)
        items = [self.value(x, node.at(index, s)).text for x in node.xs]
        inner.insert(f"{h} = {spec.c(node.step_args(items, h), node.params)};")
        self.stack.pop()
        scope.close_child(loop)
        result = Val(h, free)
        scope.memo[key] = result
        self.stack = saved
        if node.id in self.side:
            return self.bind(("side", key), h, free, node=node, flat=flat)
        return result

    def _vector_sum(self, scope: Scope, acc: str, found: list, extent: int, r: ix.Var) -> None:
        """The sum of Generator._vector_factors: a pointer per factor chosen once, then four
        positions a step, the float4 factors in one load each, the products in the scalar loop's
        order."""
        pointers = _pointers(
            scope, self.fresh, [branches for _, branches, _ in found], r, "the pointers to the first position"
        )
        c = self.fresh("c")
        loop = Code(f"#pragma unroll 2\nfor (int {c} = 0; {c} < {extent}; {c} += 4)")
        lanes_of = []
        for (kind, _branches, stride), p in zip(found, pointers):
            if kind == "float4":
                x = self.fresh("x")
                loop.items.append(f"const float4 {x} = ffk_ld4({p} + {c});")
                lanes_of.append([f"{x}.x", f"{x}.y", f"{x}.z", f"{x}.w"])
            elif kind == "strided":
                lanes_of.append([f"{p}[({c} + {i}) * {stride}]" for i in range(4)])
            else:
                lanes_of.append([f"(*{p})"] * 4)
        for i in range(4):
            loop.items.append(f"{acc} += {' * '.join(terms[i] for terms in lanes_of)};")
        scope.insert(loop)

    def _concat(self, node: Concat, index: list, flat, free: frozenset, key) -> Val:
        branches = list(concat_branches(node, index))
        if len(branches) == 1 and branches[0][2] is None:
            src, sub, _ = branches[0]
            val = self.value(src, sub)
            if node.id in self.side:
                return self.bind(key, val.text, val.free | free, node=node, flat=flat)
            return val
        level = self.target(free)
        saved = self.stack
        self.stack = saved[: level + 1]
        scope = self.stack[-1]
        out = self.fresh("cat")
        scope.insert(f"float {out};")
        for i, (src, sub, guard) in enumerate(branches):
            if i == len(branches) - 1:
                head = "else"
            else:
                pos, _start, stop = guard
                head = f"{'else ' if i else ''}if ({ix.to_c(pos)} < {stop})"
            block = Code(head)
            scope.insert(block)  # branch bodies never hoist out of their test (see target())
            self.stack.append(Scope(block, guard=True))
            val = self.value(src, sub)
            self.stack[-1].insert(f"{out} = {val.text};")
            self.stack.pop()
        result = Val(out, free)
        scope.memo[key] = result
        self.stack = saved
        if node.id in self.side:
            return self.bind(("side", key), out, free, node=node, flat=flat)
        return result


class _BodyEmitter(Emitter):
    """C for the values of a body loop's element (Generator._body_loop): the slots and the kept
    body values are read from their shared-memory buffers (``places``: node id -> pointer), the
    rest inlined as in any task."""

    def __init__(self, gen: Generator, t: int, task: Task, top: Code, places: dict):
        super().__init__(gen, t, task, top)
        self.places = places

    def value(self, node: Node, index: list, *, expand_self: bool = False) -> Val:
        place = self.places.get(node.id)
        if place is None or (expand_self and not isinstance(node, Leaf)):
            if isinstance(node, Leaf) and node.role == "slot":
                raise CompileError(f"{node}: a body loop's slot without a buffer")
            return super().value(node, index)
        flat = ix.flatten(index, node.shape)
        key = (node.id, repr(flat))
        found = self.lookup(key)
        if found is not None:
            return found
        return self.bind(key, f"{place}[{ix.to_c(flat)}]", ix.free_vars(flat))


def _pointers(scope: Scope, fresh, operands: list, r: ix.Var, why: str) -> list[str]:
    """A pointer per operand of a float4 walk or sum (Generator._vector_factors), declared in
    ``scope`` and set once, in a block where the position ``r`` is 0, through each operand's
    Concat branches: their names."""
    pointers = []
    block = Code("")
    block.items.append(f"const int {r.name} = 0;  // {why}")
    block.items.append(f"(void){r.name};")
    for branches in operands:
        p = fresh("p")
        pointers.append(p)
        scope.insert(f"const float* {p};")
        for i, (guards, (base, origin), flat) in enumerate(branches):
            text = f"{p} = {base} + ({ix.to_c(flat)} - {origin});"
            if len(branches) == 1:
                block.items.append(text)
                continue
            if i == len(branches) - 1:
                head = "else"
            else:
                test = " && ".join(
                    f"{ix.to_c(pos)} >= {start} && {ix.to_c(pos)} < {stop}" for pos, start, stop in guards
                )
                head = f"{'else ' if i else ''}if ({test or 'true'})"
            branch = Code(head)
            branch.items.append(text)
            block.items.append(branch)
    scope.insert(block)
    return pointers


@dataclass
class Kernel:
    """A generated step kernel: the source, its layout and the data its launch needs."""

    source: str
    schedule: Schedule
    layout: Layout
    input_names: list
    output_names: list
    state_names: list
    settings: CodeSettings  # how it was written, resolved (generate with them again: the same source)
    done_words: int = 0  # mapped host words the host waits on (see Generator._done)
    resident: bool = False  # ffk_resident: launched once, a frame per bell (see Generator._resident_loop)
    trace: bool = False  # each block stamps its tasks' timeline (the launch's last argument, TRACE_SLOTS)
    tagged_frames: bool = False  # resident: each input float a word (epoch << 32) | bits (RESIDENT_TAGGED_FRAMES)
    frame_reads: bool = False  # resident: the frame blocks count their reads of host memory (RESIDENT_POLL_COUNTS)
    frame_copies: int = 1  # resident: 1 + a frame block's replicas (RESIDENT_FRAMER_REPLICAS)
    tagged_outputs: bool = False  # each output float a word (epoch << 32) | bits (TAGGED_OUTPUTS)
    task_phases: tuple = ()  # the phases each task's code runs (Generator.task_phases)
    copied_floats: int = 0  # the prefetch copies of all blocks in one launch (the resident kernel: once)

    @property
    def kernel_phases(self) -> int:
        """The phases the source runs over all tasks."""
        return sum(self.task_phases)

    @property
    def name(self) -> str:
        return RESIDENT_KERNEL_NAME if self.resident else KERNEL_NAME

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def identity(self) -> str:
        """What the kernel computes and how, as a hash: its source and its range table (two tactics
        can differ only in the table: paced copies change which commit point issues a block's
        copies, often not the source)."""
        digest = hashlib.sha256(self.source.encode())
        digest.update(self.ranges().tobytes())
        return digest.hexdigest()

    @property
    def smem_bytes(self) -> int:
        return 4 * self.layout.smem_floats

    def weights(self) -> np.ndarray:
        """The weight buffer (float32; narrow rows are 16-bit pairs, copied as bits)."""
        buffer = np.zeros(max(self.layout.weight_floats, 4), dtype=np.uint32)
        for offset, array in self.layout.weight_arrays:
            buffer[offset : offset + array.size] = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
        return buffer.view(np.float32)

    def ranges(self) -> np.ndarray:
        return np.ascontiguousarray(self.layout.table, dtype=np.int32)

    def dot_rows(self) -> dict[int, np.ndarray]:
        """{Dot id: its weight rows as the kernel reads them (float32)} for the products stored
        narrow: what the reference interpreter computes with (naive.run's ``dot_rows``)."""
        found = {}
        for task in self.schedule.tasks:
            for unit in task.units.values():
                if unit.node.id in self.layout.narrow:
                    found[unit.node.id] = rounded_rows(unit.node.rows, self.settings.weight_format)
        return found

    def describe(self) -> dict:
        info = self.schedule.describe()
        info.update(
            {
                "source_sha256": self.digest,
                "source_and_ranges_sha256": self.identity,
                "smem_bytes": self.smem_bytes,
                "weight_bytes": 4 * self.layout.weight_floats,
                "flagged_bytes": 8 * self.layout.ll_words,
                "prefetched_products": len(self.layout.prefetch),
                "prefetched_leaves": len(self.layout.leaf_prefetch),
                "done_words": self.done_words,
                "narrow_products": len(self.layout.narrow),
                "tagged_frames": self.tagged_frames,
                "kernel_phases": self.kernel_phases,
                "copied_bytes": 4 * self.copied_floats,
                **self.settings.describe(),
            }
        )
        return info


def generate(
    sched: Schedule,
    *,
    smem_limit_bytes: int = 200 * 1024,
    prefetch: bool = True,
    trace: bool = False,
    resident: bool = False,
    settings: CodeSettings | None = None,
    **fields,
) -> Kernel:
    """The kernel source for a schedule: ``ffk_step`` (one launch, one frame) or, with
    ``resident``, ``ffk_resident`` (one launch, a frame per bell; same layout, weights, range
    table and flagged buffer as the launched kernel of the same schedule and settings).
    ``settings`` with ``fields`` replaced (CodeSettings.of: ``weight_format="fp16"``,
    ``one_pass=True``, ...): how it is written; :meth:`Kernel.dot_rows` gives the rows a narrow
    ``weight_format`` computes with, for the reference."""
    gen = Generator(
        sched,
        smem_limit_bytes=smem_limit_bytes,
        prefetch=prefetch,
        trace=trace,
        resident=resident,
        settings=CodeSettings.of(settings, **fields),
    )
    source = _renumber(gen.source())
    return Kernel(
        source,
        sched,
        gen.layout,
        gen.input_names,
        gen.output_names,
        gen.state_names,
        gen.settings,
        done_words=gen.done_words,
        resident=resident,
        trace=trace,
        tagged_frames=gen.tagged,
        frame_reads=gen._counts_reads() if resident else False,
        frame_copies=gen.frame_copies(),
        tagged_outputs=gen.tagged_outputs,
        task_phases=gen.task_phases(),
        copied_floats=gen.copied_floats,
    )


__all__ = ["KERNEL_NAME", "RESIDENT_KERNEL_NAME", "CodeSettings", "Kernel", "generate"]
