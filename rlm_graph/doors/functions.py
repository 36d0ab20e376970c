"""The way out: a workflow's function nodes that are not trio code, run from the scheduler.

- A plain (sync) function runs in a worker thread (`run_in_thread`), so the scheduler
  and every other node go on while it works. A model node's prompt function runs on the
  scheduler's thread (`prompt_messages`): it builds text, and may use what the caller's
  thread holds.
- An ``async`` function written for trio is awaited on the scheduler's loop; one that
  turns out to be asyncio code fails with a `NodeFailed` that says to pass
  ``loop="asyncio"`` (`on_trio`), not with asyncio's or trio's own puzzling error.
- An ``async`` function written for asyncio (``loop="asyncio"``) runs on an asyncio loop
  of its own, ``asyncio.run`` in a worker thread (`run_on_asyncio`): the simplest way
  that gives it a running loop, ``asyncio.current_task()`` and its libraries, without
  tying the engine's trio loop to asyncio.

Invariants:
    - Cancelling the node (the run's deadline, the node's ``timeout``, another node's
      fatal error, Ctrl-C) returns at once: the thread is abandoned
      (``abandon_on_cancel``). An asyncio coroutine is also cancelled in its loop, so it
      unwinds at its next ``await``; a plain function cannot be stopped by Python and
      runs to its end, its result dropped. Either way a thread still running is handed
      to ``abandoned`` (its ``finished`` event), for the run to count as leaked (a
      cancelled coroutine first gets 0.2 s to unwind: it is not leaked, only stopping).
    - Threads come from the caller's ``limiter``, not trio's default one: an abandoned
      thread holds its token until it ends, and must not starve other users of threads
      (the journal's writer).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, cast

import trio

from ..contracts import Message
from ..errors import NodeFailed, asyncio_on_trio
from ..graph import NodeRecord, preview
from ..graph.spec import NodeSpec, is_async

__all__ = [
    "call_function",
    "function_try",
    "on_trio",
    "prompt_messages",
    "run_in_thread",
    "run_on_asyncio",
]


async def call_function(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    native: bool,
    loop: str,
    limiter: trio.CapacityLimiter,
    abandoned: list[threading.Event],
    on_start: Callable[[], None] | None = None,
) -> Any:
    """``fn(*args, **kwargs)`` where it belongs: awaited here when it is trio code
    (``native``), on an asyncio loop in a thread for ``loop="asyncio"``, else in a thread
    (``on_start`` called when it gets its thread: waiting for one is not running).

    Raises:
        RuntimeError: the function called ``sys.exit()``, or raised another exception
            that is not an ``Exception`` (a class of its own, asyncio's
            ``CancelledError``): a node cannot end the program or the run, it fails, and
            the rest of the workflow goes on (trio's cancellation and Ctrl-C go on up).
    """
    if native:
        return await _awaited(fn, lambda: fn(*args, **kwargs))
    door = run_on_asyncio if loop == "asyncio" else run_in_thread
    if on_start is not None:
        limiter = cast(trio.CapacityLimiter, _Started(limiter, on_start))
    result = await door(fn, args, kwargs, limiter=limiter, abandoned=abandoned)
    if loop == "trio" and hasattr(result, "__await__"):
        # A plain function that returned a trio awaitable (a lambda calling an async def)
        result = await _awaited(fn, lambda: result)
    return result


async def _awaited(fn: Callable[..., Any], start: Callable[[], Awaitable[Any]]) -> Any:
    """``await start()`` on the scheduler's loop (`on_trio`); a ``BaseException`` that
    is not the run's own business fails the node (`_not_an_exception`)."""
    try:
        return await on_trio(fn, start())
    except BaseException as exc:
        if isinstance(exc, Exception) or _goes_on(exc):
            raise
        raise _not_an_exception(fn, exc) from None


def function_try(
    spec: NodeSpec,
    inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    limiter: trio.CapacityLimiter,
    abandoned: list[threading.Event],
) -> Callable[[NodeRecord], Awaitable[Any]]:
    """One try of a workflow's function node (the graph executor's body for it):
    ``spec.fn`` of the node's resolved arguments (``inputs()``), where it belongs
    (`call_function`), its previews on its record."""
    fn, native = spec.fn, is_async(spec.fn) and spec.loop == "trio"
    assert fn is not None
    waited: list[bool] = []

    def started(record: NodeRecord) -> None:
        """The first try got its thread: the node's service starts (waiting for one,
        like a model node's wait for a provider slot, is queueing)."""
        if not waited:
            waited.append(True)
            record.began(trio.current_time(), time.time())

    async def body(record: NodeRecord) -> Any:
        args, kwargs = inputs()
        record.input_preview = preview([*args, *kwargs.values()])
        result = await call_function(
            fn,
            args,
            kwargs,
            native=native,
            loop=spec.loop,
            limiter=limiter,
            abandoned=abandoned,
            on_start=lambda: started(record),
        )
        record.output_preview = preview(result)
        return result

    return body


def prompt_messages(
    spec: NodeSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[Message]:
    """A workflow model node's messages (`NodeSpec.messages`). Its prompt function, if it
    has one, runs here, on the scheduler's thread (it builds text: keep it quick, and
    give slow work to a function node whose result it takes), as it always has: shared
    state and thread-bound objects it uses stay safe. One that calls ``sys.exit()`` or
    raises another ``BaseException`` fails its node; Ctrl-C and cancellation pass."""
    make, prompt = spec.prompt, spec.prompt
    if callable(make):
        try:
            prompt = make(*args, **kwargs)
        except BaseException as exc:
            if isinstance(exc, Exception) or _goes_on(exc):
                raise
            raise _not_an_exception(make, exc, "prompt function") from None
    return spec.messages(prompt)


async def on_trio(fn: Callable[..., Any], awaitable: Awaitable[Any]) -> Any:
    """``await awaitable`` on the scheduler's trio loop; asyncio code there fails with a
    `NodeFailed` that names the fix (its own error as the cause)."""
    try:
        return await awaitable
    except (RuntimeError, TypeError) as exc:
        if not asyncio_on_trio(exc):
            raise
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise NodeFailed(
            f"function {name!r} ran on trio's loop and needs asyncio's ({exc.__class__.__name__}:"
            f" {str(exc).split('. ')[0]}): written for asyncio? pass loop='asyncio' to "
            "wf.function"
        ) from exc


async def run_in_thread(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    limiter: trio.CapacityLimiter,
    abandoned: list[threading.Event],
    on_cancel: Callable[[], None] | None = None,
) -> Any:
    """``fn(*args, **kwargs)`` in a worker thread; what it returns or raises (a
    ``BaseException`` that is not an ``Exception`` as a `RuntimeError` naming ``fn``).
    Cancelled, it calls ``on_cancel`` (a way to stop the thread's work,
    if there is one) and hands the thread, still running, to ``abandoned``."""
    finished = threading.Event()

    def work() -> Any:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # sys.exit() in a thread would end only the thread
            if isinstance(exc, Exception):
                raise
            raise _not_an_exception(fn, exc) from None
        finally:
            finished.set()
        # trio refuses a coroutine back from a thread (it takes the function for async)
        return _Coroutine(result) if inspect.iscoroutine(result) else result

    try:
        result = await trio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)
        return result.coroutine if isinstance(result, _Coroutine) else result
    except trio.Cancelled:
        if on_cancel is not None:
            on_cancel()
            await _unwinding(finished)
        if not finished.is_set():
            abandoned.append(finished)
        raise


class _Coroutine:
    """A coroutine a plain function returned, carried out of its thread to be awaited."""

    __slots__ = ("coroutine",)

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.coroutine = coroutine


_UNWIND = 0.2
"""Seconds a stopped asyncio coroutine gets to unwind (it does at its next ``await``)
before its thread counts as leaked."""


async def _unwinding(finished: threading.Event) -> None:
    """Wait, shielded, up to `_UNWIND` seconds of real time (the thread's, whatever
    trio's clock says: a test's ``MockClock`` may stand still) for a stopped thread to
    end; on a thread of its own, not one of the run's function threads."""
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(finished.wait, _UNWIND, limiter=trio.CapacityLimiter(1))


def _goes_on(exc: BaseException) -> bool:
    """Whether a trio function's ``exc`` is the run's own business (its cancellation,
    Ctrl-C), not the node's failure (a ``GeneratorExit`` it raised is its own: trio never
    closes a running task's coroutine)."""
    stops = (trio.Cancelled, KeyboardInterrupt)
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(lambda e: isinstance(e, stops)) is not None
    return isinstance(exc, stops)


def _not_an_exception(
    fn: Callable[..., Any], exc: BaseException, role: str = "function"
) -> RuntimeError:
    """The node's error for a function (a node's ``role``: its function, its prompt
    function) that raised ``exc``, a ``BaseException`` that is not an ``Exception`` (its
    text kept, its traceback dropped with the chain)."""
    name = getattr(fn, "__qualname__", type(fn).__name__)
    if isinstance(exc, SystemExit):
        return RuntimeError(
            f"{role} {name!r} called sys.exit({exc.code!r}); a node cannot end the "
            "program: raise an exception to fail the node"
        )
    what = type(exc).__name__ + (f"({exc})" if str(exc) else "")
    hint = " (a task it awaited was cancelled?)" if isinstance(exc, asyncio.CancelledError) else ""
    return RuntimeError(
        f"{role} {name!r} raised {what}{hint}, which is not an Exception; a node cannot "
        "end the run: it fails (raise an Exception to fail a node on purpose)"
    )


class _Started:
    """A thread limiter (trio's ``limiter=`` protocol) that says when its thread got its
    place; the place is the wrapped limiter's, held until the thread ends."""

    __slots__ = ("_limiter", "_on_start")

    def __init__(self, limiter: trio.CapacityLimiter, on_start: Callable[[], None]) -> None:
        self._limiter = limiter
        self._on_start = on_start

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await self._limiter.acquire_on_behalf_of(borrower)
        self._on_start()

    def release_on_behalf_of(self, borrower: object) -> None:
        self._limiter.release_on_behalf_of(borrower)


async def run_on_asyncio(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], **thread: Any
) -> Any:
    """``await fn(*args, **kwargs)`` on a new asyncio loop in a worker thread
    (`run_in_thread`, whose keywords ``thread`` holds); cancelled, the coroutine is
    cancelled in its loop too."""
    lock = threading.Lock()  # the node's cancellation and the coroutine's start, in order
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []
    cancelled: list[bool] = []

    async def main() -> Any:
        task = asyncio.current_task()
        assert task is not None
        with lock:
            if cancelled:  # cancelled before it could start: it never does
                raise asyncio.CancelledError
            running.append((asyncio.get_running_loop(), task))
        try:
            return await fn(*args, **kwargs)
        except BaseException as exc:
            if isinstance(exc, Exception) or cancelled:
                raise
            raise _not_an_exception(fn, exc) from None

    def cancel() -> None:
        with lock:
            cancelled.append(True)
            for loop, task in running:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop closed meanwhile: the coroutine is done
                    pass

    return await run_in_thread(lambda: asyncio.run(main()), (), {}, on_cancel=cancel, **thread)
