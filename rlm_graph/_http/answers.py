"""How an HTTP provider reads an answer that is not a good reply: the error it raises for
each status, for a reply it cannot read, for a timeout or a broken connection
(`failures`), and the retry it asks for (`AttemptFailed`).

`rlm_graph._http.provider` and `rlm_graph._http.streaming` read answers through here, so
a plain reply and a streamed one fail the same way for the same status.
"""

from __future__ import annotations

import codecs
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Literal, NoReturn, Protocol

import httpx
import trio
from pydantic import ValidationError

from ..errors import (
    BadResponse,
    ContextLengthExceeded,
    ProviderAuthError,
    ProviderError,
    ProviderNotFound,
    ProviderTimeout,
    RateLimited,
    is_context_length_error,
)
from .attempts import note_rate_headers
from .bodies import MAX_JSON_CONTAINERS, TooManyContainers, too_many_containers
from .retry import RETRY_STATUSES, retry_delay_from_headers
from .streaming import Oversized
from .transport import RequestNotSent

__all__ = [
    "AttemptFailed",
    "answer_head",
    "parsing",
    "Speaker",
    "failures",
    "gave_up",
    "broke_off",
    "oversized",
    "stream_failure",
    "raise_for_status",
    "read_json",
    "scrubbed",
    "timed_out",
    "unreadable",
    "waited_too_long",
]


class AttemptFailed(Exception):
    """One failed attempt that may succeed when tried again (internal).

    ``reason`` labels it in logs and counts (``"429"``, ``"timeout"``, ``"connection"``).
    """

    def __init__(self, error: ProviderError, wait: float | None, reason: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait = wait
        self.reason = reason


class Speaker(Protocol):
    """What an error message says of the provider (`JSONProvider` is one)."""

    name: str
    model: str
    base_url: str
    key_rule: str

    @property
    def url(self) -> str: ...

    def _server_message(self, data: Any) -> str: ...

    def _quote(self, text: str, limit: int = 300) -> str: ...

    def _scrub(self, text: str) -> str: ...


def read_json(provider: Speaker, response: httpx.Response) -> Any:
    """The JSON of a read ``response``; the error (or `AttemptFailed`) for a status of 300
    or more, an empty body or one that is not JSON."""
    if response.status_code >= 300 and len(response.content) > ERROR_TEXT:
        data = None  # an error's body is read as its head's text only (`ERROR_TEXT`)
    else:
        data = _parsed(provider, response)
    if response.status_code >= 300:
        raise_for_status(provider, response, data)
    note_rate_headers(response.headers)
    if data is None:
        what = "an empty body" if not response.content else "a body that is not JSON"
        web_page = "html" in response.headers.get("content-type", "")
        error = BadResponse(
            f"{provider.name}: {provider.url} answered {response.status_code} with {what} "
            f"({provider._quote(_head_text(response))}); check that base_url points at the API root",
            provider=provider.name,
            status_code=response.status_code,
            retryable=not web_page,
        )
        if web_page:
            raise error  # a web page, not a struggling API: retrying will not help
        # Empty or cut-off JSON: the server (or a proxy) failed mid-answer.
        raise AttemptFailed(
            error, retry_delay_from_headers(response.headers, rate_limited=False), "bad response"
        )
    return data


def _parsed(provider: Speaker, response: httpx.Response) -> Any:
    """A read answer's JSON; None for a body that is not JSON.

    Raises:
        BadResponse: the body holds more than `bodies.MAX_JSON_CONTAINERS` objects and
            arrays (not retried: the server would send it again).
    """
    if count := too_many_containers(response.content):
        raise BadResponse(
            f"{provider.name}: {provider.url} answered {response.status_code} with JSON of "
            f"{count:,} braces and brackets, past the {MAX_JSON_CONTAINERS:,} objects and "
            "arrays the engine parses: not a reply; check the server",
            provider=provider.name,
            status_code=response.status_code,
        )
    try:
        return response.json()
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        return None


ERROR_TEXT = 64 * 1024
"""The bytes of an error's body the engine reads as text: what a server says of an error
is at its start (a body of megabytes, searched whole, would hold the event loop)."""


def _head_text(response: httpx.Response) -> str:
    """The start of an answer's body as text (`ERROR_TEXT` bytes at most), decoded as
    its ``charset`` says where that is a text encoding, else as UTF-8: never an error
    (``response.text`` took any codec a server named, and ``charset=zlib_codec`` failed
    the call with an ``AssertionError``, ``rot13`` with a ``TypeError``)."""
    head, charset = response.content[:ERROR_TEXT], response.charset_encoding
    if charset and _is_text_encoding(charset):
        try:
            return head.decode(charset, errors="replace")
        except UnicodeError:  # a codec that takes no "replace" (as `_NOT_CHARSETS`)
            pass
    return head.decode("utf-8", errors="replace")


_NOT_CHARSETS = frozenset({"idna", "punycode", "undefined"})
"""Codecs from bytes to text that are no body's charset: host names' (``punycode``
takes most of a second over 64 KiB, ``idna`` takes no "replace") and one that always
fails."""


def _is_text_encoding(name: str) -> bool:
    """Whether ``name``, a server's ``charset``, is a text encoding a body can be read
    with: not a codec from bytes to bytes (``zlib_codec``, ``base64``, ``hex``) or from
    text to text (``rot13``), nor one of `_NOT_CHARSETS`."""
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError):  # unknown, or a name with a NUL in it
        return False
    return info._is_text_encoding and info.name not in _NOT_CHARSETS


