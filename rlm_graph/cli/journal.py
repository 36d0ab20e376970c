"""``rlm-graph journal ls PATH``: the runs a journal holds (see docs/durability.md)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._json import dumps as finite_dumps
from ..errors import ConfigError
from . import EXIT_OK, EXIT_USAGE, refuse
from .output import for_stream

if TYPE_CHECKING:
    from ..journal.store import RunRow

__all__ = ["register", "run_ls"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("journal", help="list the runs a journal file holds")
    commands = parser.add_subparsers(dest="journal_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: _usage(parser))
    ls = commands.add_parser(
        "ls", help="runs, newest first: key, kind, status, attempts, nodes, cost, question"
    )
    ls.add_argument(
        "path", type=Path, metavar="PATH", help="a journal (RLM(journal=...), --journal)"
    )
    ls.add_argument("--json", action="store_true", help="one JSON object per run")
    ls.set_defaults(func=run_ls)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def run_ls(args: argparse.Namespace) -> int:
    from ..journal import JournalStore

    if not args.path.is_file():
        print(f"rlm-graph journal ls: no journal at {args.path}", file=sys.stderr)
        return EXIT_USAGE
    try:
        store = JournalStore(args.path, read_only=True)
    except ConfigError as exc:
        return refuse("journal ls", exc)
    try:
        runs = store.runs()
    except ConfigError as exc:  # a damaged chunk: the message names the node
        return refuse("journal ls", exc)
    finally:
        store.close()
    if args.json:
        for run in runs:
            print(
                finite_dumps(  # an infinite cost a damaged file holds: null, not Infinity
                    {
                        "key": run.key,
                        "kind": run.kind,
                        "status": run.status,
                        "stop_reason": run.stop_reason,
                        "attempts": run.attempts,
                        "nodes": run.nodes,
                        "cost": run.cost,
                        "label": run.label,
                        "created": run.created,
                        "updated": run.updated,
                    }
                )
            )
        return EXIT_OK
    if not runs:
        print(f"{args.path}: no runs yet")
        return EXIT_OK
    statuses = [_cell(_status(run)) for run in runs]
    wide = max(8, *map(len, statuses))
    print(
        f"{'KEY':<12}  {'KIND':<8}  {'STATUS':<{wide}}  {'TRIES':>5}  {'NODES':>6}  {'COST':>9}  {'UPDATED':<16}  QUESTION"
    )
    for run, status in zip(runs, statuses, strict=True):
        updated = _when(run.updated)
        row = (
            f"{_cell(run.key[:12]):<12}  {_cell(run.kind):<8}  {status:<{wide}}  "
            f"{run.attempts:>5}  {run.nodes:>6}  {'$' + format(run.cost, '.4f'):>9}  "
            f"{updated:<16}  {_cell(run.label)}"
        )
        print(for_stream(sys.stdout, row))  # the question is the user's (or a caller's) text
    return EXIT_OK


def _status(run: RunRow) -> str:
    """A run's status, with the limit that stopped it (``stopped:max_budget``: one word,
    so that a script may still split the table's columns on spaces)."""
    if run.stop_reason:
        return f"stopped:{run.stop_reason}"
    return run.status


# Whatever ends a line or moves to the next column, on a terminal or in a file: a
# question holding one would start a row of its own (a forged run) in the table.
_BREAKS = re.compile(r"[\t\n\v\f\r\x1c-\x1e\x85\u2028\u2029]+")


def _cell(text: str) -> str:
    """``text`` on one line of the table: each run of line breaks and tabs one space."""
    return _BREAKS.sub(" ", text)


def _when(seconds: float) -> str:
    """A row's time as a date, or ``?`` for one no calendar holds (a row edited by hand)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        return "?"
