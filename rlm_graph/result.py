"""What a run returns: a completion's result (the reference library's shape, plus the
graph) and a workflow's.

`RLMChatCompletion` and `UsageSummary` mirror the reference's fields and ``to_dict()``
shape, so code written against it keeps working; usage includes every depth of the tree.
`WorkflowResult` is a user's workflow's outcome, indexed by node.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from .errors import NodeCancelled, NodeFailed, error_slot, stops_workflow
from .graph import (
    CriticalPath,
    Graph,
    NodeKind,
    NodeRef,
    critical_path,
    makespan,
    usage_by_model,
)
from .journal.summary import ReplaySummary

__all__ = [
    "ModelUsageSummary",
    "RLMChatCompletion",
    "UpstreamFailed",
    "UsageSummary",
    "WorkflowOutcome",
    "WorkflowResult",
    "node_failure",
    "timing",
]


class ModelUsageSummary(BaseModel):
    """One model's share of a completion, over every depth of the tree."""

    model_config = ConfigDict(frozen=True)

    total_calls: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    total_cost: float | None = None
    cached_tokens: int | None = None
    """Input tokens read from the prompt cache (included in ``total_input_tokens``, priced
    at the model's cached rate); absent when none."""
    cache_write_tokens: int | None = None
    """Input tokens written to the prompt cache (Anthropic; included in
    ``total_input_tokens``, priced at the cache-write rate); absent when none."""
    estimated_calls: int | None = None
    """Calls whose tokens were estimated (the server reported no usage); absent when none."""

    def to_dict(self) -> dict[str, Any]:
        """The reference library's shape: the counts, and the others where known."""
        return self.model_dump(exclude_none=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelUsageSummary:
        """What `to_dict` gave (or the reference library's ``to_dict``)."""
        return cls.model_validate(dict(data))


class UsageSummary(BaseModel):
    """Usage per model (the reference library's shape), children included."""

    model_config = ConfigDict(frozen=True)

    model_usage_summaries: dict[str, ModelUsageSummary] = Field(default_factory=dict)

    @property
    def total_input_tokens(self) -> int:
        return sum(m.total_input_tokens for m in self.model_usage_summaries.values())

    @property
    def total_output_tokens(self) -> int:
        return sum(m.total_output_tokens for m in self.model_usage_summaries.values())

    @property
    def total_calls(self) -> int:
        return sum(m.total_calls for m in self.model_usage_summaries.values())

    @property
    def total_cost(self) -> float | None:
        costs = [
            m.total_cost for m in self.model_usage_summaries.values() if m.total_cost is not None
        ]
        return sum(costs) if costs else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model_usage_summaries": {
                name: m.to_dict() for name, m in self.model_usage_summaries.items()
            }
        }
        if self.total_cost is not None:
            out["total_cost"] = self.total_cost
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageSummary:
        """What `to_dict` gave (or the reference library's ``to_dict``)."""
        models = data.get("model_usage_summaries") or {}
        return cls(
            model_usage_summaries={
                name: ModelUsageSummary.from_dict(m) for name, m in models.items()
            }
        )

    @classmethod
    def from_graph(cls, graph: Graph) -> UsageSummary:
        return cls(
            model_usage_summaries={
                name: ModelUsageSummary(
                    total_calls=u.calls,
                    total_input_tokens=u.input_tokens,
                    total_output_tokens=u.output_tokens,
                    total_cost=u.cost if u.priced_calls else None,
                    cached_tokens=u.cached_tokens or None,
                    cache_write_tokens=u.cache_write_tokens or None,
                    estimated_calls=u.estimated_calls or None,
                )
                for name, u in usage_by_model(graph).items()
            }
        )


