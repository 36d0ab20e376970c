"""The calls of one batch on the ray executor's pool of completion workers.

The driver keeps at most ``concurrency`` calls in flight, each to the worker with the
fewest calls of the batch, never more than a worker's share (the completions it runs at
once). When a worker process dies, every completion it was running fails with it, the
item that killed it (its model code called ``os.kill``, ran the process out of memory)
and its neighbours alike, and the driver cannot tell which was which. So the dead
worker's place in the pool gets a new worker that first runs those items again one at a
time, each alone on it, and takes new items only after; a death counts against an item
(``max_retries``) only when the item was running alone. An item that kills every worker
it runs on uses up its retries by itself; its neighbours answer.

Invariants:
    - A place being cleared (items of its dead worker wait to run alone there) gets no
      new item; its next waiting item starts once no other call of the batch is in
      flight on its worker, so each runs alone.
    - Every call in flight is in ``pending``. An item waiting to run alone is not, but
      its place then has a call of the batch in flight (whose end starts the next).
    - A dead worker's provider slots are released in the limits actor, under the name
      they were held by (its own, never its replacement's, whichever batch sharing the
      pool replaced it), before its items run again.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlm_graph import scratch
from rlm_graph.errors import ConfigError
from rlm_graph.executors import BatchError, BatchItem, BatchResult

if TYPE_CHECKING:
    from .executor import RayExecutor

__all__ = ["Calls", "failed"]

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")  # the colours of Ray's error texts


@dataclass(eq=False, slots=True)
class _Call:
    """One call in flight: an item's run on one worker."""

    item: BatchItem
    attempt: int  # the item's runs so far, this one included (its result's ``attempts``)
    deaths: int  # of its earlier runs, those whose worker died while it ran there alone
    index: int  # the worker's place in the pool
    worker: Any
    holder: str  # the name the worker's slots of this batch are held under
    shared: bool | None = None  # its worker died: did other calls of the batch die with it?


