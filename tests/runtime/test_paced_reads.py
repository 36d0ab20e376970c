"""A streamed body read at a pace: several streams read together, on the same ticks.

The lean transport's responses are read here over in-memory streams (no sockets), so
trio's MockClock can jump: the instants the tests see are exactly the reads' instants.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import ssl
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from rlm_graph._http import wire
from rlm_graph._http.bodies import ResponseStream
from rlm_graph._http.transport import LeanTransport, _Connection

PACE = 0.1
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _serve(stream: trio.abc.Stream, start: float, gap: float, count: int) -> None:
    """An answer whose body comes a chunk every ``gap`` seconds after ``start``."""
    await trio.sleep(start)
    await stream.send_all(HEAD)
    for i in range(count):
        await stream.send_all(b"%x\r\n%s\r\n" % (len(b"%d;" % i), b"%d;" % i))
        await trio.sleep(gap)
    await stream.send_all(b"0\r\n\r\n")


async def _send_at_once(stream: trio.abc.Stream, chunk: bytes, count: int) -> None:
    """An answer whose body is ``count`` chunks of ``chunk``, each its own write."""
    await stream.send_all(HEAD)
    for _ in range(count):
        await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    await stream.send_all(b"0\r\n\r\n")


async def _read(transport: LeanTransport, stream: trio.abc.Stream) -> list[tuple[float, bytes]]:
    """The body of the answer on ``stream``: each piece with the instant it was read."""
    conn = _Connection(stream, ("http", "example.test", 80))
    response = conn.response = wire.Response()
    while not response.head():
        assert await transport._receive(conn, None), "the server closed before its answer"
    body = ResponseStream(transport, conn, None, PACE)
    async with contextlib.aclosing(body.__aiter__()) as chunks:
        pieces = [(trio.current_time(), piece) async for piece in chunks]
    await body.aclose()
    return pieces


async def test_concurrent_streams_read_on_shared_ticks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = LeanTransport()
    reads: dict[int, list[tuple[float, bytes]]] = {}

    async def one(i: int) -> None:
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, server, 0.007 * i, 0.02, 40)
            reads[i] = await _read(transport, client)

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)

    for pieces in reads.values():  # every byte, in order
        assert b"".join(p for _, p in pieces) == b"".join(b"%d;" % n for n in range(40))
    later = [[t for t, _ in pieces[1:]] for pieces in reads.values()]
    instants = {t for times in later for t in times}
    # After its first read, each stream reads on the multiples of the pace (there is
    # always something new by then): the eight streams share one instant per pace,
    # 0.1 s to 0.9 s, where each reading on its own would make eight times as many.
    assert all(math.isclose(t / PACE, round(t / PACE)) for t in instants)
    assert len(instants) <= 9
    assert all(b - a >= PACE * 0.999 for times in later for a, b in itertools.pairwise(times))


async def test_a_reply_that_comes_faster_than_the_ticks_is_read_as_fast_as_it_comes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 4 MiB sent at once (a very fast model, a whole reply in one go): at one read of the
    # socket per tick that was 64 reads and 6.4 s however fast it came; a read that
    # brought plenty is followed by the next at once.
    transport = LeanTransport()
    piece = b"x" * 65536
    client, server = trio.testing.memory_stream_pair()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_send_at_once, server, piece, 64)
        pieces = await _read(transport, client)
    assert b"".join(p for _, p in pieces) == piece * 64
    assert trio.current_time() < PACE  # not one tick waited


@pytest.mark.parametrize("tls", [False, True])
async def test_events_that_came_meanwhile_are_all_read_at_the_tick(
    tls: bool,
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 300 events of 200 bytes, each flushed on its own (each its own TLS record, as a
    # server that flushes every token sends them), all there before the first tick: a
    # TLS read takes one record, and one read a tick would have taken 30 s.
    client: trio.abc.Stream
    server: trio.abc.Stream
    client, server = trio.testing.memory_stream_pair()
    if tls:
        server_ctx, client_ctx = tls_pair
        client = trio.SSLStream(client, client_ctx, server_hostname="localhost")
        server = trio.SSLStream(server, server_ctx, server_side=True)
    event = b"data: " + b"t" * 192 + b"\n\n"

    async with trio.open_nursery() as nursery:
        if isinstance(client, trio.SSLStream) and isinstance(server, trio.SSLStream):
            nursery.start_soon(server.do_handshake)
            await client.do_handshake()
        nursery.start_soon(_send_at_once, server, event, 300)
        await trio.sleep(0.01)  # every event sent before the body is read
        pieces = await _read(LeanTransport(), client)
    assert b"".join(p for _, p in pieces) == event * 300
    assert trio.current_time() < 0.01 + 2 * PACE


async def test_an_event_is_not_held_back_by_a_tls_record_half_arrived(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Event A's record whole, then half of the next record (the rest a second later, as
    # after a lost segment): A is handed on at its tick, not when the next record ends.
    server_ctx, client_ctx = tls_pair
    raw_client, raw_server = trio.testing.memory_stream_pair()
    client = trio.SSLStream(raw_client, client_ctx, server_hostname="localhost")
    server = trio.SSLStream(raw_server, server_ctx, server_side=True)
    event_a = b"5\r\nA;A;A\r\n"
    event_b = b"%x\r\n%s\r\n0\r\n\r\n" % (4000, b"b" * 4000)

    async def serve() -> None:
        await server.send_all(HEAD)
        await trio.sleep(0.3)
        # Each event its own record, the second cut in two on the wire (trio's own
        # objects: its stream writes whole records only).
        tls, outgoing = server._ssl_object, server._outgoing
        tls.write(event_a)
        first = outgoing.read()
        tls.write(event_b)
        second = outgoing.read()
        await raw_server.send_all(first + second[: len(second) // 2])
        await trio.sleep(1.0)
        await raw_server.send_all(second[len(second) // 2 :])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        await client.do_handshake()
        nursery.start_soon(serve)
        pieces = await _read(LeanTransport(), client)
    assert b"".join(p for _, p in pieces) == b"A;A;A" + b"b" * 4000
    assert [t for t, p in pieces if p.startswith(b"A;A;A")][0] < 1.0


async def test_a_stream_cancelled_while_it_waits_leaves_the_others_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    transport = LeanTransport()
    pairs = [trio.testing.memory_stream_pair() for _ in range(3)]
    first = trio.CancelScope()  # the first stream to wait holds the ticks' timer
    kept: list[list[tuple[float, bytes]]] = []

    async def reader(i: int) -> None:
        with first if i == 0 else trio.CancelScope():
            pieces = await _read(transport, pairs[i][0])
            kept.append(pieces)

    with trio.fail_after(5):  # virtual seconds: a stranded stream would wait forever
        async with trio.open_nursery() as nursery:
            for i, (_, server) in enumerate(pairs):
                nursery.start_soon(_serve, server, 0.0, 0.02, 20)
                nursery.start_soon(reader, i)
                await trio.sleep(0)
            await trio.sleep(0.05)
            first.cancel()
    assert first.cancelled_caught and len(kept) == 2
    for pieces in kept:
        assert b"".join(p for _, p in pieces) == b"".join(b"%d;" % n for n in range(20))
        times = [t for t, _ in pieces[1:]]
        assert all(math.isclose(t / PACE, round(t / PACE)) for t in times)
        assert times[-1] <= 20 * 0.02 + PACE  # read to its end within a pace of it


async def test_reading_events_closes_the_body_when_stopped_between_chunks() -> None:
    # A Ctrl-C (SIGTERM, SIGHUP) in the parse leaves the body's iterators half-way, held
    # by the interrupt's traceback: collected after the run has ended, an async generator
    # could no longer be finalized ("Exception ignored in: <async_generator ...>" on the
    # way out of `rlm-graph run`). read_events closes the body before the error leaves.
    from rlm_graph._http.streaming import read_events
    from rlm_graph.contracts import ChatResponse

    closed: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            closed.append(True)

    class Stop(Exception):
        pass

    class Parser:
        def feed(self, event: str, data: str) -> str:
            raise Stop  # as a Ctrl-C in the parse would

        def result(self) -> ChatResponse:
            raise AssertionError("not reached")

    class Tracker:
        def feed(self, text: str) -> bool:
            return False

    chunks = body()
    with pytest.raises(Stop):
        await read_events(chunks, Parser(), Tracker(), lambda: None, lambda: None)
    assert closed == [True]  # closed before the error left read_events
