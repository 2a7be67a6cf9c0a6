"""Execute an ONNX graph (standard ops + framefuse nodes) with torch, on a CPU or a GPU.

The executor is the body of the cuda-graph engine and, on the CPU, the thing CI compares with
ONNX Runtime on every zoo graph. It works in two stages:

1. **Build** (:class:`GraphExecutor`): read the graph, look up every node in the op table
   (:mod:`framefuse.engines.ops`) or the framefuse registry, and refuse the whole graph up front
   if any node is unknown or uses an attribute value the table cannot honour (the error lists
   every such node and its op).
2. **Plan** (:meth:`GraphExecutor.plan`, once per set of input shapes): one eager run over
   zero-filled inputs on the target device. Shapes are static, so every shape computation
   (``Shape``, ``Gather`` of a shape, ``ConstantOfShape``, masks built from them ...) and every
   node whose inputs are all constants (weight transposes, ``Constant``) is *folded*: evaluated
   here once, kept as a device constant, and dropped from the run list. What remains is
   :class:`Plan`: a flat list of steps with their constant arguments already bound, host-side
   values (a Reshape's shape ...) already resolved to numpy, and the points where each
   intermediate dies. ``Plan.execute`` runs it with no host↔device traffic and no
   synchronisation, so it can be captured in a CUDA graph as is.

framefuse nodes run through ``get_op(op).launch`` on the GPU (into output buffers preallocated
from the planning run) and through ``get_op(op).reference`` on the CPU, or on the GPU when the
caller asks for ``framefuse_impl="reference"`` explicitly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

# IOSpec and the errors live in base.py (shared by every backend); re-exported for old imports.
from framefuse.engines.base import EngineBuildError, EngineRunError, IOSpec  # noqa: F401
from framefuse.engines.ops import (
    OPS,
    TORCH_TO_ONNX,
    OpDef,
    UnsupportedOpError,
    tensor_from_numpy,
    tensor_to_proto,
    torch_dtype,
)
from framefuse.errors import FrameFuseError

FRAMEFUSE_DOMAIN = "framefuse"
STANDARD_DOMAINS = ("", "ai.onnx")
# Ops whose output depends only on input *shapes*, which are static: always folded.
SHAPE_ONLY_OPS = ("Shape", "Size")
FRAMEFUSE_IMPLS = ("kernel", "reference")
# Set to 0 (or false/no/off) to run the plan exactly as the graph is written (see _optimize_steps).
OPTIMIZE_ENV = "FRAMEFUSE_ENGINE_OPT"


def optimization_enabled(optimize: bool | None = None) -> bool:
    """Whether planning rewrites steps to launch fewer kernels: ``optimize`` if given, else the
    environment variable ``FRAMEFUSE_ENGINE_OPT`` (on unless it is 0/false/no/off)."""
    if optimize is not None:
        return bool(optimize)
    return os.environ.get(OPTIMIZE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def node_attrs(node: onnx.NodeProto) -> dict:
    """Attributes as Python values (strings decoded; tensors stay TensorProtos)."""
    return {a.name: _decode(helper.get_attribute_value(a)) for a in node.attribute}


def node_label(node: onnx.NodeProto, index: int) -> str:
    domain = f"{node.domain}::" if node.domain not in STANDARD_DOMAINS else ""
    return f"node '{node.name or f'#{index}'}' ({domain}{node.op_type})"


def _value_info_spec(vi: onnx.ValueInfoProto, what: str) -> tuple[tuple[int | None, ...], torch.dtype]:
    tensor_type = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise EngineBuildError(f"{what} '{vi.name}' is not a tensor")
    dtype = torch_dtype(tensor_type.elem_type, f"{what} '{vi.name}'")
    dims: list[int | None] = []
    if tensor_type.HasField("shape"):
        for d in tensor_type.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else None)
    else:
        dims = None  # type: ignore[assignment]
    return (tuple(dims) if dims is not None else None), dtype  # type: ignore[return-value]


@dataclass
class NodeInfo:
    index: int
    proto: onnx.NodeProto
    label: str
    attrs: dict
    opdef: OpDef | None = None  # standard op
    ff_module: Any = None  # framefuse op package
    ff_attrs: dict | None = None


@contextlib.contextmanager
def fp32_math():
    """Full fp32 matmuls and convolutions (no TF32): the engine's fp32 contract. cuDNN picks its
    convolution algorithm when the op first runs (and at capture), so this wraps planning,
    warm-up and capture; replays keep what was chosen."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


