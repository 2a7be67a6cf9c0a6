"""Run framefuse graphs in ONNX Runtime (CPU): every ``framefuse`` node executes its op's
reference implementation (``framefuse.plugins.<op>.reference``) as an onnxruntime-extensions
Python custom op.

onnxruntime-extensions conventions this module deals with:
- A Python op has a fixed list of inputs, outputs and attributes, each node must carry every
  declared attribute, and optional inputs are not supported. So each distinct *signature* of a
  node (op, which optional inputs are present, storage dtype, attribute names, output count) is
  registered as its own Python op (``FF_<op>_<hash>``) whose function re-inserts ``None`` for
  the absent optionals before calling ``reference``; attribute defaults from the op's schema are
  written into the node.
- Registration is process-wide and may happen after sessions already exist, so every signature
  gets a domain of its own (``framefuse.ort.FF_<op>_<hash>``; the node is moved there in a *copy*
  of the model used only for running). onnxruntime-extensions keeps the registered ops in
  ``std::map<domain, std::vector<PyCustomOpFactory>>`` and hands ONNX Runtime raw pointers into
  those vectors, which ORT keeps (``CustomOpKernel::op_``) and calls on every run and when the
  session is destroyed. Adding an op to a domain that already has one reallocates that vector and
  leaves every earlier session with dangling pointers (SIGSEGV on its next run); a fresh domain
  only inserts a new map node, and map nodes never move. Hence one op per domain, never two, and
  never the shared default domain ``ai.onnx.contrib``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
from pathlib import Path

import numpy as np
import onnx

from framefuse.errors import FrameFuseError, read_onnx
from framefuse.plugins.registry import DOMAIN, get_op

CONTRIB_DOMAIN = "ai.onnx.contrib"
# Prefix of the one-op domains, see the module docstring.
OP_DOMAIN_PREFIX = "framefuse.ort."
_HALF = ("float16", "bfloat16")
_REGISTERED: dict[str, object] = {}


class ParitySetupError(FrameFuseError):
    """A model cannot be prepared for the ONNX Runtime reference run."""


def _ortx():
    try:
        import onnxruntime_extensions as ortx
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ParitySetupError("onnxruntime-extensions is required to run framefuse nodes in ONNX Runtime") from exc
    return ortx


def _pyop_type(dtype_name: str):
    defs = _ortx().PyCustomOpDef
    table = {
        "float32": defs.dt_float,
        "float16": defs.dt_float16,
        "float64": defs.dt_double,
        "bfloat16": defs.dt_bfloat16,
        "int64": defs.dt_int64,
        "int32": defs.dt_int32,
        "bool": defs.dt_bool,
    }
    if dtype_name not in table:
        raise ParitySetupError(f"dtype {dtype_name} cannot cross the onnxruntime-extensions Python-op boundary")
    return table[dtype_name]


def _attr_type(value):
    defs = _ortx().PyCustomOpDef
    if isinstance(value, bool) or isinstance(value, (int, np.integer)):
        return defs.dt_int64
    if isinstance(value, (float, np.floating)):
        return defs.dt_float
    if isinstance(value, str):
        return defs.dt_string
    raise ParitySetupError(f"attribute value {value!r} of type {type(value).__name__} cannot be passed to a Python op")


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name → ONNX element type, for every tensor whose type the model records."""
    types: dict[str, int] = {}
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            types[node.output[0]] = node.attribute[0].t.data_type
    return types


def _dtype_name(elem: int) -> str:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name


def _make_function(op_type: str, present: tuple[bool, ...], out_dtypes: list[str], n_outputs: int):
    module = get_op(op_type)

    def run_reference(*arrays, **attrs):
        import torch

        it = iter(arrays)
        inputs = [torch.from_numpy(np.ascontiguousarray(next(it))) if p else None for p in present]
        outputs = module.reference(*inputs, **attrs)
        if not isinstance(outputs, (tuple, list)):
            outputs = (outputs,)
        result = []
        for o, dt in zip(list(outputs)[:n_outputs], out_dtypes):
            arr = o.detach().cpu()
            if arr.dtype == torch.bfloat16:
                arr = arr.float()
            result.append(np.ascontiguousarray(arr.numpy()).astype(dt, copy=False))
        return tuple(result) if len(result) > 1 else result[0]

    return run_reference


def _registered_elsewhere(ortx, qualified: str):
    """The Opdef the library already holds for `qualified` (``domain::op``), if any: a second
    registration of the same name would grow that domain's vector, which is the crash this module
    avoids, so an op registered before this module was (re)imported is reused."""
    opdef_cls = getattr(ortx, "Opdef", None)
    for opdef in list(getattr(opdef_cls, "_odlist", {}).values()):
        if getattr(opdef, "op_type", None) == qualified:
            return opdef
    return None


