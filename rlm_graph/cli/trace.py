"""``rlm-graph trace show|export``, and the ``--trace`` option of ``run`` and ``demo``.

``trace show FILE`` prints a trace file's span tree with a timeline; ``trace export FILE
--format dot|graphml`` rebuilds the run's graph from it. Both read either trace format
(OTLP JSON Lines or Jaeger JSON).

Other subcommands take tracing options with `add_trace_argument` and turn them into a
tracer provider with `tracer_provider_for`; `finish_tracing` flushes it and says where
trace files went.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, TextIO

from opentelemetry.trace import TracerProvider

from .._files import UnreadableFile, destination_problem, read_once, write_private
from ..errors import ConfigError, GraphError, without_url_passwords
from ..graph import Graph, from_json, to_dot, to_graphml
from ..tracing import (
    Scrubber,
    TraceFileError,
    TraceSpan,
    close_tracing,
    configure_tracing,
    load_trace,
    render_traces,
    to_graph,
    trace_files,
    tracer_provider_from_env,
)
from ..tracing.config import TRACE_MODES
from ..tracing.reader import parse_trace
from . import EXIT_OK, EXIT_USAGE, refuse
from .output import for_stream, on_terminal, overwrite_problem, strip_control

__all__ = ["add_trace_argument", "finish_tracing", "register", "tracer_provider_for"]


def add_trace_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--trace``, ``--trace-dir`` and ``--trace-content`` to a subcommand's parser."""
    group = parser.add_argument_group("tracing")
    group.add_argument(
        "--trace",
        choices=TRACE_MODES,
        default=None,
        help="where spans go: otlp (OTEL_EXPORTER_OTLP_* variables, default "
        "http://localhost:4318), file (trace files, see --trace-dir), console, or none; "
        "default: what the OTEL_* variables say, else none",
    )
    group.add_argument(
        "--trace-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder for --trace file (default $RLM_GRAPH_TRACE_DIR or traces/)",
    )
    group.add_argument(
        "--trace-content",
        action="store_true",
        help="record prompts, code and outputs: whole in --report's trajectory, truncated on "
        "spans (secrets redacted); off by default, since documents are private",
    )


def tracer_provider_for(args: argparse.Namespace) -> TracerProvider | None:
    """The tracer provider the ``--trace`` options ask for.

    Returns:
        A provider to pass as ``tracer_provider=`` (with ``capture_content`` from
        ``args.trace_content``), or ``None`` when neither ``--trace`` nor the ``OTEL_*``
        variables ask for tracing.

    Raises:
        ConfigError: bad ``OTEL_*`` settings (the message says which).
    """
    mode = getattr(args, "trace", None)
    directory = getattr(args, "trace_dir", None)
    if directory is not None and mode != "file":
        raise ConfigError("--trace-dir is where --trace file writes; add --trace file")
    _quiet_exporters()
    if mode is None:
        return tracer_provider_from_env()
    return configure_tracing(mode, directory=directory)


def finish_tracing(provider: TracerProvider | None, stream: TextIO | None = None) -> None:
    """Flush and close ``provider``, a second at most each (a collector that is down
    does not hold up the command's exit); for trace files, say on ``stream`` (stderr)
    where they are, and for spans that could not be sent, that they were not."""
    if provider is None:
        return
    out = stream or sys.stderr
    if not close_tracing(provider, 1_000) and not trace_files(provider):
        variable = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        if not os.environ.get(variable):
            variable = "OTEL_EXPORTER_OTLP_ENDPOINT"
        endpoint = os.environ.get(variable) or "http://localhost:4318"
        print(
            f"rlm-graph: the trace could not be sent to {_endpoint_shown(endpoint)} (the "
            f"collector refused it, or did not answer within 1 s); check that the collector "
            f"runs and the endpoint ({variable})",
            file=out,
        )
    for path in trace_files(provider):
        print(f"trace written to {path}", file=out)


def _endpoint_shown(endpoint: str) -> str:
    """An OTLP endpoint for a message: its password redacted, and without its query and
    fragment (a collector's credential may ride there: ``?key=...``, ``?sig=...``)."""
    return Scrubber().scrub(re.split(r"[?#]", without_url_passwords(endpoint), maxsplit=1)[0])


