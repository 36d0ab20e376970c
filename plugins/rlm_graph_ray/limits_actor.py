"""The cluster-wide provider limits of a Ray batch: one Ray actor, and the engine's side.

`ClusterLimits` is the actor's class: per provider key, a concurrency gate (capacity,
holders, a FIFO of waiters) and request/token buckets on the actor's clock. Every
completion of the batch, in whatever worker process or machine, asks this one actor, so
``max_concurrent``, RPM and TPM hold for the whole cluster.

`RayLimiter` is the `SharedLimiter` a completion's engine is given inside its Ray task:
each gate entry is a ticket ``<owner>/<n>``, where the owner names one attempt of one
item. When a worker dies holding tickets, the driver calls ``release_owner`` for that
attempt before retrying the item, so a dead worker never keeps a slot.

Invariants (actor side): a ticket is held or waiting, never both; ``in_use`` never
passes a key's capacity; releasing an unknown ticket is a no-op (a retry may race it).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

__all__ = ["ClusterLimits", "RayLimiter", "wait_ref"]


class _Gate:
    __slots__ = ("capacity", "holders", "peak", "waiters")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.holders: dict[str, str] = {}  # ticket -> owner
        self.waiters: deque[tuple[str, str, asyncio.Future[None]]] = deque()
        self.peak = 0


class _Bucket:
    __slots__ = ("clock", "lock", "requests", "rpm", "stamp", "tokens", "tpm")

    def __init__(self, rpm: float | None, tpm: float | None, clock: Callable[[], float]) -> None:
        self.rpm, self.tpm = rpm, tpm
        self.requests = float(rpm) if rpm else math.inf
        self.tokens = float(tpm) if tpm else math.inf
        self.clock = clock
        self.stamp = clock()
        self.lock = asyncio.Lock()

    def refill(self) -> None:
        now = self.clock()
        elapsed, self.stamp = now - self.stamp, now
        if self.rpm:
            self.requests = min(float(self.rpm), self.requests + elapsed * self.rpm / 60)
        if self.tpm:
            self.tokens = min(float(self.tpm), self.tokens + elapsed * self.tpm / 60)


class ClusterLimits:
    """Provider gates and rate buckets for every completion of one batch (a Ray actor).

    Every method is async, so Ray runs the actor on one asyncio loop: the state is only
    ever touched by one coroutine at a time, and waiters do not block other calls.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        # Injectable so that the bucket arithmetic is testable without waiting.
        self._clock, self._sleep = clock, sleep
        self._gates: dict[str, _Gate] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._tickets: dict[str, str] = {}  # ticket -> key, held or waiting
        # Released before its acquire ran (a caller cancelled at once): never grant it.
        self._released_early: set[str] = set()

    async def acquire(self, key: str, capacity: int, owner: str, ticket: str) -> None:
        """Wait for a slot of ``key`` (first come, first served) and hold it as ``ticket``."""
        if ticket in self._released_early:
            self._released_early.discard(ticket)
            return
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(capacity)
        self._tickets[ticket] = key
        if len(gate.holders) < gate.capacity and not gate.waiters:
            self._hold(gate, ticket, owner)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gate.waiters.append((ticket, owner, future))
        await future

    @staticmethod
    def _hold(gate: _Gate, ticket: str, owner: str) -> None:
        gate.holders[ticket] = owner
        gate.peak = max(gate.peak, len(gate.holders))

    def _release(self, ticket: str) -> None:
        key = self._tickets.pop(ticket, None)
        if key is None:
            self._released_early.add(ticket)
            return
        gate = self._gates[key]
        if gate.holders.pop(ticket, None) is None:  # still waiting: leave the queue
            for entry in gate.waiters:
                if entry[0] == ticket:
                    gate.waiters.remove(entry)
                    entry[2].set_result(None)  # its caller is gone; nothing is held
                    break
            return
        while gate.waiters and len(gate.holders) < gate.capacity:
            waiting, owner, future = gate.waiters.popleft()
            self._hold(gate, waiting, owner)
            future.set_result(None)

    async def release(self, ticket: str) -> None:
        """Give back a held slot, or leave the queue if still waiting."""
        self._release(ticket)

    async def release_owner(self, owner: str) -> int:
        """Give back every slot held or awaited by ``owner`` (a dead attempt); how many."""
        mine = [
            ticket
            for gate in self._gates.values()
            for ticket in [
                *(t for t, o in gate.holders.items() if o == owner),
                *(w[0] for w in gate.waiters if w[1] == owner),
            ]
        ]
        for ticket in mine:
            self._release(ticket)
        return len(mine)

    async def take_rate(self, key: str, rpm: float | None, tpm: float | None, tokens: int) -> None:
        """Wait until one request of about ``tokens`` tokens may go out, then take it."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(rpm, tpm, self._clock)
        tokens = min(tokens, int(tpm)) if tpm else 0
        async with bucket.lock:  # waiters in arrival order
            while True:
                bucket.refill()
                wait = 0.0
                if bucket.rpm and bucket.requests < 1:
                    wait = max(wait, (1 - bucket.requests) * 60 / bucket.rpm)
                if bucket.tpm and bucket.tokens < tokens:
                    wait = max(wait, (tokens - bucket.tokens) * 60 / bucket.tpm)
                if wait <= 0:
                    bucket.requests -= 1
                    bucket.tokens -= tokens
                    return
                await self._sleep(wait)

    async def settle(self, key: str, estimated: int, actual: int) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None and bucket.tpm:
            bucket.tokens -= actual - estimated

    async def forget_batch(self, batch: str) -> None:
        """Drop the gates and buckets of a finished batch (its keys start ``<batch>:``)."""
        prefix = batch + ":"
        for key in [k for k in self._gates if k.startswith(prefix)]:
            del self._gates[key]
        for key in [k for k in self._buckets if k.startswith(prefix)]:
            del self._buckets[key]
        owned = batch + "/"  # tickets are "<batch>/<item>#<attempt>/<n>"
        for ticket in [t for t in self._tickets if t.startswith(owned)]:
            del self._tickets[ticket]
        self._released_early = {t for t in self._released_early if not t.startswith(owned)}

    async def statistics(self) -> dict[str, dict[str, int]]:
        """Per key: capacity, slots held now, the peak held, waiters (for tests and debugging)."""
        return {
            key: {"capacity": g.capacity, "in_use": len(g.holders), "peak": g.peak, "waiting": len(g.waiters)}
            for key, g in self._gates.items()
        }


async def wait_ref(ref: Any) -> Any:
    """Await a Ray ``ObjectRef`` from trio without a thread: its future's callback wakes us."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = ref.future()

    def wake(_: object) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:  # the completion ended before the answer came
            pass

    future.add_done_callback(wake)
    await done.wait()
    return future.result()


