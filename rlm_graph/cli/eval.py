"""``rlm-graph eval``: run benchmark items through methods and print the table.

``rlm-graph eval --task sniah|--data ITEMS.jsonl --method rlm,base --model M --out DIR``
runs every item under every method (one completion per call, as ``rlm-graph batch``
runs them), writes ``DIR/results.jsonl`` row by row, then ``summary.json``,
``summary.md`` and ``report.html``. The same command again resumes: rows already in
``results.jsonl`` are not asked again, and a call cut by a crash replays from
``DIR/journal.sqlite``. ``rlm-graph eval convert --from oolong FILE`` turns a published
data file into items. Exit codes: 0 every item ran, 1 some items failed (their rows say
why), 2 bad usage, 3 the budget (``--max-budget``) ran out first, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from .._files import open_private, same_file
from ..errors import ConfigError
from . import EXIT_FAILED, EXIT_LIMIT, EXIT_OK, EXIT_USAGE, interrupted_after, refuse
from .batch import _executor_kwargs, _regular_input, add_executor_arguments
from .output import strip_control
from .run import add_engine_arguments, rlm_kwargs

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="run benchmark tasks or items through methods (rlm, base, ...) and print the table",
        allow_abbrev=False,  # "--api-key SECRET" must fail, not pass as --api-key-env
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    _add_source_arguments(parser)
    _add_run_arguments(parser)
    add_executor_arguments(parser)
    add_engine_arguments(
        parser,
        model_required=False,  # not for `eval convert`
        limits="limits (per completion, but --max-budget: the whole evaluation)",
        limit_help={
            "max_budget": "USD for the whole evaluation, every item and method "
            "(docs/eval.md: the rule and its bound)"
        },
    )
    parser.set_defaults(func=run, journal=None)
    actions = parser.add_subparsers(
        dest="action", metavar="[convert]", help="convert a published file to items"
    )
    _register_convert(actions)


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_argument_group("items (one of --task and --data)")
    source.add_argument("--task", help="a generated task: sniah, synth-oolong, synth-oolong-pairs")
    source.add_argument(
        "--data",
        type=Path,
        metavar="FILE.jsonl",
        help="items, one JSON object a line (docs/eval.md)",
    )
    source.add_argument(
        "--n",
        type=int,
        help="items: per length of a --task (default 10), or drawn from --data with --seed (default all)",
    )
    source.add_argument(
        "--lengths", help="a --task's context lengths in tokens, e.g. 8k,64k,1m (k = 1,024)"
    )
    source.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the task, of the draw from --data and of the bootstrap (default 0)",
    )


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--method",
        default="rlm",
        help="comma-separated eval methods (default rlm; see `rlm-graph plugins`)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="the evaluation's folder (resumed when it holds results)",
    )
    parser.add_argument(
        "--retry-failed", action="store_true", help="on resume, run items that failed again too"
    )
    parser.add_argument(
        "--estimate", action="store_true", help="print the cost estimate and exit without running"
    )
    parser.add_argument(
        "--no-journal", action="store_true", help="do not journal completions in DIR/journal.sqlite"
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no line per finished item, only the summary"
    )


def _register_convert(actions: Any) -> None:
    from ..eval.convert import CONVERTERS

    parser = actions.add_parser(
        "convert",
        help="convert a published benchmark file (OOLONG, BrowseComp-Plus, LongBench-v2) to items",
        description="Convert a downloaded benchmark file into an items file for `rlm-graph eval "
        "--data`. Nothing is downloaded. See docs/eval.md for each source's columns.",
    )
    parser.add_argument(
        "--from", dest="source", required=True, choices=CONVERTERS, help="the file's benchmark"
    )
    parser.add_argument(
        "file", type=Path, metavar="FILE", help="the file as published (.jsonl, .json or .parquet)"
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="ITEMS.jsonl",
        help="where to write the items (default stdout)",
    )
    parser.add_argument(
        "--filter",
        action="append",
        metavar="COLUMN=VALUE",
        help="keep rows whose column has this value, e.g. dataset=trec_coarse (repeatable)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        metavar="CORPUS.jsonl",
        help="browsecomp-plus: the corpus (docid, text, url) to fill each context from",
    )
    parser.add_argument(
        "--docs",
        type=int,
        help="browsecomp-plus: documents per context (default 1,000 with --corpus)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="browsecomp-plus: the shuffle and the corpus draw (default 0)",
    )
    parser.add_argument(
        "--all-domains", action="store_true", help="longbench-v2: every domain, not only CodeQA's"
    )
    parser.set_defaults(func=run_convert)


# -- convert --------------------------------------------------------------------------------


def run_convert(args: argparse.Namespace) -> int:
    from ..eval.convert import convert, parse_filters, write_items

    read = [path for path in (args.file, args.corpus) if path is not None]
    if args.output is not None and any(same_file(args.output, path) for path in read):
        return refuse(
            "eval convert",
            ConfigError(
                f"--output {args.output} is a file convert reads: the download would be "
                "replaced by its items; write them to another file"
            ),
        )
    try:
        items = convert(
            args.source,
            args.file,
            filters=parse_filters(args.filter),
            corpus=args.corpus,
            docs=args.docs,
            seed=args.seed,
            all_domains=args.all_domains,
        )
        if args.output is None:
            count = write_items(items, sys.stdout)
        else:
            partial = args.output.with_name(args.output.name + ".partial")
            try:
                with open_private(partial) as handle:
                    count = write_items(items, handle)
                partial.replace(args.output)
            finally:  # whatever stopped it (a bad row, Ctrl-C): no half a file left
                partial.unlink(missing_ok=True)
    except ConfigError as exc:
        return refuse("eval convert", exc)
    except BrokenPipeError:  # the reader of stdout left (| head): quietly, as every command
        raise
    except OSError as exc:
        print(
            f"rlm-graph eval convert: cannot write {args.output}: {exc.strerror}", file=sys.stderr
        )
        return EXIT_USAGE
    where = args.output if args.output is not None else "stdout"
    none = (
        " (no row matched --filter: values are compared as text, case and all)"
        if count == 0 and args.filter
        else ""
    )
    print(
        f"rlm-graph eval convert: {count} items from {args.file.name} written to {where}{none}",
        file=sys.stderr,
    )
    return EXIT_OK


# -- eval -----------------------------------------------------------------------------------


def _items(args: argparse.Namespace) -> Any:
    from ..eval import ItemsFile, TaskItems, parse_lengths, sample_items, scan_items

    if (args.task is None) == (args.data is None):
        raise ConfigError("give one of --task NAME and --data FILE.jsonl")
    if args.task is not None:
        lengths = parse_lengths(args.lengths) if args.lengths else None
        return TaskItems(
            args.task, n=args.n if args.n is not None else 10, lengths=lengths, seed=args.seed
        )
    if args.lengths:
        raise ConfigError("--lengths goes with --task (the lengths of --data items are theirs)")
    # A pipe (``-``, ``/dev/stdin``) was read whole by the check, then said to hold no item.
    _regular_input(args.data, "--data")
    ids = sample_items(scan_items(args.data), args.n, args.seed)
    return ItemsFile(args.data, only=ids if args.n is not None else None)


def _evaluation(args: argparse.Namespace) -> Any:
    from ..eval import Evaluation

    if args.model is None:
        raise ConfigError("--model is missing: the root model's name")
    if args.out is None:
        raise ConfigError("--out DIR is missing: the folder of the evaluation's results")
    kwargs = rlm_kwargs(args)
    kwargs.pop("max_budget", None)  # the evaluation's, not each completion's: see SharedBudget
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    return Evaluation(
        _items(args),
        kwargs,
        methods=methods,
        out=args.out,
        concurrency=args.concurrency,
        executor=args.executor,
        executor_kwargs=_executor_kwargs(args),
        seed=args.seed,
        max_budget=args.max_budget,
        retry_failed=args.retry_failed,
        journal=not args.no_journal,
        check=not args.estimate,  # an estimate needs no key
    )


def _cost(methods: Mapping[str, float | None], total: float | None) -> str:
    """The estimate's cost, the reason for an unknown one said once (not per method)."""
    known = ", ".join(f"{name} ${cost:,.2f}" for name, cost in methods.items() if cost is not None)
    if total is not None:
        return f"estimated cost ${total:,.2f} ({known}): a rough floor from the price table"
    unknown = [name for name, cost in methods.items() if cost is None]
    shown = f"{', '.join(unknown)} unknown" + (f"; {known}" if known else "")
    return f"estimated cost unknown: a model has no price in the table ({shown})"