def _quiet_exporters() -> None:
    """The OTLP exporters log each retry of a collector that is down over the command's
    output; the command says it once itself (`finish_tracing`)."""
    logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "trace", help="show a trace file, or export the graph it recorded"
    )
    commands = parser.add_subparsers(dest="trace_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: _usage(parser))

    show = commands.add_parser(
        "show", help="the span tree with durations, models, tokens, status and a timeline"
    )
    show.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="trace files (.otlp.jsonl or .jaeger.json); each is shown in turn",
    )
    show.add_argument(
        "--width",
        type=_width,
        default=0,
        help=f"line width, {MIN_WIDTH} to {MAX_WIDTH} (default 0: the terminal's)",
    )
    show.add_argument("--no-timeline", action="store_true", help="leave out the timeline bars")
    show.add_argument("--ascii", action="store_true", help="ASCII characters only")
    show.set_defaults(func=run_show)

    export = commands.add_parser("export", help="rebuild the run's graph as DOT or GraphML")
    export.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="a trace file (.otlp.jsonl or .jaeger.json), a graph JSON (rlm-graph demo "
        "--out) or a journal (--journal); given several (a shell glob), the newest is used",
    )
    export.add_argument("--format", choices=("dot", "graphml"), default="dot")
    export.add_argument("--trace-id", default=None, help="which trace, if the file has several")
    export.add_argument(
        "--run",
        default=None,
        metavar="KEY",
        help="for a journal (.sqlite): which run, by the start of its key (`rlm-graph "
        "journal ls`; --trace-id is taken the same way); default the newest",
    )
    export.add_argument(
        "-o", "--output", type=Path, default=None, help="write here instead of stdout"
    )
    export.set_defaults(func=run_export)


MIN_WIDTH, MAX_WIDTH = 40, 1000


def _width(text: str) -> int:
    """``--width``: 0 (the terminal's) or a line width a screen or a file can hold (a
    width of a billion columns built a line of gigabytes)."""
    try:
        width = int(text)
    except ValueError:
        width = -1
    if width != 0 and not MIN_WIDTH <= width <= MAX_WIDTH:
        raise argparse.ArgumentTypeError(
            f"must be 0 (the terminal's width) or {MIN_WIDTH} to {MAX_WIDTH} columns, not {text!r}"
        )
    return width


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def run_show(args: argparse.Namespace) -> int:
    terminal = shutil.get_terminal_size((120, 24)).columns  # $COLUMNS may say anything
    width = args.width or min(max(terminal, MIN_WIDTH), MAX_WIDTH)
    for number, path in enumerate(args.files):
        try:
            spans = load_trace(path)
        except TraceFileError as exc:
            return refuse("trace show", exc)
        # A file's name, span names and models come from others (a shell glob, servers,
        # configurations): a terminal gets them without control sequences, taken out of
        # the spans before the columns are padded.
        if len(args.files) > 1:
            sys.stdout.write(for_stream(sys.stdout, ("\n" if number else "") + f"== {path}\n"))
        if on_terminal(sys.stdout):
            spans = [_printable(span) for span in spans]
        shown = render_traces(spans, width=width, timeline=not args.no_timeline, ascii=args.ascii)
        sys.stdout.write(for_stream(sys.stdout, shown))
    return EXIT_OK


def _printable(span: TraceSpan) -> TraceSpan:
    """``span`` with its name and text attributes stripped of control sequences."""
    attributes = {
        key: strip_control(value) if isinstance(value, str) else value
        for key, value in span.attributes.items()
    }
    return span.model_copy(update={"name": strip_control(span.name), "attributes": attributes})


def _newest(paths: list[Path]) -> Path:
    existing = [p for p in paths if p.exists()]
    if len(paths) > 1 and existing:
        newest = max(existing, key=lambda p: p.stat().st_mtime)
        said = f"rlm-graph trace export: {len(paths)} files given; using the newest, {newest}"
        print(strip_control(said), file=sys.stderr)  # as `refuse` says a file's name
        return newest
    return paths[0]


