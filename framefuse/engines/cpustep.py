"""The step compiler's CPU step as an engine candidate: compiler/cstep.py's function behind the
executor's ``Plan`` interface, so the cuda-graph engine's build-time selection times it host to host
beside the GPU candidates and keeps it where it answers first (small models at batch 1: a launch,
a PCIe round trip and a wait cost more than their arithmetic).

:class:`CpuStepBinding` is the Binding protocol (engines/base.py) over the compiled function's own
buffers: the frame is written into its input array, a launch is one call, the state lives in two
host halves the function reads and writes by parity. Its frame is hostpath.c's frame call with the
function as the launch (``native_frame``), so Session.step's native hot path (the extension's
step) runs it as it runs the step kernel, with no Python between the frame and the output.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Mapping

import numpy as np
import torch

from framefuse.compiler import cstep
from framefuse.engines import hostpath
from framefuse.engines.base import BindingBase, EngineBuildError, EngineRunError, IOSpec
from framefuse.engines.executor import Step
from framefuse.engines.fusion import CPUSTEP
from framefuse.engines.stepkernel import NativeFrameBinding, spin_until_answered

HOST_SPIN_LIMIT = 16  # the function has raised its done word when the call returns
# Resident (CpuResidentBinding): polls of the done word before a look at the clock; polls of an
# unrung bell between two sched_yield()s of the worker; a frame's deadline
WORKER_CHECK_POLLS = 1 << 20
WORKER_YIELD_POLLS = 4096
WORKER_TIMEOUT_S = float(os.environ.get("FRAMEFUSE_RESIDENT_TIMEOUT_S", "2.0"))


class CpuStepPlan:
    """A program's CPU step behind the executor's Plan interface. ``execute(feeds)`` runs it on
    the feeds' values (any device) and returns the outputs on the plan's device, for the
    selection's parity check; ``host_only``: nothing to capture in a CUDA graph."""

    host_only = True

    def __init__(
        self, step: cstep.CStep, input_specs: Mapping[str, IOSpec], output_specs: Mapping[str, IOSpec], device
    ):
        self.step = step
        self.device = torch.device(device)
        self.input_specs = dict(input_specs)
        self.output_specs = dict(output_specs)
        program = step.program
        for name, spec in self.input_specs.items():
            leaf = program.inputs.get(name) or program.states.get(name)
            if leaf is None or leaf.shape != tuple(spec.shape) or spec.dtype != torch.float32:
                raise EngineBuildError(f"{CPUSTEP}: input '{name}' {list(spec.shape)} {spec.dtype} does not match")
        for name, spec in self.output_specs.items():
            node = program.outputs.get(name)
            if node is None or node.shape != tuple(spec.shape) or spec.dtype != torch.float32:
                raise EngineBuildError(f"{CPUSTEP}: output '{name}' {list(spec.shape)} {spec.dtype} does not match")
        self.steps = [Step(CPUSTEP, "CpuStep", None, [], [], list(self.output_specs))]
        self.folded: list[str] = []
        self.constants: dict = {}
        self.output_sources = {n: ("env", n) for n in self.output_specs}
        self._runner: cstep.Runner | None = None

    @classmethod
    def build(cls, model, input_specs, output_specs, device) -> CpuStepPlan:
        """Lower ``model`` (a fused step graph), generate and compile its CPU step (compiled now:
        a compiler or library that fails does so at the build, naming itself)."""
        from framefuse.compiler import lower_program

        step = cstep.generate(lower_program(model))
        cstep.load(step)
        return cls(step, input_specs, output_specs, device)

    def describe(self) -> dict:
        return self.step.describe()

    def execute(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self._runner is None:
            self._runner = cstep.Runner(self.step)
        program = self.step.program
        values = {n: feeds[n].detach().cpu().numpy() for n in self.input_specs}
        result = self._runner.run(
            {n: values[n] for n in program.inputs}, {n: values[n] for n in program.states if n in values}
        )
        return {n: torch.from_numpy(result[n]).to(self.device) for n in self.output_specs}

    def create_binding(
        self, engine, *, host_inputs, host_outputs, state_pairs, input_buffers=None, resident=False
    ) -> CpuStepBinding:
        if resident is not False and resident is not True:  # Session's resident_sms=N
            raise EngineBuildError(
                f"resident_sms={resident} limits a resident GPU kernel; this engine's step is the {CPUSTEP} "
                "candidate, which runs on the CPU (resident=True alone keeps it on a core of its own)"
            )
        if resident:
            return CpuResidentBinding(self, engine, host_inputs, host_outputs, state_pairs, input_buffers)
        return CpuStepBinding(self, engine, host_inputs, host_outputs, state_pairs, input_buffers)


class CpuStepBinding(NativeFrameBinding, BindingBase):
    """The compiled function over its own host buffers (see the module docstring). ``dev_in`` and
    ``dev_out`` are CPU tensors over the same arrays: the current state half is
    ``dev_in[state]``."""

    def __init__(self, plan: CpuStepPlan, engine, host_inputs, host_outputs, state_pairs, input_buffers=None):
        hs = self._hs = hostpath.FrameState()  # (before the base's __init__: it counts the replays)
        # the caller's state buffers live on the engine's device: their values are taken, the
        # state itself lives in the function's host halves
        super().__init__(plan.input_specs, plan.output_specs, "cpu", host_inputs, host_outputs, state_pairs, None)
        self.plan, self.engine = plan, engine
        runner = self.runner = cstep.Runner(plan.step)
        program = plan.step.program
        unpaired = [n for n in program.states if self.state_pairs.get(program.state_of[n]) != n]
        if unpaired:
            raise EngineBuildError(
                f"{CPUSTEP}: state input(s) {unpaired} must be handed their next value ({program.state_of})"
            )
        for name, buffer in (input_buffers or {}).items():
            if name in runner.halves:
                runner.halves[name][0][...] = buffer.detach().cpu().numpy().reshape(runner.halves[name][0].shape)
        self._dev_inputs = {n: torch.from_numpy(a) for n, a in runner.inputs.items()}
        self._dev_outputs = {n: torch.from_numpy(a) for n, a in runner.outputs.items()}
        self._halves = {n: [torch.from_numpy(h) for h in halves] for n, halves in runner.halves.items()}
        self.set_host_buffers(
            {n: self._dev_inputs[n] for n in self.host_input_names},
            {n: self._dev_outputs[n] for n in self.host_output_names},
        )
        hs.launch = runner.function
        hs.exec[0], hs.exec[1] = runner.io_address(0), runner.io_address(1)
        hs.n_execs = 2 if runner.halves else 1
        hs.done, hs.n_done = runner.done.ctypes.data, 1
        hs.spin_limit = HOST_SPIN_LIMIT
        self._hs_ptr = ctypes.pointer(hs)
        self._native = hostpath.load()
        self._count_native_launches(engine)

    def launch(self) -> None:
        hs = self._hs
        self.runner.call(hs.parity)
        self._count_frame(hs.n_execs == 2)

    def sync(self) -> None:
        pass  # a call returns when the step is done

    def output(self, name: str) -> torch.Tensor:
        return self.dev_out[name]

    # -- Session.step's native frame (engines/hostpath.py; NativeFrameBinding's native_frame) --------
    def native_failed(self, code: int) -> bool:
        if code == hostpath.NONFINITE:
            return True
        if code == hostpath.UNWAITED:  # not left by this binding's calls; clear it and run the frame
            self._hs.unwaited = 0
            self.launch()
            return False
        raise EngineRunError(f"{CPUSTEP}: the native frame call answered {code}")


def _stop_worker(stop, worker_ptr, *keep) -> None:
    """Join a CpuResidentBinding's worker (its finalizer: the binding collected, or interpreter
    exit); ``keep`` holds what the worker reads until it has stopped."""
    stop(worker_ptr)


class CpuResidentBinding(CpuStepBinding):
    """The CPU step kept on a core of its own: a worker thread (hostpath.c's ff_cpu_worker,
    started on the first frame) that waits on a bell word, runs the step and raises the done word
    to the frame's epoch, the resident GPU kernel's protocol (hostpath.c's ff_frame rings it).

    Why: between two frames a game's own work evicts the step's weights and code from the
    caller's caches (engines/framegap.py); the worker's core does nothing else, so they stay in its
    L1/L2. The cost: the worker spins on the bell between frames, a core held while the session
    runs (with sched_yield() every WORKER_YIELD_POLLS polls). ``stop()`` / ``close()`` (and the binding's collection, and interpreter
    exit) join it; the next frame starts it again. A frame not answered within WORKER_TIMEOUT_S
    (FRAMEFUSE_RESIDENT_TIMEOUT_S) raises. The state halves are read and written between frames
    (the worker waits on the bell then), so state reads, resets and checks do not stop it."""

    def __init__(self, plan, engine, host_inputs, host_outputs, state_pairs, input_buffers=None):
        super().__init__(plan, engine, host_inputs, host_outputs, state_pairs, input_buffers)
        functions = hostpath.worker()
        if functions is None:
            raise EngineBuildError(
                f"resident=True on the {CPUSTEP} runs it on a worker thread that hostpath.c provides, and that is "
                f"not built here: {hostpath.status()}"
            )
        self._start_fn, self._stop_fn = functions
        hs = self._hs
        self._bell = np.zeros(1, np.uint32)
        self._answer = np.zeros(1, np.uint32)  # the worker's done word (the function's own is not waited on)
        self._bell_word = ctypes.c_uint32.from_address(self._bell.ctypes.data)
        self._answer_word = ctypes.c_uint32.from_address(self._answer.ctypes.data)
        hs.bell, hs.done, hs.n_done = self._bell.ctypes.data, self._answer.ctypes.data, 1
        hs.spin_limit = WORKER_CHECK_POLLS  # then wait_host looks at the clock
        hs.running = 0
        worker = self._worker = hostpath.CpuWorker()
        worker.frame = ctypes.addressof(hs)
        worker.yield_polls = WORKER_YIELD_POLLS
        self._worker_ptr = ctypes.pointer(worker)
        self.timeout_s = WORKER_TIMEOUT_S
        self.starts = 0
        self._finalizer = weakref.finalize(
            self, _stop_worker, self._stop_fn, self._worker_ptr, worker, hs, self._bell, self._answer, self.runner
        )

    @property
    def running(self) -> bool:
        return bool(self._hs.running)

    def start(self) -> None:
        """Start the worker (the frame path does this on its first frame)."""
        if self.running:
            return
        hs, worker = self._hs, self._worker
        self._bell_word.value = 0
        self._answer_word.value = 0  # below every epoch: no stale answer passes for a frame's
        hs.frames = hs.epoch_base = 0
        hs.unwaited = 0
        worker.parity = hs.parity
        err = self._start_fn(self._worker_ptr)
        if err:
            raise EngineRunError(f"{CPUSTEP}: the resident worker thread could not start ({os.strerror(err)})")
        hs.running = 1
        self.starts += 1

    def launch(self) -> None:
        if not self.running:
            self.start()
        elif self._hs.unwaited:
            self.wait_host()
        hs = self._hs
        hs.frames += 1
        hs.expected = (hs.epoch_base + hs.frames - 1) % 0xFFFFFFFF + 1
        self._bell_word.value = hs.frames  # after the frame's floats: x86 stores are seen in order
        hs.unwaited = 1
        self._count_frame(hs.n_execs == 2)

    def wait_host(self) -> None:
        """Spin until the worker has raised this frame's epoch; past ``timeout_s`` the worker is
        stopped and this raises."""
        hs = self._hs
        if not hs.unwaited:
            return
        if not spin_until_answered(
            [self._answer_word], hs.expected, polls=WORKER_CHECK_POLLS, timeout_s=self.timeout_s
        ):
            frame = hs.frames
            self.stop(wait=False)
            raise EngineRunError(
                f"{CPUSTEP}: the resident worker did not answer frame {frame} within {self.timeout_s:g} s "
                "(stopped; the next frame starts it again)"
            )
        hs.unwaited = 0

    def sync(self) -> None:
        self.wait_host()

    def wait_idle(self) -> None:
        self.wait_host()

    def stop(self, wait: bool = True) -> None:
        """Join the worker (a frame in flight answered first, unless ``wait`` is False)."""
        if not self.running:
            return
        if wait:
            self.wait_host()
        err = self._stop_fn(self._worker_ptr)
        hs = self._hs
        hs.running = 0
        hs.unwaited = 0
        hs.parity = self._worker.parity  # the halves the worker's last frame wrote
        if err:
            raise EngineRunError(f"{CPUSTEP}: the resident worker thread could not be joined ({os.strerror(err)})")

    def close(self) -> None:
        self.stop()

    # frames rung and waited on, as the resident kernel's (not CpuStepBinding's synchronous call)
    native_failed = NativeFrameBinding.native_failed
    _native_label = CPUSTEP


def cpustep_candidate(model, plan, say, *, required: bool = False):
    """The CPU step of the engine's graph as a Plan-like candidate; None (the reason logged) when
    the graph cannot be compiled for the CPU, or EngineBuildError when ``required``."""
    try:
        return CpuStepPlan.build(model, plan.input_specs, plan.output_specs, plan.device)
    except Exception as exc:  # a graph the CPU step declines is reported, never fatal to the build
        reason = f"{type(exc).__name__}: {str(exc)[:400]}"
        if required:
            raise EngineBuildError(f"--select {CPUSTEP}: the CPU step cannot run this graph ({reason})") from exc
        say(f"selection: {CPUSTEP} not a candidate ({reason})")
        return None


__all__ = ["CPUSTEP", "CpuResidentBinding", "CpuStepBinding", "CpuStepPlan", "cpustep_candidate"]