class RLMChatCompletion(BaseModel):
    """The result of `RLM.completion`.

    Attributes:
        response: the answer (or, when a limit stopped the run, the best partial answer);
            with ``schema=``, the JSON of ``parsed``.
        parsed: with ``schema=``, the validated answer (an instance of the type given, or
            JSON data for a JSON Schema dict); ``None`` when no answer matched.
        error: with ``schema=``, why the last answer was refused when none matched.
        stop_reason: ``None`` when the model finished; else the limit that stopped it
            (``"max_iterations"``, ``"max_timeout"``, ``"max_tokens"``, ``"max_budget"``,
            ``"max_errors"``).
        usage_summary: calls, tokens and cost per model, children included.
        execution_time: wall-clock seconds.
        graph: every node of the run, with its record.
        critical_path, parallel_efficiency: from the graph (see rlm_graph.graph).
        leaked_threads: threads of stopped blocks (``local`` environment) still running
            when the run ended: code stuck in a long C call. See docs/environments.md.
        replay: with ``journal=``, what came from the journal and what went live.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    root_model: str
    prompt: Any
    response: str
    parsed: Any = None
    usage_summary: UsageSummary
    execution_time: float
    stop_reason: str | None = None
    iterations: int = 0
    graph: Graph
    metadata: dict[str, Any] | None = None
    error: str | None = None
    leaked_threads: int = 0
    replay: ReplaySummary | None = None

    # Worked out from the graph when first asked (a batch of thousands of completions
    # whose callers never look pays nothing for them).
    @cached_property
    def critical_path(self) -> CriticalPath:
        """The run's critical path (see rlm_graph.graph)."""
        return critical_path(self.graph)

    @cached_property
    def parallel_efficiency(self) -> float:
        """Critical path / makespan (1.0 for a run with no time at all)."""
        span = makespan(self.graph)
        return self.critical_path.length / span if span > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        out = {
            "root_model": self.root_model,
            "prompt": self.prompt,
            "response": self.response,
            "error": self.error,
            "usage_summary": self.usage_summary.to_dict(),
            "execution_time": self.execution_time,
            "stop_reason": self.stop_reason,
            "iterations": self.iterations,
            "nodes": len(self.graph),
            "critical_path": list(self.critical_path.nodes),
            "critical_path_seconds": self.critical_path.length,
            "parallel_efficiency": self.parallel_efficiency,
            "leaked_threads": self.leaked_threads,
            "metadata": self.metadata,
        }
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RLMChatCompletion:
        """A result from what `to_dict` gave (or the reference library's ``to_dict``):
        its answer, usage, time and metadata; the graph is not in that dict, so the
        result's ``graph`` is empty (its critical path too)."""
        kept = ("stop_reason", "iterations", "leaked_threads", "metadata", "error")
        return cls(
            root_model=data.get("root_model", ""),
            prompt=data.get("prompt"),
            response=data.get("response", ""),
            usage_summary=UsageSummary.from_dict(data.get("usage_summary") or {}),
            execution_time=data.get("execution_time", 0.0),
            graph=Graph(),
            **{key: data[key] for key in kept if data.get(key) is not None},
        )


class UpstreamFailed(Exception):
    """A workflow node did not run because its dependency ``upstream`` failed
    (``origin``: the node whose own failure it was, ``upstream`` itself or further up)."""

    def __init__(self, message: str, *, upstream: str, origin: str) -> None:
        super().__init__(message)
        self.upstream = upstream
        self.origin = origin


