"""The slots of one ``*_batched`` call: many independent slots at once, results in input
order, failures in their slot (not to be confused with `rlm_graph.batch`, which runs many
completions)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio

from ..errors import error_slot

__all__ = ["run_slots"]

X = TypeVar("X")


async def run_slots(
    items: Sequence[X],
    one: Callable[[int, X], Awaitable[Any]],
    *,
    limit: int,
    name: str = "batch",
) -> list[Any]:
    """Run ``one(i, item)`` for every item, at most ``limit`` at once.

    ``min(limit, len(items))`` workers take the items in input order, so slots start
    first-come first-served and no task waits on a limiter just to exist.

    Returns the results in input order. A slot that raises holds
    ``"[ERROR] <type>: <message>"`` and never cancels its siblings; cancellation of the
    caller still cancels every slot.
    """
    results: list[Any] = [""] * len(items)
    queue = iter(enumerate(items))

    async def worker() -> None:
        for index, item in queue:
            try:
                results[index] = await one(index, item)
            except Exception as exc:  # a failed slot is data for the model, not a crash
                results[index] = error_slot(exc)

    async with trio.open_nursery() as nursery:
        for number in range(min(limit, len(items))):
            nursery.start_soon(worker, name=f"{name}-worker-{number}")
    return results