def _register(
    op_type: str, present: tuple[bool, ...], in_dtypes: list[str], out_dtypes: list[str], attrs: dict
) -> tuple[str, str]:
    """Register (once per process) the Python op for this signature; its (domain, op name)."""
    key = repr((op_type, present, in_dtypes, out_dtypes, sorted((k, type(v).__name__) for k, v in attrs.items())))
    name = f"FF_{op_type}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    domain = OP_DOMAIN_PREFIX + name
    if name not in _REGISTERED:
        ortx = _ortx()
        qualified = f"{domain}::{name}"  # onnxruntime-extensions splits the domain off at "::"
        existing = _registered_elsewhere(ortx, qualified)
        if existing is not None:
            _REGISTERED[name] = existing
        else:
            fn = _make_function(op_type, present, out_dtypes, len(out_dtypes))
            _REGISTERED[name] = ortx.onnx_op(
                op_type=qualified,
                inputs=[_pyop_type(d) for d in in_dtypes],
                outputs=[_pyop_type(d) for d in out_dtypes],
                attrs={k: _attr_type(v) for k, v in attrs.items()},
            )(fn)
    return domain, name


def prepare_for_ort(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose framefuse nodes are onnxruntime-extensions Python ops."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    if not any(n.domain == DOMAIN for n in model.graph.node):
        return model
    if not model.graph.value_info:
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - types below fall back to the op's storage dtype
            pass
    types = _elem_types(model)
    new_nodes = []
    op_domains: list[str] = []
    for node in model.graph.node:
        if node.domain != DOMAIN:
            new_nodes.append(node)
            continue
        module = get_op(node.op_type)
        schema = module.SCHEMA
        if len(node.input) > len(schema.inputs):
            raise ParitySetupError(
                f"node {node.name!r} ({node.op_type}) has {len(node.input)} inputs, the op takes "
                f"at most {len(schema.inputs)}"
            )
        present = tuple(i < len(node.input) and node.input[i] != "" for i in range(len(schema.inputs)))
        for spec, p in zip(schema.inputs, present):
            if not p and not spec.optional:
                raise ParitySetupError(f"node {node.name!r} ({node.op_type}): required input {spec.name} is missing")
        # Storage dtype: the dtype of the first present "T" input.
        storage = None
        for i, spec in enumerate(schema.inputs):
            if present[i] and spec.dtype == "T" and node.input[i] in types:
                storage = _dtype_name(types[node.input[i]])
                break
        storage = storage or "float32"
        # Half-precision tensors cross the Python-op boundary as float32 (onnxruntime-extensions
        # aborts the process on float16 Python-op tensors): Cast in, reference, Cast out. The
        # references compute in float32 anyway, and Cast rounds like the reference's own output
        # conversion, so the numbers are the same.
        in_dtypes, kept_inputs = [], []
        for i, spec in enumerate(schema.inputs):
            if not present[i]:
                continue
            known = types.get(node.input[i])
            dt = _dtype_name(known) if known else (storage if spec.dtype == "T" else spec.dtype)
            name = node.input[i]
            if dt in _HALF:
                name = f"{node.input[i]}__{node.name or node.op_type}_{i}_f32"
                new_nodes.append(onnx.helper.make_node("Cast", [node.input[i]], [name], to=onnx.TensorProto.FLOAT))
                dt = "float32"
            in_dtypes.append(dt)
            kept_inputs.append(name)
        out_dtypes = [d if isinstance(d, str) else str(d) for d in schema.output_dtypes(storage)][: len(node.output)]
        casts_after = []
        for j, dt in enumerate(out_dtypes):
            if dt in _HALF and node.output[j]:
                wide = f"{node.output[j]}__f32"
                to = onnx.TensorProto.FLOAT16 if dt == "float16" else onnx.TensorProto.BFLOAT16
                casts_after.append(onnx.helper.make_node("Cast", [wide], [node.output[j]], to=to))
                node.output[j] = wide
                out_dtypes[j] = "float32"
        given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        given = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in given.items()}
        attrs = {k: v for k, v in schema.attrs_with_defaults(given).items() if v is not None}
        op_domain, name = _register(node.op_type, present, in_dtypes, out_dtypes, attrs)
        if op_domain not in op_domains:
            op_domains.append(op_domain)
        del node.input[:]
        node.input.extend(kept_inputs)
        del node.attribute[:]
        for k, v in attrs.items():
            node.attribute.append(onnx.helper.make_attribute(k, v))
        node.op_type = name
        node.domain = op_domain
        new_nodes.append(node)
        new_nodes.extend(casts_after)
    nodes_copy = [onnx.NodeProto.FromString(n.SerializeToString()) for n in new_nodes]
    del model.graph.node[:]
    model.graph.node.extend(nodes_copy)
    imports = [imp for imp in model.opset_import if imp.domain != DOMAIN and imp.domain not in op_domains]
    del model.opset_import[:]
    model.opset_import.extend(imports)
    model.opset_import.extend(onnx.helper.make_opsetid(d, 1) for d in op_domains)
    return model


