"""A lean HTTP/1.1 transport for httpx over trio streams (the wire format: `wire`).

httpx stays the API (requests, responses, timeouts, errors); this replaces only the
connection pool under it, which on a 2-core machine is most of a sub-call's engine cost
(docs/benchmarks.md has the measurement and the command).

What it does:
    - HTTP/1.1 with keep-alive: a connection goes back to its origin's idle list once a
      response was read to the end, and is reused (newest first);
    - request bodies of known length or streamed (read whole, sent with
      ``Content-Length``); response bodies framed by ``Content-Length``, chunked, or
      the connection's close (`wire.Response`, which also says what is refused);
    - connection loss: an idle connection the server closed is dropped before use (a
      ``poll`` of the socket before every reuse); a request is never sent twice. When
      the connection fails while the request is being written, it provably never reached
      the server whole (part of it was never handed to the kernel), and `RequestNotSent`
      says so: the caller may send it again at no risk. When it fails after the request
      was written (even with no byte of an answer), the server may have acted on it;
      that is an ``httpx.RemoteProtocolError`` or ``ReadError``, and whether to send the
      request again (a POST can bill a completion twice) is the caller's decision, made
      and counted in one place (`rlm_graph._http.provider`);
    - TLS for ``https`` (``trio.SSLStream``, certificate checks on by default);
    - httpx timeouts (``connect``, ``read``, ``write``, ``pool``), as httpx exceptions;
    - for a caller that holds its own deadline (the provider), a request without an
      ``httpx.Request``: `LeanTransport.exchange` (the body still to read) and
      `LeanTransport.fetch` (the answer read whole, its connection already back).

What it does not do: proxies (callers fall back to httpx's own transport when one is
configured; see `proxy_configured`), HTTP/2, ``Expect: 100-continue``, upgrades.

Invariants:
    - At most ``max_connections`` connections exist at once; a request waits for one
      (up to the ``pool`` timeout).
    - Every connection is closed exactly once: on error, on a response not read to the
      end, on expiry, or by `aclose`. A response must be closed (httpx does it).
"""

from __future__ import annotations

import functools
import ssl
import time
import urllib.request
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx
import trio

from ..concurrency.tokens import take
from . import bodies, wire
from .bodies import ResponseStream, as_read, body_of, decoded, over
from .sockets import READ_SIZE, plain, read_now, read_when_ready, write_all

__all__ = [
    "PACE",
    "LeanTransport",
    "LoopClient",
    "RequestNotSent",
    "proxy_configured",
    "shared_ssl_context",
]

PACE = "rlm_graph.read_pace"
"""The request extension that sets the seconds between two reads of the response body
(`bodies.ResponseStream`): a streamed reply's tokens are read in batches."""

Origin = tuple[str, str, int]
_NO_TIMEOUTS: Mapping[str, float | None] = {}
_CONNECTION_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def proxy_configured() -> bool:
    """Whether the environment names an HTTP(S) proxy (``HTTPS_PROXY``, ``ALL_PROXY``...)."""
    proxies = urllib.request.getproxies()
    return any(proxies.get(scheme) for scheme in ("http", "https", "all"))


class RequestNotSent(httpx.WriteError):
    """The connection failed before the whole request was written: the server cannot have
    acted on it, so sending it again (on a fresh connection) is safe."""


class _Connection:
    """One socket (or TLS stream), and the response being read on it."""

    __slots__ = ("idle_since", "origin", "response", "stream")

    def __init__(self, stream: trio.abc.Stream, origin: Origin) -> None:
        self.stream = stream
        self.origin = origin
        self.response: wire.Response | None = None
        self.idle_since = 0.0

    def looks_alive(self) -> bool:
        """An idle connection with something to read has been closed by the server (or
        sent what no request asked for: never read as the next request's answer)."""
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            if _tls_buffered(stream):
                return False
            stream = stream.transport_stream
        sock = getattr(stream, "socket", None)
        return sock is not None and not sock.is_readable()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


