"""TensorRT plugins for the framefuse op set, one shared module driven by the op schemas.

Every op in ``framefuse.plugins.registry.OP_TYPES`` becomes a TensorRT ``IPluginV3`` (namespace
``framefuse``, name = op type, version ``"1"``). Nothing op-specific is written here: the shape
rule is ``SCHEMA.infer_shapes``, the dtypes come from ``SCHEMA.inputs/outputs`` ("T" = storage
dtype, else fixed), the serialised fields are ``SCHEMA.attributes``, and the enqueue calls the op
package's ``launch``. The module is split so that everything except the TensorRT glue is plain
Python, testable without TensorRT:

- :func:`output_shapes`, :func:`output_dtypes`, :func:`supports_combination`,
  :func:`attrs_to_fields` / :func:`fields_to_attrs` — the plugin's build-time logic;
- :func:`enqueue_core` — device pointers + shapes + dtypes + stream -> the op's ``launch`` (what
  the plugin's ``enqueue`` calls; tests/gpu/test_tensorrt_plugin_enqueue.py calls it directly);
- :func:`plugin_classes` / :func:`register_creators` — the TensorRT classes, made on demand for a
  given TensorRT module (``tensorrt`` or ``tensorrt_rtx``), since both share the Python API.

See framefuse/engines/TENSORRT.md for which TensorRT accepts which plugin form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from framefuse.errors import FrameFuseError
from framefuse.plugins import registry
from framefuse.plugins.schema import STORAGE_DTYPES, SchemaError, dtype_name

NAMESPACE = registry.DOMAIN
PLUGIN_VERSION = str(registry.VERSION)


class PluginError(FrameFuseError):
    """A framefuse TensorRT plugin was configured with shapes, dtypes or fields it cannot take."""


# A plugin layer takes no empty input (tensorrt_rtx 1.7: "addPluginV3: ... (input) != nullptr"), so
# a node with an absent optional input before a present one (mamba's step form: SelectiveScan
# without D, z and dt_bias, with the state h0) is parsed with its present inputs only and this
# field, a bit mask over the schema's inputs (bit i: input i given), maps them back to positions.
# Without it the inputs given are the schema's first ones.
PRESENT_FIELD = "framefuse_present_inputs"


def present_positions(op_type: str, present: int | None, n_given: int) -> list[int]:
    """The schema positions of the ``n_given`` inputs a plugin layer gets (``present``: the mask)."""
    schema = _schema(op_type)
    if present is None:
        positions = list(range(n_given))
    else:
        positions = [i for i in range(len(schema.inputs)) if int(present) >> i & 1]
        if int(present) >> len(schema.inputs):
            raise PluginError(f"TensorRT plugin {op_type}: {PRESENT_FIELD}={present} names inputs the op does not have")
    if len(positions) != n_given or n_given > len(schema.inputs):
        raise PluginError(
            f"TensorRT plugin {op_type}: {n_given} inputs given, but {PRESENT_FIELD}={present} says {len(positions)}"
        )
    missing = [
        schema.inputs[i].name for i in range(len(schema.inputs)) if not schema.inputs[i].optional and i not in positions
    ]
    if missing:
        raise PluginError(f"TensorRT plugin {op_type}: required input(s) {', '.join(missing)} not given")
    return positions


def by_position(op_type: str, values: Sequence, present: int | None = None) -> list:
    """``values`` of the inputs a plugin layer gets, placed at their schema positions (None where
    an optional input is absent)."""
    out = [None] * len(_schema(op_type).inputs)
    for position, value in zip(present_positions(op_type, present, len(values)), values):
        out[position] = value
    return out


def presence_mask(inputs: Sequence[str]) -> int:
    """The ``PRESENT_FIELD`` mask of an ONNX node's input names ("" = absent)."""
    return sum(1 << i for i, name in enumerate(inputs) if name)


# ---------------------------------------------------------------------------------------------
# build-time logic (no TensorRT)
# ---------------------------------------------------------------------------------------------
def _schema(op_type: str):
    return registry.get_schema(op_type)


