"""`take`: a trio limiter's token without a trip through the run loop when one is free.

trio's ``CapacityLimiter.acquire`` and ``Semaphore.acquire`` yield to the scheduler once
even when a token is free (a schedule point, for fairness between tasks that acquire in
a loop). A model call took two such tokens (its provider's limiter, the lean
transport's connection slot) and then waits for its answer anyway, which is its
schedule point: the two yields were two scheduler round trips per call for nothing
(docs/benchmarks.md). Fairness is trio's own: ``acquire_nowait`` refuses while others
wait, so a free token never jumps ahead of a waiting caller.
"""

from __future__ import annotations

from typing import Protocol

import trio

__all__ = ["Tokens", "take"]


class Tokens(Protocol):
    """What `take` takes from: ``trio.CapacityLimiter`` and ``trio.Semaphore`` are."""

    def acquire_nowait(self) -> None: ...

    async def acquire(self) -> None: ...


async def take(tokens: Tokens) -> None:
    """``tokens.acquire()``, without its yield when a token is free and nobody waits: a
    cancellation point, then the token; a caller that finds none waits in turn.

    Raises:
        trio.Cancelled: the caller is cancelled (and holds no token).
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        tokens.acquire_nowait()  # none free, or others waiting first: WouldBlock
    except trio.WouldBlock:
        await tokens.acquire()
