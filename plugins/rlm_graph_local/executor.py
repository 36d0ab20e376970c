"""The ``local`` batch executor: every completion of a batch in one trio loop.

One `RLM` (one engine, one set of provider limiters) serves the whole batch, so the
providers' ``max_concurrent`` and rate limits hold across all its completions exactly as
they hold across one recursion tree. Each item is a task of its own, started once fewer
than ``concurrency`` are running (so never more tasks than items in flight, whatever
``concurrency`` says); each finished result goes to the caller at once. While they run, the heap that
existed before is frozen for the garbage collector (`rlm_graph.batch.heap`).

The loop runs in a thread of its own so that the batch is a plain iterator for sync
code: results cross to the caller through a queue. The thread starts at the iterator's
first ``next()``. Closing the iterator (or an exception in the caller) cancels the loop
and joins the thread before it returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import trio

from rlm_graph.executors import (
    BatchItem,
    BatchResult,
    InProcessLimiter,
    complete_item,
    frozen_heap,
)

if TYPE_CHECKING:
    from rlm_graph import RLM

__all__ = ["LocalExecutor"]

_DONE = object()


class LocalExecutor:
    """Run a batch's completions concurrently in one trio loop (the default executor)."""

    name = "local"

    def run(
        self, items: Iterator[BatchItem], rlm_kwargs: Mapping[str, Any], *, concurrency: int
    ) -> Iterator[BatchResult]:
        return _LocalBatch(items, dict(rlm_kwargs), concurrency, self.name).results()


class _LocalBatch:
    """One batch: its loop's thread puts results in ``out``, the caller's takes them."""

    def __init__(
        self, items: Iterator[BatchItem], rlm_kwargs: dict[str, Any], concurrency: int, name: str
    ) -> None:
        self.items, self.rlm_kwargs, self.concurrency, self.name = (
            items, rlm_kwargs, concurrency, name,
        )  # fmt: skip
        self.out: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.bad_item: Exception | None = None
        self.scope: trio.CancelScope | None = None

    def results(self) -> Iterator[BatchResult]:
        """The results as they come (the caller's thread); leaving early cancels the
        loop and joins its thread. The loop's thread starts at the first ``next()``: an
        iterator closed or dropped before it has started nothing, since a generator's
        ``finally`` (the cancel and join) runs only once its body has begun."""
        thread = threading.Thread(target=self.thread, name="rlm-graph-batch", daemon=True)
        thread.start()
        try:
            while (got := self.out.get()) is not _DONE:
                assert isinstance(got, BatchResult)
                yield got
            if self.error is not None:
                raise self.error
        finally:
            if thread.is_alive() and self.token is not None and self.scope is not None:
                try:
                    self.token.run_sync_soon(self.scope.cancel)
                except trio.RunFinishedError:
                    pass
            thread.join()

    def thread(self) -> None:
        try:
            trio.run(self._batch)
        except BaseException as exc:  # handed to the caller's thread, raised there
            self.error = _single(exc)
        finally:
            self.out.put(_DONE)

    async def _batch(self) -> None:
        from rlm_graph import RLM

        with trio.CancelScope() as scope:
            self.token, self.scope = trio.lowlevel.current_trio_token(), scope
            async with RLM(**self.rlm_kwargs, limiter=InProcessLimiter()) as rlm:
                # The engine is built and its plugins imported: that heap is frozen for
                # the batch, so no full collection stalls every completion to walk it.
                with frozen_heap():
                    async with trio.open_nursery() as nursery:
                        await self._feed(rlm, nursery)
        if self.bad_item is not None:  # raised once the completions running have ended
            raise self.bad_item

    async def _feed(self, rlm: RLM, nursery: trio.Nursery) -> None:
        """Start one task per item, each once a place is free among ``concurrency``:
        never more tasks than items in flight (``concurrency`` may be far more than
        there are items)."""
        running = trio.CapacityLimiter(self.concurrency)
        while True:
            place = object()
            await running.acquire_on_behalf_of(place)
            item = self._next()  # taken once a place is free, as the file is read
            if item is None:
                return
            nursery.start_soon(self._complete, rlm, item, running, place)

    async def _complete(
        self, rlm: RLM, item: BatchItem, running: trio.CapacityLimiter, place: object
    ) -> None:
        try:
            self.out.put(await complete_item(rlm, item, executor=self.name))
        finally:
            running.release_on_behalf_of(place)

    def _next(self) -> BatchItem | None:
        """The next item, or None once there is none: also after an item that cannot
        be read (a duplicate id, a bad line), which is raised when the completions
        already running have given their results (they are paid for)."""
        if self.bad_item is not None:
            return None
        try:
            return next(self.items, None)
        except Exception as exc:
            self.bad_item = exc
            return None


def _single(exc: BaseException) -> BaseException:
    """The one real error of a nursery's group (a bad item, say), else the group."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    _, rest = exc.split(trio.Cancelled)
    while isinstance(rest, BaseExceptionGroup) and len(rest.exceptions) == 1:
        rest = rest.exceptions[0]
    return rest if rest is not None else exc
