"""``Session``: run an engine from a game loop.

    session = Session.load("artifacts/mamba-step")     # an engine artifact, or builds the folder's ONNX
    for frame in frames:                                 # numpy, torch (CPU/CUDA), cupy
        action = session.step(frame)                     # one run + one sync; see "What step returns"
    print(session.stats.summary())                       # p50 / p99 / max µs, budget overruns
    session.reset()                                      # zero the recurrent state

Engines (``engine=``, see :mod:`framefuse.engines.registry`): an artifact already built in the
folder (``engine.ffe`` cuda-graph, ``engine.ort`` ONNX Runtime, ``engine.plan`` TensorRT) is used
first; otherwise the session builds, in memory, the cuda-graph engine when a CUDA GPU and
cuda-python are usable, else the ONNX Runtime engine (CPU EP) over the original ``model.onnx``.

Step form (graph inputs ``x`` + ``state.<name>``, outputs ``y`` + ``next_state.<name>``): the state
lives in the engine's buffers between frames and never crosses to the host. The cuda-graph engine
ends its captured graph by copying each ``next_state.<name>`` onto ``state.<name>`` (the state stays
on the GPU); ONNX Runtime writes ``next_state`` straight into a second buffer that the next step
reads (ping-pong I/O binding). Either way ``step`` is one run and one synchronisation.

What ``step`` returns: the output in the frame's own kind, **in a buffer the session owns and the
next step overwrites** (``step(frame, copy=True)`` or ``Session(copy=True)`` returns a fresh copy):
- numpy frame → numpy view of the host output buffer;
- torch CPU tensor → torch CPU tensor over that buffer;
- torch CUDA tensor or cupy array (``__cuda_array_interface__`` / DLPack) on a cuda-graph session →
  copied device-to-device into the graph's input buffer (no host staging); returns the device
  output (torch or cupy). Other engines stage device frames through the host buffers.
The hot path (numpy or torch frames) allocates no tensors or arrays.

A frame holding NaN or ±Inf is refused before the engine runs (``nonfinite="raise"``, the
default): :class:`SessionError` names the frame index and the input, and the state is as it was, on
every engine; ``nonfinite="propagate"`` hands such frames to the engine. ``check_finite=True``
also checks every output and new state, instead of carrying a NaN for a million frames; off by
default, when the hot path does not look at them.
"""

from __future__ import annotations

import ctypes
import json
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from framefuse.artifact_folder import Resolved, load_target
from framefuse.build.stage import build_engine
from framefuse.engines import registry
from framefuse.errors import FrameFuseError
from framefuse.runtime.stats import DEFAULT_BUDGET_MS, LatencyStats

_FLOAT32 = np.dtype(np.float32)  # builtin dtypes are singletons: an identity test on the hot path
_clock = time.perf_counter_ns

# The frame check multiplies the frame by zeros: an Inf frame makes numpy warn about Inf·0 before
# the check refuses it with its own error (np.errstate around the dot would cost ~1 µs a frame).
warnings.filterwarnings("ignore", "invalid value encountered in dot", RuntimeWarning, __name__)

STATE_PREFIX = "state."
NEXT_STATE_PREFIX = "next_state."
NONFINITE_POLICIES = ("raise", "propagate")


_REFUSED_FRAME = 'not run: the state is unchanged; Session(nonfinite="propagate") runs such frames'
_REFUSED_RUN = 'not run; Session(nonfinite="propagate") runs such inputs'


class SessionError(FrameFuseError):
    """A session was given inputs or asked for something its graph cannot do."""


def _frame_into(name: str, value, buffer: np.ndarray) -> None:
    """A frame that is not float32 (the graphs compute in float32): converted when every value
    converts exactly (float16, float64, integers, booleans holding float32 values), otherwise
    refused naming the dtype and the first value that would change. Complex, string and object
    frames are refused. float32 frames take the copy-only hot path in ``step``."""
    array = np.asarray(value)
    kind = array.dtype.kind
    if kind not in "fiub":
        raise SessionError(f"frame '{name}' has dtype {array.dtype}: the graph takes float32 (real numbers)")
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(np.float32)
    if kind == "f":
        exact = np.array_equal(converted.astype(array.dtype), array, equal_nan=True)
    else:
        exact = np.array_equal(converted.astype(np.float64), array.astype(np.float64))
    if not exact:
        back = converted.astype(np.float64).reshape(-1)
        orig = array.astype(np.float64).reshape(-1)
        with np.errstate(invalid="ignore"):
            bad = int(np.flatnonzero(~((back == orig) | (np.isnan(back) & np.isnan(orig))))[0])
        raise SessionError(
            f"frame '{name}' has dtype {array.dtype} and value {array.reshape(-1)[bad]!r} at flat index {bad} "
            f"does not convert exactly to float32 (it would become {converted.reshape(-1)[bad]!r}): pass float32"
        )
    np.copyto(buffer, converted.reshape(buffer.shape))


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _is_cuda_array(value: Any) -> bool:
    return hasattr(value, "__cuda_array_interface__") or (
        hasattr(value, "__dlpack_device__") and not isinstance(value, (np.ndarray, torch.Tensor))
    )


