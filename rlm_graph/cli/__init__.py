"""The ``rlm-graph`` command.

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a function of the
parsed arguments that returns the exit code.

Exit codes: 0 done, 1 the run failed otherwise (a crashed environment), 2 bad usage or
configuration, 3 a limit stopped the run (the partial answer is printed), 4 a provider
failed (the partial answer and usage so far are printed), 130 interrupted (Ctrl-C), 143
and 129 stopped by SIGTERM and SIGHUP.

Invariants:
    - Ctrl-C ends any subcommand with one line on stderr and exit 130, never a
      traceback (the engine has cancelled everything by the time it reaches here).
    - SIGTERM and SIGHUP take the same path (they are turned into a SIGINT, which trio
      delivers safely): every guest killed and every scratch folder removed before the
      command exits, with 128 + the signal's number.
    - With ``--json`` on the command line, a usage error is a JSON object on stdout too
      (see `rlm_graph.cli.output`).
    - A reader of stdout that goes away (``| head``) ends the command quietly, exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

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


def refuse(command: str, exc: Exception) -> int:
    """A command's configuration error, said on stderr: the usage exit code. The message
    may quote a file's text or name (a trace's, a journal's): it is printed without
    control sequences, wherever stderr goes, so an error line cannot retitle a terminal
    or clear it, nor break a log's lines."""
    from .output import strip_control

    print(f"rlm-graph {command}: {strip_control(on_the_command_line(str(exc)))}", file=sys.stderr)
    return EXIT_USAGE


def on_the_command_line(text: str) -> str:
    """A library error's message, with the command line's fix where its fix is Python's."""
    hint = " [on the command line: --price INPUT OUTPUT (USD per million tokens)]"
    # After the line that needs it: a batch's message has a line per bad input line.
    lines = text.split("\n")
    return "\n".join(line + hint if "no price is known" in line else line for line in lines)


def interrupted_after(command: str, done: str) -> int:
    """Ctrl-C (or SIGTERM, SIGHUP) in a command that resumes: what it had finished, and
    how to go on; 130, or 128 + the signal's number."""
    signum = _said_stopped()
    how = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
    print(
        f"\nrlm-graph {command}: interrupted{how} after {done}; rerun the same command to resume",
        file=sys.stderr,
    )
    return _exit_code(signum)


def interrupted(out: Output) -> int:
    """A command stopped by Ctrl-C, SIGTERM or SIGHUP (the last one received), which
    caught the stop itself: its one line on stderr, and its exit code (130, or 128 + the
    signal's number)."""
    return _interrupted(out, _said_stopped())


class _Stops:
    """The stops of the running command: the stopping signals (SIGTERM, SIGHUP) it
    received, in order; whether it has said it was stopped; whether a stop is now only
    listed, not raised (said, or its handlers being put back): never a second line, or a
    second JSON object."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.reset()

    def reset(self) -> None:
        self.received.clear()
        self.said = self.quiet = False


_STOPS = _Stops()


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
    from .._version import __version__

    parser.add_argument("--version", action="version", version=f"rlm-graph {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rlm-graph`` command line ``argv`` (default ``sys.argv[1:]``).

    Returns:
        The exit code (see the module docstring).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in words
    command = words[0] if words and words[0] in SUBCOMMANDS else ""
    # SIGTERM and SIGHUP are taken before the first import, which takes from a quarter
    # of a second to seconds on a loaded machine: a stop then killed the command (no line,
    # no exit code of its own) where a Ctrl-C got both.
    _replace_what_cannot_be_printed()  # on the streams themselves, before the stand-in
    try:
        with _messages_never_fail(), _stops_as_interrupts():
            return _command(words, command, as_json)
    except KeyboardInterrupt:  # a stop before the command could take it: no traceback
        if _STOPS.said:  # a Ctrl-C after the command said it was stopped: said once
            return _exit_code(_last(_STOPS.received))
        from .output import Output  # an import a stop cut short is undone: done again

        with _messages_never_fail():
            return _interrupted(Output(command, as_json=as_json), _said_stopped())


def _command(words: list[str], command: str, as_json: bool) -> int:
    """The command, its stops (Ctrl-C, SIGTERM, SIGHUP) taken, as the module says."""
    from .output import Output

    out = Output(command, as_json=as_json)
    try:
        return _main(words, out, as_json)
    except KeyboardInterrupt:
        return _interrupted(out, _said_stopped())
    except BrokenPipeError:
        return _reader_left()


def _last(received: list[int]) -> int:
    """The stop that ended the command: the last SIGTERM or SIGHUP received, else Ctrl-C."""
    return received[-1] if received else signal.SIGINT


def _said_stopped() -> int:
    """The stop that ended the command, about to be said: later stops are only listed."""
    _STOPS.said = _STOPS.quiet = True
    return _last(_STOPS.received)


def _exit_code(signum: int) -> int:
    """130 for Ctrl-C, else 128 + the signal's number (143 SIGTERM, 129 SIGHUP)."""
    return EXIT_INTERRUPTED if signum == signal.SIGINT else 128 + signum