class WorkflowResult(BaseModel):
    """The outcome of a workflow run, like a completion's: values, usage, time, graph.

    Index it with a `NodeRef` or a node id for that node's value; a node that failed or
    was skipped raises `NodeFailed`, one that was cancelled or never ran `NodeCancelled`
    (`exception` gives either without raising).

    Attributes:
        values: node id -> value, for the nodes that succeeded.
        errors: node id -> ``"[ERROR] <type>: <message>"``, for the nodes that failed or
            were skipped.
        failures: node id -> the exception a failed node raised (an `UpstreamFailed` for a
            skipped one).
        graph: a record for every node (status, times, usage, cost, attempts, previews).
        stop_reason: None when every node ran; else ``"max_timeout"``, ``"max_tokens"``,
            ``"max_budget"``, ``"interrupted"`` (Ctrl-C) or ``"fatal_error"`` (a node's
            error that stops the workflow: a rejected key, an unknown model...).
        usage_summary: calls, tokens and cost per model.
        execution_time: wall-clock seconds of the run.
        critical_path, parallel_efficiency: from the graph (see `rlm_graph.graph`).
        leaked_threads: worker threads of cancelled function nodes still running when
            the run ended (Python cannot stop a thread; see docs/graph-executor.md).
        replay: with ``journal=``, what came from the journal and what went live.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    values: dict[str, Any]
    errors: dict[str, str]
    graph: Graph
    failures: dict[str, BaseException] = Field(default_factory=dict, repr=False)
    stop_reason: str | None = None
    usage_summary: UsageSummary = Field(default_factory=UsageSummary)
    execution_time: float = 0.0
    critical_path: CriticalPath = Field(default_factory=lambda: CriticalPath(nodes=(), length=0.0))
    parallel_efficiency: float = 1.0
    leaked_threads: int = 0
    replay: ReplaySummary | None = None
    _owner: int = PrivateAttr(default=0)  # the workflow's mark (`NodeRef.owner`)

    def _key(self, node: NodeRef | str) -> str:
        """The id ``node`` names here.

        Raises:
            KeyError: ``node`` is a handle of another workflow (ids repeat across
                workflows, so it would stand for a node of the same name).
        """
        if not isinstance(node, NodeRef):
            return node
        if node.owner and self._owner and node.owner != self._owner:
            raise KeyError(
                f"{node.id!r} is a handle of another Workflow: index a result with its own "
                "workflow's handles, or with a node id"
            )
        return node.id

    def __getitem__(self, node: NodeRef | str) -> Any:
        key = self._key(node)
        if key in self.values:
            return self.values[key]
        error = self.exception(key)
        if error is None:  # pragma: no cover - a node is a value or an error
            raise KeyError(key)
        raise error from error.__cause__

    def exception(self, node: NodeRef | str) -> NodeFailed | NodeCancelled | None:
        """What ``result[node]`` raises, or None for a node that has a value.

        Raises:
            KeyError: the workflow has no such node (or ``node`` is another's handle).
        """
        key = self._key(node)
        if key in self.values:
            return None
        if key in self.failures or key in self.errors:
            return node_failure(key, self.graph, self.failures, self.errors)
        if key not in self.graph:
            raise KeyError(f"no node {key!r} in this workflow")
        what = "was cancelled" if self.graph[key].start is not None else "never ran"
        return NodeCancelled(
            f"node {key!r} {what}: the run stopped ({_stopped(self.stop_reason, self.failures)})",
            node_id=key,
            stop_reason=self.stop_reason,
        )

    @property
    def ok(self) -> bool:
        """Every node ran and succeeded."""
        return not self.errors and self.stop_reason is None

    @property
    def cost(self) -> float:
        """USD spent by the run's model calls (0.0 when none was priced)."""
        return self.usage_summary.total_cost or 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: errors, usage, time, critical path, stop reason."""
        out = {
            "nodes": len(self.graph),
            "ok": self.ok,
            "errors": dict(self.errors),
            "stop_reason": self.stop_reason,
            "usage_summary": self.usage_summary.to_dict(),
            "execution_time": self.execution_time,
            "critical_path": list(self.critical_path.nodes),
            "critical_path_seconds": self.critical_path.length,
            "parallel_efficiency": self.parallel_efficiency,
            "leaked_threads": self.leaked_threads,
        }
        return {k: v for k, v in out.items() if v is not None}


class WorkflowOutcome:
    """What a workflow run has so far, node by node: the values of the nodes that
    succeeded, the errors and exceptions of those that failed or were skipped (the
    runtime's executor fills it in; `result` makes the `WorkflowResult`)."""

    def __init__(self, owner: int = 0) -> None:
        self.owner = owner  # the workflow's mark, which its result checks handles by
        self.values: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.failures: dict[str, BaseException] = {}

    def fail(self, node_id: str, exc: BaseException) -> None:
        self.failures[node_id] = exc
        self.errors[node_id] = error_slot(exc)

    def skip(self, node_id: str, upstream: str) -> str:
        """Record that ``node_id`` did not run because ``upstream`` failed; the reason."""
        before = self.failures[upstream]
        origin = before.origin if isinstance(before, UpstreamFailed) else upstream
        message = f"dependency {upstream!r} failed" + (
            f" (it was skipped: {origin!r} failed)" if origin != upstream else ""
        )
        self.fail(node_id, UpstreamFailed(message, upstream=upstream, origin=origin))
        return f"skipped: {message}"

    def value(self, node_id: str, graph: Graph) -> Any:
        """What a node gets for its dependency ``node_id``: its value, or (for a node
        that receives failures) its `NodeFailed`."""
        if node_id in self.values:
            return self.values[node_id]
        return node_failure(node_id, graph, self.failures, self.errors)

    def result(
        self, graph: Graph, stop_reason: str | None, execution_time: float, leaked_threads: int
    ) -> WorkflowResult:
        path, efficiency = timing(graph)
        made = WorkflowResult(
            values=self.values,
            errors=self.errors,
            failures=self.failures,
            graph=graph,
            stop_reason=stop_reason,
            usage_summary=UsageSummary.from_graph(graph),
            execution_time=execution_time,
            critical_path=path,
            parallel_efficiency=efficiency,
            leaked_threads=leaked_threads,
        )
        made._owner = self.owner
        return made


def node_failure(
    key: str, graph: Graph, failures: Mapping[str, BaseException], errors: Mapping[str, str]
) -> NodeFailed:
    """The `NodeFailed` of the failed (or skipped) workflow node ``key``: its cause is the
    node's own exception (for a skipped node, the `NodeFailed` of the node that failed),
    with a function's traceback as text."""
    exc = failures.get(key)
    if isinstance(exc, UpstreamFailed):
        origin = node_failure(exc.origin, graph, failures, errors)
        error = NodeFailed(
            f"node {key!r} was skipped: {exc}", node_id=key, cause=origin, upstream=exc.origin
        )
        error.__cause__ = origin
        return error
    said = errors.get(key) or error_slot(exc or Exception())
    if isinstance(exc, NodeFailed) and not exc.node_id and exc.__cause__ is not None:
        exc = exc.__cause__  # the engine's word on the node's own error: its text, that cause
    text = "".join(traceback.format_exception(exc)) if exc is not None else ""
    is_function = key in graph and graph[key].kind == NodeKind.FUNCTION
    error = NodeFailed(
        f"node {key!r} failed: {said}",
        node_id=key,
        cause=exc,
        traceback=text if is_function else "",
    )
    error.__cause__ = exc
    return error


def _stopped(reason: str | None, failures: Mapping[str, BaseException]) -> str:
    if reason == "fatal_error":
        for node, exc in failures.items():
            if stops_workflow(exc):
                return f"node {node!r} failed with {type(exc).__name__}, which stops the workflow"
    if reason == "interrupted":
        return "interrupted: Ctrl-C"
    return reason or "cancelled"


def timing(graph: Graph) -> tuple[CriticalPath, float]:
    """A run's critical path and its parallel efficiency (critical path / makespan; 1.0
    for a run with no time at all)."""
    path = critical_path(graph)
    span = makespan(graph)
    return path, path.length / span if span > 0 else 1.0