def load_any(model_or_path) -> tuple[onnx.ModelProto, str]:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, model_or_path.graph.name or "<model>"
    path = Path(os.fspath(model_or_path))
    if not path.is_file():
        raise ParitySetupError(f"ONNX model file not found: {path}")
    return read_onnx(path, error=ParitySetupError), str(path)


_VNNI_FLAGS = {"avx512_vnni", "avx_vnni", "avxvnni", "amx_int8"}


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def int8_kernels_saturate() -> bool:
    """Whether ONNX Runtime's fused int8 GEMMs saturate on this CPU. On x86-64 its QDQ fusion turns
    DequantizeLinear -> MatMul -> QuantizeLinear into u8s8 kernels; without VNNI (AVX2, AVX-512
    without VNNI) they add pairs of u8·s8 products in int16, which saturates (2·255·127 > 32767):
    measured on an AMD EPYC (Zen 3, AVX2) here, a framefuse int8 mamba step differed from the graph
    run as written by 0.105 at int8 tolerance 0.1, and by 0.0 with the fusion off. Unknown x86
    CPUs count as saturating; other architectures do not."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    flags = _cpu_flags()
    return flags is None or not (flags & _VNNI_FLAGS)


def keep_qdq_exact(options, proto) -> bool:
    """Turn ONNX Runtime's QDQ fusion off (``session.disable_quant_qdq``) for a graph with Q/DQ
    nodes where its int8 kernels saturate (:func:`int8_kernels_saturate`): the quantized graph
    then runs as written (dequantized weights, float GEMMs, the activations' Q/DQ) instead of
    drifting by up to a quantization step. Returns whether it did."""
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node):
        return False
    if not int8_kernels_saturate():
        return False
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return True


def ort_session(model, *, fused: bool = True, optimize: bool = True):
    """An ONNX Runtime CPU InferenceSession for `model` (ModelProto or path). With ``fused``,
    framefuse nodes run through their reference implementations. ``optimize=False`` turns ONNX
    Runtime's graph optimiser off, so the graph runs exactly as written (its QDQ fusions replace
    DequantizeLinear -> MatMul -> QuantizeLinear with integer kernels whose rounding depends on the
    CPU's instruction set; where they saturate, the fusion is off, see keep_qdq_exact)."""
    import onnxruntime as ort

    proto, label = load_any(model)
    ort.set_default_logger_severity(3)  # ORT's optimiser warnings are noise here
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    else:
        keep_qdq_exact(options, proto)
    python_ops = fused and any(n.domain == DOMAIN for n in proto.graph.node)
    if python_ops:
        proto = prepare_for_ort(proto)
        options.register_custom_ops_library(_ortx().get_library_path())
        # ORT's pool threads spin after each node and take the cores from the torch threads of
        # the Python op that runs next: fused zoo step graphs ran 3-6x slower (2 cores, 2026-12-01:
        # mamba 8.8 -> 2.9 ms a step, attention 6.6 -> 1.1, min_gru 0.70 -> 0.63)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        raise ParitySetupError(f"ONNX Runtime cannot load {label}: {exc}") from exc
    if python_ops:
        return InterruptSafeSession(session)
    return session


@contextlib.contextmanager
def deferred_sigint():
    """Ctrl-C held until the block ends, then raised. framefuse ops run as Python callbacks inside
    ONNX Runtime; a KeyboardInterrupt raised in one crosses into C++ and aborts the process
    (`terminate called after throwing an instance of 'pybind11::error_already_set'`, exit 134)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # handlers can only be set from the main thread, and one installed from C is left alone
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class InterruptSafeSession:
    """An ONNX Runtime session whose ``run`` holds Ctrl-C until it returns (see
    :func:`deferred_sigint`); everything else is the session's own."""

    def __init__(self, session):
        self._session = session

    def run(self, *args, **kwargs):
        with deferred_sigint():
            return self._session.run(*args, **kwargs)

    def run_with_iobinding(self, *args, **kwargs):
        with deferred_sigint():
            return self._session.run_with_iobinding(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)
