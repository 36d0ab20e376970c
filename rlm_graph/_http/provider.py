"""The base of every HTTP provider: one client per trio loop, retries, error mapping, no leaks.

A subclass says how to build a request body and read a response
(`JSONProvider._build_body`, `JSONProvider._parse`); this module does the rest the same way
for every API:

    complete() -> _send_with_retries() -> _attempt() -> _post() / _read() / _parse()
    stream()   -> _send_with_retries() -> _stream_attempt() -> _open_stream() / _stream_parser()

Invariants:
    - One ``httpx.AsyncClient`` per provider *per trio loop*, created lazily on the first
      ``complete()`` in that loop; ``aclose()`` closes the current loop's client only.
      Sync completions running at once in several threads (one loop each) therefore
      never close or replace each other's client, and each loop keeps its connections
      alive between its calls. Its pool holds ``max_concurrent`` connections. (The
      provider's concurrency limit across loops is the engine's `SharedGate`.)
    - Retries happen on 408/409/425/429, every 5xx, timeouts, dropped connections and
      2xx answers that cannot be read (empty, truncated, not the API's shape), with
      capped exponential backoff and jitter, honouring ``Retry-After`` (seconds or an HTTP
      date), ``retry-after-ms`` and the common rate-limit reset headers. Backoff sleeps
      with ``trio.sleep``, so trio's ``MockClock`` makes a test of a 30 s wait instant.
    - Every retry is one more attempt: logged at DEBUG and, once its wait is over and it
      goes, counted on the node and in the run's summary (`rlm_graph._http.attempts`);
      nothing is re-sent silently. A wait the server names is never shorter than the
      computed backoff (a ``Retry-After: 0`` storm does not use every attempt up at once).
    - Each attempt has a deadline: ``timeout``, doubled after every attempt that timed
      out in a row, up to ``8 * timeout`` (docs/providers.md says why). ``max_timeouts``
      timeouts in a row fail the call (3: 60 + 120 + 240 s by default), so a server that
      hangs for good fails it in minutes, not after ``max_attempts`` growing deadlines;
      any other answer (even a 5xx) shows the server alive and starts the count and the
      deadline again. The run's first timeout is a WARNING when it happens. A streamed
      attempt's deadline is for silence: each chunk must come within it of the last.
    - A streamed reply is the same `ChatResponse` as a plain one; a stream cut off (no
      end marker, or an error event) is retried like a truncated 200
      (`rlm_graph._http.streaming` says what the sink sees across attempts).
    - 400, 401, 403, 404 and other 4xx fail at once, with a message that says what to
      check and quotes the server's own message.
    - The API key is never part of an error message, a log line or a repr: it lives only
      in the request headers, every quoted server text is scrubbed of it, and errors are
      raised ``from None`` so no ``httpx.Request`` (with its headers) hangs off them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import trio
from opentelemetry.propagate import inject

from ..concurrency import DEFAULT_CEILING, DEFAULT_INITIAL
from ..contracts import ChatRequest, ChatResponse, TextSink
from ..errors import BadResponse, ProviderError
from ..tracing.scrub import Scrubber, without_url_passwords
from .answers import (
    AttemptFailed as _Retry,
    failures,
    gave_up,
    parsing,
    read_json,
    scrubbed,
    stream_failure,
    timed_out,
    unreadable,
    waited_too_long,
)
from .attempts import first_warning, note_held, note_rate_headers, note_retry, wait_before_retry
from .bodies import decoding, read_whole
from .checks import (
    check_settings,
    check_shapes,
    checked_base_url,
    checked_policy,
    quoted_secrets,
    url_credentials,
    wire_headers,
)
from .keys import Secret
from .retry import RetryPolicy, parse_duration, parse_retry_after, retry_delay_from_headers
from .streaming import DeltaTracker, StreamParser, read_reply, whole_reply
from .transport import (
    LeanTransport,
    LoopClient as _LoopClient,
    proxy_configured,
    shared_ssl_context as _shared_ssl_context,
)

__all__ = [
    "JSONProvider",
    "RetryPolicy",
    "Secret",
    "parse_duration",
    "parse_retry_after",
    "retry_delay_from_headers",
]

logger = logging.getLogger("rlm_graph.providers")

# Attempt deadlines grow after each timeout, up to this many times ``timeout``.
TIMEOUT_GROWTH_CAP = 8.0

_DEFAULT_HEADERS = {
    "User-Agent": "rlm-graph",
    "Accept": "application/json",
    "Accept-Encoding": "gzip, deflate",
}


class JSONProvider:
    """A `Provider` that POSTs JSON to one endpoint over a shared ``httpx.AsyncClient``.

    Subclasses set ``name`` and ``path`` and implement `_build_body`, `_parse` and, for
    their auth scheme, `_auth_headers`. Everything else (the client's lifecycle, retries,
    timeouts, error messages, key hygiene) is here.

    Args:
        model_name: the model asked for when a request names none.
        base_url: the API's root URL (the endpoint ``path`` is appended).
        api_key: the key, or ``None`` for servers that need none.
        max_concurrent: the most requests in flight at once (the ceiling of the engine's
            adaptive limit, and the size of each loop's connection pool). ``None`` (the
            default): the limit finds what the server takes, from 64 up to 512, lower
            on 429s (docs/limits.md); a number is a hard ceiling the limit starts at.
        timeout: seconds the first attempt may take in all (connect, send, wait, read);
            each attempt after a timeout gets twice as long, up to ``8 * timeout``.
            ``None``: no limit.
        max_attempts, max_timeouts, backoff_base, backoff_max, max_retry_after: see
            `RetryPolicy`.
        requests_per_minute, tokens_per_minute: rate limits the engine applies to this
            provider, shared by every run of the engine.
        headers: extra headers sent with every request.
        extra_body: body fields sent with every request (a request's ``extra`` wins).
        http_transport: ``"lean"`` (the default: `rlm_graph._http.transport.LeanTransport`,
            trio streams and `rlm_graph._http.wire`; about half the CPU per call of httpx's pool and no
            slowdown with many connections, see docs/benchmarks.md) or ``"httpx"``
            (httpx's own pool). Either way httpx is the client API; with a proxy
            configured, httpx's pool is used, since the lean transport has no proxy
            support.
        transport: an ``httpx.AsyncBaseTransport`` to use instead (``httpx.MockTransport``
            in unit tests); wins over ``http_transport``.
        stream: stream root turns (`stream`) where the API can; ``False`` for a server
            that cannot.
    """

    name = "http"
    path = "/"
    key_rule = ""
    """Which key rule applied (`rlm_graph._http.keys`), quoted by a 401's message."""
    key_variables: tuple[str, ...] | None = None
    """The variables its key and base URL came from (`ResolvedKey.variables`); None: unsaid."""
    # The optional capabilities (`rlm_graph.contracts.ProviderCapabilities`) a subclass
    # may change: a server that prices its own replies sets ``reports_cost = True``.
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    default_max_tokens: int | None = None
    reports_cost = False
    streams = False
    """On when the subclass can stream (`_stream_fields`) and ``stream=True``."""
    stream_interval = 0.1
    """Seconds between two reads of a streamed reply through the lean transport: what
    arrived meanwhile is read at once, one wake-up for several tokens (docs/benchmarks.md)."""

    def __init__(
        self,
        *,
        model_name: str,
        base_url: str,
        api_key: str | None = None,
        max_concurrent: int | None = None,
        timeout: float | None = 60.0,
        max_attempts: int = 10,
        max_timeouts: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        max_retry_after: float = 120.0,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        http_transport: str = "lean",
        transport: httpx.AsyncBaseTransport | None = None,
        stream: bool = True,
    ) -> None:
        check_settings(self.name, model_name, max_concurrent, http_transport, timeout, api_key)
        rates = (requests_per_minute, tokens_per_minute)
        check_shapes(self.name, headers, extra_body, transport, stream, rates)
        self.streams = bool(stream) and type(self)._stream_fields is not JSONProvider._stream_fields
        self.model = model_name
        self.base_url = checked_base_url(self.name, base_url)
        self.max_concurrent = DEFAULT_CEILING if max_concurrent is None else max_concurrent
        self.initial_concurrency = DEFAULT_INITIAL if max_concurrent is None else max_concurrent
        self.timeout = timeout
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.retry = checked_policy(
            self.name,
            max_attempts=max_attempts,
            max_timeouts=max_timeouts,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            max_retry_after=max_retry_after,
        )
        self.extra_body = dict(extra_body or {})
        self._api_key = Secret(api_key) if api_key else None
        secrets = quoted_secrets(api_key, self.base_url, headers, extra_body)
        self._redact = Scrubber(secrets, environ={}).scrub_literals  # for quoted server text
        self._headers = dict(headers or {})
        self._transport = transport
        self.http_transport = http_transport
        # One client per trio loop (see the module's invariants); the lock guards the map,
        # which threads running their own loops share.
        self._clients: weakref.WeakKeyDictionary[trio.lowlevel.TrioToken, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )
        self._clients_lock = threading.Lock()
        self._url = httpx.URL(self.url)
        self._default_headers = {**_DEFAULT_HEADERS, **self._headers}
        self._wire_headers = wire_headers(self.name, self._url, self._default_headers)
        # Built now (configuration time), not on the first request of the first run.
        self._ssl_context = _shared_ssl_context()

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return (
            f"{type(self).__name__}(name={self.name!r}, model_name={self.model!r}, "
            f"base_url={without_url_passwords(repr(self.base_url))}, api_key=<{key}>, max_concurrent={self.max_concurrent})"
        )

    @property
    def url(self) -> str:
        """The endpoint every request goes to."""
        return self.base_url + self.path

    # -- what a subclass provides -------------------------------------------------------

    def _auth_headers(self) -> dict[str, str]:
        """Headers carrying the key (``Authorization: Bearer`` by default)."""
        return {"Authorization": f"Bearer {self._api_key.reveal()}"} if self._api_key else {}

    def _build_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body for ``request``."""
        raise NotImplementedError

    def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
        """Read a 2xx JSON answer; raise `BadResponse` when it is not the API's shape."""
        raise NotImplementedError

    def _stream_fields(self, request: ChatRequest) -> dict[str, Any] | None:
        """Body fields that ask for ``request``'s answer as server-sent events
        (``{"stream": True}``...), or None when it cannot be streamed. A subclass that
        returns fields also implements `_stream_parser`; the default never streams."""
        return None

    def _stream_parser(self, request: ChatRequest) -> StreamParser:
        """A fresh reader of one attempt's events (see `StreamParser`)."""
        raise NotImplementedError

    def _server_message(self, data: Any) -> str:
        """The human message inside an error body (``{"error": {"message": ...}}``)."""
        if isinstance(data, dict):
            error = data.get("error", data)
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return str(error["message"])
            if isinstance(error, str):
                return error
        return ""

    # -- the client's lifecycle ---------------------------------------------------------

    @property
    def _client(self) -> httpx.AsyncClient | None:
        """The current trio loop's client, if it has one; outside trio, any client still
        open (for tests and debugging)."""
        with self._clients_lock:
            try:
                found = self._clients.get(trio.lowlevel.current_trio_token())
            except RuntimeError:
                found = next(iter(self._clients.values()), None)
        return found.client if found is not None else None

    def _get_client(self) -> _LoopClient:
        loop = trio.lowlevel.current_trio_token()
        with self._clients_lock:
            found = self._clients.get(loop)
        if found is not None:
            return found
        transport = self._make_transport()
        pool = httpx.Limits(
            max_connections=self.max_concurrent,
            max_keepalive_connections=self.max_concurrent,
            keepalive_expiry=30.0,
        )
        client = httpx.AsyncClient(
            verify=self._ssl_context,
            limits=pool,
            timeout=httpx.Timeout(self.timeout),
            transport=transport,
            headers={"User-Agent": "rlm-graph", **self._headers},
        )
        # Our own transport is called directly on the hot path (see `_post`).
        found = _LoopClient(client, transport if isinstance(transport, LeanTransport) else None)
        with self._clients_lock:
            self._clients[loop] = found
        return found

    def _make_transport(self) -> httpx.AsyncBaseTransport | None:
        if self._transport is not None:
            return self._transport
        if self.http_transport == "lean" and not proxy_configured():
            return LeanTransport(
                max_connections=self.max_concurrent,
                keepalive_expiry=30.0,
                ssl_context=self._ssl_context,
            )
        return None  # httpx's own pool (and its proxy support)

    async def aclose(self) -> None:
        """Close the current trio loop's client and its connections.

        Other loops' clients (other threads' sync completions) are theirs to close; the
        next call in this loop opens a new client.
        """
        with self._clients_lock:
            found = self._clients.pop(trio.lowlevel.current_trio_token(), None)
        if found is not None:
            await found.client.aclose()

    # -- one call -----------------------------------------------------------------------

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Send ``request``, retrying what may succeed, and read the answer.

        Raises:
            ProviderAuthError: 401/403 (check the key).
            ProviderNotFound: 404 (check the model name and base URL).
            RateLimited: 429 and the retries ran out.
            ProviderTimeout: ``max_timeouts`` attempts in a row (or the last attempt)
                ran past their deadline.
            ProviderError: any other failure, after retries where retrying makes sense.
            BadResponse: a 2xx answer that is not the API's format.
        """
        body = {**self.extra_body, **self._build_body(request)}
        return await self._send_with_retries(json.dumps(body).encode(), request)

    async def stream(self, request: ChatRequest, sink: TextSink) -> ChatResponse:
        """`complete`, with the reply's text handed to ``sink`` as it streams in (the
        `rlm_graph.contracts.StreamingProvider` capability; see `TextSink` for what a
        retried attempt's text does). A request the API cannot stream (``streams`` off,
        or `_stream_fields` says None) is answered whole and handed on at once."""
        fields = self._stream_fields(request) if self.streams else None
        if fields is None:
            reply = await self.complete(request)
            if reply.content:
                sink(0, reply.content)
            return reply
        body = {**self.extra_body, **self._build_body(request), **fields}
        tracker = DeltaTracker(sink)
        return await self._send_with_retries(json.dumps(body).encode(), request, tracker)

    async def _send_with_retries(
        self, content: bytes, request: ChatRequest, tracker: DeltaTracker | None = None
    ) -> ChatResponse:
        attempts = self.retry.max_attempts
        timeouts = 0  # attempts in a row that timed out
        warned = False
        for attempt in range(1, attempts + 1):
            deadline = self._attempt_timeout(timeouts)
            try:
                if tracker is None:
                    return await self._attempt(content, request, deadline)
                return await self._stream_attempt(content, request, deadline, tracker)
            except _Retry as retry:
                timeouts = self._timeouts_in_a_row(timeouts, retry)
                if retry.reason == "timeout" and timeouts >= self.retry.max_timeouts:
                    deadlines = [self._attempt_timeout(n) for n in range(timeouts)]
                    raise timed_out(self, deadlines, attempt, self.retry.max_timeouts) from None
                if attempt == attempts:
                    raise gave_up(retry.error, attempts) from None
                wait = self._wait_before_retry(retry, attempt)
                logger.debug(
                    "%s; retrying in %.2f s (attempt %d of %d)",
                    retry.error,
                    wait,
                    attempt + 1,
                    attempts,
                )
                # Said once per run (once per call outside a run), when it happens.
                if retry.reason == "timeout" and not warned and first_warning("timeout"):
                    warned = True
                    self._warn_timeout(retry.error, timeouts)
                await wait_before_retry(retry.reason, wait, named=retry.wait)
                # Counted as it goes: a call cancelled during its wait sent no more.
                note_retry(retry.reason, wait=wait)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _timeouts_in_a_row(timeouts: int, retry: _Retry) -> int:
        """The count of attempts in a row that timed out, after ``retry``."""
        if retry.reason == "timeout":
            return timeouts + 1
        # A dead keep-alive connection says nothing about the server; any answer (a 5xx,
        # a reset, a refusal) shows it is not hung.
        return timeouts if retry.reason == "not sent" else 0

    def _attempt_timeout(self, timeouts: int) -> float | None:
        """The deadline of an attempt after ``timeouts`` attempts in a row timed out."""
        if self.timeout is None:
            return None
        return self.timeout * min(2.0**timeouts, TIMEOUT_GROWTH_CAP)

    def _warn_timeout(self, error: ProviderError, timeouts: int) -> None:
        """Say at once that the server may be hung (once per run, not per call): the
        call itself may keep retrying for minutes before its error shows."""
        logger.warning(
            "%s; retrying with a %g s deadline (a call fails after max_timeouts=%d "
            "timeouts in a row; later timeouts of this run are counted in its summary)",
            error,
            self._attempt_timeout(timeouts),
            self.retry.max_timeouts,
        )

    def _wait_before_retry(self, retry: _Retry, attempt: int) -> float:
        if retry.reason == "not sent":
            return 0.0  # a dead keep-alive connection, not a struggling server
        backoff = self.retry.backoff(attempt)
        if retry.wait is None:
            return backoff
        most = self.retry.max_retry_after
        if retry.wait > most:
            # This call fails; the others wait, as long as one of them would.
            note_held(retry.reason, most)
            raise waited_too_long(retry.error, retry.wait, most) from None
        # Retry-After: 0 (or a date past) is no reason to retry sooner than without it.
        return max(self.retry.spread(retry.wait), backoff)

    def _send_headers(self, stream: bool) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self._auth_headers()}
        if stream:  # compression would hold the tokens back until a block fills
            headers.update({"Accept": "text/event-stream", "Accept-Encoding": "identity"})
        # W3C traceparent (or whatever propagator the application set) of the calling
        # node's span, so a gateway's or inference server's spans join our trace.
        inject(headers)
        for name, value in headers.items():  # a propagator's, or a plugin's, may not be
            if not (name.isascii() and value.isascii()):
                raise httpx.LocalProtocolError(
                    f"header {name!r} is not ASCII text (an OpenTelemetry propagator's, or "
                    "the provider's own); HTTP headers carry ASCII only"
                )
        return headers

    def _lean_headers(self, headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
        """The default headers with ``headers`` over them (by name, in any case), as
        they go on the wire: the lean transport takes them as they are. The base URL's
        ``user:password@`` is the ``Authorization``, over the key's (httpx's rule)."""
        merged = dict(self._wire_headers)
        url_auth = bool(self._url.userinfo) and url_credentials(self._url) is not None
        for name, value in headers.items():
            encoded = name.encode("ascii")
            if url_auth and encoded.lower() == b"authorization":
                continue
            merged[encoded.lower()] = (encoded, value.encode("ascii"))
        return list(merged.values())

    async def _post(
        self, loop: _LoopClient, content: bytes, timeout: float | None
    ) -> httpx.Response:
        """POST ``content`` and read the whole answer.

        Through the lean transport the request goes straight to it: the client's
        middleware (cookie jar, redirects, auth flows, URL merging) has nothing to do for
        a JSON API call and costs about a quarter of the CPU of a call. Any other
        transport (httpx's pool, proxies, a test's MockTransport) goes through the client.
        Either way the connect, write, read and pool timeouts are the attempt's deadline.
        """
        headers = self._send_headers(False)
        if loop.lean is None:  # read through `read_whole`: as bounded as the lean reads
            async with loop.client.stream(
                "POST", self.url, content=content, headers=headers, timeout=httpx.Timeout(timeout)
            ) as response:
                await read_whole(response)
            return response
        # The attempt's one cancel scope (`_attempt`) is the deadline of every phase.
        return await loop.lean.fetch("POST", self._url, self._lean_headers(headers), content)

    @contextlib.asynccontextmanager
    async def _open_stream(
        self, loop: _LoopClient, content: bytes, timeout: float | None
    ) -> AsyncIterator[httpx.Response]:
        """POST ``content`` for a streamed answer: the response, its body still to read.
        Its reads have no timeout of their own: the attempt's stall deadline is theirs."""
        headers, timeouts = self._send_headers(True), httpx.Timeout(timeout, read=None)
        if loop.lean is None:
            async with loop.client.stream(
                "POST", self.url, content=content, headers=headers, timeout=timeouts
            ) as response:
                yield response
            return
        # The attempt's stall scope (`_stream_attempt`) is the deadline of every phase.
        response = await loop.lean.exchange(
            "POST", self._url, self._lean_headers(headers), content, pace=self.stream_interval
        )
        try:
            yield response
        finally:
            await response.aclose()

    async def _attempt(
        self, content: bytes, request: ChatRequest, timeout: float | None
    ) -> ChatResponse:
        """One attempt: send, read, parse; `_Retry` when another attempt may succeed."""
        loop = self._get_client()
        with failures(self, timeout, deadline=True):
            response = await self._post(loop, content, timeout)
        return self._whole(response, request)

    def _whole(self, response: httpx.Response, request: ChatRequest) -> ChatResponse:
        """A read answer as a reply (or the error, or the retry, it calls for)."""
        data = self._read(response)
        # A 2xx that is JSON but not the API's shape (or with a field of a wrong type, or
        # one a plugin's parser indexed or called without checking): a proxy or an
        # overloaded server's stand-in answer more often than a wrong base_url (a 404).
        try:
            with parsing(response):  # what `answer_head` quotes of an answer it cannot read
                return self._parse(data, request)
        except BadResponse as exc:
            error = scrubbed(self, exc)
        except ProviderError:  # a plugin's own verdict on the reply (a refusal, say)
            raise
        except Exception as exc:
            error = unreadable(self, exc)
        wait = retry_delay_from_headers(response.headers, rate_limited=False)
        raise _Retry(error, wait, "bad response") from None

    async def _stream_attempt(
        self, content: bytes, request: ChatRequest, timeout: float | None, tracker: DeltaTracker
    ) -> ChatResponse:
        """One streamed attempt. Its deadline is for silence: the answer's headers, then
        every chunk, must come within ``timeout`` of the one before, so a stream that
        stalls is a timeout however long the reply. A stream that ends early (or says it
        failed) is retried like a truncated 200 (docs/providers.md)."""
        loop = self._get_client()
        tracker.begin()
        parser: StreamParser | None = None
        with failures(self, timeout):
            with trio.CancelScope() as stall:

                def heard() -> None:  # the headers, or a chunk, came: the silence starts again
                    if timeout is not None:
                        stall.deadline = trio.current_time() + timeout + self.stream_interval

                stall.deadline = math.inf if timeout is None else trio.current_time() + timeout
                async with self._open_stream(loop, content, timeout) as response:
                    heard()
                    kind = response.headers.get("content-type", "").lower()
                    if response.status_code >= 300 or "event-stream" not in kind:
                        await read_whole(response)  # an error, or a server that ignored "stream"
                        reply = self._whole(response, request)  # its headers noted there
                        tracker.feed(reply.content)
                        tracker.finish()
                        return reply
                    # An answer's window headers only: a refusal's wait is the retry's,
                    # bounded by max_retry_after, as for a whole reply (read_json).
                    note_rate_headers(response.headers)
                    if loop.lean is not None:  # its reads as they are: no layer between
                        raw = aiter(response.stream)  # type: ignore[arg-type]
                    else:
                        raw = response.aiter_raw()
                    chunks = decoding(response, raw, loop.lean is not None)

                    parser = self._stream_parser(request)
                    try:
                        reply = await read_reply(chunks, parser, tracker, heard, timeout)
                    except Exception as exc:
                        raise stream_failure(self, exc) from None
            if stall.cancelled_caught:  # silence: after a finish reason, the reply is whole
                whole = whole_reply(parser)
                if whole is None:
                    raise trio.TooSlowError
                reply = whole
        tracker.finish()
        return reply

    def _read(self, response: httpx.Response) -> Any:
        return read_json(self, response)

    def _scrub(self, text: str) -> str:
        return self._redact(text)

    def _quote(self, text: str, limit: int = 300) -> str:
        text = self._scrub(" ".join(text[: 16 * limit].split()))  # a body may be megabytes
        if not text:
            return "(empty body)"
        return repr(text if len(text) <= limit else text[:limit] + "...")
