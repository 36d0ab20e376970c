"""The run lifecycle: everything around a run, completion or workflow, written once.

    run_lifecycle(run, operation)
        the deadline -> run_started -> the journal -> the run's span (linked to the
        first attempt's) -> the operation's body, in the run's cancel scope -> the stop
        reason -> every record finished -> the journal closed -> the result ->
        run_finished -> the spans flushed -> raised on a limit (``on_limit="raise"``)

An `Operation` is what varies: a completion (`rlm_graph.runtime.completion`) or a
workflow (`rlm_graph.runtime.workflow`) says what its body does, what its answer and
result are, and how a failure carries its partial data.

Invariants:
    - ``run_started`` comes before the first node and ``run_finished`` after the last,
      once each, whatever happens in between (a failure's partial result, if it has
      one, is the event's result).
    - A cut run (a limit, a cancellation) ends with every node finished (`Run.finalize`),
      its stop reason on the result and on the run's span, and its journal closed
      (``stopped``), before the result is built.
    - A `ProviderError` that ends the run reaches the caller carrying its partial
      result, with its spans flushed; any other error passes unchanged (a group holding
      one real error and cancellations is that error). Ctrl-C (``KeyboardInterrupt``) is
      such an error, except for an operation that ``returns_when_interrupted`` (a
      workflow): its run ends as a cut one, with ``stop_reason="interrupted"``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import trio

from ..doors.sync import reraise, unwrap
from ..errors import LimitExceeded, ProviderError
from ..journal import ReplaySummary
from ..journal.seam import JournalTarget
from .replay import open_journal

if TYPE_CHECKING:
    from .context import Run

__all__ = ["Operation", "Outcome", "run_lifecycle"]


class Outcome(Protocol):
    """What a run's result has that the lifecycle fills in or reads."""

    stop_reason: str | None
    replay: ReplaySummary | None


R = TypeVar("R", bound=Outcome)


class Operation(Protocol[R]):
    """What a run does inside its lifecycle.

    Attributes:
        kind: the run's kind in its events (``run_started.operation``).
        span_name, span_attributes: the run's own span.
        journal: where the run is journaled, or None.
    """

    @property
    def kind(self) -> Literal["completion", "workflow"]: ...
    @property
    def span_name(self) -> str: ...
    @property
    def span_attributes(self) -> Mapping[str, Any]: ...
    @property
    def journal(self) -> JournalTarget | None: ...

    async def body(self, run: Run) -> None:
        """The run's work, inside its cancel scope (a limit cancels it)."""

    @property
    def stop_reason(self) -> str | None:
        """Why the body stopped short, by its own rule (``max_iterations``...), if it did."""

    def answer(self, cut: bool) -> str | None:
        """The answer the journal keeps for this attempt (``cut``: a limit stopped it)."""

    def result(self, run: Run, stop_reason: str | None, cut: bool) -> R:
        """The run's result."""

    def failed(self, run: Run, failure: BaseException) -> None:
        """Give ``failure`` the partial data it carries to the caller, if any."""

    def limit_error(self, result: R, reason: str) -> LimitExceeded | None:
        """The error raised for ``result`` when ``on_limit="raise"`` (None: ``reason`` is
        not a limit, and the result is returned)."""


async def run_lifecycle(
    run: Run, operation: Operation[R], *, flush: Callable[[], Awaitable[None]]
) -> R:
    """Run ``operation`` as ``run``, from its first event to its last.

    Args:
        run: a new run (`Engine.new_run`).
        operation: what the run does.
        flush: exports the run's spans (bounded: a collector that is down costs little).

    Raises:
        LimitExceeded: a limit stopped the run and ``on_limit="raise"``.
        ProviderError: the run's provider failed it (carrying the partial result).
    """
    if run.limits.max_timeout is not None:
        run.scope.deadline = trio.current_time() + run.limits.max_timeout
    run.run_started(operation.kind)
    try:
        result = await _journaled(run, operation, flush)
    except BaseException as exc:
        # A provider error carries the partial result: listeners get it too.
        run.run_finished(getattr(exc, "result", None), error=exc)
        raise
    run.run_finished(result)
    await flush()
    if result.stop_reason is not None and run.limits.on_limit == "raise":
        error = operation.limit_error(result, result.stop_reason)
        if error is not None:
            raise error
    return result


async def _journaled(run: Run, operation: Operation[R], flush: Callable[[], Awaitable[None]]) -> R:
    """The body in its span and scope, with the journal open around it; the result."""
    journal = None
    if operation.journal is not None:
        journal = run.journal = await open_journal(run.graph, operation.journal)
    status = "failed"
    stop_reason: str | None = None
    failure: BaseException | None = None
    replay = None
    try:
        links = [journal.link] if journal is not None and journal.link else []
        with run.tracer.run_span(operation.span_name, operation.span_attributes, links) as span:
            if journal is not None:
                journal.link_span(span)
            with run.scope:
                await operation.body(run)
            stop_reason = operation.stop_reason
            if run.scope.cancelled_caught:
                stop_reason = run.stop_reason or "max_timeout"
            if stop_reason is not None:
                span.set_attribute("rlm.stop_reason", stop_reason)
        status = "finished" if stop_reason is None else "stopped"
    except BaseExceptionGroup as group:
        failure = unwrap(group)
        if failure is None:
            raise
    except (ProviderError, KeyboardInterrupt) as exc:
        failure = exc
    finally:
        if isinstance(failure, KeyboardInterrupt) and getattr(
            operation, "returns_when_interrupted", False
        ):
            failure, stop_reason, status = None, "interrupted", "stopped"
        run.finalize()
        if journal is not None:
            answer = operation.answer(run.scope.cancelled_caught)
            replay = await journal.close(
                status, answer, stop_reason if status == "stopped" else None
            )
    if failure is not None:
        operation.failed(run, failure)
        with trio.CancelScope(shield=True):
            await flush()
        reraise(failure)  # its own cause and context, not the group it came in
    result = operation.result(run, stop_reason, run.scope.cancelled_caught)
    result.replay = replay
    return result