def _as_torch_device_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A torch view (no copy) of a cupy/numba/DLPack device array."""
    if hasattr(value, "__dlpack__"):
        try:
            return torch.from_dlpack(value)
        except Exception:  # noqa: BLE001 - fall through to the array interface below
            pass
    if hasattr(value, "__cuda_array_interface__"):
        return torch.as_tensor(value, device=device)
    raise SessionError(f"cannot read a {type(value).__name__} as a CUDA tensor (no DLPack / __cuda_array_interface__)")


def resolve_artifact(path, engine: str | None = None, device=None, fused: bool | None = None) -> Resolved:
    """What ``Session.load`` would load for ``path`` (:func:`framefuse.artifact_folder.load_target`),
    a problem named as a SessionError."""
    return load_target(path, engine, device, fused, error=SessionError)


def _engine_options(engine: str, framefuse_impl: str | None, fused: bool | None, options: dict | None) -> dict:
    options = dict(options or {})
    if framefuse_impl is not None:
        registry.check_option(engine, "framefuse_impl", "framefuse_impl", error=SessionError)
        options["framefuse_impl"] = framefuse_impl
    if registry.get_kind(engine).original_first:
        options.setdefault("fused", bool(fused))  # the fused graph only on request (see resolve_artifact)
    elif fused is not None:
        registry.check_option(engine, "fused", "fused=", error=SessionError)
        options["fused"] = fused
    return options


class Session:
    """Runs one engine: ``run`` for whole sequences, ``step`` per frame.

    ``step`` on a step-form graph carries the state from frame to frame; on a graph without state
    (a policy that reads one frame, a window model called on each window) a step is one call of
    the graph on the frame, over the same fixed buffers (made on the first step, or at once with
    ``resident=True``).

    ``copy``: ``step`` returns a fresh copy of its output instead of the session's buffer.
    ``nonfinite``: what a frame holding NaN or ±Inf does. ``"raise"`` (default): it is refused
    before the engine runs (SessionError naming the frame, the input and the count; the state and
    the frame index stay as they were), so every engine behaves the same: ONNX Runtime's LSTM
    zeroes its state on a NaN frame, the CUDA engines carry the NaN into every later frame.
    ``"propagate"``: the frame goes to the engine as it is, and what the state becomes is the
    engine's. The check of a host frame is one dot product against zeros (NaN·0 and Inf·0 are
    NaN, finite·0 is 0) into no new buffer; a CUDA frame's costs a synchronisation before the launch.
    ``check_finite``: the outputs and the new state are checked too (a SessionError names the
    tensor and the frame); off by default, and then the hot path does not look at them.
    ``resident``: the step compiler's kernel stays on the GPU between frames (launched on the
    first frame, rung per frame through mapped memory: no launch per step). It holds one block on
    each SM while it runs, so ``run``, device frames, ``reset``/``get_state``/``set_state`` and
    ``check_finite`` stop it first and the next frame starts it again; ``close()`` or leaving a
    ``with`` block stops it. While it runs nothing in the process may wait for the whole device
    (``torch.cuda.synchronize()``, a CUDA graph capture, hence creating another session): that
    waits for a kernel that does not end; close it first. Only for a cuda-graph engine whose plan
    is the step kernel (``framefuse build --select stepkernel``) or the CPU step (``--select
    cpustep``, or the build's choice): that one runs on a worker thread of its own, which spins on
    a core while it waits (engines/cpustep.CpuResidentBinding; ``close()`` joins it).
    ``resident_sms``: schedule the resident kernel over
    that many SMs (compiled again for them with the build's tactic: its threads, schedule
    arguments, code settings and math) and leave the others to the rest of the program; default:
    every SM, the kernel as built. GPU work run for the first time beside it can wait until the
    session stops (measured: the process's first torch.sum, under eager module loading too; under
    CUDA's default lazy loading any kernel's first launch may; a device-wide synchronize always):
    run the work the program does beside it once before the session starts (the session warns).
    """

    def __init__(
        self,
        engine,
        *,
        budget_ms: float | None = DEFAULT_BUDGET_MS,
        stats_capacity: int = 100_000,
        replay: str = "torch",
        manifest: dict | None = None,
        copy: bool = False,
        check_finite: bool = False,
        nonfinite: str = "raise",
        resident: bool = False,
        resident_sms: int | None = None,
    ):
        if nonfinite not in NONFINITE_POLICIES:
            raise SessionError(f"nonfinite={nonfinite!r}: use one of {', '.join(NONFINITE_POLICIES)}")
        if resident_sms is not None and not resident:
            raise SessionError("resident_sms= limits a resident kernel: give resident=True with it")
        self.engine = engine
        self.engine_name = getattr(engine, "ENGINE", "") or type(engine).__name__
        self.device = engine.device
        self.manifest = manifest or {}
        self.stats = LatencyStats(stats_capacity, budget_ms)
        self.replay_mode = replay
        self.copy = bool(copy)
        self.check_finite = bool(check_finite)
        self.nonfinite = nonfinite
        self._refuse_nonfinite = nonfinite == "raise" or self.check_finite
        self._finite_probe: dict[int, tuple] = {}  # id(buffer) -> (flat view, zeros, ..., buffer): the frame check
        self.frame_index = 0  # frames stepped since the last reset
        inputs, outputs = engine.input_specs, engine.output_specs
        self.state_inputs = [n for n in inputs if n.startswith(STATE_PREFIX)]
        self.state_pairs: dict[str, str] = {}  # next_state output -> state input
        for name in self.state_inputs:
            out_name = NEXT_STATE_PREFIX + name[len(STATE_PREFIX) :]
            if out_name not in outputs:
                raise SessionError(
                    f"state input '{name}' has no matching output '{out_name}' (outputs: {list(outputs)})"
                )
            self.state_pairs[out_name] = name
        self.frame_inputs = [n for n in inputs if n not in self.state_inputs]
        self.frame_outputs = [n for n in outputs if n not in self.state_pairs]
        self.is_step_form = bool(self.state_pairs)
        self._single_in = self.frame_inputs[0] if len(self.frame_inputs) == 1 else None
        self._single_out = self.frame_outputs[0] if len(self.frame_outputs) == 1 else None
        # Engines whose bindings read device buffers the caller fills (cuda-graph) take CUDA
        # frames without host staging; the others get them through the host buffers.
        self._device_frames = self.device.type == "cuda" and getattr(engine, "DEVICE_FRAMES", True)
        self._state: dict[str, torch.Tensor] = {}
        self._host_step = None
        self._hot = None  # see _open_host_step; None while the device frames' binding holds the state
        self._hot_path = None  # the host frames' hot path, as built (self._hot is it or None)
        self._state_holder = None  # the binding whose buffers hold the current state (None: _host_step)
        self._device_out: dict[str, torch.Tensor] = {}  # device copies of a host-only binding's outputs
        self._native_context = None  # hostpath.StepContext of the extension's step (see _native_step)
        self._device_step = None
        self._device_run: dict[tuple, Any] = {}
        self._cupy_out: dict[str, Any] = {}
        self._out_dict: dict | None = None
        self._out_dict_t: dict | None = None
        self.resident = bool(resident)
        self._resident_sms = resident_sms
        if self.is_step_form:
            self._state = {
                name: torch.zeros(inputs[name].shape, dtype=inputs[name].dtype, device=self.device)
                for name in self.state_inputs
            }
        # Captured now, so the first frame of a game loop does not pay for the capture. A graph
        # without state gets its frame binding on the first step() (most sessions of one only
        # run() it), unless it is to be resident: that is asked for to step it.
        if self.is_step_form or resident:
            self._open_host_step()

    def _open_host_step(self) -> None:
        inputs = self.engine.input_specs
        options = {"resident": int(self._resident_sms) if self._resident_sms is not None else True}
        try:
            binding = self.engine.create_binding(
                host_inputs=self.frame_inputs,
                host_outputs=self.frame_outputs,
                state_pairs=self.state_pairs,
                input_buffers=self._state,
                **(options if self.resident else {}),
            )
        except TypeError as exc:
            if not self.resident:
                raise
            raise SessionError(
                f"resident=True needs the cuda-graph engine with the step compiler's kernel; this session runs "
                f"{self.engine_name}"
            ) from exc
        binding.set_replay_mode(self.replay_mode)
        # the wait for a frame's host outputs: bindings that can tell when those have landed
        # before the whole launch retires (the step kernel's done words) say so with wait_host
        self._wait_host = getattr(binding, "wait_host", binding.sync)
        self._frame_specs = {n: inputs[n] for n in self.frame_inputs}
        # Built once: the multi-output hot path returns this same dict every frame.
        self._out_dict = dict(binding.host_out)
        self._out_dict_t = dict(binding.host_out_t)
        # a step-kernel binding's frame as one native call (engines/hostpath.py), where it is built:
        # step()'s hot path is then this tuple and the call
        native_frame = getattr(binding, "native_frame", None)
        native = None
        if native_frame is not None and self._single_in is not None and not self.check_finite:
            native = native_frame(self._single_in if self._refuse_nonfinite else None)
        self._hot = None
        if native is not None:
            buffer = binding.host_in[self._single_in]
            out = binding.host_out[self._single_out] if self._single_out else self._out_dict
            # with the extension built (hostpath.extension), the whole frame is its step(); else
            # the frame is copied here and the ctypes call does the rest
            fast, self._native_context = _native_step(binding, buffer, out, self.stats)
            context = ctypes.addressof(self._native_context) if fast is not None else None
            self._hot = (buffer, buffer.shape, native[0], native[1], out, fast, context)
        self._hot_path = self._hot
        self._host_step = binding

    # -- lifetime ---------------------------------------------------------------------------------
    def _release_gpu(self) -> None:
        """Stop a resident step kernel before other work needs the GPU's SMs (it holds one block
        on each while it runs); the next frame starts it again."""
        if self.resident:
            self._host_step.stop()

    def close(self) -> None:
        """Stop a resident step kernel (a no-op otherwise); the session stays usable."""
        if self.resident and self._host_step is not None:
            self._host_step.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- loading ----------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        artifact_or_onnx,
        *,
        engine: str | None = None,
        device: str | None = None,
        framefuse_impl: str | None = None,
        fused: bool | None = None,
        engine_options: dict | None = None,
        check_source: bool = True,
        **kwargs,
    ) -> Session:
        """A session over an artifact folder, an engine artifact (``engine.ffe`` / ``engine.ort`` /
        ``engine.plan``), an ``.onnx`` file or an ``onnx.ModelProto``.

        ``engine``: "cuda-graph", "onnxruntime" or "tensorrt"; default: an artifact already built
        in the folder (the default engine's first), else cuda-graph when a CUDA GPU and cuda-python
        are usable, else onnxruntime (see :func:`resolve_artifact`). ONNX graphs are built in
        memory. ``device``: "cuda" or "cpu". ``framefuse_impl`` (cuda-graph) and ``fused``
        (onnxruntime: run a fused graph, framefuse nodes through their Python references) are
        backend options; ``engine_options`` passes any other to the backend's ``build``. Other
        keyword arguments go to ``Session(...)`` (``budget_ms``, ``copy``, ``check_finite`` ...).
        """
        from framefuse.engines.registry import get_backend, unavailable_reason

        manifest = None
        if isinstance(artifact_or_onnx, onnx.ModelProto):
            chosen = engine or registry.default_engine(device)
            if (
                engine is None
                and registry.get_kind(chosen).original_first
                and not fused
                and any(node.domain == "framefuse" for node in artifact_or_onnx.graph.node)
            ):
                chosen = registry.FUSED_ANYWHERE  # as for a named fused file (see resolve_artifact)
            resolved = Resolved(chosen, "onnx", Path("<ModelProto>"), None)
            source = artifact_or_onnx
        else:
            resolved = resolve_artifact(artifact_or_onnx, engine, device, fused)
            source = resolved.file
            if resolved.manifest is not None:
                manifest = json.loads(resolved.manifest.read_text())
        name = resolved.engine
        reason = unavailable_reason(name, device=device) if device is not None else unavailable_reason(name)
        if reason is not None:
            raise SessionError(reason)
        backend = get_backend(name)
        if resolved.kind == "artifact":
            if framefuse_impl is not None or engine_options:
                raise SessionError(
                    f"{resolved.file}: options are fixed when an engine is built; rebuild it to "
                    f"change them (`framefuse build --engine {name}`)"
                )
            runner = backend.load(resolved.file, device=device, check_source=check_source)
        else:
            options = _engine_options(name, framefuse_impl, fused, engine_options)
            runner = build_engine(source, engine=name, device=device, options=options).runner
        return cls(runner, manifest=manifest, **kwargs)

    # -- description ------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return self.engine.input_names

    @property
    def output_names(self) -> list[str]:
        return self.engine.output_names

    @property
    def replays(self) -> int:
        return self.engine.replays

    @property
    def host_path(self) -> str | None:
        """How step() does a host frame's launch and wait on the step kernel: "native" (one call
        into engines/hostpath.c) or "python (why)"; None for other engines."""
        binding = self._host_step
        if binding is None or not hasattr(binding, "native_frame"):
            return None
        if self._hot_path is not None:
            if self._hot_path[5] is None:
                return "native through ctypes (engines/hostpath.c; its extension module is not built)"
            return "native (engines/hostpath.c)"
        from framefuse.engines import hostpath

        if self.check_finite:
            return "python (check_finite reads the outputs and the state after each step)"
        if self._single_in is None:
            return f"python ({len(self.frame_inputs)} frame inputs)"
        status = hostpath.status()
        if status.startswith("native"):  # built, but this kernel raises no done word to spin on
            return "python (no done words: the stream is synchronised)"
        return status

    def __repr__(self) -> str:
        form = "step" if self.is_step_form else "sequence"
        return (
            f"Session({form} form, {self.engine_name} engine on {self.device}, inputs={self.input_names}, "
            f"outputs={self.output_names})"
        )

    # -- sequences ----------------------------------------------------------------------------------
    def run(self, inputs) -> dict:
        """Run the graph once. ``inputs``: a dict by input name, or one array when the graph has
        one non-state input. Missing state inputs of a step-form graph are zeros; the session's
        own state is not touched. Returns fresh outputs: numpy for host inputs, torch CUDA
        tensors when the inputs are on the GPU (engines that take device buffers)."""
        start = time.perf_counter_ns()
        self._release_gpu()
        feeds = self._feeds(inputs)
        for name in self.state_inputs:
            if name not in feeds:
                spec = self.engine.input_specs[name]
                feeds[name] = np.zeros(spec.shape, dtype=spec.numpy_dtype)
        on_device = self._device_frames and any(
            (isinstance(v, torch.Tensor) and v.is_cuda) or _is_cuda_array(v) for v in feeds.values()
        )
        if on_device:
            outputs = self._run_device(feeds)
        else:
            host = {}
            for name, value in feeds.items():
                if isinstance(value, torch.Tensor):
                    host[name] = value.detach().cpu().numpy()
                elif _is_cuda_array(value):
                    host[name] = _as_torch_device_tensor(value, torch.device("cuda")).cpu().numpy()
                else:
                    host[name] = np.asarray(value)
            if self._refuse_nonfinite:
                self._check_host(host.items(), "input", None, hint=_REFUSED_RUN)
            outputs = self.engine.run(host)
        if self.check_finite:
            self._check_any(outputs.items(), "output", None)
        self.stats.record(time.perf_counter_ns() - start)
        return outputs

    def _feeds(self, inputs) -> dict:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        elif len(self.frame_inputs) == 1:
            feeds = {self.frame_inputs[0]: inputs}
        else:
            raise SessionError(f"this graph has inputs {self.input_names}: pass a dict by name")
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise SessionError(f"unknown input(s) {unknown}; the graph's inputs are {self.input_names}")
        missing = [n for n in self.frame_inputs if n not in feeds]
        if missing:
            raise SessionError(f"missing input(s) {missing}")
        return feeds

    def _run_device(self, feeds: dict) -> dict:
        shapes = {n: tuple(v.shape) for n, v in feeds.items()}
        key = tuple(sorted(shapes.items()))
        binding = self._device_run.get(key)
        if binding is None:
            binding = self.engine.create_binding(input_shapes=shapes, host_inputs=[], host_outputs=[])
            binding.set_replay_mode(self.replay_mode)
            self._device_run[key] = binding
        for name, value in feeds.items():
            if isinstance(value, torch.Tensor):
                binding.dev_in[name].copy_(value)
            elif _is_cuda_array(value):
                binding.dev_in[name].copy_(_as_torch_device_tensor(value, self.device))
            else:
                binding.dev_in[name].copy_(torch.as_tensor(np.asarray(value)))
        if self._refuse_nonfinite:
            self._check_any(((n, binding.dev_in[n]) for n in feeds), "input", None, hint=_REFUSED_RUN)
        binding.order_after_current()
        binding.launch()
        binding.sync()
        return {name: binding.dev_out[name].clone() for name in self.output_names}

    # -- frames -------------------------------------------------------------------------------------
    def step(self, frame, *, copy: bool | None = None):
        """Feed one frame, advance the state, return the output (a graph without state: the
        graph run on the frame, nothing carried to the next).

        The returned array/tensor is the session's own output buffer: **the next ``step``
        overwrites it**. Keep a value across frames with ``.copy()`` (numpy) / ``.clone()``
        (torch), or ask for a fresh copy: ``step(frame, copy=True)`` or ``Session(copy=True)``.
        numpy frame → numpy view of the host output buffer; torch CPU tensor → torch tensor over
        it; torch CUDA tensor or cupy array on a cuda-graph session → the device output buffer
        (torch or cupy). Several outputs: a dict by name (the same dict every frame).
        With ``check_finite=True`` a NaN/Inf in the frame, the output or the new state raises
        SessionError naming it and the frame index. Frames are float32; a frame of another real
        dtype (float16/64, integers, booleans) is converted only when every value converts exactly,
        else SessionError names the dtype and the first value that would change; complex, string
        and object frames are refused.
        """
        hot = self._hot
        if hot is not None and not self.check_finite:
            fast = hot[5]
            if fast is not None and not (copy or self.copy):  # the hot path: one C call
                out = fast(hot[6], frame)  # None: not a float32 ndarray of the input's shape
                if out is not None:
                    if out.__class__ is int:  # copied in, but not done in C
                        out = self._finish_native_frame(out, hot)
                    self.frame_index += 1
                    return out
        if self._state_holder is not None and not self._is_device_frame(frame):
            self._hand_state_to(self._host_step)  # the device frames' binding ran last
            hot = self._hot
        start = _clock()
        if hot is not None and type(frame) is np.ndarray and not self.check_finite:  # the ctypes path
            buffer, shape, call, arg, out = hot[:5]
            if frame.shape != shape:
                self._check_frame_shape(self._single_in, frame.shape)
            if frame.dtype is _FLOAT32:
                buffer[...] = frame  # (half of np.copyto's cost)
            else:
                _frame_into(self._single_in, frame, buffer)
            # the NaN/Inf check, the launch and the wait for the host outputs: one foreign call
            code = call(arg)
            if code and self._host_step.native_failed(code):
                self._refuse_host_frame(self._single_in, buffer)  # raises, naming the frame
                raise SessionError(f"frame '{self._single_in}': refused by the native host path, not by the check")
            self.frame_index += 1
            if copy or (copy is None and self.copy):
                out = _copy_output(out)
            self.stats.record(_clock() - start)
            return out
        binding = self._host_step
        if binding is None:  # a graph without state, stepped for the first time
            self._open_host_step()
            binding = self._host_step
        name = self._single_in
        if name is not None and type(frame) is np.ndarray:  # the Python path
            buffer = binding.host_in[name]
            if frame.shape != buffer.shape:
                self._check_frame_shape(name, frame.shape)
            if frame.dtype is _FLOAT32:
                buffer[...] = frame
            else:
                _frame_into(name, frame, buffer)
            if self._refuse_nonfinite:
                self._refuse_host_frame(name, buffer)
            if self.check_finite:
                binding.launch()
                binding.sync()  # the checks read the new state on the device
            else:
                binding.launch()
                self._wait_host()
            out = binding.host_out[self._single_out] if self._single_out else self._out_dict
            if self.check_finite:
                self._check_step_results(binding, out)
        else:
            out = self._step_general(frame)
        self.frame_index += 1
        if copy or (copy is None and self.copy):
            out = _copy_output(out)
        self.stats.record(_clock() - start)
        return out

    def _finish_native_frame(self, code: int, hot: tuple):
        """The extension's step copied the frame in and its frame call answered ``code``: refuse
        the frame, or finish it the Python way (binding.native_failed), and record its latency
        from the call's entry (hostpath.c's start_ns, on perf_counter_ns's clock)."""
        binding = self._host_step
        if binding.native_failed(code):
            self._refuse_host_frame(self._single_in, hot[0])  # raises, naming the frame
            raise SessionError(f"frame '{self._single_in}': refused by the native host path, not by the check")
        self.stats.record(_clock() - binding.native_start_ns())
        return hot[4]

    def _check_frame_shape(self, name: str, shape) -> None:
        expected = self._frame_specs[name].shape
        shape = tuple(shape)
        if shape != expected and not (expected[:1] == (1,) and shape == expected[1:]):
            raise SessionError(f"frame '{name}' has shape {list(shape)}, the graph takes {list(expected)}")

    def _step_general(self, frame):
        frames = frame if isinstance(frame, Mapping) else None
        if frames is None:
            if self._single_in is None:
                raise SessionError(f"this step graph has frame inputs {self.frame_inputs}: pass a dict by name")
            frames = {self._single_in: frame}
        unknown = sorted(set(frames) - set(self.frame_inputs))
        missing = [n for n in self.frame_inputs if n not in frames]
        if unknown or missing:
            raise SessionError(
                f"step() frames: missing {missing}, unexpected {unknown} (frame inputs: {self.frame_inputs})"
            )
        kinds = set()
        for name, value in frames.items():
            if isinstance(value, torch.Tensor):
                kinds.add("cuda" if value.is_cuda else "torch")
            elif _is_cuda_array(value):
                kinds.add("cupy")
            else:
                kinds.add("numpy")
            self._check_frame_shape(
                name, tuple(np.shape(value)) if not isinstance(value, torch.Tensor) else value.shape
            )
        device_frames = kinds & {"cuda", "cupy"}
        if device_frames and self._device_frames:
            if len(kinds) > 1:
                raise SessionError(
                    f"step() frames mix host and device arrays ({sorted(kinds)}); pass them all on one side"
                )
            return self._step_device(frames, cupy_out="cupy" in kinds)
        binding = self._host_step
        if self._state_holder is not None:
            self._hand_state_to(binding)
        for name, value in frames.items():
            if isinstance(value, torch.Tensor) and value.dtype in (torch.float32, torch.float16, torch.bfloat16):
                binding.host_in_t[name].copy_(value.reshape(binding.host_in_t[name].shape))  # exact widening
            elif isinstance(value, torch.Tensor) and not value.is_cuda:
                _frame_into(name, value.detach().numpy(), binding.host_in[name])
            elif _is_cuda_array(value):  # a device array on a session that reads host frames
                source = _as_torch_device_tensor(value, torch.device("cuda"))
                binding.host_in_t[name].copy_(source.reshape(binding.host_in_t[name].shape))
            else:
                _frame_into(name, value, binding.host_in[name])
        if self._refuse_nonfinite:
            for name in frames:
                self._refuse_host_frame(name, binding.host_in[name])
        binding.launch()
        if self.check_finite:
            binding.sync()  # the checks read the new state on the device
        else:
            self._wait_host()
        source = self._out_dict_t if kinds == {"torch"} else self._out_dict
        out = source[self._single_out] if self._single_out is not None else source
        if self.check_finite:
            self._check_step_results(binding, out)
        return out

    def _step_device(self, frames: Mapping, *, cupy_out: bool):
        self._release_gpu()
        binding = self._device_step
        if binding is None:
            binding = self.engine.create_binding(
                host_inputs=[], host_outputs=[], state_pairs=self.state_pairs, input_buffers=self._state
            )
            binding.set_replay_mode(self.replay_mode)
            self._device_step = binding
        if self.is_step_form and self._host_step is not None:
            self._hand_state_to(binding)
        for name, value in frames.items():
            source = value if isinstance(value, torch.Tensor) else _as_torch_device_tensor(value, self.device)
            binding.dev_in[name].copy_(source.reshape(binding.dev_in[name].shape))
        if self._refuse_nonfinite:
            for name in frames:
                self._refuse_device_frame(name, binding.dev_in[name])
        binding.order_after_current()
        binding.launch()
        binding.sync()
        outputs = {name: self._on_device(name, binding.dev_out[name]) for name in self.frame_outputs}
        if self.check_finite:
            self._check_step_results(binding, outputs)
        if cupy_out:
            outputs = {name: self._cupy_view(name, tensor) for name, tensor in outputs.items()}
        if self._single_out is not None:
            return outputs[self._single_out]
        return outputs

    def _on_device(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A device frame's output on the session's device: a binding that computes on the host
        (the CPU step, chosen by the build's timing) answers through a device buffer of the
        session's, so the kind of array returned does not depend on that choice."""
        if tensor.device.type == self.device.type:
            return tensor
        buffer = self._device_out.get(name)
        if buffer is None:
            buffer = self._device_out[name] = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
        buffer.copy_(tensor)
        return buffer

    def _cupy_view(self, name: str, tensor: torch.Tensor):
        view = self._cupy_out.get(name)
        if view is None:
            import cupy

            view = cupy.asarray(tensor)  # zero-copy through __cuda_array_interface__
            self._cupy_out[name] = view
        return view

    # -- NaN/Inf checks ------------------------------------------------------------------------------
    def _refuse_host_frame(self, name: str, buffer: np.ndarray) -> None:
        """Refuse a frame in ``buffer`` holding NaN/±Inf before the engine runs: NaN·0 and Inf·0
        are NaN and finite·0 is exactly 0, so one dot product against zeros (BLAS, 0.6 µs for 256
        floats on the 2-core CI machine) decides, and the float it returns is the only object made."""
        probe = self._finite_probe.get(id(buffer))
        if probe is None:
            flat = buffer.reshape(-1)
            if not np.shares_memory(flat, buffer):  # pragma: no cover - the bindings' buffers are contiguous
                raise SessionError(f"frame buffer '{name}' is not contiguous")
            probe = self._finite_probe[id(buffer)] = (flat, np.zeros(flat.shape, dtype=flat.dtype), buffer)
        flat, zeros, _ = probe
        if flat.dtype.kind == "f":
            dot = np.dot(flat, zeros)
            if dot != dot:
                self._check_host(((name, buffer),), "frame input", self.frame_index, hint=_REFUSED_FRAME)

    def _refuse_device_frame(self, name: str, buffer: torch.Tensor) -> None:
        """The same for a frame already copied into a device input buffer: the dot product runs on
        the GPU into a scalar made once, and reading it is the synchronisation the decision needs
        before the launch."""
        if not buffer.is_floating_point():
            return
        probe = self._finite_probe.get(id(buffer))
        if probe is None:
            flat = buffer.reshape(-1)
            # the buffer is kept in the entry, so its id cannot be taken by another object
            probe = self._finite_probe[id(buffer)] = (flat, torch.zeros_like(flat), buffer.new_zeros(()), buffer)
        flat, zeros, result, _ = probe
        torch.dot(flat, zeros, out=result)
        value = result.item()
        if value != value:
            self._check_any(((name, buffer),), "frame input", self.frame_index, hint=_REFUSED_FRAME)

    def _check_step_results(self, binding, out) -> None:
        outputs = out.items() if isinstance(out, Mapping) else ((self._single_out, out),)
        self._check_any(outputs, "output", self.frame_index)
        self._check_any(
            ((n, binding.dev_in[n]) for n in self.state_inputs),
            "state",
            self.frame_index,
            hint="the new state after this frame; reset() or set_state() to go on",
        )

    def _check_host(self, items, what: str, frame: int | None, hint: str = "") -> None:
        for name, value in items:
            array = np.asarray(value)
            if array.dtype.kind in "fc" and not np.isfinite(array).all():
                bad = int(array.size - np.isfinite(array).sum())
                self._raise_not_finite(what, name, frame, bad, array.size, hint)

    def _check_any(self, items, what: str, frame: int | None, hint: str = "") -> None:
        for name, value in items:
            if isinstance(value, torch.Tensor):
                if not value.is_floating_point():
                    continue
                finite = torch.isfinite(value)
                if not bool(finite.all()):
                    bad = int(value.numel() - finite.sum().item())
                    self._raise_not_finite(what, name, frame, bad, value.numel(), hint)
            else:
                self._check_host(((name, value),), what, frame)

    def _raise_not_finite(self, what: str, name: str, frame: int | None, bad: int, total: int, hint: str = "") -> None:
        where = f"frame {frame}: " if frame is not None else ""
        extra = f" ({hint})" if hint else ""
        raise SessionError(f"{where}{what} '{name}' has {bad} NaN/Inf value(s) of {total}{extra}")

    # -- state ----------------------------------------------------------------------------------------
    def _bindings(self):
        return [b for b in (self._host_step, self._device_step) if b is not None]

    def _is_device_frame(self, frame) -> bool:
        """Whether ``frame`` (or a dict of them) takes the device frames' binding (_step_device)."""
        if not self._device_frames:
            return False
        values = frame.values() if isinstance(frame, Mapping) else (frame,)
        return any((isinstance(v, torch.Tensor) and v.is_cuda) or _is_cuda_array(v) for v in values)

    def _hand_state_to(self, binding) -> None:
        """Make ``binding`` hold the current state. Host and device frames run through two
        bindings, each with its own state buffers (two halves chosen by a parity it keeps, or a
        host copy for the CPU step): the state is copied across when frames change side, so any
        mix of host and device frames steps one sequence. The host frames' hot path runs only
        while its binding holds the state."""
        source = self._state_holder or self._host_step
        if source is binding:
            return
        for other in self._bindings():
            other.wait_idle()
        for name in self.state_inputs:
            target, value = binding.dev_in[name], source.dev_in[name]
            if target.data_ptr() != value.data_ptr() or target.device != value.device:
                target.copy_(value)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        if binding is self._host_step:
            self._state_holder, self._hot = None, self._hot_path
        else:
            self._state_holder, self._hot = binding, None

    def _state_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers holding the current state. Bindings that swap state buffers between runs
        (ONNX Runtime's ping-pong, the step kernels' two halves) name the current one in ``dev_in``."""
        binding = self._state_holder or self._host_step
        if binding is None:
            return {}
        return {name: binding.dev_in[name] for name in self.state_inputs}

    def reset(self) -> None:
        """Zero the recurrent state (the next step starts a new sequence, frame index 0)."""
        self.frame_index = 0
        if not self.is_step_form:
            return
        for binding in self._bindings():
            binding.wait_idle()
        for tensor in self._state_buffers().values():
            tensor.zero_()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def get_state(self) -> dict[str, np.ndarray]:
        """A copy of the current state, by state input name."""
        for binding in self._bindings():
            binding.wait_idle()
        return {name: tensor.detach().cpu().numpy().copy() for name, tensor in self._state_buffers().items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Overwrite the state (names as in ``get_state``; every state tensor must be given)."""
        missing = [n for n in self.state_inputs if n not in state]
        unknown = sorted(set(state) - set(self.state_inputs))
        if missing or unknown:
            raise SessionError(f"set_state: missing {missing}, unexpected {unknown} (state: {self.state_inputs})")
        for binding in self._bindings():
            binding.wait_idle()
        buffers = self._state_buffers()
        for name, value in state.items():
            target = buffers[name]
            source = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
            if tuple(source.shape) != tuple(target.shape):
                raise SessionError(f"set_state: '{name}' has shape {list(source.shape)}, expected {list(target.shape)}")
            target.copy_(source)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def _native_step(binding, buffer: np.ndarray, out, stats: LatencyStats):
    """(hostpath's extension step, its hostpath.StepContext) for a step-kernel binding whose
    frame call is native, or (None, None) where the extension is not built. The context names the
    binding's frame state, the mapped frame input, the session's output and its latency buffers:
    the session keeps it, with the binding and the stats it points into."""
    from framefuse.engines import hostpath

    module = hostpath.extension()
    state = getattr(binding, "native_state", None)
    if (
        module is None
        or state is None
        or buffer.dtype != np.float32  # the C checks a frame's floats for NaN/Inf
        or buffer.ndim > hostpath.MAX_DIMS
        or not buffer.flags.c_contiguous
    ):
        return None, None
    context = hostpath.StepContext()
    context.state = ctypes.addressof(state)
    context.ndarray = np.ndarray
    context.dtype = _FLOAT32  # numpy's float32 singleton: a frame's dtype is compared by identity
    context.out = out
    context.buffer = buffer.ctypes.data
    context.nbytes = buffer.nbytes
    context.shape[: buffer.ndim] = buffer.shape
    context.ndim = buffer.ndim
    context.ring, context.stats = stats.buffers()
    return module.step, context


def _copy_output(out):
    if isinstance(out, Mapping):
        return {name: _copy_output(value) for name, value in out.items()}
    if isinstance(out, torch.Tensor):
        return out.clone()
    return out.copy()
