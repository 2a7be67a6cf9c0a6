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

Binding protocol (what ``Session.step`` uses; ``cuda_graph.Binding`` is the model)::

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
    #: the artifact's metadata as read at load time (None for a freshly built engine)
    artifact_metadata: dict | None = None
    precision: str = "fp32"

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
        Defaults: every input from the host, every output to the host, no hand-off."""
        raise NotImplementedError

    def check_feeds(self, feeds: Mapping[str, Any]) -> None:
        """EngineRunError unless ``feeds`` names exactly the graph inputs."""
        missing = [n for n in self.input_names if n not in feeds]
        extra = [n for n in feeds if n not in self.input_specs]
        if missing or extra:
            raise EngineRunError(
                f"feeds do not match the graph inputs {self.input_names}: missing {missing}, unexpected {extra}"
            )

    def check_binding_args(
        self,
        host_inputs: Sequence[str],
        host_outputs: Sequence[str],
        state_pairs: Mapping[str, str],
        input_specs: Mapping[str, IOSpec] | None = None,
        output_specs: Mapping[str, IOSpec] | None = None,
    ) -> None:
        """EngineRunError / EngineBuildError for names a binding cannot have."""
        inputs = self.input_specs if input_specs is None else input_specs
        outputs = self.output_specs if output_specs is None else output_specs
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


__all__ = [
    "PRECISIONS",
    "EngineBuildError",
    "EngineRunError",
    "EngineRunner",
    "IOSpec",
    "check_precision",
    "load_onnx",
    "run_host",
    "sha256_file",
    "torch_dtype_of_numpy",
]
