"""The ONNX Runtime engine: an ONNX graph in an ``onnxruntime.InferenceSession``, run through
I/O binding over preallocated buffers.

It is the engine of machines without a supported GPU (a laptop, CI): ONNX Runtime's CPU EP runs
a small step graph in tens of microseconds where the cuda-graph engine's CPU executor, which
interprets the graph op by op in Python, takes milliseconds. With ``onnxruntime-gpu`` installed the
CUDA EP is used when asked for (``providers``) or when the device is ``cuda``.

Which graph it runs: the *original* graph (``model.onnx``) by default. A fused graph's framefuse
nodes exist in ONNX Runtime only as Python references (onnxruntime-extensions custom ops, see
:mod:`framefuse.plugins.ort_bridge`), which is right for parity checks and slow for anything
else, so a fused graph is run only on request (``options={"fused": True}``).

Step form without per-step allocation: a binding holds two ``IOBinding`` objects over the same
preallocated buffers with the state buffers swapped (ping-pong): run *A* reads ``state`` from
buffer 0 and writes ``next_state`` into buffer 1, run *B* reads buffer 1 and writes buffer 0.
``next_state`` is thus written straight into the buffer the next step reads; the only copy per
step is the caller's frame into the bound input buffer. Buffers are bound by address
(``IOBinding.bind_input`` / ``bind_output`` over the memory of torch tensors, which numpy views
share), so ONNX Runtime reads and writes them in place: nothing is allocated per run.

Fused graphs in ONNX Runtime are for parity: onnxruntime-extensions passes each Python op's
outputs back as Python lists, and we have seen a session crash (SIGSEGV, about 1 run in 12) when
it runs after another session registered new Python ops in the same process.

The artifact ``engine.ort`` is a small JSON file (format, framefuse and onnxruntime versions,
source ONNX path + sha256, providers, session options, precision); the ONNX file it names is the
model. Loading refuses a foreign artifact (another framefuse version or format, the CUDA EP when
this onnxruntime has none) and a stale one (the ONNX changed since the build).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from framefuse.engines import artifact as _artifact
from framefuse.engines.artifact import ArtifactError, ForeignArtifactError
from framefuse.engines.base import (
    BindingBase,
    EngineBuildError,
    EngineRunError,
    EngineRunner,
    IOSpec,
    check_precision,
    load_onnx,
    run_host,
    torch_dtype_of_numpy,
)

NAME = "onnxruntime"
ARTIFACT_NAME = "engine.ort"
FORMAT = "framefuse-ort-engine"
FORMAT_VERSION = 1
FRAMEFUSE_DOMAIN = "framefuse"
CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
# Options build() understands, with their defaults. One intra-op thread: a batch-1 step graph is
# too small to split, and a spinning thread pool costs latency jitter on a shared machine.
DEFAULT_OPTIONS = {
    "providers": None,
    "fused": False,
    "intra_op_num_threads": 1,
    "inter_op_num_threads": 1,
    "graph_optimization_level": "all",
}
_OPT_LEVELS = ("disable", "basic", "extended", "all")

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _ort():
    try:
        import onnxruntime
    except ImportError as exc:
        raise EngineBuildError(
            f"engine 'onnxruntime' needs the onnxruntime package ({exc}); `pip install onnxruntime`"
        ) from exc
    return onnxruntime


def unavailable_reason(device: str | torch.device | None = None) -> str | None:
    """None when ONNX Runtime can run here (on ``device``: cuda needs the CUDA EP)."""
    try:
        import onnxruntime
    except ImportError:
        return "engine 'onnxruntime' needs the onnxruntime package: `pip install onnxruntime`"
    if (
        device is not None
        and torch.device(device).type == "cuda"
        and CUDA_EP not in onnxruntime.get_available_providers()
    ):
        return (
            f"onnxruntime {onnxruntime.__version__} has no {CUDA_EP} (providers: "
            f"{', '.join(onnxruntime.get_available_providers())}); `pip install onnxruntime-gpu` for the CUDA EP"
        )
    return None


def has_framefuse_nodes(model: onnx.ModelProto) -> bool:
    return any(node.domain == FRAMEFUSE_DOMAIN for node in model.graph.node)


def _resolve_providers(providers: Sequence[str] | None, device: torch.device | None) -> list[str]:
    available = _ort().get_available_providers()
    if providers is None:
        wants_cuda = device is not None and device.type == "cuda"
        providers = [CUDA_EP, CPU_EP] if wants_cuda else [CPU_EP]
    providers = list(providers)
    missing = [p for p in providers if p not in available]
    if missing:
        hint = " (`pip install onnxruntime-gpu` for the CUDA EP)" if CUDA_EP in missing else ""
        raise EngineBuildError(
            f"onnxruntime {_ort().__version__} has no {', '.join(missing)} (available: {', '.join(available)}){hint}"
        )
    if CPU_EP not in providers:
        providers.append(CPU_EP)  # the fallback for nodes another EP does not take
    return providers


def _provider_entries(providers: Sequence[str], precision: str) -> list:
    """Providers with their options: the CUDA EP computes fp32 graphs in full fp32 (no TF32),
    the contract the other engines keep too."""
    entries: list = []
    for provider in providers:
        if provider == CUDA_EP and precision == "fp32":
            entries.append((provider, {"use_tf32": "0"}))
        else:
            entries.append(provider)
    return entries


def _session_options(options: Mapping[str, Any]):
    ort = _ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3  # ORT's optimiser warnings are noise here
    so.intra_op_num_threads = int(options["intra_op_num_threads"])
    so.inter_op_num_threads = int(options["inter_op_num_threads"])
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    level = options["graph_optimization_level"]
    if level not in _OPT_LEVELS:
        raise EngineBuildError(f"onnxruntime: graph_optimization_level must be one of {_OPT_LEVELS}, got {level!r}")
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    if int(options["intra_op_num_threads"]) == 1:
        # With one thread there is no pool to keep warm: spinning would only burn a core.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def _spec(name: str, ort_type: str, shape, what: str, label: str) -> IOSpec:
    np_dtype = _ORT_TYPES.get(ort_type)
    if np_dtype is None:
        raise EngineBuildError(
            f"{label}: {what} '{name}' has type {ort_type}, which the onnxruntime engine "
            f"cannot bind (supported: {', '.join(sorted(_ORT_TYPES))})"
        )
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise EngineBuildError(
            f"{label}: {what} '{name}' has a dynamic or unknown shape {list(shape)}; the engine "
            f"needs static shapes (export with a fixed configuration)"
        )
    return IOSpec(name, tuple(int(d) for d in shape), torch_dtype_of_numpy(np_dtype))


class OnnxRuntimeRunner(EngineRunner):
    """An ONNX graph in ONNX Runtime, with the engine API (``run`` / ``create_binding``) and
    Polygraphy's runner interface."""

    ENGINE = NAME
    DEVICE_FRAMES = False  # bindings read their frames from host buffers (ONNX Runtime copies them)

    def __init__(
        self,
        onnx_path_or_model,
        *,
        device: str | torch.device | None = None,
        options: Mapping[str, Any] | None = None,
        precision: str = "fp32",
        metadata: dict | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name, prefix="framefuse-onnxruntime")
        ort = _ort()
        model, path = load_onnx(onnx_path_or_model)
        self.source_path = path
        self.label = str(path) if path is not None else (model.graph.name or "<model>")
        unknown = sorted(set(options or {}) - set(DEFAULT_OPTIONS))
        if unknown:
            raise EngineBuildError(
                f"onnxruntime engine: unknown option(s) {unknown} (known: {sorted(DEFAULT_OPTIONS)})"
            )
        self.options = {**DEFAULT_OPTIONS, **dict(options or {})}
        self.precision = check_precision(precision)
        self.metadata = dict(metadata or {})
        requested = torch.device(device) if device is not None else None
        self.providers = _resolve_providers(self.options["providers"], requested)
        self.options["providers"] = list(self.providers)
        self.device = torch.device("cuda", 0) if self.providers[0] == CUDA_EP else torch.device("cpu")
        if requested is not None and requested.type != self.device.type:
            raise EngineBuildError(f"onnxruntime engine: device {requested} but providers {self.providers}")
        session_options = _session_options(self.options)
        self.fused = has_framefuse_nodes(model)
        if self.fused:
            if not self.options["fused"]:
                raise EngineBuildError(
                    f"{self.label}: the graph has framefuse nodes, which ONNX Runtime runs only through their "
                    f"Python references; build the ONNX Runtime engine from the original model.onnx, or ask for "
                    f"the fused graph explicitly (--fused / options={{'fused': True}})"
                )
            from onnxruntime_extensions import get_library_path

            from framefuse.plugins.ort_bridge import prepare_for_ort

            model = prepare_for_ort(model)
            session_options.register_custom_ops_library(get_library_path())
        from framefuse.plugins.ort_bridge import keep_qdq_exact

        # the CPU provider's fused int8 GEMMs saturate on x86 CPUs without VNNI: run Q/DQ as written there
        qdq_exact = "CPUExecutionProvider" in self.providers and keep_qdq_exact(session_options, model)
        self.session_options = {k: v for k, v in self.options.items() if k != "providers"}
        if qdq_exact:
            self.session_options["qdq_fusion"] = "off (int8 kernels saturate on this CPU)"
        start = time.perf_counter()
        try:
            self.session = ort.InferenceSession(
                model.SerializeToString(), session_options, providers=_provider_entries(self.providers, self.precision)
            )
        except Exception as exc:  # ORT raises its own exception types
            raise EngineBuildError(
                f"{self.label}: ONNX Runtime cannot load the graph ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc})"
            ) from exc
        if self.fused:
            from framefuse.plugins.ort_bridge import InterruptSafeSession

            self.session = InterruptSafeSession(self.session)  # framefuse ops are Python callbacks
        self.session_seconds = time.perf_counter() - start
        self._input_specs = {
            i.name: _spec(i.name, i.type, i.shape, "input", self.label) for i in self.session.get_inputs()
        }
        self._output_specs = {
            o.name: _spec(o.name, o.type, o.shape, "output", self.label) for o in self.session.get_outputs()
        }
        self.nodes = len(model.graph.node)
        self.runs = 0
        self._run_options = ort.RunOptions()
        self._run_binding = None

    # -- description ------------------------------------------------------------------------------
    @property
    def input_specs(self) -> dict[str, IOSpec]:
        return self._input_specs

    @property
    def output_specs(self) -> dict[str, IOSpec]:
        return self._output_specs

    @property
    def replays(self) -> int:
        return self.runs

    def summary(self) -> dict:
        return {
            "engine": NAME,
            "device": str(self.device),
            "providers": list(self.providers),
            "graph": "fused (framefuse nodes through Python references)" if self.fused else "original",
            "nodes": self.nodes,
            "session_options": dict(self.session_options),
            "precision": self.precision,
            "inputs": [s.describe() for s in self._input_specs.values()],
            "outputs": [s.describe() for s in self._output_specs.values()],
            "onnxruntime_version": _ort().__version__,
            "runs": self.runs,
        }

    # -- running ------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run once on host inputs (numpy arrays or CPU tensors); fresh numpy outputs."""
        self.check_feeds(feeds)
        arrays = {}
        for name, spec in self._input_specs.items():
            value = feeds[name]
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().numpy()
            value = np.ascontiguousarray(value, dtype=spec.numpy_dtype)
            if value.shape != spec.shape:
                raise EngineRunError(
                    f"input '{name}' has shape {list(value.shape)}, the graph takes {list(spec.shape)}"
                )
            arrays[name] = value
        try:
            outputs = self.session.run(None, arrays)
        except Exception as exc:
            raise EngineRunError(f"{self.label}: ONNX Runtime run failed ({type(exc).__name__}: {exc})") from exc
        self.runs += 1
        return dict(zip(self.output_names, outputs))

    def create_binding(
        self,
        *,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        host_inputs: Sequence[str] | None = None,
        host_outputs: Sequence[str] | None = None,
        state_pairs: Mapping[str, str] | None = None,
        input_buffers: Mapping[str, torch.Tensor] | None = None,
    ) -> OrtBinding:
        host_inputs, host_outputs = self.fixed_binding_args(input_shapes, host_inputs, host_outputs, state_pairs)
        return OrtBinding(self, host_inputs, host_outputs, dict(state_pairs or {}), input_buffers)

    def activate_impl(self):
        pass  # the session exists from construction on


