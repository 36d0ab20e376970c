"""Attempts of model calls: counted per call and per run, logged once per run.

A provider that retries calls `note_retry` for every attempt after the first (and for a
request it had to send again for any reason), as that attempt goes, after its wait. The
count lands on the calling node (``NodeRecord.attempts``) and in the run's `RetryLog`,
which writes one summary line per provider when the run ends
(``"openai: 37 retries over 1000 calls: 429 x 20, 500 x 17"``) instead of a warning per
retry; each attempt is logged at DEBUG by the provider.

Invariants:
    - `call_model` opens a `CallAttempts` around every ``provider.complete`` (a context
      variable, so a provider needs no engine handle); outside one, `note_retry` counts nothing.
    - Each retry is also an event (`RETRY_EVENT`) on the calling node's span, which is
      the current span while the provider works: its attempt number, its reason and the
      wait before it. No text from the server goes on it (it could quote a key).
    - Counting never fails a call and never blocks.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

import trio
from opentelemetry import trace

__all__ = [
    "RETRY_EVENT",
    "AttemptHooks",
    "CallAttempts",
    "RetryLog",
    "first_warning",
    "note_held",
    "note_rate_headers",
    "note_retry",
    "wait_before_retry",
]

RETRY_EVENT = "rlm.retry"
"""The span event of one retry (docs/tracing.md, "Events")."""

logger = logging.getLogger("rlm_graph.providers")


class RetryLog:
    """Retries of one run, by provider and reason (``"429"``, ``"timeout"``...)."""

    def __init__(self) -> None:
        # Sync completions on one engine from several threads each have a run of their
        # own, but a log is cheap to make safe and a workflow may share it.
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.retries: dict[str, Counter[str]] = {}
        self.failed: Counter[str] = Counter()
        self.warned: set[tuple[str, str]] = set()

    def add_call(self, provider: str) -> None:
        with self._lock:
            self.calls[provider] += 1

    def add_retry(self, provider: str, reason: str) -> int:
        """Count one retry; returns how many of ``provider``'s retries had ``reason`` so far."""
        with self._lock:
            reasons = self.retries.setdefault(provider, Counter())
            reasons[reason] += 1
            return reasons[reason]

    def claim_warning(self, provider: str, reason: str) -> bool:
        """True the first time it is asked for ``provider`` and ``reason`` in the run."""
        with self._lock:
            if (provider, reason) in self.warned:
                return False
            self.warned.add((provider, reason))
            return True

    def add_failure(self, provider: str) -> None:
        with self._lock:
            self.failed[provider] += 1

    def summary(self) -> list[str]:
        """One line per provider that retried anything, most frequent reason first."""
        lines = []
        with self._lock:
            for provider, reasons in sorted(self.retries.items()):
                total = sum(reasons.values())
                parts = ", ".join(f"{reason} x {n}" for reason, n in reasons.most_common())
                line = (
                    f"{provider}: {total} retr{'y' if total == 1 else 'ies'} over "
                    f"{self.calls[provider]} call{'s' * (self.calls[provider] != 1)}: {parts}"
                )
                if self.failed[provider]:
                    line += f"; {self.failed[provider]} call(s) failed"
                lines.append(line)
        return lines

    def log_summary(self) -> None:
        """Write the summary lines (WARNING: a retry means the service was struggling)."""
        for line in self.summary():
            logger.warning("%s", line)


class AttemptHooks(Protocol):
    """The engine's side of one call's attempts: its place under the provider's limit."""

    async def before_retry(self, reason: str, wait: float, named: float | None) -> None:
        """Wait ``wait`` seconds before the next attempt (``named``: the wait the server
        asked for, if it did); a refused request gives its place back and queues again."""

    def rate_headers(self, headers: Mapping[str, str]) -> None:
        """An answer's headers, for the rate-limit windows they report."""

    def hold(self, reason: str, seconds: float) -> None:
        """The server asked for a wait this call will not make (it fails); for a refusal
        (``reason``), every other request is held ``seconds`` all the same."""