@dataclass
class Step:
    """One node of the run list, with its constant arguments bound."""

    label: str
    op_type: str
    fn: Callable[[list], list]
    template: list  # constant / host / None arguments in place; env arguments filled per run
    env_args: list[tuple[int, str]]  # (position, env name)
    outputs: list[str]  # '' for an output the graph does not use
    frees: list[str] = field(default_factory=list)  # env names dead after this step
    attrs: dict = field(default_factory=dict)  # the node's attributes (standard ops)
    standard: bool = True  # an ONNX op (False: a framefuse op)


@dataclass
class Plan:
    """The folded run list for one set of input shapes."""

    input_specs: dict[str, IOSpec]
    output_specs: dict[str, IOSpec]
    steps: list[Step]
    constants: dict[str, torch.Tensor]  # folded values and weights, on the device
    output_sources: dict[str, tuple[str, str]]  # output name -> ("env" | "const", name)
    folded: list[str]  # labels of the nodes folded at build time
    device: torch.device

    def execute(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run every step on the current stream; returns the graph outputs (device tensors).

        No allocation outside torch's ops, no synchronisation, no host reads: safe to capture."""
        env: dict[str, torch.Tensor] = dict(feeds)
        for step in self.steps:
            args = list(step.template)
            for position, name in step.env_args:
                args[position] = env[name]
            results = step.fn(args)
            for name, value in zip(step.outputs, results):
                if name:
                    env[name] = value
            for name in step.frees:
                env.pop(name, None)
        outputs = {}
        for name, (kind, source) in self.output_sources.items():
            outputs[name] = env[source] if kind == "env" else self.constants[source]
        return outputs


class GraphExecutor:
    """A checked ONNX graph, ready to be planned for input shapes on ``device``.

    Every node must be a standard op of :data:`framefuse.engines.ops.OPS` or a framefuse op;
    anything else is an :class:`UnsupportedOpError` here, naming each offending node.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        device: str | torch.device = "cpu",
        framefuse_impl: str | None = None,
        optimize: bool | None = None,
    ):
        self.model = model
        self.optimize = optimization_enabled(optimize)
        self.device = torch.device(device)
        if framefuse_impl is None:
            framefuse_impl = "kernel" if self.device.type == "cuda" else "reference"
        if framefuse_impl not in FRAMEFUSE_IMPLS:
            raise EngineBuildError(f"framefuse_impl must be one of {FRAMEFUSE_IMPLS}, got {framefuse_impl!r}")
        if self.device.type == "cpu" and framefuse_impl == "kernel":
            raise EngineBuildError("framefuse kernels need a CUDA device; on the CPU use framefuse_impl='reference'")
        self.framefuse_impl = framefuse_impl
        graph = model.graph
        self.initializers: dict[str, np.ndarray] = {
            init.name: numpy_helper.to_array(init) for init in graph.initializer
        }
        self.input_decl: dict[str, tuple[tuple[int | None, ...] | None, torch.dtype]] = {}
        for vi in graph.input:
            if vi.name in self.initializers:
                continue  # old-style graphs list initializers as inputs too
            self.input_decl[vi.name] = _value_info_spec(vi, "graph input")
        self.output_names = [vi.name for vi in graph.output]
        self.nodes = [self._resolve(i, node) for i, node in enumerate(graph.node)]
        self._check_order()
        self._weights: dict[str, torch.Tensor] | None = None
        self._plans: dict[tuple, Plan] = {}

    # -- build-time checks ---------------------------------------------------------------------
    def _resolve(self, index: int, node: onnx.NodeProto) -> NodeInfo:
        info = NodeInfo(index, node, node_label(node, index), node_attrs(node))
        return info

    def _check_order(self) -> None:
        problems = []
        for info in self.nodes:
            node = info.proto
            if node.domain in STANDARD_DOMAINS:
                opdef = OPS.get(node.op_type)
                if opdef is None:
                    problems.append(f"{info.label}: op {node.op_type} is not in the engine's op table")
                    continue
                if opdef.check is not None:
                    reason = opdef.check(info.attrs, len(node.input))
                    if reason:
                        problems.append(f"{info.label}: {reason}")
                        continue
                info.opdef = opdef
            elif node.domain == FRAMEFUSE_DOMAIN:
                from framefuse.plugins.registry import get_op

                try:
                    module = get_op(node.op_type)
                except FrameFuseError as exc:
                    problems.append(f"{info.label}: {exc}")
                    continue
                entry = "launch" if self.framefuse_impl == "kernel" else "reference"
                if not callable(getattr(module, entry, None)):
                    problems.append(f"{info.label}: framefuse op {node.op_type} has no `{entry}` entry")
                    continue
                try:
                    info.ff_attrs = module.SCHEMA.attrs_with_defaults(info.attrs)
                    module.SCHEMA.check_arity(len(node.input))
                except FrameFuseError as exc:
                    problems.append(f"{info.label}: {exc}")
                    continue
                info.ff_module = module
            else:
                problems.append(f"{info.label}: domain '{node.domain}' is not supported (only ONNX and framefuse)")
        if problems:
            listing = "\n  ".join(problems)
            raise UnsupportedOpError(f"the engine cannot run {len(problems)} node(s) of this graph:\n  {listing}")
        # ONNX requires topological order; check it so a broken graph fails here, not mid-run.
        known = set(self.initializers) | set(self.input_decl) | {""}
        for info in self.nodes:
            for name in info.proto.input:
                if name not in known:
                    raise EngineBuildError(
                        f"{info.label}: input '{name}' is not produced by an earlier node, an initializer "
                        f"or a graph input (graph not in topological order, or a dangling name)"
                    )
            known.update(info.proto.output)
        for name in self.output_names:
            if name not in known:
                raise EngineBuildError(f"graph output '{name}' is produced by no node")

    # -- shapes ----------------------------------------------------------------------------------
    def default_input_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for name, (shape, _) in self.input_decl.items():
            if shape is None or any(d is None or d <= 0 for d in shape):
                raise EngineBuildError(
                    f"graph input '{name}' has a dynamic or unknown shape {shape}: framefuse engines need "
                    f"static shapes (export with a fixed shape, or pass input_shapes=)"
                )
            shapes[name] = tuple(int(d) for d in shape)
        return shapes

    def input_dtype(self, name: str) -> torch.dtype:
        return self.input_decl[name][1]

    def check_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        missing = sorted(set(self.input_decl) - set(shapes))
        extra = sorted(set(shapes) - set(self.input_decl))
        if missing or extra:
            raise EngineRunError(
                f"inputs do not match the graph: missing {missing}, unexpected {extra} "
                f"(graph inputs: {list(self.input_decl)})"
            )
        result = {}
        for name, shape in shapes.items():
            declared = self.input_decl[name][0]
            shape = tuple(int(d) for d in shape)
            if declared is not None and (
                len(declared) != len(shape) or any(d is not None and d > 0 and d != s for d, s in zip(declared, shape))
            ):
                raise EngineRunError(f"input '{name}' has shape {list(shape)}, the graph declares {list(declared)}")
            result[name] = shape
        return result

    # -- planning --------------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """Initializers on the device, uploaded once and shared by every plan."""
        if self._weights is None:
            self._weights = {
                name: tensor_from_numpy(value).to(self.device)  # bf16-aware (ml_dtypes arrays)
                for name, value in self.initializers.items()
            }
        return self._weights

    def plan(self, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Plan:
        shapes = self.check_shapes(input_shapes) if input_shapes is not None else self.default_input_shapes()
        key = tuple(sorted(shapes.items()))
        plan = self._plans.get(key)
        if plan is None:
            with fp32_math(), torch.no_grad():
                plan = self._make_plan(shapes)
            self._plans[key] = plan
        return plan

    def _make_plan(self, shapes: dict[str, tuple[int, ...]]) -> Plan:
        device = self.device
        constants: dict[str, torch.Tensor] = dict(self.weights())
        host_cache: dict[str, np.ndarray] = {}
        env: dict[str, torch.Tensor] = {
            name: torch.zeros(shape, dtype=self.input_dtype(name), device=device) for name, shape in shapes.items()
        }

        def host_value(name: str) -> np.ndarray:
            if name not in host_cache:
                host_cache[name] = constants[name].detach().cpu().numpy()
            return host_cache[name]

        steps: list[Step] = []
        folded: list[str] = []
        for info in self.nodes:
            node = info.proto
            names = list(node.input)
            foldable = node.op_type in SHAPE_ONLY_OPS and node.domain in STANDARD_DOMAINS
            if not foldable:
                foldable = all(n == "" or n in constants for n in names) and node.domain in STANDARD_DOMAINS
            host_positions = set(info.opdef.host_inputs) if info.opdef is not None else set()
            template: list = []
            env_args: list[tuple[int, str]] = []
            eager_args: list = []
            for position, name in enumerate(names):
                if name == "":
                    template.append(None)
                    eager_args.append(None)
                elif position in host_positions:
                    if name not in constants:
                        raise EngineBuildError(
                            f"{info.label}: input {position} ('{name}') must be known when the engine is built "
                            f"(it sets a shape or an index), but it depends on the graph's input data; "
                            f"framefuse engines need static shapes"
                        )
                    value = host_value(name)
                    template.append(value)
                    eager_args.append(value)
                elif name in constants:
                    template.append(constants[name])
                    eager_args.append(constants[name])
                else:
                    template.append(None)
                    env_args.append((position, name))
                    eager_args.append(env[name])
            fn = self._step_fn(info)
            try:
                results = list(fn(eager_args))
            except FrameFuseError:
                raise
            except Exception as exc:  # an op failing on the graph's own shapes is a graph problem
                shapes_seen = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in eager_args]
                raise EngineBuildError(
                    f"{info.label} failed while planning: {type(exc).__name__}: {exc} (argument shapes {shapes_seen})"
                ) from exc
            outputs = list(node.output)
            if len(results) < len([o for o in outputs if o]):
                raise EngineBuildError(f"{info.label}: produced {len(results)} outputs, the node has {len(outputs)}")
            if foldable:
                folded.append(info.label)
                for name, value in zip(outputs, results):
                    if name:
                        constants[name] = value.to(device)
                continue
            if info.ff_module is not None and self.framefuse_impl == "kernel":
                # Preallocate the kernel's outputs (all of the schema's, used or not) once; every
                # run and every captured graph writes into the same buffers.
                prealloc = [torch.empty_like(r) for r in results]
                fn = self._kernel_fn(info, prealloc)
            for name, value in zip(outputs, results):
                if name:
                    env[name] = value
            steps.append(
                Step(
                    info.label,
                    node.op_type,
                    fn,
                    template,
                    env_args,
                    outputs,
                    attrs=info.attrs,
                    standard=info.opdef is not None,
                )
            )

        if self.optimize:
            steps = _optimize_steps(steps, env, set(self.output_names), device)

        # Output sources and liveness: an env value dies after its last reader (not if an output).
        output_sources: dict[str, tuple[str, str]] = {}
        output_specs: dict[str, IOSpec] = {}
        for name in self.output_names:
            if name in constants:
                output_sources[name] = ("const", name)
                value = constants[name]
            else:
                output_sources[name] = ("env", name)
                value = env[name]
            output_specs[name] = IOSpec(name, tuple(value.shape), value.dtype)
        last_use: dict[str, int] = {}
        for i, step in enumerate(steps):
            for _, name in step.env_args:
                last_use[name] = i
        keep = {src for kind, src in output_sources.values() if kind == "env"}
        for name, i in last_use.items():
            if name not in keep:
                steps[i].frees.append(name)
        input_specs = {name: IOSpec(name, shape, self.input_dtype(name)) for name, shape in shapes.items()}
        return Plan(input_specs, output_specs, steps, constants, output_sources, folded, device)

    def _step_fn(self, info: NodeInfo) -> Callable[[list], list]:
        n_outputs = len(info.proto.output)
        if info.opdef is not None:
            fn, attrs = info.opdef.fn, info.attrs
            return lambda args: fn(args, attrs, n_outputs)
        module, attrs = info.ff_module, info.ff_attrs
        n_inputs = len(module.SCHEMA.inputs)
        if self.framefuse_impl == "reference":
            reference = module.reference

            def run_reference(args):
                args = list(args) + [None] * (n_inputs - len(args))
                return list(reference(*args, **attrs))

            return run_reference
        launch = module.launch

        def run_kernel_planning(args):
            args = [a.contiguous() if a is not None else None for a in args] + [None] * (n_inputs - len(args))
            return list(launch(args, attrs, outputs=None, stream=None))

        return run_kernel_planning

    def _kernel_fn(self, info: NodeInfo, prealloc: list[torch.Tensor]) -> Callable[[list], list]:
        module, attrs = info.ff_module, info.ff_attrs
        n_inputs = len(module.SCHEMA.inputs)
        launch = module.launch
        pad = [None] * (n_inputs - len(info.proto.input))

        def run_kernel(args):
            # Kernels take contiguous tensors; .contiguous() is free when already so (the usual
            # case) and a captured copy kernel otherwise. stream=None: torch's current stream,
            # which during capture is the capture stream.
            args = [a.contiguous() if a is not None else None for a in args] + pad
            launch(args, attrs, outputs=prealloc, stream=None)
            return prealloc

        return run_kernel

    # -- the folded graph ------------------------------------------------------------------------
    def folded_model(self, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> onnx.ModelProto:
        """The graph as planned: folded nodes replaced by initializers, static input shapes.

        This is what the engine artifact stores; building it again folds nothing new."""
        plan = self.plan(input_shapes)
        kept = {step.label for step in plan.steps}
        nodes = [info.proto for info in self.nodes if info.label in kept]
        used = {name for node in nodes for name in node.input if name}
        used |= {src for kind, src in plan.output_sources.values() if kind == "const"}
        initializers = []
        for name in sorted(used):
            if name in plan.constants and name not in plan.input_specs:
                initializers.append(tensor_to_proto(plan.constants[name], name))
        elem = TORCH_TO_ONNX
        inputs = [
            helper.make_tensor_value_info(spec.name, elem[spec.dtype], list(spec.shape))
            for spec in plan.input_specs.values()
        ]
        outputs = [
            helper.make_tensor_value_info(spec.name, elem[spec.dtype], list(spec.shape))
            for spec in plan.output_specs.values()
        ]
        graph = helper.make_graph(nodes, self.model.graph.name or "framefuse", inputs, outputs, initializers)
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        for prop in self.model.metadata_props:
            model.metadata_props.add(key=prop.key, value=prop.value)
        return model


# -- plan-time optimisation ------------------------------------------------------------------------
# Every kernel in a captured graph costs ~1.5-2.5 µs of replay at batch 1, whatever its size, so
# the run list is rewritten once, at planning, into fewer kernels. The views the op table already
# uses (Reshape, Transpose, Expand, Squeeze ... are torch views) launch nothing; these rewrites
# remove what remains avoidable. Each one keeps the node's ONNX semantics exactly and is checked
# against the planning run's shapes; FRAMEFUSE_ENGINE_OPT=0 (or optimize=False) turns them off.


def _constant_arg(step: Step, position: int) -> torch.Tensor | None:
    """The step's argument at ``position`` if it is a bound constant tensor (not an env value)."""
    if position >= len(step.template) or any(p == position for p, _ in step.env_args):
        return None
    value = step.template[position]
    return value if isinstance(value, torch.Tensor) else None


def _gather_with_constant_indices(step: Step, env: dict, graph_outputs: set, device) -> Callable | None:
    """Gather whose indices are a constant: normalise them once, here, instead of three kernels
    (``lt``/``add``/``where``) per run; a scalar index becomes ``select`` and a run of consecutive
    indices ``narrow``, both views (no kernel at all)."""
    indices = _constant_arg(step, 1)
    if indices is None or [p for p, _ in step.env_args] != [0]:
        return None
    data = env[step.env_args[0][1]]
    axis = int(step.attrs.get("axis", 0))
    axis = axis + data.dim() if axis < 0 else axis
    dim = data.shape[axis]
    idx = indices.detach().cpu().numpy().astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    if idx.size and (idx.min() < 0 or idx.max() >= dim):
        return None  # out of range: leave it to the op (planning would have failed already)
    # A graph output that is a view of a graph input would alias the state buffers the binding
    # copies between; such an output keeps a real copy.
    as_view = step.outputs[0] not in graph_outputs
    if idx.ndim == 0 and as_view:
        index = int(idx)
        return lambda args: [args[0].select(axis, index)]
    if idx.ndim == 1 and idx.size and as_view and bool((np.diff(idx) == 1).all()):
        start, length = int(idx[0]), int(idx.size)
        return lambda args: [args[0].narrow(axis, start, length)]
    flat = torch.from_numpy(np.ascontiguousarray(idx.reshape(-1))).to(device)
    shape = list(data.shape[:axis]) + list(idx.shape) + list(data.shape[axis + 1 :])
    return lambda args: [torch.index_select(args[0], axis, flat).reshape(shape)]


def _matmul_bias(matmul: Step, add: Step, env: dict) -> Callable | None:
    """MatMul(x, W) feeding only Add(·, b), W a constant [K, N] and b a constant of N values over
    the last dim, x with more than one row: one ``addmm`` kernel (cuBLASLt adds the bias in the
    GEMM's epilogue)."""
    weight = _constant_arg(matmul, 1)
    if weight is None or weight.dim() != 2 or [p for p, _ in matmul.env_args] != [0]:
        return None
    x = env[matmul.env_args[0][1]]
    if x.dim() < 2 or not x.dtype.is_floating_point or weight.dtype != x.dtype:
        return None
    product_name = matmul.outputs[0]
    ((position, _),) = [(p, n) for p, n in add.env_args if n == product_name] or [(None, None)]
    if position is None or len(add.env_args) != 1:
        return None
    bias = _constant_arg(add, 1 - position)
    product, total = env[product_name], env[add.outputs[0]]
    n = weight.shape[1]
    if (
        bias is None
        or bias.dtype != x.dtype
        or bias.numel() != n
        or bias.dim() > product.dim()
        or (bias.dim() and bias.shape[-1] != n)
        or tuple(total.shape) != tuple(product.shape)
    ):
        return None
    k = weight.shape[0]
    if x.numel() // k < 2:
        # One row: torch's addmm copies the bias into the output and runs the GEMM onto it, two
        # kernels, exactly what MatMul then Add cost; leave the graph's own rounding alone.
        return None
    bias_row = bias.reshape(n).contiguous()
    out_shape = list(product.shape)
    return lambda args: [torch.addmm(bias_row, args[0].reshape(-1, k), weight).reshape(out_shape)]


class GatherConstantIndices:
    """Gather by constant indices: a view or one ``index_select`` (see _gather_with_constant_indices)."""

    name = "gather-constant-indices"

    def run(self, steps: list[Step], env: dict, graph_outputs: set, device) -> list[Step]:
        result = list(steps)
        for i, step in enumerate(steps):
            if step.op_type != "Gather" or not step.standard:
                continue
            fn = _gather_with_constant_indices(step, env, graph_outputs, device)
            if fn is not None:
                _check_same(step, fn, env)
                result[i] = Step(
                    step.label, step.op_type, fn, step.template, step.env_args, step.outputs, attrs=step.attrs
                )
        return result


class MatMulBias:
    """MatMul by a constant feeding only an Add of a constant bias: one ``addmm`` (see _matmul_bias)."""

    name = "matmul-bias"

    def run(self, steps: list[Step], env: dict, graph_outputs: set, device) -> list[Step]:
        readers: dict[str, list[int]] = {}
        for i, step in enumerate(steps):
            for _, name in step.env_args:
                readers.setdefault(name, []).append(i)
        result = list(steps)
        for i, step in enumerate(steps):
            if step.op_type != "MatMul" or not step.standard or step.outputs[0] in graph_outputs:
                continue
            users = readers.get(step.outputs[0], [])
            if len(users) != 1:
                continue
            add = steps[users[0]]
            if add.op_type != "Add" or not add.standard:
                continue
            fn = _matmul_bias(step, add, env)
            if fn is None:
                continue
            # The MatMul's step computes x·W + b under the MatMul's output name; the Add's step
            # passes it on (no kernel). One step per node stays true (the artifact relies on it).
            fused = Step(step.label, "MatMul+Add", fn, [None], [(0, step.env_args[0][1])], step.outputs)
            _check_same(fused, fn, env)
            position = [p for p, n in add.env_args if n == step.outputs[0]][0]
            result[i] = fused
            result[users[0]] = Step(
                add.label, "Add(in MatMul)", lambda args, p=position: [args[p]], add.template, add.env_args, add.outputs
            )
        return result


class SiblingMatMuls:
    """MatMuls of one input by different constant weights: one GEMM, each output a slice of it
    (see _merge_sibling_matmuls)."""

    name = "sibling-matmuls"

    def run(self, steps: list[Step], env: dict, graph_outputs: set, device) -> list[Step]:
        return _merge_sibling_matmuls(steps, env, graph_outputs)


# The plan-time rewrites, in the order they run: each is one class above with ``name`` and
# ``run(steps, env, graph_outputs, device) -> steps`` (a step per node kept), and a new one is one
# more class and one more entry here. The sibling merge runs last: it must see the MatMuls that
# MatMulBias did not take (a MatMul+Add step is no longer a MatMul).
PLAN_REWRITES = (GatherConstantIndices(), MatMulBias(), SiblingMatMuls())


def _optimize_steps(steps: list[Step], env: dict, graph_outputs: set, device) -> list[Step]:
    for rewrite in PLAN_REWRITES:
        steps = rewrite.run(steps, env, graph_outputs, device)
    return steps


# Ops that read strided (sliced) inputs without a copy: torch's elementwise kernels.
_STRIDE_TOLERANT = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Sigmoid",
    "Tanh",
    "Relu",
    "Exp",
    "Neg",
    "Softplus",
    "Erf",
    "Sqrt",
    "Abs",
}


