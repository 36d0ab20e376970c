"""The in-process REPL: each block runs in a worker thread; sub-calls re-enter trio.

The three traps of the design, and how this module avoids them:
    1. Deadlock under recursion: blocks run on threads from an *unbounded* limiter, so a
       block waiting on its children never holds a slot the children need; children in
       flight are bounded by the scheduler's per-depth limiter instead.
    2. Mixed output: printed output is captured per thread (`rlm_graph.repl.capture`),
       never by swapping ``sys.stdout`` under a lock.
    3. Process-wide state: no ``chdir``; each environment has its own scratch folder,
       and relative paths given to ``open`` land in it.

Stopping a block (timeout, cancellation): trio stops waiting at once, every sub-call
the block has in flight is cancelled and later ones fail, and the thread gets a
`BlockInterrupted` exception at its next Python instruction. Model code that catches it
(``except BaseException: continue``) does not get to go on: the session marks the thread
as stopped, and every ``except`` and ``finally`` of the REPL's code raises it again on
entry (see `ReplSession.stop_thread`). The engine keeps interrupting for ``stop_grace``
seconds; a thread still running then (inside one long C call: ``time.sleep``, a regex)
is *leaked*: logged once by name, counted in ``leaked_threads``, and still interrupted
every half second until it ends. Use the ``subprocess`` environment where that matters.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
import os
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import outcome
import trio

from rlm_graph import scratch
from rlm_graph.contracts import ExecResult, Message, SubcallBridge, SubcallRequest
from rlm_graph.errors import ConfigError
from rlm_graph.repl import BlockInterrupted, ReplSession

__all__ = ["LocalEnvironment"]

T = TypeVar("T")

logger = logging.getLogger("rlm_graph.local")

_REINTERRUPT = 0.05  # seconds between interrupts while the grace period runs
_LEAKED_REINTERRUPT = 0.5  # and after it, for a leaked thread


_STARTING_A_THREAD = threading.Thread.start.__code__


def _send_stop(thread_id: int) -> bool:
    """Raise `BlockInterrupted` in the thread ``thread_id``; False if it was not sent.

    Not while that thread is starting another: until a new thread runs its first step,
    CPython files it under the id of the thread that starts it, so the exception would
    also land in the new thread before it says it has started, and the starter would
    wait for it forever (inside ``concurrent.futures``, holding a lock that every pool of
    the process takes: the whole process's pools would hang). Under the lock that
    `Thread.start` takes first (looked up now: a forked child has a new one), no thread
    begins starting while the exception is sent; the caller sends again a moment later.
    """
    with threading._active_limbo_lock:  # type: ignore[attr-defined]
        if threading._limbo and _in_thread_start(thread_id):  # type: ignore[attr-defined]
            return False
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread_id), ctypes.py_object(BlockInterrupted)
        )
        return True


def _in_thread_start(thread_id: int) -> bool:
    """Whether the thread ``thread_id`` is inside `threading.Thread.start`."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code is _STARTING_A_THREAD:
            return True
        frame = frame.f_back
    return False


class _BlockControl:
    """The link between one running block's thread and the trio side.

    Sub-calls from the block's thread run as tasks of the nursery that `execute` holds
    open for the block, so cutting the block cancels them and waits for them: nothing the
    block started outlives it.
    """

    def __init__(self, nursery: trio.Nursery, session: ReplSession) -> None:
        self.nursery = nursery
        self.session = session
        self.lock = threading.Lock()
        self.thread_id: int | None = None
        self.running = False
        self.interrupted = False
        self.finished = threading.Event()
        # A KeyboardInterrupt (or other BaseException) of the engine's that a sub-call
        # met: it stops the block and is raised again on the loop's side, never handed
        # to the model's code as if the code had raised it.
        self.engine_error: BaseException | None = None

    def interrupt(self) -> bool:
        """Cancel the block's sub-calls and raise `BlockInterrupted` in its thread.

        Returns:
            Whether the block's thread was still running.
        """
        self.nursery.cancel_scope.cancel()
        return self.interrupt_thread()

    def interrupt_thread(self) -> bool:
        """Raise `BlockInterrupted` in the block's thread (callable from any thread).

        Returns:
            Whether the block's thread was still running.
        """
        with self.lock:
            self.interrupted = True
            if self.running and self.thread_id is not None:
                self.session.stop_thread(self.thread_id)
                _send_stop(self.thread_id)
                return True
            return False

    async def stop(self, grace: float) -> bool:
        """Interrupt the thread until it ends, for at most ``grace`` seconds.

        The grace period is real time (the thread runs in real time, whatever trio's clock
        says), waited for on a worker thread.

        Returns:
            ``True`` if the thread ended, ``False`` if it still runs (it is leaked).
        """
        deadline = time.monotonic() + grace
        while self.interrupt():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await trio.to_thread.run_sync(self.finished.wait, min(_REINTERRUPT, left))
        return True

    def keep_interrupting(self) -> None:
        """On a thread of its own: interrupt a leaked block's thread until it ends."""
        # Not `interrupt`: the block's nursery belongs to trio, and this is not trio's thread.
        while self.interrupt_thread():
            self.finished.wait(_LEAKED_REINTERRUPT)


class _ThreadCaller:
    """`SubcallCaller` for code on a worker thread: each call re-enters trio."""

    def __init__(self, env: LocalEnvironment) -> None:
        self.env = env

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        control = self.env._control
        token = self.env._token
        if control is None or token is None or control.interrupted:
            raise BlockInterrupted("the block was stopped")
        try:
            result: outcome.Outcome[T] = trio.from_thread.run(
                _in_block_nursery, control, fn, *args, trio_token=token
            )
        except (trio.RunFinishedError, RuntimeError) as exc:  # the run or the block ended
            raise BlockInterrupted("the block was stopped") from exc
        return result.unwrap()

    def call(self, request: SubcallRequest) -> Any:
        return self._call(self.env.bridge.call, request)


class _ClosedCaller:
    """The caller of a closed environment's session: it holds nothing (the live caller
    holds the environment, which holds the session: a cycle)."""

    def call(self, request: SubcallRequest) -> Any:
        raise BlockInterrupted("the environment is closed")


_CLOSED = _ClosedCaller()


def _deliver_pending() -> None:
    """A Python-level call: the interpreter checks for pending async exceptions here."""


async def _in_block_nursery(
    control: _BlockControl, fn: Callable[..., Awaitable[T]], *args: Any
) -> outcome.Outcome[T]:
    """Run ``fn(*args)`` as a task of the block's nursery and wait for its outcome."""
    done = trio.Event()
    box: list[outcome.Outcome[T]] = []

    async def task() -> None:
        try:
            box.append(await outcome.acapture(fn, *args))
        finally:
            done.set()

    control.nursery.start_soon(task)
    await done.wait()
    if not box:
        return outcome.Error(BlockInterrupted("the block was stopped"))
    found = box[0]
    if isinstance(found, outcome.Error) and not isinstance(found.error, Exception):
        if not isinstance(found.error, trio.Cancelled | BlockInterrupted):
            # The engine's own (a Ctrl-C landing in a sub-call): the whole block stops,
            # its other sub-calls with it, and the error is raised again on this side.
            control.engine_error = found.error
            control.interrupt()
        return outcome.Error(BlockInterrupted("the block was stopped"))
    return found


@dataclasses.dataclass(frozen=True)
class LocalOptions:
    """The ``environment_kwargs`` of the local environment (`LocalEnvironment` says what
    each means), checked when made.

    Raises:
        ConfigError: a bad value.
    """

    timeout: float | None = None
    scratch_dir: str | None = None
    output_cap: int = 1_000_000
    stop_grace: float = 1.0
    subcalls: bool = True

    def __post_init__(self) -> None:
        timeout, stop_grace, output_cap = self.timeout, self.stop_grace, self.output_cap
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf  # NaN and infinity too
        ):
            raise ConfigError(
                "local environment: timeout must be a positive finite number of seconds "
                f"(None for no limit), not {timeout!r:.40}"
            )
        if self.scratch_dir is not None and not os.path.isdir(self.scratch_dir):
            raise ConfigError(
                f"local environment: scratch_dir {self.scratch_dir!r} is not a folder"
            )
        if isinstance(output_cap, bool) or not isinstance(output_cap, int) or output_cap < 1:
            raise ConfigError("local environment: output_cap must be a positive int")
        if (
            isinstance(stop_grace, bool)
            or not isinstance(stop_grace, int | float)
            or not 0 <= stop_grace < math.inf
        ):
            raise ConfigError(
                f"local environment: stop_grace must be a finite number of seconds >= 0, "
                f"not {stop_grace!r:.40}"
            )
        if not isinstance(self.subcalls, bool):
            raise ConfigError("local environment: subcalls must be True or False")