class CallAttempts:
    """The attempts of one model call; ``with`` it around ``provider.complete``."""

    __slots__ = ("attempts", "hooks", "log", "provider", "_token")

    def __init__(
        self, log: RetryLog | None, provider: str, hooks: AttemptHooks | None = None
    ) -> None:
        self.log = log
        self.provider = provider
        self.hooks = hooks
        self.attempts = 1
        self._token: contextvars.Token[CallAttempts | None] | None = None

    def __enter__(self) -> CallAttempts:
        if self.log is not None:
            self.log.add_call(self.provider)
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
        if exc is not None and isinstance(exc, Exception) and self.log is not None:
            self.log.add_failure(self.provider)


_CURRENT: contextvars.ContextVar[CallAttempts | None] = contextvars.ContextVar(
    "rlm_graph_call_attempts", default=None
)


def first_warning(reason: str) -> bool:
    """Whether to warn now of a retry for ``reason`` (a hung server's timeout): True the
    first time the current model call's run asks for its provider and ``reason`` (always
    True outside a run), so a run of a thousand hung calls warns once, when the first
    times out, before its wait."""
    current = _CURRENT.get()
    if current is None or current.log is None:
        return True
    return current.log.claim_warning(current.provider, reason)


def note_retry(reason: str, *, wait: float | None = None) -> bool:
    """Count one more attempt of the current model call, retried because of ``reason``,
    and put it on the node's span as an event. Call it as the attempt goes, after its
    wait (`wait_before_retry`): a call cancelled while it waits made no more attempts.

    Args:
        reason: a short label: the HTTP status (``"429"``), ``"timeout"``,
            ``"connection"``, ``"bad response"``...
        wait: the seconds the provider waits before the attempt, if it knows them.

    Returns:
        True when this is the run's first retry of this provider for ``reason`` (always
        True outside a run): a provider warns once per run about what deserves a user's
        attention now (a hung server) rather than once per call.
    """
    current = _CURRENT.get()
    if current is None:
        return True
    current.attempts += 1
    span = trace.get_current_span()
    if span.is_recording():
        attributes: dict[str, Any] = {
            "rlm.retry.attempt": current.attempts,
            "rlm.retry.reason": reason,
        }
        if wait is not None:
            attributes["rlm.retry.wait_seconds"] = wait
        span.add_event(RETRY_EVENT, attributes)
    if current.log is None:
        return True
    return current.log.add_retry(current.provider, reason) == 1


async def wait_before_retry(reason: str, wait: float, *, named: float | None = None) -> None:
    """Wait before the next attempt of the current model call (a provider's retry loop
    calls this instead of ``trio.sleep(wait)``).

    Inside a run, the engine waits: a request the provider refused (429, 503, 529) gives
    its place under the provider's concurrency limit back, the limit learns from it
    (docs/limits.md), and the retry queues for a place again; a wait the server named
    (``named``, from ``Retry-After``) holds every request to that provider, not only
    this one. Outside a run it is ``trio.sleep(wait)``. A wait below 0 (a reset time
    already past) is none.
    """
    wait = max(0.0, wait)
    named = max(0.0, named) if named is not None else None
    current = _CURRENT.get()
    if current is None or current.hooks is None:
        await trio.sleep(wait)
        return
    await current.hooks.before_retry(reason, wait, named)


def note_held(reason: str, seconds: float) -> None:
    """Tell the engine the server asked for a wait this call will not make (past
    ``max_retry_after``): the provider's other requests are held ``seconds`` all the
    same (pass ``max_retry_after``, the longest any of them would wait for a retry, not
    the server's hour). Never fails, never blocks."""
    current = _CURRENT.get()
    if current is not None and current.hooks is not None:
        current.hooks.hold(reason, seconds)


def note_rate_headers(headers: Mapping[str, str]) -> None:
    """Hand an answer's headers to the engine: a rate-limit window they report as used
    up (``x-ratelimit-remaining-requests: 0`` and its reset) holds the provider's next
    requests until the reset. Never fails, never blocks."""
    current = _CURRENT.get()
    if current is not None and current.hooks is not None:
        current.hooks.rate_headers(headers)
