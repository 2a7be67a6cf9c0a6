"""torch → ONNX in two forms, checked before anything is written.

- *sequence* form: ``x [B, T, F]`` → ``y [B, T, out]``.
- *step* form: ``x [B, F]`` and ``state.<name>`` → ``y [B, out]`` and ``next_state.<name>``
  (names from ``model.state_names()``): the graph a game loop runs once per frame.

Every export goes: reference run in torch → ONNX exporter → metadata → ONNX checker (full) →
ONNX Runtime (CPU) on the same seeded inputs vs torch → atomic write of
``<out_dir>/<name>/model.onnx`` and ``manifest.json``. Any failure raises a FrameFuseError
and leaves nothing on disk.

Exporters (``exporter=``): ``torchscript`` (``torch.onnx.export(dynamo=False)``: deterministic
bytes, ONNX LSTM/GRU nodes), ``dynamo`` (``torch.onnx.export(dynamo=True)``: handles ops the
TorchScript exporter lacks, e.g. ``aten::diff`` in transformers' mask code, negative permutes;
its graph is inlined, made static-shape and IR <= 10 like the other) and ``auto`` (TorchScript
first, because its LSTM/GRU nodes map straight onto fused ops; dynamo when TorchScript fails
at any step, checker and parity included). Both run with ``nn.MultiheadAttention``'s fast path
off: its fused kernel ``aten::_native_multi_head_attention`` has no ONNX export.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import re
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import framefuse
from framefuse import config as ffconfig
from framefuse.errors import FrameFuseError, ParityError
from framefuse.exporter.errors import (
    ExportError,
    NoStepFormError,
    OutputDirError,
    ShapeError,
    UnsupportedOperatorError,
)
from framefuse.exporter.loading import (
    apply_weights,
    build_zoo_model,
    is_model_file_spec,
    load_user_model,
    model_label,
)
from framefuse.rewrite.normalize import fix_negative_transpose_perms

FORMS = ("sequence", "step")
EXPORTERS = ("torchscript", "dynamo", "auto")
#: The dynamo exporter writes no opset below this one.
MIN_DYNAMO_OPSET = 18
#: ONNX IR version written: ONNX Runtime >= 1.18 reads IR <= 10 (onnx 1.23 would write 14).
MAX_IR_VERSION = 10
#: Frames stepped from the zero state to get a realistic non-zero state for the step-form check.
WARMUP_FRAMES = 3

Progress = Callable[[str], None]


@dataclass
class ExportResult:
    """What one export produced (paths are final, the files exist)."""

    name: str
    arch: str
    form: str
    directory: Path
    model_path: Path
    manifest_path: Path
    inputs: list[dict]
    outputs: list[dict]
    opset: int
    sha256: str
    parity: dict
    seconds: float
    warnings: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


@dataclass
class PreparedExport:
    """A checked export held in memory, not yet written (see :func:`write_export`)."""

    name: str
    arch: str
    form: str
    onnx_bytes: bytes
    manifest: dict
    seconds: float
    warnings: list[str]


# --------------------------------------------------------------------------------------------
# config and model resolution
# --------------------------------------------------------------------------------------------


def resolve_config(config, arch: str | None) -> dict:
    """A complete validated config from None (the arch's config file), a path, or a dict."""
    if config is None:
        return ffconfig.load_config(arch=arch)
    if isinstance(config, (str, Path)):
        return ffconfig.load_config(config, arch=arch)
    if isinstance(config, Mapping):
        # A (possibly partial) dict given in code: completed from the defaults and the arch's
        # config file, its own values winning (like command-line overrides).
        given = dict(config)
        if arch is not None and given.get("arch") not in (None, arch):
            raise ffconfig.ConfigError(f"config is for arch '{given['arch']}' but arch '{arch}' was asked for")
        given["arch"] = arch or given.get("arch")
        model_keys, _ = ffconfig.zoo_model_keys(given["arch"])
        ffconfig.validate_config(given, "config", model_keys)
        cfg = ffconfig.load_config(arch=given["arch"]) if given["arch"] else ffconfig.load_config()
        for key, value in given.items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = value
        return ffconfig.validate_config(cfg, "config", model_keys)
    raise ExportError(f"config must be a dict, a path to a YAML file or None, got {type(config).__name__}")


def apply_input_shape(cfg: dict, input_shape: Sequence[int] | None) -> dict:
    """``(B, T, F)`` sets batch, seq and in_features (the step form uses B and F)."""
    if input_shape is None:
        return cfg
    shape = tuple(input_shape)
    if len(shape) != 3 or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape):
        raise ShapeError(f"input shape must be three positive integers B,T,F, got {list(shape)}")
    cfg = dict(cfg)
    cfg["batch"], cfg["seq"], cfg["in_features"] = shape
    return cfg


