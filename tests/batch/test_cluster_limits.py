"""The Ray executor's limits actor, as plain asyncio code (Ray runs it on one asyncio
loop): the gate's order and capacity, a dead attempt's slots released, rate buckets."""

from __future__ import annotations

import asyncio
from typing import Any

from rlm_graph_ray.limits_actor import ClusterLimits


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_gate_holds_capacity_and_serves_waiters_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        limits = ClusterLimits()
        granted: list[str] = []

        async def take(ticket: str) -> None:
            await limits.acquire("k", 2, "owner-" + ticket, ticket)
            granted.append(ticket)

        tasks = [asyncio.create_task(take(t)) for t in ("a", "b", "c", "d")]
        await asyncio.sleep(0)
        assert granted == ["a", "b"]
        assert (await limits.statistics())["k"] == {
            "capacity": 2,
            "in_use": 2,
            "peak": 2,
            "waiting": 2,
        }
        await limits.release("b")
        await asyncio.sleep(0)
        await limits.release("a")
        await asyncio.gather(*tasks)
        assert (await limits.statistics())["k"]["peak"] == 2
        return granted

    assert run(scenario()) == ["a", "b", "c", "d"]


def test_a_dead_attempts_slots_and_places_in_line_are_released() -> None:
    async def scenario() -> dict[str, int]:
        limits = ClusterLimits()
        await limits.acquire("k", 1, "dead", "dead/1")
        waiting = asyncio.create_task(limits.acquire("k", 1, "dead", "dead/2"))
        other = asyncio.create_task(limits.acquire("k", 1, "alive", "alive/1"))
        await asyncio.sleep(0)
        assert await limits.release_owner("dead") == 2
        await other  # the live attempt gets the slot the dead one held
        await waiting  # and the dead one's queued request ends without holding anything
        return (await limits.statistics())["k"]

    assert run(scenario()) == {"capacity": 1, "in_use": 1, "peak": 1, "waiting": 0}


def test_a_release_that_overtakes_its_acquire_never_grants_the_slot() -> None:
    async def scenario() -> int:
        limits = ClusterLimits()
        await limits.release("t/1")  # the caller was cancelled before its acquire ran
        await limits.acquire("k", 1, "t", "t/1")
        await limits.acquire("k", 1, "u", "u/1")  # the slot is still free
        return (await limits.statistics())["k"]["in_use"]

    assert run(scenario()) == 1


def test_rate_buckets_allow_a_minutes_burst_then_the_steady_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    async def scenario() -> None:
        limits = ClusterLimits(clock=lambda: now[0], sleep=fake_sleep)
        for _ in range(3):
            await limits.take_rate("k", 3, None, 0)
        assert slept == []  # a burst of one minute's allowance
        await limits.take_rate("k", 3, None, 0)  # then one every 20 s
        await limits.take_rate("t", None, 600, 500)  # tokens: 500 of a 600/min bucket
        await limits.settle("t", 500, 100)  # the call used 100: 400 come back
        await limits.take_rate("t", None, 600, 500)

    run(scenario())
    assert slept == [20.0]


def test_forgetting_a_batch_drops_only_its_keys() -> None:
    async def scenario() -> list[str]:
        limits = ClusterLimits()
        await limits.acquire("b1:openai/0", 1, "b1/x#1", "b1/x#1/1")
        await limits.acquire("b2:openai/0", 1, "b2/x#1", "b2/x#1/1")
        await limits.forget_batch("b1")
        return sorted(await limits.statistics())

    assert run(scenario()) == ["b2:openai/0"]
