"""Fake model servers on 127.0.0.1 that speak the OpenAI and Anthropic wire formats.

For provider plugins' tests and for benchmarks: a real socket, real HTTP/1.1 with
keep-alive, and a script of what to answer::

    with FakeOpenAIServer(lambda body: "hello", api_key="sk-test-1") as server:
        engine = Engine("openai", {"model_name": "m", "base_url": server.base_url,
                                   "api_key": "sk-test-1"})
        ...
        assert server.peak_in_flight <= 8

What a server answers, in order: the next of ``replies`` (consumed one per request),
else ``responder(body)`` (a function of the parsed JSON body), else an echo of the last
user message. Each answer is a string (the reply text, wrapped in the API's format), a
dict (the whole JSON body, sent as is) or a `Reply` (any status, headers, body, or a
broken answer: a dropped connection, a reset mid-response, a truncated or empty 200, a
hang; see `Reply.fault`).

A request that asks for a stream (``"stream": true``) gets the reply text as the API's
server-sent events, a token (about four characters) per event: the first after
``latency`` (and the reply's ``delay``), the next ones ``1 / stream_rate`` seconds apart (``stream_rate=None``: at
once), chunked on the wire. Faults apply to a stream too: ``truncated`` ends it cleanly
but early (no end marker), ``reset`` resets the connection midway, ``stall`` goes silent
midway for ``delay`` seconds, ``error`` sends the API's error event midway.

Invariants:
    - The server runs in a thread of its own (a stdlib ``ThreadingHTTPServer``, one thread
      per connection), so it serves sync code, any trio loop and trio's ``MockClock``
      alike, and a slow ``responder`` or ``latency`` holds only its own connection.
    - It binds 127.0.0.1 on an ephemeral port and stops itself on ``__exit__``/``stop()``:
      open keep-alive connections are shut down and every thread is joined.
    - Every request is recorded (`RecordedRequest`), with the number in flight and the
      peak, and every answer sent as ``(status, JSON payload)`` in ``responses``; the ``Authorization``/``x-api-key`` values are recorded as given so a test can
      check them, and never printed.
"""

from __future__ import annotations

import json
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "FakeServer",
    "Responder",
    "RecordedRequest",
    "Reply",
    "last_user_message",
]

Responder = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Reply:
    """A scripted HTTP answer.

    Attributes:
        status: the HTTP status.
        body: a string (reply text, wrapped in the API's format when ``status`` is 200,
            else an error message in the API's error format) or a dict sent as JSON.
        headers: extra response headers (``{"Retry-After": "2"}``).
        drop: close the connection without answering (a lost connection).
        delay: seconds to wait before answering (on the server's thread); for a streamed
            answer, before its first token (with ``"stall"``: the silence midway).
        fault: a broken answer instead of this one: ``"truncated"`` (a complete HTTP
            message whose JSON body is cut in half), ``"empty"`` (a 200 with an empty
            body), ``"reset"`` (headers and half the body, then a TCP reset), ``"hang"``
            (no answer for ``delay`` seconds or until the client hangs up, then close);
            for streams also ``"stall"`` (half the events, then silence for ``delay``
            seconds, then close) and ``"error"`` (half the events, then an error event).
        keep: for a fault of a streamed answer, how many characters of the reply text go
            out before it (default: half).
    """

    status: int = 200
    body: str | Mapping[str, Any] = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    drop: bool = False
    delay: float = 0.0
    fault: str = ""
    keep: int | None = None

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; use one of {sorted(FAULTS)}")

    @classmethod
    def error(cls, status: int, message: str = "", **headers: str) -> Reply:
        """An error answer; ``Reply.error(429, "slow down", retry_after="1")``."""
        named = {k.replace("_", "-").title(): v for k, v in headers.items()}
        return cls(status=status, body=message or f"error {status}", headers=named)

    @classmethod
    def dropped(cls) -> Reply:
        """Close the connection without an answer (after reading the request)."""
        return cls(drop=True)

    @classmethod
    def truncated(cls, text: str = "cut") -> Reply:
        """A 200 whose JSON body (carrying ``text``) is cut in half, well framed."""
        return cls(body=text, fault="truncated")

    @classmethod
    def empty(cls) -> Reply:
        """A 200 with an empty body."""
        return cls(fault="empty")

    @classmethod
    def reset(cls, text: str = "reset") -> Reply:
        """Headers and half the body of a 200, then a TCP reset."""
        return cls(body=text, fault="reset")

    @classmethod
    def hang(cls, seconds: float = 60.0) -> Reply:
        """No answer for ``seconds`` or until the client hangs up; then close."""
        return cls(delay=seconds, fault="hang")

    @classmethod
    def stalled(cls, text: str, seconds: float = 60.0, keep: int | None = None) -> Reply:
        """A streamed ``text`` that goes silent after ``keep`` characters for ``seconds``."""
        return cls(body=text, delay=seconds, fault="stall", keep=keep)


