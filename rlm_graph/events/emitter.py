"""The fan-out: one emitter per run turns node records into events and hands each event
to every listener. Pure: the run passes its clock in.

Invariants:
    - ``seq`` rises by one per event; every listener gets every event, in that order.
    - A listener that raises is logged and skipped for that event; the run goes on and
      the other listeners still get it.
    - A limit warning is sent once per limit, the first time 80% of it is used (checked
      at each node event: tokens and dollars after each model call, time at each node).
    - With no listener, nothing is built (a run nobody watches pays one attribute test
      per node).
    - Every text of an event is whole UTF-8 (a lone surrogate, half a character a REPL
      printed, is U+FFFD): an event a listener gets is one it can write (the stream's
      buffer spills events to disk as JSON), and a spilled event reads back equal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from .._files import has_surrogate, utf8_text
from ..concurrency import AdaptiveLimit
from ..errors import message_of
from ..graph import NodeRecord
from ..limits import Budget, Limits
from .models import (
    ConcurrencyLimit,
    EventBase,
    LimitWarning,
    Listener,
    NodeFinished,
    NodeStarted,
    RunFinished,
    RunStarted,
    TextDelta,
)

__all__ = ["WARN_AT", "EventEmitter"]

logger = logging.getLogger("rlm_graph")

WARN_AT = 0.8
"""The share of a limit at which a ``limit_warning`` is sent."""


class EventEmitter:
    """Builds a run's events and fans them out to its listeners.

    Args:
        listeners: called with each event, in order.
        run_id: the run's id, on every event.
        limits: the run's limits (for warnings).
        budget: the run's tree-wide spend (read for warnings and the final totals).
        clock: the run's clock in seconds (trio's, in the runtime).
    """

    __slots__ = (
        "_budget",
        "_clock",
        "_finished",
        "_limits",
        "_listeners",
        "_names",
        "_seq",
        "_start",
        "_warned",
        "run_id",
    )

    def __init__(
        self,
        listeners: Sequence[Listener],
        *,
        run_id: str,
        limits: Limits,
        budget: Budget,
        clock: Callable[[], float],
        names: Mapping[str, str] | None = None,
    ) -> None:
        self._listeners = tuple(listeners)
        self._names = names or {}  # a provider's key -> the name a user reads
        self.run_id = run_id
        self._limits = limits
        self._budget = budget
        self._clock = clock
        self._start = clock()
        self._seq = 0
        self._warned: set[str] = set()
        self._finished = False

    @property
    def active(self) -> bool:
        """Someone listens (else the run skips building events)."""
        return bool(self._listeners)

    def run_started(self, operation: Literal["completion", "workflow"]) -> None:
        self._start = self._clock()
        limits = self._limits
        self._send(
            RunStarted,
            operation=operation,
            max_timeout=limits.max_timeout,
            max_tokens=limits.max_tokens,
            max_budget=limits.max_budget,
        )

    def node_started(self, record: NodeRecord, parent_id: str | None) -> None:
        self._send(
            NodeStarted,
            **_about(record, parent_id),
            model=record.model,
            batch_index=record.batch_index,
            input_preview=record.input_preview,
        )
        self.check_limits()

    def concurrency(self, provider: str, limit: AdaptiveLimit) -> None:
        """A provider's adaptive limit moved (a call of this run moved it)."""
        provider = self._names.get(provider, provider)
        logger.info(
            "%s: concurrency limit now %d (%d in flight, %d refused)",
            provider,
            limit.limit,
            limit.in_flight,
            limit.refusals,
        )
        self._send(
            ConcurrencyLimit,
            provider=provider,
            limit=limit.limit,
            in_flight=limit.in_flight,
            refused=limit.refusals,
        )

    def text_sink(
        self, record: NodeRecord, then: Callable[[int, str], bool | None] | None
    ) -> Callable[[int, str], bool | None] | None:
        """Where the streamed reply of ``record``'s call goes: ``then`` (the caller's
        `rlm_graph.contracts.TextSink`) and, when someone listens, a ``text_delta``
        event per piece. None when neither wants it (the call need not stream)."""
        if not self._listeners:
            return then
        parent = None if record.completion == "root" else record.completion

        def sink(offset: int, text: str) -> bool | None:
            self.text_delta(record, parent, offset, text)
            return then(offset, text) if then is not None else None

        return sink

    def text_delta(self, record: NodeRecord, parent_id: str | None, offset: int, text: str) -> None:
        self._send(
            TextDelta,
            **_about(record, parent_id),
            offset=offset,
            text=text,
        )

    def node_finished(self, record: NodeRecord, parent_id: str | None) -> None:
        self._send(
            NodeFinished,
            **_about(record, parent_id),
            status=record.status,
            duration=record.duration,
            model=record.model,
            usage=record.usage,
            cost=record.cost,
            preview=record.output_preview,
            error=record.error,
            error_type=record.error_type,
            hedge=record.hedge,
        )
        self.check_limits()

    def run_finished(
        self,
        *,
        nodes: int,
        result: Any = None,
        stop_reason: str | None = None,
        error: BaseException | None = None,
    ) -> None:
        self._finished = True
        self._send(
            RunFinished,
            nodes=nodes,
            stop_reason=stop_reason,
            error=f"{type(error).__name__}: {message_of(error)}" if error is not None else None,
            usage=self._budget.usage,
            cost=self._budget.cost,
            result=result,
        )

    def check_limits(self) -> None:
        """Send a ``limit_warning`` for each limit now past `WARN_AT` of its maximum (once
        per limit): called as nodes start and end, and by the run's timer for time.
        Nothing once the run has finished (``run_finished`` stays the last event)."""
        if self._finished:
            return
        limits, budget = self._limits, self._budget
        if limits.max_tokens is not None:
            self._warn("max_tokens", budget.input_tokens + budget.output_tokens, limits.max_tokens)
        if limits.max_budget is not None:
            self._warn("max_budget", budget.cost, limits.max_budget)
        if limits.max_timeout is not None:
            self._warn("max_timeout", self._clock() - self._start, limits.max_timeout)

    def _warn(
        self, limit: Literal["max_timeout", "max_tokens", "max_budget"], used: float, maximum: float
    ) -> None:
        if used >= WARN_AT * maximum and limit not in self._warned:
            self._warned.add(limit)
            self._send(LimitWarning, limit=limit, used=used, maximum=maximum)

    def _send(self, cls: type[EventBase], **fields: Any) -> None:
        if not self._listeners:
            return
        self._seq += 1
        for name, value in fields.items():
            if isinstance(value, str) and has_surrogate(value):
                fields[name] = utf8_text(value)
        event = cls(
            seq=self._seq,
            run_id=self.run_id,
            time=time.time(),
            elapsed=self._clock() - self._start,
            **fields,
        )
        for listener in self._listeners:
            try:
                listener(event)
            except (Exception, SystemExit):  # a listener's bug (even sys.exit) is not the run's
                logger.exception(
                    "the rlm-graph listener %s failed on node %s (event %s: %s)",
                    getattr(listener, "__qualname__", None) or type(listener).__qualname__,
                    event.node_id or "-",
                    event.seq,
                    getattr(event, "type", "?"),
                )


def _about(record: NodeRecord, parent_id: str | None) -> dict[str, Any]:
    """The fields of a node event that say which node it is about."""
    return {
        "node_id": record.id,
        "parent_id": parent_id,
        "kind": record.kind,
        "depth": record.depth,
        "completion": record.completion,
        "iteration": record.iteration,
    }
