"""What a run returns: a completion's result (the reference library's shape, plus the
graph) and a workflow's.

`RLMChatCompletion` and `UsageSummary` mirror the reference's fields and ``to_dict()``
shape, so code written against it keeps working; usage includes every depth of the tree.
`WorkflowResult` is a user's workflow's outcome, indexed by node.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import NodeFailed
from .graph import CriticalPath, Graph, NodeRef, critical_path, makespan, usage_by_model
from .journal.summary import ReplaySummary

__all__ = [
    "ModelUsageSummary",
    "RLMChatCompletion",
    "UsageSummary",
    "WorkflowResult",
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
                name: m.model_dump(exclude_none=True)
                for name, m in self.model_usage_summaries.items()
            }
        }
        if self.total_cost is not None:
            out["total_cost"] = self.total_cost
        return out

    @classmethod
    def from_graph(cls, graph: Graph) -> UsageSummary:
        return cls(
            model_usage_summaries={
                name: ModelUsageSummary(
                    total_calls=u.calls,
                    total_input_tokens=u.input_tokens,
                    total_output_tokens=u.output_tokens,
                    total_cost=u.cost if u.cost else None,
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
    critical_path: CriticalPath
    parallel_efficiency: float
    metadata: dict[str, Any] | None = None
    error: str | None = None
    leaked_threads: int = 0
    replay: ReplaySummary | None = None

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
        }
        return {k: v for k, v in out.items() if v is not None}


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


def timing(graph: Graph) -> tuple[CriticalPath, float]:
    """A run's critical path and its parallel efficiency (critical path / makespan; 1.0
    for a run with no time at all)."""
    path = critical_path(graph)
    span = makespan(graph)
    return path, path.length / span if span > 0 else 1.0