def output_shapes(
    op_type: str, input_shapes: Sequence[Sequence[int] | None], attrs: Mapping | None = None, present: int | None = None
):
    """Output shapes of ``op_type`` for the given input shapes (-1 = unknown), from the schema's
    rule. Unknown dimensions in an output are a PluginError: the plugins are built for the static
    shapes framefuse engines use. ``present``: the layer's PRESENT_FIELD mask, if it has one."""
    schema = _schema(op_type)
    if present is None:
        schema.check_arity(len(input_shapes))
    shapes = by_position(op_type, [None if s is None else tuple(int(d) for d in s) for s in input_shapes], present)
    try:
        result = schema.infer_shapes(shapes, schema.attrs_with_defaults(attrs))
    except SchemaError as exc:
        raise PluginError(f"TensorRT plugin {op_type}: {exc}") from exc
    out = [tuple(int(d) for d in s) for s in result]
    for spec, shape in zip(schema.outputs, out):
        if any(d < 0 for d in shape):
            raise PluginError(
                f"TensorRT plugin {op_type}: output {spec.name} has unknown dims {list(shape)} for inputs "
                f"{[list(s) if s is not None else None for s in shapes]}; framefuse plugins need static shapes"
            )
    return out


def storage_dtype(op_type: str, input_dtypes: Sequence[Any], present: int | None = None) -> str:
    """The op's storage dtype "T" (name) read from its first "T" input."""
    schema = _schema(op_type)
    for spec, dt in zip(schema.inputs, by_position(op_type, list(input_dtypes), present)):
        if spec.dtype == "T" and dt is not None:
            return dtype_name(dt)
    raise PluginError(f"TensorRT plugin {op_type}: no storage-dtype input among {len(input_dtypes)} inputs")


def output_dtypes(op_type: str, input_dtypes: Sequence[Any], present: int | None = None) -> list[str]:
    """Output dtype names from the schema ("T" outputs take the storage dtype)."""
    return [dtype_name(d) for d in _schema(op_type).output_dtypes(storage_dtype(op_type, input_dtypes, present))]


def supports_combination(
    op_type: str, pos: int, dtypes: Sequence[str], linear: Sequence[bool], n_inputs: int, present: int | None = None
) -> bool:
    """TensorRT's supportsFormatCombination for position ``pos`` of ``inputs + outputs``: row-major
    (LINEAR) only; storage "T" tensors in float32/float16/bfloat16, all equal to the first input's;
    fixed-dtype tensors (fp32 state) exactly that dtype. ``dtypes`` are dtype names, ``linear``
    whether each position's format is LINEAR; only positions <= pos are looked at, as TensorRT
    requires. ``present``: the layer's PRESENT_FIELD mask, if it has one."""
    schema = _schema(op_type)
    if not linear[pos]:
        return False
    given = [schema.inputs[i] for i in present_positions(op_type, present, n_inputs)]
    specs = given + list(schema.outputs)
    if pos >= len(specs):
        return False
    spec, dt = specs[pos], dtypes[pos]
    if spec.dtype != "T":
        return dt == spec.dtype
    if dt not in STORAGE_DTYPES:
        return False
    first_t = next(i for i, s in enumerate(specs) if s.dtype == "T")
    return pos == first_t or dt == dtypes[first_t]


def attrs_to_fields(op_type: str, attrs: Mapping | None) -> list[tuple[str, np.ndarray]]:
    """The op's attributes (defaults filled) as (name, numpy array) plugin fields: int -> int32[1],
    float -> float32[1], str -> int8 bytes. An attribute whose value is None is left out (its
    default is None, so the reader restores it)."""
    schema = _schema(op_type)
    fields = []
    for name, value in schema.attrs_with_defaults(attrs).items():
        if value is None:
            continue
        typ = schema.attributes[name][0]
        if typ is int:
            fields.append((name, np.array([value], dtype=np.int32)))
        elif typ is float:
            fields.append((name, np.array([value], dtype=np.float32)))
        elif typ is str:
            fields.append((name, np.frombuffer(value.encode(), dtype=np.int8).copy()))
        else:
            raise PluginError(f"TensorRT plugin {op_type}: attribute {name} of type {typ.__name__} cannot be a field")
    return fields


def fields_to_attrs(op_type: str, fields: Mapping[str, Any]) -> dict:
    """Attributes from plugin fields (numpy arrays, bytes or scalars, as the ONNX parser or a plan
    gives them). Fields that are no attribute of the op (the parser's own ``plugin_version`` /
    ``plugin_namespace``) are dropped."""
    schema = _schema(op_type)
    attrs = {}
    for name, raw in fields.items():
        if name not in schema.attributes:
            continue
        typ = schema.attributes[name][0]
        if typ is str:
            attrs[name] = (
                bytes(np.asarray(raw, dtype=np.int8).tobytes()).decode()
                if not isinstance(raw, (str, bytes))
                else (raw.decode() if isinstance(raw, bytes) else raw)
            )
            continue
        arr = np.asarray(raw).reshape(-1)
        if arr.size != 1:
            raise PluginError(f"TensorRT plugin {op_type}: field {name} has {arr.size} values, expected 1")
        attrs[name] = typ(arr[0].item())
    return schema.attrs_with_defaults(attrs)


