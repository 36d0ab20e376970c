"""``rlm-graph mcp``: a Model Context Protocol server over stdio, for coding agents.

One tool, ``rlm_answer(question, paths=[...] | text=...)``: it reads the files (or takes
the text), runs one completion over them (`RLM.acompletion`, with the engine flags of
``rlm-graph run``) and returns the answer, the stop reason, usage, cost and the path of
the run's HTML report. A thin adapter from a tool call to the public API: everything
else is the engine's.

Invariants:
    - Files are read only inside the ``--read-path`` roots (`rlm_graph.cli.read_roots`):
      a path outside them, a ``..`` out of them or a link out of them is refused with a
      tool error before any model is called. The model's code gets their text as
      ``context`` and no ``read_paths``: in the ``subprocess`` guest it reads only its
      runtime and its own folders (Landlock). ``--environment local``, where nothing
      bounds the code, is refused unless ``--allow-local`` is given.
    - stdout carries the protocol and nothing else: while it serves, the SDK points file
      descriptor 1 at stderr, so a stray print (ours, a plugin's, a child process's)
      lands in the agent's log instead of corrupting the wire.
    - Each call is a run of its own (its own `RLM`, closed after it): the limits hold
      per call, as they do per ``rlm-graph run``. The engine runs on its trio thread
      (`RLM.acompletion` from asyncio), never on the server's event loop; a call the
      client cancels cancels its run, and the reading of its files too (the walk's
      thread is stopped at its next entry, not waited for).
    - API keys come from the environment only, as for ``run``; they are never in a
      tool's result or error.
    - A report is a file of its own (mode 0600) in ``--report-dir`` (mode 0700 when
      created here): it holds previews of the documents.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

from pydantic import BaseModel, Field

from .. import __version__, scratch
from ..errors import ConfigError, LimitExceeded, ProviderError, RLMGraphError, scrub_error
from ..tracing.scrub import Scrubber, secret_values
from . import EXIT_OK, EXIT_USAGE, interrupted
from .output import Output
from .read_roots import ENTRIES_PER_FILE, ReadRoots
from .report import ReportWriter
from .run import add_engine_arguments, provider_message, rlm_kwargs
from .trace import add_trace_argument, finish_tracing, tracer_provider_for

if TYPE_CHECKING:
    from collections.abc import Callable

    import anyio
    from mcp.server.mcpserver import MCPServer
    from opentelemetry.trace import TracerProvider

__all__ = ["AnswerResult", "build_server", "register", "run"]

MISSING_SDK = (
    "rlm-graph mcp needs the MCP Python SDK, which is not installed: "
    "pip install 'rlm-graph[mcp]' (or pip install 'mcp>=2,<3')"
)
DEFAULT_MAX_READ_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_READ_FILES = 20_000
DEFAULT_MAX_CALLS = 4
"""Calls that run at once: an agent firing many holds at most this many reads of up to
``--max-read-bytes`` (about five times that in memory, decoded) and guest processes."""


class AnswerResult(BaseModel):
    """What ``rlm_answer`` returns (its structured content)."""

    answer: str = Field(description="the answer; when stop_reason is set, the best partial answer")
    stop_reason: str | None = Field(
        description="null when the model finished; else the limit that stopped it "
        "(max_iterations, max_timeout, max_tokens, max_budget, max_errors)"
    )
    usage: dict[str, Any] = Field(description="calls, tokens and cost per model, children included")
    cost_usd: float | None = Field(
        description="the run's cost in USD (null: a model without a price)"
    )
    execution_time: float = Field(description="seconds the run took")
    report: str | None = Field(
        description="path of the run's one-file HTML report (null: none written)"
    )
    no_report: str | None = Field(
        default=None, description="why no report could be written, if none could"
    )
    files_read: int = Field(description="files given to the model (0 for text)")
    bytes_read: int = Field(description="bytes of those files, or of the text")
    skipped: list[str] = Field(description="files of the folders named that were not read, and why")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve the tool rlm_answer to coding agents over MCP (stdio)",
        allow_abbrev=False,  # "--api-key SECRET" must fail, not pass as --api-key-env
        description="A Model Context Protocol server on stdin/stdout with one tool, "
        "rlm_answer(question, paths or text): a completion over the files named (inside "
        "--read-path only) or the text given, returning the answer, usage, cost and the "
        "path of the run's HTML report. Configure it in the agent (see docs/mcp.md); API "
        "keys come from the environment only.",
    )
    parser.add_argument(
        "--read-path",
        action="append",
        default=[],
        metavar="PATH",
        required=True,
        help="a folder (or file) the tool may read; repeat for more. Paths outside every "
        "one (after resolving links and '..') are refused; relative paths are taken from "
        "the first folder",
    )
    _add_limit_arguments(parser)
    parser.add_argument(
        "--allow-local",
        action="store_true",
        help="accept --environment local, where the model's code runs in this server's "
        "process and can read every file the server can (its keys too): --read-path then "
        "bounds only what the tool reads, not what the code reads. For trusted documents "
        "and models only",
    )
    parser.add_argument(
        "--report-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where each call's HTML report goes, one file (mode 0600) per call (default: "
        "a new private folder under the system's temporary folder)",
    )
    add_engine_arguments(parser)
    add_trace_argument(parser)
    parser.set_defaults(func=run)


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """What one call may read, and how many calls run at once."""
    parser.add_argument(
        "--max-read-bytes",
        type=int,
        default=DEFAULT_MAX_READ_BYTES,
        metavar="N",
        help=f"the most bytes one call may read (default {DEFAULT_MAX_READ_BYTES:,})",
    )
    parser.add_argument(
        "--max-read-files",
        type=int,
        default=DEFAULT_MAX_READ_FILES,
        metavar="N",
        help=f"the most files one call may read (default {DEFAULT_MAX_READ_FILES:,}); a walk "
        f"of a folder looks at no more than {ENTRIES_PER_FILE} files and folders per file, "
        "skipped ones included",
    )
    parser.add_argument(
        "--max-calls",
        type=int,
        default=DEFAULT_MAX_CALLS,
        metavar="N",
        help=f"the most calls that run at once (default {DEFAULT_MAX_CALLS}); the others "
        "wait their turn. Each holds what it read, a guest process and its model calls",
    )


def run(args: argparse.Namespace) -> int:
    out = Output("mcp", as_json=False)
    try:
        import mcp.server.mcpserver  # noqa: F401 - the SDK's 2.x API, checked before anything
    except ImportError:
        return out.error(EXIT_USAGE, MISSING_SDK, kind="ConfigError")
    import anyio

    if sys.stdin is None or getattr(sys.stdout, "name", "") == os.devnull:
        return out.error(
            EXIT_USAGE,
            "stdin or stdout is closed: an MCP client starts rlm-graph mcp with a pipe on "
            "both (see docs/mcp.md for a client's configuration)",
            kind="ConfigError",
        )
    provider = None
    try:
        provider = tracer_provider_for(args)
        server, tools = _build(args, provider)
    except ConfigError as exc:
        finish_tracing(provider)
        return out.error(EXIT_USAGE, str(exc), kind=type(exc).__name__, error=exc)
    try:
        anyio.run(_serve, server, tools, functools.partial(_leave, out, provider))
    finally:
        finish_tracing(provider)
    return EXIT_OK


async def _serve(server: MCPServer[Any], tools: _Tools, leave: Callable[[], NoReturn]) -> None:
    """Serve until the client closes stdin. At a stop (Ctrl-C; SIGTERM and SIGHUP, which
    the command turns into one), cancel every call, wait until each has closed its run
    (guest killed, folders removed), and `leave`: the SDK reads stdin in a worker thread
    blocked in ``read(2)``, which no cancellation interrupts and which the interpreter
    would wait for at exit, so a client holding stdin open kept a stopped server alive."""
    import anyio

    if threading.current_thread() is not threading.main_thread():  # no signals to take
        await server.run_stdio_async()
        return
    async with anyio.create_task_group() as serving:

        async def serve_stdio() -> None:
            await server.run_stdio_async()
            serving.cancel_scope.cancel()  # stdin's end: the server's own end, no stop

        serving.start_soon(serve_stdio)
        # Open until the process leaves: a second stop while the calls close their runs
        # is taken here too (else a KeyboardInterrupt skips `leave`, and the reader's
        # thread holds the exit again).
        with anyio.open_signal_receiver(signal.SIGINT) as stops:
            async for _ in stops:
                break
            serving.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await tools.wait_idle()
            leave()


def _leave(out: Output, provider: TracerProvider | None) -> NoReturn:
    """End the process of a stopped server, its calls' runs closed, with the exit code
    and the one line of a stopped command (130, or 128 + SIGTERM's or SIGHUP's number)."""
    code = interrupted(out)
    scratch.clear_kept()  # what atexit would remove, which os._exit skips
    finish_tracing(provider)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to tell
            pass
    os._exit(code)


class _Tools:
    """The state the tool needs between calls: the roots, the RLM keywords, the report
    folder and the tracer provider."""

    def __init__(self, args: argparse.Namespace, provider: TracerProvider | None) -> None:
        if args.max_calls < 1:
            raise ConfigError(f"--max-calls {args.max_calls}: give at least 1")
        self.max_calls = args.max_calls
        self.roots = ReadRoots(
            args.read_path, max_bytes=args.max_read_bytes, max_files=args.max_read_files
        )
        _check_environment(args)
        self.kwargs = rlm_kwargs(args)
        given = [self.kwargs.get("backend_kwargs"), *self.kwargs.get("other_backend_kwargs", [])]
        # A key a plugin quoted in its error goes neither to the client nor to the log.
        self.scrub = Scrubber([s for kw in given for s in secret_values(kw, environ={})]).scrub
        self.provider = provider
        self.trace_content = bool(getattr(args, "trace_content", False))
        self._check_engine()
        self.report_dir = _report_dir(args.report_dir)
        self._turns: anyio.Semaphore | None = None  # made on the server's loop
        self.calls = 0  # in flight: each until its run is closed
        self._idle: anyio.Event | None = None  # while `wait_idle` waits

    async def wait_idle(self) -> None:
        """Wait until no call is in flight: each has closed its run (its guest killed,
        its folders removed) and its report."""
        import anyio

        while self.calls:
            self._idle = anyio.Event()
            await self._idle.wait()

    def _check_engine(self) -> None:
        """Build (and drop) one RLM now, so that a bad backend, environment or limit is a
        usage error when the server starts, not a failure of every call."""
        from .. import RLM

        RLM(**self.kwargs).close()

    async def answer(
        self, question: str, paths: list[str] | None, text: str | None
    ) -> AnswerResult:
        """One call of the tool, counted in flight (`wait_idle`) from start to end."""
        import anyio

        self.calls += 1
        try:
            if self._turns is None:
                self._turns = anyio.Semaphore(self.max_calls)
            async with self._turns:  # what one call holds times --max-calls: the bound
                return await self._answer(question, paths, text)
        finally:
            self.calls -= 1
            if not self.calls and self._idle is not None:
                self._idle.set()

    async def _answer(
        self, question: str, paths: list[str] | None, text: str | None
    ) -> AnswerResult:
        import anyio
        from mcp.server.mcpserver.exceptions import ToolError

        from .. import RLM

        context, files, size, skipped = await self._read(question, paths, text)
        report, no_report = self._new_report()
        writer = ReportWriter(report or Path(), f"rlm-graph mcp: {question[:80]}", _log)
        try:
            rlm = RLM(
                **self.kwargs,
                tracer_provider=self.provider,
                trace_content=self.trace_content,
                record_content=self.trace_content,
                listeners=[writer] if report is not None else [],
            )
        except BaseException:
            if report is not None:
                report.unlink(missing_ok=True)
            raise
        try:
            result = await rlm.acompletion(context, root_prompt=question)
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit ends its call, not us
            scrub_error(exc, self.scrub)
            raise ToolError(self.scrub(_failure(exc))) from None
        finally:
            with anyio.CancelScope(shield=True):
                await rlm.aclose()
            if report is not None and writer.written is None:
                report.unlink(missing_ok=True)
        summary = result.usage_summary
        return AnswerResult(
            answer=result.response,
            stop_reason=result.stop_reason,
            usage=summary.to_dict(),
            cost_usd=summary.total_cost,
            execution_time=result.execution_time,
            report=str(writer.written) if writer.written is not None else None,
            no_report=no_report or writer.failed,
            files_read=files,
            bytes_read=size,
            skipped=skipped,
        )

    async def _read(
        self, question: str, paths: list[str] | None, text: str | None
    ) -> tuple[str | dict[str, str], int, int, list[str]]:
        """The call's context, the question counted in ``--max-read-bytes``; any failure
        a `ToolError` that says what happened."""
        from mcp.server.mcpserver.exceptions import ToolError

        if not question.strip():  # a paid run with nothing to answer
            raise ToolError("the question is empty: say what to find in the documents")
        room = self.roots.max_bytes - len(question.encode("utf-8", errors="replace"))
        if room < 0:
            raise ToolError(
                f"the question is more than {self.roots.max_bytes:,} bytes (--max-read-bytes); "
                "put long material in text or paths"
            )
        try:
            return await self._context(paths, text, room)
        except ToolError:
            raise
        except Exception as exc:  # a bug or an OS surprise: said, not "Error executing tool"
            logging.getLogger("rlm_graph").exception("rlm_answer could not read its context")
            raise ToolError(f"cannot read the context: {type(exc).__name__}: {exc}") from None

    async def _context(
        self, paths: list[str] | None, text: str | None, room: int
    ) -> tuple[str | dict[str, str], int, int, list[str]]:
        """The call's context (``room``: the bytes left once the question is counted)."""
        import anyio
        from mcp.server.mcpserver.exceptions import ToolError

        if (paths is None) == (text is None):
            raise ToolError(
                "give either paths (files or folders to read) or text, not both and not neither"
            )
        if text is not None:
            size = len(text.encode("utf-8", errors="replace"))
            if size > room:
                raise ToolError(
                    f"the text and the question come to more than {self.roots.max_bytes:,} "
                    "bytes (--max-read-bytes)"
                )
            return text, 0, size, []
        assert paths is not None
        # A cancelled call leaves its reading thread behind at once (a walk of a large
        # folder can take a minute), and the stop ends that thread at its next entry, so
        # that it neither reads on for nothing nor holds the server's exit.
        stop = threading.Event()
        try:
            docs = await anyio.to_thread.run_sync(
                self.roots.read, paths, room, stop, abandon_on_cancel=True
            )
        except ConfigError as exc:
            raise ToolError(str(exc)) from None
        finally:
            stop.set()
        if not docs.files:
            raise ToolError(
                "no text file to read in the paths given: " + "; ".join(_listed(docs.skipped, 20))
            )
        return docs.files, len(docs.files), docs.size, _listed(docs.skipped, 200)

    def _new_report(self) -> tuple[Path | None, str | None]:
        """A new private file for the call's report; or None and why there is none. The
        report is a by-product: it never fails the call."""
        name = f"rlm-answer-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.html"
        path = self.report_dir / name
        try:
            try:
                _create_private(path)
            except FileNotFoundError:  # the folder went (a cleaner of /tmp): made again
                self.report_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                _create_private(path)
        except OSError as exc:
            why = f"cannot write a report in {self.report_dir}: {exc.strerror or exc}"
            _log(f"{why}; answering without one")
            return None, why
        return path, None


