"""The body of an answer of `rlm_graph._http.transport.LeanTransport`, read from its
connection: streamed as it comes (`ResponseStream`), or whole (`read_whole`, and
`LeanTransport.fetch` with `as_read`). Reading one whole here costs none of the async
iterators (nor trio's finalizers for them) that reading an ``httpx.Response`` runs.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import httpx
import trio

from . import wire
from .encodings import Inflater, codings_of
from .pacing import next_tick, ticker

__all__ = [
    "MAX_BODY",
    "CONTAINER_BYTES",
    "MAX_JSON_CONTAINERS",
    "TooManyContainers",
    "Decoding",
    "ResponseStream",
    "as_read",
    "body_of",
    "decoded",
    "decoding",
    "over",
    "read_whole",
    "too_many_containers",
]

MAX_BODY = 64 * 1024 * 1024
"""The most bytes of a body read whole (`LeanTransport.fetch`, `read_whole`), as it came
or decoded: a reply is kilobytes, a server sending more is broken or hostile, and the
engine's memory is not its to fill."""

MAX_JSON_CONTAINERS = 1_000_000
"""The most JSON objects and arrays the engine parses in one document from a server (a
reply, an error's body, one streamed event) when they are also dense: more than one in
`CONTAINER_BYTES` bytes. A reply's own are tens, or with ``logprobs`` about one in 22
bytes (24,000 tokens at ``top_logprobs=20``: a million in 21.6 MiB), which is read; the
rest are the braces and brackets of its text. A million empty objects parse in about
0.3 s and 70 MB; the 22 million of a 64 MiB body of ``{},{},...`` (64 KiB of gzip on
the wire) held the loop 2 s and took 1.5 GB."""

CONTAINER_BYTES = 8
"""Bytes per JSON object or array below which a body past `MAX_JSON_CONTAINERS` is
refused (`too_many_containers`): ``{},{},...`` has one in 3 bytes, logprobs one in 22."""


class TooManyContainers(Exception):
    """A streamed event of JSON past `MAX_JSON_CONTAINERS` (`rlm_graph.http.event_object`):
    not a reply, and not retried (the server would send it again)."""


def too_many_containers(data: bytes | str) -> int:
    """How many JSON objects and arrays ``data`` may hold, when that is past
    `MAX_JSON_CONTAINERS` and dense (`CONTAINER_BYTES`), else 0: its ``{`` and ``[``, those in strings too (a few
    hundredths of a second for 64 MiB, where parsing it would hold the loop for seconds).
    ``data`` too short to hold more (each takes two characters) is not counted: the
    events of a streamed reply cost nothing."""
    if len(data) <= 2 * MAX_JSON_CONTAINERS:
        return 0
    if isinstance(data, str):
        count = data.count("{") + data.count("[")
    else:
        count = data.count(b"{") + data.count(b"[")
    dense = count * CONTAINER_BYTES > len(data)
    return count if count > MAX_JSON_CONTAINERS and dense else 0


FLOWING = 16 * 1024
"""A paced read (`ResponseStream`) that brought this many bytes or more is followed by
the next at once, not at the next tick: a reply coming faster than about 160 KB a tick
(a very fast model, a whole reply sent at once) is read at the speed it comes, and each
of those reads still takes many tokens."""


class Connection(Protocol):
    """A connection of the transport, with the response being read on it."""

    response: wire.Response | None


class Reader(Protocol):
    """What a body takes from its transport (`LeanTransport` is one; ``conn`` is one of
    its connections)."""

    async def _receive(self, conn: Any, timeout: float | None) -> int: ...

    def _receive_now(self, conn: Any) -> int | None: ...

    async def _release(self, conn: Any) -> None: ...

    async def _rest(self, conn: Any, timeout: float | None) -> bytes: ...