class _RayGate:
    def __init__(self, limiter: RayLimiter, key: str, capacity: int) -> None:
        self._limiter, self._key, self._capacity = limiter, key, capacity
        self._ticket: str | None = None

    async def __aenter__(self) -> None:
        limiter = self._limiter
        ticket = f"{limiter.owner}/{next(limiter.counter)}"
        ref = limiter.actor.acquire.remote(self._key, self._capacity, limiter.owner, ticket)
        try:
            await wait_ref(ref)
        except BaseException:
            # Cancelled while queued (or the grant is in flight): give it back either way.
            limiter.actor.release.remote(ticket)
            raise
        self._ticket = ticket

    async def __aexit__(self, *exc: object) -> None:
        if self._ticket is not None:
            self._limiter.actor.release.remote(self._ticket)  # no need to wait for it
            self._ticket = None


class _RayRate:
    def __init__(self, limiter: RayLimiter, key: str, rpm: float | None, tpm: float | None) -> None:
        self._limiter, self._key, self._rpm, self._tpm = limiter, key, rpm, tpm

    async def acquire(self, tokens: int = 0) -> None:
        await wait_ref(self._limiter.actor.take_rate.remote(self._key, self._rpm, self._tpm, tokens))

    def settle(self, estimated: int, actual: int) -> None:
        self._limiter.actor.settle.remote(self._key, estimated, actual)


class RayLimiter:
    """The `SharedLimiter` of a completion run by the Ray executor: asks the batch's actor.

    Args:
        actor: the `ClusterLimits` actor handle.
        batch: the batch's id: its provider keys in the actor are ``<batch>:<key>``.
        owner: this attempt of this item (``"<batch>/<item id>#<attempt>"``); its tickets
            are released together if the worker dies.
    """

    def __init__(self, actor: Any, *, batch: str, owner: str) -> None:
        self.actor = actor
        self.batch = batch
        self.owner = owner
        self.counter = itertools.count(1)

    def gate(self, key: str, capacity: int) -> _RayGate:
        return _RayGate(self, f"{self.batch}:{key}", capacity)

    def rate(self, key: str, rpm: float | None, tpm: float | None) -> _RayRate:
        return _RayRate(self, f"{self.batch}:{key}", rpm, tpm)