def resolve_model(model_or_arch, cfg: dict):
    """(model in eval mode, arch label) from an nn.Module, a zoo arch name or ``FILE.py:FACTORY``."""
    from torch import nn

    if isinstance(model_or_arch, nn.Module):
        return model_or_arch.eval(), model_label(model_or_arch)
    if not isinstance(model_or_arch, str):
        raise ExportError(
            f"expected an nn.Module, an architecture name or FILE.py:FACTORY, got {type(model_or_arch).__name__}"
        )
    if is_model_file_spec(model_or_arch):
        model = load_user_model(model_or_arch, ffconfig.model_config(cfg), cfg["seed"])
        return model, model_label(model)
    return build_zoo_model(model_or_arch, ffconfig.model_config(cfg), cfg["seed"]), model_or_arch


# --------------------------------------------------------------------------------------------
# step form
# --------------------------------------------------------------------------------------------


def has_step_form(model) -> bool:
    """Whether the model implements ``step``, ``init_state`` and ``state_names`` (not the
    FrameModel placeholders that raise NotImplementedError)."""
    from framefuse.models.base import FrameModel

    for method in ("step", "init_state", "state_names"):
        impl = getattr(type(model), method, None)
        if not callable(impl) or impl is getattr(FrameModel, method):
            return False
    return True


def _step_signature(model, label: str, batch: int) -> tuple[list[str], tuple]:
    """(state names, zero state) with the checks a step export needs."""
    import torch

    if not has_step_form(model):
        missing = [m for m in ("step", "init_state", "state_names") if not callable(getattr(type(model), m, None))]
        what = f"no {', '.join(missing)}" if missing else "only FrameModel's unimplemented step/init_state/state_names"
        raise NoStepFormError(
            f"model '{label}' has {what}: the step form needs step(x_t, state), init_state(batch) "
            f"and state_names() (see framefuse/models/base.py); export --form sequence instead"
        )
    try:
        names = list(model.state_names())
        state = tuple(model.init_state(batch))
    except NotImplementedError:
        raise NoStepFormError(f"model '{label}' does not implement state_names()/init_state(): no step form") from None
    except Exception as exc:
        raise ExportError(
            f"model '{label}': init_state({batch}) / state_names() failed: {type(exc).__name__}: {exc}"
        ) from exc
    if len(names) != len(state):
        raise ExportError(
            f"model '{label}': state_names() gives {len(names)} names {names} but init_state() "
            f"gives {len(state)} tensors"
        )
    if len(set(names)) != len(names):
        raise ExportError(f"model '{label}': state_names() has duplicates: {names}")
    for name, tensor in zip(names, state):
        if not isinstance(tensor, torch.Tensor):
            raise ExportError(
                f"model '{label}': init_state() entry '{name}' is a {type(tensor).__name__}, not a tensor"
            )
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ExportError(f"model '{label}': state name '{name}' must use letters, digits, '_', '.' or '-'")
    return names, state


