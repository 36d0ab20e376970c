"""The ``local`` batch executor: every completion of a batch in one trio loop.

One `RLM` (one engine, one set of provider limiters) serves the whole batch, so the
providers' ``max_concurrent`` and rate limits hold across all its completions exactly as
they hold across one recursion tree. ``concurrency`` worker tasks pull items one at a
time; each finished result goes to the caller at once. While they run, the heap that
existed before is frozen for the garbage collector (`rlm_graph.batch.heap`).

The loop runs in a thread of its own so that the batch is a plain iterator for sync
code: results cross to the caller through a queue. Closing the iterator (or an exception
in the caller) cancels the loop and joins the thread before it returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import trio

from rlm_graph.executors import (
    BatchItem,
    BatchResult,
    InProcessLimiter,
    complete_item,
    frozen_heap,
)

__all__ = ["LocalExecutor"]

_DONE = object()


class LocalExecutor:
    """Run a batch's completions concurrently in one trio loop (the default executor)."""

    name = "local"

    def run(
        self, items: Iterator[BatchItem], rlm_kwargs: Mapping[str, Any], *, concurrency: int
    ) -> Iterator[BatchResult]:
        out: queue.SimpleQueue[object] = queue.SimpleQueue()
        state: dict[str, Any] = {}
        thread = threading.Thread(
            target=self._thread,
            args=(items, dict(rlm_kwargs), concurrency, out, state),
            name="rlm-graph-batch",
            daemon=True,
        )
        thread.start()
        return self._results(out, state, thread)

    @staticmethod
    def _results(
        out: queue.SimpleQueue[object], state: dict[str, Any], thread: threading.Thread
    ) -> Iterator[BatchResult]:
        try:
            while (got := out.get()) is not _DONE:
                assert isinstance(got, BatchResult)
                yield got
            if "error" in state:
                raise state["error"]
        finally:
            token = state.get("token")
            scope = state.get("scope")
            if thread.is_alive() and token is not None and scope is not None:
                try:
                    token.run_sync_soon(scope.cancel)
                except trio.RunFinishedError:
                    pass
            thread.join()

    def _thread(
        self,
        items: Iterator[BatchItem],
        rlm_kwargs: dict[str, Any],
        concurrency: int,
        out: queue.SimpleQueue[object],
        state: dict[str, Any],
    ) -> None:
        try:
            trio.run(self._batch, items, rlm_kwargs, concurrency, out, state)
        except BaseException as exc:  # handed to the caller's thread, raised there
            state["error"] = _single(exc)
        finally:
            out.put(_DONE)

    async def _batch(
        self,
        items: Iterator[BatchItem],
        rlm_kwargs: dict[str, Any],
        concurrency: int,
        out: queue.SimpleQueue[object],
        state: dict[str, Any],
    ) -> None:
        from rlm_graph import RLM

        with trio.CancelScope() as scope:
            state["token"], state["scope"] = trio.lowlevel.current_trio_token(), scope
            async with RLM(**rlm_kwargs, limiter=InProcessLimiter()) as rlm:

                async def worker() -> None:
                    for item in items:  # one shared iterator: each worker takes the next item
                        out.put(await complete_item(rlm, item, executor=self.name))

                # The engine is built and its plugins imported: that heap is frozen for
                # the batch, so no full collection stalls every completion to walk it.
                with frozen_heap():
                    async with trio.open_nursery() as nursery:
                        for _ in range(concurrency):
                            nursery.start_soon(worker)


def _single(exc: BaseException) -> BaseException:
    """The one real error of a nursery's group (a bad item, say), else the group."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    _, rest = exc.split(trio.Cancelled)
    while isinstance(rest, BaseExceptionGroup) and len(rest.exceptions) == 1:
        rest = rest.exceptions[0]
    return rest if rest is not None else exc
