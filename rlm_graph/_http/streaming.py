"""Streamed replies: server-sent events as they arrive, and the text a sink is given.

`JSONProvider.stream` reads a streamed answer with the pieces here:

    bytes --SSEDecoder--> (event, data) --the API's StreamParser--> text --DeltaTracker--> sink

Invariants:
    - The sink sees the reply's text once, in order, whatever the retries: a retried
      attempt's text is matched against what the sink was already given, and only what
      goes beyond it (or, where the retried text differs, what replaces it from there
      on: ``sink(offset, text)`` with ``offset`` before the end) is handed on. When the
      call returns, the sink has been given exactly the reply's ``content``.
    - Usage, the finish reason and the model are the parser's, read from the attempt
      that completed; a cut attempt's partial usage counts nowhere (as a truncated 200).
    - A sink that answers True has what it wants: the reading stops (`read_events` calls
      ``halt``), and the reply is what came so far (`StreamParser.partial`).
    - A reply is whole at the API's end marker, or at a finish reason with no text after
      it (``whole``): the reading then stops within `END_GRACE` of the end marker,
      whatever the server sends or holds back after it (`read_reply`); after a finish
      reason, when the attempt's stall deadline passes with no more progress, the reply
      is taken as it is (`whole_reply`), not retried.
    - Parsing and the reading's own bounds; the attempt itself (deadlines, retries) is
      the provider's.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import trio

from ..contracts import ChatResponse, TextSink
from . import bodies

__all__ = [
    "END_GRACE",
    "MAX_EVENT",
    "DeltaTracker",
    "Oversized",
    "SSEDecoder",
    "StreamParser",
    "read_events",
    "read_reply",
    "whole_reply",
]

MAX_EVENT = 4 * 1024 * 1024
"""The most bytes of one server-sent event (a token's chunk is a few hundred; a whole
reply sent as one event, a few hundred thousand)."""


class Oversized(Exception):
    """A streamed answer past what the engine reads: an event over `MAX_EVENT` bytes,
    or a body over `bodies.MAX_BODY` (the message says which)."""


class StreamParser(Protocol):
    """Reads one attempt's server-sent events into text and, at the end, the reply.

    A provider makes a fresh one per attempt (`JSONProvider._stream_parser`).

    A parser may also keep ``progress``, an int it raises for each event that shows the
    model at work without adding text (reasoning, a tool call, usage, a finish reason):
    such an event starts the stall deadline again, as text and the end marker do. Any
    other event (an empty one, ``{"choices": []}``, an empty delta, Anthropic's
    ``ping``) counts as a keep-alive comment does (`QUIET_FLOOR`). Without it, only text
    and the end marker are progress.

    It may also keep ``whole``, True while a finish reason has come with no text after it
    (OpenAI-compatible servers send the usage, then the end marker, after it): the reply
    is then taken when the stall deadline passes with no more progress (`whole_reply`),
    and `result` gives it, whether the end marker came or not. Without it, only the end marker makes a reply whole.
    """

    finished: bool
    """The API's end marker has come (no more events are expected)."""

    def feed(self, event: str, data: str) -> str:
        """The text an event adds to the reply (``""`` for none).

        Raises:
            BadResponse: the event is not the API's shape, or says the server failed
                mid-answer (an error event): the attempt is retried.
        """
        ...

    def partial(self) -> ChatResponse:
        """The reply so far, for a stream the engine stopped (``finish_reason``
        ``"engine_stop"``; usage as far as the server said, else none: estimated)."""
        ...

    def result(self) -> ChatResponse:
        """The reply, once the stream has ended.

        Raises:
            BadResponse: the stream ended before the API's end marker (cut off): the
                attempt is retried like a truncated 200.
        """
        ...


END_GRACE = 0.25
"""Seconds a streamed body's end may take after the API's end marker (the connection is
then reused): a server holding the stream open, or sending comments, is not waited for."""

