"""The asyncio doorway: ``await rlm.acompletion(...)`` from an asyncio application.

The engine is trio code. An asyncio caller (FastAPI, aiohttp, a Jupyter cell) gets its
work run on one trio loop in a daemon thread, shared by every asyncio caller of the
process, and awaits an asyncio future for the outcome.

Why a thread and not trio's guest mode on the asyncio loop: a thread can host only one
trio run, guest or not, so guest mode would mean one long-lived guest per asyncio loop,
tied to that loop's shutdown order; a dedicated thread has no such tie and gives every
caller the same trio loop, hence the same provider limiters and HTTP connections.

Invariants:
    - The caller's context variables (an OpenTelemetry span, a request id) are copied
      into the trio task, so the run's span nests under the caller's current span.
    - Cancelling the awaiting asyncio task cancels the trio run (a cancel scope around
      it) and waits until the run has unwound (requests stopped, REPL blocks cut) before
      ``CancelledError`` propagates: nothing of the run outlives the cancellation.
    - The thread starts on first use and lives as long as the process (a daemon: it never
      keeps the interpreter alive); a loop that closed before its result arrived simply
      drops the result.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import outcome
import sniffio
import trio

__all__ = ["call_from_asyncio", "run_on_trio_thread", "running_under_asyncio"]

T = TypeVar("T")


def running_under_asyncio() -> bool:
    """Whether the calling coroutine runs under asyncio (not trio, not bare)."""
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


class _TrioThread:
    """One trio loop in a daemon thread, taking work from any thread."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self.token: trio.lowlevel.TrioToken | None = None
        self.thread = threading.Thread(
            target=trio.run, args=(self._main,), name="rlm-graph-trio", daemon=True
        )
        self.thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self._ready.set()
        await trio.sleep_forever()


_thread: _TrioThread | None = None
_thread_lock = threading.Lock()


def _trio_thread() -> _TrioThread:
    global _thread
    with _thread_lock:
        if _thread is None or not _thread.thread.is_alive():
            _thread = _TrioThread()
        return _thread


def run_on_trio_thread(fn: Callable[[], Awaitable[Any]]) -> None:
    """``await fn()`` on the trio thread asyncio callers share, from sync code, if that
    thread has started (its loop holds what they opened there: a provider's connections,
    which a sync ``close()``, in a trio loop of its own, cannot reach)."""
    with _thread_lock:
        thread = _thread
    if thread is not None and thread.thread.is_alive() and thread.token is not None:
        trio.from_thread.run(fn, trio_token=thread.token)


class _Call:
    """One asyncio caller's work on the trio thread: its cancel scope and its outcome."""

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self.loop = loop
        self.future = future
        self.scope = trio.CancelScope()

    async def run(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        with self.scope:
            result = await outcome.acapture(fn, *args)
        try:
            self.loop.call_soon_threadsafe(self._deliver, result)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting
            pass

    def _deliver(self, result: outcome.Outcome[Any]) -> None:
        if not self.future.done():
            self.future.set_result(result)


async def call_from_asyncio(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)`` on the trio thread, from asyncio code.

    Args:
        fn: an async function written for trio.
        *args: its positional arguments.

    Returns:
        What ``fn`` returned; what it raised is raised here.

    Raises:
        asyncio.CancelledError: the awaiting task was cancelled; the trio run was
            cancelled too and has finished.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[outcome.Outcome[T]] = loop.create_future()
    call = _Call(loop, future)
    context = contextvars.copy_context()
    token = _trio_thread().token
    assert token is not None
    token.run_sync_soon(
        lambda: trio.lowlevel.spawn_system_task(call.run, fn, args, context=context)
    )
    try:
        result = await asyncio.shield(future)
    except asyncio.CancelledError:
        token.run_sync_soon(call.scope.cancel)
        await _until_done(future)
        raise
    return result.unwrap()


async def _until_done(future: asyncio.Future[Any]) -> None:
    """Wait for ``future`` even if cancelled again: the trio run must finish first."""
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue
