"""Live progress of a run on the terminal, rendered from the run's events.

`RunProgress` keeps the totals (coalesced: a counter per fact, not a list of events, so a
run of any size costs the same), updated by each event on the scheduler's thread.
`ProgressDisplay` shows them on stderr, never on stdout (which holds the answer, or the
JSON with ``--json``):

- stderr is a terminal: one live line (rich), redrawn a few times a second: elapsed
  time, the root's turn, the deepest depth reached, sub-calls done / running / failed
  (and cancelled, once any was), tokens and cost so far;
- otherwise (a pipe, a log file): one plain line each time the root starts a turn, and
  one at the end;
- ``--verbose``: also a line per node as it finishes, the root model's replies line by
  line as they are written (where the provider streams), and a line each time a
  provider's adaptive concurrency limit moves (docs/limits.md); ``--quiet``: nothing.

The line shows the providers' current concurrency limits (``limit 28``) once one has
moved.

The end says how the run ended (`RunProgress.outcome`): ``done``, ``interrupted``
(Ctrl-C, a cancellation), ``stopped by <limit>`` or ``failed (<error type>)``. A sub-call
cut by the end of the run is counted as cancelled, never as failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, Literal, Self, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..events import (
    ConcurrencyLimit,
    LimitWarning,
    NodeFinished,
    NodeStarted,
    RunFinished,
    RunStarted,
    TextDelta,
)
from ..graph import NodeKind, NodeStatus
from .output import for_stream, strip_control

__all__ = ["ProgressDisplay", "RunProgress", "add_progress_arguments", "progress_for"]

Mode = Literal["live", "plain", "off"]
_SUB_CALLS = (NodeKind.LLM_CALL, NodeKind.RLM_CALL)
# The error types of a run that was cut from outside rather than failing on its own.
_INTERRUPTIONS = frozenset({"KeyboardInterrupt", "Cancelled", "CancelledError"})


def add_progress_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--verbose`` and ``--quiet`` to a subcommand's parser."""
    group = parser.add_argument_group("progress (on stderr)")
    quiet = group.add_mutually_exclusive_group()
    quiet.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print each node as it finishes, and the root model's code as it is written",
    )
    quiet.add_argument("-q", "--quiet", action="store_true", help="print no progress")


def progress_for(args: argparse.Namespace, stream: TextIO | None = None) -> ProgressDisplay:
    """The display ``--verbose``/``--quiet`` ask for, on ``stream`` (default stderr)."""
    out = stream if stream is not None else sys.stderr
    if getattr(args, "quiet", False):
        mode: Mode = "off"
    else:
        mode = "live" if out.isatty() else "plain"
    return ProgressDisplay(mode, verbose=getattr(args, "verbose", False), stream=out)


class RunProgress:
    """What a run has done so far, from its events."""

    __slots__ = (
        "cancelled",
        "cost",
        "depth",
        "done",
        "error",
        "failed",
        "finished",
        "limits",
        "running",
        "started",
        "stop_reason",
        "tokens",
        "turn",
        "warnings",
    )

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.turn = 0
        self.depth = 0
        self.done = 0
        self.running = 0
        self.failed = 0
        self.cancelled = 0
        self.tokens = 0
        self.cost = 0.0
        self.warnings: list[str] = []
        self.stop_reason: str | None = None
        self.error: str | None = None
        self.finished = False
        self.limits: dict[str, int] = {}  # provider -> its concurrency limit, once moved

    def update(self, event: Any) -> None:
        if isinstance(event, RunStarted):
            self.started = time.monotonic()
        elif isinstance(event, NodeStarted):
            self.depth = max(self.depth, event.depth)
            if event.kind == NodeKind.ROOT_TURN and event.depth == 0:
                self.turn = event.iteration or self.turn + 1
            if event.kind in _SUB_CALLS:
                self.running += 1
        elif isinstance(event, NodeFinished):
            if event.usage is not None:
                self.tokens += event.usage.input_tokens + event.usage.output_tokens
            self.cost += event.cost or 0.0
            if event.kind in _SUB_CALLS:
                self.running -= 1
                if event.status == NodeStatus.OK:
                    self.done += 1
                elif event.status == NodeStatus.CANCELLED:
                    self.cancelled += 1
                else:
                    self.failed += 1
        elif isinstance(event, LimitWarning):
            self.warnings.append(f"{event.limit} {event.fraction:.0%} used")
        elif isinstance(event, ConcurrencyLimit):
            self.limits[event.provider] = event.limit
        elif isinstance(event, RunFinished):
            self.stop_reason = event.stop_reason
            self.error = event.error
            self.finished = True

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def outcome(self) -> str:
        """How the run ended: ``running`` until it has, then ``done``, ``interrupted``
        (Ctrl-C or another cancellation), ``stopped by <limit>`` or ``failed (<type>)``."""
        if not self.finished:
            return "running"
        if self.error is not None:
            kind = self.error.split(":", 1)[0]
            return "interrupted" if kind in _INTERRUPTIONS else f"failed ({kind})"
        if self.stop_reason:
            return f"stopped by {self.stop_reason}"
        return "done"

    def line(self) -> str:
        """The totals as one line of plain text."""
        cancelled = f", {self.cancelled} cancelled" if self.cancelled else ""
        text = (
            f"{self.elapsed:6.1f}s  turn {self.turn}  depth {self.depth}  "
            f"sub-calls {self.done} done, {self.running} running, {self.failed} failed"
            f"{cancelled}  {self.tokens:,} tokens  ${self.cost:.4f}"
        )
        if len(self.limits) == 1:
            text += f"  limit {next(iter(self.limits.values()))}"
        elif self.limits:
            text += "  limits " + " ".join(f"{k}={v}" for k, v in self.limits.items())
        if self.warnings:
            text += "  (" + "; ".join(self.warnings) + ")"
        return text