def _replace_what_cannot_be_printed() -> None:
    """A stdout or stderr whose encoding cannot write every character (``latin-1``, an
    old console) prints ``?`` for one it cannot: an answer with a character outside it
    was lost to a ``UnicodeEncodeError``, and every later message with it."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "")
        reconfigure = getattr(stream, "reconfigure", None)
        if encoding not in ("utf8", "utf16", "utf32") and reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (OSError, ValueError):
                pass


class _Messages(io.TextIOBase):
    """stderr for a command's messages and progress, whose failure never stops the
    command: a reader gone (``2>&1 >out | head``) or a closed stream swallows them, and
    the answer on stdout, the results file, go on."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                self.stream.write(text)
            except (OSError, ValueError):  # a broken pipe, a full disk, a closed file
                self.stream = None
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.stream = None

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        try:
            return self.stream is not None and self.stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self.stream is None:
            raise io.UnsupportedOperation("stderr is closed")
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


@contextmanager
def _messages_never_fail() -> Iterator[None]:
    """While the command runs, `_Messages` stands in for stderr, and a stdout closed
    before it started (``>&-``) is a sink: there is nothing to tell, not a crash."""
    before_out, before_err = sys.stdout, sys.stderr
    sink = open(os.devnull, "w", encoding="utf-8") if before_out is None else None  # noqa: SIM115
    if sink is not None:
        sys.stdout = sink
    sys.stderr = _Messages(before_err)
    try:
        yield
    finally:
        if isinstance(sys.stderr, _Messages):  # unless the command put its own there
            sys.stderr = before_err
        if sink is not None:
            sys.stdout = before_out
            sink.close()


def _reader_left() -> int:
    """The reader of stdout went away (``rlm-graph plugins --json | head``): stop quietly,
    as command-line tools do, with no traceback and no error at exit's flush."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor behind stdout
        pass
    return EXIT_FAILED


@contextmanager
def _stops_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP, while the command runs, become a Ctrl-C (the signals that
    arrived are listed in `_STOPS`), so they stop a run the way Ctrl-C does: cleanly.

    A stopping signal the command was started ignoring stays ignored (``nohup`` ignores
    SIGHUP). A command started with SIGINT ignored (a background job of a script,
    ``rlm-graph batch ... &``, where the shell has no job control) takes Ctrl-C while
    it runs, since a SIGTERM goes that way (trio's own handler delivers it safely):
    ignored, it took the SIGTERM with it, and only SIGKILL stopped the job.
    """
    _STOPS.reset()
    received = _STOPS.received
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        if not received or received[-1] != signum:
            received.append(signum)
        if not _STOPS.quiet:
            signal.raise_signal(signal.SIGINT)

    # Ctrl-C first (a SIGTERM turned into an ignored SIGINT was lost), and each handler
    # noted before it is set: a stop as soon as it is set ends here, and it is put back.
    handlers: dict[signal.Signals, Any] = {}
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        handlers[signal.SIGINT] = signal.default_int_handler
    for stop in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(stop) != signal.SIG_IGN:
            handlers[stop] = interrupt
    before: dict[signal.Signals, Any] = {}
    try:
        for number, handler in handlers.items():
            before[number] = signal.getsignal(number)
            signal.signal(number, handler)
        yield
    finally:
        _STOPS.quiet = True  # a stop while they are put back is listed, not raised
        for number, handler in before.items():
            signal.signal(number, handler)


def _main(words: list[str], out: Output, as_json: bool) -> int:
    from ..tracing.scrub import without_key_shapes

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
        exc.message = without_key_shapes(_unrecognized_names(exc.message))
        if as_json:
            return out.error(EXIT_USAGE, exc.message, kind="UsageError")
        # One line (docs/cli.md), naming the subcommand even where the top parser found
        # the fault (an unknown flag after the subcommand's own).
        prog = exc.parser.prog
        if prog == parser.prog and words and words[0] in SUBCOMMANDS:
            prog = f"{prog} {words[0]}"
        print(f"{prog}: error: {exc.message} (see {prog} --help)", file=sys.stderr)
        return EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    code: int = args.func(args)
    return code


_UNRECOGNIZED = "unrecognized arguments: "


def _unrecognized_names(message: str) -> str:
    """argparse's "unrecognized arguments: ..." with the names of the unknown flags and
    the stray words before them, never what follows one: after ``--api_key``,
    ``--token=``, ``--key`` comes a key, in whatever spelling the flag was misspelt."""
    if not message.startswith(_UNRECOGNIZED):
        return message
    shown: list[str] = []
    hidden = 0
    for word in message.removeprefix(_UNRECOGNIZED).split(" "):
        name, value = word.split("=", 1) if "=" in word else (word, None)
        if word.startswith("-") and name[1:].lstrip("-")[:1].isalpha():
            shown.append(name)
            hidden += value is not None
        elif any(s.startswith("-") for s in shown):
            hidden += 1
        else:
            shown.append(word)
    if hidden:
        words = "a word" if hidden == 1 else f"{hidden} words"
        shown.append(f"({words} after an unknown flag not shown: it may be a key)")
    return _UNRECOGNIZED + " ".join(shown)


def _interrupted(out: Output, signum: int) -> int:
    status = _exit_code(signum)
    how = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    if out.as_json:
        return out.error(status, f"interrupted ({how})", kind="Interrupted")
    name = f"rlm-graph {out.command}".rstrip()
    suffix = "" if signum == signal.SIGINT else f" ({how})"
    print(f"{name}: interrupted{suffix}", file=sys.stderr)
    return status
