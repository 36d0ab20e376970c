"""The run: shared state of one top-level run and the one place nodes are executed.

Invariants:
    - Every node of a run goes through `Run.execute`: it is added to the graph, moves
      ``pending -> running -> ok | error | cancelled``, gets its times from trio's clock,
      is announced to the run's listeners (``node_started``/``node_finished`` events, see
      `rlm_graph.events`; the pluggy observers are one listener) and is one span opened
      and closed in one ``with``.
    - A run owns one cancel scope for its whole recursion tree. A limit anywhere in the
      tree (tokens, budget, deadline) calls `Run.stop`, which records the first reason and
      cancels that scope; every in-flight node then records itself ``cancelled``.
    - When a run ends, no record is left ``pending`` or ``running``: `Run.finalize` marks
      what never finished as ``cancelled``.
    - A finished record holds no known secret: its previews and error are redacted
      before observers see it.
    - With a journal open, a node given ``journal=`` (how it is keyed and kept, a
      `Journaled`) is answered from the journal or recorded there, inside its span
      and its events, the same way for every kind (see `rlm_graph.runtime.replay`).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import trio

from .._http.attempts import RetryLog
from ..concurrency.capacity import BudgetGate
from ..errors import message_of, scrub_error
from ..events import WARN_AT, EventEmitter, Listener
from ..graph import Graph, NodeRecord, NodeStatus
from ..hedging import HedgeBudget
from ..hooks.listener import HookListener, has_observers
from ..journal.tools import NOT_JOURNALED
from ..limits import Budget, Limits

if TYPE_CHECKING:
    from ..concurrency.capacity import LoopLimiters
    from ..hooks import PluginHost
    from ..journal.seam import Journaled
    from ..routing import ProviderRouter
    from ..tracing import NodeTracer
    from .replay import Replayer

__all__ = ["Run"]

T = TypeVar("T")


def _is_cancellation(exc: BaseException) -> bool:
    """A ``trio.Cancelled`` or a Ctrl-C, or a group (from a nursery) of nothing else."""
    if isinstance(exc, trio.Cancelled | KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_cancellation(inner) for inner in exc.exceptions)
    return False


def _mark_failed(
    record: NodeRecord, exc: BaseException, redact: Callable[[str], str] | None
) -> None:
    """Record how a node's body ended: cancelled (Ctrl-C too), or failed with ``exc``
    (redacted first)."""
    if _is_cancellation(exc):
        record.status = NodeStatus.CANCELLED
    elif isinstance(exc, Exception):
        scrub_error(exc, redact)
        record.fail(type(exc).__name__, message_of(exc))


class Run:
    """One top-level run (a completion with all its children, or a workflow)."""

    def __init__(
        self,
        *,
        limits: Limits,
        host: PluginHost,
        router: ProviderRouter,
        limiters: LoopLimiters,
        tracer: NodeTracer,
        graph: Graph | None = None,
        redact: Callable[[str], str] | None = None,
        listeners: Iterable[Listener] = (),
        record_content: bool = False,
    ) -> None:
        self.limits = limits
        self.host = host
        self.router = router
        self.limiters = limiters
        self.tracer = tracer
        self.graph = graph if graph is not None else Graph()
        self.budget = Budget(limits)
        self.spend = BudgetGate(self.budget)
        self.redact = redact
        self.record_content = record_content  # keep whole inputs and outputs on records
        self.scope = trio.CancelScope()
        self._time_warning = trio.CancelScope()
        self.stop_reason: str | None = None
        self.leaked_threads = 0  # threads of stopped blocks still running (environments say)
        self._counters: Counter[str] = Counter()
        self.journal: Replayer | None = None  # set by the run's lifecycle
        self.retries = RetryLog()
        # The tree's hedged sub-calls: its latencies per model, its duplicates' budget.
        self.hedges = HedgeBudget(limits.hedge) if limits.hedge is not None else None
        self._subcalls: dict[int, trio.CapacityLimiter] = {}  # see `subcalls`
        fan_out = list(listeners)
        if has_observers(host.hook):
            fan_out.append(HookListener(host.pm, self.graph))
        self.run_id = uuid.uuid4().hex
        self.events = EventEmitter(
            fan_out,
            run_id=self.run_id,
            limits=limits,
            budget=self.budget,
            clock=trio.current_time,
            names=router.names,
        )
        self._observed = self.events.active

    def subcalls(self, depth: int) -> trio.CapacityLimiter:
        """Child completions in flight at ``depth`` of this tree (this run's
        ``max_concurrent_subcalls``): per depth, so a child waiting on its own children
        never starves them of slots; the provider limiter bounds the total."""
        if depth not in self._subcalls:
            self._subcalls[depth] = trio.CapacityLimiter(self.limits.max_concurrent_subcalls)
        return self._subcalls[depth]

    def new_id(self, prefix: str) -> str:
        self._counters[prefix] += 1
        return f"{prefix}-{self._counters[prefix]}"

    def stop(self, reason: str) -> None:
        """Stop the whole tree for ``reason`` (a limit name); the first reason wins."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.scope.cancel()

    async def execute(
        self,
        record: NodeRecord,
        body: Callable[[NodeRecord], Awaitable[T]],
        *,
        after: Iterable[str] = (),
        parent: str | None = None,
        span_parent: str | None = None,
        added: bool = False,
        journal: Journaled[T] | Callable[[], Journaled[T] | Awaitable[Journaled[T]]] | None = None,
    ) -> T:
        """Run ``body(record)`` as the node ``record``; what ``body`` raises is recorded
        on the node, then raised. ``body`` may fill in the record's usage, model, previews.

        Args:
            after: nodes this one depends on (``after`` edges).
            parent: the node that issued this one (a ``spawn`` edge).
            span_parent: the node whose span is this span's parent (default: ``parent``;
                ``None`` for both means the run's own span).
            added: the record is already in the graph (a workflow adds all nodes first).
            journal: how the node is journaled (or a function, maybe async, that says,
                called in the node when the run has a journal): a recorded result of the
                same request is the node's result, else what ``body`` returns is recorded.
        """
        if not added:
            self.graph.add(record, after=after, parent=parent)
        record.running(trio.current_time(), time.time())
        parent_id = span_parent or parent
        if self._observed:
            self._started(record, parent_id)
        try:
            with self.tracer.node_span(record, parent_id):
                try:
                    replayer = self.journal
                    if journal is None or replayer is None:
                        result = await body(record)
                    else:  # the journal's seam; no await of its own (every frame costs)
                        key = journal if isinstance(journal, tuple) else journal()
                        key = key if isinstance(key, tuple) else await key  # a prompt function's
                        result = replayer.replay(record, key)
                        if result is NOT_JOURNALED:
                            result = await body(record)
                            replayer.keep(record, key, result)
                except BaseException as exc:
                    _mark_failed(record, exc, self.redact)
                    raise
                else:
                    # A body may mark its own node failed and still return data (a block).
                    if record.status == NodeStatus.RUNNING:
                        record.status = NodeStatus.OK
                    return result
                finally:
                    record.end = trio.current_time()
        finally:
            if record.status is NodeStatus.RUNNING:  # a Ctrl-C outside the body's try
                record.status, record.end = NodeStatus.CANCELLED, trio.current_time()
            if self.redact is not None:  # no known secret stays, even one a model echoed
                record.redact(self.redact)
            if self._observed:
                self.events.node_finished(record, parent_id)

    def _started(self, record: NodeRecord, parent_id: str | None) -> None:
        if self.redact is not None:  # the event goes out now: no known secret in it
            record.input_preview = self.redact(record.input_preview)
        self.events.node_started(record, parent_id)

    def finalize(self) -> None:
        """Mark every node that never finished as ``cancelled``; log the retry summary."""
        self.retries.log_summary()
        now = trio.current_time()
        for record in self.graph.records():
            if not record.status.finished:
                if record.status == NodeStatus.RUNNING and record.end is None:
                    record.end = now
                record.status = NodeStatus.CANCELLED

    def run_started(self, operation: Literal["completion", "workflow"]) -> None:
        """Announce the run (call once, before its first node). With ``max_timeout`` and
        someone listening, a timer sends the time's ``limit_warning`` when it is due,
        even if no node starts or ends then (one long call)."""
        self.events.run_started(operation)
        if self._observed and self.limits.max_timeout is not None:
            due = trio.current_time() + WARN_AT * self.limits.max_timeout
            trio.lowlevel.spawn_system_task(self._warn_on_time, due, name="rlm_graph.time_warning")

    async def _warn_on_time(self, due: float) -> None:
        with self._time_warning:
            await trio.sleep_until(due)
            self.events.check_limits()

    def run_finished(self, result: Any = None, *, error: BaseException | None = None) -> None:
        """Announce the end of the run: its ``result``, and the ``error`` it raised if it
        did (a provider error's partial result is still a result)."""
        self._time_warning.cancel()
        self.events.run_finished(
            nodes=len(self.graph),
            result=result,
            stop_reason=getattr(result, "stop_reason", None),
            error=error,
        )