def _failure(exc: BaseException) -> str:
    """What the client is told of a failed run (a bug's traceback goes to the log)."""
    if isinstance(exc, ProviderError):
        said = provider_message(exc) + "."
        if exc.result is not None and exc.partial:
            said += f" The partial answer so far: {exc.partial}"
        return said
    if isinstance(exc, LimitExceeded):  # on_limit is "return"; kept for plugins that raise
        return f"stopped by {exc.reason}; the partial answer: {exc.partial}"
    if isinstance(exc, RLMGraphError):  # a crashed environment, a plugin's late check
        return f"{type(exc).__name__}: {exc}"
    logging.getLogger("rlm_graph").error("rlm_answer failed", exc_info=exc)
    return f"the run failed: {type(exc).__name__}: {exc}"


def _create_private(path: Path) -> None:
    """Create ``path``, private (0600), before the report is written into it."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def _listed(skipped: list[str], most: int) -> list[str]:
    """The first ``most`` skipped files, and a last entry counting the rest: nothing is
    cut without saying so."""
    if len(skipped) <= most:
        return skipped
    return [*skipped[:most], f"... and {len(skipped) - most:,} more files skipped"]


def _check_environment(args: argparse.Namespace) -> None:
    """Refuse ``--environment local`` unless ``--allow-local`` says the user knows that
    the model's code would read past ``--read-path``."""
    if args.environment == "local" and not args.allow_local:
        raise ConfigError(
            "--environment local runs the model's code inside this server's process, where it "
            "can read every file the server can (and its API keys), so --read-path would not "
            "hold for it: use --environment subprocess (the default), or add --allow-local "
            "if the documents and the model are yours to trust"
        )