class Calls:
    """The calls of one batch in flight on ``pool`` (a list of workers, each running up
    to ``per_worker`` completions, shared with the driver's other batches)."""

    def __init__(
        self,
        executor: RayExecutor,
        pool: list[Any],
        per_worker: int,
        concurrency: int,
        arguments: tuple[Any, Any],
    ) -> None:
        self.executor = executor
        self.ray = executor._ray
        self.pool = pool
        self.per_worker = per_worker
        self.concurrency = concurrency
        self.kwargs, self.keys = arguments  # object refs: put in Ray's store once
        self.actor = executor._limits_actor()
        self.batch = uuid.uuid4().hex[:12]
        self.pending: dict[Any, _Call] = {}
        self.failed_early: list[BatchResult] = []
        self.load: Counter[Any] = Counter()  # calls of this batch in flight, per worker
        # Each place being cleared: the items of its dead worker waiting to run alone
        # there (item, attempt, deaths).
        self.clearing: dict[int, deque[tuple[BatchItem, int, int]]] = {}
        # Each worker's slots of this batch are held under a name of its own, by worker
        # (the pool is shared: another batch may have replaced a dead worker in it).
        self._names = itertools.count()
        self.holders: dict[Any, str] = {}

    def fill(self, items: Iterator[BatchItem]) -> None:
        """Submit items until ``concurrency`` calls are in flight, no worker takes one
        more, or none is left."""
        while len(self.pending) < self.concurrency:
            index = self._place()
            if index is None:
                return
            item = next(items, None)
            if item is None:
                return
            try:
                loaded = item.loaded()
            except ConfigError as exc:  # its context file went missing: that item failed
                self.failed_early.append(failed(item, exc, 1))
                continue
            self._send(loaded, 1, 0, index)

    def finished(self, ref: Any) -> BatchResult | None:
        """The result of the call ``ref``, or None when its item will run again."""
        call = self.pending.pop(ref)
        self.load[call.worker] -= 1
        if self.load[call.worker] <= 0:
            del self.load[call.worker]
        outcome = self._outcome(ref, call)
        result = self._died(call, outcome) if isinstance(outcome, BaseException) else outcome
        self._next_alone(call.index)
        return result

    def _place(self) -> int | None:
        """The place of the worker with the fewest calls of the batch, of those taking
        new items and below their share; None when there is none."""
        free = [
            index
            for index, worker in enumerate(self.pool)
            if index not in self.clearing and self.load[worker] < self.per_worker
        ]
        return min(free, key=lambda index: self.load[self.pool[index]], default=None)

    def _send(self, item: BatchItem, attempt: int, deaths: int, index: int) -> None:
        worker = self.pool[index]
        holder = self.holders.get(worker)
        if holder is None:
            holder = self.holders[worker] = f"{self.batch}/worker-{next(self._names)}"
        ref = worker.complete.remote(
            self.kwargs, item, self.actor, self.batch, attempt, self.keys, holder
        )
        self.pending[ref] = _Call(item, attempt, deaths, index, worker, holder)
        self.load[worker] += 1

    def _outcome(self, ref: Any, call: _Call) -> BatchResult | BaseException:
        """The result of a finished call, or the error of its worker's death (whose
        slots are released by then)."""
        ray = self.ray
        exceptions = ray.exceptions
        try:
            return BatchResult(**ray.get(ref))
        except (
            exceptions.RayActorError,
            exceptions.WorkerCrashedError,
            exceptions.NodeDiedError,
            exceptions.ObjectLostError,
            exceptions.OwnerDiedError,
        ) as exc:
            ray.get(self.actor.release_owner.remote(call.holder))
            death: BaseException = exc
            return death
        except exceptions.RayError as exc:  # the call itself could not run (a bug, a bad pickle)
            # The worker lives on (its limiter gave back what the call held): nothing to free.
            return failed(call.item, exc, call.attempt)

    def _died(self, call: _Call, exc: BaseException) -> BatchResult | None:
        """``call``'s worker died: it is replaced (once), and the item waits to run
        alone in its place, or fails when it has died alone more than ``max_retries``
        times."""
        if call.shared is None:  # the first of the worker's calls to come back
            others = [other for other in self.pending.values() if other.worker == call.worker]
            for dead in (call, *others):
                dead.shared = bool(others)
        if self.pool[call.index] == call.worker:
            self._replace(call.index)
        deaths = call.deaths + (0 if call.shared else 1)
        if deaths > self.executor.max_retries:
            return failed(call.item, exc, call.attempt)
        waiting = self.clearing.setdefault(call.index, deque())
        waiting.append((call.item, call.attempt + 1, deaths))
        return None

    def _replace(self, index: int) -> None:
        self.ray.kill(self.pool[index])
        scratch.sweep_stale()  # what the dead process left on this machine
        self.pool[index] = self.executor._new_worker(self.per_worker)

    def _next_alone(self, index: int) -> None:
        """Start the next item waiting to run alone at ``index`` if nothing else of the
        batch is in flight on its worker; with none left, the place takes new items."""
        waiting = self.clearing.get(index)
        if waiting is None or self.load[self.pool[index]] > 0:
            return
        if not waiting:
            del self.clearing[index]
            return
        self._send(*waiting.popleft(), index)


def failed(item: BatchItem, exc: BaseException, attempt: int) -> BatchResult:
    """A failed item's result. An error the call raised in its worker comes as Ray's
    wrapper (``RayTaskError``, whose text is a coloured header and a traceback): the
    row says the worker's own error, its type and message."""
    now = time.time()
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = _ANSI.sub("", str(exc)).strip()
    message = text.splitlines()[0] if text else type(exc).__name__
    return BatchResult(
        id=item.id,
        started_at=now,
        finished_at=now,
        seconds=0.0,
        attempts=attempt,
        executor="ray",
        error=BatchError(type=type(exc).__name__, message=message),
        asked=item.asked(),
    )
