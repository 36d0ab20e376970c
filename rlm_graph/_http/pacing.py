"""The clock of paced reads: a streamed body read at most once a ``pace`` seconds reads on
the multiples of ``pace`` on trio's clock, the same instants for every stream of a run,
and one timer per instant wakes them all (`ticker`). Used by `transport`'s body reader.
"""

from __future__ import annotations

import trio

__all__ = ["next_tick", "ticker"]


def next_tick(now: float, pace: float) -> float:
    """The first multiple of ``pace`` after ``now``: when a paced stream reads next.
    (A millionth of a pace added first: a float ``now`` a rounding error short of a
    multiple is on it, not a rounding error before its own next tick.)"""
    return ((now + pace * 1e-6) // pace + 1) * pace


class _Ticker:
    """The ticks of one pace (`next_tick`), for the paced streams of one trio run.

    The streams waiting for a tick (all want the same one: the next) park here, but the
    first, which holds a timer and wakes the others when it fires: a trio timer wakes
    its task by cancelling a sleep, which costs more CPU than being unparked, so one
    timer per tick, not one per stream (docs/benchmarks.md has the measurement). A
    holder cancelled before its tick wakes the others, and the first of them holds the
    timer in its place.
    """

    __slots__ = ("_held", "_lot")

    def __init__(self) -> None:
        self._lot = trio.lowlevel.ParkingLot()
        self._held = False

    async def wait_until(self, tick: float) -> None:
        """Until ``tick`` (a multiple of the pace, `next_tick`)."""
        while trio.current_time() < tick:
            if self._held:
                await self._lot.park()
                continue
            self._held = True
            try:
                await trio.sleep_until(tick)
            finally:
                self._held = False
                self._lot.unpark_all()


_TICKERS: trio.lowlevel.RunVar[dict[float, _Ticker]] = trio.lowlevel.RunVar("rlm_graph_tickers")


def ticker(pace: float) -> _Ticker:
    """This trio run's ticker for ``pace`` (shared by every transport of the run)."""
    try:
        tickers = _TICKERS.get()
    except LookupError:
        tickers = {}
        _TICKERS.set(tickers)
    found = tickers.get(pace)
    if found is None:
        found = tickers[pace] = _Ticker()
    return found
