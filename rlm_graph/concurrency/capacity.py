"""Capacity limits of one trio loop, shared by a whole recursion tree and every run of
an engine in that loop, and the run's budget gate.

Three levels of concurrency, each a named ``trio.CapacityLimiter``:
    - per provider (``provider:<name>``): the real rate-limit boundary; every depth of
      every run of one engine shares it, so no product of the other limits can exceed it;
    - per batch (``batch:<node>``, ``batch_max_concurrent``): one per ``*_batched`` call;
    - child completions in flight (``max_concurrent_subcalls``): per run, tree-wide, one
      limiter per depth (`rlm_graph.runtime.context.Run.subcalls`).

A provider's concurrency gate and rate buckets must hold beyond one loop: across threads
of one process, and, for a batch on a cluster, across processes and machines. The engine
reaches them through a `SharedLimiter` it is given and never asks which one it has
(beyond whether it adapts): by default an `InProcessLimiter`
(rlm_graph.concurrency.limiter); a batch executor may supply its own (the Ray
executor's lives in a Ray actor, see plugins/rlm_graph_ray).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..contracts import RateGate, SharedLimiter, Usage
from ..limits import Budget, Reservation
from .adaptive import AdaptiveLimit
from .limiter import InProcessLimiter, ProviderSlot, SharedGate

__all__ = [
    "BudgetGate",
    "InProcessLimiter",
    "LoopLimiters",
    "RateGate",
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

    def try_reserve(self, tokens: int, cost: float | None, model: str = "") -> Reservation | None:
        """`reserve` if the estimate fits now; None (nothing held) if it would wait."""
        if not self.budget.fits(tokens, cost):
            return None
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


class LoopLimiters:
    """The limiters of one engine inside one trio loop.

    trio primitives belong to the loop they were used in, so an engine keeps one
    `LoopLimiters` per loop; every run inside that loop (and every depth of each) shares it.
    Provider gates and rates come from the engine's `SharedLimiter`.
    """

    def __init__(self, shared: SharedLimiter | None = None) -> None:
        self._providers: dict[str, trio.CapacityLimiter] = {}
        self._shared: SharedLimiter = shared if shared is not None else InProcessLimiter()
        self._gates: dict[str, SharedGate] = {}  # the in-process limiter's, looked up once

    def provider(self, key: str, capacity: int) -> trio.CapacityLimiter:
        limiter = self._providers.get(key)
        if limiter is None:
            limiter = self._providers[key] = trio.CapacityLimiter(capacity)
        return limiter

    def slot(
        self,
        key: str,
        initial: int | None,
        ceiling: int,
        model: str,
        on_change: Callable[[str, AdaptiveLimit], None] | None = None,
    ) -> ProviderSlot | SharedGate:
        """A call's place under provider ``key``'s limit, beyond this loop: a
        `ProviderSlot` of a limit that adapts from ``initial`` up to ``ceiling``, or, with
        ``initial`` None, the gate of a fixed limit of ``ceiling`` (itself the context
        manager: nothing to learn). Only the in-process limiter adapts; a
        `SharedLimiter` of another kind (the Ray actor, a user's) holds a fixed gate at
        the limit's start."""
        gate = self._gates.get(key)
        if gate is None and isinstance(self._shared, InProcessLimiter):
            gate = self._gates[key] = self._shared.adaptive(key, initial, ceiling)
        if gate is not None:
            if not gate.limit.adaptive:
                return gate
            return ProviderSlot(key, gate, None, model, on_change)
        start = ceiling if initial is None else min(initial, ceiling)
        return ProviderSlot(key, None, self._shared.gate(key, start), model, on_change)

    def rate(self, key: str, rpm: float | None, tpm: float | None) -> RateGate | None:
        if not rpm and not tpm:
            return None
        return self._shared.rate(key, rpm, tpm)

    def statistics(self) -> dict[str, object]:
        """Limiter statistics by name, for debugging a stuck or slow run."""
        stats: dict[str, object] = {
            f"provider:{k}": v.statistics() for k, v in self._providers.items()
        }
        return stats
