"""``Session``: run an engine from a game loop.

    session = Session.load("artifacts/mamba-step")     # engine.ffe, or builds model(.fused).onnx
    for frame in frames:                                 # numpy, torch (CPU/CUDA), cupy
        action = session.step(frame)                     # one graph replay + one sync
    print(session.stats.summary())                       # p50 / p99 / max µs, budget overruns
    session.reset()                                      # zero the recurrent state

Step form (graph inputs ``x`` + ``state.<name>``, outputs ``y`` + ``next_state.<name>``): the state
lives in device buffers that are the graph's state inputs; the captured graph ends by copying each
``next_state.<name>`` onto ``state.<name>``, so the state (and an attention model's KV window)
never leaves the GPU and ``step`` is one replay and one synchronisation.

What ``step`` returns: the output in the frame's own kind, in a buffer the session owns and
overwrites on the next call (copy it to keep it):
- numpy frame → numpy view of the pinned host output buffer;
- torch CPU tensor → torch CPU tensor over that buffer;
- torch CUDA tensor or cupy array (``__cuda_array_interface__`` / DLPack) → copied device-to-
  device into the graph's input buffer (no host staging); returns the device output (torch or cupy).
The hot path (numpy or torch frames, single input) allocates no tensors or arrays.

On a machine without a GPU the same Session runs through the CPU executor (no capture), so its
logic is tested in CI.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
import torch

from framefuse.errors import FrameFuseError
from framefuse.runtime.stats import DEFAULT_BUDGET_MS, LatencyStats

STATE_PREFIX = "state."
NEXT_STATE_PREFIX = "next_state."


class SessionError(FrameFuseError):
    """A session was given inputs or asked for something its graph cannot do."""


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


def resolve_artifact(path) -> tuple[str, Path, Path | None]:
    """What ``Session.load`` would load for ``path``: ("engine" | "onnx", file, manifest)."""
    path = Path(path)
    if path.is_dir():
        manifest = path / "manifest.json"
        manifest = manifest if manifest.is_file() else None
        for kind, name in (("engine", "engine.ffe"), ("onnx", "model.fused.onnx"), ("onnx", "model.onnx")):
            if (path / name).is_file():
                return kind, path / name, manifest
        raise SessionError(f"{path}: no engine.ffe, model.fused.onnx or model.onnx in this folder")
    if not path.exists():
        raise SessionError(f"{path}: no such file or folder")
    manifest = path.parent / "manifest.json"
    manifest = manifest if manifest.is_file() else None
    if path.suffix == ".ffe":
        return "engine", path, manifest
    if path.suffix == ".onnx":
        return "onnx", path, manifest
    raise SessionError(f"{path}: expected an artifact folder, an engine.ffe or an .onnx file")


class Session:
    """Runs one engine: ``run`` for whole sequences, ``step`` per frame (step-form graphs)."""

    def __init__(
        self,
        engine,
        *,
        budget_ms: float | None = DEFAULT_BUDGET_MS,
        stats_capacity: int = 100_000,
        replay: str = "torch",
        manifest: dict | None = None,
    ):
        self.engine = engine
        self.device = engine.device
        self.manifest = manifest or {}
        self.stats = LatencyStats(stats_capacity, budget_ms)
        self.replay_mode = replay
        inputs, outputs = engine.input_specs, engine.output_specs
        self.state_inputs = [n for n in inputs if n.startswith(STATE_PREFIX)]
        self.state_pairs: dict[str, str] = {}  # next_state output -> state input
        for name in self.state_inputs:
            out_name = NEXT_STATE_PREFIX + name[len(STATE_PREFIX) :]
            if out_name not in outputs:
                raise SessionError(f"state input '{name}' has no matching output '{out_name}' (outputs: {list(outputs)})")
            self.state_pairs[out_name] = name
        self.frame_inputs = [n for n in inputs if n not in self.state_inputs]
        self.frame_outputs = [n for n in outputs if n not in self.state_pairs]
        self.is_step_form = bool(self.state_pairs)
        self._single_in = self.frame_inputs[0] if len(self.frame_inputs) == 1 else None
        self._single_out = self.frame_outputs[0] if len(self.frame_outputs) == 1 else None
        self._state: dict[str, torch.Tensor] = {}
        self._host_step = None
        self._device_step = None
        self._device_run: dict[tuple, Any] = {}
        self._cupy_out: dict[str, Any] = {}
        if self.is_step_form:
            self._state = {
                name: torch.zeros(inputs[name].shape, dtype=inputs[name].dtype, device=self.device)
                for name in self.state_inputs
            }
            # Captured now, so the first frame of a game loop does not pay for the capture.
            self._host_step = engine.create_binding(
                host_inputs=self.frame_inputs,
                host_outputs=self.frame_outputs,
                state_pairs=self.state_pairs,
                input_buffers=self._state,
            )
            self._host_step.set_replay_mode(replay)
            self._frame_specs = {n: inputs[n] for n in self.frame_inputs}

    # -- loading ----------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        artifact_or_onnx,
        *,
        device: str | None = None,
        framefuse_impl: str | None = None,
        check_source: bool = True,
        **kwargs,
    ) -> "Session":
        """A session over an artifact folder (``engine.ffe`` if built, else it builds
        ``model.fused.onnx`` or ``model.onnx`` in memory), an ``engine.ffe``, an ``.onnx`` file or
        an ``onnx.ModelProto``. ``device``: "cuda" or "cpu" (default: cuda when there is one)."""
        from framefuse.engines.cuda_graph import CudaGraphEngine, load_engine

        manifest = None
        if isinstance(artifact_or_onnx, onnx.ModelProto):
            engine = CudaGraphEngine(artifact_or_onnx, device=device or default_device(), framefuse_impl=framefuse_impl)
        else:
            kind, file, manifest_path = resolve_artifact(artifact_or_onnx)
            if manifest_path is not None:
                manifest = json.loads(manifest_path.read_text())
            if kind == "engine":
                if framefuse_impl is not None:
                    raise SessionError("framefuse_impl is fixed when an engine is built; rebuild it to change it")
                engine = load_engine(file, device=device, check_source=check_source)
            else:
                engine = CudaGraphEngine(file, device=device or default_device(), framefuse_impl=framefuse_impl)
        return cls(engine, manifest=manifest, **kwargs)

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

    def __repr__(self) -> str:
        form = "step" if self.is_step_form else "sequence"
        return f"Session({form} form on {self.device}, inputs={self.input_names}, outputs={self.output_names})"

    # -- sequences ----------------------------------------------------------------------------------
    def run(self, inputs) -> dict:
        """Run the graph once. ``inputs``: a dict by input name, or one array when the graph has
        one non-state input. Missing state inputs of a step-form graph are zeros; the session's
        own state is not touched. Returns fresh outputs: numpy for host inputs, torch CUDA
        tensors when the inputs are on the GPU."""
        start = time.perf_counter_ns()
        feeds = self._feeds(inputs)
        for name in self.state_inputs:
            if name not in feeds:
                spec = self.engine.input_specs[name]
                feeds[name] = np.zeros(spec.shape, dtype=spec.numpy_dtype)
        on_device = self.device.type == "cuda" and any(
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
                    host[name] = _as_torch_device_tensor(value, self.device).cpu().numpy()
                else:
                    host[name] = np.asarray(value)
            outputs = self.engine.run(host)
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
        binding.order_after_current()
        binding.launch()
        binding.sync()
        return {name: binding.dev_out[name].clone() for name in self.output_names}

    # -- frames -------------------------------------------------------------------------------------
    def step(self, frame):
        """Feed one frame, advance the state, return the output (see the module docstring)."""
        start = time.perf_counter_ns()
        binding = self._host_step
        if binding is None:
            raise SessionError(
                "step() needs a step-form graph (inputs state.<name>, outputs next_state.<name>); this one has "
                f"inputs {self.input_names}: use run(), or export the step form (artifacts/<name>-step)"
            )
        name = self._single_in
        if name is not None and type(frame) is np.ndarray:  # the hot path
            buffer = binding.host_in[name]
            if frame.shape != buffer.shape:
                self._check_frame_shape(name, frame.shape)
            np.copyto(buffer, frame, casting="same_kind")
            binding.launch()
            binding.sync()
            out = binding.host_out[self._single_out] if self._single_out else dict(binding.host_out)
        else:
            out = self._step_general(frame)
        self.stats.record(time.perf_counter_ns() - start)
        return out

    def _check_frame_shape(self, name: str, shape) -> None:
        expected = self._frame_specs[name].shape
        shape = tuple(shape)
        if shape != expected and not (expected[:1] == (1,) and shape == expected[1:]):
            raise SessionError(f"frame '{name}' has shape {list(shape)}, the step graph takes {list(expected)}")

    def _step_general(self, frame):
        frames = frame if isinstance(frame, Mapping) else None
        if frames is None:
            if self._single_in is None:
                raise SessionError(f"this step graph has frame inputs {self.frame_inputs}: pass a dict by name")
            frames = {self._single_in: frame}
        unknown = sorted(set(frames) - set(self.frame_inputs))
        missing = [n for n in self.frame_inputs if n not in frames]
        if unknown or missing:
            raise SessionError(f"step() frames: missing {missing}, unexpected {unknown} (frame inputs: {self.frame_inputs})")
        kinds = set()
        for name, value in frames.items():
            if isinstance(value, torch.Tensor):
                kinds.add("cuda" if value.is_cuda else "torch")
            elif _is_cuda_array(value):
                kinds.add("cupy")
            else:
                kinds.add("numpy")
            self._check_frame_shape(name, tuple(np.shape(value)) if not isinstance(value, torch.Tensor) else value.shape)
        device_frames = kinds & {"cuda", "cupy"}
        if device_frames and self.device.type == "cuda":
            if len(kinds) > 1:
                raise SessionError(f"step() frames mix host and device arrays ({sorted(kinds)}); pass them all on one side")
            return self._step_device(frames, cupy_out="cupy" in kinds)
        binding = self._host_step
        for name, value in frames.items():
            if isinstance(value, torch.Tensor):
                binding.host_in_t[name].copy_(value)
            elif _is_cuda_array(value):  # a device array on a CPU session
                binding.host_in_t[name].copy_(_as_torch_device_tensor(value, torch.device("cuda")))
            else:
                np.copyto(binding.host_in[name], np.asarray(value), casting="same_kind")
        binding.launch()
        binding.sync()
        source = binding.host_out_t if kinds == {"torch"} else binding.host_out
        if self._single_out is not None:
            return source[self._single_out]
        return dict(source)

    def _step_device(self, frames: Mapping, *, cupy_out: bool):
        binding = self._device_step
        if binding is None:
            binding = self.engine.create_binding(
                host_inputs=[], host_outputs=[], state_pairs=self.state_pairs, input_buffers=self._state
            )
            binding.set_replay_mode(self.replay_mode)
            self._device_step = binding
        for name, value in frames.items():
            source = value if isinstance(value, torch.Tensor) else _as_torch_device_tensor(value, self.device)
            binding.dev_in[name].copy_(source.reshape(binding.dev_in[name].shape))
        binding.order_after_current()
        binding.launch()
        binding.sync()
        outputs = {name: binding.dev_out[name] for name in self.frame_outputs}
        if cupy_out:
            outputs = {name: self._cupy_view(name, tensor) for name, tensor in outputs.items()}
        if self._single_out is not None:
            return outputs[self._single_out]
        return outputs

    def _cupy_view(self, name: str, tensor: torch.Tensor):
        view = self._cupy_out.get(name)
        if view is None:
            import cupy

            view = cupy.asarray(tensor)  # zero-copy through __cuda_array_interface__
            self._cupy_out[name] = view
        return view

    # -- state ----------------------------------------------------------------------------------------
    def _bindings(self):
        return [b for b in (self._host_step, self._device_step) if b is not None]

    def reset(self) -> None:
        """Zero the recurrent state (the next step starts a new sequence)."""
        if not self.is_step_form:
            return
        for binding in self._bindings():
            binding.wait_idle()
        for tensor in self._state.values():
            tensor.zero_()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def get_state(self) -> dict[str, np.ndarray]:
        """A copy of the current state, by state input name."""
        for binding in self._bindings():
            binding.wait_idle()
        return {name: tensor.detach().cpu().numpy().copy() for name, tensor in self._state.items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Overwrite the state (names as in ``get_state``; every state tensor must be given)."""
        missing = [n for n in self.state_inputs if n not in state]
        unknown = sorted(set(state) - set(self.state_inputs))
        if missing or unknown:
            raise SessionError(f"set_state: missing {missing}, unexpected {unknown} (state: {self.state_inputs})")
        for binding in self._bindings():
            binding.wait_idle()
        for name, value in state.items():
            target = self._state[name]
            source = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
            if tuple(source.shape) != tuple(target.shape):
                raise SessionError(f"set_state: '{name}' has shape {list(source.shape)}, expected {list(target.shape)}")
            target.copy_(source)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