QUIET_FACTOR = 8.0
QUIET_FLOOR = 3600.0
"""A stream may send keep-alives alone (comments, or events that are not progress:
`StreamParser`) for `QUIET_FACTOR` attempt timeouts, and at least `QUIET_FLOOR` seconds
(a hidden-reasoning model behind a gateway that pings may think for many minutes), before
they no longer count as the server heard (`_Hearing`)."""


async def read_events(
    chunks: AsyncIterator[bytes],
    parser: StreamParser,
    tracker: DeltaTracker,
    heard: Callable[[], None],
    halt: Callable[[], None],
    ended: Callable[[float], None] = lambda grace: None,
    timeout: float | None = None,
) -> ChatResponse:
    """A streamed body, chunk by chunk (``heard()`` after each that brought progress,
    keep-alives alone only for a while: `_Hearing`), through ``parser`` into ``tracker``;
    the reply. When the sink says it has what it wants, ``halt()`` (the provider cancels
    the reading, then takes ``parser.partial()``). Once the API's end marker has come,
    ``ended(END_GRACE)``, and no more ``heard()``: the provider gives the body's end a
    moment to come (the connection is then reused), then halts, whatever the server
    sends or holds back after it. Once the reply is whole without it (``whole``: a
    finish reason), the reading goes on for what follows (the usage, the end marker,
    text of a server that names a finish reason early) under the attempt's stall
    deadline, which only progress starts again (keep-alives do not, then): when it
    passes, the provider takes the reply (`whole_reply`) instead of a timeout.

    The reading stops at an event that fails the attempt (a server that then goes silent,
    or sends only comments, would hold the call). Once the reply is whole, it is whole
    however the connection ends (closed or reset before the body's own end).
    However the reading stops, the iterator is closed here: collected after its trio run
    has ended, it could not be finalized.

    Raises:
        BadResponse: an event failed the attempt, or the stream ended early.
        Oversized: the body passed `bodies.MAX_BODY` bytes (or an event `MAX_EVENT`):
            the reading stops there.
        Exception: any other error of ``parser.feed`` (a plugin's parser that met a shape
            it did not check): the provider makes it a retried `BadResponse`.
    """
    reading = _Reading(parser, tracker, _Hearing(heard, timeout), halt, ended)
    try:
        while reading.failed is None and (chunk := await _next(chunks, reading.whole)) is not None:
            reading.feed(chunk)
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            with trio.CancelScope(shield=True):
                await close()
    if reading.failed is not None:
        raise reading.failed
    return parser.result()


async def read_reply(
    chunks: AsyncIterator[bytes],
    parser: StreamParser,
    tracker: DeltaTracker,
    heard: Callable[[], None],
    timeout: float | None,
) -> ChatResponse:
    """The reply of a streamed body (`read_events`): whole, or, when the sink had what it
    wanted first, what came so far (``parser.partial()``). Once the end marker has come,
    the reading stops within `END_GRACE`.

    Raises:
        Exception: as `read_events`; the provider makes it the attempt's failure.
    """
    with trio.CancelScope() as halt:  # cancelled: the sink is content, or the grace is over

        def ended(grace: float) -> None:
            halt.deadline = trio.current_time() + grace

        return await read_events(chunks, parser, tracker, heard, halt.cancel, ended, timeout)
    return parser.result() if _whole(parser) else parser.partial()


