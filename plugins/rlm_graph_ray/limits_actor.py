"""The cluster-wide provider limits of a Ray batch: one Ray actor, and the engine's side.

`ClusterLimits` is the actor's class: per provider key, a concurrency gate (capacity,
holders, a FIFO of waiters) and request/token buckets on the actor's clock. Every
completion of the batch, in whatever worker process or machine, asks this one actor, so
``max_concurrent``, RPM and TPM hold for the whole cluster.

`RayLimiter` is the `SharedLimiter` the engines of a batch's completions are given in a
worker process: each gate entry is a ticket ``<owner>/<n>``, where the owner names one
worker's share of one batch (or one attempt of one item). When a worker dies holding
tickets, the driver calls ``release_owner`` for it before retrying its items, so a dead
worker never keeps a slot. A worker keeps released slots for its next calls until the
actor recalls them for someone else (see `RayLimiter.recall`).

Invariants (actor side): a ticket is held or waiting, never both; ``in_use`` never
passes a key's capacity; releasing an unknown ticket is a no-op (a retry may race it).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rlm_graph.executors import RateBucket

__all__ = ["ClusterLimits", "RayLimiter", "wait_ref"]


class _Gate:
    __slots__ = ("capacity", "holders", "peak", "recalled", "waiters")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.holders: dict[str, str] = {}  # ticket -> owner
        self.waiters: deque[tuple[str, str, asyncio.Future[None]]] = deque()
        self.peak = 0
        # Owners asked to give back their idle slots since they last asked for one.
        self.recalled: set[str] = set()


class _Bucket:
    """A key's `RateBucket`, and the lock that keeps its waiters in arrival order."""

    __slots__ = ("lock", "rates")

    def __init__(self, rpm: float | None, tpm: float | None) -> None:
        self.rates = RateBucket(rpm, tpm)
        self.lock = asyncio.Lock()


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
        # Owners that keep released slots for their next request (a worker's shared
        # `RayLimiter`), and the handle that gives them back on request (``recall``).
        self._keepers: dict[str, Any] = {}
        # Orders the "someone waits" news a keeper gets (answers and recalls may cross).
        self._news = itertools.count(1)

    def _enqueue(self, gate: _Gate, key: str, owner: str, ticket: str) -> None:
        """Hold ``ticket`` at once if a slot is free and nobody waits, else queue it."""
        if ticket in self._tickets:
            return  # asked again while it waits: it keeps its place
        if ticket in self._released_early:
            self._released_early.discard(ticket)
            return
        self._tickets[ticket] = key
        if len(gate.holders) < gate.capacity and not gate.waiters:
            self._hold(gate, ticket, owner)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gate.waiters.append((ticket, owner, future))
        self._recall_idle(gate, key, owner)

    def _recall_idle(self, gate: _Gate, key: str, asker: str) -> None:
        """Someone waits for ``key``: ask every other keeper holding its slots to give back
        those it is not using (once until that keeper asks again)."""
        for holder in set(gate.holders.values()) - gate.recalled - {asker}:
            keeper = self._keepers.get(holder)
            if keeper is not None:
                gate.recalled.add(holder)
                keeper.recall.remote(holder, key, next(self._news))

    async def acquire_many(
        self, key: str, capacity: int, owner: str, tickets: list[str]
    ) -> list[str]:
        """Queue ``tickets`` for slots of ``key`` (in order, first come first served) and
        wait until at least one of them holds a slot; return those that do.

        The others keep their places: ask again with them to wait for the next grant.
        A caller's requests made at the same moment travel as one message this way (a
        batch of sub-calls asks once, not once per slot). Returns ``[]`` when every one
        of them was released meanwhile.
        """
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(capacity)
        for ticket in tickets:
            self._enqueue(gate, key, owner, ticket)
        held = [t for t in tickets if t in gate.holders]
        if held:
            return held
        waiting = [w[2] for w in gate.waiters if w[0] in set(tickets)]
        if waiting:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        return [t for t in tickets if t in gate.holders]

    async def acquire_kept(
        self, key: str, capacity: int, owner: str, tickets: list[str], keeper: Any
    ) -> tuple[list[str], bool, int]:
        """`acquire_many` for an owner that keeps released slots for later (``keeper``,
        asked to ``recall(owner, key, news)`` them when someone else waits); with the
        granted tickets, whether anyone waits for ``key`` now (then the owner gives slots
        back as soon as it is done with them), and the news number of that answer.

        News numbers grow with time: a keeper acts on an answer or a recall only if it is
        newer than the last it acted on, so a late "nobody waits" never undoes a recall.
        An owner told "nobody waits" is recalled again by the next waiter.
        """
        self._keepers[owner] = keeper
        held = await self.acquire_many(key, capacity, owner, tickets)
        gate = self._gates[key]
        contended = bool(gate.waiters)
        if not contended:
            gate.recalled.discard(owner)
        return held, contended, next(self._news)

    async def acquire(self, key: str, capacity: int, owner: str, ticket: str) -> None:
        """Wait for a slot of ``key`` and hold it as ``ticket`` (one-ticket `acquire_many`);
        returns without a slot if ``ticket`` is released meanwhile."""
        while not await self.acquire_many(key, capacity, owner, [ticket]):
            if ticket not in self._tickets:
                return

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

    async def release_many(self, tickets: list[str]) -> None:
        """`release` for each of ``tickets`` (a caller's releases of one moment, as one message)."""
        for ticket in tickets:
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
            bucket = self._buckets[key] = _Bucket(rpm, tpm)
        async with bucket.lock:  # waiters in arrival order
            while (wait := bucket.rates.take_or_wait(tokens, self._clock())) > 0:
                await self._sleep(wait)

    async def settle(self, key: str, estimated: int, actual: int) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.rates.settle(estimated, actual)

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
        for owner in [o for o in self._keepers if o.startswith(owned)]:
            del self._keepers[owner]

    async def statistics(self) -> dict[str, dict[str, int]]:
        """Per key: capacity, slots held now, the peak held, waiters (for tests and debugging)."""
        return {
            key: {
                "capacity": g.capacity,
                "in_use": len(g.holders),
                "peak": g.peak,
                "waiting": len(g.waiters),
            }
            for key, g in self._gates.items()
        }


