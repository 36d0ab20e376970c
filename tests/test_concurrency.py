"""The adaptive concurrency limit's arithmetic (rlm_graph.concurrency), without a loop."""

from __future__ import annotations

import heapq

import pytest

from rlm_graph.concurrency import DEFAULT_INITIAL, AdaptiveLimit, LatencyTrend
from rlm_graph.concurrency.adaptive import Ticket


def _wave(limit: AdaptiveLimit, n: int, seconds: float = 1.0) -> None:
    """Send ``n`` requests at once, then answer them all."""
    tickets = [limit.start() for _ in range(n)]
    for ticket in tickets:
        limit.answered(ticket, seconds)


def _round_trips(limit: AdaptiveLimit, rounds: int, seconds: float = 1.0) -> None:
    """Keep the limit full for ``rounds`` round trips: each answer makes room for the
    next request (and for more, as the limit grows)."""
    flying = [limit.start() for _ in range(limit.limit)]
    for _ in range(rounds):
        answered, flying = flying, []
        for ticket in answered:
            limit.answered(ticket, seconds)
            while limit.admits():
                flying.append(limit.start())
    for ticket in flying:
        limit.ended(ticket)


def test_a_busy_limit_doubles_each_round_trip_in_slow_start() -> None:
    limit = AdaptiveLimit(initial=8, ceiling=100)
    # From idle the first round's early requests went with the limit half used (they
    # say nothing about more); from then on every answer adds one: x2 a round trip.
    _round_trips(limit, 3)
    assert 13 * 2 * 2 <= limit.limit <= 8 * 2 * 2 * 2
    assert limit.in_flight == 0


def test_answers_while_the_limit_is_hardly_used_do_not_raise_it() -> None:
    limit = AdaptiveLimit(initial=32, ceiling=100)
    for _ in range(50):
        _wave(limit, 4)  # 4 of 32 in flight: says nothing about 33
    assert limit.limit == 32


def test_the_limit_never_passes_its_ceiling() -> None:
    limit = AdaptiveLimit(initial=8, ceiling=12)
    for _ in range(10):
        _wave(limit, limit.limit)
    assert limit.limit == 12


def test_a_refusal_brings_the_limit_below_the_level_it_was_sent_at() -> None:
    limit = AdaptiveLimit(initial=32, ceiling=512)
    tickets = [limit.start() for _ in range(32)]
    # The server takes 6: every request sent with more than 6 in flight is refused.
    for ticket in tickets[6:]:
        limit.refused(ticket)
    assert limit.limit == 6
    assert not limit.slow_start
    for ticket in tickets[:6]:
        limit.answered(ticket, 1.0)
    assert limit.in_flight == 0
    assert limit.refusals == 26


def test_one_round_of_refusals_backs_off_once() -> None:
    limit = AdaptiveLimit(initial=100, ceiling=512)
    tickets = [limit.start() for _ in range(100)]
    # Refused with a named wait: about a rate, not about how many are in flight.
    for ticket in tickets:
        limit.refused(ticket, full=False)
    assert limit.limit == 90  # one multiplicative decrease, not 0.9 ** 100


def test_after_a_refusal_the_limit_grows_about_one_per_round_trip() -> None:
    limit = AdaptiveLimit(initial=20, ceiling=512)
    limit.refused(limit.start(), full=False)  # no level learnt: only the backoff
    assert limit.limit == 18
    _round_trips(limit, 3)
    assert 20 <= limit.limit <= 21


def test_a_level_once_refused_is_probed_rarely() -> None:
    limit = AdaptiveLimit(initial=32, ceiling=512)
    tickets = [limit.start() for _ in range(8)]
    limit.refused(tickets[-1])  # refused at 8 in flight
    for ticket in tickets[:-1]:
        limit.answered(ticket, 1.0)
    assert limit.limit == 7
    rounds = 0
    while limit.limit < 8:
        _round_trips(limit, 1)
        rounds += 1
    assert rounds >= 8  # a tenth of the normal growth near the refused level