class ResponseStream(httpx.AsyncByteStream):
    """The body of one response; hands its connection back when read to the end.

    Each piece it yields is everything one read of the socket brought (the HTTP chunks
    in it joined), and with ``pace`` (seconds) it reads the socket at most once a
    ``pace``: a streamed reply's tokens that came meanwhile then cost one wake-up, not
    one each. Those reads fall on the multiples of ``pace`` on trio's clock (`pacing.next_tick`),
    the same instants for every stream of the run, and one timer wakes them all
    (`pacing.ticker`): streams read at once cost the run loop one wake-up, not one each.
    A read takes everything already there (over TLS, every whole record), and one that
    brought `FLOWING` bytes or more is followed by the next at once: pacing never caps
    how fast a reply can come.
    """

    def __init__(
        self,
        transport: Reader,
        conn: Connection,
        read_timeout: float | None,
        pace: float = 0.0,
    ) -> None:
        self._transport = transport
        self._conn = conn
        self._timeout = read_timeout
        self._pace = pace
        self._closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _BodyReader(self)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._transport._release(self._conn)


class _BodyReader:
    """The pieces of one `ResponseStream`, read as its docstring says. A plain object,
    not an async generator: one left half-way (a stream cancelled or interrupted between
    two pieces) leaves nothing for the garbage collector to finalize on a trio run that
    may have ended by then."""

    __slots__ = ("_done", "_next_read", "_response", "_stream")

    def __init__(self, stream: ResponseStream) -> None:
        self._stream = stream
        self._response = stream._conn.response
        self._next_read = -math.inf
        self._done = False

    def __aiter__(self) -> _BodyReader:
        return self

    async def aclose(self) -> None:
        """Read no more (the stream's own `ResponseStream.aclose` hands the connection
        back)."""
        self._done = True

    async def __anext__(self) -> bytes:
        stream = self._stream
        conn, pace, response = stream._conn, stream._pace, self._response
        if response is None or stream._closed or conn.response is not response:
            # Its connection went back to the pool: what it reads now is another's.
            raise httpx.StreamClosed()
        while not self._done:
            pieces = body_of(response)
            if response.done:
                self._done = True
            if pieces:
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if self._done:
                break
            if pace and trio.current_time() < self._next_read:
                await ticker(pace).wait_until(self._next_read)
                # Just woken (a checkpoint): the socket most likely holds what came
                # meanwhile, and taking it at once saves trio's two task switches.
                got = stream._transport._receive_now(conn)
                if got is None:
                    got = await stream._transport._receive(conn, stream._timeout)
            else:
                got = await stream._transport._receive(conn, stream._timeout)
            if pace:
                # A read of `FLOWING` bytes or more: the reply comes faster than a tick
                # takes it, so the next read is at once (each still brings plenty).
                flowing = got >= FLOWING
                self._next_read = -math.inf if flowing else next_tick(trio.current_time(), pace)
        raise StopAsyncIteration


async def read_whole(response: httpx.Response) -> None:
    """Read ``response``'s body, as ``await response.aread()`` does (its content is then
    ``response.content``), but never more than `MAX_BODY` bytes, read or decoded.

    An answer of `LeanTransport.exchange` is read by the transport, as
    `LeanTransport.fetch` reads one (no async iterators, nor trio's finalizers for
    them), its connection handed back; any other response (httpx's own transport)
    through httpx's iterator.

    Raises:
        httpx.RemoteProtocolError: the body, or what it decodes to, is over `MAX_BODY`.
    """
    stream = response.stream
    if isinstance(stream, ResponseStream) and not stream._closed:
        if response.is_stream_consumed:
            raise httpx.StreamConsumed()
        stream._closed = True  # its connection is `_rest`'s to hand back, or to close
        raw = await stream._transport._rest(stream._conn, stream._timeout)
        as_read(response, decoded(response, raw), len(raw))
        return
    try:
        already = response.content  # read before (a test's MockTransport reads it)
    except httpx.ResponseNotRead:
        pass
    else:
        if len(already) > MAX_BODY:
            raise over("is")
        return
    inflater = Inflater(codings_of(response.headers), MAX_BODY, lambda: over("decodes to"))
    pieces: list[bytes] = []
    chunks = response.aiter_raw()  # as they came: decoded here, a bounded piece at a time
    try:
        async for chunk in chunks:
            pieces += inflater.feed(chunk)
    except (httpx.RemoteProtocolError, httpx.DecodingError):
        await _abandon(response, chunks)
        raise
    as_read(response, b"".join(pieces), response.num_bytes_downloaded)


