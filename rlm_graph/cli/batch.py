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
from pathlib import Path
from typing import Any, TextIO

from ..batch import BatchResult, BatchSummary, ResultsFile, read_items, run_batch, scan_items
from ..errors import ConfigError
from . import EXIT_OK, EXIT_USAGE
from .run import LIMIT_FLAGS, _add_provider_arguments, _add_window_arguments, _rlm_kwargs

__all__ = ["register", "run"]

EXIT_FAILED_ITEMS = 1
EXIT_INTERRUPTED = 130


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="answer every item of a JSONL file (resumable; local or on a Ray cluster)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    parser.add_argument("--input", required=True, type=Path, metavar="FILE", help="items, one JSON object a line")
    parser.add_argument("--output", required=True, type=Path, metavar="FILE", help="results, appended as items finish")
    parser.add_argument("--concurrency", type=int, default=8, help="completions at once (default 8)")
    parser.add_argument("--retry-failed", action="store_true", help="on resume, run failed items again too")
    parser.add_argument("--executor", default="local", help="where completions run: local (default) or ray")
    parser.add_argument("--ray-address", default=None, help="with --executor ray: the cluster (auto, ray://host:10001); default: start one here")
    parser.add_argument("--ray-task-cpus", type=float, default=None, help="with --executor ray: CPUs reserved per completion (default 0.25)")
    parser.add_argument("--quiet", action="store_true", help="no line per finished item, only the summary")
    parser.add_argument("--backend", default="openai", help="provider name (default openai; see `rlm-graph plugins`)")
    parser.add_argument("--model", required=True, help="the root model's name")
    parser.add_argument("--base-url", help="the API root (default: the backend's)")
    parser.add_argument("--sub-model", help="a (cheaper) model for sub-calls at depth >= 1, same backend")
    parser.add_argument(
        "--environment", default="subprocess",
        help="the REPL environment (default subprocess, as for `run`; 'local' is faster, for "
        "trusted documents and models only; see docs/environments.md)",
    )
    _add_provider_arguments(parser)  # --max-concurrent and --requests-per-minute: batch-wide
    _add_window_arguments(parser)
    limits = parser.add_argument_group("limits (per completion; an item may override them)")
    for name, kind, text in LIMIT_FLAGS:
        limits.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    parser.set_defaults(func=run)


def _executor_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if args.ray_address is not None:
        kwargs["address"] = args.ray_address
    if args.ray_task_cpus is not None:
        kwargs["task_cpus"] = args.ray_task_cpus
    if kwargs and args.executor != "ray":
        raise ConfigError("--ray-address and --ray-task-cpus go with --executor ray")
    return kwargs


def _progress(result: BatchResult, number: int, total: int, stream: TextIO) -> None:
    width = len(str(total))
    if result.ok:
        note = f"ok {result.seconds:.2f} s" + (f" (stopped by {result.stop_reason})" if result.stop_reason else "")
    else:
        assert result.error is not None
        note = f"FAILED {result.error.type}: {result.error.message[:120]}"
    retried = f" after {result.attempts} attempts" if result.attempts > 1 else ""
    print(f"[{number:>{width}}/{total}] {result.id} {note}{retried}", file=stream, flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        if args.input.resolve() == args.output.resolve():
            raise ConfigError("--output must not be the --input file")
        ids = scan_items(args.input)
        results_file = ResultsFile(args.output).open()
    except ConfigError as exc:
        print(f"rlm-graph batch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with results_file:
        done = results_file.done(retry_failed=args.retry_failed) & set(ids)
        total = len(ids) - len(done)
        if done:
            print(f"rlm-graph batch: {len(done)} of {len(ids)} items already in {args.output}; running the other {total}", file=sys.stderr)
        finished: list[BatchResult] = []
        try:
            results = run_batch(
                read_items(args.input), _rlm_kwargs(args), concurrency=args.concurrency,
                executor=args.executor, executor_kwargs=_executor_kwargs(args), skip_ids=done,
            )
            for result in results:
                results_file.append(result)
                finished.append(result)
                if not args.quiet:
                    _progress(result, len(finished), total, sys.stderr)
        except ConfigError as exc:
            print(f"rlm-graph batch: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print(f"\nrlm-graph batch: interrupted after {len(finished)} items; rerun the same command to resume", file=sys.stderr)
            return EXIT_INTERRUPTED
    summary = BatchSummary.of(finished, skipped=len(done))
    print(f"rlm-graph batch: {summary.text()}", file=sys.stderr)
    return EXIT_OK if summary.failed == 0 else EXIT_FAILED_ITEMS
