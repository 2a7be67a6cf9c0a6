"""The step compiler's kernel as an engine: the executor's ``Plan`` and the per-frame bindings.

:class:`StepKernelPlan` is a :class:`~framefuse.compiler.engine.CompiledStep` behind the
executor's ``Plan`` interface (device tensors in, device tensors out), so the cuda-graph engine's
build-time selection times it against the other candidates like any plan. :class:`StepBinding`
is the per-frame path ``Session.step`` uses: graph inputs are read by the kernel straight from
pinned, mapped host memory and graph outputs written straight to it, the recurrent state stays
in device memory in two halves (the kernel reads one and writes the other; two captured graphs,
one per parity), so a step is one kernel node in a CUDA graph and nothing else.
:class:`ResidentStepBinding` (``Session(resident=True)``) launches the same body once as a loop
over frames and rings it per frame: no launch at all.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from framefuse.compiler.engine import CompiledStep
from framefuse.engines import hostpath
from framefuse.engines.base import BindingBase, EngineBuildError, EngineRunError, IOSpec, run_host
from framefuse.engines.executor import Step


def _cuda():
    from framefuse.plugins import cuda

    return cuda


# Measured (session 58, H100 and H200, bench/microbench/resident_first_kernel.py --case ...): beside
# a resident step kernel on 16 SMs the process's first torch.sum waits until the session stops, under
# CUDA_MODULE_LOADING=EAGER as under LAZY (so not only CUDA's lazy loading, session 57's suspect),
# while a first elementwise kernel (bitwise_xor), torch.arange, torch.cummax, a 256 MB allocation and
# a sum run once before the session started all finish; torch.cuda.synchronize() waits (device-wide,
# as it must). It fits what meta-pytorch/torchcomms#2334 reproduced beside a persistent kernel: a
# module loaded at a kernel's first launch (cuLibraryLoadData) waits for the device's work to drain,
# holding the context lock; so something torch.sum's first launch loads is loaded then even under
# EAGER (not known what; a first cudaMemsetAsync is the next suspect, --case memset). A resident
# kernel on resident_sms SMs is meant to run beside the program's own GPU work, so such a session
# says so once.
BESIDE_RESIDENT_WARNING = (
    "resident_sms={sms}: GPU work run for the first time beside a resident step kernel can wait until "
    "the session stops (measured: the process's first torch.sum, under CUDA_MODULE_LOADING=EAGER too; "
    "under the default lazy loading any kernel's first launch may): run the GPU work the program does "
    "beside it once before the session starts, and do not synchronize the whole device "
    "(torch.cuda.synchronize) while it runs"
)


def warn_beside_resident(sms: int) -> None:
    """The RuntimeWarning of a resident kernel limited to ``sms`` SMs (BESIDE_RESIDENT_WARNING),
    naming the caller's line outside framefuse."""
    warnings.warn(BESIDE_RESIDENT_WARNING.format(sms=sms), RuntimeWarning, stacklevel=_caller_stacklevel())


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel, called from the function that warns, naming the first frame
    outside the framefuse package: the user's Session(...) line, not the engine's (Python 3.11 has
    no skip_file_prefixes)."""
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


class _PinnedAllocation:
    """One cuMemHostAlloc allocation, freed when the last numpy/torch view of it goes: the views
    hold it as their base (``__array_interface__``), so an output a caller keeps stays valid after
    its session is gone (``Session(...).step(frame).copy()`` read freed memory before)."""

    def __init__(self, nbytes: int, write_combined: bool = False):
        cuda = _cuda()
        driver = cuda._driver()
        cuda.ensure_context()
        flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
        if write_combined:
            flags |= driver.CU_MEMHOSTALLOC_WRITECOMBINED
        self.host = int(cuda._check(driver.cuMemHostAlloc(nbytes, flags), "cuMemHostAlloc"))
        self._driver = driver
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (self.host, False), "version": 3}

    def __del__(self):
        host = getattr(self, "host", 0)
        if host:
            try:
                self._driver.cuMemFreeHost(host)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
            self.host = 0


class MappedHostBuffer:
    """Pinned host memory the GPU reads and writes directly (cuMemHostAlloc, DEVICEMAP): a numpy
    view, a torch CPU view and the device address of the same bytes. The memory lives as long as
    any of the views does.

    ``write_combined`` (CU_MEMHOSTALLOC_WRITECOMBINED): the CPU does not cache it, so its stores
    leave through the write-combining buffers, weakly ordered, until a store fence
    (hostpath.store_fence) sends them, and its reads are uncached (slow): memory the host only
    writes and the GPU only reads."""

    def __init__(self, shape: Sequence[int], dtype=np.float32, write_combined: bool = False):
        cuda = _cuda()
        driver = cuda._driver()
        self.shape = tuple(int(d) for d in shape)
        self.write_combined = bool(write_combined)
        count = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = max(count * np.dtype(dtype).itemsize, 4)
        allocation = _PinnedAllocation(self.nbytes, self.write_combined)
        self.device_ptr = int(
            cuda._check(driver.cuMemHostGetDevicePointer(allocation.host, 0), "cuMemHostGetDevicePointer")
        )
        self.array = np.asarray(allocation).view(dtype)[:count].reshape(self.shape)
        self.array[...] = 0
        self.tensor = torch.from_numpy(self.array)


class StepKernelPlan:
    """The compiled step behind the executor's Plan interface: ``execute(feeds)`` launches the
    kernel on torch's current stream over device tensors (capturable), for build-time selection."""

    def __init__(self, compiled: CompiledStep, input_specs: Mapping[str, IOSpec], output_specs: Mapping[str, IOSpec]):
        self.compiled = compiled
        self.device = compiled.device
        self.input_specs = dict(input_specs)
        self.output_specs = dict(output_specs)
        self._check_specs()
        self.steps = [Step("stepkernel", "StepKernel", None, [], [], list(self.output_specs))]
        self.folded: list[str] = []
        self.constants: dict = {}
        self.output_sources = {n: ("env", n) for n in self.output_specs}
        self._outputs: dict[str, torch.Tensor] | None = None
        self._words: dict[str, torch.Tensor] | None = None  # tagged outputs (codegen.TAGGED_OUTPUTS)

    @classmethod
    def of(cls, compiled: CompiledStep) -> StepKernelPlan:
        """The plan of a compiled step over its own inputs and outputs (all float32)."""
        return cls(
            compiled,
            {n: IOSpec(n, shape, torch.float32) for n, shape in compiled.input_shapes.items()},
            {n: IOSpec(n, shape, torch.float32) for n, shape in compiled.output_shapes.items()},
        )

    def _check_specs(self) -> None:
        c = self.compiled
        for name, spec in self.input_specs.items():
            mine = c.input_shapes.get(name)
            if mine is None or mine != tuple(spec.shape) or spec.dtype != torch.float32:
                raise EngineBuildError(f"stepkernel: input '{name}' {list(spec.shape)} {spec.dtype} does not match")
        for name, spec in self.output_specs.items():
            mine = c.output_shapes.get(name)
            if mine is None or mine != tuple(spec.shape) or spec.dtype != torch.float32:
                raise EngineBuildError(f"stepkernel: output '{name}' {list(spec.shape)} {spec.dtype} does not match")

    def execute(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c = self.compiled
        k = c.kernel
        if self._outputs is None:
            self._outputs = {
                n: torch.empty(s.shape, dtype=torch.float32, device=self.device) for n, s in self.output_specs.items()
            }
        program = c.program
        if k.tagged_outputs and self._words is None:  # each output float a word (epoch << 32) | bits
            self._words = {
                n: torch.zeros(self._outputs[n].shape, dtype=torch.int64, device=self.device) for n in k.output_names
            }
        outs = self._words if k.tagged_outputs else self._outputs
        args = c.args(
            [feeds[n].data_ptr() for n in k.input_names],
            [outs[n].data_ptr() for n in k.output_names],
            [feeds[n].data_ptr() for n in k.state_names],
            [self._outputs[program.state_of[n]].data_ptr() for n in k.state_names],
        )
        c.launch(args)
        if k.tagged_outputs:  # the words' low halves (little-endian) are the floats
            for n in k.output_names:
                self._outputs[n].copy_(self._words[n].view(torch.float32)[..., 0::2])
        return self._outputs

    def create_binding(
        self, engine, *, host_inputs, host_outputs, state_pairs, input_buffers=None, resident=False
    ) -> StepBinding:
        """``resident``: False, True (the kernel on every SM, as built) or a number of SMs (the
        program scheduled again over that many blocks, the rest of the GPU left free)."""
        if resident:
            sms = None if resident is True else resident
            return ResidentStepBinding(self, engine, host_inputs, host_outputs, state_pairs, input_buffers, sms=sms)
        return StepBinding(self, engine, host_inputs, host_outputs, state_pairs, input_buffers)


# polls of a done word before wait_host falls back to the stream sync (tens of ns a poll: a few ms)
HOST_SPIN_LIMIT = 100_000


class _FastLaunch:
    """cuGraphLaunch and cuStreamSynchronize straight from libcuda through ctypes: the per-frame
    host cost is two foreign calls (cuda-python's wrappers convert their arguments on every call)."""

    _lib = None

    def __init__(self, exec_handle: int, stream_handle: int):
        if _FastLaunch._lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            lib.cuGraphLaunch.restype = ctypes.c_int
            lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
            lib.cuStreamSynchronize.restype = ctypes.c_int
            _FastLaunch._lib = lib
        self.launch_fn = _FastLaunch._lib.cuGraphLaunch
        self.sync_fn = _FastLaunch._lib.cuStreamSynchronize
        self.exec_handle = ctypes.c_void_p(exec_handle)
        self.stream = ctypes.c_void_p(stream_handle)


def fill_launch(state, execs: Sequence[ctypes.c_void_p], stream: ctypes.c_void_p) -> None:
    """A hostpath.FrameState's launch: cuGraphLaunch of ``execs`` (one graph, or one per state
    parity, alternating) on ``stream``, as _FastLaunch holds them."""
    state.launch = ctypes.cast(_FastLaunch._lib.cuGraphLaunch, ctypes.c_void_p).value
    state.exec[0], state.exec[1] = execs[0].value, execs[-1].value
    state.stream = stream.value
    state.n_execs = len(execs)


class _HostField:
    """An attribute kept in the binding's hostpath.FrameState: the native per-frame call
    (hostpath.c) and the Python paths read and write one value."""

    def __init__(self, field: str, kind=int):
        self.field, self.kind = field, kind

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return self.kind(getattr(obj._hs, self.field))

    def __set__(self, obj, value) -> None:
        setattr(obj._hs, self.field, int(value))


def spin_until_answered(words, expected: int, *, polls: int, timeout_s: float, check=None) -> bool:
    """The Python frame path's wait on a resident step (the GPU kernel's done words, the CPU
    worker's answer word): spin until every word holds ``expected``; every ``polls`` spins look at
    the clock (the first look starts the deadline, so a frame that answers within ``polls`` spins
    never reads it) and call ``check()`` (which raises if the answerer died). False once
    ``timeout_s`` has passed without an answer."""
    deadline = 0.0
    for word in words:
        spins = 0
        while word.value != expected:
            spins += 1
            if spins % polls == 0:
                now = time.perf_counter()
                deadline = deadline or now + timeout_s
                if check is not None:
                    check()
                if now > deadline:
                    return False
    return True


class _OutputTags:
    """Tagged output words as spin_until_answered's words: one per output, whose ``value`` is the
    epoch every word of that output carries, or 0 while they differ."""

    class _Tags:
        def __init__(self, tags: np.ndarray):
            self.tags = tags

        @property
        def value(self) -> int:
            first = int(self.tags[0]) if self.tags.size else 0
            return first if bool((self.tags == first).all()) else 0

    def __init__(self, takes):
        self.words = [self._Tags(tags) for _, tags, _, _ in takes]

    def __iter__(self):
        return iter(self.words)


class NativeFrameBinding:
    """What the bindings whose frame is hostpath.c's call share (StepBinding here,
    cpustep.CpuStepBinding): the state in two halves chosen by ``parity`` (``_halves``: name ->
    [half 0, half 1], beside ``_dev_inputs`` and ``_dev_outputs``), and Session.step's native frame
    over the FrameState ``_hs`` (``_hs_ptr``; ``_native``: hostpath.load()'s answer)."""

    parity = _HostField("parity")

    @property
    def replays(self) -> int:
        """Frames run through this binding, those hostpath.c ran included (its FrameState counts
        them: ``_hs`` exists before BindingBase.__init__ sets this to 0)."""
        return self._py_replays + self._hs.launches

    @replays.setter
    def replays(self, value: int) -> None:
        self._py_replays = int(value) - self._hs.launches

    def _count_native_launches(self, engine) -> None:
        """The engine's ``replays`` count this binding's native frames too, until the binding goes."""
        count = getattr(engine, "count_native_launches", None)
        if count is not None:
            count(self._hs)
            weakref.finalize(self, engine.forget_native_launches, self._hs)

    def _native_ready(self) -> bool:
        return self._native is not None

    def _count_frame(self, two_halves: bool) -> None:
        """A frame launched from Python: the next one reads the other state half (where there are
        two), and this binding and its engine count it."""
        if two_halves:
            self.parity ^= 1
        self.replays += 1
        if self.engine is not None:
            self.engine.replays += 1

    @property
    def dev_in(self) -> dict[str, torch.Tensor]:
        current = {n: halves[self.parity] for n, halves in self._halves.items()}
        return {**self._dev_inputs, **current}

    @property
    def dev_out(self) -> dict[str, torch.Tensor]:
        nxt = {out: self._halves[inp][self.parity] for out, inp in self.state_pairs.items()}
        return {**self._dev_outputs, **nxt}

    def native_frame(self, check_input: str | None = None):
        """``(call, argument)`` for Session.step's hot path, or None where hostpath.c is not built
        (or this binding has no done words to wait on): ``call(argument)`` launches a frame whose
        inputs are already in ``host_in`` and waits for its host outputs, in one foreign call,
        after checking the host input ``check_input`` for NaN/Inf (None: no check). It answers
        hostpath.DONE, or a code for ``native_failed``."""
        if not self._native_ready():
            return None
        hs = self._hs
        if check_input is None:
            hs.frame, hs.frame_floats = None, 0
        else:
            array = self.host_in[check_input]
            hs.frame, hs.frame_floats = array.ctypes.data, array.size
        return self._native[0], self._hs_ptr

    def native_failed(self, code: int) -> bool:
        """After ``native_frame``'s call answered ``code``: finish the frame the Python way (wait
        on, launch after a pending launch's wait, start a resident kernel or worker) or raise; True
        when the frame was refused for a NaN/Inf (nothing launched; the caller raises its error).
        For the bindings whose frames are waited on (``wait_host``)."""
        if code == hostpath.NONFINITE:
            return True
        if code == hostpath.SPINNING:
            self.wait_host()
            return False
        if code in (hostpath.UNWAITED, hostpath.NOT_RUNNING):
            self.launch()
            self.wait_host()
            return False
        raise EngineRunError(f"{self._native_label}: the native frame call answered {code}")

    _native_label = "stepkernel"  # names the binding in native_failed's errors

    @property
    def native_state(self):
        """The hostpath.FrameState that native_frame's call runs (for hostpath's extension step,
        which runs the same call from C); None where native_frame is None."""
        return self._hs if self._native_ready() else None

    def native_start_ns(self) -> int:
        """When the last native frame call began (perf_counter_ns's clock)."""
        return self._hs.start_ns


class StepBinding(NativeFrameBinding, BindingBase):
    """Fixed buffers and captured graphs for repeated steps (the engines' Binding protocol, see
    engines/base.py). Host inputs and outputs live in pinned mapped memory the kernel reads and
    writes itself; a state handed to the next step lives in two device halves.

    A frame's host work (the done words cleared, the launch, the spin on the done words, the
    frame's NaN check) is one call into hostpath.c where that is built (``native_frame``); the
    Python methods below do the same where it is not, and every path outside Session.step's."""

    _unwaited = _HostField("unwaited", bool)  # a launch nobody has waited on yet

    def __init__(self, plan: StepKernelPlan, engine, host_inputs, host_outputs, state_pairs, input_buffers=None):
        c = plan.compiled
        k = c.kernel
        self._hs = hostpath.FrameState()
        self._hs_ptr = ctypes.pointer(self._hs)
        super().__init__(
            plan.input_specs, plan.output_specs, plan.device, host_inputs, host_outputs, state_pairs, input_buffers
        )
        self.plan = plan
        self.engine = engine
        paired_inputs = set(self.state_pairs.values())
        self._mapped: dict[str, MappedHostBuffer] = {}
        self._dev_inputs: dict[str, torch.Tensor] = {}
        self._halves: dict[str, list[torch.Tensor]] = {}
        for name, spec in plan.input_specs.items():
            if name in paired_inputs:
                first = self.given(name)
                if first is None:
                    first = torch.zeros(spec.shape, dtype=torch.float32, device=self.device)
                self._halves[name] = [first, torch.zeros_like(first)]
            elif name in self.host_input_names:
                self._mapped[name] = MappedHostBuffer(spec.shape)
            else:
                buffer = self.given(name)
                if buffer is None:
                    buffer = torch.zeros(spec.shape, dtype=torch.float32, device=self.device)
                self._dev_inputs[name] = buffer
        self.host_in = {n: self._mapped[n].array for n in self.host_input_names}
        self.host_in_t = {n: self._mapped[n].tensor for n in self.host_input_names}
        self._out_mapped: dict[str, MappedHostBuffer] = {}
        self._dev_outputs: dict[str, torch.Tensor] = {}
        paired_outputs = set(self.state_pairs)
        for name, spec in plan.output_specs.items():
            if name in paired_outputs:
                continue
            if name in self.host_output_names:
                # tagged outputs (codegen.TAGGED_OUTPUTS): the kernel writes words, the host takes
                # their floats into host_out once each word carries the step's epoch
                self._out_mapped[name] = MappedHostBuffer(
                    spec.shape, dtype=np.uint64 if k.tagged_outputs else np.float32
                )
            else:
                self._dev_outputs[name] = torch.zeros(spec.shape, dtype=torch.float32, device=self.device)
        self.tagged_outputs = bool(k.tagged_outputs)
        # tagged outputs kept on the device (device frames, Session.run): the kernel's words, their
        # floats copied out by a node of the same graph
        self._dev_words = {
            n: torch.zeros(self._dev_outputs[n].shape, dtype=torch.int64, device=self.device)
            for n in (k.output_names if self.tagged_outputs else [])
            if n in self._dev_outputs
        }
        if self.tagged_outputs:
            self.host_out_t = {
                n: torch.zeros(self._out_mapped[n].shape, dtype=torch.float32) for n in self.host_output_names
            }
            self.host_out = {n: t.numpy() for n, t in self.host_out_t.items()}
        else:
            self.host_out = {n: self._out_mapped[n].array for n in self.host_output_names}
            self.host_out_t = {n: self._out_mapped[n].tensor for n in self.host_output_names}
        self._point_output_words(k)
        self.parity = 0
        # the host-facing blocks' done words (see codegen.Generator._done): wait_host spins on them
        self._done = MappedHostBuffer((max(k.done_words, 1),), dtype=np.uint32)
        self._done_addr = self._done.array.ctypes.data
        self._done_nbytes = self._done.array.nbytes
        self._done_words = [ctypes.c_uint32.from_address(self._done_addr + 4 * i) for i in range(k.done_words)]
        self._unwaited = False
        if not self._done_words:  # no block touches host memory: nothing to wait on but the stream
            self.wait_host = self.sync
        self.stream = torch.cuda.Stream(self.device)
        program = c.program
        state_of = program.state_of
        out_of_state = {v: k for k, v in self.state_pairs.items()}  # input -> its next output

        def pointer_in(name: str, parity: int) -> int:
            if name in self._halves:
                return self._halves[name][parity].data_ptr()
            if name in self._mapped:
                return self._mapped[name].device_ptr
            return self._dev_inputs[name].data_ptr()

        def pointer_out(name: str, parity: int) -> int:
            state = next((s for s, o in state_of.items() if o == name), None)
            if state is not None and state in self._halves and out_of_state.get(state) == name:
                return self._halves[state][1 - parity].data_ptr()
            if name in self._out_mapped:
                return self._out_mapped[name].device_ptr
            if name in self._dev_words:
                return self._dev_words[name].data_ptr()
            return self._dev_outputs[name].data_ptr()

        self._graphs = []
        self._launchers = []
        for parity in range(2 if self._halves else 1):
            args = c.args(
                [pointer_in(n, parity) for n in k.input_names],
                [pointer_out(n, parity) for n in k.output_names],
                [pointer_in(n, parity) for n in k.state_names],
                [pointer_out(state_of[n], parity) for n in k.state_names],
                done=self._done.device_ptr,
            )
            graph = torch.cuda.CUDAGraph()
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                c.launch(args)
                for name, words in self._dev_words.items():  # the words' low halves (little-endian)
                    self._dev_outputs[name].copy_(words.view(torch.float32)[..., 0::2])
            raw = getattr(graph, "raw_cuda_graph_exec", None)
            if raw is None:
                raise EngineBuildError(
                    f"stepkernel needs torch.cuda.CUDAGraph.raw_cuda_graph_exec (torch {torch.__version__})"
                )
            self._graphs.append(graph)
            self._launchers.append(_FastLaunch(int(raw()), int(self.stream.cuda_stream)))
        self._launch_fn = self._launchers[0].launch_fn
        self._sync_fn = self._launchers[0].sync_fn
        self._stream_handle = self._launchers[0].stream
        self._execs = [launcher.exec_handle for launcher in self._launchers]
        hs = self._hs
        fill_launch(hs, self._execs, self._stream_handle)
        hs.spin_limit = HOST_SPIN_LIMIT
        self._point_done_words()
        self._native = hostpath.load()
        self._count_native_launches(engine)
        torch.cuda.synchronize(self.device)

    def _point_done_words(self) -> None:
        self._hs.done = self._done_addr
        self._hs.n_done = len(self._done_words)

    def _point_output_words(self, k) -> None:
        """hostpath.c's view of the tagged output words and the floats they go to (none when the
        kernel writes plain floats)."""
        names = [n for n in k.output_names if n in self._out_mapped] if k.tagged_outputs else []
        # (words, their tags, their floats, host_out) per output: the Python path's views
        words = [self._out_mapped[n].array.reshape(-1) for n in names]
        self._out_takes = [
            (w, w.view(np.uint32)[1::2], w.view(np.float32)[0::2], self.host_out[n].reshape(-1))
            for w, n in zip(words, names)
        ]
        count = len(names)
        self._out_words_ptrs = (ctypes.c_void_p * max(count, 1))(
            *[self._out_mapped[n].array.ctypes.data for n in names]
        )
        self._out_float_ptrs = (ctypes.c_void_p * max(count, 1))(*[self.host_out[n].ctypes.data for n in names])
        self._out_lens = (ctypes.c_int64 * max(count, 1))(*[self._out_mapped[n].array.size for n in names])
        self._hs.out_words = ctypes.addressof(self._out_words_ptrs)
        self._hs.out_floats = ctypes.addressof(self._out_float_ptrs)
        self._hs.out_len = ctypes.addressof(self._out_lens)
        self._hs.out_tensors = count

    def _take_outputs(self, expected: int | None, spin: bool = True) -> bool:
        """Tagged outputs: wait until every output word carries ``expected`` (None: any epoch, the
        words were cleared before the launch), then its float into host_out. Without ``spin`` the
        words must be there already (the stream was synchronized). False after HOST_SPIN_LIMIT
        polls of one output without its words."""
        for _, tags, floats, out in self._out_takes:
            spins = 0
            while not (tags.all() if expected is None else bool((tags == expected).all())):
                spins += 1
                if not spin or spins > HOST_SPIN_LIMIT:
                    return False
            np.copyto(out, floats)
        return True

    def _native_ready(self) -> bool:
        return self._native is not None and bool(self._done_words)

    def native_failed(self, code: int) -> bool:
        if code == hostpath.LAUNCH_FAILED:
            raise EngineRunError(f"stepkernel: cuGraphLaunch failed: CUresult {self._hs.error}")
        return super().native_failed(code)

    # -- the protocol ------------------------------------------------------------------------------------
    def order_after_current(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def launch(self) -> None:
        if self._unwaited:  # the previous launch's done words could still land after the reset below
            self.sync()
        ctypes.memset(self._done_addr, 0, self._done_nbytes)
        for words, _, _, _ in self._out_takes:
            words[...] = 0
        err = self._launch_fn(self._execs[self.parity], self._stream_handle)
        if err:
            raise EngineRunError(f"stepkernel: cuGraphLaunch failed: CUresult {err}")
        self._unwaited = True
        self._count_frame(len(self._execs) == 2)

    def sync(self) -> None:
        # a launch nobody waited on (either frame path's): its tagged outputs are taken here
        pending = self._unwaited and bool(self._out_takes)
        err = self._sync_fn(self._stream_handle)
        self._unwaited = False
        if err:
            raise EngineRunError(f"stepkernel: the step kernel failed: CUresult {err} ({_error_name(err)})")
        if pending and not self._take_outputs(None, spin=False):
            raise EngineRunError(
                "stepkernel: the kernel finished but not every tagged output word carries an epoch: a code generation error"
            )

    def wait_host(self) -> None:
        """Wait until the last launch has read its frames and written its host outputs: spin on
        the done words of the blocks that touch host memory, not on the stream (the kernel may
        still be storing the next state; the next launch is ordered after it by the stream, and
        sync/wait_idle wait for it). After ~HOST_SPIN_LIMIT polls it falls back to the stream
        sync, which reports a failed kernel."""
        for word in self._done_words:
            spins = 0
            while not word.value:
                spins += 1
                if spins > HOST_SPIN_LIMIT:
                    self._wait_host_slow()
                    return
        if self._out_takes and not self._take_outputs(None):
            self._wait_host_slow()
            return
        self._unwaited = False

    def _wait_host_slow(self) -> None:
        self.sync()
        missing = [i for i, word in enumerate(self._done_words) if not word.value]
        if missing:
            raise EngineRunError(
                f"stepkernel: the kernel finished but {len(missing)} of its {len(self._done_words)} host-facing "
                f"blocks did not raise their done word (slots {missing[:8]}): a code generation error"
            )

    def wait_idle(self) -> None:
        self.sync()
        torch.cuda.current_stream(self.device).synchronize()

    def run_host(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        return run_host(self, feeds)


# How long a resident step may take to answer, or the kernel to stop, before the host gives up
# (compute-sanitizer runs a kernel tens of times slower: raise it there)
RESIDENT_TIMEOUT_S = float(os.environ.get("FRAMEFUSE_RESIDENT_TIMEOUT_S", "2.0"))
_BELL_STOP = 0xFFFFFFFF
_RESIDENT_CHECK_POLLS = 0x20000  # polls of a done word between looks at the clock and the kernel
_POLL_BINS = 8  # runtime.cuh's FFK_POLL_BINS: the control words' histogram of frame reads (frame_reads)
# A resident kernel's tagged frame words and bell in write-combined memory (MappedHostBuffer's
# write_combined), fenced after the words and after the bell (hostpath.c's flush_frame), instead of
# write-back memory. Why it may be faster: the GPU polls those words across PCIe while the host
# writes them; in write-back memory each poll is snooped in the CPU's caches and each line the GPU
# read must be taken back before the host's next store to it (the frame is 256 words, 32 lines, at
# embed 256), where write-combined stores go straight out and the reads need no snoop. Timed on an
# H100 (session 60, bench/h100/2026-12-06-s60/wc): off, the hardware does not reward it.
# host_roundtrip.cu: a 256-word frame's round trip p50 3.03 us write-combined vs 3.01 write-back,
# frame + output 4.29 vs 4.25 (p99 3.43 / 4.73 vs 3.48 / 5.08), a dependent GPU load 2,514 vs 2,464
# cycles; Session.step (resident_variants.py, best of 3 rounds, p50 / p99 us): min_gru 11.0 / 16.0
# vs 11.1 / 17.3, gru 9.8 / 17.1 vs 9.9 / 18.1, mamba 18.9 / 20.3 vs 18.9 / 21.1: ~0.1 us at p50
# and not on mamba, within the rounds' spread. Bit for bit equal to the launched step (GPU test).
# Only with hostpath.c built (its store fence); the Python frame path fences through it too.
RESIDENT_WRITE_COMBINED_FRAMES = False
# A resident binding's kernel writes its outputs as tagged words (codegen.TAGGED_OUTPUTS: each
# output float a word (epoch << 32) | bits the host takes once it carries the frame's epoch; no
# system fence, no done word for the blocks that only write outputs) whatever the launched
# kernel's setting: where the plan's kernel has none, the binding compiles the same schedule with
# them (its own CompiledStep, as resident_sms does). Outputs bit for bit the same. H100, resident
# Session.step p50 / p99 us, best of 3 interleaved rounds (bench/h100/2026-12-06-s65/g21/), plain /
# tagged: min_gru 11.0 / 14.1 -> 10.3 / 13.2, min_lstm 11.3 / 14.2 -> 10.5 / 12.0, gru 10.0 / 12.2
# -> 9.3 / 10.8, lstm 10.5 / 13.0 -> 9.7 / 11.2, gated_ssm 12.0 / 14.5 -> 11.2 / 12.9, attention
# 14.9 / 19.8 -> 14.2 / 16.2, liquid 13.9 / 16.7 -> 13.2 / 16.1, jamba 17.0 / 19.5 -> 16.3 / 18.7,
# delta_net 16.5 / 17.2 -> 15.7 / 17.8, mamba 19.0 / 28.5 -> 18.1 / 21.0, xlstm 21.1 / 23.2 ->
# 20.5 / 22.6; delta_net and mamba again over 6 rounds (g23/): 16.4 / 20.1 -> 15.5 / 18.9 and
# 19.5 / 20.1 -> 18.5 / 19.4. Faster at p50 everywhere and at p99 in all but one row of one run.
# Launched, the same setting is faster at p50 but not at p99 (g21: worse in 5 of 11, g23 in both),
# so the launched kernel keeps codegen.TAGGED_OUTPUTS's default (off). This binding's own tagged
# CompiledStep beside the untagged plan passed every case of tests/gpu/test_resident.py on the H100
# (FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1: 46 of 54 in session 66's g27, its own twin test among
# them; the other 8 in session 67's g31, bench/h100/2026-12-07-s67/), and timed as its own binding (default ->
# twin, resident p50 / p99 us): g26, 11 archs, p50 0.6-1.0 lower on all, p99 lower on 10 (delta_net
# 17.4 -> 19.3); g31, 5 rounds, delta_net 16.4 / 19.7 -> 15.6 / 18.1, gru 10.0 / 10.7 -> 9.3 / 9.8.
# On since session 67; FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=0 turns it off.
RESIDENT_TAGGED_OUTPUTS = os.environ.get("FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS", "1") != "0"


class ResidentStepBinding(StepBinding):
    """The same binding with the step kernel resident: ``ffk_resident`` is launched once (on the
    first frame, on a stream of its own that nothing else waits on) and stays on the GPU; a frame
    is the frame written into mapped memory, then its number written into the bell word, then
    the wait for the done words (see codegen.Generator._resident_loop). No launch per frame.

    The kernel holds one block on each of its SMs while it runs: other kernels that need those
    SMs wait for it. So everything but the frame path stops it first (``sync``, ``wait_idle``:
    state reads and writes, resets, checks) and the next frame starts it again (one launch).
    A frame that does not answer within ``timeout_s`` raises and stops the kernel; ``close()``
    (and interpreter exit) stops it."""

    # kept in the hostpath.FrameState, where hostpath.c rings the bell and waits
    frames = _HostField("frames")  # frames rung since the kernel was launched
    running = _HostField("running", bool)
    _epoch_base = _HostField("epoch_base")
    _expected = _HostField("expected")

    def __init__(
        self, plan: StepKernelPlan, engine, host_inputs, host_outputs, state_pairs, input_buffers=None, sms=None
    ):
        engine_plan = plan
        c = plan.compiled
        _check_resident_host(c.props)
        if sms is not None:
            sms = int(sms)
            if not 1 <= sms <= c.props["sm_count"]:
                raise EngineBuildError(f"resident_sms={sms}: {c.props['name']} has {c.props['sm_count']} SMs")
            warn_beside_resident(sms)
        tag = RESIDENT_TAGGED_OUTPUTS and not c.kernel.tagged_outputs
        if sms is not None and sms != c.grid:
            # the same program and tactic (schedule arguments, code settings, math) scheduled
            # over fewer blocks: its own kernel and buffers (weights, flagged words, counters,
            # range table), the session's state halves
            source = c.source.rescheduled(sms)
            c = CompiledStep(
                c.program, device=c.device, source=source.with_settings(tagged_outputs=True) if tag else source
            )
        elif tag:
            # compiled once for the plan's compiled step, whose sessions share it as they share the
            # plan's (weights, flagged words, counters)
            c = c.with_tagged_outputs()
        if c is not plan.compiled:
            plan = StepKernelPlan(c, plan.input_specs, plan.output_specs)
        super().__init__(plan, engine, host_inputs, host_outputs, state_pairs, input_buffers)
        self.plan = engine_plan  # the engine's plan; this binding's buffers are its kernel's (compiled)
        self.compiled = c
        k = c.kernel
        loose = [n for n in k.input_names if n not in self._mapped] + [
            n for n in k.output_names if n not in self._out_mapped
        ]
        unpaired = [n for n in k.state_names if n not in self._halves]
        if loose or unpaired:
            raise EngineBuildError(
                "a resident step reads every frame input from and writes every output to host memory, and hands "
                f"every state to the next frame: {', '.join(loose + unpaired)} do not"
            )
        if not self._done_words:
            raise EngineBuildError("a resident step needs done words (a block that reads a frame or writes an output)")
        self.fn = c.resident_fn()
        # this binding's kernel: c.resident_kernel names the one compiled last, which a later
        # resident_fn() with other codegen settings (bench/microbench/resident_variants.py) replaces
        self.resident_kernel = c.resident_kernel
        if bool(self.resident_kernel.tagged_outputs) != self.tagged_outputs:
            raise EngineBuildError(
                "stepkernel: the resident kernel's outputs are "
                f"{'tagged words' if self.resident_kernel.tagged_outputs else 'floats'} and the launched kernel's are "
                f"{'tagged words' if self.tagged_outputs else 'floats'} (codegen.TAGGED_OUTPUTS changed between them)"
            )
        # Tagged frames (codegen.RESIDENT_TAGGED_FRAMES): the kernel reads each input float as a
        # word (epoch << 32) | bits in a buffer of its own, written from host_in just before the
        # bell; the blocks that read the frame poll those words instead of waiting for the bell
        self.tagged = bool(self.resident_kernel.tagged_frames)
        # write-combined words and bell (RESIDENT_WRITE_COMBINED_FRAMES) need hostpath.c's fence
        fence = hostpath.store_fence() if RESIDENT_WRITE_COMBINED_FRAMES and self.tagged else None
        self.write_combined = fence is not None
        self._fence = fence if fence is not None else _no_fence
        self._hs.flush_frame = int(self.write_combined)
        self._tagged: dict[str, MappedHostBuffer] = {}
        # the Python frame path's: (the floats' bits, a 64-bit scratch, (the words of an even frame,
        # those of an odd one)), one entry an input and copy
        self._tag_words = []
        # frame-block replicas (codegen.RESIDENT_FRAMER_REPLICAS): each input's words once for the
        # frame block and once for each replica, each copy in two frames' halves, [copy 0 even |
        # copy 0 odd | copy 1 even | copy 1 odd | ...]
        copies = self.resident_kernel.frame_copies
        flips = 2 if copies > 1 else 1
        if self.tagged:
            entries = []  # (floats, their words' first address) an input and copy
            for n in k.input_names:
                size = self._mapped[n].array.size
                self._tagged[n] = MappedHostBuffer(
                    (copies * flips * size,) if copies > 1 else self._mapped[n].shape,
                    dtype=np.uint64,
                    write_combined=self.write_combined,
                )
                words = self._tagged[n].array.reshape(-1)
                for copy in range(copies):
                    first = copy * flips * size
                    self._tag_words.append(
                        (
                            self._mapped[n].array.reshape(-1).view(np.uint32),
                            np.zeros(size, dtype=np.uint64),
                            (words[first : first + size], words[first + (flips - 1) * size : first + flips * size]),
                        )
                    )
                    entries.append((n, self._tagged[n].array.ctypes.data + 8 * first))
            count = len(entries)
            self._tag_src = (ctypes.c_void_p * count)(*[self._mapped[n].array.ctypes.data for n, _ in entries])
            self._tag_dst = (ctypes.c_void_p * count)(*[address for _, address in entries])
            self._tag_len = (ctypes.c_int64 * count)(*[self._mapped[n].array.size for n, _ in entries])
            self._hs.tag_src = ctypes.addressof(self._tag_src)
            self._hs.tag_dst = ctypes.addressof(self._tag_dst)
            self._hs.tag_len = ctypes.addressof(self._tag_len)
            self._hs.tag_inputs = count
            self._hs.tag_flip = int(flips == 2)
        self.timeout_s = RESIDENT_TIMEOUT_S
        self._bell = MappedHostBuffer((1,), dtype=np.uint32, write_combined=self.write_combined)
        self._idle = MappedHostBuffer((1,), dtype=np.uint32)
        self._bell_word = ctypes.c_uint32.from_address(self._bell.array.ctypes.data)
        self._idle_word = ctypes.c_uint32.from_address(self._idle.array.ctypes.data)
        self._hs.bell = self._bell.array.ctypes.data
        self._hs.spin_limit = _RESIDENT_CHECK_POLLS  # then wait_host looks at the clock and the kernel
        # go epoch, stop, finished blocks, the SM each block runs on (block_sms), then the frame
        # blocks' reads a frame (frame_reads, codegen.RESIDENT_POLL_COUNTS: FFK_POLL_BINS words)
        self._ctl = torch.zeros(3 + c.grid + _POLL_BINS, dtype=torch.int64, device=self.device)
        cuda = _cuda()
        driver = cuda._driver()
        self._rstream = cuda._check(
            driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
        )
        self._rstream_handle = int(self._rstream)
        self._query = ctypes.CDLL("libcuda.so.1").cuStreamQuery
        self._query.argtypes = [ctypes.c_void_p]
        self._query.restype = ctypes.c_int
        self.running = False
        self.frames = 0
        self.starts = 0
        self._epoch_base = 0
        self._expected = 0
        self._finalizer = weakref.finalize(
            self,
            _stop_resident,
            self._bell_word,
            self._fence,
            self._query,
            self._rstream_handle,
            self._bell,
            self._idle,
        )

    def start(self) -> None:
        """Launch the resident kernel (the frame path does this on its first frame)."""
        if self.running:
            return
        c = self.compiled
        # no launched step and no state write in flight: the counters and the state are final (not
        # a device-wide synchronize, which would wait forever for another resident kernel's stream)
        torch.cuda.current_stream(self.device).synchronize()
        self._sync_fn(self._stream_handle)
        counters = c.counters.cpu()
        if not bool((counters == counters[0]).all()):
            raise EngineRunError("stepkernel: the blocks' launch counters differ (a launch failed part way)")
        self._epoch_base = int(counters[0])
        self._ctl.zero_()
        self._ring(0)
        self._idle_word.value = 0
        torch.cuda.current_stream(self.device).synchronize()
        k = c.kernel
        pointers_in = [(self._tagged if self.tagged else self._mapped)[n].device_ptr for n in k.input_names]
        pointers_out = [self._out_mapped[n].device_ptr for n in k.output_names]
        halves = [self._halves[n] for n in k.state_names]
        ptr = ctypes.c_void_p
        args = (
            [ptr(p) for p in pointers_in]
            + [ptr(p) for p in pointers_out]
            + [ptr(h[self.parity].data_ptr()) for h in halves]
            + [ptr(h[1 - self.parity].data_ptr()) for h in halves]
            + [
                ptr(c.weights.data_ptr()),
                ptr(c.flags.data_ptr()),
                ptr(c.counters.data_ptr()),
                ptr(c.ranges.data_ptr()),
                ptr(self._done.device_ptr),
                ptr(self._bell.device_ptr),
                ptr(self._idle.device_ptr),
                ptr(self._ctl.data_ptr()),
            ]
            + ([ptr(c.trace.data_ptr())] if self.resident_kernel.trace else [])
        )
        self.fn.launch(
            c.grid,
            c.threads,
            args,
            shared_mem=self.resident_kernel.smem_bytes,
            stream=self._rstream_handle,
            op="stepkernel",
            detail=f"resident, source {self.resident_kernel.digest[:12]}",
        )
        self.frames = 0
        self.running = True
        self.starts += 1

    def launch(self) -> None:
        if not self.running:
            self.start()
        self.frames += 1
        count = self._epoch_base + self.frames - 1
        self._expected = expected = count % 0xFFFFFFFF + 1
        odd = (self.frames - 1) & 1  # the kernel's frame parity (its frames count from 0 each launch)
        for bits, scratch, halves in self._tag_words:  # one 64-bit store a word: never a new epoch on an old value
            tag_words(bits, scratch, halves[odd], expected)
        self._fence()  # write-combined: the words sent before the bell (write-back: x86 keeps them in order)
        self._ring(self.frames)
        self._unwaited = True
        self._count_frame(len(self._execs) == 2)

    def wait_host(self) -> None:
        """Spin until every host-facing block has raised this frame's epoch; every ~10^5 polls look
        at the clock and at the kernel (a failed kernel raises its error; a silent one past the
        deadline is stopped and raises)."""
        answered = spin_until_answered(
            self._done_words,
            self._expected,
            polls=_RESIDENT_CHECK_POLLS,
            timeout_s=self.timeout_s,
            check=self._check_alive,
        )
        if answered and self._out_takes:  # tagged outputs: each word once it carries this frame's epoch
            answered = spin_until_answered(
                _OutputTags(self._out_takes),
                self._expected,
                polls=_RESIDENT_CHECK_POLLS,
                timeout_s=self.timeout_s,
                check=self._check_alive,
            )
            if answered:
                self._take_outputs(self._expected, spin=False)
        if not answered:
            frame = self.frames
            self.stop(force=True)
            raise EngineRunError(
                f"stepkernel: the resident kernel did not answer frame {frame} within {self.timeout_s:g} s "
                "(stopped; the next frame launches it again)"
            )
        self._unwaited = False

    def _ring(self, value: int) -> None:
        """The bell word written (and, write-combined, sent: the kernel polls it)."""
        self._bell_word.value = value
        self._fence()

    def _check_alive(self) -> None:
        err = self._query(ctypes.c_void_p(self._rstream_handle))
        if err == 600:  # CUDA_ERROR_NOT_READY: still running
            return
        self.running = False
        if err:
            raise EngineRunError(f"stepkernel: the resident kernel failed: CUresult {err} ({_error_name(err)})")
        raise EngineRunError("stepkernel: the resident kernel exited without being stopped")

    def stop(self, force: bool = False) -> None:
        """Ring the stop and wait (at most ``timeout_s``) for the kernel to exit: every block then
        has written its counters and the state of the last frame."""
        if not self.running:
            return
        if self._unwaited and not force:
            self.wait_host()
        self._ring(_BELL_STOP)
        deadline = time.perf_counter() + self.timeout_s
        while True:
            err = self._query(ctypes.c_void_p(self._rstream_handle))
            if err != 600:
                break
            if time.perf_counter() > deadline:
                raise EngineRunError(
                    f"stepkernel: the resident kernel did not stop within {self.timeout_s:g} s; the GPU is held by "
                    "it until this process exits"
                )
            time.sleep(0)
        self.running = False
        self._unwaited = False
        if err:
            raise EngineRunError(f"stepkernel: the resident kernel failed: CUresult {err} ({_error_name(err)})")

    def sync(self) -> None:
        self.stop()

    def block_sms(self) -> list[int]:
        """The SM each block of the last launch ran on (%smid, which every block writes at launch;
        for diagnostics: bench/microbench/resident_spread.py), read once the kernel has stopped."""
        if self.running:
            raise EngineRunError("stepkernel: block_sms() reads the resident kernel's words once it has stopped")
        if not self.starts:
            raise EngineRunError("stepkernel: block_sms(): the resident kernel has not been launched")
        return [int(v) for v in self._ctl[3 : 3 + self.compiled.grid].cpu().tolist()]

    def frame_reads(self) -> list[int]:
        """Frames of the last launch by the reads of host memory a frame block's thread 0 took
        before its word carried the frame's epoch: element i counts the frames that took i + 1
        reads, the last those that took that many or more (summed over the frame blocks). Only a
        kernel generated with codegen.RESIDENT_POLL_COUNTS counts; read once it has stopped."""
        if not self.resident_kernel.frame_reads:
            raise EngineRunError(
                "stepkernel: frame_reads(): this resident kernel was generated without codegen.RESIDENT_POLL_COUNTS"
            )
        if self.running:
            raise EngineRunError("stepkernel: frame_reads() reads the resident kernel's words once it has stopped")
        if not self.starts:
            raise EngineRunError("stepkernel: frame_reads(): the resident kernel has not been launched")
        base = 3 + self.compiled.grid
        return [int(v) for v in self._ctl[base : base + _POLL_BINS].cpu().tolist()]

    def wait_idle(self) -> None:
        self.stop()
        torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        self.stop()


def _check_resident_host(props: Mapping) -> None:
    """Refuse, with one line, a GPU on which a kernel that never ends cannot live: one with a
    run-time limit on kernels (a display's watchdog would kill it, and the display would freeze
    until then) or without compute preemption; and an MPS client limited to part of the GPU (the
    blocks would not all be resident, and they wait on one another)."""
    name = props.get("name", "this GPU")
    if props.get("kernel_exec_timeout"):
        raise EngineBuildError(
            f"{name} has a run-time limit on kernels (a display watchdog): a resident step kernel would be killed; "
            "use the launched step (resident=False) or a GPU without a display"
        )
    if props.get("compute_preemption") == 0:
        raise EngineBuildError(f"{name} cannot preempt a running kernel: a resident step kernel would hold it")
    share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if share is not None:
        try:
            limited = float(share) < 100.0
        except ValueError:
            limited = True
        if limited:
            raise EngineBuildError(
                f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share}: an MPS client limited to part of the GPU cannot keep "
                "every block of a resident step kernel resident"
            )


def tag_words(bits: np.ndarray, scratch: np.ndarray, words: np.ndarray, epoch: int) -> None:
    """``words[i] = (epoch << 32) | bits[i]``, each word one 64-bit store (the Python frame path's
    tagged words: a word is never seen with a new epoch on an old value, whether the memory is
    write-back or write-combined, whose stores are not seen in order), through ``scratch`` (uint64,
    as long), allocating nothing."""
    np.copyto(scratch, bits, casting="unsafe")
    np.bitwise_or(scratch, np.uint64(epoch) << np.uint64(32), out=words)


def _no_fence() -> None:
    """Write-back memory's stores need no fence to be sent (x86 keeps them in order)."""


def _stop_resident(bell_word, fence, query, stream_handle, *keep_alive) -> None:
    """At collection or interpreter exit: ring the stop, give the kernel a moment to leave, and
    release the binding's stream once it has."""
    try:
        bell_word.value = _BELL_STOP
        fence()
        deadline = time.perf_counter() + RESIDENT_TIMEOUT_S
        while query(ctypes.c_void_p(stream_handle)) == 600 and time.perf_counter() < deadline:
            time.sleep(0)
        if query(ctypes.c_void_p(stream_handle)) != 600:
            ctypes.CDLL("libcuda.so.1").cuStreamDestroy_v2(ctypes.c_void_p(stream_handle))
    except Exception:  # noqa: BLE001 - interpreter shutdown
        pass


def _error_name(err: int) -> str:
    try:
        from cuda.bindings import driver

        return _cuda().cuda_error_text(driver.CUresult(err))
    except Exception:  # noqa: BLE001
        return "unknown"


__all__ = [
    "MappedHostBuffer",
    "ResidentStepBinding",
    "StepBinding",
    "StepKernelPlan",
]