async def _abandon(response: httpx.Response, chunks: AsyncIterator[bytes]) -> None:
    """Stop reading ``response`` through httpx's (nested) iterators ``chunks``: close
    its connection, then let them fail on it, each in turn, so that none is left
    half-way for the garbage collector (closing the outer one alone would leave the
    ones inside it)."""
    await response.aclose()
    with contextlib.suppress(httpx.HTTPError, httpx.StreamError):
        async for _ in chunks:
            pass


def decoded(response: httpx.Response, raw: bytes) -> bytes:
    """``raw``, the body of ``response``, decoded as its ``Content-Encoding`` says (as
    it is, with none), at most `MAX_BODY` bytes (`encodings.Inflater`: a small body that
    inflates without end, a "zip bomb", is cut off a piece past the limit).

    Raises:
        httpx.RemoteProtocolError: it decodes to more than `MAX_BODY` bytes.
        httpx.DecodingError: it is not what its encoding says.
    """
    codings = codings_of(response.headers)
    if not codings:
        return raw
    inflater = Inflater(codings, MAX_BODY, lambda: over("decodes to"))
    return b"".join(inflater.feed(raw))


class Decoding:
    """A streamed body's raw pieces (``raw``), decoded a bounded piece at a time when
    ``inflater`` is set (`encodings.Inflater`); for httpx's own iterators (``response``
    set) closed as `_abandon` says."""

    __slots__ = ("_inflater", "_pending", "_raw", "_response")

    def __init__(
        self,
        raw: AsyncIterator[bytes],
        inflater: Inflater | None,
        response: httpx.Response | None,
    ) -> None:
        self._raw = raw
        self._inflater = inflater
        self._response = response
        self._pending: Iterator[bytes] = iter(())

    def __aiter__(self) -> Decoding:
        return self

    async def __anext__(self) -> bytes:
        if self._inflater is None:
            return await self._raw.__anext__()
        while True:
            piece = next(self._pending, None)
            if piece is not None:
                return piece
            self._pending = self._inflater.feed(await self._raw.__anext__())

    async def aclose(self) -> None:
        if self._response is not None:
            await _abandon(self._response, self._raw)
            return
        close = getattr(self._raw, "aclose", None)
        if close is not None:
            await close()


def decoding(
    response: httpx.Response, raw: AsyncIterator[bytes], lean: bool
) -> AsyncIterator[bytes]:
    """A streamed body's raw pieces as they are to be read (`Decoding`): decoded as
    ``response``'s headers say, and, from httpx's own transport (not ``lean``), closed
    without leaving its iterators half-way; ``raw`` itself when neither is needed."""
    codings = codings_of(response.headers)
    if not codings and lean:
        return raw
    # No limit of its own: `streaming.read_events` holds a stream to `MAX_BODY`, counting
    # the pieces this gives (at most `encodings.PIECE` bytes each).
    inflater = Inflater(codings, sys.maxsize, lambda: over("decodes to")) if codings else None
    return Decoding(raw, inflater, None if lean else response)


def over(what: str) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(
        f"the answer's body {what} over {MAX_BODY // (1024 * 1024)} MiB: not a reply "
        "(the server is broken, or not the API)"
    )


def as_read(response: httpx.Response, content: bytes, downloaded: int) -> None:
    """Leave ``response`` as httpx's ``read`` would: ``content`` (decoded) there, the
    ``downloaded`` bytes (its raw length) counted, its stream consumed and closed;
    without the generators ``read`` runs to join it."""
    response._content = content
    response._num_bytes_downloaded = downloaded
    response.is_stream_consumed = response.is_closed = True


def body_of(response: wire.Response) -> list[bytes]:
    """`wire.Response.body`, its refusals as httpx's."""
    try:
        return response.body()
    except wire.ProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from None
