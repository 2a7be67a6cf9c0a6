"""The step kernel on the GPU: compile it and hold its device buffers.

:class:`CompiledStep` is a lowered, scheduled, generated and NVRTC-compiled program with its
device buffers (weights, flag-tagged values, per-block launch counters, the range table), and
``launch`` / ``args`` to run it on device pointers. :func:`prepare_tactics` generates and compiles
a build's tactics side by side. The engines run it: ``engines/stepkernel.py`` puts it behind the
executor's ``Plan`` interface and binds it to host memory for ``Session.step`` (the compiler
knows nothing of the engines: it sits below them).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from framefuse.compiler.codegen import KERNEL_NAME, RESIDENT_KERNEL_NAME, TRACE_SLOTS, CodeSettings, Kernel, generate
from framefuse.compiler.ir import CompileError, Program
from framefuse.compiler.memo import cached_program, cached_schedule
from framefuse.compiler.schedule import THREADS, Schedule, hybrid_recurrences, replica_capped, shared_enumerations

# The step kernel's math: denormals flushed to zero, division and square root to 2 ulp (full range:
# inf and NaN as IEEE), exp as the __expf intrinsic (codegen.EXP_INTRINSIC). Measured on the H100:
# 0.1-1.2 us a step faster than exact IEEE math for every zoo architecture and real model timed,
# outputs within 9e-6 of the exact kernel's a step (bench/h100/2026-11-26-session/); the GPU tests
# hold it to 1e-4 of ONNX Runtime over chained steps, NaN and Inf frames included.
# ``CompiledStep(fast_math=False)`` (``framefuse build --exact-math``) compiles with exact IEEE
# math. Not NVRTC's --use_fast_math,
# which also made GPT-2's GELU NaN (powf of a negative base).
FAST_MATH = True
FAST_MATH_OPTIONS = ("-ftz=true", "-prec-div=false", "-prec-sqrt=false")
EXACT_MATH_OPTIONS = ("-DFFK_EXACT_MATH",)

CANDIDATE = "stepkernel"
# Shared memory kept back from the opt-in limit for the kernel's static shared variables.
STATIC_SMEM_RESERVE = 1024


def _cuda():
    from framefuse.plugins import cuda

    return cuda


def write_source(kernel: Kernel) -> Path:
    """The generated source in the kernel cache (named by its hash), written atomically once."""
    cuda = _cuda()
    path = cuda.cache_dir() / f"stepkernel-{kernel.digest[:24]}.cu"
    if not path.exists():
        cuda._atomic_write(path, kernel.source.encode())
    return path


@dataclass(frozen=True)
class StepSource:
    """A step program scheduled and generated for one GPU (its properties) and written to the
    kernel cache, not yet compiled: what :func:`prepare_tactics` hands to NVRTC and
    :class:`CompiledStep` loads."""

    program: Program
    schedule: Schedule
    kernel: Kernel
    path: Path
    props: Mapping
    grid: int
    threads: int
    prefetch: bool
    fast_math: bool
    schedule_s: float  # scheduling (or the memo's answer) and code generation
    # prepare_step's schedule arguments that made it (with the kernel's settings: the same tactic
    # prepared again, over another grid, see rescheduled)
    schedule_arguments: Mapping = field(default_factory=dict)

    def rescheduled(self, grid: int) -> StepSource:
        """The same tactic (schedule arguments, code settings, math) over ``grid`` blocks: the
        resident kernel limited to fewer SMs (``resident_sms``)."""
        return self._prepared_again(int(grid), self.kernel.settings)

    def with_settings(self, **fields) -> StepSource:
        """The same schedule with code settings ``fields`` replaced (codegen.CodeSettings.of): the
        resident kernel with tagged outputs beside a launched kernel without them."""
        return self._prepared_again(self.grid, CodeSettings.of(self.kernel.settings, **fields))

    def traced(self) -> StepSource:
        """The same source with the timeline trace (CompiledStep.timeline): each block stamps its
        tasks' entry, inputs and exit, launched or resident."""
        return self._prepared_again(self.grid, self.kernel.settings, trace=True)

    def _prepared_again(self, grid: int, settings: CodeSettings, trace: bool | None = None) -> StepSource:
        arguments = dict(self.schedule_arguments, grid=grid, threads=self.threads)
        arguments.pop("hybrid_threads", None)  # the threads it chose are the source's own
        return prepare_step(
            self.program,
            self.props,
            prefetch=self.prefetch,
            fast_math=self.fast_math,
            settings=settings,
            trace=self.kernel.trace if trace is None else trace,
            **arguments,
        )

    @property
    def nvrtc_options(self) -> tuple[str, ...]:
        return FAST_MATH_OPTIONS if self.fast_math else EXACT_MATH_OPTIONS

    @property
    def cc(self) -> int:
        major, minor = self.props["cc"]
        return int(major) * 10 + int(minor)