def _records_waiting(stream: trio.SSLStream[Any]) -> bytes:
    """The data of every whole TLS record ``stream`` has already taken off the socket,
    decrypted now, without waiting (up to `READ_SIZE`). A TLS read hands over one record,
    and a server that flushes each event of a streamed reply sends each as a record of its
    own: read one at a time, a paced stream would take one event a tick, and a whole body
    would cost a trip through the scheduler per record. ``b""`` when no whole record is
    there (or this trio keeps its TLS state under other names).

    Raises:
        ssl.SSLError: a record that fails (a bad MAC: never read as the body's end)."""
    ssl_object = getattr(stream, "_ssl_object", None)
    if not isinstance(ssl_object, ssl.SSLObject):
        return b""
    pieces, size = [], 0
    while size < READ_SIZE:
        try:
            data = ssl_object.read(READ_SIZE - size)
        except ssl.SSLWantReadError:  # no whole record yet; any other error is raised
            break
        if not data:  # the server's close_notify: trio's next read says so
            break
        pieces.append(data)
        size += len(data)
    return b"".join(pieces)


def _tls_buffered(stream: trio.SSLStream[Any]) -> bool:
    """Whether a TLS stream holds bytes it took off the socket and has not handed on: a
    record after an answer's last one, in the same TCP segment. (trio keeps undecrypted
    bytes in a private BIO; where a later trio has none, the decrypted ones still
    count.)"""
    incoming = getattr(stream, "_incoming", None)
    return bool(getattr(incoming, "pending", 0) or stream.pending())


class LeanTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` with its own small keep-alive pool.

    Args:
        max_connections: connections open at once, over all origins.
        keepalive_expiry: seconds an idle connection is kept.
        ssl_context: for ``https``; default: httpx's (certifi roots, verification on).
    """

    def __init__(
        self,
        *,
        max_connections: int = 16,
        keepalive_expiry: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._max_connections = max_connections
        self._slots = trio.Semaphore(max_connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._keepalive_expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._closed = False

    # -- the pool -----------------------------------------------------------------------
    #
    # ``_slots`` counts requests in flight (each holds one connection); idle connections
    # hold no slot. Before a new connection is opened, idle ones are closed until
    # in-flight + idle stays within ``max_connections``.

    async def _checkout(self, origin: Origin, timeouts: Mapping[str, float | None]) -> _Connection:
        """A slot (`take`: at once when one is free), then a live idle connection to
        ``origin`` or a new one."""
        with _timeout(timeouts.get("pool"), httpx.PoolTimeout, "waiting for a free connection"):
            await take(self._slots)
        try:
            conn = await self._reuse(origin)
            if conn is not None:
                return conn
            await self._make_room()
            return await self._connect(origin, timeouts.get("connect"))
        except BaseException:
            self._slots.release()
            raise

    async def _reuse(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin, [])
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            # Always poll before reuse (about a microsecond): a request sent on a
            # connection the server has closed fails after it was written, and then it
            # cannot be sent again without risking a second completion.
            if now - conn.idle_since < self._keepalive_expiry and conn.looks_alive():
                return conn
            await conn.aclose()
        return None

    async def _make_room(self) -> None:
        in_flight = self._max_connections - self._slots.value
        idle = [c for conns in self._idle.values() for c in conns]
        idle.sort(key=lambda c: c.idle_since)
        for conn in idle[: max(0, in_flight + len(idle) - self._max_connections)]:
            self._idle[conn.origin].remove(conn)
            await conn.aclose()

    async def _connect(self, origin: Origin, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        with _timeout(timeout, httpx.ConnectTimeout, f"connecting to {host}:{port}"):
            try:
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
            if scheme == "https":
                stream = await self._start_tls(stream, host)
        return _Connection(stream, origin)

    async def _start_tls(self, stream: trio.abc.Stream, host: str) -> trio.SSLStream[Any]:
        context = self._ssl_context or httpx.create_ssl_context()
        tls = trio.SSLStream(stream, context, server_hostname=host, https_compatible=True)
        try:
            await tls.do_handshake()
        except BaseException as exc:  # a timeout or Ctrl-C too: the socket is closed
            await trio.aclose_forcefully(stream)
            if not isinstance(exc, (trio.BrokenResourceError, ssl.SSLError)):
                raise
            reason = exc if isinstance(exc, ssl.SSLError) else exc.__cause__ or exc
            raise httpx.ConnectError(
                f"TLS handshake with {host} failed: {str(reason) or type(reason).__name__}"
            ) from reason
        return tls

    async def _release(self, conn: _Connection) -> None:
        """Back to the idle list when reusable, else closed; frees the request's slot."""
        try:
            response, conn.response = conn.response, None
            if response is not None and response.reusable and not self._closed:
                conn.idle_since = time.monotonic()
                self._idle.setdefault(conn.origin, []).append(conn)
            else:
                await conn.aclose()
        finally:
            self._slots.release()

    # -- one request --------------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        extensions = request.extensions
        return await self.exchange(
            request.method,
            request.url,
            request.headers.raw,
            body,
            extensions.get("timeout", {}),
            extensions.get(PACE, 0.0),
        )

    async def exchange(
        self,
        method: str,
        url: httpx.URL,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Mapping[str, float | None] = _NO_TIMEOUTS,
        pace: float = 0.0,
    ) -> httpx.Response:
        """One request, without an ``httpx.Request`` (`handle_async_request` is this for
        one): what a provider that holds its own deadline calls.

        Args:
            method: the request's method.
            url: where it goes.
            headers: its headers, ``Host`` included, as they go on the wire (the body
                is framed here: any ``Content-Length`` or ``Transfer-Encoding`` given is
                replaced).
            body: the whole body.
            timeouts: httpx's per-phase timeouts (``connect``, ``write``, ``read``,
                ``pool``); none by default, for a caller whose own cancel scope is the
                deadline.
            pace: seconds between two reads of the body (`PACE`).
        """
        conn, response = await self._opened(method, url, headers, body, timeouts)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=ResponseStream(self, conn, timeouts.get("read"), pace),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": response.reason},
        )

    async def fetch(
        self,
        method: str,
        url: httpx.URL,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Mapping[str, float | None] = _NO_TIMEOUTS,
    ) -> httpx.Response:
        """`exchange`, the answer read whole: a response whose ``content`` is there (decoded
        as its ``Content-Encoding`` says) and whose connection is back in the pool.

        What a whole reply takes: its body is read here, one socket read at a time, with
        none of the async iterators (nor trio's finalizers for them) that reading an
        ``httpx.Response`` costs.
        """
        conn, response = await self._opened(method, url, headers, body, timeouts)
        content = await self._rest(conn, timeouts.get("read"))
        whole = httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=httpx.ByteStream(content),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": response.reason},
        )
        as_read(whole, decoded(whole, content), len(content))
        return whole

    async def _rest(self, conn: _Connection, timeout: float | None) -> bytes:
        """The rest of the body of ``conn``'s answer, read to its end, one socket read at
        a time; the connection is then back in the pool (closed, its slot freed, on any
        failure, and a body over `bodies.MAX_BODY` bytes is one)."""
        response = conn.response
        assert response is not None
        try:
            pieces = body_of(response)
            size = sum(map(len, pieces))
            while not response.done:
                await self._receive(conn, timeout)
                more = body_of(response)
                size += sum(map(len, more))
                pieces += more
                if size > bodies.MAX_BODY:
                    raise over("is")
        except BaseException:
            await self._discard(conn)
            raise
        await self._release(conn)
        return b"".join(pieces)

    async def _opened(
        self,
        method: str,
        url: httpx.URL,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Mapping[str, float | None],
    ) -> tuple[_Connection, wire.Response]:
        """Send a request and read its answer's head: the connection it went on and the
        answer, its body still to read. The request's bytes are built before a
        connection is taken (one that cannot be written fails with none taken); on any
        failure the connection is closed and its slot freed."""
        if self._closed:
            raise RuntimeError("the transport is closed")
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
        origin = (scheme, url.host, url.port or (443 if scheme == "https" else 80))
        out = _request_bytes(method, url, headers, body)
        conn = await self._checkout(origin, timeouts)
        try:
            response = await self._send(conn, method, out, timeouts.get("write"))
            await self._await_head(conn, response, timeouts.get("read"))
        except BaseException:
            await self._discard(conn)
            raise
        return conn, response

    async def _discard(self, conn: _Connection) -> None:
        """Close a connection a request failed on, and free its slot."""
        await conn.aclose()
        self._slots.release()

    async def _send(
        self, conn: _Connection, method: str, out: bytes, timeout: float | None
    ) -> wire.Response:
        """Send a request's bytes on ``conn``; the answer it is to read."""
        with _timeout(timeout, httpx.WriteTimeout, "sending the request"):
            try:
                stream = conn.stream
                if plain(stream):
                    await write_all(stream.socket, out)  # type: ignore[attr-defined]
                else:
                    await stream.send_all(out)
            except _CONNECTION_ERRORS as exc:
                # send_all raises only before every byte was handed to the kernel: the
                # server never got the whole request.
                raise RequestNotSent(
                    f"the connection failed while sending the request ({exc or type(exc).__name__})"
                ) from None
        response = conn.response = wire.Response(head_request=method == "HEAD")
        return response

    async def _await_head(
        self, conn: _Connection, response: wire.Response, timeout: float | None
    ) -> None:
        """Read until the answer's (final) head has come."""
        first = True  # just sent: nothing to read yet, wait before reading
        while not _head(response):
            if not await self._receive(conn, timeout, first):
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            first = False

    async def _receive(self, conn: _Connection, timeout: float | None, first: bool = False) -> int:
        """One read of the socket into the response being read; how many bytes came (0:
        the server closed the connection, which ends a body read until close). ``first``:
        the first read after the request was sent, on a plain socket a wait and then a
        read (an answer is never there yet, so trying first is a system call wasted)."""
        with _timeout(timeout, httpx.ReadTimeout, "waiting for the response"):
            try:
                stream = conn.stream
                data: bytes | bytearray
                if first and plain(stream):
                    data = await read_when_ready(stream.socket)  # type: ignore[attr-defined]
                else:
                    data = await stream.receive_some(READ_SIZE)
                    if data and type(stream) is trio.SSLStream:
                        data = bytes(data) + _records_waiting(stream)
            except _CONNECTION_ERRORS as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        return self._took(conn, data)

    def _receive_now(self, conn: _Connection) -> int | None:
        """`_receive` without waiting, on a plain socket that has bytes (or its end)
        ready: how many bytes came (0: the server closed the connection); None when it
        has none yet (or is a TLS stream): then `_receive`."""
        stream = conn.stream
        if not plain(stream):
            return None
        try:
            data = read_now(stream.socket)  # type: ignore[attr-defined]
        except trio.ClosedResourceError:
            return None
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        if data is None:
            return None
        return self._took(conn, data)

    def _took(self, conn: _Connection, data: bytes | bytearray) -> int:
        """What one read brought, fed to the response being read (``b""``: the server
        closed the connection); how many bytes."""
        response = conn.response
        assert response is not None
        if data:
            response.feed(data if type(data) is bytes else bytes(data))
        elif _head(response):  # within a body: its end, if read until close
            try:
                response.closed()
            except wire.ProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from None
        return len(data)

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                await conn.aclose()
        self._idle.clear()


def _request_bytes(
    method: str, url: httpx.URL, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """A request on the wire, its (read) body framed by ``Content-Length``."""
    try:
        return wire.request_bytes(method.encode(), url.raw_path, headers, body)
    except (ValueError, UnicodeEncodeError) as exc:
        raise httpx.LocalProtocolError(str(exc)) from None


def _head(response: wire.Response) -> bool:
    """`wire.Response.head`, its refusals as httpx's."""
    try:
        return response.head()
    except wire.ProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from None


class _timeout:
    """``trio.fail_after`` raising an httpx timeout exception (``None``: no limit)."""

    __slots__ = ("_error", "_scope", "_seconds", "_what")

    def __init__(
        self, seconds: float | None, error: type[httpx.TimeoutException], what: str
    ) -> None:
        self._seconds = seconds
        self._error = error
        self._what = what
        # No limit, no scope: a streamed body is read with none (its caller keeps one
        # deadline for the whole stream), and a scope per read costs a wake-up's worth.
        self._scope = trio.CancelScope() if seconds is not None else None

    def __enter__(self) -> None:
        if self._scope is not None:
            self._scope.deadline = trio.current_time() + (self._seconds or 0.0)
            self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._scope is None:
            return False
        suppressed = self._scope.__exit__(exc_type, exc, tb)
        if self._scope.cancelled_caught:
            raise self._error(f"timed out {self._what} after {self._seconds} s")
        return bool(suppressed)


class LoopClient:
    """The client of one trio loop, and its lean transport when it has one."""

    __slots__ = ("client", "lean")

    def __init__(self, client: httpx.AsyncClient, lean: LeanTransport | None) -> None:
        self.client = client
        self.lean = lean


@functools.lru_cache(maxsize=1)
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context per process: building one (loading the CA bundle) costs ~20 ms,
    and every sync ``completion()`` opens a new client. Honours SSL_CERT_FILE/DIR."""
    return httpx.create_ssl_context()
