"""Hedged sub-calls: a request and, past its model's latency quantile, one duplicate,
racing in the send stage (`rlm_graph.runtime.calls`; docs/limits.md, "Hedged
sub-calls"). The policy and its arithmetic are `policy`.

Invariants:
    - A duplicate goes only after the first request has held its provider slot for the
      delay (the quantile of the model's latencies in this tree, the calls in flight
      counted: `HedgeBudget.delay`; read again as calls answer), only within
      the tree's ``max_extra`` share of calls, and only if its estimate fits the budget
      now (it never waits for budget: a hedge that would wait is not worth sending).
    - The first answer wins and the other request is cancelled. A request that fails
      leaves the other to answer; the call fails only when both did, with the error that
      came first.
    - The duplicate passes the same limiters as any request, and its reservation is
      the caller's to settle (`Duplicate`) or, when the call fails, given back here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from ..contracts import ChatResponse
from ..graph import NodeRecord
from ..limits import Reservation
from .policy import HedgeBudget

__all__ = ["Duplicate", "Send", "race"]

Send = Callable[[bool, Callable[[], bool]], Awaitable[ChatResponse]]
"""One request of the call through the provider's limiters: ``send(first, on_slot)``;
``on_slot`` is called when the request got its slot (its service time starts) and says
whether to send it (False: the race is over, the request is about to be cancelled)."""


class Duplicate:
    """A duplicate request that went: its budget reservation, settled with the call's
    accounting (None: the run has no token or dollar limit), and whether the request
    that lost is billed (False when it failed rather than being cancelled)."""

    __slots__ = ("billed", "reservation")

    def __init__(self, reservation: Reservation | None) -> None:
        self.reservation = reservation
        self.billed = True


class _Race:
    __slots__ = (
        "duplicate",
        "duplicate_went",
        "errors",
        "failed",
        "over",
        "running",
        "started",
        "wake",
        "winner",
    )

    def __init__(self) -> None:
        self.winner: tuple[int, ChatResponse] | None = None
        self.errors: list[Exception] = []
        self.running = 0
        self.started = trio.Event()  # the first request got its slot (or ended)
        self.over = trio.Event()  # an answer came, or every request sent has failed
        self.wake = trio.Event()  # over, or the model's delay became known
        self.duplicate_went = False  # the duplicate got its slot while the race was on
        self.failed: set[int] = set()  # requests that ended in an error (not billed)
        self.duplicate: Duplicate | None = None  # the duplicate launched, if one was

    async def run(
        self,
        send: Send,
        hedges: HedgeBudget,
        model: str,
        reserve_now: Callable[[], Reservation | None] | None,
    ) -> None:
        """The first request, and the duplicate once the call is past its delay, until
        one answers (the loser cancelled) or every one sent has failed."""
        async with trio.open_nursery() as nursery:
            self.running += 1  # counted before its task runs: a quick failure sees it
            nursery.start_soon(self.attempt, 0, send)
            await self.started.wait()
            began = trio.current_time()
            hedges.began(model)
            try:
                if await self.wait_until_past(hedges, model, began):
                    self.duplicate = _launch(self, hedges, reserve_now)
                    if self.duplicate is not None:
                        self.running += 1
                        nursery.start_soon(self.attempt, 1, send)
                await self.over.wait()
                if 0 not in self.failed:
                    # One latency a call, the first request's: when the duplicate won,
                    # the first ran at least this long (its own answer is never heard).
                    hedges.answered(model, trio.current_time() - began)
            finally:
                hedges.ended(model)
            nursery.cancel_scope.cancel()  # the loser's request

    async def wait_until_past(self, hedges: HedgeBudget, model: str, began: float) -> bool:
        """Wait until the call has run past its model's delay (True), or is over (False).
        The delay moves as calls answer: it is read again at each wake-up."""
        while not self.over.is_set():
            delay = hedges.delay(model)
            if delay is None:
                hedges.when_known(model, self.wake.set)
                await self.wake.wait()
                self.wake = trio.Event()
            elif trio.current_time() - began >= delay:
                return True
            else:
                with trio.move_on_at(began + delay):
                    await self.over.wait()
        return False

    def _first_slot(self) -> bool:
        self.started.set()
        return True

    def _duplicate_slot(self) -> bool:
        # A slot handed over by the first request as it answered comes too late: the
        # race is over, the duplicate is about to be cancelled before it sends.
        self.duplicate_went = not self.over.is_set()
        return self.duplicate_went

    async def attempt(self, index: int, send: Send) -> None:
        """One request of the race (the caller counted it in ``running``)."""
        on_slot = self._first_slot if index == 0 else self._duplicate_slot
        try:
            response = await send(index == 0, on_slot)
        except Exception as exc:  # a failed request: the other may still answer
            self.errors.append(exc)
            self.failed.add(index)
        else:
            if self.winner is None:
                self.winner = (index, response)
        finally:
            self.running -= 1
            self.started.set()
            if self.winner is not None or self.running == 0:
                self.over.set()
                self.wake.set()


async def race(
    hedges: HedgeBudget,
    model: str,
    record: NodeRecord,
    send: Send,
    reserve_now: Callable[[], Reservation | None] | None,
    release: Callable[[Reservation], None],
) -> tuple[ChatResponse, Duplicate | None]:
    """Send a call, and one duplicate if it is still unanswered past its model's delay.

    Args:
        hedges: the tree's hedging (latencies, duplicates sent).
        model: the model the call asks (latencies are per model).
        record: the call's node (gets ``hedge`` when a duplicate went).
        send: one request through the limiters (`Send`).
        reserve_now: the duplicate's budget reservation if its estimate fits now (None:
            it does not); None when the run has no token or dollar limit.
        release: gives a reservation back (a failed call's duplicate's).

    Returns:
        The winning response, and the duplicate that went (None if none did).

    Raises:
        Exception: the error that came first, when every request sent failed.
    """
    hedges.called()
    state = _Race()
    try:
        await state.run(send, hedges, model, reserve_now)
    except BaseException:
        _release(state.duplicate, release)
        raise
    return _outcome(state, hedges, record, release)


def _outcome(
    state: _Race, hedges: HedgeBudget, record: NodeRecord, release: Callable[[Reservation], None]
) -> tuple[ChatResponse, Duplicate | None]:
    """The winner and the duplicate to count, once the race is over (see `race`)."""
    duplicate = state.duplicate
    if duplicate is not None and not state.duplicate_went:
        # It waited for a slot until the first answered: no request went, nothing to count.
        hedges.extra -= 1
        _release(duplicate, release)
        duplicate = None
    if state.winner is None:
        _release(duplicate, release)
        raise state.errors[0]
    index, response = state.winner
    if duplicate is not None:
        record.hedge = "won" if index == 1 else "lost"
        hedges.won += index == 1
        if (1 - index) in state.failed:  # the loser failed: a failed request is not billed
            duplicate.billed = False
    return response, duplicate


def _launch(
    state: _Race, hedges: HedgeBudget, reserve_now: Callable[[], Reservation | None] | None
) -> Duplicate | None:
    """The duplicate, if one may go now (the call is still unanswered, the tree's share
    allows it, the budget has room)."""
    if state.over.is_set() or not hedges.may_send():
        return None
    reservation = None
    if reserve_now is not None:
        reservation = reserve_now()
        if reservation is None:
            return None
    hedges.sent()
    return Duplicate(reservation)


def _release(duplicate: Duplicate | None, release: Callable[[Reservation], None]) -> None:
    if duplicate is not None and duplicate.reservation is not None:
        release(duplicate.reservation)
        duplicate.reservation = None