def _say_plan(evaluation: Any, args: argparse.Namespace, stream: TextIO) -> None:
    estimate = evaluation.estimate
    todo = sum(estimate.todo.values())
    done = estimate.items * len(estimate.methods) - todo
    print(
        f"rlm-graph eval: {evaluation.title}: {estimate.items} items ({estimate.tokens:,} tokens) x "
        f"{len(estimate.methods)} methods; {todo} to run"
        + (f", {done} already in {args.out}" if done else ""),
        file=stream,
    )
    budget = (
        f"; --max-budget ${args.max_budget:,.2f} holds across the whole evaluation"
        if args.max_budget
        else ""
    )
    print(f"rlm-graph eval: {_cost(estimate.methods, estimate.total)}{budget}", file=stream)


class _Progress:
    """One line per finished row on stderr (``--quiet``: none)."""

    def __init__(self, total: int, *, quiet: bool, stream: TextIO) -> None:
        self.total, self.quiet, self.stream = total, quiet, stream
        self.done = 0
        self.clean = stream.isatty()

    def __call__(self, row: Any) -> None:
        self.done += 1
        if self.quiet:
            return
        if row.error is not None:
            note = f"FAILED {row.error.type}: {row.error.message[:120]}"
        else:
            cost = f" ${row.cost:.4f}" if row.cost is not None else ""
            stop = f" ({row.stop_reason})" if row.stop_reason else ""
            note = f"score {row.score:.2f}{cost} {row.latency_s:.2f} s{stop}"
        line = f"[{self.done:>{len(str(self.total))}}/{self.total}] {row.method} {row.id} {note}"
        print(strip_control(line) if self.clean else line, file=self.stream, flush=True)