class _Want:
    """One request of this completion for a slot, as the client side sees it."""

    __slots__ = ("asked", "error", "event", "granted", "ticket")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.asked = False  # in an acquire_many now in flight
        self.granted = False
        self.ticket: str | None = None  # the ticket granted: its own, or one handed over
        self.error: BaseException | None = None


class _RayGate:
    def __init__(self, limiter: RayLimiter, key: str, capacity: int) -> None:
        self._limiter, self._key, self._capacity = limiter, key, capacity
        self._ticket: str | None = None

    async def __aenter__(self) -> None:
        self._ticket = await self._limiter.acquire(self._key, self._capacity)

    async def __aexit__(self, *exc: object) -> None:
        if self._ticket is not None:
            self._limiter.release(self._ticket, self._key)
            self._ticket = None


class _RayRate:
    def __init__(self, limiter: RayLimiter, key: str, rpm: float | None, tpm: float | None) -> None:
        self._limiter, self._key, self._rpm, self._tpm = limiter, key, rpm, tpm

    async def acquire(self, tokens: int = 0) -> None:
        await wait_ref(
            self._limiter.actor.take_rate.remote(self._key, self._rpm, self._tpm, tokens)
        )

    def settle(self, estimated: int, actual: int) -> None:
        self._limiter.actor.settle.remote(self._key, estimated, actual)


