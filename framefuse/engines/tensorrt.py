"""The TensorRT backend: ONNX -> serialized plan (``engine.plan`` + ``engine.plan.json``) and a
runner that executes it with ``execute_async_v3`` on fixed device buffers.

Works with full TensorRT (``import tensorrt``, preferred) or TensorRT for RTX (``tensorrt_rtx``),
whichever is importable: both share the Python API used here. What was verified where is in
framefuse/engines/TENSORRT.md; in short, building plans from unfused graphs ran with tensorrt_rtx
1.7 on a CPU-only machine; the runner (``TensorRTRunner`` / ``TrtBinding``) is written from
NVIDIA's documented API and was NOT run here (no GPU; tensorrt_rtx refuses compute capability 9.0,
and full tensorrt cannot be installed on the lab machines).

Fused graphs (``framefuse``-domain nodes) need the plugins of framefuse/plugins/tensorrt_plugins.py.
tensorrt_rtx 1.7's ONNX parser, on meeting a plugin node, dlopens ``libtensorrt_rtx.so`` by that
name; the wheel ships only ``libtensorrt_rtx.so.1``, the parser's ``std::runtime_error("Unable to
open library ...")`` is caught by nobody and the process ends with SIGABRT ("terminate called
without an active exception"). A symlink with the unversioned name in a folder on
``LD_LIBRARY_PATH`` *when the process starts* (the loader reads it once) lets the parser find the
library already loaded and import the nodes as plugin layers. :func:`build_plan` makes that link
(``rtx_parser_library_dir``) and, when this process cannot load the library by that name, builds
in a child process started with the folder on ``LD_LIBRARY_PATH``: the user never has to. A
crash of the child is an EngineBuildError naming the signal, never the end of the caller's
process. With full tensorrt the creators are registered and the nodes parse in-process (not run
here).
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from framefuse.engines import artifact as _artifact
from framefuse.engines.base import (
    BindingBase,
    EngineBuildError,
    EngineRunError,
    EngineRunner,
    IOSpec,
    check_precision,
    load_onnx,
)
from framefuse.engines.registry import ENGINES
from framefuse.plugins.registry import DOMAIN

NAME = "tensorrt"
ARTIFACT_NAME = "engine.plan"
FORMAT = "framefuse-tensorrt-plan"
FORMAT_VERSION = 1
DEFAULT_WORKSPACE = 1 << 30
TIMING_CACHE_NAME = "timing.cache"
INSTALL_HINT = (
    "`pip install tensorrt` (full TensorRT, datacenter GPUs) or `pip install tensorrt-rtx` (TensorRT for RTX)"
)
# keys `options` may hold; anything else is an error (a typo must not be silently ignored)
OPTIONS = ENGINES[NAME].options

# tensorrt_rtx's parser needs its library under the unversioned name (see the module docstring);
# when no such link can be made, this is the one-line reason given instead of the abort.
RTX_PLUGIN_REFUSAL = (
    "TensorRT for RTX {version} cannot build framefuse plugin nodes ({ops}): its ONNX parser loads "
    "libtensorrt_rtx.so by that name and aborts the process when it cannot ({why}); build the unfused "
    "graph (model.onnx) or use full TensorRT (`pip install tensorrt`)"
)
RTX_LIBRARY = "libtensorrt_rtx.so"
# the child that builds a plan with the parser's library on LD_LIBRARY_PATH (see build_plan)
CHILD_TIMEOUT_S = 1800

_TRT: tuple[Any, str] | None = None
_TRT_ERRORS: list[str] = []


def _find_trt() -> tuple[Any, str] | None:
    """(module, flavour) of the TensorRT library here: full ``tensorrt`` first, else
    ``tensorrt_rtx``; None when neither imports."""
    global _TRT
    if _TRT is None and not _TRT_ERRORS:
        for module_name, flavour in (("tensorrt", "tensorrt"), ("tensorrt_rtx", "tensorrt_rtx")):
            try:
                _TRT = (importlib.import_module(module_name), flavour)
                break
            except ImportError as exc:
                _TRT_ERRORS.append(f"{module_name}: {exc}")
    return _TRT


def _trt():
    found = _find_trt()
    if found is None:
        raise EngineBuildError(unavailable_reason())
    return found


def unavailable_reason(device: str | torch.device | None = None) -> str | None:
    """None when a TensorRT library is importable here (plans can be built); else one line with the
    install commands. Running a plan also needs an NVIDIA GPU the library supports (checked at load)."""
    if _find_trt() is not None:
        return None
    return f"engine 'tensorrt' needs TensorRT, which is not installed here; install it with {INSTALL_HINT}"


def library_info() -> dict:
    trt, flavour = _trt()
    return {"flavour": flavour, "version": trt.__version__}


# -- dtypes -----------------------------------------------------------------------------------------
def _dtype_table(trt) -> dict:
    table = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.INT32: torch.int32,
        trt.DataType.BOOL: torch.bool,
    }
    for attr, dt in (("BF16", torch.bfloat16), ("INT64", torch.int64), ("INT8", torch.int8), ("UINT8", torch.uint8)):
        if hasattr(trt.DataType, attr):
            table[getattr(trt.DataType, attr)] = dt
    return table


def framefuse_ops(model: onnx.ModelProto) -> list[str]:
    """The framefuse-domain op types in ``model`` (sorted, unique)."""
    return sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN})


def _nodes_with_holes(model: onnx.ModelProto):
    """(index, node, inputs without trailing absent ones) of each framefuse node with an absent
    input before a present one."""
    for index, node in enumerate(model.graph.node):
        if node.domain != DOMAIN:
            continue
        inputs = list(node.input)
        while inputs and not inputs[-1]:
            inputs.pop()
        if not all(inputs):
            yield index, node, inputs


def plugin_input_holes(model: onnx.ModelProto) -> list[str]:
    """One line per framefuse node with an absent optional input before a present one: TensorRT's
    parser hands a plugin layer no empty input (tensorrt_rtx 1.7: "addPluginV3: ... (input) !=
    nullptr"), so `packed_plugin_inputs` gives such a node (mamba's step form: SelectiveScan
    without D, z and dt_bias, with the state h0) its present inputs only and a mask."""
    from framefuse.plugins.registry import get_schema

    lines = []
    for _, node, inputs in _nodes_with_holes(model):
        holes = [i for i, name in enumerate(inputs) if not name]
        if holes:
            specs = get_schema(node.op_type).inputs
            names = ", ".join(specs[i].name if i < len(specs) else f"#{i}" for i in holes)
            lines.append(
                f"node '{node.name}' ({node.op_type}): optional input(s) {names} absent before "
                f"{specs[len(inputs) - 1].name if len(inputs) <= len(specs) else 'a later one'}"
            )
    return lines


def packed_plugin_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every framefuse node that has an absent optional input before a present one
    given its present inputs only and the attribute ``tensorrt_plugins.PRESENT_FIELD`` (a bit mask
    over the schema's inputs), which the plugin reads back to place them (a copy; ``model`` is
    untouched)."""
    from framefuse.plugins.tensorrt_plugins import PRESENT_FIELD, presence_mask

    packed = None
    for index, _, inputs in _nodes_with_holes(model):
        if packed is None:
            packed = onnx.ModelProto()
            packed.CopyFrom(model)
        target = packed.graph.node[index]
        del target.input[:]
        target.input.extend(name for name in inputs if name)
        target.attribute.append(onnx.helper.make_attribute(PRESENT_FIELD, presence_mask(inputs)))
    return model if packed is None else packed


