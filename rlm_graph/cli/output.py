"""What the CLI prints: answers and errors, as text or as one JSON object.

Invariants:
    - With ``--json``, every exit path prints exactly one JSON object on stdout (answers,
      limits, provider errors, bad usage, Ctrl-C), with the same keys each time:
      ``answer``, ``stop_reason``, ``usage``, ``execution_time``, ``exit_code`` and
      ``error`` (``null``, or ``{"type", "message", "exit_code"}``). Its texts are whole
      UTF-8: a lone surrogate is U+FFFD, as in text mode.
    - Without ``--json``, an error is one line on stderr, ``rlm-graph <command>: ...``.
    - Text from a model or a server is untrusted: printed to a terminal, its control
      sequences (ANSI CSI, OSC window titles and hyperlinks, other escapes and C0/C1
      control characters but newline and tab) are removed, so an answer cannot clear the
      screen, retitle the window or forge a prompt. Printed to a pipe or a file it is
      left as is (the bytes the model wrote).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from .._files import same_file, utf8_text
from .._json import dumps as finite_dumps
from ..tracing.scrub import without_url_passwords

__all__ = ["Output", "for_stream", "on_terminal", "overwrite_problem", "strip_control"]

# ESC-introduced sequences: CSI (ESC [ ... final byte), OSC/DCS/SOS/PM/APC strings (ending
# in BEL or ESC \), and two-byte escapes; then the 8-bit forms (CSI 0x9b, OSC 0x9d...);
# then any other C0/C1 control character except tab and newline; then the bidirectional
# overrides and isolates (U+202A-202E, U+2066-2069), which reorder what follows them on
# the line (a reply's "txt.exe" shown as "exe.txt"); the marks U+200E/200F stay.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x9c|\x1b\\)?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"
)


def strip_control(text: str) -> str:
    """``text`` without terminal control sequences (newlines and tabs kept; a carriage
    return is dropped, since it lets a line overwrite what the terminal showed) nor
    bidirectional overrides (which make a line show its text in another order)."""
    return _CONTROL.sub("", text)


def on_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (control sequences written there act)."""
    isatty = getattr(stream, "isatty", None)
    return callable(isatty) and bool(isatty())


def for_stream(stream: TextIO, text: str) -> str:
    """``text`` as it may be written to ``stream``: stripped of control sequences when
    that is a terminal, each lone surrogate (half a character a reply may hold, which no
    stream can write) as U+FFFD."""
    text = utf8_text(text)
    return strip_control(text) if on_terminal(stream) else text


_BESIDE = {"-wal": "write-ahead log", "-shm": "shared-memory file"}


def overwrite_problem(
    flag: str, output: str | os.PathLike[str], reads: Iterable[tuple[str, Any]]
) -> str | None:
    """What writing ``output`` would destroy, said before anything is written: ``reads``
    are ``(what, path)`` of the files the command reads or keeps (a path None or ``-``
    is none), each with the ``-wal`` and ``-shm`` files SQLite keeps beside a journal;
    None when ``output`` is none of them (another spelling, a link, a hard link count).
    """
    for what, path in reads:
        if path is None or os.fspath(path) in ("", "-"):
            continue
        for suffix in ("", "-wal", "-shm"):
            if same_file(output, f"{os.fspath(path)}{suffix}"):
                which = f"the {_BESIDE[suffix]} of {what} ({path}{suffix})" if suffix else what
                return (
                    f"{flag} {os.fspath(output)} is {which}: writing there would destroy "
                    "it; give another path"
                )
    return None


class Output:
    """Prints one command's outcome, as text or as one JSON object.

    Args:
        command: the subcommand's name, for error lines (``rlm-graph run: ...``).
        as_json: print one JSON object on stdout instead of text.
    """

    def __init__(self, command: str, *, as_json: bool) -> None:
        self.command = command
        self.as_json = as_json

    def line(self, text: str, *, stream: TextIO | None = None) -> None:
        """A line of text, as `for_stream` makes it for its stream."""
        out = stream or sys.stdout
        print(for_stream(out, text), file=out)

    def note(self, text: str) -> None:
        """A line on stderr (text mode only: JSON mode keeps stderr for real trouble)."""
        if not self.as_json:
            self.line(text, stream=sys.stderr)

    def result(
        self,
        code: int,
        *,
        answer: str | None,
        stop_reason: str | None = None,
        result: Any = None,
        error: BaseException | None = None,
        message: str | None = None,
        kind: str | None = None,
    ) -> int:
        """Print the outcome and return ``code``, the exit code.

        Args:
            code: the exit code.
            answer: the answer (or the partial answer), if there is one.
            stop_reason: what stopped the run early (a limit, ``"provider_error"``).
            result: the ``RLMChatCompletion`` (full or partial), for usage and time.
            error: the error that ended the command, if any.
            message: the error line to print (default ``str(error)``).
            kind: the error's type name in JSON (default the exception's class name).
        """
        summary = getattr(result, "usage_summary", None)
        elapsed = getattr(result, "execution_time", None)
        text = _said(message, error)
        if self.as_json:
            payload = {
                "answer": answer if answer or error is None else None,  # failed, none: null
                "stop_reason": stop_reason,
                "usage": summary.to_dict() if summary is not None else None,
                "execution_time": elapsed,
                "exit_code": code,
                "error": None
                if text is None
                else {
                    "type": kind or (type(error).__name__ if error is not None else "Error"),
                    "message": text,
                    "exit_code": code,
                },
            }
            print(finite_dumps(payload, indent=2))  # not Infinity, nor "\ud800"
            return code
        if stop_reason is not None and answer is not None:
            what = "partial answer" if answer else "no partial answer"
            self.line(f"[stopped by {stop_reason}; {what}]", stream=sys.stderr)
        if answer:
            self.line(answer)
        if summary is not None and elapsed is not None:
            self.line(_usage_line(summary, elapsed), stream=sys.stderr)
        replay = getattr(result, "replay", None)
        if replay is not None and replay.replayed:
            self.line(
                f"[{replay.replayed} of {replay.replayed + replay.live + replay.diverged} calls "
                f"replayed from the journal, {replay.tokens_saved:,} tokens not asked again; "
                "the line above counts them too]",
                stream=sys.stderr,
            )
        if text is not None:
            self.line(f"rlm-graph {self.command}: {text}", stream=sys.stderr)
        return code

    def error(self, code: int, text: str, *, kind: str, error: BaseException | None = None) -> int:
        """An error before or instead of any answer: one line (or one JSON object)."""
        return self.result(code, answer=None, error=error, message=text, kind=kind)


def _said(message: str | None, error: BaseException | None) -> str | None:
    """The error line's text (default ``str(error)``), a URL's password in it unsaid."""
    text = message if message is not None else (str(error) if error is not None else None)
    return without_url_passwords(text) if text is not None else None


_ESTIMATED = "the server reported none, or a hedged duplicate was cancelled"
"""Why a call's tokens are estimates (`rlm_graph.contracts.Usage.estimated`)."""


def _usage_line(summary: Any, elapsed: float) -> str:
    cost = summary.total_cost
    estimated = sum(m.estimated_calls or 0 for m in summary.model_usage_summaries.values())
    return (
        f"[{summary.total_calls} call{'' if summary.total_calls == 1 else 's'}, {summary.total_input_tokens:,} input and "
        f"{summary.total_output_tokens:,} output tokens"
        + (f" (estimated for {estimated}: {_ESTIMATED})" if estimated else "")
        + (f", ${cost:.4f}" if cost is not None else "")
        + f", {elapsed:.1f} s]"
    )
