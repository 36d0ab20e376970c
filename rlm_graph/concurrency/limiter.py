"""The provider limits every trio loop and thread of an engine shares: the default
`SharedLimiter` (`InProcessLimiter`), its concurrency gates and its rate buckets.

A provider's concurrency gate (`SharedGate`) holds an `AdaptiveLimit`
(rlm_graph.concurrency.adaptive) and the requests waiting for it, in arrival order,
across loops; each model call holds its place through all its attempts as a
`ProviderSlot`, which tells the limit what the provider's answers said (an answer and
its latency, a refusal, a wait the server named). Rate buckets run on trio's clock,
which belongs to one loop, so each loop has its own (`RateLimiter`).

A batch executor may supply another `SharedLimiter` (the Ray executor's lives in a Ray
actor, see plugins/rlm_graph_ray): its gates are fixed, not adaptive.

Invariants: a request counted in a gate's ``in_flight`` is released exactly once, as
answered, refused or ended; a waiter granted a place while being cancelled passes it on.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from .._http.retry import exhausted_for
from ..limits import RateBucket
from .adaptive import AdaptiveLimit, Ticket

__all__ = [
    "MAX_PAUSE",
    "REFUSALS",
    "GateHooks",
    "InProcessLimiter",
    "ProviderSlot",
    "RateLimiter",
    "SharedGate",
    "attempt_hooks",
]


class RateLimiter:
    """Requests-per-minute and tokens-per-minute buckets for one provider, on trio's
    clock (the arithmetic is `RateBucket`'s): one loop's (a test's virtual clock)."""

    def __init__(self, rpm: float | None = None, tpm: float | None = None) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._bucket = RateBucket(rpm, tpm)
        self._lock = trio.Lock()

    async def acquire(self, tokens: int = 0) -> None:
        """Wait until one request of about ``tokens`` tokens may go out, then take it."""
        if not self._bucket.limited:
            return
        # The lock keeps waiters in arrival order: no request starves behind later ones.
        async with self._lock:
            while (wait := self._take(tokens)) > 0:
                await trio.sleep(wait)

    def _take(self, tokens: int) -> float:
        return self._bucket.take_or_wait(tokens, trio.current_time())

    def settle(self, estimated: int, actual: int) -> None:
        """Correct the token bucket once the real usage of a request is known."""
        self._bucket.settle(estimated, actual)


class SharedRateLimiter(RateLimiter):
    """`RateLimiter` for every trio loop of the process (sync ``completion()`` calls, one
    after another or from threads, each run a loop of their own): one bucket on the
    process's monotonic clock, behind a thread lock; each loop keeps its own waiters in
    arrival order."""

    def __init__(self, rpm: float | None = None, tpm: float | None = None) -> None:
        super().__init__(rpm, tpm)
        self._shared = threading.Lock()
        self._orders: weakref.WeakKeyDictionary[trio.lowlevel.TrioToken, trio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def acquire(self, tokens: int = 0) -> None:
        if not self._bucket.limited:
            return
        token = trio.lowlevel.current_trio_token()
        with self._shared:
            order = self._orders.get(token)
            if order is None:
                order = self._orders[token] = trio.Lock()
        async with order:
            while (wait := self._take(tokens)) > 0:
                await trio.sleep(wait)

    def _take(self, tokens: int) -> float:
        with self._shared:
            return self._bucket.take_or_wait(tokens, time.monotonic())

    def settle(self, estimated: int, actual: int) -> None:
        with self._shared:
            self._bucket.settle(estimated, actual)


class _Waiter:
    __slots__ = ("event", "ticket", "token")

    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.event = trio.Event()
        self.ticket: Ticket | None = None


class SharedGate:
    """A provider's concurrency limit across trio loops (threads): an `AdaptiveLimit`
    (rlm_graph.concurrency) and the requests waiting for it, in arrival order.

    trio's `CapacityLimiter` belongs to one loop; sync ``completion()`` calls made at the
    same time from several threads each run their own loop. The gate counts every
    request of the engine, whatever its loop. Inside one loop the loop's
    `CapacityLimiter` (at the ceiling) queues requests first, fairly, so the gate only
    makes a request wait for the limit. ``acquire`` a `Ticket`, then ``release`` it
    with what the request told about the provider.
    """

    def __init__(self, limit: AdaptiveLimit) -> None:
        self._lock = threading.Lock()
        self.limit = limit
        self._waiters: deque[_Waiter] = deque()
        self._paused_until = 0.0  # time.monotonic(): a server-named wait holds every request

    @property
    def capacity(self) -> int:
        return self.limit.limit

    @property
    def in_use(self) -> int:
        return self.limit.in_flight

    async def __aenter__(self) -> None:
        """A place under a fixed limit, for a request that tells it nothing (see
        `ProviderSlot` for one that adapts)."""
        if self.try_acquire() is None:
            await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        with self._lock:
            self.limit.in_flight -= 1
            if self._waiters:
                self._grant_locked()

    def try_acquire(self) -> Ticket | None:
        """A place under the limit if one is free now and nobody waits; else None."""
        limit = self.limit
        if self._paused_until and self._paused_until > time.monotonic():
            return None
        with self._lock:
            if self._waiters or limit.in_flight >= limit.limit:
                return None
            return limit.start()

    async def acquire(self) -> Ticket:
        """Wait for a place under the limit, and for a server-named pause to pass (a
        request granted a place while the provider is paused waits out the pause)."""
        await self._sit_out_pause()
        with self._lock:
            if not self._waiters and self.limit.admits():
                return self.limit.start()
            waiter = _Waiter()
            self._waiters.append(waiter)
        try:
            await waiter.event.wait()
            await self._sit_out_pause()
        except BaseException:
            with self._lock:
                if waiter.ticket is not None:  # granted while being cancelled: pass it on
                    self.limit.ended(waiter.ticket)
                    self._grant_locked()
                else:
                    self._waiters.remove(waiter)
            raise
        assert waiter.ticket is not None
        return waiter.ticket

    def release(
        self,
        ticket: Ticket,
        *,
        seconds: float | None = None,
        model: str = "",
        refused: bool = False,
        full: bool = True,
    ) -> bool:
        """Give a place back: answered after ``seconds``, ``refused`` (``full``: no
        wait named), or neither (failed or cancelled: nothing learnt). True when the
        limit moved enough to tell the run's watchers (`AdaptiveLimit.news`)."""
        limit = self.limit
        with self._lock:
            if refused:
                limit.refused(ticket, full=full)
            elif seconds is not None:
                limit.answered(ticket, seconds, model)
            else:
                limit.ended(ticket)
            if self._waiters:
                self._grant_locked()
            return limit.adaptive and limit.news()

    def pause(self, seconds: float) -> None:
        """Send nothing more for ``seconds`` (the server asked, or its window is used up),
        at most `MAX_PAUSE`."""
        with self._lock:
            until = time.monotonic() + min(seconds, MAX_PAUSE)
            self._paused_until = max(self._paused_until, until)

    async def _sit_out_pause(self) -> None:
        while self._paused_until and (left := self._paused_until - time.monotonic()) > 0:
            await trio.sleep(left)

    def _grant_locked(self) -> None:
        while self._waiters and self.limit.admits():
            waiter = self._waiters.popleft()
            waiter.ticket = self.limit.start()
            try:
                waiter.token.run_sync_soon(waiter.event.set)
            except trio.RunFinishedError:  # that loop has ended: try the next waiter
                self.limit.ended(waiter.ticket)


class _GateUse:
    """One request's hold on a `SharedGate` as an async context manager (the
    `SharedLimiter.gate` shape: nothing learnt, a failed request or not)."""

    __slots__ = ("gate", "ticket")

    def __init__(self, gate: SharedGate) -> None:
        self.gate = gate
        self.ticket: Ticket | None = None

    async def __aenter__(self) -> None:
        self.ticket = await self.gate.acquire()

    async def __aexit__(self, *exc: object) -> None:
        if self.ticket is not None:
            self.gate.release(self.ticket)


MAX_PAUSE = 60.0
"""The longest a server-named wait holds a provider's requests (a window that resets in
an hour or a day is a quota: its requests are refused, and retried or given up on, as
any 429 is)."""

REFUSALS = frozenset({"429", "503", "529"})
"""Retry reasons that mean the provider refused the request for load (529: Anthropic's
overloaded)."""


class GateHooks:
    """The `AttemptHooks` of a call under a fixed limit (one that cannot move: a
    ``max_concurrent`` of 1, or a provider declaring no ``initial_concurrency``):
    the call keeps its place through its retries, and a wait the server names, or a
    window it reports used up, holds every request to the provider all the same."""

    __slots__ = ("gate",)

    def __init__(self, gate: SharedGate) -> None:
        self.gate = gate

    async def before_retry(self, reason: str, wait: float, named: float | None) -> None:
        self.hold(reason, named or 0.0)
        await trio.sleep(wait)

    def rate_headers(self, headers: Mapping[str, str]) -> None:
        _pause_for_window(self.gate, headers)

    def hold(self, reason: str, seconds: float) -> None:
        if seconds > 0 and reason in REFUSALS:
            self.gate.pause(seconds)


def _pause_for_window(gate: SharedGate | None, headers: Mapping[str, str]) -> None:
    """Hold ``gate``'s provider until a rate-limit window the headers report used up
    resets."""
    wait = exhausted_for(headers) if gate is not None else None
    if wait and gate is not None:
        gate.pause(wait)


def attempt_hooks(slot: ProviderSlot | SharedGate) -> ProviderSlot | GateHooks:
    """What a call's attempts tell the engine through (`CallAttempts`), for its slot."""
    return slot if isinstance(slot, ProviderSlot) else GateHooks(slot)


class ProviderSlot:
    """One model call's place under its provider's limit, through all its attempts: the
    `AttemptHooks` of its `CallAttempts` (rlm_graph._http.attempts).

    With an adaptive gate, the call's answer (and its latency) or a refusal is what the
    limit learns from; a refused attempt gives its place back and queues again before
    its retry, and a wait the server named pauses the provider for every request. A
    `SharedLimiter` without adaptive gates (a third party's) holds one fixed place.
    """

    __slots__ = ("fixed", "gate", "key", "model", "on_change", "sent", "ticket")

    def __init__(
        self,
        key: str,
        gate: SharedGate | None,
        fixed: AbstractAsyncContextManager[object] | None,
        model: str,
        on_change: Callable[[str, AdaptiveLimit], None] | None,
    ) -> None:
        self.key, self.gate, self.fixed, self.model = key, gate, fixed, model
        self.on_change = on_change
        self.ticket: Ticket | None = None
        self.sent = 0.0

    async def __aenter__(self) -> ProviderSlot:
        gate = self.gate
        if gate is None:
            assert self.fixed is not None
            await self.fixed.__aenter__()
            return self
        # Most calls find a free place: no coroutine to make for the wait.
        ticket = gate.try_acquire()
        self.ticket = ticket if ticket is not None else await gate.acquire()
        if gate.limit.adaptive:
            self.sent = trio.current_time()
        return self

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> None:
        gate = self.gate
        if gate is None:
            assert self.fixed is not None
            await self.fixed.__aexit__(kind, exc, tb)
        elif self.ticket is not None:
            ticket, self.ticket = self.ticket, None
            if not gate.limit.adaptive:  # a fixed limit learns nothing: the place back
                gate.release(ticket)
                return
            # An answer, and its latency, to learn from; else (failed, cancelled) nothing.
            seconds = trio.current_time() - self.sent if exc is None else None
            if gate.release(ticket, seconds=seconds, model=self.model) and self.on_change:
                self.on_change(self.key, gate.limit)

    async def before_retry(self, reason: str, wait: float, named: float | None) -> None:
        if self.gate is None or reason not in REFUSALS or self.ticket is None:
            await trio.sleep(wait)
            return
        if named:  # before the place goes back: the requests queued for it wait too
            self.gate.pause(named)
        self._give(refused=True, full=not named)
        await trio.sleep(wait)
        await self._take()

    def rate_headers(self, headers: Mapping[str, str]) -> None:
        _pause_for_window(self.gate, headers)

    def hold(self, reason: str, seconds: float) -> None:
        if self.gate is not None and seconds > 0 and reason in REFUSALS:
            self.gate.pause(seconds)

    async def _take(self) -> None:
        assert self.gate is not None
        self.ticket = await self.gate.acquire()
        if self.gate.limit.adaptive:
            self.sent = trio.current_time()

    def _give(self, **how: Any) -> None:
        assert self.gate is not None and self.ticket is not None
        news = self.gate.release(self.ticket, model=self.model, **how)
        self.ticket = None
        if news and self.on_change is not None:
            self.on_change(self.key, self.gate.limit)


class InProcessLimiter:
    """The default `SharedLimiter`: one process, any number of trio loops (threads).

    The concurrency limit is a `SharedGate` per provider, counted across loops; its
    ``adaptive`` gate finds the provider's limit (docs/limits.md). Rate buckets are
    shared too, on the process's clock (`SharedRateLimiter`); a loop run on a test's
    virtual clock (trio's ``MockClock``) has its own, on that clock.
    """

    def __init__(self) -> None:
        self._gates: dict[str, SharedGate] = {}
        self._lock = threading.Lock()
        self._rates: weakref.WeakKeyDictionary[trio.lowlevel.TrioToken, dict[str, RateLimiter]] = (
            weakref.WeakKeyDictionary()
        )
        self._shared_rates: dict[str, SharedRateLimiter] = {}

    def adaptive(self, key: str, initial: int | None, ceiling: int) -> SharedGate:
        """The gate of provider ``key`` (made on first use): its limit starts at
        ``initial`` and moves (never past ``ceiling``) with what the provider's answers
        say; ``initial`` None: a fixed limit of ``ceiling``."""
        gate = self._gates.get(key)
        if gate is None:
            with self._lock:
                gate = self._gates.get(key)
                if gate is None:
                    limit = (
                        AdaptiveLimit.fixed(ceiling)
                        if initial is None
                        else AdaptiveLimit(initial=min(initial, ceiling), ceiling=ceiling)
                    )
                    gate = self._gates[key] = SharedGate(limit)
        return gate

    def gate(self, key: str, capacity: int) -> AbstractAsyncContextManager[object]:
        return _GateUse(self.adaptive(key, None, capacity))

    def rate(self, key: str, rpm: float | None, tpm: float | None) -> RateLimiter:
        if type(trio.lowlevel.current_clock()).__name__ != "MockClock":  # no trio.testing
            with self._lock:
                shared = self._shared_rates.get(key)
                if shared is None:
                    shared = self._shared_rates[key] = SharedRateLimiter(rpm, tpm)
            return shared
        token = trio.lowlevel.current_trio_token()
        rates = self._rates.get(token)
        if rates is None:
            rates = self._rates[token] = {}
        limiter = rates.get(key)
        if limiter is None:
            limiter = rates[key] = RateLimiter(rpm, tpm)
        return limiter