FAULTS = frozenset({"", "truncated", "empty", "reset", "hang", "stall", "error"})
_TOKEN = re.compile(r"\s*\S{1,4}|\s+")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    start: float
    end: float | None = None


def last_user_message(body: Mapping[str, Any]) -> str:
    """The text of the last user message of a chat body (OpenAI or Anthropic)."""
    for message in reversed(list(body.get("messages") or [])):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
            return str(content)
    return ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        self.server.fake._handle(self)

    def do_GET(self) -> None:
        self.server.fake._handle(self)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read the recorded requests instead."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The stdlib's backlog of 5 resets connections when a test fans out 64 at once.
    request_queue_size = 256
    fake: FakeServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is normal here (dropped connections)."""

    def process_request(self, request: Any, client_address: Any) -> None:
        # Our own thread per connection (not the mixin's) so that stop() can join them.
        self.fake._track(request)
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        self.fake._threads.append(thread)
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        self.fake._untrack(request)
        super().shutdown_request(request)


class FakeServer:
    """The shared machinery of the fake servers; use a subclass.

    Args:
        responder: ``responder(body) -> answer`` for every request the ``replies`` leave.
        replies: answers used first, one per request, in order.
        api_key, models: the key the API takes and the models it serves: the shipped
            subclasses answer 401 and 404 (a subclass of yours checks them itself).
        latency: seconds every answer waits (on the connection's thread); for a streamed
            answer, until its first token. A callable is drawn from once per request
            (`rlm_graph.testing.Lognormal`: seeded, heavy-tailed). A client that hangs up
            while its answer waits is counted in ``cancelled``.
        max_in_flight: a concurrency ceiling: a request that arrives while this many are
            in flight is refused at once with the API's 429 and ``refusal_headers``
            (``Retry-After: 0`` by default), counted in ``refused`` and not in flight.
        refusal_headers: the headers of those refusals.
        stream_rate: tokens per second of a streamed answer (None: all at once).
        prompt_cache: report cached input tokens for a prefix the server saw before, as
            the API does (see the subclasses).
        cache_min_tokens: the shortest prefix the server caches.
    """

    paths: tuple[str, ...] = ()

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        replies: Iterable[Any] = (),
        api_key: str | None = None,
        models: Iterable[str] | None = None,
        latency: float | Callable[[], float] = 0.0,
        max_in_flight: int | None = None,
        refusal_headers: Mapping[str, str] | None = None,
        stream_rate: float | None = None,
        prompt_cache: bool = False,
        cache_min_tokens: int = 1024,
    ) -> None:
        self.responder = responder
        self.stream_rate = stream_rate
        self.prompt_cache = prompt_cache
        self.cache_min_tokens = cache_min_tokens
        self._prefixes: set[str] = set()  # the prompt cache: prefixes seen (or written)
        self._local = threading.local()
        self.streamed: list[tuple[int, int]] = []
        """Per streamed answer: the tokens sent before it ended (or the client hung up),
        and the tokens it had."""
        self.replies: list[Any] = list(replies)
        self.api_key = api_key
        self.models = set(models) if models is not None else None
        self.latency = latency
        self.max_in_flight = max_in_flight
        self.refusal_headers = dict(refusal_headers or {"Retry-After": "0"})
        self.refused = 0
        self.cancelled = 0
        self.requests: list[RecordedRequest] = []
        self.responses: list[tuple[int, Any]] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.connections_opened = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._address: str | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self._address!r})"

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        host, port = server.server_address[:2]
        self._address = f"http://{host!s}:{port}"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.01},
            daemon=True,
            name=f"{type(self).__name__}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, hang up on every open connection and join the threads."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.server_close()
        for thread in self._threads:
            thread.join(timeout=2)
        self._threads.clear()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self._address is None:
            raise RuntimeError("the fake server was never started; use it as a context manager")
        return self._address

    @property
    def base_url(self) -> str:
        """What a provider's ``base_url`` should be."""
        return self.url

    @property
    def bodies(self) -> list[Any]:
        """The parsed JSON bodies of every request, in arrival order."""
        with self._lock:
            return [r.body for r in self.requests]

    # -- what a subclass speaks (a fake for a new API overrides these and ``paths``) ------

    def check_request(self, headers: Mapping[str, str], body: Any) -> Reply | None:
        """An error answer for a request the real API would refuse, else ``None``.

        Args:
            headers: the request's headers, names lower-cased.
            body: the parsed JSON body (``None`` when it was not JSON).
        """
        return None

    def success_body(self, text: str, body: Any) -> dict[str, Any]:
        """The API's JSON answer carrying the reply ``text`` to the request ``body``."""
        raise NotImplementedError

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """The API's JSON error body for ``status`` with the human ``message``."""
        raise NotImplementedError

    def stream_events(self, text: str, body: Any) -> tuple[list[str], list[str]]:
        """A streamed answer carrying ``text``: the events before its first token and
        those after its last (each a whole event, ``"data: ...\n\n"``)."""
        raise NotImplementedError

    def token_event(self, token: str, body: Any) -> str:
        """The event of one token of a streamed answer to ``body``."""
        raise NotImplementedError

    def cache_counts(self, body: Any) -> tuple[int, int]:
        """Input tokens of ``body`` read from the prompt cache and written to it (called
        once per request, with ``prompt_cache`` on; the subclass keeps the cache)."""
        return 0, 0

    @property
    def counted(self) -> tuple[int, int]:
        """`cache_counts` of the request this thread is answering ((0, 0) without
        ``prompt_cache``)."""
        return getattr(self._local, "counts", (0, 0))

    def error_event(self, message: str) -> str:
        """The API's error event, sent mid-stream (fault ``"error"``)."""
        raise NotImplementedError

    # -- serving ------------------------------------------------------------------------

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
            self.connections_opened += 1

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)

    def _handle(self, handler: _Handler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in handler.headers.items()}
        index, counted = self._begin(handler, headers, body)
        try:
            if not counted:  # past max_in_flight
                self._send(
                    handler, Reply(429, "too many requests in flight", self.refusal_headers), body
                )
                return
            reply = self._answer(handler.path, headers, body)
            self._local.counts = (0, 0)
            if self.prompt_cache and reply.status < 300 and isinstance(body, dict):
                with self._lock:
                    self._local.counts = self.cache_counts(body)
            if reply.fault == "hang":
                self._hang(handler, self._latency() + reply.delay)
                return
            if self._streams(reply, body):
                self._send_stream(handler, reply, body)
                return
            wait = self._latency() + reply.delay
            if wait and not self._wait(handler, wait):
                return  # the client hung up: nothing to answer
            # The client may send its next request as soon as it reads this answer (its
            # slot is free then): stop counting this one first, or ``peak_in_flight``
            # would count a request that is already over for the client.
            self._leave()
            counted = False
            self._send(handler, reply, body)
        finally:
            self._finish(index, counted)

    @staticmethod
    def _streams(reply: Reply, body: Any) -> bool:
        """A streamed answer: asked for, a success, and not a whole JSON body."""
        wanted = isinstance(body, dict) and body.get("stream") is True
        return wanted and reply.status < 300 and not reply.drop and isinstance(reply.body, str)

    def _send_stream(self, handler: _Handler, reply: Reply, body: Any) -> None:
        """The reply as server-sent events, paced (see the module), chunked."""
        text = reply.body if isinstance(reply.body, str) else ""
        tokens = _TOKEN.findall(text) if reply.fault != "empty" else []
        head, tail = self.stream_events(text, body)
        if reply.fault:
            keep = len(text) // 2 if reply.keep is None else reply.keep
            kept, sent = [], 0
            for token in tokens:
                if sent >= keep:
                    break
                kept.append(token)
                sent += len(token)
            tokens, tail = kept, []
        else:
            with self._lock:
                self.responses.append((reply.status, self.success_body(text, body)))
        handler.close_connection = reply.fault in ("stall", "reset")
        sent = 0
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Transfer-Encoding", "chunked")
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            self._chunks(handler, head)
            wait = self._latency() + (reply.delay if reply.fault != "stall" else 0.0)
            if wait:  # to the first token
                time.sleep(wait)
            gap = 1.0 / self.stream_rate if self.stream_rate else 0.0
            for token in tokens:
                self._chunks(handler, [self.token_event(token, body)])
                sent += 1
                if gap:
                    time.sleep(gap)
            self._stream_end(handler, reply, tail)
        except OSError:  # the client hung up (or stopped the stream)
            handler.close_connection = True
        finally:
            with self._lock:
                self.streamed.append((sent, len(tokens)))

    def _stream_end(self, handler: _Handler, reply: Reply, tail: list[str]) -> None:
        if reply.fault == "stall":
            self._hang(handler, reply.delay)
            return
        if reply.fault == "reset":
            handler.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            return
        if reply.fault == "error":
            tail = [self.error_event("Overloaded")]
        self._chunks(handler, tail)
        handler.wfile.write(b"0\r\n\r\n")

    @staticmethod
    def _chunks(handler: _Handler, events: list[str]) -> None:
        for event in events:
            data = event.encode()
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _hang(self, handler: _Handler, seconds: float) -> None:
        """Answer nothing until ``seconds`` pass or the client closes, then close."""
        handler.close_connection = True
        try:
            select.select([handler.connection], [], [], seconds)
            handler.connection.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass

    def _latency(self) -> float:
        return self.latency() if callable(self.latency) else self.latency

    def _wait(self, handler: _Handler, seconds: float) -> bool:
        """Wait ``seconds`` before answering; False (counted in ``cancelled``) when the
        client hung up meanwhile. With no pipelining, a readable connection here is an
        end of file or a reset."""
        until = time.monotonic() + seconds
        readable: list[Any] = []
        try:
            readable, _, _ = select.select([handler.connection], [], [], seconds)
            gone = bool(readable) and not handler.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            gone = True
        if readable and not gone:  # a pipelined request, not a hang-up: wait it out
            time.sleep(max(0.0, until - time.monotonic()))
        if gone:
            handler.close_connection = True
            with self._lock:
                self.cancelled += 1
        return not gone

    def _begin(self, handler: _Handler, headers: dict[str, str], body: Any) -> tuple[int, bool]:
        """Record a request; whether it is in flight (False: refused, past the ceiling)."""
        with self._lock:
            self.requests.append(
                RecordedRequest(handler.command, handler.path, headers, body, time.monotonic())
            )
            if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
                self.refused += 1
                return len(self.requests) - 1, False
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            return len(self.requests) - 1, True

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _finish(self, index: int, counted: bool) -> None:
        with self._lock:
            if counted:
                self.in_flight -= 1
            old = self.requests[index]
            self.requests[index] = RecordedRequest(
                old.method, old.path, old.headers, old.body, old.start, time.monotonic()
            )

    def _answer(self, path: str, headers: Mapping[str, str], body: Any) -> Reply:
        if path not in self.paths:
            return Reply(404, f"no route {path}; this fake serves {', '.join(self.paths)}")
        refused = self.check_request(headers, body)
        if refused is not None:
            return refused
        with self._lock:
            scripted = self.replies.pop(0) if self.replies else None
        if scripted is None:
            if self.responder is not None:
                scripted = self.responder(body)
            else:
                scripted = f"echo: {last_user_message(body or {})}"
        return scripted if isinstance(scripted, Reply) else Reply(200, scripted)

    def _send(self, handler: _Handler, reply: Reply, body: Any) -> None:
        if reply.drop:
            handler.close_connection = True
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if isinstance(reply.body, Mapping):
            payload: Any = reply.body
        elif reply.status < 300:
            payload = self.success_body(reply.body, body)
        else:
            payload = self.error_body(reply.status, reply.body)
        data = json.dumps(payload).encode()
        if reply.fault == "empty":
            data = b""
        length = len(data)
        if reply.fault in ("truncated", "reset"):
            data = data[: len(data) // 2]
            length = len(data) if reply.fault == "truncated" else length
        if not reply.fault:
            with self._lock:
                self.responses.append((reply.status, payload))
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(length))
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
            if reply.fault == "reset":
                handler.wfile.flush()
                handler.close_connection = True
                handler.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
        except OSError:
            handler.close_connection = True
