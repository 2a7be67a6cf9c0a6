"""The cuda-graph engine: a (fused) ONNX graph executed by torch + framefuse kernels, captured
whole into one CUDA graph per input shape and replayed.

What one replay does (measured on the lab's H100 in the design notes: a launch from Python costs
~21 µs of host time, inside a replayed graph it costs nothing; pinned copies captured in the
graph add ~8 µs where separate copies add ~15 µs — so everything is captured, copies included):

    pinned host inputs ──H2D──▶ device input buffers ──all ops──▶ outputs ──D2H──▶ pinned host outputs
                                       ▲                             │
                                       └──── state hand-off (D2D) ◀──┘   (step form: next_state → state)

A :class:`Binding` is one captured variant: which inputs arrive through pinned host buffers (the
others are device buffers the caller fills, e.g. from a CUDA tensor, or the recurrent state that
never leaves the GPU), which outputs go back to pinned host buffers, and which outputs are copied
onto which inputs at the end of the graph. The same object runs without capture on the CPU
(``device="cpu"``: framefuse nodes through their references), so the session logic above it is
tested in CI.

The engine is also a Polygraphy runner (``activate`` / ``infer`` / ``deactivate``), so Polygraphy's
comparators check it against ONNX Runtime on the original graph.
"""

from __future__ import annotations

import gc
import json
import os
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch

from framefuse.engines import artifact as _artifact
from framefuse.engines.artifact import ArtifactError
from framefuse.engines.base import (
    BindingBase,
    EngineBuildError,
    EngineRunError,
    EngineRunner,
    IOSpec,
    check_precision,
    load_onnx,
    run_host,
    sha256_file,
)
from framefuse.engines.executor import GraphExecutor, Plan, fp32_math
from framefuse.engines.registry import ENGINES

NAME = "cuda-graph"
ARTIFACT_NAME = _artifact.ARTIFACT_NAME
FORMAT = _artifact.FORMAT
FORMAT_VERSION = _artifact.FORMAT_VERSION

# Warm-up runs on the capture stream before capture: cuBLAS/cuDNN create their per-stream
# handles and workspaces on first use, which must not happen inside the capture.
WARMUP_RUNS = 2


