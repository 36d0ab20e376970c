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

import math
from collections.abc import Callable
from typing import Any

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
        # Per model: [counted, estimated] input tokens of calls big enough to tell, and
        # [reported dollars, estimated tokens] of calls that reported a cost.
        self._inputs: dict[str, list[float]] = {}
        self._costs: dict[str, list[float]] = {}

    def estimate(
        self, model: str, input_tokens: int, output_tokens: int, price: Callable[[Usage], Any]
    ) -> tuple[int, float | None]:
        """A call's tokens and dollars before it goes.

        The prompt's estimate (`rlm_graph.limits.reserved_tokens`) scaled by the ratio
        of counted to estimated input over this run's calls of ``model`` (`_learn`: a
        tokenizer that counts more than the estimate, at most `MAX_INPUT_SCALE`); priced
        from the table (``price``), else at what the run's reported costs have come to
        per estimated token (a provider that reports its own costs: a call over a larger
        prompt is dearer); before the first such cost, None (the call then goes only
        alone)."""
        counted = self._inputs.get(model)
        scale = min(max(counted[0] / counted[1], 1.0), MAX_INPUT_SCALE) if counted else 1.0
        scaled = math.ceil(input_tokens * scale)
        tokens = scaled + output_tokens
        cost = price(Usage(input_tokens=scaled, output_tokens=output_tokens))
        reported = self._costs.get(model)
        if cost is None and reported is not None:
            cost = reported[0] / reported[1] * tokens
        return tokens, cost

    async def reserve(
        self, tokens: int, cost: float | None, model: str = "", estimated_input: int = 0
    ) -> Reservation:
        while not self.budget.fits(tokens, cost):
            await self._parked.park()
        return self.budget.reserve(tokens, cost, model, estimated_input)

    def try_reserve(
        self, tokens: int, cost: float | None, model: str = "", estimated_input: int = 0
    ) -> Reservation | None:
        """`reserve` if the estimate fits now; None (nothing held) if it would wait."""
        if not self.budget.fits(tokens, cost):
            return None
        return self.budget.reserve(tokens, cost, model, estimated_input)

    def release(self, reservation: Reservation) -> None:
        self.budget.release(reservation)
        self._parked.unpark_all()

    def settle(self, reservation: Reservation, usage: Usage, cost: float | None) -> str | None:
        """Charge the call's real usage in place of its reservation; the limit now
        passed, if any."""
        self._learn(reservation, usage, cost)
        exceeded = self.budget.settle(reservation, usage, cost)
        self._parked.unpark_all()
        return exceeded

    def _learn(self, reservation: Reservation, usage: Usage, cost: float | None) -> None:
        """What the call's real usage says of the next estimates of its model: the
        run's totals so far, so that one odd call moves them little."""
        model = reservation.model
        if reservation.estimated_input >= LEARN_FROM and usage.input_tokens:
            counted = self._inputs.setdefault(model, [0.0, 0.0])
            counted[0] += min(usage.input_tokens, MAX_INPUT_SCALE * reservation.estimated_input)
            counted[1] += reservation.estimated_input
        if cost is not None and reservation.tokens and math.isfinite(cost) and cost >= 0:
            reported = self._costs.setdefault(model, [0.0, 0.0])
            reported[0] += cost
            reported[1] += reservation.tokens


MAX_INPUT_SCALE = 8.0
"""The most a prompt's estimate is scaled by what servers counted (a character a token,
as CJK text, is 4; a server's absurd count does not make every later call wait alone)."""

LEARN_FROM = 256
"""The smallest prompt estimate (tokens) whose count corrects the next estimates: a short
prompt's count is mostly the chat template's own tokens (``"hi"`` is 1 estimated, 9
counted), which says nothing of a long one's."""


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