def test_a_rising_latency_backs_the_limit_off() -> None:
    limit = AdaptiveLimit(initial=16, ceiling=16, floor=1)
    for _ in range(4):
        _wave(limit, 16, seconds=0.1)
    assert limit.limit == 16
    _wave(limit, 16, seconds=1.0)  # ten times slower: a queue is building
    assert limit.limit < 16


def _queueing_server(limit: AdaptiveLimit, answers: int, slots: int = 8) -> int:
    """A server that serves ``slots`` requests at a time, 50 ms each, and queues the rest
    first come first served, never refusing (a local vLLM or llama.cpp); the client keeps
    the limit in flight. The peak in flight."""
    now, free_at, peak = 0.0, [0.0] * slots, 0
    flying: list[tuple[float, int, Ticket, float]] = []

    def send() -> None:
        nonlocal peak
        ticket = limit.start()
        finish = max(now, heapq.heappop(free_at)) + 0.05
        heapq.heappush(free_at, finish)
        heapq.heappush(flying, (finish, ticket.seq, ticket, now))
        peak = max(peak, limit.in_flight)

    for _ in range(answers):
        while limit.admits():
            send()
        finish, _, ticket, sent = heapq.heappop(flying)
        now = finish
        limit.answered(ticket, finish - sent)
    return peak


def test_a_server_that_queues_instead_of_refusing_is_backed_off_from() -> None:
    """Slow start raised the limit to its ceiling against a server holding 8 at a time:
    its queue grew the latency 60-fold, but slowly enough that the long-run latency the
    trend compares with rose with it, and nothing backed off (clients timed out)."""
    limit = AdaptiveLimit()
    peak = _queueing_server(limit, answers=3000)
    assert limit.epoch > 0  # backed off on the latency alone: nothing was refused
    assert peak < 256 and limit.limit < 256  # not the ceiling, 512


def test_a_fixed_limit_never_moves() -> None:
    limit = AdaptiveLimit.fixed(5)
    assert not limit.adaptive
    for _ in range(5):
        _wave(limit, 5)
    limit.refused(limit.start())
    assert limit.limit == 5


def test_the_latency_trend_ignores_a_heavy_tail() -> None:
    trend = LatencyTrend()
    # A lognormal-like stream: mostly fast, a slow one now and then.
    samples = [0.5, 0.7, 1.0, 1.2, 0.8, 9.0, 0.6, 1.1] * 20
    assert not any(trend.add(s, seq) for seq, s in enumerate(samples))


def test_the_slowest_answers_of_a_batch_coming_last_are_no_rising_latency() -> None:
    trend = LatencyTrend()
    for batch in range(4):
        # 64 sent together (in a random order) and answered fastest first.
        latencies = [0.2 * 1.05**i for i in range(64)]
        sends = [(i * 37) % 64 for i in range(64)]
        answers = sorted(zip(latencies, sends, strict=True))
        assert not any(trend.add(s, batch * 64 + seq) for s, seq in answers)


def test_a_queue_building_is_a_rising_latency() -> None:
    trend = LatencyTrend()
    rising = [trend.add(0.1 if seq < 100 else 1.0, seq) for seq in range(140)]
    assert not any(rising[:100]) and any(rising[100:])


def test_watchers_hear_every_fall_and_each_rise_of_an_eighth() -> None:
    limit = AdaptiveLimit(initial=DEFAULT_INITIAL, ceiling=512)
    heard = []
    flying = [limit.start() for _ in range(limit.limit)]
    while flying:
        ticket = flying.pop(0)
        limit.answered(ticket, 1.0)
        if limit.news():
            heard.append(limit.limit)
        while limit.admits() and limit.sent < 2000:
            flying.append(limit.start())
    assert limit.limit == 512
    assert heard == sorted(heard)
    assert 10 <= len(heard) <= 30  # not one per answer
    ticket = limit.start()
    limit.refused(ticket)
    assert limit.news()  # a fall is always news


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="floor <= ceiling"):
        AdaptiveLimit(initial=4, ceiling=2, floor=3)