class LocalEnvironment:
    """A REPL in the engine's process.

    Args:
        bridge: the scheduler's side of the sub-calls.
        tools: custom tools and data, ``{name: (value, description)}``.
        depth: the depth of the completion it serves.
        timeout: seconds a block may run before it is stopped and the model told so
            (default: no per-block limit; the run's ``max_timeout`` still applies).
        scratch_dir: a folder to use as the scratch folder instead of a fresh temporary
            one (it is then not deleted at close).
        output_cap: the most characters of printed output kept per block.
        stop_grace: seconds a stopped block's thread gets to end before it is counted as
            leaked (it is interrupted again and again meanwhile).
        subcalls: ``False`` leaves ``llm_query``, ``llm_query_batched``, ``rlm_query``
            and ``rlm_query_batched`` out of the REPL (the "no sub-calls" ablation).

    Attributes:
        leaked_threads: how many stopped blocks' threads were still running after
            ``stop_grace`` (the engine adds them to ``result.leaked_threads``).
    """

    def __init__(
        self,
        *,
        bridge: SubcallBridge,
        tools: Mapping[str, tuple[Any, str | None]] | None = None,
        depth: int = 0,
        **options: Any,
    ) -> None:
        opts = LocalOptions(**options)
        self.bridge = bridge
        self.depth = depth
        self.timeout = opts.timeout
        self.stop_grace = opts.stop_grace
        self.leaked_threads = 0
        self._own_dir = opts.scratch_dir is None
        self.scratch_dir = opts.scratch_dir or scratch.take_folder("local")
        self.session = ReplSession(
            _ThreadCaller(self),
            scratch_dir=self.scratch_dir,
            tools=tools,
            output_cap=opts.output_cap,
            subcalls=opts.subcalls,
        )
        self._control: _BlockControl | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._threads: trio.CapacityLimiter | None = None

    # Validates ``environment_kwargs`` without making anything (called when an `RLM` is
    # configured): a bad value is a `ConfigError`; an unknown keyword a ``TypeError``,
    # which the engine reports as a `ConfigError` naming the keywords this one takes.
    check_kwargs = staticmethod(LocalOptions)

    async def start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()

    async def add_context(self, value: Any, index: int) -> None:
        self.session.add_context(value, index)

    async def add_history(self, messages: Sequence[Message], index: int) -> None:
        self.session.add_history([m.model_dump() for m in messages], index)

    async def set_variable(self, name: str, value: Any) -> None:
        self.session.set_variable(name, value)

    async def reset_answer(self) -> None:
        self.session.reset_answer()

    async def answer_content(self) -> str:
        # On the loop's thread: never the model's __str__, which could run forever.
        return self.session.answer_content_now()

    async def execute(self, code: str) -> ExecResult:
        # A persistent session outlives its trio loop: take this loop's token each time.
        self._token = trio.lowlevel.current_trio_token()
        # Unbounded on purpose (trap 1); a fresh limiter per loop, as trio requires.
        self._threads = trio.CapacityLimiter(math.inf)
        async with trio.open_nursery() as nursery:
            control = self._control = _BlockControl(nursery, self.session)
            try:
                with trio.move_on_after(self.timeout if self.timeout is not None else math.inf):
                    return await self._in_thread(code, control)
                return ExecResult(
                    stderr=f"TimeoutError: the block ran longer than {self.timeout:g} s and was stopped\n",
                    error=f"TimeoutError: block exceeded {self.timeout:g} s",
                    timed_out=True,
                    answer_content=self.session.answer_content_now(),
                )
            finally:
                self._control = None
                with trio.CancelScope(shield=True):
                    if not await control.stop(self.stop_grace):
                        self._leaked(control, code)
        if control.engine_error is not None:  # the block's nursery was cancelled for it
            raise control.engine_error
        raise AssertionError("unreachable")  # pragma: no cover

    def _leaked(self, control: _BlockControl, code: str) -> None:
        self.leaked_threads += 1
        first_line = next((line for line in code.splitlines() if line.strip()), "")
        logger.warning(
            "local environment: the thread (id %s) of a stopped block is still running "
            "%g s later (inside a long C call?) and is leaked; it is interrupted until it "
            "ends. The block began: %r. The subprocess environment can kill such code.",
            control.thread_id,
            self.stop_grace,
            first_line[:80],
        )
        watcher = threading.Thread(
            target=control.keep_interrupting, name="rlm-graph-local-stopper", daemon=True
        )
        watcher.start()

    async def _in_thread(self, code: str, control: _BlockControl) -> ExecResult:
        result = await trio.to_thread.run_sync(
            self._thread_main, code, control, limiter=self._threads, abandon_on_cancel=True
        )
        if control.engine_error is not None:  # however the block ended
            raise control.engine_error
        if result is None:  # interrupted inside the thread: the caller is being cancelled
            await trio.lowlevel.checkpoint()
            raise BlockInterrupted("the block was stopped")
        return result

    def _thread_main(self, code: str, control: _BlockControl) -> ExecResult | None:
        try:
            return self._run_in_thread(code, control)
        finally:
            # A pooled thread: whatever runs on it next was not stopped.
            self.session.forget_thread(threading.get_ident())

    def _run_in_thread(self, code: str, control: _BlockControl) -> ExecResult | None:
        try:
            with control.lock:
                control.thread_id = threading.get_ident()
                control.running = True
            try:
                return self.session.execute(code)
            finally:
                with control.lock:
                    control.running = False
                control.finished.set()
                # An interrupt sent just before `running` went false is still pending:
                # a Python call makes the interpreter deliver it here, inside this try,
                # and not later in whatever this pooled thread runs next. (Clearing it
                # with PyThreadState_SetAsyncExc(id, NULL) instead hangs the process
                # when a tracer or profiler is active.)
                _deliver_pending()
                _deliver_pending()
        except BlockInterrupted:
            return None

    async def aclose(self) -> None:
        if self.depth == 0:
            # A journaled run seeds `random` per block, and this REPL's `random` is the
            # host's: the top-level completion ending, the host's draws are its own again
            # (a child's close would reseed its parent's blocks mid-run).
            random.seed()
        if self._control is not None:
            self._control.interrupt()
        else:  # no block runs or will run: let reference counting free the session
            self.session.close()
            self.session.caller = _CLOSED
        if self._own_dir and not scratch.give_back("local", self.scratch_dir):
            # Before the completion returns (nothing of a run outlives it), off the loop.
            await trio.to_thread.run_sync(scratch.remove, self.scratch_dir)