# ---------------------------------------------------------------------------------------------
# enqueue (no TensorRT): device pointers -> torch views -> the op's launch
# ---------------------------------------------------------------------------------------------
# __cuda_array_interface__ has no bfloat16 typestr: bf16 buffers are wrapped as int16 and viewed.
_CAI_TYPESTR = {"float32": "<f4", "float16": "<f2", "bfloat16": "<i2", "float64": "<f8", "int32": "<i4", "int64": "<i8"}


class _DevicePointer:
    """A device buffer described by ``__cuda_array_interface__`` (what torch.as_tensor wraps)."""

    def __init__(self, ptr: int, shape: Sequence[int], typestr: str):
        self.__cuda_array_interface__ = {
            "data": (int(ptr), False),
            "shape": tuple(int(d) for d in shape),
            "typestr": typestr,
            "strides": None,
            "version": 3,
        }


def tensor_from_pointer(ptr: int, shape: Sequence[int], dtype: Any, device_index: int | None = None):
    """A torch CUDA tensor viewing ``ptr`` (row-major, ``shape``, ``dtype``), no copy."""
    import torch

    name = dtype_name(dtype)
    if name not in _CAI_TYPESTR:
        raise PluginError(f"cannot view a device pointer as {name}")
    shape = tuple(int(d) for d in shape)
    if int(np.prod(shape, dtype=np.int64)) == 0 or not ptr:
        # TensorRT may hand out null pointers for empty tensors; CAI rejects those
        return torch.empty(shape, dtype=getattr(torch, name), device="cuda" if device_index is None else device_index)
    device = torch.device("cuda", torch.cuda.current_device() if device_index is None else device_index)
    t = torch.as_tensor(_DevicePointer(ptr, shape, _CAI_TYPESTR[name]), device=device)
    return t.view(torch.bfloat16) if name == "bfloat16" else t


def enqueue_core(
    op_type: str,
    attrs: Mapping | None,
    input_ptrs: Sequence[int],
    input_shapes: Sequence[Sequence[int]],
    input_dtypes: Sequence[Any],
    output_ptrs: Sequence[int],
    out_shapes: Sequence[Sequence[int]],
    out_dtypes: Sequence[Any],
    stream: int,
    present: int | None = None,
):
    """Run ``op_type`` on raw device buffers on ``stream`` (a CUstream handle as int): wraps the
    pointers as torch tensors and calls the op package's ``launch`` with the outputs given, so
    the kernel writes straight into them. Inputs are the op's first ``len(input_ptrs)`` inputs
    (trailing optional ones left out), or the ones ``present`` (the PRESENT_FIELD mask) names.
    Checks the shapes against the schema's rule first; never synchronises. Returns the output
    tensors (views of ``output_ptrs``)."""
    op = registry.get_op(op_type)
    launch = getattr(op, "launch", None)
    if launch is None:
        raise PluginError(f"TensorRT plugin {op_type}: the op has no CUDA launch")
    attrs = op.SCHEMA.attrs_with_defaults(attrs)
    expected = output_shapes(op_type, input_shapes, attrs, present)
    given = [tuple(int(d) for d in s) for s in out_shapes]
    if expected != given[: len(expected)] or len(given) != len(expected):
        raise PluginError(f"TensorRT plugin {op_type}: output shapes {given} do not match the schema's {expected}")
    want = output_dtypes(op_type, input_dtypes, present)
    got = [dtype_name(d) for d in out_dtypes]
    if want != got:
        raise PluginError(f"TensorRT plugin {op_type}: output dtypes {got} do not match the schema's {want}")
    inputs = by_position(
        op_type, [tensor_from_pointer(p, s, d) for p, s, d in zip(input_ptrs, input_shapes, input_dtypes)], present
    )
    outputs = [tensor_from_pointer(p, s, d) for p, s, d in zip(output_ptrs, out_shapes, out_dtypes)]
    launch(inputs, attrs, outputs, int(stream))
    return outputs