_ANSWER: ContextVar[httpx.Response | None] = ContextVar("rlm_graph_answer", default=None)


@contextmanager
def parsing(response: httpx.Response) -> Iterator[None]:
    """While a provider's ``_parse`` reads ``response``'s JSON: `answer_head` is its."""
    token = _ANSWER.set(response)
    try:
        yield
    finally:
        _ANSWER.reset(token)


def answer_head() -> str:
    """The start (`ERROR_TEXT` bytes at most) of the answer a provider's ``_parse`` is
    reading, as text: what its error quotes of a reply it cannot read (``str(data)`` of
    the parsed whole would hold the event loop for a body of megabytes)."""
    response = _ANSWER.get()
    return "" if response is None else _head_text(response)


def _server_said(provider: Speaker, data: Any) -> str | None:
    """The server's message by the provider's reading of its error body; None when that
    reading slips on an odd body (a proxy's HTML page: ``data`` is None), so that the
    body's text is quoted and the failure is retried as any other."""
    try:
        message = provider._server_message(data)
    except Exception:
        return None
    return message if isinstance(message, str) else None


def raise_for_status(provider: Speaker, response: httpx.Response, data: Any) -> NoReturn:
    """The error of an answer with a status of 300 or more (`AttemptFailed` for a retry)."""
    status, text = response.status_code, _head_text(response)
    said = provider._quote(_server_said(provider, data) or text)
    name, model = provider.name, provider.model
    where = f"{name}: POST {provider.url} answered {status}"
    if status != 429 and is_context_length_error(text):
        raise ContextLengthExceeded(
            f"{where}: {said}. The request does not fit model {model!r}'s context "
            "window: turn on compaction with the server's window (RLM(compaction=True, "
            f"models={{{model!r}: {{'context_window': N}}}})), ask for fewer output "
            "tokens (sampling_args={'max_tokens': ...}), or give the server a larger "
            "window (llama.cpp: --ctx-size; Ollama: num_ctx)",
            provider=name,
            status_code=status,
            server_message=said,
        )
    if status in (401, 403):
        rule = f" [key: {provider.key_rule}]" if provider.key_rule else ""
        raise ProviderAuthError(
            f"{where}: {said}. Check the API key (backend_kwargs['api_key'] or the "
            f"provider's environment variable) and that it has access to model {model!r}" + rule,
            provider=name,
            status_code=status,
        )
    if 300 <= status < 400:
        location = provider._quote(response.headers.get("location", ""), 200)
        raise ProviderError(
            f"{where}: a redirect to {location}. Redirects are not followed (the request "
            "and its key would go to another address): set base_url to where the API is "
            "(often https:// instead of http://, or a trailing /v1)",
            provider=name,
            status_code=status,
        )
    if status == 404:
        raise ProviderNotFound(
            f"{where}: {said}. Check the model name and the base URL "
            f"(base_url={provider.base_url!r})",
            provider=name,
            status_code=status,
        )
    if status == 429:
        wait = retry_delay_from_headers(response.headers)
        error: ProviderError = RateLimited(
            f"{where} (rate limited): {said}", provider=name, status_code=status, retryable=True
        )
        raise AttemptFailed(error, wait, str(status))
    if status >= 500 or status in RETRY_STATUSES:
        error = ProviderError(f"{where}: {said}", provider=name, status_code=status, retryable=True)
        wait = retry_delay_from_headers(response.headers, rate_limited=False)
        raise AttemptFailed(error, wait, str(status))
    raise ProviderError(
        f"{where}: {said}. The request was rejected as sent; check the model name and "
        "the request arguments (temperature, max_tokens, extra)",
        provider=name,
        status_code=status,
    )


