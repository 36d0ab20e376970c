"""``rlm-graph batch``: answer every item of a JSONL file, resumably.

Each input line is ``{"id", "query", "context" | "context_file", ...limit overrides}``;
each finished item appends one line to ``--output`` (id, answer, stop reason, usage, cost,
timings, error). Rerunning with the same ``--output`` skips the ids already there.
Exit codes: 0 every item answered, 1 some items failed (their lines say why), 2 bad
usage, 130 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from .._files import same_file
from ..batch import (
    BatchItem,
    BatchResult,
    BatchTally,
    ResultsFile,
    read_items,
    run_batch,
    scan_items,
)
from ..batch.results import glance
from ..batch.run import check_batch, item_limits_check
from ..errors import ConfigError
from . import EXIT_FAILED, EXIT_OK, EXIT_USAGE, interrupted_after, refuse
from .output import for_stream
from .progress import LiveLine
from .run import add_engine_arguments, rlm_kwargs

__all__ = ["add_executor_arguments", "register", "run"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="answer every item of a JSONL file (resumable; local or on a Ray cluster)",
        # No abbreviations: "--api-key SECRET" must fail, not pass as --api-key-env.
        allow_abbrev=False,
        # The module's docstring, its reStructuredText ``literals`` as plain text.
        description=__doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else None,
    )
    parser.add_argument(
        "--input", required=True, type=Path, metavar="FILE", help="items, one JSON object a line"
    )
    parser.add_argument(
        "--output",
        required=True,
        type=Path,
        metavar="FILE",
        help="results, appended as items finish",
    )
    add_executor_arguments(parser)
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="on resume, run failed items, and items a limit stopped, again too",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no line per finished item, only the summary"
    )
    parser.add_argument(
        "--journal",
        metavar="PATH",
        help="record every completion's finished nodes in this SQLite file (shared by all "
        "items); a completion run again (a retry after a worker died, a resumed batch) "
        "replays what was recorded instead of paying again (docs/durability.md)",
    )
    # --max-concurrent and --requests-per-minute are batch-wide; the limits per completion
    add_engine_arguments(parser, limits="limits (per completion; an item may override them)")
    parser.set_defaults(func=run)


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--concurrency``, ``--executor``, ``--ray-address``, ``--ray-task-cpus``: how many
    completions run at once, and where (``batch`` and ``eval`` share them)."""
    parser.add_argument(
        "--concurrency", type=int, default=8, help="completions at once (default 8)"
    )
    parser.add_argument(
        "--executor", default="local", help="where completions run: local (default) or ray"
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="with --executor ray: the cluster (auto, ray://host:10001); default: start one here",
    )
    parser.add_argument(
        "--ray-task-cpus",
        type=float,
        default=None,
        help="with --executor ray: CPUs reserved per completion (default 0.25)",
    )