# ---------------------------------------------------------------------------------------------
# TensorRT glue (made per TensorRT module: tensorrt or tensorrt_rtx)
# ---------------------------------------------------------------------------------------------
def trt_dtype_names(trt) -> dict:
    """TensorRT DataType -> dtype name (only the float types the ops take, plus int32/int64)."""
    table = {trt.DataType.FLOAT: "float32", trt.DataType.HALF: "float16", trt.DataType.INT32: "int32"}
    for attr, name in (("BF16", "bfloat16"), ("INT64", "int64")):
        if hasattr(trt.DataType, attr):
            table[getattr(trt.DataType, attr)] = name
    return table


_CLASSES: dict[int, dict[str, type]] = {}

# The name TensorRT knows an op's plugin by, where it cannot be the op type: ONNX (opset 23) has an
# Attention op, and TensorRT's ONNX parser imports any node named Attention, whatever its domain, as
# its own attention layer (tensorrt_rtx 1.7: the build then fails, "Attention operation was not
# supported by a dedicated kernel"), never asking the plugin registry. The engine renames such
# nodes in the graph it parses (framefuse.engines.tensorrt.build_plan).
TRT_PLUGIN_NAMES = {"Attention": "FramefuseAttention"}


def trt_plugin_name(op_type: str) -> str:
    return TRT_PLUGIN_NAMES.get(op_type, op_type)


def plugin_classes(trt) -> dict[str, tuple[type, type]]:
    """op type -> (plugin class, creator class) for TensorRT module ``trt`` (built once per module).

    The plugin implements IPluginV3 with the IPluginV3One{Core,Build,Runtime} capabilities, as in
    NVIDIA's python_plugin samples; every method defers to the functions above."""
    classes = _CLASSES.setdefault(id(trt), {})
    missing = [op_type for op_type in registry.OP_TYPES if op_type not in classes]
    if not missing:  # an op registered later (registry.add_op_package) gets its classes then
        return {op_type: classes[op_type] for op_type in registry.OP_TYPES}
    names = trt_dtype_names(trt)
    by_name = {v: k for k, v in names.items()}

    def fields_of(fc) -> dict:
        return {f.name: f.data for f in fc} if fc is not None else {}

    def constant_dims(dims) -> tuple[int, ...]:
        out = []
        for d in dims:
            out.append(d.get_constant_value() if d.is_constant() else -1)
        return tuple(out)

    def make(op_type: str):
        class Plugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
            def __init__(self, attrs=None, present=None):
                trt.IPluginV3.__init__(self)
                trt.IPluginV3OneCore.__init__(self)
                trt.IPluginV3OneBuild.__init__(self)
                trt.IPluginV3OneRuntime.__init__(self)
                self.plugin_name = trt_plugin_name(op_type)
                self.plugin_namespace = NAMESPACE
                self.plugin_version = PLUGIN_VERSION
                self.num_outputs = len(_schema(op_type).outputs)
                # Python plugins must set every attribute (TensorRT's Python API docs)
                self.timing_cache_id = ""
                self.metadata_string = f"framefuse {op_type} v{PLUGIN_VERSION}"
                self.attrs = _schema(op_type).attrs_with_defaults(attrs)
                self.present = None if present is None else int(present)
                self.in_shapes = None
                self.in_dtypes = None

            def get_capability_interface(self, type):  # noqa: A002 - TensorRT's name
                return self

            def clone(self):
                other = Plugin(self.attrs, self.present)
                other.in_shapes, other.in_dtypes = self.in_shapes, self.in_dtypes
                return other

            def get_fields_to_serialize(self):
                kinds = {
                    np.dtype(np.int32): trt.PluginFieldType.INT32,
                    np.dtype(np.float32): trt.PluginFieldType.FLOAT32,
                    np.dtype(np.int8): trt.PluginFieldType.CHAR,
                }
                fields = attrs_to_fields(op_type, self.attrs)
                if self.present is not None:
                    fields.append((PRESENT_FIELD, np.array([self.present], dtype=np.int32)))
                return trt.PluginFieldCollection([trt.PluginField(n, a, kinds[a.dtype]) for n, a in fields])

            def get_output_data_types(self, input_types):
                return [by_name[n] for n in output_dtypes(op_type, [names.get(t) for t in input_types], self.present)]

            def get_output_shapes(self, inputs, shape_inputs, expr_builder):
                shapes = output_shapes(op_type, [constant_dims(d) for d in inputs], self.attrs, self.present)
                result = []
                for shape in shapes:
                    dims = trt.DimsExprs(len(shape))
                    for i, d in enumerate(shape):
                        dims[i] = expr_builder.constant(d)
                    result.append(dims)
                return result

            def supports_format_combination(self, pos, in_out, num_inputs):
                descs = [io.desc for io in in_out]
                return supports_combination(
                    op_type,
                    pos,
                    [names.get(d.type) for d in descs],
                    [d.format == trt.TensorFormat.LINEAR for d in descs],
                    num_inputs,
                    self.present,
                )

            def configure_plugin(self, inp, out):
                self.in_shapes = [tuple(d.desc.dims) for d in inp]
                self.in_dtypes = [names.get(d.desc.type) for d in inp]

            def get_workspace_size(self, inp, out):
                return 0  # launch allocates what it needs on the enqueue stream (torch caching allocator)

            def on_shape_change(self, inp, out):
                self.in_shapes = [tuple(d.dims) for d in inp]
                self.in_dtypes = [names.get(d.type) for d in inp]

            def attach_to_context(self, context):
                return self.clone()

            def set_tactic(self, tactic):
                pass

            def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
                enqueue_core(
                    op_type,
                    self.attrs,
                    list(inputs),
                    [tuple(d.dims) for d in input_desc],
                    [names.get(d.type) for d in input_desc],
                    list(outputs),
                    [tuple(d.dims) for d in output_desc],
                    [names.get(d.type) for d in output_desc],
                    stream,
                    self.present,
                )

        class Creator(trt.IPluginCreatorV3One):
            def __init__(self):
                trt.IPluginCreatorV3One.__init__(self)
                self.name = trt_plugin_name(op_type)
                self.plugin_namespace = NAMESPACE
                self.plugin_version = PLUGIN_VERSION
                kinds = {
                    int: (np.int32, trt.PluginFieldType.INT32),
                    float: (np.float32, trt.PluginFieldType.FLOAT32),
                    str: (np.int8, trt.PluginFieldType.CHAR),
                }
                self.field_names = trt.PluginFieldCollection(
                    [
                        trt.PluginField(n, np.array([], dtype=kinds[t][0]), kinds[t][1])
                        for n, (t, _) in _schema(op_type).attributes.items()
                    ]
                    + [trt.PluginField(PRESENT_FIELD, np.array([], dtype=np.int32), trt.PluginFieldType.INT32)]
                )

            def create_plugin(self, name, fc, phase):
                fields = fields_of(fc)
                present = fields.get(PRESENT_FIELD)
                present = (
                    None
                    if present is None or np.asarray(present).size == 0
                    else int(np.asarray(present).reshape(-1)[0])
                )
                return Plugin(fields_to_attrs(op_type, fields), present)

        Plugin.__name__ = Plugin.__qualname__ = f"{op_type}TrtPlugin"
        Creator.__name__ = Creator.__qualname__ = f"{op_type}TrtPluginCreator"
        return Plugin, Creator

    classes.update({op_type: make(op_type) for op_type in missing})
    return {op_type: classes[op_type] for op_type in registry.OP_TYPES}


