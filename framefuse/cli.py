"""The ``framefuse`` command line (also ``python -m framefuse``).

Each stage lives in its own module listed in COMMANDS; the module defines
``register(subparsers)``, which adds its subcommand with ``set_defaults(func=run)`` where
``run(args) -> int | None``. A stage whose module does not exist yet still shows up as a
placeholder subcommand that says so. Adding a stage never needs an edit here beyond its row.

Stages use :func:`progress` (a rich status line on stderr, only on a terminal and without
``--quiet``) and :func:`print_table` (a rich summary table on stdout) from this module.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence

from framefuse import __version__
from framefuse.errors import FrameFuseError

#: (subcommand, module that defines ``register(subparsers)``), in the order of the pipeline.
COMMANDS: list[tuple[str, str]] = [
    ("export", "framefuse.exporter.cli"),
    ("rewrite", "framefuse.rewrite.cli"),
    ("check", "framefuse.parity.cli"),
    ("build", "framefuse.build.cli"),
    ("run", "framefuse.runtime.cli"),
    ("bench", "framefuse.runtime.bench_cli"),
]

DESCRIPTION = """\
Compile recurrent, state-space and attention models into fused low-latency engines.

Pipeline: export (torch -> ONNX) -> rewrite (fused framefuse ops) -> build (engine)
-> check (parity) -> run / bench. Every stage writes into artifacts/<name>/."""

EPILOG = """\
examples:
  framefuse export --arch min_gru                 # both forms -> artifacts/min_gru{,-step}/
  framefuse export --arch mamba --form step --embed 128 --layers 4
  framefuse export --model my_net.py:make_model --input-shape 1,32,64
  framefuse export --help                         # every option of a stage

Configs for every zoo architecture are in configs/<arch>.yaml; command-line options win."""


class NotAvailableError(FrameFuseError):
    """A subcommand whose stage is not part of this version yet."""


# --------------------------------------------------------------------------------------------
# terminal helpers for the stages
# --------------------------------------------------------------------------------------------


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _stdout_console():
    from rich.console import Console

    return Console()


@contextlib.contextmanager
def progress(args: argparse.Namespace | None, initial: str = "working") -> Iterator[Callable[[str], None]]:
    """A status line on stderr; yields ``update(message)``. Silent when stderr is not a
    terminal or with ``--quiet`` (so logs and pipes get no spinner frames)."""
    quiet = bool(getattr(args, "quiet", False))
    console = _stderr_console()
    if quiet or not console.is_terminal:
        yield lambda _message: None
        return
    with console.status(initial) as status:
        yield lambda message: status.update(message)


def print_table(args: argparse.Namespace | None, title: str, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    """A summary table on stdout (plain text when stdout is not a terminal). Skipped with --quiet."""
    if getattr(args, "quiet", False):
        return
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    _stdout_console().print(table)


def _bounded(convert, lowest, *, strict: bool, what: str):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value != value or value < lowest or (strict and value == lowest):  # NaN too
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


#: argparse ``type=`` for counts, rates and tolerances: a bad value is a usage error naming the
#: option, before anything runs (a negative rate or tolerance would otherwise run and report nonsense).
positive_int = _bounded(int, 0, strict=True, what="a positive integer")
non_negative_int = _bounded(int, 0, strict=False, what="an integer >= 0")
positive_float = _bounded(float, 0.0, strict=True, what="a number > 0")
non_negative_float = _bounded(float, 0.0, strict=False, what="a number >= 0")


def writable_file(path: str | None, option: str) -> None:
    """Fail before the work when an output file could not be written at the end (its folder is
    missing, or is a file)."""
    if path is None:
        return
    from pathlib import Path

    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise FrameFuseError(f"{option} {path}: folder {parent} does not exist")


def note(args: argparse.Namespace | None, message: str) -> None:
    """A one-line remark for the user on stderr (skipped with --quiet)."""
    if not getattr(args, "quiet", False):
        print(f"framefuse: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# the parser
# --------------------------------------------------------------------------------------------


def _add_placeholder(subparsers, command: str, module: str, reason: str) -> None:
    message = f"'framefuse {command}' is not available yet ({reason})"
    parser = subparsers.add_parser(
        command,
        help=f"not available yet ({module})",
        description=message,
        add_help=True,
    )

    def unavailable(_args):
        raise NotAvailableError(message)

    # Any arguments are accepted (see main): the user learns the stage is missing, not that
    # an option is unknown.
    parser.set_defaults(func=unavailable, accepts_any_arguments=True)


def _register_command(subparsers, command: str, module: str) -> None:
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the stage's package itself does not exist yet
        found = False
    if not found:
        _add_placeholder(subparsers, command, module, f"{module} is not part of this version")
        return
    try:
        stage = importlib.import_module(module)
    except Exception as exc:  # a broken stage must not take the other subcommands down
        _add_placeholder(subparsers, command, module, f"{module} failed to import: {type(exc).__name__}: {exc}")
        return
    register = getattr(stage, "register", None)
    if not callable(register):
        _add_placeholder(subparsers, command, module, f"{module} defines no register(subparsers)")
        return
    register(subparsers)


def _add_common_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    # On subcommands the default is SUPPRESS so `framefuse -q export` and
    # `framefuse export -q` both work without one overwriting the other.
    default = False if top_level else argparse.SUPPRESS
    if "--quiet" not in parser._option_string_actions:
        parser.add_argument(
            "-q",
            "--quiet",
            action="store_true",
            default=default,
            help="no progress or summary table (errors still go to stderr)",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framefuse",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"framefuse {__version__}")
    _add_common_options(parser, top_level=True)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for command, module in COMMANDS:
        _register_command(subparsers, command, module)
    for sub in subparsers.choices.values():
        _add_common_options(sub, top_level=False)
    return parser


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 usage/input error, 3 parity, 130 ^C)."""
    try:
        parser = build_parser()
        try:
            args, unknown = parser.parse_known_args(argv)
            if unknown and not getattr(args, "accepts_any_arguments", False):
                parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        except SystemExit as exc:  # --help, --version, usage errors: argparse has printed
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return 2
        status = func(args)
        return int(status or 0)
    except FrameFuseError as exc:
        print(f"framefuse: error: {_one_line(str(exc))}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except BrokenPipeError:
        # the reader went away (`framefuse check ... | head`): stop quietly, as a Unix tool killed
        # by SIGPIPE would; stdout goes to /dev/null so the interpreter's final flush cannot fail
        import os

        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor
            pass
        return 141
    except KeyboardInterrupt:
        print("framefuse: interrupted", file=sys.stderr)
        return 130
    except ImportError as exc:
        # Ctrl-C while a library imports (onnxruntime turns it into an ImportError)
        if isinstance(exc.__cause__, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt):
            print("framefuse: interrupted", file=sys.stderr)
            return 130
        raise


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