def _grid_and_smem(props: Mapping, grid: int | None, grid_fraction: float) -> tuple[int, int]:
    """The blocks of a schedule (``grid``, else ``grid_fraction`` of the SMs) and the shared memory
    (bytes) a block's arrays may use on a GPU of ``props``."""
    grid = int(grid or max(1, round(props["sm_count"] * grid_fraction)))
    return grid, int(props["max_shared_per_block_optin"]) - STATIC_SMEM_RESERVE


def prepare_step(
    program: Program,
    props: Mapping,
    *,
    grid: int | None = None,
    threads: int = THREADS,
    prefetch: bool = True,
    trace: bool = False,
    grid_fraction: float = 1.0,
    fast_math: bool | None = None,
    replica_floats: int | None = None,
    hybrid_threads: int | None = None,
    recomputed_scalars: int | None = None,
    replicated_dot_macs: int | None = None,
    settings: CodeSettings | None = None,
    **fields,
) -> StepSource:
    """Schedule and generate ``program`` for a GPU of ``props`` (cuda.device_properties: "name",
    "cc", "sm_count", "max_shared_per_block_optin"; no GPU is touched) and write its source.

    The schedule: ``grid`` blocks (default one per SM, or ``grid_fraction`` of the SMs) of
    ``threads``; ``replica_floats``: the schedule's cap on a task whose blocks copy the same values
    whole, schedule.schedule (where no task of the plain schedule exceeds it, the plain schedule);
    ``hybrid_threads``: blocks of this many threads where the schedule at ``threads`` holds a
    recurrence's R partly in registers, schedule.hybrid_recurrences (where none does, the plain
    schedule); ``recomputed_scalars``: arrays of at most this many cheap scalars recomputed by
    their readers, schedule.RECOMPUTED_SCALARS; ``replicated_dot_macs``: products computed by every
    block that reads them where a block's share is at most this many multiply-adds,
    schedule.REPLICATED_DOT_MACS (where that changes nothing, the plain schedule).

    The code: ``settings`` with ``fields`` replaced (codegen.CodeSettings.of: ``weight_format``,
    ``lossless_rows``, ``copy_pieces``, ``paced_copies``, ``skewed_sums``, ``lane_cells``,
    ``alias_views``, ``one_pass``, ``inputs_ahead``, ``take_together``, ``input_helpers``,
    ``x_in_registers``; each documented there; a setting that applies nowhere in the program leaves
    the plain source)."""
    settings = CodeSettings.of(settings, **fields)
    major, minor = props["cc"]
    if major < 8:
        raise CompileError(
            f"the step kernel needs compute capability 8.0+ (cp.async); {props['name']} is {major}.{minor}"
        )
    if not 0.0 < grid_fraction <= 1.0:
        raise CompileError(f"grid_fraction must be in (0, 1], got {grid_fraction}")
    schedule_arguments = {
        "grid": grid,
        "threads": threads,
        "grid_fraction": grid_fraction,
        "replica_floats": replica_floats,
        "hybrid_threads": hybrid_threads,
        "recomputed_scalars": recomputed_scalars,
        "replicated_dot_macs": replicated_dot_macs,
    }
    grid, smem_limit = _grid_and_smem(props, grid, grid_fraction)
    start = time.perf_counter()
    # the same schedule for the tactics that differ only in the code (compiler.memo)
    scalars = {"recomputed_scalars": recomputed_scalars, "replicated_dot_macs": replicated_dot_macs}
    schedule = cached_schedule(program, grid=grid, threads=threads, smem_floats=smem_limit // 8, **scalars)
    if hybrid_threads is not None and hybrid_threads != threads and hybrid_recurrences(schedule):
        threads = int(hybrid_threads)
        schedule = cached_schedule(program, grid=grid, threads=threads, smem_floats=smem_limit // 8, **scalars)
    if replica_floats is not None and replica_capped(schedule, replica_floats):
        schedule = cached_schedule(
            program, grid=grid, threads=threads, smem_floats=smem_limit // 8, replica_floats=replica_floats, **scalars
        )
    kernel = generate(schedule, smem_limit_bytes=smem_limit, prefetch=prefetch, trace=trace, settings=settings)
    schedule_s = time.perf_counter() - start
    return StepSource(
        program,
        schedule,
        kernel,
        write_source(kernel),
        dict(props),
        grid,
        threads,
        prefetch,
        FAST_MATH if fast_math is None else bool(fast_math),
        schedule_s,
        schedule_arguments,
    )


# NVRTC compiles of the build's tactics at once (prepare_tactics): xlstm's T = 32 window has seven
# distinct tactic sources of 4.4-5.8 s each (33.6 s in all on a 2-core CPU), compiled one after the
# other in the build before (its whole build took 175 s on the H100's host). cuda-bindings releases
# the GIL in nvrtcCompileProgram (NVIDIA/cuda-python#624): two window sources compiled in two
# threads took 3.2 s against 5.9 s one after the other (2-core CPU, cuda-bindings 13.4.4, NVRTC
# 13.5), so threads suffice. On that 2-core CPU a whole build's tactics gain little (the zoo
# attention window: 17.2 s with one compile thread beside the generation, 17.6 s with two: two
# cores); the GPU hosts have 16 (not measured there yet).
# A tactic that compiles a program unrolled (roll_recurrences False: stepkernel-unrolled) is tried
# only where that program has at most this many nodes: scheduling is superlinear in the copies (the
# MLP cell loop's 329 nodes at T = 8 took 15 s on a 2-core CPU, its 1265 at T = 32 many minutes),
# and a loop rolled from that many copies is the faster kernel anyway (the nn.RNNCell loop at T = 32,
# 456 nodes unrolled: rolled 35 us, unrolled 79 on the H100).
UNROLLED_TACTIC_MAX_NODES = 512
# A tactic's arguments that choose the lowering (memo.cached_program), not the schedule or the code
LOWERING_ARGUMENTS = ("compose_input", "roll_recurrences", "widen_storage", "split")
NVRTC_WORKERS = 8  # the environment's FRAMEFUSE_NVRTC_WORKERS replaces it (1: one compile at a time)


def nvrtc_workers() -> int:
    """How many NVRTC compiles prepare_tactics runs at once: FRAMEFUSE_NVRTC_WORKERS or NVRTC_WORKERS."""
    raw = os.environ.get("FRAMEFUSE_NVRTC_WORKERS")
    if raw is None or not raw.strip():
        return NVRTC_WORKERS
    try:
        workers = int(raw)
    except ValueError:
        workers = 0
    if workers < 1:
        raise CompileError(f"FRAMEFUSE_NVRTC_WORKERS={raw!r}: give a whole number of compiles at once, 1 or more")
    return workers


def device_properties(device) -> dict:
    """cuda.device_properties of a torch CUDA device, torch's primary context made first (see
    DESIGN.md gotchas)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.zeros(1, device=device)
    return _cuda().device_properties(index)


def _compile_image(source: StepSource) -> float:
    """NVRTC for ``source`` into the kernel cache (a later load reads it there); its seconds."""
    start = time.perf_counter()
    _cuda().compile_cached(source.path, source.cc, source.nvrtc_options)
    return time.perf_counter() - start


def _split_saves_levels(model_or_path, program: Program, props: Mapping, lowering: dict, arguments: dict) -> None:
    """Decline a tactic that splits products (simplify.SplitProducts) unless its schedule has
    fewer dependency levels than the same tactic's without splitting: a split that saves no level
    only moves a recurrence onto fewer blocks (an LSTM layer's input product)."""
    plain = cached_program(model_or_path, **{**lowering, "split": False})
    if plain is program:
        raise CompileError("no product of a recurrence's output to split into partial sums")
    threads = int(arguments.get("threads") or THREADS)
    grid, smem_limit = _grid_and_smem(props, arguments.get("grid"), arguments.get("grid_fraction", 1.0))
    smem = smem_limit // 8
    scalars = {k: arguments.get(k) for k in ("recomputed_scalars", "replicated_dot_macs")}
    before = cached_schedule(plain, grid=grid, threads=threads, smem_floats=smem, **scalars).levels()
    after = cached_schedule(program, grid=grid, threads=threads, smem_floats=smem, **scalars).levels()
    if after >= before:
        raise CompileError(
            f"its products split into partial sums schedule into {after} levels, not fewer than {before}"
        )


def prepare_tactics(
    model_or_path,
    props: Mapping,
    tactics: Mapping[str, Mapping],
    *,
    fast_math: bool | None = None,
    workers: int | None = None,
    compile_image=None,
    log=None,
) -> dict[str, StepSource | Exception]:
    """Every tactic's source (``tactics``: name -> prepare_step's arguments and the lowering's
    LOWERING_ARGUMENTS, as engines.fusion.STEPKERNELS), generated in order
    while NVRTC compiles the sources already written, ``workers`` threads at a time (default:
    nvrtc_workers()). A source another tactic already has is compiled once. Returns, per tactic in
    order, its StepSource (compiled: a load reads the kernel cache) or the exception that declined
    it (the compiler's, or NVRTC's for its source); when the first tactic declines, the others are
    not tried (they lower the same program) and map to its exception. ``compile_image(source)``
    compiles one source and returns its seconds (default: NVRTC into the kernel cache)."""
    from concurrent.futures import ThreadPoolExecutor

    compile_image = compile_image or _compile_image
    workers = max(1, int(workers or nvrtc_workers()))
    results: dict[str, StepSource | Exception] = {}
    compiles: dict[tuple, object] = {}  # (source digest, options) -> its compile's future
    start = time.perf_counter()
    with (
        ThreadPoolExecutor(max_workers=min(workers, max(1, len(tactics)))) as pool,
        shared_enumerations(),
    ):
        first_failure: Exception | None = None
        for i, (name, arguments) in enumerate(tactics.items()):
            if first_failure is not None:
                results[name] = first_failure
                continue
            arguments = dict(arguments)
            lowering = {key: arguments.pop(key, None) for key in LOWERING_ARGUMENTS}
            lowering["widen_storage"] = bool(lowering["widen_storage"])
            try:
                program = cached_program(model_or_path, **lowering)
                nodes = len(program.nodes())
                if lowering["roll_recurrences"] is False and nodes > UNROLLED_TACTIC_MAX_NODES:
                    raise CompileError(
                        f"the unrolled program has {nodes} nodes, more than {UNROLLED_TACTIC_MAX_NODES} "
                        "(compiler.engine.UNROLLED_TACTIC_MAX_NODES): its schedule would take minutes"
                    )
                if lowering["split"]:
                    _split_saves_levels(model_or_path, program, props, lowering, arguments)
                source = prepare_step(program, props, fast_math=fast_math, **arguments)
            except Exception as exc:  # the compiler declines the graph: reported by the caller
                results[name] = exc
                first_failure = exc if i == 0 else None
                continue
            results[name] = source
            key = (source.kernel.digest, source.nvrtc_options)
            if key not in compiles:
                compiles[key] = pool.submit(compile_image, source)
        for name, source in list(results.items()):
            if isinstance(source, StepSource):
                future = compiles[(source.kernel.digest, source.nvrtc_options)]
                try:
                    future.result()
                except Exception as exc:  # NVRTC's error for this source
                    results[name] = exc
        seconds = sum(f.result() for f in compiles.values() if f.exception() is None)
    if log is not None and compiles:
        log(
            f"stepkernel: {len(compiles)} tactic source(s) generated and compiled in "
            f"{time.perf_counter() - start:.1f} s ({seconds:.1f} s of NVRTC compiles, up to "
            f"{min(workers, len(compiles))} at a time)"
        )
    return results


class CompiledStep:
    """A step program compiled for one CUDA device, with its device buffers."""

    def __init__(
        self,
        program: Program,
        *,
        device: torch.device,
        source: StepSource | None = None,
        log=None,
        **arguments,
    ):
        """``arguments``: prepare_step's (the schedule's and the code's) for ``device``; or
        ``source``, the program's kernel from :func:`prepare_step` / :func:`prepare_tactics` for
        this device (then no other argument is given)."""
        cuda = _cuda()
        self.device = torch.device(device)
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.device_index = index
        props = device_properties(self.device)
        self.props = props
        if source is None:
            source = prepare_step(program, props, **arguments)
        elif arguments:
            raise CompileError(
                f"a prepared step source carries its own tactic: {', '.join(sorted(arguments))} not used"
            )
        elif source.program is not program or tuple(source.props["cc"]) != tuple(props["cc"]):
            raise CompileError("the prepared step source is for another program or GPU")
        self.source = source
        self.program = program
        self.schedule = source.schedule
        self.kernel = source.kernel
        self.settings = self.kernel.settings
        self.kernel_prefetch = source.prefetch
        self.schedule_s = source.schedule_s
        grid, threads = source.grid, source.threads
        start = time.perf_counter()
        self.fast_math = source.fast_math
        self.nvrtc_options = source.nvrtc_options
        self.fn = cuda.get_kernel(source.path, KERNEL_NAME, self.nvrtc_options, device=index)
        self.compile_s = time.perf_counter() - start
        if self.kernel.smem_bytes > 48 * 1024:
            self.fn.set_max_dynamic_shared_memory(self.kernel.smem_bytes)
        self._check_residency(grid, threads)
        self.grid, self.threads = grid, threads
        k = self.kernel
        self.weights = torch.from_numpy(k.weights()).to(self.device)
        self.flags = torch.zeros(max(k.layout.ll_words, 1), dtype=torch.int64, device=self.device)
        self.counters = torch.zeros(grid, dtype=torch.int64, device=self.device)
        self.ranges = torch.from_numpy(k.ranges()).to(self.device)
        # where the done words go when nobody waits on them (device-tensor launches)
        self.done_scratch = torch.zeros(max(k.done_words, 1), dtype=torch.int32, device=self.device)
        self.trace = (
            torch.zeros((grid, len(self.schedule.tasks) + 1, TRACE_SLOTS), dtype=torch.int64, device=self.device)
            if self.kernel.trace
            else None
        )
        # every input and output is float32 (the IR's one dtype); the engines' specs are built from these
        self.input_shapes = {
            n: tuple(program.inputs[n].shape if n in program.inputs else program.states[n].shape)
            for n in list(program.inputs) + list(program.states)
        }
        self.output_shapes = {n: tuple(node.shape) for n, node in program.outputs.items()}
        if log is not None:
            d = self.describe()
            log(
                f"stepkernel: {d['tasks']} tasks, {d['levels']} dependency levels, {d['kernel_phases']} phases"
                f"{' (the frame published with its scalars)' if d['framed'] else ''}, grid {grid} x {threads}, "
                f"{d['smem_bytes']} B shared memory, source {d['source_sha256'][:12]} "
                f"(scheduled in {self.schedule_s:.2f} s, loaded in {self.compile_s:.2f} s: NVRTC or the kernel cache)"
            )

    def _check_residency(self, grid: int, threads: int, fn=None, smem_bytes: int | None = None) -> None:
        """Every block must be resident at once (they wait on one another): one block per SM."""
        cuda = _cuda()
        driver = cuda._driver()
        fn = fn or self.fn
        smem_bytes = self.kernel.smem_bytes if smem_bytes is None else smem_bytes
        per_sm = int(
            cuda._check(
                driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn._function, threads, smem_bytes),
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            )
        )
        if per_sm < 1 or grid > per_sm * self.props["sm_count"]:
            raise CompileError(
                f"the step kernel's {grid} blocks of {threads} threads and {smem_bytes} B shared memory "
                f"cannot all be resident on {self.props['name']} ({per_sm} per SM x {self.props['sm_count']} SMs)"
            )

    def describe(self) -> dict:
        from framefuse.compiler.schedule import frame_source

        info = self.kernel.describe()
        info.update(
            {
                # the first layer's products read the frame, published with its scalars by one block
                "framed": any(frame_source(t.root) is not None for t in self.schedule.tasks),
                "gpu": self.props["name"],
                "arch": self.props["arch"],
                "nvrtc_options": list(self.nvrtc_options),
                "registers": self.fn.attribute("NUM_REGS"),
                "local_bytes": self.fn.attribute("LOCAL_SIZE_BYTES"),
                # build time: scheduling and generation (or the memo's answer), then the module's
                # load (NVRTC, or the kernel cache prepare_tactics filled)
                "schedule_s": round(self.schedule_s, 3),
                "load_s": round(self.compile_s, 3),
            }
        )
        return info

    def args(
        self,
        inputs: Sequence[int],
        outputs: Sequence[int],
        states_in: Sequence[int],
        states_out: Sequence[int],
        done: int | None = None,
    ):
        """The kernel's arguments; ``done`` is the address of ``kernel.done_words`` 32-bit words
        the host-facing blocks raise (mapped host memory for a host wait; a device scratch buffer
        when not given)."""
        ptr = ctypes.c_void_p
        return (
            [ptr(p) for p in inputs]
            + [ptr(p) for p in outputs]
            + [ptr(p) for p in states_in]
            + [ptr(p) for p in states_out]
            + [
                ptr(self.weights.data_ptr()),
                ptr(self.flags.data_ptr()),
                ptr(self.counters.data_ptr()),
                ptr(self.ranges.data_ptr()),
                ptr(self.done_scratch.data_ptr() if done is None else done),
            ]
            + ([ptr(self.trace.data_ptr())] if self.trace is not None else [])
        )

    def timeline(self, resident: bool = False) -> list[dict]:
        """Per task, from the last traced launch (trace=True): when the blocks entered it, had
        their inputs, and left it (µs after the first block entered the kernel; median and latest
        over the task's blocks, and each block's in ``block_us``); the last row is the kernel's own:
        entry, prologue done (the prefetch copies issued), end. ``resident``: the last frame of
        the resident kernel (read once it has stopped), in µs after the median block entered the
        frame: the blocks that wait for the go enter together, while a frame block enters before
        it polls its words."""
        if self.trace is None:
            raise CompileError("compile with trace=True for a timeline")
        stamps = self.trace.cpu().numpy().astype(np.float64)
        n = len(self.schedule.tasks)
        entries = stamps[:, n, 0]
        entered = entries[entries > 0]
        start = (float(np.median(entered)) if resident else entered.min()) if len(entered) else 0.0
        rows = []
        for t, task in enumerate(self.schedule.tasks):
            blocks = stamps[task.first : task.first + task.blocks, t, :3]
            rel = (blocks - start) / 1e3
            clocks = stamps[task.first : task.first + task.blocks, t, 3:]
            clocks = clocks[:, (clocks != 0).any(axis=0)]
            cycles = np.diff(clocks, axis=1) if clocks.shape[1] > 1 else np.zeros((len(clocks), 0))
            rows.append(
                {
                    "task": t,
                    "value": task.root.label or repr(task.root),
                    "blocks": task.blocks,
                    "phases": self.kernel.task_phases[t],
                    "enter_us": [round(float(np.median(rel[:, 0])), 2), round(float(rel[:, 0].max()), 2)],
                    "ready_us": [round(float(np.median(rel[:, 1])), 2), round(float(rel[:, 1].max()), 2)],
                    "exit_us": [round(float(np.median(rel[:, 2])), 2), round(float(rel[:, 2].max()), 2)],
                    "phase_cycles": [int(np.median(c)) for c in cycles.T] if len(cycles) else [],
                    # each of its blocks (task.first on): entry, inputs, exit
                    "block_us": np.round(rel, 2).tolist(),
                }
            )
        rel = (stamps[:, n, :3] - start) / 1e3
        rows.append(
            {
                "task": "kernel",
                "value": "entry / prologue done / end, every block",
                "blocks": self.grid,
                "phases": 0,
                "enter_us": [round(float(np.median(rel[:, 0])), 2), round(float(rel[:, 0].max()), 2)],
                "ready_us": [round(float(np.median(rel[:, 1])), 2), round(float(rel[:, 1].max()), 2)],
                "exit_us": [round(float(np.median(rel[:, 2])), 2), round(float(rel[:, 2].max()), 2)],
                "phase_cycles": [],
            }
        )
        return rows

    def with_tagged_outputs(self) -> CompiledStep:
        """This step with its outputs as tagged words (the same schedule, codegen.TAGGED_OUTPUTS):
        itself where they are already, else compiled on first use and kept (its own weights,
        flagged words and counters): a resident binding's kernel beside an untagged launched one
        (engines/stepkernel.RESIDENT_TAGGED_OUTPUTS)."""
        if self.kernel.tagged_outputs:
            return self
        if getattr(self, "_tagged", None) is None:
            self._tagged = CompiledStep(
                self.program, device=self.device, source=self.source.with_settings(tagged_outputs=True)
            )
        return self._tagged

    def forget_resident(self) -> None:
        """The resident kernels (this step's and its tagged twin's) generated and compiled again on
        next use, with the codegen settings then in force (bench/microbench/resident_variants.py)."""
        self._resident_fn = None
        if getattr(self, "_tagged", None) is not None:
            self._tagged._resident_fn = None

    def resident_fn(self):
        """The resident kernel of the same schedule (ffk_resident: launched once, a frame per
        bell), compiled on first use; it shares this kernel's weights, flags, counters and
        range table (the same layout, checked)."""
        if getattr(self, "_resident_fn", None) is None:
            cuda = _cuda()
            smem_limit = int(self.props["max_shared_per_block_optin"]) - STATIC_SMEM_RESERVE
            kernel = generate(
                self.schedule,
                smem_limit_bytes=smem_limit,
                prefetch=self.kernel_prefetch,
                resident=True,
                settings=self.settings,
                trace=self.kernel.trace,
            )
            if kernel.smem_bytes != self.kernel.smem_bytes or not np.array_equal(kernel.ranges(), self.kernel.ranges()):
                raise CompileError("the resident kernel's layout differs from the launched kernel's (a compiler bug)")
            fn = cuda.get_kernel(
                write_source(kernel), RESIDENT_KERNEL_NAME, self.nvrtc_options, device=self.device_index
            )
            if kernel.smem_bytes > 48 * 1024:
                fn.set_max_dynamic_shared_memory(kernel.smem_bytes)
            self._check_residency(self.grid, self.threads, fn, kernel.smem_bytes)
            self.resident_kernel, self._resident_fn = kernel, fn
        return self._resident_fn

    def launch(self, args, stream=None) -> None:
        self.fn.launch(
            self.grid,
            self.threads,
            args,
            shared_mem=self.kernel.smem_bytes,
            stream=stream,
            op="stepkernel",
            detail=f"source {self.kernel.digest[:12]}",
        )


def compile_step(
    model_or_path,
    *,
    device,
    compose_input=None,
    roll_recurrences=None,
    widen_storage=False,
    split=None,
    log=None,
    **arguments,
) -> CompiledStep:
    """Lower, schedule, generate and compile a fused step graph for ``device``: ``compose_input``,
    ``roll_recurrences``, ``split``: see lower_program; ``widen_storage``: an fp16 / bf16 build's graph,
    lower.lower_model; ``arguments``: prepare_step's, the schedule's (``grid``, ``threads``,
    ``grid_fraction``, ``fast_math`` (see FAST_MATH_OPTIONS), ``replica_floats``, ...) and the
    code's (codegen.CodeSettings: ``weight_format``, ``one_pass``, ...). The program is lowered
    once for the build's tactics (compiler.memo)."""
    program = cached_program(
        model_or_path,
        compose_input=compose_input,
        roll_recurrences=roll_recurrences,
        widen_storage=widen_storage,
        split=split,
    )
    return CompiledStep(program, device=device, log=log, **arguments)


def dump_source(compiled: CompiledStep, folder) -> Path:
    folder = Path(os.fspath(folder))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"stepkernel-{compiled.kernel.digest[:12]}.cu"
    _cuda()._atomic_write(target, compiled.kernel.source.encode())
    return target


__all__ = [
    "CANDIDATE",
    "CompiledStep",
    "StepSource",
    "compile_step",
    "device_properties",
    "dump_source",
    "prepare_step",
    "prepare_tactics",
]