_REGISTERED: dict[tuple[int, str], dict] = {}


def register_creators(trt, namespaces: Sequence[str] = (NAMESPACE,)) -> list:
    """Register one creator per op type in TensorRT's plugin registry under each namespace (once
    per process, namespace and op type: an op registered later gets its creator on the next
    call); returns the creator objects (keep them alive: TensorRT holds only a reference)."""
    registry_ = trt.get_plugin_registry()
    creators = []
    for ns in namespaces:
        made = _REGISTERED.setdefault((id(trt), ns), {})
        for op_type, (_plugin, creator_cls) in plugin_classes(trt).items():
            if op_type in made:
                continue
            creator = creator_cls()
            creator.plugin_namespace = ns
            if not registry_.register_creator(creator, ns):
                raise PluginError(
                    f"TensorRT refused to register the framefuse creator {creator.name} in namespace {ns!r}"
                )
            made[op_type] = creator
        creators.extend(made.values())
    return creators


__all__ = [
    "NAMESPACE",
    "PRESENT_FIELD",
    "TRT_PLUGIN_NAMES",
    "PLUGIN_VERSION",
    "PluginError",
    "attrs_to_fields",
    "by_position",
    "enqueue_core",
    "fields_to_attrs",
    "output_dtypes",
    "output_shapes",
    "plugin_classes",
    "presence_mask",
    "present_positions",
    "register_creators",
    "trt_plugin_name",
    "storage_dtype",
    "supports_combination",
    "tensor_from_pointer",
]
