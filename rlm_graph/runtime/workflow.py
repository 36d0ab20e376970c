"""The graph executor for a user's `Workflow`: every node a task, started when its
dependencies are done, under the engine's limiters.

Invariants:
    - Every node of the workflow is in the run's graph (``pending``) before any runs, so a
      cancelled run shows exactly which nodes never started.
    - A node starts as soon as its last dependency finishes; independent nodes run at once.
    - One nursery for the whole workflow; the run's cancel scope wraps it (the run's
      lifecycle enters it: `WorkflowRun` is the workflow as a run's operation).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any, Literal

import trio

from ..contracts import Message
from ..errors import LIMIT_ERRORS, LimitExceeded, error_slot
from ..graph import NodeKind, NodeRecord, Workflow, preview
from ..graph.workflow import NodeSpec
from ..journal import value_hash
from ..journal.keys import json_value, qualname
from ..journal.seam import Journaled, JournalTarget
from ..result import WorkflowResult
from .calls import ModelCall
from .context import Run

__all__ = ["UpstreamFailed", "WorkflowRun", "run_workflow"]


class UpstreamFailed(Exception):
    """A node did not run because a function it depends on failed."""


class WorkflowRun:
    """A workflow as a run's `Operation` (see `rlm_graph.runtime.lifecycle`)."""

    kind: Literal["completion", "workflow"] = "workflow"
    span_name = "invoke_workflow"
    span_attributes: Mapping[str, Any] = {"gen_ai.operation.name": "invoke_workflow"}

    def __init__(self, workflow: Workflow, journal: JournalTarget | None) -> None:
        self.workflow = workflow
        self.journal = journal
        self.values: dict[str, Any] = {}
        self.errors: dict[str, str] = {}

    async def body(self, run: Run) -> None:
        await run_workflow(run, self.workflow, self.values, self.errors)

    @property
    def stop_reason(self) -> str | None:
        return None

    def answer(self, cut: bool) -> str | None:
        return None

    def result(self, run: Run, stop_reason: str | None, cut: bool) -> WorkflowResult:
        return WorkflowResult(
            values=self.values,
            errors=self.errors,
            graph=run.graph,
            stop_reason=stop_reason or run.stop_reason,
        )

    def failed(self, run: Run, failure: BaseException) -> None:
        return None

    def limit_error(self, result: WorkflowResult, reason: str) -> LimitExceeded:
        error = LIMIT_ERRORS.get(reason, LIMIT_ERRORS["max_timeout"])
        return error(f"workflow stopped by {reason}", result=result)


async def run_workflow(
    run: Run, workflow: Workflow, values: dict[str, Any], errors: dict[str, str]
) -> None:
    """Run every node of ``workflow`` inside ``run``; their results go in ``values``,
    their failures in ``errors`` (by node id)."""
    done = {spec.id: trio.Event() for spec in workflow}
    records: dict[str, NodeRecord] = {}
    for spec in workflow:
        record = NodeRecord(id=spec.id, kind=spec.kind, model=spec.model)
        records[spec.id] = run.graph.add(record, after=spec.deps)

    async def run_spec(spec: NodeSpec) -> None:
        try:
            for dep in spec.deps:
                await done[dep].wait()
            await _run_node(run, spec, records[spec.id], values, errors)
        finally:
            done[spec.id].set()

    async with trio.open_nursery() as nursery:
        for spec in workflow:
            nursery.start_soon(run_spec, spec, name=f"node:{spec.id}")


async def _run_node(
    run: Run,
    spec: NodeSpec,
    record: NodeRecord,
    values: dict[str, Any],
    errors: dict[str, str],
) -> None:
    failed = [dep for dep in spec.deps if dep not in values]
    args = [values[dep] for dep in spec.deps if dep in values]
    try:
        if failed:
            await run.execute(record, _upstream_failed(failed), added=True)
        elif spec.kind == NodeKind.LLM_CALL:
            call = _LazyCall(run, record, spec, args)
            values[spec.id] = await run.execute(
                record, call.text, added=True, journal=call.journaled
            )
        else:
            values[spec.id] = await run.execute(
                record,
                _function_body(spec, args),
                added=True,
                journal=lambda: _function_journaled(spec, args),
            )
    except Exception as exc:
        errors[spec.id] = error_slot(exc)
        if spec.kind == NodeKind.LLM_CALL and not failed:
            # A failed model call is a failed slot: dependents see the error string.
            values[spec.id] = errors[spec.id]


def _upstream_failed(failed: list[str]) -> Any:
    async def body(record: NodeRecord) -> None:
        raise UpstreamFailed(f"not run: it depends on {', '.join(failed)}, which failed")

    return body


class _LazyCall:
    """A model node's call, made on first use inside the node (a prompt function that
    fails fails its node)."""

    def __init__(self, run: Run, record: NodeRecord, spec: NodeSpec, args: list[Any]) -> None:
        self.run, self.record, self.spec, self.args = run, record, spec, args
        self._call: ModelCall | None = None

    @property
    def call(self) -> ModelCall:
        if self._call is None:
            spec = self.spec
            self._call = ModelCall(
                self.run,
                self.record,
                _messages(spec, self.args),
                model=spec.model,
                params=spec.params,
            )
        return self._call

    async def text(self, record: NodeRecord) -> str:
        reply = await self.call.text(record)
        if self.run.record_content:
            record.keep_content(self.call.messages[-1].content, reply)
        return reply

    def journaled(self) -> Journaled[str]:
        return self.call.journaled()


def _messages(spec: NodeSpec, args: list[Any]) -> list[Message]:
    """A model node's messages: its system text, and its prompt (built from its
    dependencies' results when it is a function)."""
    prompt = spec.prompt(*args) if callable(spec.prompt) else spec.prompt
    if not isinstance(prompt, str):
        raise TypeError(
            f"the prompt function of node {spec.id!r} returned {type(prompt).__name__}; "
            "it must return a string"
        )
    messages = [Message(role="user", content=prompt)]
    if spec.system:
        messages.insert(0, Message(role="system", content=spec.system))
    return messages


def _function_body(spec: NodeSpec, args: list[Any]) -> Any:
    async def body(record: NodeRecord) -> Any:
        assert spec.fn is not None
        record.input_preview = preview(args)
        result = spec.fn(*args)
        if inspect.isawaitable(result):
            result = await result
        record.output_preview = preview(result)
        return result

    return body


def _function_journaled(spec: NodeSpec, args: list[Any]) -> Journaled[Any]:
    """A function node is keyed by its qualified name and its arguments; its result is
    kept as JSON when JSON gives it back equal (else it runs again on resume)."""
    return Journaled(value_hash("function", qualname(spec.fn), args), json_value, json.loads)