class OrtBinding(BindingBase):
    """Fixed buffers over one ONNX Runtime session (the Binding protocol of
    :mod:`framefuse.engines.base`), with the state ping-pong described in the module docstring.

    After each ``launch`` the state input buffers are swapped: ``dev_in[state]`` always names the
    buffer the *next* run reads, i.e. the current state. Keep no reference to it across steps.
    """

    def __init__(
        self,
        runner: OnnxRuntimeRunner,
        host_inputs: Sequence[str],
        host_outputs: Sequence[str],
        state_pairs: dict[str, str],
        input_buffers: Mapping[str, torch.Tensor] | None,
    ):
        ort = _ort()
        in_specs, out_specs = runner.input_specs, runner.output_specs
        super().__init__(in_specs, out_specs, runner.device, host_inputs, host_outputs, state_pairs, input_buffers)
        self.runner = runner
        on_gpu = self.device.type == "cuda"
        # Host side (pinned when a GPU EP copies from it).
        self.set_host_buffers(
            self.host_buffers(self.host_input_names, in_specs, pinned=on_gpu),
            self.host_buffers(self.host_output_names, out_specs, pinned=on_gpu),
        )
        # What ONNX Runtime reads and writes. On the CPU EP host-fed inputs are bound directly (no copy).
        self.dev_in: dict[str, torch.Tensor] = {}
        for name, spec in in_specs.items():
            if name in self.host_in_t and not on_gpu and self.given(name) is None:
                self.dev_in[name] = self.host_in_t[name]
            else:
                self.dev_in[name] = self.given_or_zeros(name, spec)
        self.dev_out: dict[str, torch.Tensor] = {}
        for name, spec in out_specs.items():
            if name in self.state_pairs:
                continue  # written into the other state buffer (below)
            if name in self.host_out_t and not on_gpu:
                self.dev_out[name] = self.host_out_t[name]
            else:
                self.dev_out[name] = torch.zeros(spec.shape, dtype=spec.dtype, device=self.device)
        # The second buffer of each state input: run A writes next_state here, run B reads it.
        self._state_other = {in_name: torch.zeros_like(self.dev_in[in_name]) for in_name in self.state_pairs.values()}
        self._io = [self._make_io_binding(ort, swapped=False), self._make_io_binding(ort, swapped=True)]
        self._phase = 0
        self._run_options = ort.RunOptions()
        self._h2d = [n for n in self.host_input_names if self.dev_in[n].data_ptr() != self.host_in_t[n].data_ptr()]
        self._d2h = [
            n
            for n in self.host_output_names
            if n not in self.state_pairs and self.dev_out[n].data_ptr() != self.host_out_t[n].data_ptr()
        ]
        self._state_h2d = [n for n in self.host_output_names if n in self.state_pairs]

    def _bind(self, io, kind: str, name: str, tensor: torch.Tensor) -> None:
        dev = "cuda" if tensor.is_cuda else "cpu"
        index = (tensor.device.index or 0) if tensor.is_cuda else 0
        np_dtype = torch.empty((), dtype=tensor.dtype).numpy().dtype
        args = (name, dev, index, np_dtype, list(tensor.shape), tensor.data_ptr())
        if kind == "input":
            io.bind_input(*args)
        else:
            io.bind_output(*args)

    def _make_io_binding(self, ort, *, swapped: bool):
        io = self.runner.session.io_binding()
        state_inputs = set(self.state_pairs.values())
        for name, tensor in self.dev_in.items():
            if name in state_inputs and swapped:
                tensor = self._state_other[name]
            self._bind(io, "input", name, tensor)
        for name in self.runner.output_specs:
            if name in self.state_pairs:
                in_name = self.state_pairs[name]
                target = self.dev_in[in_name] if swapped else self._state_other[in_name]
            else:
                target = self.dev_out[name]
            self._bind(io, "output", name, target)
        return io

    # -- the Binding protocol ---------------------------------------------------------------------
    def order_after_current(self) -> None:
        if self.device.type == "cuda":  # ONNX Runtime's CUDA EP works on its own stream
            torch.cuda.current_stream(self.device).synchronize()

    def launch(self) -> None:
        """One run (synchronous: ONNX Runtime returns when the outputs are written)."""
        for name in self._h2d:
            self.dev_in[name].copy_(self.host_in_t[name], non_blocking=True)
        if self._h2d:
            torch.cuda.current_stream(self.device).synchronize()
        try:
            self.runner.session.run_with_iobinding(self._io[self._phase], self._run_options)
        except Exception as exc:
            raise EngineRunError(f"{self.runner.label}: ONNX Runtime run failed ({type(exc).__name__}: {exc})") from exc
        # next_state is now in the other buffers: they are the state from here on.
        if self.state_pairs:
            for in_name, other in self._state_other.items():
                self._state_other[in_name] = self.dev_in[in_name]
                self.dev_in[in_name] = other
            self._phase ^= 1
        for name in self._d2h:
            self.host_out_t[name].copy_(self.dev_out[name])
        for out_name in self._state_h2d:
            self.host_out_t[out_name].copy_(self.dev_in[self.state_pairs[out_name]])
        self.replays += 1
        self.runner.runs += 1

    def sync(self) -> None:
        pass  # launch() has waited

    def output(self, name: str) -> torch.Tensor:
        """The tensor holding output ``name`` after the last run (a state output: the current state)."""
        if name in self.state_pairs:
            return self.dev_in[self.state_pairs[name]]
        return self.dev_out[name]

    def run_host(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Copy host feeds in, run; returns copies of the host outputs."""
        return run_host(self, feeds, sync=False)


# -- the engine.ort artifact ------------------------------------------------------------------------


def _write_model(model: onnx.ModelProto, target: Path) -> Path:
    """The ONNX file an artifact built from a ModelProto points to (beside the artifact)."""
    path = target.with_name(target.name + ".onnx")
    _artifact.write_atomic(path, lambda raw: raw.write(model.SerializeToString()))
    return path


def save_runner(runner: OnnxRuntimeRunner, path, *, model: onnx.ModelProto | None = None) -> Path:
    """Write ``engine.ort`` (JSON) at ``path`` (a ``.ort`` file or a folder), atomically. A runner
    built from a ModelProto needs ``model``: it is saved beside as ``engine.ort.onnx``."""
    target = _artifact.artifact_path(path, ARTIFACT_NAME)
    source = runner.source_path
    if source is None:
        if model is None:
            raise EngineBuildError("an onnxruntime engine built from a ModelProto needs the model to be saved")
        source = _write_model(model, target)
        runner.source_path = source
    metadata = _artifact.common_metadata(
        fmt=FORMAT,
        format_version=FORMAT_VERSION,
        engine=NAME,
        device=torch.device("cpu"),
        precision=runner.precision,
        source=source,
        target=target,
    )
    metadata.update(
        {
            "device": runner.device.type,  # cuda = the CUDA EP (ONNX Runtime's graph is not GPU-specific)
            "gpu_name": None,
            "compute_capability": None,
            "onnxruntime_version": _ort().__version__,
            "providers": list(runner.providers),
            "session_options": dict(runner.session_options),
            "fused": runner.fused,
            "inputs": [s.describe() for s in runner.input_specs.values()],
            "outputs": [s.describe() for s in runner.output_specs.values()],
            "extra": dict(runner.metadata),
        }
    )
    text = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
    _artifact.write_atomic(target, lambda raw: raw.write(text.encode()))
    runner.artifact_path = target
    runner.artifact_metadata = metadata
    return target


def read_artifact(path) -> dict:
    target = _artifact.artifact_path(path, ARTIFACT_NAME)
    if not target.is_file():
        raise ArtifactError(
            f"{target}: no onnxruntime engine artifact (build one with "
            f"`framefuse build <model.onnx> --engine onnxruntime`)"
        )
    try:
        metadata = json.loads(target.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(
            f"{target}: not a framefuse onnxruntime engine artifact ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        found = metadata.get("format") if isinstance(metadata, dict) else type(metadata).__name__
        raise ArtifactError(f"{target}: not a framefuse onnxruntime engine artifact (format {found!r})")
    return metadata


def load(artifact, *, device=None, check_source: bool = True) -> OnnxRuntimeRunner:
    """Load ``engine.ort``: refuses foreign and stale artifacts (see the module docstring)."""
    target = _artifact.artifact_path(artifact, ARTIFACT_NAME)
    metadata = read_artifact(target)
    _artifact.check_version(metadata, target, FORMAT_VERSION)
    providers = list(metadata.get("providers") or [CPU_EP])
    requested = torch.device(device) if device is not None else None
    if requested is not None and requested.type == "cpu":
        providers = [CPU_EP]  # the graph is device-independent: the CPU EP can run any of them
    elif requested is not None and requested.type == "cuda" and CUDA_EP not in providers:
        providers = [CUDA_EP, CPU_EP]
    available = _ort().get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise ForeignArtifactError(
            f"{target}: built for {', '.join(missing)}, which onnxruntime {_ort().__version__} here does not have "
            f"(available: {', '.join(available)}); {_artifact.rebuild_hint(metadata, target)}, or install "
            f"onnxruntime-gpu"
        )
    source = _artifact.check_fresh(metadata, target) if check_source else _artifact.find_source(metadata, target)
    if source is None:
        recorded = (metadata.get("source") or {}).get("path")
        raise ArtifactError(
            f"{target}: its model {recorded} is gone (the ONNX file is the onnxruntime engine's "
            f"model); rebuild it with `framefuse build <model.onnx> --engine onnxruntime`"
        )
    options = {
        **DEFAULT_OPTIONS,
        **{k: v for k, v in (metadata.get("session_options") or {}).items() if k in DEFAULT_OPTIONS},
    }
    options["providers"] = providers
    runner = OnnxRuntimeRunner(
        source, options=options, precision=metadata.get("precision", "fp32"), metadata=metadata.get("extra") or {}
    )
    runner.artifact_metadata = metadata
    runner.artifact_path = target
    return runner


def build(
    source, *, out=None, precision: str = "fp32", device=None, options: dict | None = None, log=None
) -> OnnxRuntimeRunner:
    """Backend ``build``: a session over ``source`` (path or ModelProto, taken as given); with
    ``out``, the artifact ``engine.ort``. Options: see ``DEFAULT_OPTIONS`` (``providers``, ``fused``,
    thread counts, ``graph_optimization_level``)."""
    model = source if isinstance(source, onnx.ModelProto) else None
    runner = OnnxRuntimeRunner(source, device=device, options=options, precision=precision)
    if log is not None:
        log(
            f"onnxruntime {_ort().__version__}: session over {runner.label} ({runner.nodes} nodes, "
            f"{'fused' if runner.fused else 'original'} graph) on {', '.join(runner.providers)} in "
            f"{runner.session_seconds:.2f} s"
        )
    if out is not None:
        target = save_runner(runner, out, model=model)
        if log is not None:
            log(f"onnxruntime: wrote {target} (model: {runner.source_path})")
    return runner


__all__ = [
    "NAME",
    "OnnxRuntimeRunner",
    "OrtBinding",
    "build",
    "load",
    "read_artifact",
    "save_runner",
    "unavailable_reason",
]