def _merge_sibling_matmuls(steps: list[Step], env: dict, graph_outputs: set) -> list[Step]:
    """MatMuls of one input by different constant weights [K, N_i] (a layer's gate projections):
    one GEMM by the weights concatenated along N, each output a slice (a view) of its result.
    Only where every reader of each output is an elementwise op, which reads the slice in place;
    a reader that needs contiguous memory would pay a copy and undo the gain."""
    readers: dict[str, list[Step]] = {}
    for step in steps:
        for _, name in step.env_args:
            readers.setdefault(name, []).append(step)
    groups: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        if step.op_type != "MatMul" or not step.standard or [p for p, _ in step.env_args] != [0]:
            continue
        weight = _constant_arg(step, 1)
        x = env[step.env_args[0][1]]
        out = step.outputs[0]
        if (
            weight is None
            or weight.dim() != 2
            or x.dim() < 2
            or weight.dtype != x.dtype
            or not x.dtype.is_floating_point
            or out in graph_outputs
            or not readers.get(out)
            or any(not r.standard or r.op_type not in _STRIDE_TOLERANT for r in readers[out])
        ):
            continue
        groups.setdefault(step.env_args[0][1], []).append(i)
    replace: dict[int, Step | None] = {}
    for x_name, members in groups.items():
        if len(members) < 2:
            continue
        weights = [_constant_arg(steps[i], 1) for i in members]
        k = weights[0].shape[0]
        if any(w.shape[0] != k for w in weights):
            continue
        widths = [int(w.shape[1]) for w in weights]
        merged_weight = torch.cat(weights, dim=1).contiguous()
        lead = list(env[x_name].shape[:-1])
        offsets = np.cumsum([0] + widths[:-1]).tolist()

        # The first MatMul's step runs the GEMM (its result under a name of its own) and takes its
        # slice; each other MatMul's step takes its slice of that result, a view (no kernel).
        first = steps[members[0]]
        merged_name = f"{first.outputs[0]}::merged_gemm"
        env[merged_name] = torch.mm(env[x_name].reshape(-1, k), merged_weight).reshape(lead + [merged_weight.shape[1]])

        def run(args, merged_weight=merged_weight, lead=lead, k=k, offset=offsets[0], width=widths[0]):
            y = torch.mm(args[0].reshape(-1, k), merged_weight).reshape(lead + [merged_weight.shape[1]])
            return [y, y.narrow(-1, offset, width)]

        merged = Step(first.label, "MatMul(merged)", run, [None], [(0, x_name)], [merged_name, first.outputs[0]])
        _check_same(merged, run, env)
        replace[members[0]] = merged
        for i, offset, width in zip(members[1:], offsets[1:], widths[1:]):
            take = Step(
                steps[i].label,
                "MatMul(slice)",
                lambda args, o=offset, w=width: [args[0].narrow(-1, o, w)],
                [None],
                [(0, merged_name)],
                steps[i].outputs,
            )
            _check_same(take, take.fn, env)
            replace[i] = take
    return [replace.get(i, step) for i, step in enumerate(steps)]


def _check_same(step: Step, fn: Callable, env: dict) -> None:
    """A rewritten step must give the planning run's shapes and dtypes (a rewrite's own bug is an
    engine bug, caught here at build time rather than as a wrong answer later)."""
    args = list(step.template)
    for position, name in step.env_args:
        args[position] = env[name]
    results = fn(args)
    for name, value in zip(step.outputs, results):
        if name and (tuple(value.shape) != tuple(env[name].shape) or value.dtype != env[name].dtype):
            raise EngineBuildError(
                f"{step.label}: the engine's rewrite ({step.op_type}) gives {list(value.shape)} {value.dtype}, "
                f"the node gives {list(env[name].shape)} {env[name].dtype} (set {OPTIMIZE_ENV}=0 to bypass; "
                f"please report)"
            )
