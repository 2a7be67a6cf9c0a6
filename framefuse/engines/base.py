"""What every engine backend shares: I/O descriptions, errors, the runner base class.

Each backend module (``framefuse.engines.cuda_graph``, ``.onnxruntime``, ``.tensorrt``) is
Polygraphy-shaped: ``build`` / ``load`` are its loaders, and they return an :class:`EngineRunner`,
a Polygraphy ``BaseRunner`` (``activate`` / ``infer`` / ``deactivate``) with the few extra members
``Session`` and ``framefuse check`` rely on:

    device                         torch.device the engine computes on (cuda or cpu)
    input_specs / output_specs     dict[name, IOSpec]; input_names / output_names
    run(feeds) -> dict             fresh numpy outputs for host feeds
    create_binding(...) -> Binding fixed buffers for the hot path (see BINDING_PROTOCOL)
    summary() -> dict              what ``framefuse build`` prints and the artifact records
    metadata: dict                 extra facts written beside the artifact

Binding protocol (what ``Session.step`` uses; every binding derives from :class:`BindingBase`,
which checks the names, the state hand-off and the caller's buffers and holds the host views)::

    host_in[name]  / host_in_t[name]    numpy / torch-CPU views of the buffer a host frame is written to
    host_out[name] / host_out_t[name]   numpy / torch-CPU views of the buffer a host output lands in
    dev_in[name]   / dev_out[name]      torch tensors the engine reads / writes (CPU tensors on CPU backends)
    launch()                            enqueue one run, do not wait
    sync()                              wait for the last launch
    wait_host()                         optional: wait until the last launch has read its host inputs and
                                        written its host outputs; device buffers may still be written
                                        (the step kernel's done words; Session.step uses it when given)
    wait_idle()                         wait for anything this binding may still have in flight
    set_replay_mode(mode)               "torch" | "driver" (backends without graphs accept and ignore them)
    order_after_current()               make the next launch wait for torch's current stream
    state_pairs                         output name -> the input it is handed to for the next run

This module imports torch (``IOSpec`` carries torch dtypes) but no backend library.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from framefuse.config import PRECISIONS  # noqa: F401  (the one definition; re-exported to the engines)
from framefuse.errors import FrameFuseError, read_onnx


class EngineBuildError(FrameFuseError):
    """The graph cannot be built into an engine (bad input shapes, data-dependent shapes,
    an unavailable backend ...)."""


class EngineRunError(FrameFuseError):
    """Inputs given to an engine do not match its graph, or a run failed."""


@dataclass(frozen=True)
class IOSpec:
    """A graph input or output: name, static shape, torch dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numpy_dtype(self) -> np.dtype:
        return torch.empty((), dtype=self.dtype).numpy().dtype

    def describe(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": str(self.dtype).removeprefix("torch.")}


def run_host(binding, feeds: Mapping[str, Any], *, sync: bool = True) -> dict[str, np.ndarray]:
    """A binding's one-shot run over host feeds (the Binding protocol's ``run_host``): copy each
    host input in, launch, wait, and return copies of the host outputs."""
    for name in binding.host_input_names:
        value = feeds[name]
        if isinstance(value, torch.Tensor):
            binding.host_in_t[name].copy_(value)
        else:
            np.copyto(binding.host_in[name], np.asarray(value), casting="same_kind")
    binding.launch()
    if sync:
        binding.sync()
    return {name: binding.host_out[name].copy() for name in binding.host_output_names}


def torch_dtype_of_numpy(dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (``np.float32`` -> ``torch.float32``)."""
    return torch.from_numpy(np.zeros((), dtype=np.dtype(dtype))).dtype


def sha256_file(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_onnx(onnx_path_or_model) -> tuple[onnx.ModelProto, Path | None]:
    """(model, path) for an ONNX path or a ModelProto (path None); unreadable files are an
    EngineBuildError naming the file."""
    if isinstance(onnx_path_or_model, onnx.ModelProto):
        return onnx_path_or_model, None
    path = Path(os.fspath(onnx_path_or_model))
    model = read_onnx(path, error=EngineBuildError)
    if not model.graph.output:
        raise EngineBuildError(f"{path}: the graph has no outputs: there is nothing to build (an empty export?)")
    return model, path


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise EngineBuildError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


class EngineRunner(BaseRunner):
    """The base of every backend's runner (a Polygraphy ``BaseRunner``).

    Subclasses set ``device``, ``metadata`` and provide ``input_specs`` / ``output_specs``,
    ``run``, ``create_binding`` and ``summary``. The Polygraphy hooks have working defaults
    here (``infer_impl`` calls ``run``), so a backend overrides them only when it has
    something better to do (``activate_impl``: build bindings before the first timed call).
    """

    #: the registry name of the backend ("cuda-graph", "onnxruntime", "tensorrt")
    ENGINE: ClassVar[str] = ""
    #: whether a binding created with ``host_inputs=[]`` runs on device buffers the caller fills
    #: (Session then copies CUDA frames device-to-device); False: frames go through host buffers
    DEVICE_FRAMES: ClassVar[bool] = True

    device: torch.device
    metadata: dict
    #: the ONNX file the engine was built from (None for a ModelProto)
    source_path: Path | None = None
    #: the artifact the engine was loaded from or saved to (None until then)
    artifact_path: Path | None = None
    #: the artifact's metadata as read at load time or written by save (None before either)
    artifact_metadata: dict | None = None
    precision: str = "fp32"
    #: runs through a binding so far (Session.replays)
    replays: int = 0

    def __init__(self, name: str | None = None, prefix: str | None = None):
        """Polygraphy's runner state (name, active flag); a subclass's ``__init__`` calls it first."""
        super().__init__(name=name, prefix=prefix or f"framefuse-{self.ENGINE or 'engine'}")

    # -- description --------------------------------------------------------------------------
    @property
    def input_specs(self) -> dict[str, IOSpec]:
        raise NotImplementedError

    @property
    def output_specs(self) -> dict[str, IOSpec]:
        raise NotImplementedError

    @property
    def input_names(self) -> list[str]:
        return list(self.input_specs)

    @property
    def output_names(self) -> list[str]:
        return list(self.output_specs)

    def summary(self) -> dict:
        raise NotImplementedError

    # -- running ------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the graph once on host inputs (numpy arrays or CPU tensors); fresh numpy outputs."""
        raise NotImplementedError

    def create_binding(
        self,
        *,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        host_inputs: Sequence[str] | None = None,
        host_outputs: Sequence[str] | None = None,
        state_pairs: Mapping[str, str] | None = None,
        input_buffers: Mapping[str, torch.Tensor] | None = None,
    ):
        """Fixed buffers for repeated runs (see the Binding protocol in the module docstring).
        Defaults: every input from the host, every output to the host, no hand-off.

        This default is :class:`HostBinding` over :meth:`run` (host buffers, the state handed off
        by a copy): enough for ``Session`` to step any engine; a backend with a faster path (a
        captured graph, I/O binding) overrides it."""
        host_inputs, host_outputs = self.fixed_binding_args(input_shapes, host_inputs, host_outputs, state_pairs)
        return HostBinding(self, host_inputs, host_outputs, dict(state_pairs or {}), input_buffers)

    def fixed_binding_args(self, input_shapes, host_inputs, host_outputs, state_pairs) -> tuple[list, list]:
        """(host inputs, host outputs) of a binding of an engine that runs only the shapes it was
        built for: every input / output by default; other shapes refused (unknown names are refused
        by the binding: BindingBase)."""
        if input_shapes is not None:
            for name, shape in input_shapes.items():
                if name in self.input_specs and tuple(shape) != self.input_specs[name].shape:
                    raise EngineRunError(
                        f"the {self.ENGINE or type(self).__name__} engine runs the shapes it was built for: input "
                        f"'{name}' is {list(self.input_specs[name].shape)}, asked for {list(shape)}"
                    )
        host_inputs = list(self.input_specs) if host_inputs is None else list(host_inputs)
        host_outputs = list(self.output_specs) if host_outputs is None else list(host_outputs)
        return host_inputs, host_outputs

    def check_feeds(self, feeds: Mapping[str, Any]) -> None:
        """EngineRunError unless ``feeds`` names exactly the graph inputs."""
        missing = [n for n in self.input_names if n not in feeds]
        extra = [n for n in feeds if n not in self.input_specs]
        if missing or extra:
            raise EngineRunError(
                f"feeds do not match the graph inputs {self.input_names}: missing {missing}, unexpected {extra}"
            )

    # -- Polygraphy runner interface ----------------------------------------------------------
    def activate_impl(self):
        pass

    def deactivate_impl(self):
        pass  # engines stay usable after a Polygraphy comparison

    def get_input_metadata_impl(self):
        meta = TensorMetadata()
        for spec in self.input_specs.values():
            meta.add(spec.name, spec.numpy_dtype, spec.shape)
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        outputs = self.run(feed_dict)
        self.inference_time = time.perf_counter() - start  # Polygraphy's Comparator reads it
        return OrderedDict((name, outputs[name]) for name in self.output_names)


def check_binding_args(
    host_inputs: Sequence[str],
    host_outputs: Sequence[str],
    state_pairs: Mapping[str, str],
    inputs: Mapping[str, IOSpec],
    outputs: Mapping[str, IOSpec],
) -> None:
    """EngineRunError / EngineBuildError for names a binding cannot have."""
    for name in host_inputs:
        if name not in inputs:
            raise EngineRunError(f"no graph input '{name}' (inputs: {list(inputs)})")
    for name in host_outputs:
        if name not in outputs:
            raise EngineRunError(f"no graph output '{name}' (outputs: {list(outputs)})")
    for out_name, in_name in state_pairs.items():
        if out_name not in outputs or in_name not in inputs:
            raise EngineRunError(f"state hand-off {out_name} -> {in_name} names an unknown output or input")
        out_spec, in_spec = outputs[out_name], inputs[in_name]
        if out_spec.shape != in_spec.shape or out_spec.dtype != in_spec.dtype:
            raise EngineBuildError(
                f"state hand-off {out_name} -> {in_name}: output is {list(out_spec.shape)} {out_spec.dtype}, "
                f"input is {list(in_spec.shape)} {in_spec.dtype}"
            )


REPLAY_MODES = ("torch", "driver")


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy array over a CPU tensor's memory (bfloat16 through ml_dtypes: numpy has none)."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class BindingBase:
    """What every binding shares (the Binding protocol above): the host-fed inputs and
    host-returned outputs by name, the state hand-off, the caller's input buffers, host buffers and
    the replay counters. The checks run once, here: an unknown name, a state output handed to an
    input of another shape or dtype, or a caller's buffer that does not match its input is one
    EngineBuildError naming it, whatever the backend. A backend builds its own device buffers
    (from ``given(name)`` where the caller passed one) and its launch."""

    def __init__(
        self,
        input_specs: Mapping[str, IOSpec],
        output_specs: Mapping[str, IOSpec],
        device,
        host_inputs: Sequence[str],
        host_outputs: Sequence[str],
        state_pairs: Mapping[str, str] | None,
        input_buffers: Mapping[str, torch.Tensor] | None,
    ):
        self.device = torch.device(device)
        self.host_input_names = tuple(host_inputs)
        self.host_output_names = tuple(host_outputs)
        self.state_pairs = dict(state_pairs or {})
        self.replays = 0
        self.replay_mode = "torch"
        check_binding_args(self.host_input_names, self.host_output_names, self.state_pairs, input_specs, output_specs)
        self._given: dict[str, torch.Tensor] = {}
        for name, buffer in (input_buffers or {}).items():
            spec = input_specs.get(name)
            if spec is None:
                raise EngineBuildError(f"input buffer for '{name}': the engine has no such input")
            on_device = buffer.device.type == self.device.type and (
                self.device.index is None or buffer.device.index in (None, self.device.index)
            )
            if tuple(buffer.shape) != spec.shape or buffer.dtype != spec.dtype or not on_device:
                raise EngineBuildError(
                    f"input buffer for '{name}' must be {list(spec.shape)} {spec.dtype} on {self.device}, got "
                    f"{list(buffer.shape)} {buffer.dtype} on {buffer.device}"
                )
            if not buffer.is_contiguous():
                raise EngineBuildError(f"input buffer for '{name}' must be contiguous")
            self._given[name] = buffer

    def given(self, name: str) -> torch.Tensor | None:
        """The caller's buffer for input ``name`` (checked), or None."""
        return self._given.get(name)

    def given_or_zeros(self, name: str, spec: IOSpec) -> torch.Tensor:
        """The caller's buffer for input ``name``, or a new zeroed one on this binding's device."""
        buffer = self._given.get(name)
        return buffer if buffer is not None else torch.zeros(spec.shape, dtype=spec.dtype, device=self.device)

    def set_host_buffers(self, host_in_t: Mapping[str, torch.Tensor], host_out_t: Mapping[str, torch.Tensor]) -> None:
        """Sets the protocol's host_in_t / host_out_t and their numpy views host_in / host_out."""
        self.host_in_t = dict(host_in_t)
        self.host_in = {name: numpy_view(t) for name, t in self.host_in_t.items()}
        self.host_out_t = dict(host_out_t)
        self.host_out = {name: numpy_view(t) for name, t in self.host_out_t.items()}

    @staticmethod
    def host_buffers(names: Sequence[str], specs: Mapping[str, IOSpec], *, pinned: bool) -> dict[str, torch.Tensor]:
        """Zeroed CPU tensors for ``names`` (page-locked when a GPU copies to or from them)."""
        return {n: torch.zeros(specs[n].shape, dtype=specs[n].dtype, pin_memory=pinned) for n in names}

    def set_replay_mode(self, mode: str) -> None:
        """ "torch" or "driver"; a backend without graphs accepts both and runs the same way."""
        if mode not in REPLAY_MODES:
            raise EngineRunError(f"replay mode must be one of {REPLAY_MODES}, got {mode!r}")
        self.replay_mode = mode

    def order_after_current(self) -> None:
        pass  # a backend that runs on a stream of its own makes it wait for torch's current one

    def wait_idle(self) -> None:
        pass  # a backend that can have work in flight waits for it


class HostBinding(BindingBase):
    """The Binding protocol (module docstring) over a runner's ``run``: CPU buffers for every input
    and output, each launch one ``run`` of what the input buffers hold, a state output copied into
    the input it is handed to. What ``create_binding`` gives a backend that has no faster path."""

    def __init__(
        self,
        runner: EngineRunner,
        host_inputs: Sequence[str],
        host_outputs: Sequence[str],
        state_pairs: dict[str, str],
        input_buffers: Mapping[str, torch.Tensor] | None = None,
    ):
        super().__init__(
            runner.input_specs, runner.output_specs, "cpu", host_inputs, host_outputs, state_pairs, input_buffers
        )
        self.runner = runner
        self.dev_in = {name: self.given_or_zeros(name, spec) for name, spec in runner.input_specs.items()}
        self.dev_out = {
            name: torch.zeros(spec.shape, dtype=spec.dtype)
            for name, spec in runner.output_specs.items()
            if name not in self.state_pairs
        }
        # the host views are the buffers themselves: nothing to copy on a CPU engine
        self.set_host_buffers(
            {name: self.dev_in[name] for name in self.host_input_names},
            {
                name: self.dev_in[self.state_pairs[name]] if name in self.state_pairs else self.dev_out[name]
                for name in self.host_output_names
            },
        )

    def launch(self) -> None:
        """One run (synchronous); the new state replaces the old only after the run has read it."""
        outputs = self.runner.run({name: t.numpy() for name, t in self.dev_in.items()})
        for name, value in outputs.items():
            target = self.dev_in[self.state_pairs[name]] if name in self.state_pairs else self.dev_out.get(name)
            if target is not None:
                target.copy_(torch.as_tensor(np.asarray(value)).reshape(target.shape))
        self.replays += 1
        self.runner.replays += 1

    def sync(self) -> None:
        pass  # launch() has waited

    def output(self, name: str) -> torch.Tensor:
        """The tensor holding output ``name`` after the last run (a state output: the current state)."""
        return self.dev_in[self.state_pairs[name]] if name in self.state_pairs else self.dev_out[name]

    def run_host(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return run_host(self, feeds, sync=False)


__all__ = [
    "PRECISIONS",
    "EngineBuildError",
    "EngineRunError",
    "EngineRunner",
    "HostBinding",
    "IOSpec",
    "check_precision",
    "load_onnx",
    "run_host",
    "sha256_file",
    "torch_dtype_of_numpy",
]
