"""``rlm-graph report RUN -o run.html``, and ``--report PATH`` of ``run`` and ``demo``.

RUN is a trace file (``.otlp.jsonl`` or ``.jaeger.json``, from ``--trace file``) or a
graph JSON (``rlm-graph demo --out``, or ``rlm_graph.graph.to_json``). The report is one
HTML file with everything inline (see `rlm_graph.report`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .._files import destination_problem
from ..errors import ConfigError
from ..events import RunFinished
from ..graph import Graph
from ..hooks import hookimpl
from ..report import write_report
from ..tracing import TraceFileError, choose_run, to_graph
from ..tracing.reader import parse_trace
from . import EXIT_OK, EXIT_USAGE, refuse
from .output import overwrite_problem
from .trace import graph_from_json, is_graph_json, journal_graph, read_run_file

__all__ = [
    "LoadedRun",
    "ReportWriter",
    "add_report_argument",
    "load_run",
    "register",
    "report_writers",
]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a one-file HTML report of a run (timeline, graph, models, errors)",
        description="Write a self-contained HTML report of a run: a timeline (one lane per "
        "node in flight), the graph with its critical path, calls/tokens/cost per model, "
        "errors and limit stops, and each node's previews on click. It opens offline.",
    )
    parser.add_argument(
        "run",
        type=Path,
        metavar="RUN",
        help="a trace file (.otlp.jsonl or .jaeger.json), a graph JSON (rlm-graph demo --out) "
        "or a journal (--journal; its newest run, or the one --trace-id names)",
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, metavar="PATH", help="the HTML file to write"
    )
    parser.add_argument(
        "--trace-id",
        default=None,
        help="which trace, if the file has several (for a journal: which run, by the start of its key)",
    )
    parser.add_argument("--title", default=None, help="the page's title (default: the file's name)")
    parser.set_defaults(func=run)


def add_report_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--report PATH`` to a subcommand that runs something."""
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a one-file HTML report of the run here when it ends",
    )


# What a report says of a journal's run that did not finish: the journal keeps the
# run's status and the limit that stopped it (a journal older than that record: not
# which), not which error ended it, nor the nodes that failed.
_JOURNAL_ENDINGS = {
    "stopped": "stopped by a limit (this journal does not say which: an older version wrote it)",
    "failed": "failed (an error or Ctrl-C ended it; the journal keeps neither which, nor "
    "the nodes that failed or were cancelled)",
    "running": "did not finish (it crashed, was killed, or is still running; the journal "
    "keeps finished nodes only)",
}


class LoadedRun(NamedTuple):
    """A run read back for a report: its graph, the limit that stopped it (if known), and
    how it ended in words where no stop reason says it (a journal's run)."""

    graph: Graph
    stop_reason: str | None = None
    ended: str | None = None


def load_run(path: Path, trace_id: str | None = None) -> LoadedRun:
    """The run recorded in ``path`` (a trace file, a graph JSON, or a journal, whose run
    ``trace_id`` names by the start of its key), read once (a pipe works).

    Raises:
        TraceFileError: the file cannot be read, or is neither a trace, a graph JSON nor a
            journal.
    """
    text = read_run_file(path)
    if text is None:  # a journal: --trace-id names the run
        graph, status, stop_reason = journal_graph(path, trace_id)
        if stop_reason is not None:  # the limit is known: said as a live run's report says it
            return LoadedRun(graph, stop_reason=stop_reason)
        return LoadedRun(graph, ended=_JOURNAL_ENDINGS.get(status))
    if is_graph_json(text):
        return LoadedRun(graph_from_json(path, text))
    try:
        spans = parse_trace(text)
    except TraceFileError as exc:
        raise TraceFileError(f"{path}: {exc} (or a graph JSON, or a journal)") from None
    try:
        chosen = choose_run(spans, trace_id)  # the run's own stop reason, not another's
        graph = to_graph(chosen)
    except TraceFileError as exc:
        raise TraceFileError(f"{path}: {exc}") from None
    stops = [
        s.attributes.get("rlm.stop_reason") for s in chosen if "rlm.stop_reason" in s.attributes
    ]
    return LoadedRun(graph, str(stops[0]) if stops else None)


def run(args: argparse.Namespace) -> int:
    problem = destination_problem(args.output)
    problem = f"-o: {problem}" if problem is not None else None
    problem = problem or overwrite_problem("-o", args.output, [("the run it reads", args.run)])
    if problem is not None:  # said before anything is read, let alone written
        return refuse("report", ValueError(problem))
    try:
        loaded = load_run(args.run, args.trace_id)
    except TraceFileError as exc:
        return refuse("report", exc)
    try:
        path = write_report(
            loaded.graph,
            args.output,
            title=args.title or f"rlm-graph run: {args.run.name}",
            stop_reason=loaded.stop_reason,
            ended=loaded.ended,
        )
    except OSError as exc:
        print(
            f"rlm-graph report: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr
        )
        return EXIT_USAGE
    print(f"report written to {path} ({len(loaded.graph):,} nodes)", file=sys.stderr)
    return EXIT_OK


class ReportWriter:
    """Writes the report when the run finishes (``--report PATH``): a listener of the
    run's events, and an observer (pass it as both) that keeps the run's graph, so that a
    run that ends without a result (Ctrl-C, a crashed environment) is reported too."""

    def __init__(self, path: Path, title: str, say: Callable[[str], None]) -> None:
        self.path = path
        self.title = title
        self.say = say
        self.written: Path | None = None
        self.failed: str | None = None  # why the report could not be written
        self.graph: Graph | None = None

    @hookimpl
    def rlm_node_started(self, record: Any, graph: Graph) -> None:
        self.graph = graph

    def __call__(self, event: Any) -> None:
        if not isinstance(event, RunFinished):
            return
        result = event.result
        if result is not None:
            graph, stop_reason = result.graph, result.stop_reason
        elif self.graph is not None:  # the run raised: what it did until then
            graph, stop_reason = self.graph, _ended_by(event.error)
        else:
            return
        try:
            self.written = write_report(graph, self.path, title=self.title, stop_reason=stop_reason)
        except OSError as exc:
            self.failed = f"cannot write the report {self.path}: {exc.strerror or exc}"
            self.say(f"rlm-graph: {self.failed}")
        else:
            self.say(f"report written to {self.written}")


def _ended_by(error: str | None) -> str:
    """The stop reason a report shows for a run that raised ``error`` ("Type: message")."""
    kind = (error or "").partition(":")[0]
    return "interrupted" if kind in ("KeyboardInterrupt", "Cancelled") else f"error: {kind}"


def report_writers(args: argparse.Namespace, say: Callable[[str], None], title: str) -> list[Any]:
    """The listeners ``--report`` asks for (none without it); ``say`` prints a notice on
    stderr (the progress display's, so that it lands above a live line)."""
    path = getattr(args, "report", None)
    if path is None:
        return []
    problem = destination_problem(path)
    if problem is not None:  # said before the run, not after it was paid for
        raise ConfigError(f"--report: {problem}")
    kept = [
        (f"the {flag} file", getattr(args, name, None))
        for flag, name in (("--context", "context"), ("--journal", "journal"),
                           ("--schema", "schema"), ("--out", "out"))
    ]  # fmt: skip
    problem = overwrite_problem("--report", path, kept)
    if problem is not None:
        raise ConfigError(problem)
    return [ReportWriter(path, title, say)]