class LiveLine:
    """One line redrawn a few times a second on a terminal (``mode == "live"``), while
    the ``with`` block runs; subclasses set ``mode`` and ``_console`` and draw `_render`."""

    mode: str
    _console: Console
    _live: Live | None = None

    def _render(self) -> Text:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if self.mode == "live":
            self._live = Live(
                console=self._console,
                get_renderable=self._render,
                refresh_per_second=8,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()


class ProgressDisplay(LiveLine):
    """A listener that shows a run's progress; use it as ``with display:`` around the run.

    Args:
        mode: ``"live"`` (a redrawn line, for a terminal), ``"plain"`` (a line per root
            turn) or ``"off"``.
        verbose: also a line per finished node.
        stream: where to write (stderr in the CLI).

    Set ``redact`` (`Engine.redact`) once the engine is built: the echoed reply goes
    through it, a line at a time.
    """

    def __init__(self, mode: Mode, *, verbose: bool = False, stream: TextIO) -> None:
        self.mode = mode
        self.verbose = verbose and mode != "off"
        self.stream = stream
        self.progress = RunProgress()
        self._console = Console(file=stream, force_terminal=mode == "live", highlight=False)
        self._live: Live | None = None
        # The model may repeat a key it saw: each line shown as the engine records it.
        self.redact: Callable[[str], str] = str
        self._echo = ReplyEcho(lambda line: self._say(self.redact(line)))

    def listeners(self) -> list[Any]:
        """What to pass as ``listeners=`` (nothing when the display is off)."""
        return [] if self.mode == "off" else [self]

    def __call__(self, event: Any) -> None:
        self.progress.update(event)
        if self.verbose and event.depth == 0 and event.kind == NodeKind.ROOT_TURN:
            if isinstance(event, TextDelta):
                self._echo.add(event.offset, event.text)
            elif isinstance(event, NodeFinished):
                self._echo.end()
        if self.verbose and isinstance(event, NodeFinished):
            self._say(_node_line(event))
        elif self.verbose and isinstance(event, ConcurrencyLimit):
            self._say(
                f"  concurrency limit of {event.provider}: {event.limit} "
                f"({event.in_flight} in flight, {event.refused} refused so far)"
            )
        if self.mode == "plain":
            if (
                isinstance(event, NodeStarted)
                and event.kind == NodeKind.ROOT_TURN
                and event.depth == 0
            ):
                self._say("rlm-graph: " + self.progress.line())
            elif isinstance(event, RunFinished):
                self._say("rlm-graph: " + self.progress.line() + "  " + self.progress.outcome)

    def say(self, text: str) -> None:
        """Print a line on the display's stream (above the live line, if one is drawn)."""
        self._say(text)

    def _say(self, text: str) -> None:
        # The model's text and the server's names go to a terminal: without their
        # control sequences (a title, a clipboard write, a cleared screen).
        if self._live is not None:
            self._console.print(Text(strip_control(text)), soft_wrap=True)  # above the live line
        else:
            print(for_stream(self.stream, text), file=self.stream, flush=True)

    def _render(self) -> Text:
        state = self.progress.outcome
        return Text.assemble(("rlm-graph ", "bold"), (f"[{state}] ", "cyan"), self.progress.line())


class ReplyEcho:
    """The root model's reply, shown a line at a time as it streams in (``--verbose``):
    each complete line once, the last one when the turn ends; a retried attempt that
    says something else is marked and shown again from where it differs."""

    __slots__ = ("_say", "_shown", "_text")

    def __init__(self, say: Any) -> None:
        self._say = say
        self._text = ""
        self._shown = 0  # the text before this was printed (always at a line's start)

    def add(self, offset: int, text: str) -> None:
        if offset < len(self._text):
            self._text = self._text[:offset]
            if offset < self._shown:
                self._shown = self._text.rfind("\n") + 1
                self._say("  │ (the reply was retried and goes on differently:)")
        self._text += text
        end = self._text.rfind("\n")
        if end >= self._shown:
            for line in self._text[self._shown : end].split("\n"):
                self._say("  │ " + line)
            self._shown = end + 1

    def end(self) -> None:
        if self._shown < len(self._text):
            self._say("  │ " + self._text[self._shown :])
        self._text, self._shown = "", 0


def _node_line(event: NodeFinished) -> str:
    where = f"depth {event.depth}"
    usage = f" {event.usage.input_tokens + event.usage.output_tokens:,} tok" if event.usage else ""
    error = f"  {event.error_type or 'error'}: {event.error}" if event.error else ""
    hedge = f"  hedged: the duplicate {event.hedge}" if event.hedge else ""
    return (
        f"  {event.node_id:<24} {event.kind!s:<10} {where:<8} {event.status!s:<9} "
        f"{event.duration:7.3f}s{usage}{error}{hedge}"
    )