def _say_outcome(outcome: Any, args: argparse.Namespace, stream: TextIO) -> None:
    for name, m in outcome.summary.methods.items():
        if m.score is None:
            none = f" ({m.not_run} items not run)" if m.not_run else ""
            print(f"rlm-graph eval: {name}: no row yet{none}", file=stream)
            continue
        ci = f" [{100 * m.ci95[0]:.1f}, {100 * m.ci95[1]:.1f}]" if m.ci95 else ""
        cost = (
            f", ${m.cost.mean:.4f} mean, ${m.cost.p95:.4f} p95"
            if m.cost.mean is not None and m.cost.p95 is not None
            else ""
        )
        latency = f", {m.latency_s.median:.1f} s median" if m.latency_s.median is not None else ""
        notes = "".join(
            f", {count} {what}"
            for count, what in ((m.errors, "failed"), (m.does_not_fit, "did not fit"))
            if count
        )
        # A budget-cut evaluation's score is over the items that ran: say how many did not.
        over = (
            f"{m.n} of {m.n + m.not_run} items, {m.not_run} not run"
            if m.not_run
            else f"{m.n} items"
        )
        print(
            f"rlm-graph eval: {name}: {100 * m.score:.1f}%{ci} over {over}{cost}{latency}{notes}",
            file=stream,
        )
    print(
        f"rlm-graph eval: spent ${outcome.spent:.4f}; wrote {outcome.written} rows; table in {outcome.out / 'summary.md'}, "
        f"report in {outcome.out / 'report.html'}",
        file=stream,
    )
    if outcome.unfinished:
        print(
            f"rlm-graph eval: the budget (--max-budget ${args.max_budget:,.2f}) ran out with {outcome.unfinished} "
            "item x method runs left; rerun with a larger --max-budget to finish them (nothing done is asked again)",
            file=stream,
        )


def run(args: argparse.Namespace) -> int:
    if args.action is not None:  # a sub-action's own func is set; never reached
        return EXIT_USAGE
    try:
        evaluation = _evaluation(args)
    except ConfigError as exc:  # PluginError (an unknown method or executor) is one too
        return refuse("eval", exc)
    _say_plan(evaluation, args, sys.stderr)
    if args.estimate:
        return EXIT_OK
    progress = _Progress(
        sum(evaluation.estimate.todo.values()), quiet=args.quiet, stream=sys.stderr
    )
    try:
        outcome = evaluation.run(progress)
    except ConfigError as exc:
        return refuse("eval", exc)
    except KeyboardInterrupt:
        return interrupted_after("eval", f"{progress.done} rows")
    _say_outcome(outcome, args, sys.stderr)
    print(Path(outcome.out / "summary.md").read_text(encoding="utf-8"), end="")
    if outcome.unfinished:
        return EXIT_LIMIT
    # The evaluation's rows, not this run's: a rerun that left failed rows failed too.
    failed = sum(m.errors for m in outcome.summary.methods.values())
    return EXIT_OK if failed == 0 else EXIT_FAILED
