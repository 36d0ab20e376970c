"""How a provider retries: the policy, and the waits a server's response headers ask for.

Pure: no trio, no httpx. `rlm_graph._http.provider` applies it; provider authors get it
through `rlm_graph.http`.
"""

from __future__ import annotations

import email.utils
import math
import random
import re
import time
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "RESET_HEADERS",
    "RETRY_STATUSES",
    "RetryPolicy",
    "exhausted_for",
    "parse_duration",
    "parse_retry_after",
    "retry_delay_from_headers",
]

RETRY_STATUSES = frozenset({408, 409, 425, 429})
RESET_HEADERS = (
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-reset",
    "ratelimit-reset",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
# A reset header above this is an epoch timestamp, not a number of seconds.
_EPOCH_THRESHOLD = 1_000_000_000


class RetryPolicy(BaseModel):
    """How a provider retries a failed request.

    Attributes:
        max_attempts: tries in all, the first included (1 means never retry).
        max_timeouts: attempts in a row that may time out before the call fails (they
            count towards ``max_attempts`` too); bounds how long a hung server holds a
            call.
        backoff_base: seconds before the first retry when the server names no wait;
            doubled on every further retry. A named wait is never shorter.
        backoff_max: the longest computed backoff, in seconds.
        max_retry_after: the longest server-requested wait honoured; a server asking for
            more fails at once with `RateLimited` (better than hanging a run for an hour),
            and the provider's other requests are held this long, not for what it asked.
        jitter: the share of random spread on every wait (0.25: up to 25% more for a
            server-named wait, 25% less..as named for a computed one).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(10, ge=1)
    max_timeouts: int = Field(3, ge=1)
    backoff_base: float = Field(0.5, ge=0)
    backoff_max: float = Field(8.0, ge=0)
    max_retry_after: float = Field(120.0, ge=0)
    jitter: float = Field(0.25, ge=0, le=1)

    def backoff(self, attempt: int) -> float:
        """The computed wait before retry number ``attempt`` (1 for the first retry)."""
        base = min(self.backoff_max, self.backoff_base * 2.0 ** (attempt - 1))
        return base * (1 - self.jitter * random.random())

    def spread(self, wait: float) -> float:
        """A server-named wait plus jitter, so a fan-out does not retry in one burst; the
        jitter never takes it past ``max_retry_after`` (a wait named longer is refused
        before this)."""
        return min(wait * (1 + self.jitter * random.random()), max(wait, self.max_retry_after))


def parse_duration(value: str) -> float | None:
    """Seconds in a duration like ``"1s"``, ``"6m0s"``, ``"20ms"`` or ``"2.5"``."""
    text = value.strip().lower()
    try:
        return _seconds(float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return _seconds(sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts))


def _seconds(value: float) -> float | None:
    """A wait a server named, read: never negative; None for NaN or infinity (a value
    no server means, unreadable like any other)."""
    return max(0.0, value) if math.isfinite(value) else None


def parse_retry_after(value: str, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: a number of seconds or an HTTP date.

    Args:
        value: the header's value.
        now: the current wall-clock time (``time.time()`` by default), for dates.

    Returns:
        The wait in seconds (never negative), or ``None`` when the value is unreadable.
    """
    text = value.strip()
    try:
        return _seconds(float(text))
    except ValueError:
        pass
    try:  # a date past what a datetime holds is as unreadable as any other
        when = email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return _seconds(when - (time.time() if now is None else now))


def _parse_reset(value: str, now: float) -> float | None:
    seconds = parse_duration(value)
    if seconds is not None:
        return max(0.0, seconds - now) if seconds > _EPOCH_THRESHOLD else seconds
    try:
        from datetime import datetime

        return _seconds(datetime.fromisoformat(value.strip()).timestamp() - now)
    except (ValueError, OverflowError, OSError):
        return None


def retry_delay_from_headers(
    headers: Mapping[str, str], now: float | None = None, *, rate_limited: bool = True
) -> float | None:
    """The wait a response asks for, in seconds, or ``None`` when it names none.

    Reads ``retry-after-ms``, then ``Retry-After``. For a refusal (``rate_limited``, a
    429) it then reads the rate-limit reset headers (OpenAI's ``x-ratelimit-reset-*``
    durations, Anthropic's ``anthropic-ratelimit-*-reset`` timestamps, epoch or seconds
    ``x-ratelimit-reset``): the reset of the window the response says is used up (its
    ``*-remaining-*`` at 0, `exhausted_for`), else the longest (a tokens window with some
    room may still be too small for the request). A 429 for the requests window that
    also reports the tokens window, with room and a full reset in minutes, asks for the
    requests window's second, not the tokens window's minutes.

    Any other answer (a 5xx, a cut-off body: ``rate_limited=False``) names a wait only
    by ``Retry-After``: the reset headers every OpenAI answer carries say when a window
    refills, not that the server wants the retry held (a 500 with a tokens window
    resetting in 6 minutes is retried on the backoff, not failed as "asked to wait 360 s").
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    now = time.time() if now is None else now
    if "retry-after-ms" in lowered:
        try:
            wait = _seconds(float(lowered["retry-after-ms"]) / 1000)
        except ValueError:
            wait = None
        if wait is not None:
            return wait
    if "retry-after" in lowered:
        wait = parse_retry_after(lowered["retry-after"], now)
        if wait is not None:
            return wait
    if not rate_limited:
        return None
    used_up = exhausted_for(lowered, now)
    if used_up is not None:
        return used_up
    waits = [_parse_reset(lowered[name], now) for name in RESET_HEADERS if name in lowered]
    known = [w for w in waits if w is not None]
    return max(known) if known else None


_REMAINING = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
)


def exhausted_for(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds until a rate-limit window the server says is used up resets (a
    ``*-remaining-*`` header at 0 and its ``*-reset-*`` header); None when none is.

    A successful answer that says so tells the engine to send nothing to that provider
    before the reset: the next request would only be refused.
    """
    # Read on every answer: first one pass over the raw names (most answers name no
    # window), then a few lookups. (httpx's headers look names up in any case; a plain
    # mapping is expected in lower case.)
    raw = getattr(headers, "raw", None)
    if raw is not None and b"ratelimit" not in b"\n".join([name for name, _ in raw]).lower():
        return None
    waits = []
    for remaining, reset in _REMAINING:
        value = headers.get(remaining)
        if value is None:
            continue
        try:
            if float(value) > 0:
                continue
        except ValueError:
            continue
        until = headers.get(reset)
        wait = None if until is None else _parse_reset(until, time.time() if now is None else now)
        if wait is not None:
            waits.append(max(0.0, wait))
    return max(waits) if waits else None
