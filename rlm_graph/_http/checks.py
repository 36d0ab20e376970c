"""Configuration checks of an HTTP provider's keywords: one-line `ConfigError`s that
say what to pass instead (never pydantic's dump or httpx's traceback)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import ValidationError

from ..errors import ConfigError, config_error
from ..limits import is_rate
from ..tracing.scrub import secret_values, without_url_passwords
from . import wire
from .retry import RetryPolicy

__all__ = ["check_settings", "check_shapes", "checked_base_url", "checked_policy", "wire_headers"]


def check_settings(
    provider: str,
    model_name: object,
    max_concurrent: int | None,
    http_transport: str,
    timeout: float | None,
    api_key: object = None,
) -> None:
    """Refuse a missing model name, a concurrency below 1, an unknown transport, a
    timeout that is not positive, or a key no header can carry (never quoting it)."""
    if isinstance(api_key, str) and not (api_key.isascii() and wire.is_value(api_key.encode())):
        raise ConfigError(
            f"{provider}: the API key has a line break or a character that is not ASCII "
            "(a key read from a file often ends with a newline: strip it)"
        )
    if not model_name or not isinstance(model_name, str):
        raise ConfigError(f"{provider}: no model name; pass backend_kwargs={{'model_name': ...}}")
    if max_concurrent is not None and (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or max_concurrent < 1
    ):
        raise ConfigError(
            f"{provider}: max_concurrent must be a whole number of at least 1 (or None: "
            f"find the server's limit), not {max_concurrent!r}"
        )
    if http_transport not in ("httpx", "lean"):
        raise ConfigError(
            f"{provider}: http_transport must be 'httpx' or 'lean', not {http_transport!r}"
        )
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):  # NaN too
        raise ConfigError(f"{provider}: timeout must be > 0 seconds, or None, not {timeout!r}")


def check_shapes(
    provider: str,
    headers: object,
    extra: object,
    transport: object,
    stream: object,
    rates: tuple[object, object],
) -> None:
    """Refuse ``headers`` or ``extra_body`` that are not objects (``headers`` of text),
    a ``transport`` that is not an httpx transport, a ``stream`` that is not a bool, and
    rates (requests, tokens per minute) that are not positive numbers."""
    if headers is not None and (
        not isinstance(headers, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise ConfigError(
            f"{provider}: headers must be an object of name: value, both text "
            '(e.g. {"X-Team": "research"})'
        )
    if extra is not None and not isinstance(extra, Mapping):
        raise ConfigError(
            f"{provider}: extra_body must be an object of fields added to each request's "
            f'body (e.g. {{"reasoning_effort": "low"}}), not {type(extra).__name__}'
        )
    if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
        raise ConfigError(
            f"{provider}: transport must be an httpx.AsyncBaseTransport (for tests), not "
            f"{type(transport).__name__}; to choose the HTTP client use http_transport"
        )
    for rate, value in zip(("requests_per_minute", "tokens_per_minute"), rates, strict=True):
        if value is not None and not is_rate(value):
            raise ConfigError(
                f"{provider}: {rate} must be a positive number, or None for no limit, not {value!r}"
            )
    if not isinstance(stream, bool):
        raise ConfigError(f"{provider}: stream must be True or False")


def checked_base_url(provider: str, base_url: object) -> str:
    """``base_url`` without its trailing slash, or a `ConfigError` saying what is wrong."""
    if not isinstance(base_url, str) or not base_url.strip():
        raise ConfigError(f"{provider}: base_url must be a URL like 'http://localhost:8000/v1'")
    # A query may hold a key (``?api-key=...``): it is never quoted, whatever is wrong.
    bare = base_url.strip().split("#", 1)[0].split("?", 1)[0]
    shown = without_url_passwords(repr(bare))
    if bare != base_url.strip():
        part = "a query string (?...)" if "?" in base_url else "a fragment (#...)"
        raise ConfigError(
            f"{provider}: base_url {shown} has {part}; the endpoint's path goes after "
            "base_url, so give the API root alone, and put a key in --api-key-env "
            "(api_key_env) or in headers instead"
        )
    try:
        url = httpx.URL(bare)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{provider}: base_url {shown} is not a valid URL ({without_url_passwords(str(exc))})"
        ) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(
            f"{provider}: base_url {shown} must be an http:// or https:// URL with a host, "
            "e.g. 'http://localhost:8000/v1'"
        )
    return bare.rstrip("/")


def checked_policy(provider: str, **settings: Any) -> RetryPolicy:
    """A `RetryPolicy`, with a one-line `ConfigError` for a bad value (not pydantic's)."""
    try:
        return RetryPolicy(jitter=0.25, **settings)
    except ValidationError as exc:
        raise config_error(provider, exc) from None


def wire_headers(
    provider: str, url: httpx.URL, headers: dict[str, str]
) -> dict[bytes, tuple[bytes, bytes]]:
    """``Host`` (from ``url``) and ``headers`` as they go on the wire, by lower-case name;
    a `ConfigError` for a header the wire cannot carry (not ASCII, or a line break). A
    ``user:password@`` in ``url`` is Basic auth, over any ``Authorization`` (httpx's
    rule: the httpx transport sends the same)."""
    found = {b"host": (b"Host", url.netloc)}
    for name, value in headers.items():
        try:
            encoded = (name.encode("ascii"), value.encode("ascii"))
        except (AttributeError, UnicodeEncodeError):
            raise ConfigError(
                f"{provider}: header {name!r} must be ASCII text in its name and value"
            ) from None
        if not (wire.is_token(encoded[0]) and wire.is_value(encoded[1])):
            raise ConfigError(
                f"{provider}: header {name!r} is not a valid header (a name of letters, "
                "digits and !#$%&'*+-.^_`|~; a value without line breaks)"
            )
        found[encoded[0].lower()] = encoded
    basic = url_credentials(url)
    if basic is not None:
        found[b"authorization"] = (b"Authorization", b"Basic " + basic.encode())
    return found


def url_credentials(url: httpx.URL) -> str | None:
    """The Basic auth credentials (base64) of ``url``'s ``user:password@``, as httpx
    sends them: where it has a user or a password."""
    if not (url.username or url.password):
        return None
    return base64.b64encode(f"{url.username}:{url.password}".encode()).decode()


def quoted_secrets(
    api_key: str | None,
    base_url: str,
    headers: Mapping[str, str] | None,
    extra_body: Mapping[str, Any] | None,
) -> list[str]:
    """What a server's text quoted in errors and logs is redacted of: the key, a secret
    header's value, the base URL's password and its Basic credentials, a secret-named
    body field (not ``prompt_cache_key``, which names a cache)."""
    fields = {
        name: value
        for name, value in (extra_body or {}).items()
        if isinstance(name, str) and name != "prompt_cache_key"
    }
    given = {**fields, "api_key": api_key, "base_url": base_url, "headers": dict(headers or {})}
    found = secret_values(given, environ={})
    url = httpx.URL(base_url)
    basic = url_credentials(url)
    return found if basic is None else [*found, basic, url.password]