def _load_graph(path: Path, trace_id: str | None, run: str | None = None) -> Graph:
    """A graph from a trace file, a graph JSON export (``rlm-graph demo --out``), or a
    run of a journal."""
    text = read_run_file(path)
    if text is None:  # a journal: --trace-id names its run too, as `report` takes it
        if run is not None and trace_id is not None and run != trace_id:
            raise TraceFileError(f"--run {run} and --trace-id {trace_id} name two runs")
        return journal_graph(path, run or trace_id)[0]
    if run is not None:
        raise TraceFileError(
            f"--run picks a run of a journal; {path} is not one: give --trace-id to pick "
            "a trace of a trace file"
        )
    if is_graph_json(text):
        return graph_from_json(path, text)
    try:
        return to_graph(parse_trace(text), trace_id)
    except TraceFileError as exc:
        raise TraceFileError(f"{path}: {exc}") from None


SQLITE_MAGIC = b"SQLite format 3\x00"
_NOT_A_RUN = "give a trace file, a graph JSON or a journal"


def read_run_file(path: Path) -> str | None:
    """The text of a file a run left (a trace file, a graph JSON), read once
    (`rlm_graph._files.read_once`: a pipe works, a device or a FIFO nobody writes to is
    refused); None for a journal (an SQLite file, which SQLite opens by its path).

    Raises:
        TraceFileError: it cannot be read, is a folder or a device, is not UTF-8 text,
            or is a journal given through a pipe.
    """
    try:
        data = read_once(path, wanted=_NOT_A_RUN, stop=SQLITE_MAGIC)
    except UnreadableFile as exc:
        raise TraceFileError(str(exc)) from None
    if data is None:
        return None
    if data.startswith(SQLITE_MAGIC):  # a regular file that is one was not read: a pipe
        raise TraceFileError(
            f"{path} is a journal given through a pipe; SQLite reads a journal from a "
            "file: give the journal's path"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceFileError(f"{path} is not a text file: {_NOT_A_RUN}") from None


def is_graph_json(text: str) -> bool:
    """Whether ``text`` (a file's whole text) is a graph JSON (``rlm-graph demo --out``,
    `rlm_graph.graph.to_json`): its format is named in its first 200 characters."""
    head = text[:200]
    return '"format": "rlm-graph/1"' in head or '"format":"rlm-graph/1"' in head


def graph_from_json(path: Path, text: str) -> Graph:
    """The graph of a graph JSON read from ``path``.

    Raises:
        TraceFileError: it is not a graph export this version reads (one line, naming
            ``path``).
    """
    try:
        return from_json(text)
    except (ValueError, KeyError, TypeError, GraphError) as exc:
        raise TraceFileError(f"{path}: not a readable graph export ({exc})") from None


def journal_graph(path: Path, run: str | None) -> tuple[Graph, str, str | None]:
    """The graph of a journal's run (``run``: the start of its key; None: the newest),
    the run's status (``finished``, ``stopped``, ``failed``, ``running``) and the limit
    that stopped it (None: none did, or a journal older than the record of it)."""
    from ..journal import JournalStore

    try:
        store = JournalStore(path, read_only=True)
        try:
            found = store.find(run or "")
            return store.graph(found.key), found.status, found.stop_reason
        finally:
            store.close()
    except ConfigError as exc:
        raise TraceFileError(str(exc)) from None


def run_export(args: argparse.Namespace) -> int:
    if args.output is not None:
        problem = destination_problem(args.output)
        problem = f"-o: {problem}" if problem is not None else None
        problem = problem or overwrite_problem(
            "-o", args.output, [("a file it reads", path) for path in args.files]
        )
        if problem is not None:
            return refuse("trace export", ValueError(problem))
    try:
        graph = _load_graph(_newest(args.files), args.trace_id, getattr(args, "run", None))
    except TraceFileError as exc:
        return refuse("trace export", exc)
    text = to_dot(graph) if args.format == "dot" else to_graphml(graph)
    if args.output is None:  # a terminal gets the labels without control sequences
        sys.stdout.write(for_stream(sys.stdout, text))
        return EXIT_OK
    try:
        write_private(args.output, text)
    except OSError as exc:
        return refuse("trace export", OSError(f"cannot write {args.output}: {exc.strerror}"))
    return EXIT_OK