def _cannot_write(output: Path, error: OSError, written: int) -> int:
    print(
        f"rlm-graph batch: cannot write --output {str(output)!r}: {error.strerror or error}; "
        f"{written} results were written before it. Make room, then rerun the same command: "
        "it goes on from there",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _regular_input(path: Path, option: str = "--input") -> None:
    """``--input`` (``eval``'s ``--data``) is read twice (checked whole first, then run):
    a pipe would be empty the second time, and the command would run nothing."""
    if str(path) == "-" or (path.exists() and not path.is_file()):
        raise ConfigError(
            f"{option} {str(path)!r} is not a regular file; the items are read twice (checked "
            "first, then run): save them to a file first (... > items.jsonl)"
        )


def _scan(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Every line of ``--input`` checked: the ids in order, and what each item asks."""
    asked: dict[str, str] = {}
    limits = item_limits_check(rlm_kwargs(args))
    earlier = glance(args.output)  # read again, under its lock, once the checks pass

    def check(item: BatchItem, where: str) -> None:
        limits(item, where)
        asked[item.id] = item.asked()

    def done(item: BatchItem) -> bool:  # not run again: its context file may be gone
        return earlier.is_done(item.id, item.asked(), args.retry_failed)

    return scan_items(args.input, check, done), asked


def _executor_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if args.ray_address is not None:
        kwargs["address"] = args.ray_address
    if args.ray_task_cpus is not None:
        kwargs["task_cpus"] = args.ray_task_cpus
    if kwargs and args.executor != "ray":
        raise ConfigError("--ray-address and --ray-task-cpus go with --executor ray")
    return kwargs


class BatchProgress(LiveLine):
    """The batch's progress on stderr, one finished item at a time.

    On a terminal: one live line (rich), redrawn a few times a second: items done of the
    total, failures, tokens, cost, elapsed time; a failed item also gets a line of its own
    above it. Otherwise (a pipe, a log): one plain line per finished item. ``--quiet``:
    nothing (the summary still comes at the end).
    """

    def __init__(self, total: int, *, quiet: bool, stream: TextIO) -> None:
        self.total, self.stream = total, stream
        self.mode = "off" if quiet else "live" if stream.isatty() else "plain"
        self.done = self.failed = self.tokens = 0
        self.cost: float | None = None
        self.started = time.monotonic()
        self._console = Console(file=stream, force_terminal=self.mode == "live", highlight=False)
        self._live: Live | None = None

    def finished(self, result: BatchResult) -> None:
        self.done += 1
        self.failed += not result.ok
        self.tokens += result.usage.input_tokens + result.usage.output_tokens
        if result.cost is not None:
            self.cost = (self.cost or 0.0) + result.cost
        if self.mode == "plain" or (self.mode == "live" and not result.ok):
            # An id (from the items file) and an error (from a server) are untrusted text.
            line = for_stream(self.stream, _item_line(result, self.done, self.total))
            if self._live is not None:
                self._console.print(Text(line), soft_wrap=True)  # above the live line
            else:
                print(line, file=self.stream, flush=True)

    def _render(self) -> Text:
        cost = f", ${self.cost:.4f}" if self.cost is not None else ""
        return Text.assemble(
            ("rlm-graph batch ", "bold"),
            f"{self.done}/{self.total} done, {self.failed} failed, {self.tokens:,} tokens{cost}, "
            f"{time.monotonic() - self.started:.0f} s",
        )


_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")  # str.splitlines' own


def _item_line(result: BatchResult, number: int, total: int) -> str:
    width = len(str(total))
    if result.ok:
        note = f"ok {result.seconds:.2f} s" + (
            f" (stopped by {result.stop_reason})" if result.stop_reason else ""
        )
    else:
        assert result.error is not None
        note = f"FAILED {result.error.type}: {' '.join(result.error.message.split())[:120]}"
    retried = f" after {result.attempts} attempts" if result.attempts > 1 else ""
    # One line each: an id or an error holding a line break would forge another item's.
    shown = "".join(" " if char in _LINE_BREAKS else char for char in result.id)
    return f"[{number:>{width}}/{total}] {shown} {note}{retried}"


def run(args: argparse.Namespace) -> int:
    try:
        if str(args.output) == "-":
            raise ConfigError(
                "--output '-' would be a file named '-', not stdout: the results file is "
                "read back on a rerun to skip the items done; give a path (results.jsonl)"
            )
        if same_file(args.input, args.output):
            raise ConfigError("--output must not be the --input file")
        for name, other in (("--output", args.output), ("--input", args.input)):
            if args.journal and same_file(args.journal, other):
                raise ConfigError(f"--journal must not be the {name} file; give its own path")
        _regular_input(args.input)
        ids, asked = _scan(args)
        # Everything a run needs is checked before --output is created or touched.
        check_batch(rlm_kwargs(args), args.concurrency, args.executor, _executor_kwargs(args))
        results_file = ResultsFile(args.output).open()
    except ConfigError as exc:
        return refuse("batch", exc)
    with results_file:
        done = results_file.done(retry_failed=args.retry_failed, asked=asked) & set(ids)
        changed = (results_file.done(retry_failed=args.retry_failed) & set(ids)) - done
        total = len(ids) - len(done)
        if done or changed:
            edited = f" ({len(changed)} more that ask something else now are asked again)"
            print(
                f"rlm-graph batch: {len(done)} of {len(ids)} items already in {args.output}"
                f"{edited if changed else ''}; running the other {total}",
                file=sys.stderr,
            )
        tally = BatchTally()  # totals only: a batch's answers are not held in memory
        try:
            results = run_batch(
                read_items(args.input),
                rlm_kwargs(args),
                concurrency=args.concurrency,
                executor=args.executor,
                executor_kwargs=_executor_kwargs(args),
                skip_ids=done,
            )
            with BatchProgress(total, quiet=args.quiet, stream=sys.stderr) as progress:
                for result in results:
                    try:
                        results_file.append(result)
                    except OSError as exc:  # a full disk, a quota: stop, say how to go on
                        getattr(results, "close", lambda: None)()  # cancels the rest
                        return _cannot_write(args.output, exc, tally.finished)
                    tally.add(result)
                    progress.finished(result)
        except ConfigError as exc:
            return refuse("batch", exc)
        except KeyboardInterrupt:
            return interrupted_after("batch", f"{tally.finished} items")
    summary = tally.summary(skipped=len(done))
    print(f"rlm-graph batch: {summary.text()}", file=sys.stderr)
    return EXIT_OK if summary.failed == 0 else EXIT_FAILED
