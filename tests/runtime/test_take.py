"""`rlm_graph.concurrency.tokens.take`: a provider limiter's token taken at once when one
is free and nobody waits, and otherwise in turn, as ``acquire`` would."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rlm_graph.concurrency.tokens import take


async def test_a_free_token_is_taken_without_letting_another_task_run() -> None:
    limiter = trio.CapacityLimiter(2)
    ran: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _note(ran))  # runs at the first schedule point
        await take(limiter)
        assert ran == [] and limiter.borrowed_tokens == 1
        limiter.release()
    assert ran == ["other"]


async def _note(ran: list[str]) -> None:
    ran.append("other")


async def test_a_cancelled_caller_takes_no_token() -> None:
    limiter = trio.CapacityLimiter(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await take(limiter)
    assert scope.cancelled_caught and limiter.borrowed_tokens == 0


async def test_with_none_free_callers_wait_and_get_tokens_in_turn() -> None:
    limiter = trio.CapacityLimiter(1)
    order: list[int] = []

    async def caller(i: int) -> None:
        await take(limiter)
        order.append(i)
        await trio.sleep(0.01)
        limiter.release()

    await take(limiter)  # held: everyone after waits
    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(caller, i)
            await trio.testing.wait_all_tasks_blocked()
        limiter.release()
    assert order == [0, 1, 2, 3, 4]


async def test_a_free_token_does_not_jump_ahead_of_a_waiting_caller() -> None:
    """A token given back while a caller waits is that caller's: a newcomer that finds
    the count under the limit still waits its turn."""
    limiter = trio.CapacityLimiter(1)
    order: list[str] = []

    async def waiter() -> None:
        await take(limiter)
        order.append("waiter")
        limiter.release()

    await take(limiter)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        limiter.release()  # handed to the waiter, which has not run yet
        await take(limiter)  # the newcomer: must not take it first
        order.append("newcomer")
        limiter.release()
    assert order == ["waiter", "newcomer"]


@pytest.mark.parametrize("tokens", [1, 3])
async def test_never_more_holders_than_tokens(tokens: int) -> None:
    limiter = trio.CapacityLimiter(tokens)
    holding, peak = 0, 0

    async def caller() -> None:
        nonlocal holding, peak
        await take(limiter)
        holding += 1
        peak = max(peak, holding)
        await trio.sleep(0.001)
        holding -= 1
        limiter.release()

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(caller)
    assert peak == tokens


async def test_a_semaphore_s_free_token_too_and_a_cancelled_caller_takes_none() -> None:
    """The lean transport's connection slots are a ``trio.Semaphore``."""
    slots = trio.Semaphore(1)
    ran: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _note(ran))
        await take(slots)
        assert ran == [] and slots.value == 0
        with trio.CancelScope() as scope:
            scope.cancel()
            await take(slots)  # none free, and cancelled: no wait, no token
        assert scope.cancelled_caught and slots.value == 0
        slots.release()
    assert ran == ["other"] and slots.value == 1