def _report_dir(chosen: Path | None) -> Path:
    if chosen is None:
        return Path(tempfile.mkdtemp(prefix="rlm-graph-mcp-reports-"))
    try:
        chosen.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--report-dir {chosen}: {exc.strerror or exc}") from None
    if not os.access(chosen, os.W_OK | os.X_OK):
        raise ConfigError(f"--report-dir {chosen} is not a folder this server can write in")
    return chosen.resolve()


def _log(text: str) -> None:
    print(f"rlm-graph mcp: {text}", file=sys.stderr, flush=True)


def build_server(
    args: argparse.Namespace, provider: TracerProvider | None = None
) -> MCPServer[Any]:
    """The MCP server of the parsed ``rlm-graph mcp`` flags (not yet serving); its runs
    send spans to ``provider``.

    Raises:
        ImportError: the MCP SDK (2.x) is not installed.
        ConfigError: a flag that cannot work (a missing --read-path, a bad limit, an
            unknown backend or environment).
    """
    return _build(args, provider)[0]


def _build(
    args: argparse.Namespace, provider: TracerProvider | None
) -> tuple[MCPServer[Any], _Tools]:
    from mcp.server.mcpserver import MCPServer

    tools = _Tools(args, provider)
    roots = ", ".join(tools.roots.roots)
    server: MCPServer[Any] = MCPServer(
        "rlm-graph",
        version=__version__,
        instructions=(
            "rlm_answer answers a question over files or text too large to read whole: a "
            "Recursive Language Model reads them in a Python REPL and calls sub-models on "
            f"the parts. It may read only inside: {roots}."
        ),
    )

    async def rlm_answer(
        question: Annotated[str, Field(description="the question to answer over the documents")],
        paths: Annotated[
            list[str] | str | None,
            Field(
                description="files or folders to read (a folder: every text file in it), "
                "inside the server's read roots (the tool's description names them); one "
                "may be given as a string"
            ),
        ] = None,
        text: Annotated[
            str | None, Field(description="the document itself, instead of paths")
        ] = None,
    ) -> AnswerResult:
        return await tools.answer(question, [paths] if isinstance(paths, str) else paths, text)

    server.add_tool(
        rlm_answer,
        title="Answer a question over large documents (RLM)",
        description=(
            "Answer a question over files, a folder (a repository) or a text too large for "
            "one model call. A Recursive Language Model loads them as `context` in a Python "
            "REPL (a dict of path to text, or the text), writes code over them and calls "
            "sub-models on the parts. Give paths or text. Returns the answer, the limit "
            "that stopped the run if one did, usage, cost and the path of an HTML report "
            f"of the run. Readable paths: {roots}."
        ),
    )
    return server, tools
