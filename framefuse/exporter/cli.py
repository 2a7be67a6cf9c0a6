"""``framefuse export``: torch → ONNX (sequence and step forms), checked against ONNX Runtime.

Nothing here imports torch at parser-build time, so ``framefuse --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from framefuse.config import WEIGHTS
from framefuse.errors import FrameFuseError

EXAMPLES = """\
examples:
  framefuse export --arch min_gru
      both forms of the default model -> artifacts/min_gru/ and artifacts/min_gru-step/
  framefuse export --arch mamba --form step --embed 128 --layers 4 --set model.d_state=16
  framefuse export --arch lstm --config my_lstm.yaml -o out/ --name lstm-small
  framefuse export --model examples/my_net.py:make_model --input-shape 1,32,64
  framefuse export --model my_hf.py:make_model --exporter dynamo
      a model of your own: FACTORY(config) or FACTORY() must return an nn.Module whose
      forward takes x [B, T, F]; for the step form it also needs step(x_t, state),
      init_state(batch) and state_names() (see framefuse/models/base.py)

each artifact folder holds model.onnx and manifest.json (shapes, config, sha256, parity).
The export fails, writing nothing, unless ONNX Runtime matches torch within the fp32
tolerance of the config (1e-4 by default)."""


class UsageError(FrameFuseError):
    """Conflicting or malformed command-line options."""


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = [p.strip() for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected B,T,F (three positive integers, e.g. 1,32,64), got '{text}'"
        ) from None
    if len(shape) != 3 or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"expected B,T,F (three positive integers, e.g. 1,32,64), got '{text}'")
    return shape  # type: ignore[return-value]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'")
    return value


def register(subparsers) -> argparse.ArgumentParser:
    from framefuse.config import available_configs

    archs = available_configs()
    parser = subparsers.add_parser(
        "export",
        help="export a model to ONNX (sequence and/or step form), checked against ONNX Runtime",
        description="Export a PyTorch model to ONNX in sequence form (x [B,T,F] -> y) and/or step form "
        "(x [B,F] + state.<name> -> y + next_state.<name>), check it with the ONNX checker and "
        "ONNX Runtime against torch, and write artifacts/<name>/{model.onnx,manifest.json}.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_argument_group("model (one of)").add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--arch",
        metavar="NAME",
        help="a zoo architecture" + (f": {', '.join(archs)}" if archs else ""),
    )
    source.add_argument(
        "--model", metavar="FILE.py:FACTORY", help="your own model: a factory function or class in a Python file"
    )

    out = parser.add_argument_group("output")
    out.add_argument(
        "--form",
        choices=["sequence", "step", "both"],
        default=None,
        help="which graph(s) to export (default: both when the model has a step form, else sequence)",
    )
    out.add_argument(
        "-o", "--out-dir", metavar="DIR", default="artifacts", help="artifacts folder (default: artifacts)"
    )
    out.add_argument("--name", metavar="NAME", help="artifact name (default: <arch>; the step form adds -step)")
    out.add_argument("--opset", type=int, metavar="N", help="ONNX opset, 17..20 (default: the config's, 17)")
    out.add_argument(
        "--exporter",
        choices=["torchscript", "dynamo", "auto"],
        default="auto",
        help="torch's ONNX exporter: torchscript (dynamo=False), dynamo (dynamo=True, opset >= 18) or auto "
        "(default: torchscript, then dynamo when it fails; the manifest and the output say which and why)",
    )

    cfg = parser.add_argument_group("config (overrides the config file)")
    cfg.add_argument("--config", metavar="FILE", help="YAML config (default: configs/<arch>.yaml)")
    cfg.add_argument("--input-shape", type=parse_shape, metavar="B,T,F", help="input shape: batch, frames, features")
    cfg.add_argument("--batch", type=_positive_int, metavar="N", help="batch size (default 1)")
    cfg.add_argument("--seq", type=_positive_int, metavar="T", help="frames in the sequence form (default 32)")
    cfg.add_argument("--in-features", type=_positive_int, metavar="F", help="input features per frame (default 64)")
    cfg.add_argument("--out-features", type=_positive_int, metavar="N", help="output features per frame (default 32)")
    cfg.add_argument("--embed", type=_positive_int, metavar="N", help="model width (default 256)")
    cfg.add_argument("--layers", type=_positive_int, metavar="N", help="number of layers (default 2)")
    cfg.add_argument("--seed", type=_non_negative_int, metavar="N", help="seed of the weights and the check inputs")
    cfg.add_argument(
        "--weights",
        choices=WEIGHTS,
        help="zoo architectures: trained (default: the seeded init trained on a synthetic game task, a few "
        "seconds to a minute on a CPU, cached) or random (the seeded init)",
    )
    cfg.add_argument(
        "--checkpoint",
        metavar="FILE",
        help="a state_dict (.pt, torch.save of model.state_dict()) loaded over the model's weights, zoo or file",
    )
    cfg.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other config key, e.g. --set model.heads=8 --set tolerance.fp32=1e-5 (repeatable)",
    )
    parser.set_defaults(func=run)
    return parser


def _overrides(args) -> dict:
    from framefuse.config import parse_override

    overrides: dict = {}
    for text in args.set:
        key, value = parse_override(text)
        overrides[key] = value
    for key in (
        "opset",
        "seed",
        "batch",
        "seq",
        "in_features",
        "out_features",
        "embed",
        "layers",
        "weights",
        "checkpoint",
    ):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    if args.input_shape is not None:
        clashes = [k for k in ("batch", "seq", "in_features") if getattr(args, k) is not None]
        if clashes:
            raise UsageError(
                f"--input-shape sets batch, seq and in_features; do not also give --{clashes[0].replace('_', '-')}"
            )
        overrides["batch"], overrides["seq"], overrides["in_features"] = args.input_shape
    return overrides


def _describe(tensors: list[dict]) -> str:
    """``x 1x32x64`` for the main tensor, then a count of the state tensors."""
    main, states = tensors[0], tensors[1:]
    text = f"{main['name']} {'x'.join(str(d) for d in main['shape'])}"
    if states:
        text += f" + {len(states)} state{'s' if len(states) > 1 else ''}"
    return text


def _exporter_line(info: dict) -> str:
    text = f"exported with the {info.get('used', '?')} exporter"
    if info.get("requested") == "auto":
        text += " (--exporter auto)"
    for which, why in (info.get("failed") or {}).items():
        text += f"; the {which} exporter failed: {why}"
    return text


def run(args) -> int:
    from framefuse.cli import note, print_table, progress
    from framefuse.config import load_config

    overrides = _overrides(args)
    with progress(args, "loading config") as update:
        from framefuse.exporter.export import export_forms
        from framefuse.exporter.loading import check_arch, describe_weights, split_model_spec

        if args.model is not None:
            split_model_spec(args.model)  # FILE.py:FACTORY, or a clear error
        else:
            check_arch(args.arch)  # before the config, so a typo gets "did you mean"
        cfg = load_config(args.config, arch=args.arch, overrides=overrides)
        forms = None if args.form is None else (["sequence", "step"] if args.form == "both" else [args.form])
        results = export_forms(
            args.arch or args.model,
            forms=forms,
            config=cfg,
            out_dir=Path(args.out_dir),
            name=args.name,
            progress=update,
            exporter=args.exporter,
        )
    if args.form is None and [r.form for r in results] == ["sequence"]:
        note(
            args, f"'{results[0].arch}' has no step form (step/init_state/state_names): exported the sequence form only"
        )
    for result in results:
        for warning in result.warnings:
            note(args, f"{result.name}: {warning}")

    rows = []
    for r in results:
        worst = max((o.get("max_abs", 0.0) for o in r.parity["outputs"].values()), default=0.0)
        rows.append([r.name, r.form, _describe(r.inputs), _describe(r.outputs), f"{worst:.1e}", f"{r.seconds:.1f}s"])
    print_table(
        args,
        f"framefuse export: opset {results[0].opset}, ONNX Runtime vs torch within {results[0].parity['tolerance']:g}",
        ["artifact", "form", "inputs", "outputs", "max |ort-torch|", "time"],
        rows,
    )
    if not getattr(args, "quiet", False):
        for r in results:
            print(f"  {r.name}: {r.model_path}  (+ manifest.json)")
            print(f"    {_exporter_line(r.manifest.get('exporter') or {})}")
            print(f"    weights: {describe_weights(r.manifest.get('weights'))}")
    if getattr(args, "quiet", False):
        for r in results:
            print(r.model_path)
    return 0