def _make_step_module(model):
    from torch import nn

    class StepForm(nn.Module):
        """``forward(x_t, *state) -> (y_t, *next_state)``: the model's step as a module."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x_t, *state):
            y_t, next_state = self.inner.step(x_t, tuple(state))
            return (y_t, *next_state)

    return StepForm(model).eval()


# --------------------------------------------------------------------------------------------
# the export itself
# --------------------------------------------------------------------------------------------

_NOISE = (
    "legacy TorchScript-based ONNX export",
    "The feature will be removed",
    "Exporting a model to ONNX with a batch_size other than 1",
)


@contextlib.contextmanager
def _quiet_torchscript_exporter(collected: list[str]):
    """Silence the TorchScript exporter's deprecation warning and its log print.

    torch's ``setup_onnx_logging`` turns ONNX logging on for good (it tests the function
    object instead of calling it), so on an exception the exporter prints the whole TorchScript
    graph to stdout. We route those log lines into ``collected`` and switch logging off after.
    """
    import torch

    c_module = torch._C
    original_log = getattr(c_module, "_jit_onnx_log", None)

    def _collect(*parts):
        collected.append(" ".join(str(p) for p in parts))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if original_log is not None:
            c_module._jit_onnx_log = _collect
        try:
            yield caught
        finally:
            if original_log is not None:
                c_module._jit_onnx_log = original_log
            set_enabled = getattr(c_module, "_jit_set_onnx_log_enabled", None)
            if set_enabled is not None:
                set_enabled(False)


def _unsupported_op_name(message: str) -> str | None:
    match = re.search(r"operator '([^']+)'", message) or re.search(r"'((?:aten|prim|onnx)::[\w.]+)'", message)
    return match.group(1) if match else None


def _torch_to_onnx_bytes(module, args: tuple, input_names, output_names, opset: int, label: str, form: str):
    import torch

    buffer = io.BytesIO()
    logs: list[str] = []
    with _quiet_torchscript_exporter(logs) as caught:
        try:
            with torch.no_grad():
                torch.onnx.export(
                    module,
                    args,
                    buffer,
                    dynamo=False,
                    opset_version=opset,
                    input_names=list(input_names),
                    output_names=list(output_names),
                    do_constant_folding=True,
                    export_params=True,
                )
        except torch.onnx.errors.UnsupportedOperatorError as exc:
            op = _unsupported_op_name(str(exc)) or "an operator"
            raise UnsupportedOperatorError(
                f"cannot export '{label}' ({form} form) at opset {opset}: the ONNX exporter does not "
                f"support operator '{op}' (replace it in the model, or try another --opset)"
            ) from exc
        except FrameFuseError:
            raise
        except Exception as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            op = _unsupported_op_name(str(exc)) if "not supported" in str(exc) or "Unsupported" in str(exc) else None
            if op:
                raise UnsupportedOperatorError(
                    f"cannot export '{label}' ({form} form) at opset {opset}: operator '{op}' is not supported: {message}"
                ) from exc
            raise ExportError(
                f"torch.onnx.export failed for '{label}' ({form} form): {type(exc).__name__}: {message}"
            ) from exc
    # Keep warnings about the user's code (e.g. a TracerWarning on data-dependent control flow
    # in their forward); drop torch's own (nn.LSTM/GRU internals warn on every trace).
    torch_dir = os.path.dirname(torch.__file__)
    notes: list[str] = []
    for w in caught:
        text = str(w.message).strip().splitlines()[0] if str(w.message).strip() else ""
        note = f"{w.category.__name__}: {text} ({os.path.basename(w.filename)}:{w.lineno})"
        if not text or any(noise in text for noise in _NOISE) or str(w.filename).startswith(torch_dir):
            continue
        if note not in notes:
            notes.append(note)
    return buffer.getvalue(), notes


@contextlib.contextmanager
def mha_fastpath_disabled():
    """Turn ``nn.MultiheadAttention``'s fast path off (restored after): in eval mode it calls
    ``aten::_native_multi_head_attention``, which neither exporter can write as ONNX."""
    import torch

    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        yield
        return
    previous = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(previous)


def _dynamo_to_onnx_bytes(module, args: tuple, input_names, output_names, opset: int, label: str, form: str):
    """``torch.onnx.export(dynamo=True)``, made into the graph the rest of the pipeline expects:
    local functions inlined, every dim static (the shapes of ``args``), IR <= MAX_IR_VERSION."""
    import logging

    import onnx
    import torch

    notes: list[str] = []
    target = max(int(opset), MIN_DYNAMO_OPSET)
    if target != int(opset):
        notes.append(f"dynamo exporter: opset {opset} raised to {target} (the lowest it writes)")
    # The dynamo exporter logs its progress and torchvision's absence through ``logging``
    # and prints a banner; both are noise for a user whose export succeeds.
    quiet = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in quiet]
    try:
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                opset_version=target,
                input_names=list(input_names),
                output_names=list(output_names),
                optimize=True,
                verbose=False,
            )
    except FrameFuseError:
        raise
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"torch.onnx.export(dynamo=True) failed for '{label}' ({form} form): {type(exc).__name__}: {message}"
        ) from exc
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    proto = program.model_proto
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
        del proto.functions[:]
    _make_static(proto, {n: tuple(a.shape) for n, a in zip(input_names, args)})
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    return proto.SerializeToString(), notes


def _make_static(proto, shapes: Mapping[str, tuple]) -> None:
    """Pin the graph inputs to the shapes exported with and re-infer everything else, so no
    symbolic dim (``s0``) the dynamo exporter may leave reaches the rewrite."""
    import onnx

    for value in proto.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[value.name]:
                dims.add().dim_value = int(d)
    symbolic = [
        v
        for v in [*proto.graph.value_info, *proto.graph.output]
        if any(d.HasField("dim_param") or not d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
    ]
    if not symbolic:
        return
    del proto.graph.value_info[:]
    for value in proto.graph.output:
        value.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    proto.graph.ClearField("value_info")
    proto.graph.value_info.extend(inferred.graph.value_info)
    del proto.graph.output[:]
    proto.graph.output.extend(inferred.graph.output)


def _reference_run(module, args: tuple, label: str, form: str, shapes: Mapping[str, tuple]):
    """Run torch once (the ground truth); a failure here is almost always a wrong shape."""
    import torch

    described = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    try:
        with torch.no_grad():
            out = module(*args)
    except FrameFuseError as exc:
        raise ShapeError(f"model '{label}' ({form} form) rejects inputs {described}: {exc}") from exc
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ShapeError(
            f"model '{label}' ({form} form) failed on inputs {described}: {type(exc).__name__}: {first} "
            f"(check --input-shape / in_features)"
        ) from exc
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise ExportError(
                f"model '{label}' ({form} form) returned {type(o).__name__} at output {i}; "
                f"framefuse exports models whose forward returns one tensor y"
            )
    batch = next(iter(shapes.values()))[0] if shapes else None
    y = outs[0] if outs else None
    if y is not None and (y.dim() == 0 or (batch is not None and y.shape[0] != batch)):
        raise ExportError(
            f"model '{label}' ({form} form) returned y of shape {list(y.shape)} for inputs {described}; "
            f"framefuse exports models whose output keeps the batch axis first ([{batch}, ...]), one y per frame"
        )
    return tuple(outs)


def compare_outputs(names: Sequence[str], expected: Sequence, actual: Sequence, tol: float) -> dict:
    """Per-output max |diff| and max |diff| / |ref|; passes when |diff| <= tol + tol * |ref|
    element-wise (atol = rtol = tol)."""
    import numpy as np

    report: dict[str, dict] = {}
    for name, ref, got in zip(names, expected, actual):
        ref = np.asarray(ref, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        if ref.shape != got.shape:
            report[name] = {"passed": False, "shape_torch": list(ref.shape), "shape_ort": list(got.shape)}
            continue
        if not np.all(np.isfinite(ref)):
            report[name] = {"passed": False, "nonfinite_torch": True}
            continue
        diff = np.abs(ref - got)
        diff = np.where(np.isnan(diff), np.inf, diff)
        max_abs = float(diff.max()) if diff.size else 0.0
        rel = diff / np.maximum(np.abs(ref), np.finfo(np.float32).tiny)
        max_rel = float(rel.max()) if rel.size else 0.0
        passed = bool(np.all(diff <= tol + tol * np.abs(ref)))
        report[name] = {"passed": passed, "max_abs": max_abs, "max_rel": max_rel}
    return report


def _parity_failure_message(label: str, form: str, report: dict, tol: float) -> str:
    failed = [(n, r) for n, r in report.items() if not r["passed"]]
    parts = []
    for name, r in failed:
        if "shape_torch" in r:
            parts.append(f"output '{name}' has shape {r['shape_ort']} in ONNX Runtime but {r['shape_torch']} in torch")
        elif r.get("nonfinite_torch"):
            parts.append(f"output '{name}' of the torch model is not finite (NaN/inf)")
        else:
            parts.append(f"output '{name}' differs: max abs {r['max_abs']:.3g}, max rel {r['max_rel']:.3g}")
    return f"'{label}' ({form} form): ONNX Runtime does not match torch within {tol:g}: " + "; ".join(parts)


def _versions() -> dict:
    import numpy
    import onnx
    import onnxruntime
    import torch

    return {
        "framefuse": framefuse.__version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def _tensor_info(name: str, tensor) -> dict:
    return {"name": name, "shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", "")}


def prepare_export(
    model,
    *,
    form: str,
    config: dict,
    arch: str,
    name: str | None = None,
    progress: Progress | None = None,
    exporter: str = "auto",
    weights: dict | None = None,
) -> PreparedExport:
    """Export, check and compare in memory. ``config`` must be complete (see resolve_config).
    ``weights``: the account of the model's weights for the manifest (loading.apply_weights).

    ``exporter``: ``"torchscript"``, ``"dynamo"`` or ``"auto"`` (see the module docstring); the
    manifest's ``exporter`` entry says which one produced the graph and why another failed."""
    import onnx
    import onnxruntime as ort
    import torch

    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    if form not in FORMS:
        raise ExportError(f"unknown form '{form}': use one of {', '.join(FORMS)}")
    _check_exporter(exporter)
    cfg = config
    opset = int(cfg["opset"])
    batch, seq, features = cfg["batch"], cfg["seq"], cfg["in_features"]
    label = arch
    name = name or (arch if form == "sequence" else f"{arch}-step")
    _check_name(name)

    generator = torch.Generator().manual_seed(int(cfg["seed"]))
    model = model.eval()
    if form == "sequence":
        x = torch.randn(batch, seq, features, generator=generator)
        module = model
        args: tuple = (x,)
        input_names = ["x"]
        output_names = ["y"]
        state_names: list[str] = []
        input_shape = [batch, seq, features]
    else:
        state_names, zero_state = _step_signature(model, label, batch)
        x = torch.randn(batch, features, generator=generator)
        module = _make_step_module(model)
        # A realistic non-zero state: a few random frames stepped from the zero state (a random
        # tensor could break a model's own invariants, e.g. a 0/1 validity mask).
        state = zero_state
        say(f"{label} step: warming up the state")
        with torch.no_grad():
            try:
                for _ in range(WARMUP_FRAMES):
                    _, state = model.step(torch.randn(batch, features, generator=generator), tuple(state))
            except Exception as exc:
                raise ShapeError(
                    f"model '{label}' (step form) failed on x_t {[batch, features]} with its init_state(): "
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                ) from exc
        state = tuple(s.detach().clone() for s in state)
        if not any(bool(s.abs().sum() > 0) for s in state):
            state = tuple(torch.randn(s.shape, generator=generator, dtype=s.dtype) for s in state)
        args = (x, *state)
        input_names = ["x", *(f"state.{n}" for n in state_names)]
        output_names = ["y", *(f"next_state.{n}" for n in state_names)]
        input_shape = [batch, features]

    shapes = {n: tuple(a.shape) for n, a in zip(input_names, args)}
    say(f"{label} {form}: running torch")
    with mha_fastpath_disabled():
        expected = _reference_run(module, args, label, form, shapes)
    if len(expected) != len(output_names):
        raise ExportError(
            f"model '{label}' ({form} form) returned {len(expected)} outputs, expected {len(output_names)} "
            f"({', '.join(output_names)})"
        )

    cfg_json = ffconfig.to_json(cfg)

    def export_with(which: str):
        say(f"{label} {form}: torch.onnx.export, {which} exporter (opset {opset})")
        to_bytes = _dynamo_to_onnx_bytes if which == "dynamo" else _torch_to_onnx_bytes
        with mha_fastpath_disabled():
            raw, notes = to_bytes(module, args, input_names, output_names, opset, label, form)

        proto = onnx.load_from_string(raw)
        graph_inputs = [i.name for i in proto.graph.input]
        graph_outputs = [o.name for o in proto.graph.output]
        if graph_inputs != input_names:
            raise ExportError(
                f"'{label}' ({form} form): the exported graph has inputs {graph_inputs}, expected {input_names} "
                f"(an input the model never reads is dropped by the exporter)"
            )
        if graph_outputs != output_names:
            raise ExportError(
                f"'{label}' ({form} form): the exported graph has outputs {graph_outputs}, expected {output_names}"
            )
        proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
        # torch's permute(..., -1) reaches the graph as a negative perm the ONNX checker rejects.
        fixed = fix_negative_transpose_perms(proto)
        if fixed:
            notes = [*notes, f"{which} exporter: {fixed} Transpose perm(s) with negative entries made non-negative"]
        metadata = {
            "framefuse.version": framefuse.__version__,
            "framefuse.arch": arch,
            "framefuse.form": form,
            "framefuse.config": cfg_json,
            "framefuse.input_shape": json.dumps(input_shape),
            "framefuse.state_names": json.dumps(state_names),
        }
        del proto.metadata_props[:]
        for key, value in metadata.items():
            proto.metadata_props.add(key=key, value=value)
        proto.producer_name = "framefuse"
        proto.producer_version = framefuse.__version__

        say(f"{label} {form}: ONNX checker")
        try:
            onnx.checker.check_model(proto, full_check=True)
        except Exception as exc:
            raise ExportError(
                f"'{label}' ({form} form): the exported graph fails the ONNX checker: {str(exc).strip().splitlines()[0]}"
            ) from exc
        final = proto.SerializeToString()

        say(f"{label} {form}: ONNX Runtime vs torch")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(final, options, providers=["CPUExecutionProvider"])
            feeds = {n: a.detach().numpy() for n, a in zip(input_names, args)}
            actual = session.run(output_names, feeds)
        except Exception as exc:
            raise ExportError(
                f"'{label}' ({form} form): ONNX Runtime cannot run the exported graph: "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
            ) from exc
        tol = ffconfig.tolerance(cfg, "fp32")  # the export itself is always fp32
        report = compare_outputs(output_names, [e.detach().numpy() for e in expected], actual, tol)
        if not all(r["passed"] for r in report.values()):
            raise ParityError(_parity_failure_message(label, form, report, tol))
        return proto, final, actual, report, notes

    tol = ffconfig.tolerance(cfg, "fp32")  # the export itself is always fp32
    tried: dict[str, str] = {}
    errors: list[FrameFuseError] = []
    order = ["torchscript", "dynamo"] if exporter == "auto" else [exporter]
    for which in order:
        try:
            proto, final, actual, report, notes = export_with(which)
        except FrameFuseError as exc:
            errors.append(exc)
            tried[which] = str(exc)
            if which != order[-1]:
                say(f"{label} {form}: the {which} exporter failed, trying {order[-1]}: {exc}")
                continue
            if len(errors) == 1:
                raise
            # The first exporter's error class (and exit code) leads; every attempt is named.
            combined = "; ".join(f"{k} exporter: {v}" for k, v in tried.items())
            raise type(errors[0])(f"every exporter failed ({combined})") from exc
        used = which
        break

    outputs_info = [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype)} for n, a in zip(output_names, actual)]
    manifest = {
        "name": name,
        "arch": arch,
        "form": form,
        "inputs": [_tensor_info(n, a) for n, a in zip(input_names, args)],
        "outputs": outputs_info,
        "state_names": state_names,
        "opset": max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=opset),
        "ir_version": proto.ir_version,
        "exporter": {"requested": exporter, "used": used, "failed": tried},
        "config": json.loads(cfg_json),
        "weights": weights or {"source": "not recorded (prepare_export called without an account)"},
        "framefuse_version": framefuse.__version__,
        "model_file": "model.onnx",
        "sha256": hashlib.sha256(final).hexdigest(),
        "size_bytes": len(final),
        "parity": {
            "reference": "torch (CPU, fp32)",
            "runtime": f"onnxruntime {ort.__version__} CPUExecutionProvider",
            "tolerance": tol,
            "criterion": "|ort - torch| <= tol + tol * |torch| element-wise",
            "seed": int(cfg["seed"]),
            "state": f"zero state stepped over {WARMUP_FRAMES} random frames" if form == "step" else None,
            "passed": True,
            "outputs": report,
        },
        "versions": _versions(),
        "export_warnings": notes,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return PreparedExport(
        name=name,
        arch=arch,
        form=form,
        onnx_bytes=final,
        manifest=manifest,
        seconds=time.perf_counter() - started,
        warnings=notes,
    )


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _check_exporter(exporter: str) -> None:
    if exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter '{exporter}': use one of {', '.join(EXPORTERS)}")


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise ExportError(f"artifact name '{name}' must be a plain folder name (no '/', not starting with '.')")


def check_output_dir(out_dir: Path) -> None:
    """Fail early (before the slow part) when ``out_dir`` cannot be created or written."""
    out_dir = Path(out_dir)
    probe = out_dir
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputDirError(f"cannot write artifacts to {out_dir}: {probe} is a file, not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise OutputDirError(f"cannot write artifacts to {out_dir}: {probe} is not writable")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _make_dirs(folder: Path) -> list[Path]:
    """mkdir -p, returning the folders it created (so a failure can remove exactly those)."""
    missing = []
    probe = folder
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    created = []
    for path in reversed(missing):
        path.mkdir()
        created.append(path)
    return created


def write_artifacts(out_dir: Path, prepared: Sequence[PreparedExport]) -> list[ExportResult]:
    """Write every prepared export as ``out_dir/<name>/`` all-or-nothing.

    Each artifact is written into a temp folder beside its target and renamed into place;
    a replaced artifact is kept aside until all renames succeeded. On any error the temp
    folders are removed, replaced artifacts restored, and folders this call created removed.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    created: list[Path] = []
    staged: list[tuple[PreparedExport, Path, Path]] = []
    swapped: list[tuple[Path, Path | None]] = []  # (target, backup or None)
    try:
        try:
            created = _make_dirs(out_dir)
            for item in prepared:
                target = out_dir / item.name
                if target.exists() and not target.is_dir():
                    raise OutputDirError(f"cannot write artifact to {target}: a file with that name is in the way")
                tmp = Path(tempfile.mkdtemp(prefix=f".{item.name}.tmp-", dir=out_dir))
                staged.append((item, tmp, target))
                os.chmod(tmp, 0o777 & ~_current_umask())  # mkdtemp makes it 0700
                (tmp / "model.onnx").write_bytes(item.onnx_bytes)
                (tmp / "manifest.json").write_text(json.dumps(item.manifest, indent=2, sort_keys=False) + "\n")
            for item, tmp, target in staged:
                backup = None
                if target.exists():
                    backup = out_dir / f".{item.name}.old-{uuid.uuid4().hex[:8]}"
                    os.rename(target, backup)
                swapped.append((target, backup))
                os.rename(tmp, target)
        except OSError as exc:
            where = exc.filename or out_dir
            raise OutputDirError(f"cannot write artifacts to {out_dir}: {exc.strerror or exc} ({where})") from exc
    except BaseException:
        for target, backup in reversed(swapped):
            if backup is not None:
                shutil.rmtree(target, ignore_errors=True)
                with contextlib.suppress(OSError):
                    os.rename(backup, target)
            else:
                shutil.rmtree(target, ignore_errors=True)
        for _item, tmp, _target in staged:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    for _target, backup in swapped:
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)

    results = []
    for item, _tmp, target in staged:
        m = item.manifest
        results.append(
            ExportResult(
                name=item.name,
                arch=item.arch,
                form=item.form,
                directory=target,
                model_path=target / "model.onnx",
                manifest_path=target / "manifest.json",
                inputs=m["inputs"],
                outputs=m["outputs"],
                opset=m["opset"],
                sha256=m["sha256"],
                parity=m["parity"],
                seconds=item.seconds,
                warnings=item.warnings,
                manifest=m,
            )
        )
    return results


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def export_forms(
    model_or_arch,
    *,
    forms: Sequence[str] | None = None,
    config=None,
    out_dir: str | Path = "artifacts",
    input_shape: Sequence[int] | None = None,
    name: str | None = None,
    progress: Progress | None = None,
    exporter: str = "auto",
) -> list[ExportResult]:
    """Export several forms of one model; all are checked before any is written.

    ``forms``: a list of ``"sequence"`` / ``"step"``; None means both when the model has a
    step form, else the sequence form alone. ``name`` names the sequence form; the step
    form gets ``<name>-step`` (or ``name`` itself when it is the only form asked for).
    """
    for form in forms or ():
        if form not in FORMS:
            raise ExportError(f"unknown form '{form}': use one of {', '.join(FORMS)}")
    _check_exporter(exporter)
    arch_hint = model_or_arch if isinstance(model_or_arch, str) and not is_model_file_spec(model_or_arch) else None
    cfg = apply_input_shape(resolve_config(config, arch_hint), input_shape)
    check_output_dir(Path(out_dir))
    say = progress or (lambda _msg: None)
    say("building the model")
    model, label = resolve_model(model_or_arch, cfg)
    weights = apply_weights(model, arch_hint, cfg, progress=say)
    if arch_hint is None:
        cfg = {**cfg, "arch": label}
    if forms is None:
        forms = ["sequence", "step"] if has_step_form(model) else ["sequence"]
    prepared = []
    for form in forms:
        form_name = None
        if name is not None:
            form_name = name if form == "sequence" or len(forms) == 1 else f"{name}-step"
        prepared.append(
            prepare_export(
                model,
                form=form,
                config=cfg,
                arch=label,
                name=form_name,
                progress=progress,
                exporter=exporter,
                weights=weights,
            )
        )
    say("writing artifacts")
    return write_artifacts(Path(out_dir), prepared)


def export_model(
    model_or_arch,
    *,
    form: str,
    config=None,
    out_dir: str | Path = "artifacts",
    input_shape: Sequence[int] | None = None,
    name: str | None = None,
    progress: Progress | None = None,
    exporter: str = "auto",
) -> ExportResult:
    """Export one form of a model to ``<out_dir>/<name>/{model.onnx, manifest.json}``.

    - ``model_or_arch``: an ``nn.Module``, a zoo architecture name (``"mamba"``) or
      ``"path/to/file.py:factory"``.
    - ``form``: ``"sequence"`` or ``"step"``.
    - ``config``: None (``configs/<arch>.yaml`` or the defaults), a YAML path, or a dict
      (missing keys from the defaults).
    - ``input_shape``: ``(B, T, F)``, overriding batch / seq / in_features.
    - ``name``: artifact folder name; default ``<arch>`` (sequence) or ``<arch>-step`` (step).
    - ``exporter``: ``"torchscript"``, ``"dynamo"`` or ``"auto"`` (TorchScript, then dynamo).

    Raises a FrameFuseError (nothing written) when the model cannot be built or exported, the
    graph fails the ONNX checker, or ONNX Runtime differs from torch beyond the fp32 tolerance.
    """
    if form not in FORMS:
        raise ExportError(f"unknown form '{form}': use one of {', '.join(FORMS)}")
    (result,) = export_forms(
        model_or_arch,
        forms=[form],
        config=config,
        out_dir=out_dir,
        input_shape=input_shape,
        name=name,
        progress=progress,
        exporter=exporter,
    )
    return result