def gave_up(error: ProviderError, attempts: int) -> ProviderError:
    """The error of a call whose ``attempts`` all failed, the last with ``error``."""
    if attempts == 1:
        return error
    hint = (
        "; set requests_per_minute / tokens_per_minute below your account's limits"
        if isinstance(error, RateLimited)
        else ""
    )
    return type(error)(
        f"{error} (gave up after {attempts} attempts{hint}; raise max_attempts to keep "
        "trying longer)",
        provider=error.provider,
        status_code=error.status_code,
        retryable=error.retryable,
    )


def waited_too_long(error: ProviderError, wait: float, most: float) -> ProviderError:
    """The error of a call whose server asked for a ``wait`` past ``most`` seconds
    (``max_retry_after``): it fails at once."""
    return type(error)(
        f"{error}; the server asked to wait {_seconds_text(wait)}, more than "
        f"max_retry_after={most:g} s: lower your request rate "
        "(requests_per_minute / tokens_per_minute) or raise max_retry_after",
        provider=error.provider,
        status_code=error.status_code,
        retryable=True,
    )


def _seconds_text(seconds: float) -> str:
    """A wait a server named, readable whatever its size (a ``Retry-After: 1e300`` is
    not printed as 301 digits)."""
    if seconds > 86_400:
        return "more than a day"
    return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.3g} s"


def unreadable(provider: Speaker, exc: Exception) -> BadResponse:
    """A reply a provider's `_parse` (or a stream's parser) could not make into a
    `ChatResponse` (a field of the wrong type from the server that the parser did not
    check, or a key or index it did not find): a bad response naming the field, not
    pydantic's report or a bare ``KeyError``."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the reply"
        what = f"{where}: {first['msg']}"
    else:
        what = f"{type(exc).__name__} {str(exc)[:200]} in its parser"
    return BadResponse(
        f"{provider.name}: {provider.url} answered a reply the engine cannot read "
        f"({provider._scrub(what)}); "
        "check that base_url points at the API this provider speaks",
        provider=provider.name,
        retryable=True,
    )


def timed_out(
    provider: Speaker, deadlines: list[float | None], attempts: int, max_timeouts: int
) -> ProviderTimeout:
    """The error of a call whose last ``len(deadlines)`` attempts, in a row, timed out
    (``max_timeouts`` of them)."""
    timeouts = len(deadlines)
    shown = ", ".join(f"{d:g} s" for d in deadlines if d is not None)
    in_a_row = "s in a row" if timeouts != 1 else ""
    return ProviderTimeout(
        f"{provider.name}: no answer from {provider.url}: {timeouts} attempt{in_a_row} timed "
        f"out (deadlines {shown}; {attempts} attempt{'s' * (attempts != 1)} in all, "
        f"max_timeouts={max_timeouts}); check that the server is not hung, "
        "or for a slow model raise backend_kwargs['timeout'] (rlm-graph run --timeout) "
        "or max_timeouts",
        provider=provider.name,
        retryable=True,
    )


def scrubbed(provider: Speaker, error: BadResponse) -> BadResponse:
    """``error`` without the key in its text (a stream's error event quotes the server,
    and a server may echo the key)."""
    text = str(error)
    clean = provider._scrub(text)
    if clean == text:
        return error
    return BadResponse(clean, provider=error.provider, retryable=error.retryable)


def broke_off(provider: Speaker, exc: Exception) -> BadResponse:
    """A stream whose connection was closed or reset before the API's end marker."""
    what = f"{provider.name}: the stream from {provider.url} broke off before its end"
    return BadResponse(
        f"{what} ({type(exc).__name__}); the connection was closed or reset midway",
        provider=provider.name,
        retryable=True,
    )


