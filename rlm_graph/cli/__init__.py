"""The ``rlm-graph`` command.

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a function of the
parsed arguments that returns the exit code.

Exit codes: 0 done, 2 bad usage, 3 a limit stopped the run (the partial answer is
printed), 4 a provider failed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

SUBCOMMANDS = ("demo", "plugins", "run", "trace")

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_LIMIT = 3
EXIT_PROVIDER = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlm-graph",
        description="Run Recursive Language Models as a workflow graph.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    code: int = args.func(args)
    return code
