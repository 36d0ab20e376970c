"""The graph executor for a user's `Workflow`: every node a task, started when its
dependencies are done, under the engine's limiters.

Invariants:
    - Every node of the workflow is in the run's graph (``pending``) before any runs, so a
      cancelled run shows exactly which nodes never started.
    - A node starts as soon as its last dependency finishes; independent nodes run at once.
    - A node whose dependency failed (or was skipped) is ``skipped`` and sends nothing,
      unless it receives failures; a model call's error in `STOPS_WORKFLOW` (not a
      function's, a prompt function's or a plugin's broken answer) stops the run at once
      (``stop_reason="fatal_error"``): the nodes in flight are cancelled.
    - A node's retries and timeout are inside its one `Run.execute` (one record, one
      span, one journal lookup): a replayed node is not retried.
    - Function nodes that are not trio code run in worker threads
      (`rlm_graph.doors.functions`); a cancelled one still running is counted as leaked.
    - One nursery for the whole workflow; the run's cancel scope wraps it (the run's
      lifecycle enters it: `WorkflowRun` is the workflow as a run's operation).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import nullcontext
from typing import Any, Literal

import trio

from ..doors.functions import function_try, prompt_messages
from ..errors import LIMIT_ERRORS, LimitExceeded, mark_stops_workflow, stops_workflow
from ..graph import NodeKind, NodeRecord, Workflow
from ..graph.spec import NodeSpec
from ..journal.keys import function_fingerprints, function_key, json_value
from ..journal.seam import Journaled, JournalTarget
from ..result import WorkflowOutcome, WorkflowResult
from .calls import ModelCall
from .context import Run

__all__ = ["FUNCTION_THREADS", "WorkflowRun", "run_workflow"]

logger = logging.getLogger("rlm_graph")

FUNCTION_THREADS = 40
"""Worker threads a workflow's plain (and asyncio) function nodes may use at once."""

Body = Callable[[NodeRecord], Awaitable[Any]]
Inputs = Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]  # a node's arguments, resolved


class WorkflowRun:
    """A workflow as a run's `Operation` (see `rlm_graph.runtime.lifecycle`)."""

    kind: Literal["completion", "workflow"] = "workflow"
    span_name = "invoke_workflow"
    span_attributes: Mapping[str, Any] = {"gen_ai.operation.name": "invoke_workflow"}
    returns_when_interrupted = True

    def __init__(self, workflow: Workflow, journal: JournalTarget | None) -> None:
        self.workflow = workflow
        self.journal = journal
        self.outcome = WorkflowOutcome(workflow.owner)
        self.abandoned: list[threading.Event] = []  # threads of cancelled function nodes
        self.started = time.perf_counter()

    async def body(self, run: Run) -> None:
        await run_workflow(run, self)

    @property
    def stop_reason(self) -> str | None:
        return None

    def answer(self, cut: bool) -> str | None:
        return None

    def result(self, run: Run, stop_reason: str | None, cut: bool) -> WorkflowResult:
        leaked = sum(not finished.is_set() for finished in self.abandoned)
        if leaked:
            logger.warning(
                "%d thread(s) of cancelled function nodes still running (Python cannot "
                "stop a thread); their results are dropped",
                leaked,
            )
        return self.outcome.result(
            run.graph,
            stop_reason or run.stop_reason,
            time.perf_counter() - self.started,
            run.leaked_threads + leaked,
        )

    def failed(self, run: Run, failure: BaseException) -> None:
        return None

    def limit_error(self, result: WorkflowResult, reason: str) -> LimitExceeded | None:
        error = LIMIT_ERRORS.get(reason)
        return None if error is None else error(f"workflow stopped by {reason}", result=result)


async def run_workflow(run: Run, op: WorkflowRun) -> None:
    """Run every node of ``op.workflow`` inside ``run``; their values and failures go in
    ``op.outcome`` (by node id)."""
    done = {spec.id: trio.Event() for spec in op.workflow}
    records: dict[str, NodeRecord] = {}
    for spec in op.workflow:
        # Where a model node's call goes is known now: its start event and its span (a
        # skipped node's too) say it; its prompt only once it runs.
        routed = run.router.route(spec.model, 0).model if spec.kind == NodeKind.LLM_CALL else None
        record = NodeRecord(id=spec.id, kind=spec.kind, model=routed)
        records[spec.id] = run.graph.add(record, after=spec.deps)
    threads = trio.CapacityLimiter(FUNCTION_THREADS)
    keys = function_fingerprints(op.workflow) if run.journal is not None else {}

    async def run_spec(spec: NodeSpec) -> None:
        try:
            for dep in spec.deps:
                await done[dep].wait()
            await _run_node(run, op, spec, records[spec.id], threads, keys.get(spec.id))
        finally:
            done[spec.id].set()

    async with trio.open_nursery() as nursery:
        for spec in op.workflow:
            nursery.start_soon(run_spec, spec, name=f"node:{spec.id}")