def stream_failure(provider: Speaker, exc: Exception) -> Exception:
    """The error of an attempt whose stream failed while it was read (`read_events`): a
    retry counted as a cut stream (an error event, a stream cut off early, closed or
    reset midway, or past what the engine reads) or as a bad response (a parser's slip,
    a reply of the wrong shape); a plugin's own `ProviderError` as it is."""
    if isinstance(exc, BadResponse):  # its text may quote the server's
        return AttemptFailed(scrubbed(provider, exc), None, "cut stream")
    if isinstance(exc, Oversized):
        return AttemptFailed(oversized(provider, exc), None, "cut stream")
    if isinstance(exc, TooManyContainers):  # not retried: the server would send it again
        what = f"{provider.name}: {provider.url} streamed {exc}: not a reply"
        return BadResponse(f"{what}; check the server", provider=provider.name)
    if isinstance(exc, ContextLengthExceeded):  # an error event's: it quotes the server
        return ContextLengthExceeded(
            provider._scrub(str(exc)),
            provider=exc.provider,
            server_message=provider._scrub(exc.server_message),
        )
    if isinstance(exc, ProviderError):  # a plugin's own verdict on the reply
        return exc
    if isinstance(exc, httpx.TransportError):
        return AttemptFailed(broke_off(provider, exc), None, "cut stream")
    return AttemptFailed(unreadable(provider, exc), None, "bad response")


def oversized(provider: Speaker, exc: Exception) -> BadResponse:
    """A stream cut off past what the engine reads (`streaming.Oversized`)."""
    what = f"{provider.name}: {provider.url} streamed {exc}: not a reply, cut off there"
    return BadResponse(f"{what}; check the server", provider=provider.name, retryable=True)


class failures:
    """An attempt's timeouts and transport failures, as the retries they ask for (a
    context manager). With ``deadline``, it is also the attempt's deadline: ``timeout``
    seconds from entering, for every phase of the attempt (one cancel scope, as
    ``trio.fail_after`` would make, without its generator)."""

    __slots__ = ("_provider", "_scope", "_timeout")

    def __init__(self, provider: Speaker, timeout: float | None, *, deadline: bool = False):
        self._provider = provider
        self._timeout = timeout
        # Made whole here: a deadline set after construction runs one more generator
        # context manager inside trio. A relative deadline counts from entering.
        self._scope = (
            trio.CancelScope(relative_deadline=timeout)
            if deadline and timeout is not None
            else None
        )

    def __enter__(self) -> None:
        if self._scope is not None:
            self._scope.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._scope is not None:
            try:
                self._scope.__exit__(kind, exc, tb)
            except BaseException as raised:  # what is left of a group, say
                said = _failure(self._provider, self._timeout, raised)
                if said is None:
                    raise
                raise said from None
            if self._scope.cancelled_caught:  # its own deadline passed
                exc = trio.TooSlowError()
        if exc is None:
            return False
        said = _failure(self._provider, self._timeout, exc)
        if said is None:
            return False
        raise said from None


def _failure(provider: Speaker, timeout: float | None, exc: BaseException) -> Exception | None:
    """The error (or retry) an attempt's failure ``exc`` is; None: not one of these."""
    name, url = provider.name, provider.url
    if isinstance(exc, (trio.TooSlowError, httpx.TimeoutException)):
        within = f"{timeout:g} s" if timeout is not None else "the transport's timeout"
        error: ProviderError = ProviderTimeout(
            f"{name}: no answer from {url} within {within}; raise "
            "backend_kwargs['timeout'] for slow models, or check the server",
            provider=name,
            retryable=True,
        )
        return AttemptFailed(error, None, "timeout")
    if isinstance(exc, httpx.DecodingError):  # a body that is not what its encoding says
        said = BadResponse(
            f"{name}: {url} answered a body that does not decode ({exc}); check the server",
            provider=name,
            retryable=True,
        )
        return AttemptFailed(said, None, "bad response")
    if isinstance(exc, httpx.LocalProtocolError):  # could not be written: no retry helps
        what = f"the request to {url} could not be written ({exc}); check its headers"
        return ProviderError(f"{name}: {what}", provider=name)
    if isinstance(exc, httpx.TransportError) and (cert := _untrusted(exc)) is not None:
        # Not retried: the same certificate comes back on every attempt.
        what = cert.verify_message or str(cert)
        return ProviderError(
            f"{name}: the TLS certificate of {url} is not trusted ({what}); check base_url, "
            "or set SSL_CERT_FILE to the bundle of the authority that signed it",
            provider=name,
        )
    if isinstance(exc, httpx.TransportError):
        error = ProviderError(
            f"{name}: connection to {url} failed ({type(exc).__name__}: "
            f"{provider._scrub(str(exc)) or 'no detail'}); check base_url and that the "
            "server is up",
            provider=name,
            retryable=True,
        )
        reason = "not sent" if isinstance(exc, RequestNotSent) else "connection"
        return AttemptFailed(error, None, reason)
    return None


def _untrusted(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed a connection, wherever in its causes it is."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None or isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
