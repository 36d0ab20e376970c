"""A provider's concurrency limit that finds what the provider takes. Pure: no trio.

`AdaptiveLimit` is the arithmetic; `rlm_graph.concurrency.limiter.SharedGate` holds one per
provider and makes requests wait for it, across every run and thread of an engine (a
Ray batch keeps it in its limits actor). The algorithm is TCP's congestion control with
the defaults of Netflix's concurrency-limits ``AIMDLimit``, applied to requests in
flight instead of packets (RFC 5681, RFC 6582; Dean and Barroso's "The Tail at Scale"
for why a fixed limit is the wrong default):

- **Slow start.** From ``initial`` (64), every answered request that found the limit in
  use (at least half of it in flight when it was sent) raises the limit by one: the limit
  doubles per round trip while the provider takes it all, up to ``ceiling``.
- **Congestion avoidance.** After the first refusal the limit grows by about one per
  round trip (``1 / limit`` per answered request), and by a tenth of that just below
  the level a refusal was last seen, so a provider at its ceiling is probed rarely (one
  refused probe per about ``10 * limit`` answers) until it takes that level again.
- **Multiplicative decrease** on a refusal (HTTP 429 or 503 overloaded) or on a latency
  that has risen past ``tolerance`` times its long-run level (HyStart's idea: a queue is
  building): the limit times ``backoff`` (0.9), at most once per round of requests
  (NewReno's recovery point: requests sent before the last decrease say nothing new).
- **What a refusal measures.** A refusal that comes back while ``n`` requests are in
  flight (itself included) says the provider holds fewer than ``n``: the limit falls to
  at most ``n - 1`` at once, so a burst into a tight provider costs one wave of
  refusals, not a cascade. (In flight when the refusal comes, not when the request
  went: a burst's requests reach the server in any order.)

An explicit ``max_concurrent`` is the ``ceiling``: the limit starts there (the user said
the provider takes it) and never passes it. Invariants: ``floor <= limit <= ceiling``;
``in_flight`` counts every request started and not yet ended, whatever the outcome.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

__all__ = [
    "DEFAULT_CEILING",
    "DEFAULT_INITIAL",
    "AdaptiveLimit",
    "LatencyTrend",
    "Ticket",
]

DEFAULT_INITIAL = 64
"""Where a provider's limit starts when ``max_concurrent`` is not set."""

DEFAULT_CEILING = 512
"""How far a provider's limit may rise when ``max_concurrent`` is not set."""

_PROBE_SHARE = 0.1  # growth at the level of the last refusal, as a share of the normal
_RISE_DAMPING = 8  # how much slower the long-run latency follows a rise than a fall


class Ticket(NamedTuple):
    """One request's place: how many were in flight when it was sent (itself included),
    the limit's round (``epoch``) at the time, and its sending order (``seq``). (A tuple:
    one is made per request.)"""

    level: int
    epoch: int
    seq: int = 0


