"""The ``rlm-graph`` command.

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a function of the
parsed arguments that returns the exit code.

Exit codes: 0 done, 1 the run failed otherwise (a crashed environment), 2 bad usage or
configuration, 3 a limit stopped the run (the partial answer is printed), 4 a provider
failed (the partial answer and usage so far are printed), 130 interrupted (Ctrl-C).

Invariants:
    - Ctrl-C ends any subcommand with one line on stderr and exit 130, never a
      traceback (the engine has cancelled everything by the time it reaches here).
    - With ``--json`` on the command line, a usage error is a JSON object on stdout too
      (see `rlm_graph.cli.output`).
    - A reader of stdout that goes away (``| head``) ends the command quietly, exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from .output import Output

__all__ = ["main"]

SUBCOMMANDS = ("batch", "demo", "eval", "journal", "mcp", "plugins", "report", "run", "trace")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_LIMIT = 3
EXIT_PROVIDER = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd command


class UsageError(Exception):
    """A command line argparse refused (raised instead of argparse's own exit)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises `UsageError` instead of exiting, so that
    ``main`` can answer in JSON when ``--json`` was asked for."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rlm-graph",
        description="Run Recursive Language Models as a workflow graph.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rlm-graph`` command line ``argv`` (default ``sys.argv[1:]``).

    Returns:
        The exit code (see the module docstring).
    """
    from .output import Output

    words = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in words
    command = words[0] if words and words[0] in SUBCOMMANDS else ""
    out = Output(command, as_json=as_json)
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(words)
        except UsageError as exc:
            if any(w == "--api-key" or w.startswith("--api-key=") for w in words):
                # Not argparse's "unrecognized arguments: --api-key sk-...": no key echoed.
                exc.message = (
                    "there is no --api-key flag (a key on a command line lands in the shell's "
                    "history); set OPENAI_API_KEY, ANTHROPIC_API_KEY... in the environment"
                )
            if as_json:
                return out.error(EXIT_USAGE, exc.message, kind="UsageError")
            exc.parser.print_usage(sys.stderr)
            print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
            return EXIT_USAGE
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        return _interrupted(out)
    except BrokenPipeError:
        return _reader_left()


def _reader_left() -> int:
    """The reader of stdout went away (``rlm-graph plugins --json | head``): stop quietly,
    as command-line tools do, with no traceback and no error at exit's flush."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor behind stdout
        pass
    return EXIT_FAILED


def _interrupted(out: Output) -> int:
    if out.as_json:
        return out.error(EXIT_INTERRUPTED, "interrupted (Ctrl-C)", kind="Interrupted")
    name = f"rlm-graph {out.command}".rstrip()
    print(f"{name}: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED
