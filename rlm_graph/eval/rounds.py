"""One method's items, run in rounds: a round is one `run_batch` per role of the method,
carrying the next call of every item that has one of that role (see `rlm_graph.eval.run`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..batch import BatchError, BatchItem, BatchResult, run_batch
from .items import EvalItem, coerce_items
from .methods import Call, EvalMethod, MethodSetup, NotRun, Solver
from .results import EvalRow, ResultsLog, SharedBudget
from .scoring import score

__all__ = ["EvaluationParts", "MethodRun", "RowHook"]

RowHook = Callable[[EvalRow], None]


class EvaluationParts(Protocol):
    """What a method's rounds take from their `Evaluation`."""

    budget: SharedBudget
    concurrency: int
    executor: str
    executor_kwargs: dict[str, Any]
    log: ResultsLog
    setup: MethodSetup
    source: Any
    role_kwargs: dict[str, dict[str, dict[str, Any]]]
    asked: dict[str, str]


class _Pending:
    """An item being solved: its solver, its next call, and what its calls added up to."""

    __slots__ = (
        "budget_cut",
        "call",
        "calls",
        "cost",
        "item",
        "latency",
        "solver",
        "stop_reason",
        "tokens_in",
        "tokens_out",
    )

    def __init__(self, item: EvalItem, solver: Solver) -> None:
        self.item, self.solver = item, solver
        self.call: Call | None = None
        self.calls = 0
        self.cost: float | None = None
        self.latency = 0.0
        self.tokens_in = self.tokens_out = 0
        self.stop_reason: str | None = None
        self.budget_cut = False

    def add(self, result: BatchResult) -> None:
        self.calls += 1
        if result.cost is not None:
            self.cost = (self.cost or 0.0) + result.cost
        self.latency += result.seconds
        self.tokens_in += result.usage.input_tokens
        self.tokens_out += result.usage.output_tokens
        self.stop_reason = result.stop_reason or self.stop_reason


def _failure(exc: Exception) -> BatchError:
    return BatchError(type=type(exc).__name__, message=str(exc) or type(exc).__name__)


class MethodRun:
    """One method over the items it has still to do, in rounds (see the module docstring).

    The call generator (`_calls`) runs in the executor's thread, results are taken in
    the caller's: ``_lock`` guards what both touch (the waiting calls, the calls in
    flight, the rows made on the generator's side).
    """

    def __init__(
        self,
        evaluation: EvaluationParts,
        method: EvalMethod,
        todo: set[str],
        on_row: RowHook | None,
    ) -> None:
        self.ev = evaluation
        self.method = method
        self.todo = todo
        self.on_row = on_row
        self.kwargs = evaluation.role_kwargs[method.name]
        self._lock = threading.Lock()
        self._waiting: dict[str, list[_Pending]] = {role: [] for role in self.kwargs}
        self._in_flight: dict[str, _Pending] = {}
        self._made: list[EvalRow] = []
        self.written = 0

    # -- the rounds (caller's thread) -----------------------------------------------------

    def run(self) -> int:
        fresh: Iterator[EvalItem] | None = (
            i for i in coerce_items(self.ev.source) if i.id in self.todo
        )
        while True:
            for role in self.kwargs:
                with self._lock:
                    batch, self._waiting[role] = self._waiting[role], []
                if batch or fresh is not None:
                    self._batch(role, batch, fresh)
                    fresh = None
            with self._lock:
                left = sum(map(len, self._waiting.values()))
            if left == 0 or self.ev.budget.exhausted:
                self._flush()
                return self.written

    def _batch(self, role: str, batch: list[_Pending], fresh: Iterator[EvalItem] | None) -> None:
        results = run_batch(
            self._calls(role, batch, fresh),
            self.kwargs[role],
            concurrency=self.ev.concurrency,
            executor=self.ev.executor,
            executor_kwargs=self.ev.executor_kwargs,
        )
        try:
            for result in results:
                self._finished(result)
                self._flush()
        finally:
            close = getattr(results, "close", None)
            if close is not None:  # Ctrl-C or an error here: stop the batch's calls now
                close()
            self._flush()

    def _finished(self, result: BatchResult) -> None:
        with self._lock:
            pending = self._in_flight.pop(result.id)
        self.ev.budget.charge(result.cost)
        pending.add(result)
        if result.error is not None:
            self._row(pending, error=result.error)
        elif result.stop_reason == "max_budget" and pending.budget_cut:
            pending.solver.close()  # the evaluation's budget ran out: left for a rerun
        else:
            self._advance(pending, result.answer or "")

    def _flush(self) -> None:
        with self._lock:
            made, self._made = self._made, []
        for row in made:
            self.ev.log.append(row)
            self.written += 1
            if self.on_row is not None:
                self.on_row(row)

    # -- solvers (either thread) ----------------------------------------------------------

    def _advance(self, pending: _Pending, answer: str | None) -> bool:
        """Move the solver on (``answer=None``: start it); queue its next call or record
        its row. Returns whether a next call is waiting."""
        try:
            pending.call = next(pending.solver) if answer is None else pending.solver.send(answer)
        except StopIteration as stop:
            value = stop.value
            if isinstance(value, NotRun):
                self._row(pending, stop_reason=value.stop_reason)
            else:
                self._row(pending, prediction=str(value) if value is not None else None)
            return False
        except Exception as exc:  # the method's code or the item's context file: this item's error
            self._row(pending, error=_failure(exc))
            return False
        if pending.call.role not in self._waiting:
            self._row(
                pending,
                error=BatchError(
                    type="ConfigError",
                    message=f"method {self.method.name!r} asked for role {pending.call.role!r}; its "
                    f"rlm_kwargs() has {', '.join(self._waiting)}",
                ),
            )
            return False
        with self._lock:
            self._waiting[pending.call.role].append(pending)
        return True

    def _row(
        self,
        pending: _Pending,
        *,
        prediction: str | None = None,
        error: BatchError | None = None,
        stop_reason: str | None = None,
    ) -> None:
        item = pending.item
        row = EvalRow(
            id=item.id,
            method=self.method.name,
            prediction=prediction,
            score=score(item.answer_type, item.answer, prediction) if error is None else 0.0,
            cost=pending.cost,
            latency_s=round(pending.latency, 6),
            input_tokens=pending.tokens_in,
            output_tokens=pending.tokens_out,
            stop_reason=stop_reason or pending.stop_reason,
            error=error,
            asked=self.ev.asked.get(item.id),
        )
        with self._lock:
            self._made.append(row)

    # -- the calls of one batch (executor's thread) -----------------------------------------

    def _calls(
        self, role: str, batch: list[_Pending], fresh: Iterator[EvalItem] | None
    ) -> Iterator[BatchItem]:
        for pending in batch:
            item = self._submit(pending)
            if item is None:
                return
            yield item
        if fresh is None:
            return
        for eval_item in fresh:
            if self.ev.budget.exhausted:
                return
            pending = _Pending(eval_item, self.method.solve(eval_item, self.ev.setup))
            if not self._advance(pending, None):
                continue
            assert pending.call is not None
            if pending.call.role != role:
                continue  # waits for its role's batch
            with self._lock:
                self._waiting[role].remove(pending)
            item = self._submit(pending)
            if item is None:
                return
            yield item

    def _submit(self, pending: _Pending) -> BatchItem | None:
        """The batch item of ``pending``'s call, registered as in flight; ``None`` once
        the budget is spent."""
        if self.ev.budget.exhausted:
            return None
        call = pending.call
        assert call is not None
        cap, remainder = self.ev.budget.call_cap()
        limits = dict(call.limits)
        if cap is not None:
            limits["max_budget"] = min(cap, limits.get("max_budget", cap))
        pending.budget_cut = remainder
        with self._lock:
            self._in_flight[pending.item.id] = pending
        return BatchItem(
            id=pending.item.id,
            query=call.query,
            context=call.context,
            context_file=call.context_file,
            limits=limits,
        )
