"""Capacity and rate limits, shared by a whole recursion tree and every run of an engine.

Three levels of concurrency, each a named ``trio.CapacityLimiter``:
    - per provider (``provider:<name>``): the real rate-limit boundary; every depth of
      every run of one engine shares it, so no product of the other limits can exceed it;
    - per batch (``batch:<node>``, ``batch_max_concurrent``): one per ``*_batched`` call;
    - child completions in flight (``subcalls:depth-N``, ``max_concurrent_subcalls``):
      tree-wide, one limiter per depth (see `LoopLimiters.subcalls`).

Rates are token buckets on trio's clock (so ``MockClock`` tests are instant):
requests per minute and tokens per minute per provider.

A provider's concurrency gate and rate buckets must hold beyond one loop: across threads
of one process, and, for a batch on a cluster, across processes and machines. The engine
reaches them through a `SharedLimiter` it is given and never asks which one it has: by
default an `InProcessLimiter`; a batch executor may supply its own (the Ray executor's
lives in a Ray actor, see plugins/rlm_graph_ray).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from contextlib import AbstractAsyncContextManager

import trio

from ..contracts import RateGate, SharedLimiter, Usage
from ..limits import Budget, RateBucket, Reservation

__all__ = [
    "BudgetGate",
    "InProcessLimiter",
    "LoopLimiters",
    "RateGate",
    "RateLimiter",
    "SharedGate",
    "SharedLimiter",
]


class BudgetGate:
    """Makes a call wait until its estimated tokens and dollars fit the run's limits.

    One per run (a run lives in one trio loop). `reserve` parks until `Budget.fits`;
    every `settle` or `release` wakes the parked calls to check again. With nothing in
    flight a call always goes, so the gate cannot deadlock.
    """

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._parked = trio.lowlevel.ParkingLot()
        self._largest: dict[str, float] = {}

    def estimate(self, model: str) -> float | None:
        """The largest real cost of a call of ``model`` so far: the estimate of a call the
        price table cannot price (a provider that reports its own costs); None before
        the first such call has settled."""
        return self._largest.get(model)

    async def reserve(self, tokens: int, cost: float | None, model: str = "") -> Reservation:
        while not self.budget.fits(tokens, cost):
            await self._parked.park()
        return self.budget.reserve(tokens, cost, model)

    def release(self, reservation: Reservation) -> None:
        self.budget.release(reservation)
        self._parked.unpark_all()

    def settle(self, reservation: Reservation, usage: Usage, cost: float | None) -> str | None:
        """Charge the call's real usage in place of its reservation; the limit now
        passed, if any."""
        if cost is not None:
            self._largest[reservation.model] = max(self._largest.get(reservation.model, 0.0), cost)
        exceeded = self.budget.settle(reservation, usage, cost)
        self._parked.unpark_all()
        return exceeded


class RateLimiter:
    """Requests-per-minute and tokens-per-minute buckets for one provider, on trio's
    clock (the arithmetic is `RateBucket`'s)."""

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
            while (wait := self._bucket.take_or_wait(tokens, trio.current_time())) > 0:
                await trio.sleep(wait)

    def settle(self, estimated: int, actual: int) -> None:
        """Correct the token bucket once the real usage of a request is known."""
        self._bucket.settle(estimated, actual)


class _Waiter:
    __slots__ = ("event", "granted", "token")

    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.event = trio.Event()
        self.granted = False


class SharedGate:
    """A provider's concurrency limit across trio loops (threads).

    trio's `CapacityLimiter` belongs to one loop; sync ``completion()`` calls made at the
    same time from several threads each run their own loop. The gate counts every
    request of the engine, whatever its loop, so the provider's ``max_concurrent`` holds
    for them all. Inside one loop the loop's `CapacityLimiter` queues requests first
    (fairly, in order), so the gate only ever makes a request wait for other loops'.
    """

    def __init__(self, capacity: int) -> None:
        self._lock = threading.Lock()
        self._free = capacity
        self.capacity = capacity
        self._waiters: deque[_Waiter] = deque()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    async def __aenter__(self) -> None:
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return
            waiter = _Waiter()
            self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            with self._lock:
                if waiter.granted:  # handed a slot while being cancelled: pass it on
                    self._release_locked()
                else:
                    self._waiters.remove(waiter)
            raise

    async def __aexit__(self, *exc: object) -> None:
        with self._lock:
            self._release_locked()

    def _release_locked(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.granted = True
            try:
                waiter.token.run_sync_soon(waiter.event.set)
            except trio.RunFinishedError:  # that loop has ended: try the next waiter
                continue
            return
        self._free += 1


class InProcessLimiter:
    """The default `SharedLimiter`: one process, any number of trio loops (threads).

    The concurrency gate is a `SharedGate` per provider, counted across loops. Rate
    buckets run on trio's clock, which belongs to one loop, so each loop has its own.
    """

    def __init__(self) -> None:
        self._gates: dict[str, SharedGate] = {}
        self._rates: weakref.WeakKeyDictionary[trio.lowlevel.TrioToken, dict[str, RateLimiter]] = (
            weakref.WeakKeyDictionary()
        )

    def gate(self, key: str, capacity: int) -> SharedGate:
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates.setdefault(key, SharedGate(capacity))
        return gate

    def rate(self, key: str, rpm: float | None, tpm: float | None) -> RateLimiter:
        token = trio.lowlevel.current_trio_token()
        rates = self._rates.get(token)
        if rates is None:
            rates = self._rates[token] = {}
        limiter = rates.get(key)
        if limiter is None:
            limiter = rates[key] = RateLimiter(rpm, tpm)
        return limiter


class LoopLimiters:
    """The limiters of one engine inside one trio loop.

    trio primitives belong to the loop they were used in, so an engine keeps one
    `LoopLimiters` per loop; every run inside that loop (and every depth of each) shares it.
    Provider gates and rates come from the engine's `SharedLimiter`.
    """

    def __init__(self, max_concurrent_subcalls: int, shared: SharedLimiter | None = None) -> None:
        self._providers: dict[str, trio.CapacityLimiter] = {}
        self._shared: SharedLimiter = shared if shared is not None else InProcessLimiter()
        self._subcalls: dict[int, trio.CapacityLimiter] = {}
        self._max_subcalls = max_concurrent_subcalls

    def subcalls(self, depth: int) -> trio.CapacityLimiter:
        """The limiter of child completions at ``depth``, shared by the whole tree.

        One limiter per depth rather than one for all: a child holding a slot while it
        waits for its own children would otherwise starve them of slots, and a tree whose
        every slot-holder waits on a grandchild deadlocks. Per depth, the children in
        flight at any level are bounded, and the provider limiter bounds the total.
        """
        limiter = self._subcalls.get(depth)
        if limiter is None:
            limiter = self._subcalls[depth] = trio.CapacityLimiter(self._max_subcalls)
        return limiter

    def provider(self, key: str, capacity: int) -> trio.CapacityLimiter:
        limiter = self._providers.get(key)
        if limiter is None:
            limiter = self._providers[key] = trio.CapacityLimiter(capacity)
        return limiter

    def gate(self, key: str, capacity: int) -> AbstractAsyncContextManager[object]:
        """The gate of a provider beyond this loop (the engine's `SharedLimiter`)."""
        return self._shared.gate(key, capacity)

    def rate(self, key: str, rpm: float | None, tpm: float | None) -> RateGate | None:
        if not rpm and not tpm:
            return None
        return self._shared.rate(key, rpm, tpm)

    def statistics(self) -> dict[str, object]:
        """Limiter statistics by name, for debugging a stuck or slow run."""
        stats: dict[str, object] = {
            f"provider:{k}": v.statistics() for k, v in self._providers.items()
        }
        for depth, limiter in self._subcalls.items():
            stats[f"subcalls:depth-{depth}"] = limiter.statistics()
        return stats
