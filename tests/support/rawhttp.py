"""A hand-written HTTP/1.1 server on 127.0.0.1 that says exactly what a test's handler
says: for answers no fake API server would send (cut bodies, bad framing, odd JSON)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import trio

Handler = Callable[[trio.abc.Stream, int], Awaitable[bool]]
"""``handler(stream, index) -> keep_open``: answer one request read from ``stream``."""


async def read_request(stream: trio.abc.Stream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head


@asynccontextmanager
async def raw_server(
    handler: Handler, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[int, dict[str, int]]]:
    """A hand-written HTTP/1.1 server on 127.0.0.1 speaking exactly what ``handler`` says."""
    stats = {"connections": 0, "requests": 0, "in_flight": 0, "peak": 0}

    async def serve(stream: trio.abc.Stream) -> None:
        stats["connections"] += 1
        if tls is not None:
            stream = trio.SSLStream(stream, tls, server_side=True)
        try:
            while await read_request(stream):
                stats["requests"] += 1
                stats["in_flight"] += 1
                stats["peak"] = max(stats["peak"], stats["in_flight"])
                try:
                    keep = await handler(stream, stats["requests"])
                finally:
                    stats["in_flight"] -= 1
                if not keep:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield port, stats
        nursery.cancel_scope.cancel()


def plain_response(body: bytes, *, chunked: bool = False, close: bool = False) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    if close:
        head += b"Connection: close\r\n"
    if not chunked:
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    parts = [body[i : i + 3] for i in range(0, len(body), 3)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