class RayLimiter:
    """The `SharedLimiter` of a completion run by the Ray executor: asks the batch's actor.

    Requests for slots made at the same moment (the slots of one ``llm_query_batched``)
    go to the actor as one ``acquire_many`` message, and releases of one moment as one
    ``release_many``: the actor serves every completion of the cluster, so messages are
    what it spends its time on. Both are sent from trio's ``run_sync_soon`` queue, after
    every task that was ready has run; `flush` sends what is left when the completion ends.

    With a ``keeper`` (one limiter shared by every completion of a batch in one worker
    process), a released slot is not sent back: it goes to the oldest request of this
    process still waiting, else it stays held here, idle, and the next request takes it
    with no message at all. The actor still counts it as held, so the cluster-wide limit
    is never passed; when someone else waits for the key, the actor asks the keeper to
    `recall` the idle ones, and until this process's next grant finds nobody waiting,
    releases go straight back.

    Args:
        actor: the `ClusterLimits` actor handle.
        batch: the batch's id: its provider keys in the actor are ``<batch>:<key>``.
        owner: who holds the tickets (one attempt of one item, ``"<batch>/<item
            id>#<attempt>"``, or one worker process's share of a batch); they are released
            together if the worker dies.
        keeper: the actor handle of the worker process that runs this limiter (its
            ``recall(owner, key)`` calls `recall`); None: every release is sent back.
    """

    def __init__(self, actor: Any, *, batch: str, owner: str, keeper: Any = None) -> None:
        self.actor = actor
        self.batch = batch
        self.owner = owner
        self.keeper = keeper
        self._counter = itertools.count(1)
        self._wants: dict[str, dict[str, _Want]] = {}  # key -> ticket -> want, in order
        self._asking: set[str] = set()  # keys with a send scheduled
        self._releases: list[str] = []
        self._idle: dict[str, list[str]] = {}  # key -> held here, used by nobody (keeper only)
        self._contended: set[str] = set()  # keys someone else waits for: send releases back
        self._news: dict[str, int] = {}  # key -> the newest news acted on (see acquire_kept)

    def gate(self, key: str, capacity: int) -> _RayGate:
        return _RayGate(self, f"{self.batch}:{key}", capacity)

    def rate(self, key: str, rpm: float | None, tpm: float | None) -> _RayRate:
        return _RayRate(self, f"{self.batch}:{key}", rpm, tpm)

    async def acquire(self, key: str, capacity: int) -> str:
        """Wait for a slot of ``key``; the ticket that holds it."""
        idle = self._idle.get(key)
        if idle:
            return idle.pop()
        ticket = f"{self.owner}/{next(self._counter)}"
        want = _Want()
        self._wants.setdefault(key, {})[ticket] = want
        self._schedule_ask(key, capacity)
        try:
            await want.event.wait()
        except BaseException:
            # Cancelled while queued (or while the grant was on its way): give it back.
            if want.granted and want.ticket is not None:
                self.release(want.ticket, key)
            else:
                self._wants.get(key, {}).pop(ticket, None)
                self._send_release(ticket)
            raise
        if want.error is not None:
            raise want.error
        assert want.ticket is not None  # set with granted
        return want.ticket

    def release(self, ticket: str, key: str | None = None) -> None:
        """Give a slot of ``key`` back (or leave the queue): to a request of this process
        that waits, else kept idle (with a keeper and nobody else waiting), else sent
        with the other releases of this moment."""
        if self.keeper is None or key is None:
            self._send_release(ticket)
            return
        wants = self._wants.get(key)
        if wants:
            own, want = next(iter(wants.items()))
            del wants[own]
            want.granted, want.ticket = True, ticket
            want.event.set()
            self._send_release(own)  # its own place in the actor's line
        elif key in self._contended:
            self._send_release(ticket)
        else:
            self._idle.setdefault(key, []).append(ticket)

    def recall(self, key: str, news: int) -> None:
        """Someone else waits for ``key``: send back the idle slots, and from now on
        every slot as soon as it is released (until a newer grant finds nobody waiting)."""
        self._hear(key, contended=True, news=news)

    def _hear(self, key: str, *, contended: bool, news: int) -> None:
        if news <= self._news.get(key, 0):
            return  # older than what this limiter acted on already
        self._news[key] = news
        if not contended:
            self._contended.discard(key)
            return
        self._contended.add(key)
        for ticket in self._idle.pop(key, []):
            self._send_release(ticket)

    def _send_release(self, ticket: str) -> None:
        if not self._releases:
            trio.lowlevel.current_trio_token().run_sync_soon(self.flush)
        self._releases.append(ticket)

    def flush(self) -> None:
        """Send the releases not sent yet (also called when the completion ends)."""
        if self._releases:
            tickets, self._releases = self._releases, []
            self.actor.release_many.remote(tickets)

    def _schedule_ask(self, key: str, capacity: int) -> None:
        if key not in self._asking:
            self._asking.add(key)
            trio.lowlevel.current_trio_token().run_sync_soon(self._ask, key, capacity)

    def _ask(self, key: str, capacity: int) -> None:
        """Send every request of ``key`` not in flight as one ``acquire_many``."""
        self._asking.discard(key)
        wants = self._wants.get(key, {})
        tickets = [t for t, w in wants.items() if not w.asked]
        if not tickets:
            return
        for ticket in tickets:
            wants[ticket].asked = True
        token = trio.lowlevel.current_trio_token()
        if self.keeper is None:
            future = self.actor.acquire_many.remote(key, capacity, self.owner, tickets).future()
        else:
            future = self.actor.acquire_kept.remote(
                key, capacity, self.owner, tickets, self.keeper
            ).future()

        def arrived(done: Any) -> None:
            try:
                token.run_sync_soon(self._answered, key, capacity, tickets, done)
            except trio.RunFinishedError:  # the completion has ended
                pass

        future.add_done_callback(arrived)

    def _answered(self, key: str, capacity: int, tickets: list[str], done: Any) -> None:
        """An ``acquire_many`` came back: wake the granted, ask again for the rest."""
        wants = self._wants.get(key, {})
        try:
            answer = done.result()
        except Exception as exc:  # the actor died: every waiter of this call fails
            for ticket in tickets:
                want = wants.pop(ticket, None)
                if want is not None:
                    want.error = exc
                    want.event.set()
            return
        if self.keeper is None:
            granted = set(answer)
        else:
            granted = set(answer[0])
            self._hear(key, contended=answer[1], news=answer[2])
        for ticket in tickets:
            want = wants.get(ticket)
            if want is None:
                continue  # cancelled or served meanwhile; its release is on its way
            if ticket in granted:
                del wants[ticket]
                want.granted, want.ticket = True, ticket
                want.event.set()
            else:
                want.asked = False
        if any(not w.asked for w in wants.values()):
            self._schedule_ask(key, capacity)


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