def plugin_versions(ops: Sequence[str]) -> dict[str, str]:
    from framefuse.plugins import tensorrt_plugins as tp

    return {op: f"{tp.NAMESPACE}::{op} v{tp.PLUGIN_VERSION}" for op in ops}


# -- building ---------------------------------------------------------------------------------------
def _check_options(options: Mapping | None) -> dict:
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise EngineBuildError(f"unknown tensorrt option(s) {unknown}; known: {list(OPTIONS)}")
    return options


def _timing_cache_path(options: Mapping, out_target: Path | None) -> Path | None:
    given = options.get("timing_cache")
    if given is False:
        return None
    if given:
        return Path(given)
    if out_target is not None:
        return out_target.parent / TIMING_CACHE_NAME
    return None


def build_plan(
    model: onnx.ModelProto,
    *,
    options: Mapping | None = None,
    timing_cache: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[bytes, dict]:
    """Parse ``model`` with TensorRT's ONNX parser into a strongly typed network and build a plan.
    Returns (plan bytes, build facts). ``timing_cache``: a file read before and rewritten after
    the build (atomically), so later builds reuse the tactic timings."""
    trt, flavour = _trt()
    options = _check_options(options)
    say = log or (lambda _msg: None)
    ops = framefuse_ops(model)
    holes = plugin_input_holes(model)
    if holes:  # a plugin layer takes no empty input: the present ones and a mask instead
        model = packed_plugin_inputs(model)
        say("plugin layers given their present inputs and a mask: " + "; ".join(holes))
    if ops:
        if flavour == "tensorrt_rtx" and not _parser_library_loadable():
            try:
                folder = rtx_parser_library_dir(trt)
            except EngineBuildError as exc:
                raise EngineBuildError(
                    RTX_PLUGIN_REFUSAL.format(version=trt.__version__, ops=", ".join(ops), why=exc)
                ) from exc
            return _build_plan_in_child(model, options, timing_cache, folder, say)
        from framefuse.plugins import tensorrt_plugins as tp

        tp.register_creators(trt)
        say(f"registered framefuse plugin creators for {', '.join(ops)}")
        renamed = {op: tp.trt_plugin_name(op) for op in ops if tp.trt_plugin_name(op) != op}
        if renamed:  # the parser would import these as its own layers (see TRT_PLUGIN_NAMES)
            model = _renamed_ops(model, renamed)
            say("parsed as plugins under TensorRT names: " + ", ".join(f"{a} -> {b}" for a, b in renamed.items()))

    logger = trt.Logger(trt.Logger.VERBOSE if options.get("verbose") else trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    strongly_typed = hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")
    if strongly_typed:  # precision comes from the ONNX graph's own dtypes (fp16/bf16/Q-DQ graphs as given)
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"{flavour} {trt.__version__}: the ONNX parser rejected the graph: {errors}")
    config = builder.create_builder_config()
    workspace = int(options.get("workspace", DEFAULT_WORKSPACE))
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    if "builder_optimization_level" in options:
        config.builder_optimization_level = int(options["builder_optimization_level"])
    if options.get("compute_capabilities"):
        # tensorrt_rtx only: build for named GPU generations (e.g. ["SM89"]) instead of the current GPU
        names = list(options["compute_capabilities"])
        config.num_compute_capabilities = len(names)
        for i, cc in enumerate(names):
            config.set_compute_capability(getattr(trt.ComputeCapability, cc), i)
    cache = None
    if timing_cache is not None and flavour == "tensorrt_rtx":
        # TensorRT-RTX >= 1.2 deprecates the timing cache ("Timing cache operations are no-ops in
        # TensorRT-RTX"): its kernels are compiled just in time on the target GPU instead
        say("timing cache: not used (a no-op in TensorRT for RTX)")
        timing_cache = None
    if timing_cache is not None:
        data = timing_cache.read_bytes() if timing_cache.is_file() else b""
        cache = config.create_timing_cache(data)
        config.set_timing_cache(cache, ignore_mismatch=False)
        say(f"timing cache {timing_cache} ({'reused, ' + str(len(data)) + ' bytes' if data else 'new'})")
    say(f"building with {flavour} {trt.__version__} (strongly typed: {strongly_typed}, workspace {workspace} B)")
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if plan is None:
        raise EngineBuildError(f"{flavour} {trt.__version__}: build_serialized_network failed (see the log above)")
    data = bytes(memoryview(plan))
    if cache is not None:
        serialized = bytes(memoryview(config.get_timing_cache().serialize()))
        _artifact.write_atomic(timing_cache, lambda f: f.write(serialized))
    say(f"plan built in {seconds:.2f} s, {len(data)} bytes")
    facts = {
        "flavour": flavour,
        "tensorrt_version": trt.__version__,
        "strongly_typed": strongly_typed,
        "workspace": workspace,
        "build_seconds": round(seconds, 3),
        "plan_bytes": len(data),
        "plugins": plugin_versions(ops),
        "timing_cache": str(timing_cache) if timing_cache is not None else None,
        "layers": network.num_layers,
    }
    return data, facts


def _renamed_ops(model: onnx.ModelProto, names: Mapping[str, str]) -> onnx.ModelProto:
    """A copy of ``model`` whose framefuse nodes named in ``names`` carry the new op types."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.domain == DOMAIN and node.op_type in names:
            node.op_type = names[node.op_type]
    return copy


def _parser_library_loadable() -> bool:
    """Whether this process's dynamic loader finds ``libtensorrt_rtx.so`` by that name, as the
    parser asks for it (LD_LIBRARY_PATH is read at process start: setting it now is too late)."""
    import ctypes

    try:
        ctypes.CDLL(RTX_LIBRARY)
    except OSError:
        return False
    return True


def rtx_parser_library_dir(trt=None) -> Path:
    """A folder holding ``libtensorrt_rtx.so`` -> the wheel's ``libtensorrt_rtx.so.1`` (made once,
    under the framefuse cache, atomically); EngineBuildError naming what is missing."""
    import os

    if trt is None:
        trt, _ = _trt()
    candidates = []
    try:
        libs = importlib.import_module("tensorrt_rtx_libs")
        candidates.append(Path(libs.__file__).parent)
    except ImportError:
        pass
    candidates.append(Path(trt.__file__).parent)
    library = next((d / f"{RTX_LIBRARY}.1" for d in candidates if (d / f"{RTX_LIBRARY}.1").is_file()), None)
    if library is None:
        raise EngineBuildError(f"no {RTX_LIBRARY}.1 in {', '.join(str(d) for d in candidates)}")
    from framefuse.plugins.cuda import cache_dir

    folder = cache_dir() / f"tensorrt_rtx-{trt.__version__}-parser-lib"
    link = folder / RTX_LIBRARY
    try:
        if not (link.is_symlink() and Path(os.readlink(link)) == library.resolve()):
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{RTX_LIBRARY}.{os.getpid()}"
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            os.symlink(library.resolve(), tmp)
            os.replace(tmp, link)
    except OSError as exc:
        raise EngineBuildError(f"cannot make the link {link} -> {library}: {exc}") from exc
    return folder


# The child build: the model and options in, the plan and its facts out, through files.
_CHILD = """
import json, sys
from pathlib import Path
import onnx
from framefuse.engines import tensorrt as fft
work = Path(sys.argv[1])
request = json.loads((work / "request.json").read_text())
if not fft._parser_library_loadable():
    sys.exit("the child cannot load libtensorrt_rtx.so either (LD_LIBRARY_PATH=" + repr(request["path"]) + ")")
