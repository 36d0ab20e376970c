"""Event streams: a run in the background, its events in the caller's hands.

`EventStream` (sync code) runs the run in its own trio loop on a worker thread and hands
events to the caller's thread through an `EventBuffer`; `open_event_stream` (trio code)
runs it as a task in the caller's nursery. Either way the run never waits for the
consumer: the buffer keeps ``capacity`` events in memory and spills the rest to disk.

Invariants:
    - The consumer sees every event of the run, ``run_finished`` last; then, if the run
      raised, the same exception (after ``run_finished`` with its ``error``).
    - Leaving the stream early (``close()``, the end of a ``with`` block, cancellation of
      the async block) cancels a run still going and waits for it to end.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import trio

from ..errors import ConfigError
from ..events import DEFAULT_CAPACITY, EventBuffer, Listener
from ..events.buffer import EMPTY, END
from .aio import running_under_asyncio
from .sync import refuse_inside_trio, reraise, single_or_group, unwrap

__all__ = ["AsyncEventStream", "EventStream", "open_event_stream"]

T = TypeVar("T")

Start = Callable[[Listener], Awaitable[T]]


class EventStream(Generic[T]):
    """Iterate over a run's events from sync code while the run goes on in a thread.

    Made by `RLM.stream` and `Engine.stream`; the run starts at once.

    Attributes:
        result: the run's result once it has finished (``None`` before, or if it raised).
        buffer: the stream's `EventBuffer` (its statistics say how far the consumer lagged).
    """

    def __init__(self, start: Start[T], *, capacity: int, sync_name: str, async_name: str) -> None:
        refuse_inside_trio(sync_name, f"async with {async_name}(...) as events")
        self.buffer = EventBuffer(capacity)
        self.result: T | None = None
        self._start = start
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._closing = False  # close() came before the run's scope existed
        self._lock = threading.Lock()
        # The caller's context variables go with the run (its current span: the run's
        # span nests under it), as they do for completion().
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._main,), name=f"rlm-graph {sync_name}", daemon=True
        )
        self._thread.start()

    @property
    def running(self) -> bool:
        """The run is still going (its events may still be coming)."""
        return self._thread.is_alive()

    def _main(self) -> None:
        try:
            trio.run(self._produce)
        except BaseExceptionGroup as group:  # reported to the consumer's thread
            self._error = unwrap(group) or group
        except BaseException as exc:  # reported to the consumer's thread
            self._error = exc
        finally:
            self.buffer.close()

    async def _produce(self) -> None:
        with trio.CancelScope() as scope:
            with self._lock:
                self._token, self._scope = trio.lowlevel.current_trio_token(), scope
                if self._closing:  # left before the run had begun: it never starts
                    scope.cancel()
            self.result = await self._start(self.buffer)

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                # A bounded wait keeps Ctrl-C deliverable to the consumer's thread.
                item = self.buffer.get(timeout=0.5)
                if item is END:
                    break
                if item is not EMPTY:
                    yield item
        finally:
            self.close()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """Cancel the run if it is still going, and wait for it to end."""
        with self._lock:
            self._closing = True
            token, scope = self._token, self._scope
        if self._thread.is_alive() and token is not None and scope is not None:
            try:
                trio.from_thread.run_sync(scope.cancel, trio_token=token)
            except trio.RunFinishedError:
                pass  # it ended meanwhile
        self._thread.join()
        self.buffer.discard()

    def __enter__(self) -> EventStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEventStream(Generic[T]):
    """The events of a run going on in the caller's trio loop (``async for``)."""

    def __init__(self, buffer: EventBuffer) -> None:
        self.buffer = buffer
        self.result: T | None = None
        self.error: BaseException | None = None
        self._wake = trio.Event()
        buffer.wakeup = self._wakeup

    def _wakeup(self) -> None:
        self._wake.set()

    def __aiter__(self) -> AsyncEventStream[T]:
        return self

    async def __anext__(self) -> Any:
        while True:
            self._wake = trio.Event()
            item = self.buffer.get_nowait()
            if item is END:
                if self.error is not None:
                    error, self.error = self.error, None
                    raise error
                raise StopAsyncIteration
            if item is not EMPTY:
                return item
            await self._wake.wait()


@asynccontextmanager
async def open_event_stream(
    start: Start[T], *, capacity: int = DEFAULT_CAPACITY
) -> AsyncIterator[AsyncEventStream[T]]:
    """Start a run as a task and yield its event stream; leaving cancels a run still going.
    An error (the run's, on the stream's last read, or one raised in the ``async with``
    body) comes out as itself, not in trio's exception group."""
    if running_under_asyncio():
        raise ConfigError(
            "astream() runs under trio; under asyncio, read rlm.stream(...) (or "
            "engine.stream(...)) in a thread: "
            "await asyncio.to_thread(lambda: [handle(e) for e in rlm.stream(context)]), "
            "or pass listeners=[fn] to acompletion()"
        )
    stream: AsyncEventStream[T] = AsyncEventStream(EventBuffer(capacity))

    async def produce() -> None:
        try:
            stream.result = await start(stream.buffer)
        except Exception as exc:  # the consumer gets it after run_finished
            stream.error = exc
        finally:
            stream.buffer.close()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            try:
                yield stream
            finally:
                nursery.cancel_scope.cancel()
                stream.buffer.discard()
    except BaseExceptionGroup as group:
        reraise(single_or_group(group))