class _Reading:
    """One attempt's reading of a stream (`read_events`), chunk by chunk."""

    __slots__ = (
        "decoder",
        "done",
        "ended",
        "failed",
        "halt",
        "hearing",
        "parser",
        "size",
        "tracker",
        "whole",
    )

    def __init__(
        self,
        parser: StreamParser,
        tracker: DeltaTracker,
        hearing: _Hearing,
        halt: Callable[[], None],
        ended: Callable[[float], None],
    ) -> None:
        self.parser, self.tracker, self.hearing = parser, tracker, hearing
        self.halt, self.ended = halt, ended
        self.decoder = SSEDecoder()
        self.size = 0
        self.done = False  # the end marker has come: the chunks after it are not read
        self.whole = False  # the reply is whole (`_whole`): the connection may end
        self.failed: Exception | None = None  # raised once the body is closed

    def feed(self, chunk: bytes) -> None:
        """Read ``chunk``: its events' text to the tracker, ``heard()`` if they were
        progress; an error of the parser's in ``failed``.

        Raises:
            Oversized: the body passed `bodies.MAX_BODY` bytes, or an event `MAX_EVENT`.
        """
        self.size += len(chunk)
        if self.size > bodies.MAX_BODY:  # a reply is kilobytes: a server without end, cut off
            raise Oversized(f"an answer over {bodies.MAX_BODY // (1024 * 1024)} MiB")
        if self.done:
            return
        parser = self.parser
        before = _progress(parser)
        try:  # one piece of text per read: the sink's work is per read, not per token
            text = "".join([parser.feed(e, d) for e, d in self.decoder.feed(chunk)])
        except Oversized:
            raise
        except Exception as exc:  # the reading stops; raised once the body is closed
            self.failed = exc
            return
        progressed = bool(text) or parser.finished or _progress(parser) != before
        if progressed or not self.whole:  # once whole, keep-alives do not hold it open
            self.hearing(progressed)
        if self.tracker.feed(text):
            self.halt()
        if parser.finished:
            self.done = True
            self.ended(END_GRACE)
        self.whole = _whole(parser)  # a finish reason with no text after it, or the end


def _whole(parser: StreamParser) -> bool:
    """The reply is whole: the end marker came, or a finish reason (`StreamParser`)."""
    return parser.finished or getattr(parser, "whole", False) is True


def whole_reply(parser: StreamParser | None) -> ChatResponse | None:
    """The reply of a stream whose stall deadline passed (the provider's), if it was
    whole by then (a finish reason with no text after it): a server that holds the
    stream open after its last words has given them. None: a timeout."""
    return parser.result() if parser is not None and _whole(parser) else None


def _progress(parser: StreamParser) -> int:
    """The parser's count of events that were progress (`StreamParser`); 0 without one."""
    count: int = getattr(parser, "progress", 0)
    return count


class _Hearing:
    """``heard()`` for a chunk that brought progress (`StreamParser`); for one of
    keep-alives alone (comments: ``: PROCESSING``; events that are not progress: an empty
    delta, Anthropic's ``ping``), only for a while after the last progress
    (`QUIET_FLOOR`): a gateway that only pings, wedged, held the call until the body's
    size cap (weeks)."""

    def __init__(self, heard: Callable[[], None], timeout: float | None) -> None:
        self.heard = heard
        self.quiet = max(QUIET_FACTOR * timeout, QUIET_FLOOR) if timeout else math.inf
        self.last = trio.current_time()  # of the last progress

    def __call__(self, progressed: bool) -> None:
        now = trio.current_time()
        if progressed:
            self.last = now
        if progressed or now - self.last < self.quiet:
            self.heard()


async def _next(chunks: AsyncIterator[bytes], whole: bool) -> bytes | None:
    """The body's next chunk; None at its end, and once the reply is ``whole`` when the
    connection was closed or reset before it."""
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None
    except Exception:
        if whole:
            return None
        raise


_BOM = b"\xef\xbb\xbf"