class Binding(BindingBase):
    """One runnable variant of a plan with fixed buffers (see the module docstring).

    Attributes the session uses:
      host_in[name]   numpy view of the pinned host buffer of a host-fed input (write the frame here)
      host_in_t[name] the same memory as a torch CPU tensor
      dev_in[name]    the device buffer every input is read from
      host_out[name]  numpy view of the pinned host buffer of a host-returned output
      host_out_t[name] the same as a torch CPU tensor
      dev_out[name]   the device tensor holding each output after a run
    ``launch()`` enqueues one run (a graph replay on the GPU) without waiting; ``sync()`` waits.
    """

    def __init__(
        self,
        engine: CudaGraphEngine,
        plan: Plan,
        host_inputs: Sequence[str],
        host_outputs: Sequence[str],
        state_pairs: Mapping[str, str],
        input_buffers: Mapping[str, torch.Tensor] | None = None,
    ):
        super().__init__(
            plan.input_specs, plan.output_specs, plan.device, host_inputs, host_outputs, state_pairs, input_buffers
        )
        self.engine = engine
        self.plan = plan
        on_gpu = self.device.type == "cuda"
        self.dev_in: dict[str, torch.Tensor] = {
            name: self.given_or_zeros(name, spec) for name, spec in plan.input_specs.items()
        }
        self.set_host_buffers(
            self.host_buffers(self.host_input_names, plan.input_specs, pinned=on_gpu),
            self.host_buffers(self.host_output_names, plan.output_specs, pinned=on_gpu),
        )
        self.dev_out: dict[str, torch.Tensor] = {}
        self.graph: torch.cuda.CUDAGraph | None = None
        self._cu_exec = self._cu_stream = None
        if on_gpu:
            self._capture()

    # -- the body that is captured (GPU) or run eagerly (CPU) -------------------------------------
    def _body(self) -> dict[str, torch.Tensor]:
        for name in self.host_input_names:
            self.dev_in[name].copy_(self.host_in_t[name], non_blocking=True)
        outputs = self.plan.execute(self.dev_in)
        for name in self.host_output_names:
            self.host_out_t[name].copy_(outputs[name], non_blocking=True)
        # The hand-off comes last: every reader of the old state is before it on the stream.
        for out_name, in_name in self.state_pairs.items():
            self.dev_in[in_name].copy_(outputs[out_name])
        return outputs

    def _capture(self) -> None:
        engine = self.engine
        stream = engine.capture_stream
        saved = {name: t.clone() for name, t in self.dev_in.items()}
        with fp32_math(), torch.no_grad():
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_RUNS):
                    self._body()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            # A collection during capture can run finalizers that free driver objects (a dropped
            # engine's graph exec, a kernel module): such calls invalidate a capture. Collect
            # first, then keep the collector off until the capture ends.
            gc.collect()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                with torch.cuda.graph(graph, pool=engine.graph_pool, stream=stream, capture_error_mode="thread_local"):
                    outputs = self._body()
            except Exception as exc:
                raise EngineBuildError(
                    f"CUDA graph capture failed ({type(exc).__name__}: {exc}); an op in the graph synchronises "
                    f"or allocates host memory during the run"
                ) from exc
            finally:
                if gc_was_enabled:
                    gc.enable()
            if engine.graph_pool is None:
                engine.graph_pool = graph.pool()
        # The warm-up ran the hand-off: put the inputs (the state) back as they were.
        for name, t in self.dev_in.items():
            t.copy_(saved[name])
        torch.cuda.synchronize(self.device)
        self.dev_out = outputs
        self.graph = graph
        engine.captures += 1

    # -- running ----------------------------------------------------------------------------------
    def set_replay_mode(self, mode: str) -> None:
        """How a GPU binding replays.

        "torch":  ``CUDAGraph.replay()`` on torch's current stream, then that stream is synchronised
                  (works with whatever stream the caller has made current).
        "driver": ``cuGraphLaunch`` of the instantiated graph on the engine's own stream and
                  ``cuStreamSynchronize`` through cuda-python, skipping torch's Python layers
                  (a few µs less host time per frame). Work the caller enqueues on other streams
                  is ordered explicitly (see ``order_after_current``).
        """
        super().set_replay_mode(mode)
        self._cu_exec = self._cu_stream = None
        if mode == "driver" and self.graph is not None:
            from cuda.bindings import driver

            raw = getattr(self.graph, "raw_cuda_graph_exec", None)
            if raw is None:
                raise EngineRunError(
                    f"replay mode 'driver' needs torch.cuda.CUDAGraph.raw_cuda_graph_exec (torch >= 2.9); "
                    f"this is torch {torch.__version__}"
                )
            self._driver = driver
            self._cu_ok = driver.CUresult.CUDA_SUCCESS
            self._cu_exec = driver.CUgraphExec(init_value=int(raw()))
            self._cu_stream = driver.CUstream(init_value=int(self.engine.replay_stream.cuda_stream))

    def order_after_current(self) -> None:
        """Make this binding's next launch wait for work already enqueued on torch's current
        stream (a device-to-device input copy, a reset). Only "driver" mode needs it."""
        if self._cu_exec is not None:
            self.engine.replay_stream.wait_stream(torch.cuda.current_stream(self.device))

    def launch(self) -> None:
        if self._cu_exec is not None:
            (err,) = self._driver.cuGraphLaunch(self._cu_exec, self._cu_stream)
            if err != self._cu_ok:
                raise EngineRunError(f"cuGraphLaunch failed: {err!r}")
            self.replays += 1
            self.engine.replays += 1
        elif self.graph is not None:
            self.graph.replay()
            self.replays += 1
            self.engine.replays += 1
        else:
            with torch.no_grad():
                self.dev_out = self._body()
            self.engine.eager_runs += 1

    def sync(self) -> None:
        if self._cu_exec is not None:
            (err,) = self._driver.cuStreamSynchronize(self._cu_stream)
            if err != self._cu_ok:
                raise EngineRunError(f"cuStreamSynchronize failed: {err!r}")
        elif self.graph is not None:
            torch.cuda.current_stream(self.device).synchronize()

    def wait_idle(self) -> None:
        """Wait for everything this binding may have enqueued (before touching its buffers
        from another stream, e.g. a reset)."""
        if self._cu_exec is not None:
            self.engine.replay_stream.synchronize()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def run_host(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Copy host feeds in, run, wait; returns copies of the host outputs."""
        return run_host(self, feeds)


class CudaGraphEngine(EngineRunner):
    """A (fused) ONNX graph as a captured-CUDA-graph engine; a Polygraphy runner.

    ``device="cpu"`` runs the same plan eagerly (framefuse nodes through their references).
    """

    ENGINE = NAME
    _frame_states: tuple | list = ()  # step bindings' hostpath.FrameStates (count_native_launches)
    _replays = 0

    @property
    def replays(self) -> int:
        """Graph replays through this engine's bindings, those hostpath.c launched included."""
        return self._replays + sum(state.launches for state in self._frame_states)

    @replays.setter
    def replays(self, value: int) -> None:
        self._replays = int(value) - sum(state.launches for state in self._frame_states)

    def count_native_launches(self, state) -> None:
        """A step binding's hostpath.FrameState: the frames it launches count as replays here
        (until ``forget_native_launches``, when the binding goes)."""
        if not isinstance(self._frame_states, list):
            self._frame_states = []
        self._frame_states.append(state)

    def forget_native_launches(self, state) -> None:
        """A counted binding is gone: its launches stay counted, its state is let go."""
        if state in self._frame_states:
            self._frame_states.remove(state)
            self._replays += state.launches

    def __init__(
        self,
        onnx_path_or_model,
        *,
        device: str | torch.device = "cuda",
        framefuse_impl: str | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        name: str | None = None,
        metadata: dict | None = None,
        optimize: bool | None = None,
        select: str | None = None,
        unfused=None,
        exact_math: bool = False,
        precision: str = "fp32",
        fp32_graph=None,
    ):
        super().__init__(name=name, prefix="framefuse-cuda-graph")
        self.precision = check_precision(precision)
        model, path = load_onnx(onnx_path_or_model)
        self.source_path = path
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise EngineBuildError("device='cuda' but torch sees no CUDA GPU (use device='cpu' to run on the CPU)")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
        elif self.device.type != "cpu":
            raise EngineBuildError(f"device must be 'cuda' or 'cpu', got {device!r}")
        self.executor = GraphExecutor(model, self.device, framefuse_impl, optimize=optimize)
        self.framefuse_impl = self.executor.framefuse_impl
        self.metadata = dict(metadata or {})
        if exact_math:  # recorded, so a load compiles the step kernel with the same math
            self.metadata["exact_math"] = True
        self.exact_math = bool(self.metadata.get("exact_math"))
        self.default_shapes = (
            self.executor.check_shapes({k: tuple(v) for k, v in input_shapes.items()})
            if input_shapes is not None
            else self.executor.default_input_shapes()
        )
        start = time.perf_counter()
        self.default_plan = self.executor.plan(self.default_shapes)  # build-time errors surface here
        self.plan_seconds = time.perf_counter() - start
        if select is not None:  # build-time selection (engines/fusion.py); its report is saved in the artifact
            from framefuse.engines.fusion import apply_selection

            unfused_executor = None
            if unfused is not None and select.startswith("time") and self.device.type == "cuda":
                unfused_model, _ = load_onnx(unfused)
                unfused_executor = GraphExecutor(unfused_model, self.device, framefuse_impl, optimize=optimize)
            self.default_plan, report = apply_selection(
                self.executor,
                self.default_plan,
                select,
                unfused_executor=unfused_executor,
                exact_math=self.exact_math,
                precision=self.precision,
                fp32_graph=fp32_graph if select.startswith("time") and self.device.type == "cuda" else None,
            )
            if report.get("graph") == "unfused":  # the graph before the rewrite won the timing: run (and save) it
                self.executor = unfused_executor
            if select.startswith("time") or "selection" not in self.metadata:  # a load keeps the build's timings
                self.metadata["selection"] = report
        self.captures = 0
        self.replays = 0
        self.eager_runs = 0
        self.graph_pool = None
        self._capture_stream: torch.cuda.Stream | None = None
        self._replay_stream: torch.cuda.Stream | None = None
        self._bindings: dict[tuple, Binding] = {}

    # -- description ------------------------------------------------------------------------------
    @property
    def input_specs(self) -> dict[str, IOSpec]:
        return self.default_plan.input_specs

    @property
    def output_specs(self) -> dict[str, IOSpec]:
        return self.default_plan.output_specs

    @property
    def capture_stream(self) -> torch.cuda.Stream:
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(self.device)
        return self._capture_stream

    @property
    def replay_stream(self) -> torch.cuda.Stream:
        """The engine's own stream for "driver" replays."""
        if self._replay_stream is None:
            self._replay_stream = torch.cuda.Stream(self.device)
        return self._replay_stream

    def summary(self) -> dict:
        plan = self.default_plan
        counts: dict[str, int] = {}
        for step in plan.steps:
            counts[step.op_type] = counts.get(step.op_type, 0) + 1
        compiled = getattr(plan, "compiled", None)  # the step compiler's kernel, when selected
        extra = {}
        if compiled is not None:
            d = compiled.describe()
            extra["stepkernel"] = {
                "source_sha256": d["source_sha256"][:16],
                "gpu": d["gpu"],
                "grid": d["grid"],
                "threads": d["threads"],
                "tasks": d["tasks"],
                "levels": d["levels"],
                "phases": d.get("kernel_phases"),
                "smem_bytes": d["smem_bytes"],
                "weight_rows": d.get("weight_format", "fp32"),
                "narrow_products": d.get("narrow_products", 0),
                "weight_bytes": d.get("weight_bytes"),
            }
        if getattr(plan, "host_only", False):  # the step compiler's CPU step, when selected
            d = plan.describe()
            extra["cpustep"] = {
                "source_sha256": d["source_sha256"][:16],
                "nodes": d["nodes"],
                "weight_floats": d["weight_floats"],
                "scratch_floats": d["scratch_floats"],
            }
        vs_fp32 = (self.metadata.get("selection") or {}).get("vs_fp32")
        if vs_fp32:  # a precision build beside its fp32 graph's step kernels, timed in the same rounds
            extra["vs_fp32"] = {
                "us_per_step": vs_fp32["us_per_step"],
                "fp32_us_per_step": vs_fp32["fp32_us_per_step"],
                "slower": vs_fp32["slower"],
            }
        return {
            **extra,
            "device": str(self.device),
            "framefuse_impl": self.framefuse_impl,
            "nodes": len(self.executor.nodes),
            "folded": len(plan.folded),
            "steps": len(plan.steps),
            "ops": dict(sorted(counts.items())),
            "inputs": [s.describe() for s in plan.input_specs.values()],
            "outputs": [s.describe() for s in plan.output_specs.values()],
            "captures": self.captures,
            "replays": self.replays,
        }

    # -- bindings -----------------------------------------------------------------------------------
    def plan(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Plan:
        if input_shapes is None or {k: tuple(v) for k, v in input_shapes.items()} == self.default_shapes:
            return self.default_plan
        return self.executor.plan({k: tuple(v) for k, v in input_shapes.items()})

    def create_binding(
        self,
        *,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        host_inputs: Sequence[str] | None = None,
        host_outputs: Sequence[str] | None = None,
        state_pairs: Mapping[str, str] | None = None,
        input_buffers: Mapping[str, torch.Tensor] | None = None,
        resident: bool = False,
    ) -> Binding:
        """A new binding (captured now on the GPU). Defaults: every input from the host, every
        output to the host, no hand-off. ``resident``: the step kernel stays on the GPU between
        frames (the step compiler's plan only; see engines.stepkernel.ResidentStepBinding)."""
        plan = self.plan(input_shapes)
        host_inputs = list(plan.input_specs) if host_inputs is None else list(host_inputs)
        host_outputs = list(plan.output_specs) if host_outputs is None else list(host_outputs)
        if hasattr(plan, "create_binding"):  # the step compiler's kernel: mapped host memory, no copies
            return plan.create_binding(
                self,
                host_inputs=host_inputs,
                host_outputs=host_outputs,
                state_pairs=state_pairs or {},
                input_buffers=input_buffers,
                resident=resident,
            )
        if resident:
            raise EngineBuildError(
                "resident=True needs the step compiler's kernel, and this engine's plan is another one "
                "(build the step form with `framefuse build --select stepkernel`)"
            )
        return Binding(self, plan, host_inputs, host_outputs, state_pairs or {}, input_buffers)

    def binding(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Binding:
        """The cached all-host binding for these shapes (used by ``run`` / ``infer``)."""
        shapes = self.default_shapes if input_shapes is None else {k: tuple(v) for k, v in input_shapes.items()}
        key = tuple(sorted(shapes.items()))
        bound = self._bindings.get(key)
        if bound is None:
            bound = self.create_binding(input_shapes=shapes)
            self._bindings[key] = bound
        return bound

    # -- running ------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Run the graph on host inputs (numpy arrays or CPU tensors); returns numpy copies."""
        self.check_feeds(feeds)
        shapes = {n: tuple(np.shape(feeds[n])) for n in self.input_names}
        for name, shape in shapes.items():
            if shape != self.input_specs[name].shape:
                break
        else:
            shapes = None  # the default plan
        return self.binding(shapes).run_host(feeds)

    # Polygraphy runner interface (infer / input metadata: EngineRunner's defaults over run())
    def activate_impl(self):
        self.binding()  # capture now, not during the first timed inference

    # -- artifacts ----------------------------------------------------------------------------------
    def save(self, path, *, source: Path | None = None) -> Path:
        return save_engine(self, path, source=source or self.source_path)


# -- the engine.ffe artifact ---------------------------------------------------------------------------
#
#     engine.ffe (zip, stored)
#       graph.onnx      the graph as the engine runs it: static input shapes, every shape computation
#                       folded into initializers, weights inside
#       metadata.json   format, framefuse version, engine, device, GPU name and compute capability,
#                       torch version, source ONNX path and sha256, inputs/outputs, op counts
#
# A different torch version is recorded but not refused: the graph is torch-independent.


def save_engine(engine: CudaGraphEngine, path, *, source: Path | None = None) -> Path:
    """Write ``engine`` as an artifact at ``path`` (a ``.ffe`` file, or a folder that gets
    ``engine.ffe``), atomically; returns the file written."""
    target = _artifact.artifact_path(path, ARTIFACT_NAME)
    model = engine.executor.folded_model(engine.default_shapes)
    graph_bytes = model.SerializeToString()
    summary = engine.summary()
    metadata = _artifact.common_metadata(
        fmt=FORMAT,
        format_version=FORMAT_VERSION,
        engine=NAME,
        device=engine.device,
        precision=engine.precision,
        source=source,
        target=target,
    )
    metadata.update(
        {
            "framefuse_impl": engine.framefuse_impl,
            "inputs": summary["inputs"],
            "outputs": summary["outputs"],
            "nodes": summary["nodes"],
            "folded_nodes": summary["folded"],
            "ops": summary["ops"],
            "extra": dict(engine.metadata),
        }
    )

    def write(raw) -> None:
        with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr("metadata.json", json.dumps(metadata, indent=2, sort_keys=True))
            zf.writestr("graph.onnx", graph_bytes)

    _artifact.write_atomic(target, write)
    engine.artifact_path = target
    engine.artifact_metadata = metadata
    return target


def read_artifact(path) -> tuple[dict, onnx.ModelProto]:
    """(metadata, graph) of an ``engine.ffe``, without any compatibility check."""
    target = _artifact.artifact_path(path, ARTIFACT_NAME)
    if not target.is_file():
        raise ArtifactError(f"{target}: no engine artifact (build one with `framefuse build <model.fused.onnx>`)")
    try:
        with zipfile.ZipFile(target) as zf:
            metadata = json.loads(zf.read("metadata.json"))
            graph = onnx.load_from_string(zf.read("graph.onnx"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{target}: not a framefuse engine artifact ({type(exc).__name__}: {exc})") from exc
    if metadata.get("format") != FORMAT:
        raise ArtifactError(f"{target}: not a framefuse engine artifact (format {metadata.get('format')!r})")
    return metadata, graph


def _recorded_choice(metadata: dict) -> str | None:
    """The build's selection to re-apply to the saved graph (which is already the unfused one
    when that won: its choice is then "apply")."""
    selection = (metadata.get("extra") or {}).get("selection") or {}
    return selection.get("apply") or selection.get("chosen")


def load_engine(path, *, device: str | torch.device | None = None, check_source: bool = True) -> CudaGraphEngine:
    """Load an ``engine.ffe`` after checking it is neither foreign nor stale."""
    target = _artifact.artifact_path(path, ARTIFACT_NAME)
    metadata, graph = read_artifact(target)
    device = torch.device(device) if device is not None else None
    _artifact.check_compatible(metadata, target, device, format_version=FORMAT_VERSION)
    source = _artifact.check_fresh(metadata, target) if check_source else _artifact.find_source(metadata, target)
    engine = CudaGraphEngine(
        graph,
        device=device if device is not None else metadata["device"],
        framefuse_impl=metadata.get("framefuse_impl"),
        metadata=metadata.get("extra") or {},
        select=_recorded_choice(metadata),
        precision=metadata.get("precision", "fp32"),
    )
    engine.artifact_metadata = metadata
    engine.source_path = source
    engine.artifact_path = target
    return engine


def build_engine(
    onnx_path_or_model,
    *,
    device: str | torch.device = "cuda",
    out: str | os.PathLike | None = None,
    framefuse_impl: str | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    optimize: bool | None = None,
) -> CudaGraphEngine:
    """Build the cuda-graph engine of an ONNX graph (path or ModelProto); with ``out``, also write
    the engine artifact (``engine.ffe``) there. Errors (unknown ops, dynamic shapes ...) are raised
    here, not at the first run. ``optimize=False`` (or FRAMEFUSE_ENGINE_OPT=0) runs every node as
    written, without the planning-time kernel merges of the executor."""
    engine = CudaGraphEngine(
        onnx_path_or_model, device=device, framefuse_impl=framefuse_impl, input_shapes=input_shapes, optimize=optimize
    )
    if out is not None:
        engine.save(out)
    return engine


# -- the backend interface (framefuse.engines.registry) ----------------------------------------------


def gpu_unavailable_reason() -> str | None:
    """None when the engine can capture CUDA graphs here, else why not (one line)."""
    if not torch.cuda.is_available():
        return (
            f"torch {torch.__version__} sees no CUDA GPU (--device cpu runs the cuda-graph engine eagerly on the CPU)"
        )
    return None


def unavailable_reason(device: str | torch.device | None = None) -> str | None:
    """None when the engine can run here on ``device`` (default: any: without a GPU it runs as
    the eager CPU executor, the test double of the GPU engine)."""
    if device is not None and torch.device(device).type == "cuda":
        return gpu_unavailable_reason()
    return None


def _default_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def build(
    source, *, out=None, precision: str = "fp32", device=None, options: dict | None = None, log=None
) -> CudaGraphEngine:
    """Backend ``build``: options ``framefuse_impl`` ("kernel" | "reference"), ``input_shapes``,
    ``optimize`` (bool), ``select`` (build-time selection, engines/fusion.py; default "time"),
    ``unfused`` (the graph before the rewrite, timed as a candidate too), ``exact_math`` (bool: the
    step kernel with exact IEEE division, square root and exp; recorded in the artifact),
    ``fp32_graph`` (a precision build's fp32 graph: its step kernels timed beside, and the build says
    whether it is slower; engines.fusion.apply_selection)."""
    options = dict(options or {})
    known = set(ENGINES[NAME].options)
    unknown = sorted(set(options) - known)
    if unknown:
        raise EngineBuildError(f"cuda-graph engine: unknown option(s) {unknown} (known: {', '.join(sorted(known))})")
    device = _default_device(device)
    options.setdefault("select", "time")  # time the candidate plans on the GPU (skipped with a note on the CPU)
    start = time.perf_counter()
    engine = CudaGraphEngine(source, device=device, precision=precision, **options)
    if log is not None:
        summary = engine.summary()
        log(
            f"cuda-graph: planned {summary['steps']} steps ({summary['folded']} nodes folded) on {engine.device} "
            f"in {time.perf_counter() - start:.2f} s; framefuse nodes by {engine.framefuse_impl}"
        )
        for line in (engine.metadata.get("selection") or {}).get("log", []):
            log(f"cuda-graph: {line}")
    if out is not None:
        target = engine.save(out)
        if log is not None:
            log(f"cuda-graph: wrote {target}")
    return engine


def load(artifact, *, device=None, check_source: bool = True) -> CudaGraphEngine:
    return load_engine(artifact, device=device, check_source=check_source)


__all__ = [
    "NAME",
    "Binding",
    "CudaGraphEngine",
    "build",
    "build_engine",
    "load",
    "load_engine",
    "load_onnx",
    "read_artifact",
    "save_engine",
    "sha256_file",
    "unavailable_reason",
]
