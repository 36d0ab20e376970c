"""Long-lived completion workers of the ray executor: Ray actors that each keep one trio
loop and run several completions in it at once.

A Ray task per completion pays, every time, for a fresh trio loop, the engine's import
and set-up state, and (over HTTP) new connections; and ten one-completion processes on
a small machine mostly wait for each other's time slices. A `CompletionWorker` starts
its trio loop once (in a thread of its own) and serves ``complete`` calls from Ray's
thread pool (``max_concurrency`` = the completions it runs at once): each call hands its
completion to the loop (`trio.from_thread.run`) and returns the result, so every
completion is still one Ray call whose result the driver waits on by itself.

The completions of one batch in one worker share one `RayLimiter` (owner: the worker's
``holder`` name for that batch, chosen by the driver) that keeps released slots for the
next request of the process (see `RayLimiter`): in a steady batch most model calls pass
the cluster-wide gate with no message to the limits actor.

Invariants:
    - One loop per worker process, started before the first call returns; a call never
      runs outside it.
    - `CompletionWorker.stop` cancels every completion running in the worker (or one
      batch's) and waits (bounded) until they have ended, their environments closed and
      scratch folders removed: the driver calls it before it kills a worker whose
      completions it stopped waiting for, and with ``batch`` when a batch stops early
      while another batch of the driver still uses the worker.
    - Every slot a worker holds is held under its ``holder`` name, so when the worker
      dies the driver releases all of them with one ``release_owner(holder)``.
    - The variables the driver forwards (providers' keys) are in the process's
      environment only while a completion's engine is built, never after: the worker
      outlives the batch, and serves the driver's next one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import trio

from rlm_graph import scratch
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
        self._limiters: dict[str, RayLimiter] = {}  # holder -> its batch's limiter here
        self._running: dict[trio.CancelScope, str] = {}  # each running completion's batch
        self._ended = threading.Condition()

    def pid(self) -> int:
        """This worker's process id (ready check; tests kill it by this)."""
        return os.getpid()

    def recall(self, holder: str, key: str, news: int) -> None:
        """Called by the limits actor when someone else waits for ``key``: give back the
        idle slots ``holder`` keeps (``news`` orders this against grants)."""
        limiter = self._limiters.get(holder)
        if limiter is not None:
            trio.from_thread.run_sync(limiter.recall, key, news, trio_token=self._token)

    def stop(self, timeout: float = 10.0, batch: str | None = None) -> int:
        """Cancel the completions running here (with ``batch``: that batch's only, the
        worker serving on) and wait up to ``timeout`` seconds for them to end (their
        environments close: nothing of theirs is left on disk). Returns how many were
        still running after that."""

        def mine() -> list[trio.CancelScope]:
            return [s for s, b in list(self._running.items()) if batch in (None, b)]

        def cancel() -> None:
            for scope in mine():
                scope.cancel()

        trio.from_thread.run_sync(cancel, trio_token=self._token)
        with self._ended:
            self._ended.wait_for(lambda: not mine(), timeout)
            left = len(mine())
        if batch is None:
            scratch.clear_kept()  # the empty folders kept for reuse: this worker is stopping
        return left

    def forget(self, holder: str) -> None:
        """Called when ``holder``'s batch has ended: drop its limiter (the actor forgets
        the batch's slots itself)."""
        self._limiters.pop(holder, None)

    def complete(
        self,
        rlm_kwargs: Mapping[str, Any],
        item: BatchItem,
        actor: Any,
        batch: str,
        attempt: int,
        keys: Mapping[str, str],
        holder: str,
    ) -> dict[str, Any]:
        """Answer ``item`` in this worker's trio loop (called from one of Ray's threads).

        ``keys`` are the driver's variables the batch's providers take their keys from
        (a worker on another node has the environment of its node): set while the
        completion's engine is built (`_variables_set`), then as they were.
        ``holder`` names this worker's slots of this batch.
        """
        import ray

        from rlm_graph import RLM
        from rlm_graph.executors import complete_item, frozen_heap

        limiter = self._limiters.get(holder)
        if limiter is None:
            keeper = ray.get_runtime_context().current_actor
            # setdefault: two first calls at once end up with the same one.
            limiter = self._limiters.setdefault(
                holder, RayLimiter(actor, batch=batch, owner=holder, keeper=keeper)
            )

        async def answer() -> BatchResult:
            scope = trio.CancelScope()
            self._running[scope] = batch
            try:
                with scope:
                    with _variables_set(keys):  # its providers read their keys now
                        engine = RLM(**rlm_kwargs, limiter=limiter)
                    async with engine as rlm:
                        return await complete_item(rlm, item, executor="ray", attempts=attempt)
                raise RuntimeError("the worker was stopped")  # by `stop`, mid-completion
            finally:
                limiter.flush()  # releases the loop had no time to send
                with self._ended:
                    self._running.pop(scope, None)
                    self._ended.notify_all()

        # A worker process holds Ray's heap too: no full collection walks it mid-batch.
        with frozen_heap():
            return trio.from_thread.run(answer, trio_token=self._token).model_dump(mode="json")


@contextmanager
def _variables_set(variables: Mapping[str, str]) -> Iterator[None]:
    """``variables`` in this process's environment for the moment an engine is built
    (its providers read their keys then), then back as they were: a later completion,
    another batch's (``forward_keys=False``) or model code, finds none of them left.

    Engines are built on the worker's one trio thread, one at a time, with no await in
    between, so no two completions set them at once. Model code of the ``local``
    environment running meanwhile in another thread could read them for that moment;
    that environment hides nothing from model code anyway (docs/environments.md).
    """
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
