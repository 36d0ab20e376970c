"""The graph executor for a user's `Workflow`: every node a task, started when its
dependencies are done, under the engine's limiters.

Invariants:
    - Every node of the workflow is in the run's graph (``pending``) before any runs, so a
      cancelled run shows exactly which nodes never started.
    - A node starts as soon as its last dependency finishes; independent nodes run at once.
    - One nursery for the whole workflow; the run's cancel scope wraps it.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import trio
from pydantic import BaseModel, ConfigDict

from ..contracts import Message
from ..errors import NodeFailed, error_slot
from ..graph import Graph, NodeKind, NodeRecord, NodeRef, Workflow, preview
from ..graph.workflow import NodeSpec
from ..journal import ReplaySummary, run_key, value_hash
from .context import Run
from .providers import call_model

__all__ = ["UpstreamFailed", "WorkflowResult", "run_workflow", "workflow_key"]


class UpstreamFailed(Exception):
    """A node did not run because a function it depends on failed."""


class WorkflowResult(BaseModel):
    """The outcome of a workflow run.

    Index it with a `NodeRef` or a node id for that node's result. ``graph`` has a record
    for every node; ``errors`` maps failed node ids to their error text; ``replay``
    (with ``journal=``) says what came from the journal.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    values: dict[str, Any]
    errors: dict[str, str]
    graph: Graph
    stop_reason: str | None = None
    replay: ReplaySummary | None = None

    def __getitem__(self, node: NodeRef | str) -> Any:
        key = node.id if isinstance(node, NodeRef) else node
        if key in self.values:
            return self.values[key]
        if key in self.errors:
            raise NodeFailed(f"node {key!r} failed: {self.errors[key]}", node_id=key)
        raise KeyError(f"no result for node {key!r} (it never ran, or no such node)")

    @property
    def ok(self) -> bool:
        return not self.errors and self.stop_reason is None


async def run_workflow(run: Run, workflow: Workflow) -> WorkflowResult:
    """Run every node of ``workflow`` inside ``run`` and collect the results."""
    done = {spec.id: trio.Event() for spec in workflow}
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
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

    try:
        with run.scope:
            async with trio.open_nursery() as nursery:
                for spec in workflow:
                    nursery.start_soon(run_spec, spec, name=f"node:{spec.id}")
    finally:
        run.finalize()
    return WorkflowResult(values=values, errors=errors, graph=run.graph, stop_reason=run.stop_reason)


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
            values[spec.id] = await run.execute(record, _llm_body(run, spec, args), added=True)
        else:
            values[spec.id] = await run.execute(record, _function_body(run, spec, args), added=True)
    except Exception as exc:
        errors[spec.id] = error_slot(exc)
        if spec.kind == NodeKind.LLM_CALL and not failed:
            # A failed model call is a failed slot: dependents see the error string.
            values[spec.id] = errors[spec.id]


def _upstream_failed(failed: list[str]) -> Any:
    async def body(record: NodeRecord) -> None:
        raise UpstreamFailed(f"not run: it depends on {', '.join(failed)}, which failed")

    return body


def _llm_body(run: Run, spec: NodeSpec, args: list[Any]) -> Any:
    async def body(record: NodeRecord) -> str:
        prompt = spec.prompt(*args) if callable(spec.prompt) else spec.prompt
        if not isinstance(prompt, str):
            raise TypeError(
                f"the prompt function of node {spec.id!r} returned {type(prompt).__name__}; "
                "it must return a string"
            )
        messages = [Message(role="user", content=prompt)]
        if spec.system:
            messages.insert(0, Message(role="system", content=spec.system))
        response = await call_model(run, record, messages, model=spec.model, params=spec.params)
        return response.content

    return body


def _function_body(run: Run, spec: NodeSpec, args: list[Any]) -> Any:
    async def body(record: NodeRecord) -> Any:
        assert spec.fn is not None
        record.input_preview = preview(args)
        journal = run.journal
        request = value_hash("function", _qualname(spec.fn), args) if journal is not None else ""
        if journal is not None:
            stored = journal.lookup(record, request)
            if stored is not None and stored.value is not None:
                return json.loads(stored.value)
        result = spec.fn(*args)
        if inspect.isawaitable(result):
            result = await result
        record.output_preview = preview(result)
        if journal is not None:
            value = _as_json(result)
            if value is not None:  # what JSON cannot hold re-runs on resume
                journal.record(record, request, value)
        return result

    return body


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _as_json(value: Any) -> str | None:
    """``value`` as JSON when it comes back equal (so replay returns what the function
    did: a tuple, which comes back a list, is not journaled)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return text if json.loads(text) == value and type(json.loads(text)) is type(value) else None


def workflow_key(workflow: Workflow, providers: list[tuple[str, str, str]]) -> str:
    """The run key of a workflow: its nodes (ids, kinds, dependencies, prompts, models,
    parameters, functions by qualified name) and the engine's providers."""
    nodes = [
        [
            spec.id, spec.kind.value, list(spec.deps),
            _qualname(spec.prompt) if callable(spec.prompt) else spec.prompt,
            spec.system, spec.model, spec.params, _qualname(spec.fn) if spec.fn else None,
        ]
        for spec in workflow
    ]
    return run_key("workflow", {"nodes": nodes}, providers)
