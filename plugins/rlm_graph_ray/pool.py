"""Long-lived completion workers of the ray executor: Ray actors that each keep one trio
loop and run several completions in it at once.

A Ray task per completion pays, every time, for a fresh trio loop, the engine's import
and set-up state, and (over HTTP) new connections; and ten one-completion processes on
a small machine mostly wait for each other's time slices. A `CompletionWorker` starts
its trio loop once (in a thread of its own) and serves ``complete`` calls from Ray's
thread pool (``max_concurrency`` = the completions it runs at once): each call hands its
completion to the loop (`trio.from_thread.run`) and returns the result, so every
completion is still one Ray call whose result the driver waits on by itself.

Invariants:
    - One loop per worker process, started before the first call returns; a call never
      runs outside it.
    - A completion's limiter is its own (`RayLimiter` with the attempt as owner), so a
      dead worker's slots are released attempt by attempt, exactly as for tasks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import trio

from rlm_graph.executors import BatchItem, BatchResult

from .limits_actor import RayLimiter

__all__ = ["CompletionWorker"]


class CompletionWorker:
    """A Ray actor's class: one trio loop in a thread, completions run inside it."""

    def __init__(self) -> None:
        started = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None

        async def serve() -> None:
            self._token = trio.lowlevel.current_trio_token()
            started.set()
            await trio.sleep_forever()  # the loop lives as long as the actor's process

        threading.Thread(target=trio.run, args=(serve,), name="rlm-graph-trio", daemon=True).start()
        started.wait()

    def pid(self) -> int:
        """This worker's process id (ready check; tests kill it by this)."""
        return os.getpid()

    def complete(
        self,
        rlm_kwargs: Mapping[str, Any],
        item: BatchItem,
        actor: Any,
        batch: str,
        attempt: int,
        keys: Mapping[str, str],
    ) -> dict[str, Any]:
        """Answer ``item`` in this worker's trio loop (called from one of Ray's threads).

        ``keys`` are the driver's ``*_API_KEY`` variables: providers read their keys from
        the environment, and a worker on another node has the environment of its node.
        """
        from rlm_graph import RLM
        from rlm_graph.executors import complete_item, frozen_heap

        os.environ.update(keys)
        limiter = RayLimiter(actor, batch=batch, owner=f"{batch}/{item.id}#{attempt}")

        async def answer() -> BatchResult:
            try:
                async with RLM(**rlm_kwargs, limiter=limiter) as rlm:
                    return await complete_item(rlm, item, executor="ray", attempts=attempt)
            finally:
                limiter.flush()  # releases the loop had no time to send

        # A worker process holds Ray's heap too: no full collection walks it mid-batch.
        with frozen_heap():
            return trio.from_thread.run(answer, trio_token=self._token).model_dump(mode="json")