async def _run_node(
    run: Run,
    op: WorkflowRun,
    spec: NodeSpec,
    record: NodeRecord,
    threads: trio.CapacityLimiter,
    key: str | None,
) -> None:
    outcome = op.outcome
    if any(dep not in outcome.values and dep not in outcome.failures for dep in spec.deps):
        return  # a dependency was cancelled: so is this node (the run is stopping)
    failed = [dep for dep in spec.deps if dep in outcome.failures]
    if failed and not spec.receive_failures:
        await run.execute(record, _skip(outcome, spec.id, failed[0]), added=True)
        return
    # Resolved in the node: arguments that cannot be built fail it, not the run.
    inputs = functools.cache(lambda: spec.arguments(lambda d: outcome.value(d, run.graph)))
    journal: Callable[[], Journaled[Any] | Awaitable[Journaled[Any]]]
    if spec.kind == NodeKind.LLM_CALL:
        body, journal = _model_call(run, record, spec, inputs)
    else:
        body = function_try(spec, inputs, threads, op.abandoned)
        journal = _function_journal(spec, inputs, key)
    try:
        outcome.values[spec.id] = await run.execute(
            record, _tries(spec, body), added=True, journal=journal if spec.cache else None
        )
    except Exception as exc:
        outcome.fail(spec.id, exc)
        if stops_workflow(exc):
            run.stop("fatal_error")


def _skip(outcome: WorkflowOutcome, node_id: str, upstream: str) -> Body:
    """The body of a node that does not run: its dependency ``upstream`` failed."""

    async def body(record: NodeRecord) -> None:
        record.skip(upstream, outcome.skip(node_id, upstream))

    return body


def _tries(spec: NodeSpec, attempt: Body) -> Body:
    """``attempt`` under the node's ``timeout``, tried again on failure up to ``retries``
    times (never for an error that stops the workflow); the record's ``attempts`` counts
    the requests (or calls) of every try."""
    if not spec.retries and spec.timeout is None:
        return attempt

    async def body(record: NodeRecord) -> Any:
        total = 0
        for tries in range(1, spec.retries + 2):
            record.attempts = 1
            try:
                with trio.fail_after(spec.timeout) if spec.timeout else nullcontext():
                    return await attempt(record)
            except trio.TooSlowError:
                error: Exception = TimeoutError(
                    f"node {spec.id!r} did not finish within timeout={spec.timeout:g} s"
                )
            except Exception as exc:
                if stops_workflow(exc) or tries > spec.retries:
                    raise
                error = exc
            finally:
                total += record.attempts
                record.attempts = total
            if tries > spec.retries:
                raise error
            logger.debug("node %s: %s; try %d of %d", spec.id, error, tries + 1, spec.retries + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    return body


def _model_call(
    run: Run, record: NodeRecord, spec: NodeSpec, inputs: Inputs
) -> tuple[Body, Callable[[], Awaitable[Journaled[str]]]]:
    """A model node's body and journal key, over one `ModelCall` made on first use inside
    the node (`prompt_messages`: a prompt function that fails fails its node)."""
    made: list[ModelCall] = []

    async def call(record: NodeRecord) -> ModelCall:
        if not made:
            messages = prompt_messages(spec, *inputs())
            made.append(ModelCall(run, record, messages, model=spec.model, params=spec.params))
        return made[0]

    async def body(record: NodeRecord) -> str:
        made_call = await call(record)  # a prompt function's error: the node's own
        try:
            reply = await made_call.text(record)
        except Exception as exc:  # one the engine would meet for every model node?
            mark_stops_workflow(exc)
            raise
        if run.record_content:
            record.keep_content(made[0].messages[-1].content, reply)
        return reply

    async def journaled() -> Journaled[str]:  # a prompt function that raised is retried
        return (await _tries(spec, call)(record)).journaled()  # type: ignore[no-any-return]

    return body, journaled


def _function_journal(
    spec: NodeSpec, inputs: Inputs, key: str | None
) -> Callable[[], Journaled[Any]]:
    """A function node keyed by its code, what it reads (``key``: as the run started) and
    its arguments (`function_key`); its result kept as JSON when JSON gives it back equal."""
    return lambda: Journaled(function_key(spec, *inputs(), key), json_value, json.loads)