class LatencyTrend:
    """Whether a model's latency is rising: the median latency of the ``window`` most
    recently *sent* of the last ``horizon`` answers, against the long-run mean (an
    exponential average over about ``horizon`` answers).

    By sending order, not answering order: a batch's answers come back fastest first,
    so the last answers of any batch are its slowest, and a heavy tail would look like
    a queue building. The latest sent are what a queue at the server would slow down.
    The long-run mean follows a rise of answers sent while the limit was in use
    `_RISE_DAMPING` times slower than a fall: a queue that slow start builds grows the
    latency gradually, and a mean that kept up with it never saw it rise. (Damped
    always, the mean would sit well below a heavy tail's median, which then looked
    risen by itself.)
    """

    __slots__ = ("_kept", "_long", "_rising", "_seen", "horizon", "tolerance", "window")

    def __init__(self, tolerance: float = 2.0, window: int = 16, horizon: int = 64) -> None:
        self.tolerance, self.window, self.horizon = tolerance, window, horizon
        self._kept: deque[tuple[int, float]] = deque(maxlen=horizon)
        self._long = 0.0
        self._seen = 0
        self._rising = 0  # looks in a row that found the latency risen

    def add(self, seconds: float, sent: int, busy: bool = True) -> bool:
        """Record one answer's latency and its request's sending order (``busy``: it went
        while the limit was in use, as a queue that the limit's growth builds is); True
        when the recent median has risen past ``tolerance`` times the long-run mean at
        two looks in a row (never before ``2 * window`` answers)."""
        self._seen += 1
        weight = 1.0 / min(self._seen, self.horizon)
        if busy and seconds > self._long and self._seen > self.horizon:
            weight /= _RISE_DAMPING
        self._long += weight * (seconds - self._long)
        self._kept.append((sent, seconds))
        # Looked at every eighth answer: a queue builds over many answers, and the look
        # (a sort of the last 64: in C, ten times cheaper than heapq's partial sort in
        # Python) is the costliest thing an answer does here.
        if self._seen < 2 * self.window or self._seen % 8:
            return False
        recent = sorted(latency for _, latency in sorted(self._kept)[-self.window :])
        risen = recent[len(recent) // 2] > self.tolerance * self._long
        self._rising = self._rising + 1 if risen else 0
        return self._rising >= 2  # one look is a heavy tail's luck as often as a queue


class AdaptiveLimit:
    """The concurrency limit of one provider and the requests in flight under it.

    Not thread-safe: its holder (`SharedGate`, the Ray limits actor) serialises calls.
    ``start`` when a request goes, then exactly one of ``answered``, ``refused`` or
    ``ended`` (a failure that says nothing about load, or a cancellation).
    """

    __slots__ = (
        "_above",
        "_announced",
        "_refused_at",
        "_trends",
        "adaptive",
        "ceiling",
        "epoch",
        "floor",
        "in_flight",
        "limit",
        "refusals",
        "sent",
        "slow_start",
        "tolerance",
        "value",
    )

    def __init__(
        self,
        *,
        initial: int = DEFAULT_INITIAL,
        ceiling: int = DEFAULT_CEILING,
        floor: int = 1,
        tolerance: float = 2.0,
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, not floor={floor} ceiling={ceiling}")
        self.ceiling, self.floor, self.tolerance = ceiling, floor, tolerance
        self.adaptive = floor < ceiling
        self.value = 0.0
        self.limit = 0  # requests that may be in flight now: `value` as a whole number
        self._set(float(min(max(initial, floor), ceiling)))
        self.slow_start = True
        self.epoch = 0
        self.in_flight = 0
        self.sent = 0
        self.refusals = 0
        self._refused_at = math.inf  # the lowest level refused since the provider last took it
        self._above = 0  # answers at or above that level since
        self._trends: dict[str, LatencyTrend] = {}
        self._announced = self.limit

    @classmethod
    def fixed(cls, capacity: int) -> AdaptiveLimit:
        """A limit that never moves (``adaptive=False``): always ``capacity``."""
        return cls(initial=capacity, ceiling=capacity, floor=capacity)

    def _set(self, value: float) -> None:
        self.value = value
        self.limit = min(self.ceiling, max(self.floor, int(value)))

    def admits(self) -> bool:
        """Whether one more request may go now."""
        return self.in_flight < self.limit

    def start(self) -> Ticket:
        """Count a request that goes now."""
        self.in_flight += 1
        self.sent += 1
        return Ticket(self.in_flight, self.epoch, self.sent)

    def ended(self, ticket: Ticket) -> None:
        """A request ended without saying anything about load (failed, cancelled)."""
        del ticket
        self.in_flight -= 1

    def answered(self, ticket: Ticket, seconds: float, model: str = "") -> None:
        """A request was answered after ``seconds``: grow, or back off on a rising latency."""
        self.in_flight -= 1
        if not self.adaptive:
            return
        trend = self._trends.get(model)
        if trend is None:
            trend = self._trends[model] = LatencyTrend(self.tolerance)
        if trend.add(seconds, ticket.seq, busy=2 * ticket.level >= self.limit):
            self._decrease(ticket, bound=math.inf)
            return
        if ticket.level >= self._refused_at:
            # A round of answers at a level it once refused: it has room now. (One is not
            # enough: a level counts refusals still on their way back.)
            self._above += 1
            if self._above >= self._refused_at:
                self._refused_at, self._above = math.inf, 0
        if 2 * ticket.level < self.limit:
            return  # the limit was not in use: an answer says nothing about a higher one
        if self.slow_start:
            self._set(min(float(self.ceiling), self.value + 1.0))
        else:
            step = 1.0 / self.value
            if self.limit + 1 >= self._refused_at:
                step *= _PROBE_SHARE
            self._set(min(float(self.ceiling), self.value + step))

    def refused(self, ticket: Ticket, *, full: bool = True) -> None:
        """The provider refused a request (429, or 503 overloaded).

        Args:
            full: the refusal says the provider is full now (no wait named, or
                ``Retry-After: 0``): the limit falls below the requests in flight now
                (this one included). A refusal that names a wait is about a rate, not
                about concurrency: the limit only backs off (the gate pauses for the
                wait).
        """
        # In flight now, not at the send: requests sent together reach the server in any
        # order, so a request sent second of sixteen may be the one refused.
        level = self.in_flight
        self.in_flight -= 1
        self.refusals += 1
        if not self.adaptive:
            return
        if full:
            self._refused_at, self._above = min(self._refused_at, level), 0
        self._decrease(ticket, bound=level - 1 if full else math.inf)

    def _decrease(self, ticket: Ticket, bound: float) -> None:
        value = min(self.value, bound)
        if ticket.epoch == self.epoch:  # the first signal of this round: back off once
            value = min(value, self.value * 0.9)
            self.epoch += 1
        self.slow_start = False
        self._set(max(float(self.floor), value))

    def news(self) -> bool:
        """Whether the limit moved enough since it was last told to be worth telling
        again (and remember it as told): a move of an eighth either way (at least one
        up; down, to at most seven eighths, or to the floor). A limit in slow start
        moves with every answer: its watchers hear ~20 times on the way from 64 to 512,
        not 448; a burst's refusals walk it down one by one: they hear every eighth."""
        limit, told = self.limit, self._announced
        fell = limit <= told * 7 // 8 or (limit < told and limit == self.floor)
        if fell or limit >= told + max(1, told // 8):
            self._announced = limit
            return True
        return False

    def statistics(self) -> dict[str, object]:
        return {
            "limit": self.limit,
            "in_flight": self.in_flight,
            "sent": self.sent,
            "refused": self.refusals,
            "slow_start": self.slow_start,
            "ceiling": self.ceiling,
        }