cache = request["timing_cache"]
plan, facts = fft.build_plan(onnx.load(str(work / "model.onnx")), options=request["options"],
                             timing_cache=Path(cache) if cache else None, log=lambda m: print(m, flush=True))
(work / "facts.json").write_text(json.dumps(facts))
(work / "plan.tmp").write_bytes(plan)
(work / "plan.tmp").replace(work / "plan")
"""


def _build_plan_in_child(model, options, timing_cache, folder: Path, say) -> tuple[bytes, dict]:
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(folder), *filter(None, [env.get("LD_LIBRARY_PATH")])])
    # the child imports the framefuse this process runs, however it was put on sys.path
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    say(
        f"tensorrt_rtx's ONNX parser loads {RTX_LIBRARY} by name: building in a child process with {folder} on LD_LIBRARY_PATH"
    )
    with tempfile.TemporaryDirectory(prefix="framefuse-trt-") as tmp:
        work = Path(tmp)
        onnx.save(model, str(work / "model.onnx"))
        request = {
            "options": dict(options),
            "timing_cache": str(timing_cache) if timing_cache is not None else None,
            "path": env["LD_LIBRARY_PATH"],
        }
        (work / "request.json").write_text(json.dumps(request))
        try:
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, str(work)],
                env=env,
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineBuildError(f"the TensorRT build process did not finish in {CHILD_TIMEOUT_S} s") from exc
        for line in done.stdout.splitlines():
            say(line)
        if done.returncode != 0 or not (work / "plan").is_file():
            if done.returncode < 0:
                how = f"ended by {signal.Signals(-done.returncode).name}"
            else:
                how = f"exited with status {done.returncode}"
            lines = done.stderr.strip().splitlines()
            # TensorRT's own error lines, then the child's last line (the exception)
            picked = [line for line in lines if "] [E] " in line][-2:] + lines[-1:]
            tail = " | ".join(dict.fromkeys(picked))
            raise EngineBuildError(f"the TensorRT build process {how}: {tail or 'no message'}")
        facts = json.loads((work / "facts.json").read_text())
        facts["built_in"] = "child process (tensorrt_rtx's parser needs libtensorrt_rtx.so on LD_LIBRARY_PATH)"
        return (work / "plan").read_bytes(), facts


def _io_specs_from_onnx(model: onnx.ModelProto) -> tuple[dict[str, IOSpec], dict[str, IOSpec]]:
    """Static I/O specs from the graph (the plan has the same names)."""
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}

    def spec(vi) -> IOSpec:
        t = vi.type.tensor_type
        dims = []
        for d in t.shape.dim:
            if not d.HasField("dim_value"):
                raise EngineBuildError(f"TensorRT plans need static shapes: '{vi.name}' has a symbolic dimension")
            dims.append(d.dim_value)
        np_dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        dtype = torch.bfloat16 if "bfloat16" in str(np_dtype) else torch.from_numpy(np.zeros((), np_dtype)).dtype
        return IOSpec(vi.name, tuple(dims), dtype)

    inputs = {vi.name: spec(vi) for vi in model.graph.input if vi.name not in initializers}
    outputs = {vi.name: spec(vi) for vi in model.graph.output}
    return inputs, outputs


def build(
    source,
    *,
    out=None,
    precision: str = "fp32",
    device=None,
    options: dict | None = None,
    log: Callable[[str], None] | None = None,
) -> TensorRTRunner:
    """Build ``source`` (an ONNX path or ModelProto, taken as given) into a TensorRT plan; with
    ``out`` (a folder or an ``.plan`` path) write ``engine.plan`` and ``engine.plan.json`` atomically.
    The returned runner binds the GPU lazily (on first run), so building works without a GPU where
    the library allows it (tensorrt_rtx)."""
    check_precision(precision)
    options = _check_options(options)
    model, source_path = load_onnx(source)
    target = _artifact.artifact_path(out, ARTIFACT_NAME) if out is not None else None
    plan, facts = build_plan(model, options=options, timing_cache=_timing_cache_path(options, target), log=log)
    inputs, outputs = _io_specs_from_onnx(model)
    runner = TensorRTRunner(
        plan,
        inputs,
        outputs,
        precision=precision,
        facts=facts,
        device=device,
        cuda_graph=bool(options.get("cuda_graph", True)),
    )
    runner.source_path = source_path
    if target is not None:
        source_for_meta = source_path
        if source_path is None:  # a ModelProto: keep the graph beside the plan so staleness can be checked
            source_for_meta = target.parent / "engine.plan.onnx"
            data = model.SerializeToString()
            _artifact.write_atomic(source_for_meta, lambda f: f.write(data))
        save(runner, target, source=source_for_meta)
    return runner


# -- the artifact -------------------------------------------------------------------------------------
def metadata_path(target: Path) -> Path:
    return target.with_name(target.name + ".json")


def _gpu_description() -> dict:
    if torch.cuda.is_available():
        return _artifact.device_description(torch.device("cuda"))
    return {"device": "cuda", "gpu_name": "none (built without GPU)", "compute_capability": "none (built without GPU)"}


def save(runner: TensorRTRunner, path, *, source=None) -> Path:
    """Write the plan and its metadata (both atomically; the JSON last, so a plan without its JSON
    is never taken for a complete artifact)."""
    target = _artifact.artifact_path(path, ARTIFACT_NAME)
    metadata = _artifact.common_metadata(
        fmt=FORMAT,
        format_version=FORMAT_VERSION,
        engine=NAME,
        device=torch.device("cpu"),
        precision=runner.precision,
        source=source,
        target=target,
    )
    metadata.update(_gpu_description())  # a plan is always for a GPU, even when built on a CPU-only machine
    metadata.update(runner.facts)
    metadata["plan_sha256"] = _sha256_bytes(runner.plan)
    metadata["inputs"] = [s.describe() for s in runner.input_specs.values()]
    metadata["outputs"] = [s.describe() for s in runner.output_specs.values()]
    _artifact.write_atomic(target, lambda f: f.write(runner.plan))
    text = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
    _artifact.write_atomic(metadata_path(target), lambda f: f.write(text.encode()))
    runner.artifact_path = target
    runner.metadata = runner.artifact_metadata = metadata
    return target


def _sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def read_artifact(path) -> tuple[Path, dict, bytes]:
    """(plan path, metadata, plan bytes); ArtifactError / ForeignArtifactError for anything that is
    not a complete framefuse TensorRT plan."""
    target = _artifact.artifact_path(path, ARTIFACT_NAME)
    meta_file = metadata_path(target)
    if not target.is_file():
        raise _artifact.ArtifactError(f"{target}: no such TensorRT plan")
    if not meta_file.is_file():
        raise _artifact.ForeignArtifactError(
            f"{target}: no {meta_file.name} beside it, so it was not built by framefuse; "
            f"rebuild it with `framefuse build <model.onnx> --engine tensorrt`"
        )
    try:
        metadata = json.loads(meta_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _artifact.ArtifactError(f"{meta_file}: unreadable metadata ({exc})") from exc
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise _artifact.ForeignArtifactError(
            f"{meta_file}: not framefuse TensorRT plan metadata (format {metadata.get('format')!r})"
            if isinstance(metadata, dict)
            else f"{meta_file}: not a JSON object"
        )
    plan = target.read_bytes()
    if _sha256_bytes(plan) != metadata.get("plan_sha256"):
        raise _artifact.ArtifactError(
            f"{target}: the plan does not match its metadata (sha256 differs: corrupted or replaced); "
            f"{_artifact.rebuild_hint(metadata, target)}"
        )
    return target, metadata, plan


def check_library(metadata: dict, target: Path) -> None:
    """ForeignArtifactError unless the TensorRT library here is the one that built the plan (plans
    do not carry across TensorRT versions or between tensorrt and tensorrt_rtx)."""
    trt, flavour = _trt()
    built = (metadata.get("flavour"), metadata.get("tensorrt_version"))
    if built != (flavour, trt.__version__):
        raise _artifact.ForeignArtifactError(
            f"{target}: built with {built[0]} {built[1]}, this is {flavour} {trt.__version__}; "
            f"{_artifact.rebuild_hint(metadata, target)}"
        )


def load(artifact, *, device=None, check_source: bool = True) -> TensorRTRunner:
    """The runner of a saved plan. Refuses foreign plans (another framefuse/artifact version,
    another TensorRT flavour or version, no GPU or another compute capability than recorded)
    and stale ones (source ONNX changed), each with a one-line reason."""
    target, metadata, plan = read_artifact(artifact)
    _artifact.check_version(metadata, target, FORMAT_VERSION)
    check_library(metadata, target)
    if check_source:
        _artifact.check_fresh(metadata, target)
    inputs = {d["name"]: IOSpec(d["name"], tuple(d["shape"]), getattr(torch, d["dtype"])) for d in metadata["inputs"]}
    outputs = {d["name"]: IOSpec(d["name"], tuple(d["shape"]), getattr(torch, d["dtype"])) for d in metadata["outputs"]}
    facts = {
        k: metadata.get(k)
        for k in (
            "flavour",
            "tensorrt_version",
            "strongly_typed",
            "workspace",
            "build_seconds",
            "plan_bytes",
            "plugins",
            "timing_cache",
            "layers",
        )
    }
    runner = TensorRTRunner(
        plan, inputs, outputs, precision=metadata.get("precision", "fp32"), facts=facts, device=device
    )
    runner.artifact_path = target
    runner.artifact_metadata = metadata
    runner.metadata = metadata
    return runner


def _check_gpu_for(metadata_cc: str | None, where: str) -> torch.device:
    """The CUDA device to run on; EngineRunError without one or for a GPU of another compute
    capability than the plan was built for (when it was built on a GPU)."""
    if not torch.cuda.is_available():
        raise EngineRunError(f"{where}: a TensorRT plan runs on an NVIDIA GPU and there is none here")
    device = torch.device("cuda", torch.cuda.current_device())
    here = _artifact.device_description(device)["compute_capability"]
    if metadata_cc and not metadata_cc.startswith("none") and metadata_cc != here:
        raise _artifact.ForeignArtifactError(
            f"{where}: built for compute capability {metadata_cc}, this GPU is {here}; rebuild it here"
        )
    return device


# -- running (NOT run here: written from the documented API) -------------------------------------------
class TensorRTRunner(EngineRunner):
    """A deserialized TensorRT engine (Polygraphy ``BaseRunner``). The engine and its execution
    context are created on first use, on the GPU; ``run`` goes through a private binding."""

    ENGINE = NAME
    DEVICE_FRAMES = True

    def __init__(
        self,
        plan: bytes,
        inputs: dict[str, IOSpec],
        outputs: dict[str, IOSpec],
        *,
        precision: str,
        facts: dict,
        device=None,
        cuda_graph: bool = True,
    ):
        super().__init__(name="tensorrt-runner")
        self.plan = plan
        self._inputs, self._outputs = inputs, outputs
        self.precision = precision
        self.facts = dict(facts)
        self.metadata = dict(facts)
        self.cuda_graph = cuda_graph
        self.requested_device = device
        self.device = torch.device("cuda") if device is None else torch.device(device)
        self.runs = 0
        self._engine = None
        self._runtime = None
        self._run_binding = None

    @property
    def input_specs(self) -> dict[str, IOSpec]:
        return self._inputs

    @property
    def output_specs(self) -> dict[str, IOSpec]:
        return self._outputs

    @property
    def replays(self) -> int:
        return self.runs

    def summary(self) -> dict:
        return {
            "engine": NAME,
            "flavour": self.facts.get("flavour"),
            "tensorrt_version": self.facts.get("tensorrt_version"),
            "precision": self.precision,
            "plan_bytes": len(self.plan),
            "build_seconds": self.facts.get("build_seconds"),
            "plugins": self.facts.get("plugins") or {},
            "inputs": [s.describe() for s in self._inputs.values()],
            "outputs": [s.describe() for s in self._outputs.values()],
        }

    def engine(self):
        """The ICudaEngine (deserialized on first call, on the GPU)."""
        if self._engine is None:
            where = str(self.artifact_path or "tensorrt plan")
            self.device = _check_gpu_for((self.artifact_metadata or {}).get("compute_capability"), where)
            trt, _flavour = _trt()
            if self.facts.get("plugins"):
                from framefuse.plugins import tensorrt_plugins as tp

                tp.register_creators(trt)  # the plan names the creators; they must exist before deserializing
            self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            with torch.cuda.device(self.device):
                engine = self._runtime.deserialize_cuda_engine(self.plan)
            if engine is None:
                raise EngineRunError(
                    f"{where}: TensorRT could not deserialize the plan on {torch.cuda.get_device_name(self.device)}"
                )
            self._check_engine_io(engine, trt, where)
            self._engine = engine
        return self._engine

    def _check_engine_io(self, engine, trt, where: str) -> None:
        """EngineRunError when the deserialized engine's I/O differs from the recorded specs (a
        plan replaced together with its JSON, or a TensorRT that renamed/retyped tensors)."""
        table = _dtype_table(trt)
        found = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            found[name] = (tuple(engine.get_tensor_shape(name)), table.get(engine.get_tensor_dtype(name)))
        expected = {n: (s.shape, s.dtype) for n, s in {**self._inputs, **self._outputs}.items()}
        if found != expected:
            raise EngineRunError(f"{where}: the engine's tensors {found} differ from the recorded I/O {expected}")

    def activate_impl(self):
        self.engine()

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        self.check_feeds(feeds)
        if self._run_binding is None:
            self._run_binding = self.create_binding()
        binding = self._run_binding
        for name in self.input_names:
            value = feeds[name]
            if isinstance(value, torch.Tensor):
                binding.host_in_t[name].copy_(value)
            else:
                np.copyto(binding.host_in[name], np.asarray(value), casting="same_kind")
        binding.launch()
        binding.sync()
        return {name: binding.host_out[name].copy() for name in self.output_names}

    def create_binding(
        self, *, input_shapes=None, host_inputs=None, host_outputs=None, state_pairs=None, input_buffers=None
    ):
        host_inputs = list(self.input_names if host_inputs is None else host_inputs)
        host_outputs = list(self.output_names if host_outputs is None else host_outputs)
        state_pairs = dict(state_pairs or {})
        return TrtBinding(self, host_inputs, host_outputs, state_pairs, input_buffers)


class TrtBinding(BindingBase):
    """Fixed device buffers bound once to one execution context (the Binding protocol of
    framefuse.engines.base). One launch = host->device copies, ``execute_async_v3``, the state
    hand-off (next_state output -> state input buffer, a device copy so the bound addresses never
    change) and device->host copies, all on the binding's stream; with ``cuda_graph`` the whole
    sequence is captured once after a warm-up run and replayed (TensorRT supports capturing
    enqueueV3 when the engine has no data-dependent shapes; a failed capture falls back to
    direct enqueues). NOT run here."""

    def __init__(self, runner: TensorRTRunner, host_inputs, host_outputs, state_pairs, input_buffers):
        engine = runner.engine()
        ins, outs = runner.input_specs, runner.output_specs
        super().__init__(ins, outs, runner.device, host_inputs, host_outputs, state_pairs, input_buffers)
        self.runner = runner
        self.stream = torch.cuda.Stream(device=self.device)
        self.set_host_buffers(
            self.host_buffers(self.host_input_names, ins, pinned=True),
            self.host_buffers(self.host_output_names, outs, pinned=True),
        )
        self.dev_in = {name: self.given_or_zeros(name, spec) for name, spec in ins.items()}
        self.dev_out = {n: torch.zeros(s.shape, dtype=s.dtype, device=self.device) for n, s in outs.items()}
        self.context = engine.create_execution_context()
        if self.context is None:
            raise EngineRunError("TensorRT could not create an execution context (out of GPU memory?)")
        for name, t in self.dev_in.items():
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        for name, t in self.dev_out.items():
            self.context.set_tensor_address(name, t.data_ptr())
        self._graph: torch.cuda.CUDAGraph | None = None
        self._use_graph = runner.cuda_graph
        self.graph_error: str | None = None

    def _enqueue(self) -> None:
        for name in self.host_input_names:
            self.dev_in[name].copy_(self.host_in_t[name], non_blocking=True)
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise EngineRunError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        for out_name, in_name in self.state_pairs.items():
            self.dev_in[in_name].copy_(self.dev_out[out_name], non_blocking=True)
        for name in self.host_output_names:
            self.host_out_t[name].copy_(self.dev_out[name], non_blocking=True)

    def launch(self) -> None:
        with torch.cuda.stream(self.stream):
            if self._graph is not None:
                self._graph.replay()
            elif self._use_graph and self.replays > 0:
                self._capture()
                self._graph.replay() if self._graph is not None else self._enqueue()
            else:
                self._enqueue()
        self.replays += 1
        self.runner.runs += 1

    def _capture(self) -> None:
        # one warm-up run has happened (TensorRT allocates lazily on the first enqueue)
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                self._enqueue()
            self._graph = graph
        except Exception as exc:  # noqa: BLE001 - recorded; direct enqueues keep working
            self._use_graph = False
            self.graph_error = f"{type(exc).__name__}: {exc}"

    def sync(self) -> None:
        self.stream.synchronize()

    def wait_idle(self) -> None:
        self.stream.synchronize()

    def order_after_current(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def output(self, name: str) -> torch.Tensor:
        if name in self.state_pairs:
            return self.dev_in[self.state_pairs[name]]
        return self.dev_out[name]


__all__ = [
    "ARTIFACT_NAME",
    "FORMAT",
    "NAME",
    "RTX_PLUGIN_REFUSAL",
    "rtx_parser_library_dir",
    "TensorRTRunner",
    "TrtBinding",
    "build",
    "build_plan",
    "framefuse_ops",
    "library_info",
    "packed_plugin_inputs",
    "plugin_input_holes",
    "load",
    "read_artifact",
    "unavailable_reason",
]