class SSEDecoder:
    """Splits a ``text/event-stream`` body into ``(event, data)`` pairs (the WHATWG
    format: ``event:`` and ``data:`` fields, events ended by a blank line, ``:`` comments;
    ``data`` lines of one event joined by ``"\\n"``)."""

    __slots__ = ("_cr", "_head", "_pending", "_size")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # an event's bytes so far, line ends made "\n"
        self._size = 0  # their length
        self._cr = False  # the last chunk ended in "\r": a "\n" first in the next is its
        self._head: bytes | None = b""  # the stream's first bytes, until a BOM is ruled out

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The events completed by ``chunk``, in order. Each byte is looked at once: an
        event that comes in many chunks is joined when it ends, not at every chunk.

        Raises:
            Oversized: an event has passed `MAX_EVENT` bytes without its end.
        """
        if self._head is not None:  # the format's one byte-order mark, first: dropped
            chunk = self._head + chunk
            if len(chunk) < 3 and _BOM.startswith(chunk):
                self._head = chunk
                return []
            self._head = None
            chunk = chunk[3:] if chunk.startswith(_BOM) else chunk
        if not chunk:
            return []
        if self._cr and chunk[:1] == b"\n":  # the "\n" of a "\r\n" cut in two
            chunk = chunk[1:]
        self._cr = chunk[-1:] == b"\r"
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = chunk.rfind(b"\n\n")
        pending = self._pending
        if end < 0 and pending and chunk[:1] == b"\n" and pending[-1].endswith(b"\n"):
            end = -1  # the blank line falls between the two chunks
        elif end < 0:
            if chunk:
                pending.append(chunk)
                self._size += len(chunk)
            if self._size > MAX_EVENT:  # cut off, not kept on
                raise Oversized(f"an event over {MAX_EVENT // (1024 * 1024)} MiB")
            return []
        head = b"".join(pending) if pending else b""
        data = head + chunk[: max(end, 0)] if end >= 0 else head[:-1]
        rest = chunk[end + 2 :]
        self._pending = [rest] if rest else []
        self._size = len(rest)
        events = []
        # Bytes that are not UTF-8 read as U+FFFD, as the event-stream format says.
        for block in data.decode("utf-8", errors="replace").split("\n\n"):
            if block.startswith("data: ") and "\n" not in block:  # the common one-liner
                events.append(("message", block[6:]))
                continue
            name, lines, errors = "message", [], []
            for line in block.split("\n"):
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "data":
                    lines.append(value)
                elif field == "event":
                    name = value
                elif field == "error":  # llama.cpp's server: `error: {...}`, no data
                    errors.append(value)
            if errors:
                events.append(("error", "\n".join(errors)))
            elif lines:
                events.append((name, "\n".join(lines)))
        return events


class DeltaTracker:
    """Hands each attempt's text to a sink so that it sees the reply once (see the
    module's invariants). `begin` before each attempt, `feed` its text, `finish` when it
    completes."""

    __slots__ = ("_given", "_length", "_matching", "_pieces", "_position", "_sink")

    def __init__(self, sink: TextSink) -> None:
        self._sink = sink
        self._pieces: list[str] = []  # what the sink was given, in order
        self._length = 0  # its length
        self._given = ""  # the same as one text, while a retry is matched against it
        self._matching = False
        self._position = 0  # where the retried attempt has reached

    def begin(self) -> None:
        """A new attempt starts: its text will be matched against what was given."""
        if self._length:
            self._given = "".join(self._pieces)
            self._pieces = [self._given]
            self._matching, self._position = True, 0

    def feed(self, text: str) -> bool:
        """The next text of the current attempt; True when the sink wants no more."""
        if not text:
            return False
        if self._matching:
            text = self._match(text)
            if not text:
                return False
        stop = self._sink(self._length, text)
        self._pieces.append(text)
        self._length += len(text)
        return bool(stop)

    def _match(self, text: str) -> str:
        """Swallow what agrees with what was given; what is left to hand on (after a
        rewind of the sink where the texts differ)."""
        given, position = self._given, self._position
        end = position + len(text)
        if end <= len(given) and given.startswith(text, position):
            self._position = end
            return ""
        same = 0
        limit = min(len(text), len(given) - position)
        while same < limit and text[same] == given[position + same]:
            same += 1
        self._matching, self._given = False, ""
        differs_at = position + same
        if differs_at < self._length:  # the texts differ: replace from there on
            self._pieces = [given[:differs_at]]
            self._length = differs_at
        return text[same:]

    def finish(self) -> None:
        """The current attempt completed: a retried text shorter than what was given
        takes the rest back (``sink(offset, "")``)."""
        if self._matching and self._position < self._length:
            self._sink(self._position, "")
            self._pieces = [self._given[: self._position]]
            self._length = self._position
        self._matching, self._given = False, ""
