"""Questions a finished (or running) graph answers about itself.

All timing follows ``after`` edges only: a spawned node runs inside the node that issued
it, so its time is already part of its parent's duration.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from .model import Graph, checked_graph
from .nodes import NodeKind, NodeRecord

__all__ = [
    "CriticalPath",
    "ModelUsage",
    "counts_by_kind",
    "critical_path",
    "makespan",
    "parallel_efficiency",
    "peak_concurrency",
    "tokens_per_depth",
    "usage_by_model",
]


class CriticalPath(BaseModel):
    """The longest chain of dependent nodes, weighted by duration."""

    model_config = ConfigDict(frozen=True)

    nodes: tuple[str, ...]
    length: float


class ModelUsage(BaseModel):
    """Calls, tokens and cost of one model over a run."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    """Input tokens read from the server's prompt cache (part of ``input_tokens``)."""
    cache_write_tokens: int = 0
    """Input tokens written to the prompt cache (Anthropic; part of ``input_tokens``)."""
    cost: float = 0.0
    """USD of the calls whose cost is known (``priced_calls``)."""
    estimated_calls: int = 0
    """Calls whose server reported no usage: their tokens are a 4-characters estimate."""
    priced_calls: int = 0
    """Calls whose cost is known (a price, 0 for a local model's too, or the server's
    own): with none, the model's cost is unknown, not 0."""


def critical_path(graph: Graph) -> CriticalPath:
    """Longest path through ``after`` edges, a node weighing its duration.

    A node that runs while the chain before it still does (a block of a streamed turn
    runs while the turn is still being written) weighs only the time it runs past the
    latest end on that chain: the length is time the run spent, overlap never counted
    twice, and without overlap it is the sum of durations. Ties go to the earlier node
    in topological order, so the answer is deterministic.
    """
    graph = checked_graph(graph, "critical_path")
    best: dict[str, float] = {}
    reach: dict[str, float] = {}  # the latest end on the best chain to a node
    via: dict[str, str | None] = {}
    for node_id in graph.topological_order():
        record = graph[node_id]
        prev, prev_len, weight = None, 0.0, record.duration
        for dep in graph.predecessors(node_id, kind="after"):
            beyond = _beyond(record, reach[dep])
            if best[dep] + beyond > prev_len + weight or prev is None:
                prev, prev_len, weight = dep, best[dep], beyond
        best[node_id] = prev_len + weight
        ended = record.end if record.end is not None else -math.inf
        reach[node_id] = max(reach[prev], ended) if prev is not None else ended
        via[node_id] = prev
    if not best:
        return CriticalPath(nodes=(), length=0.0)
    end = max(best, key=lambda n: best[n])
    path: list[str] = []
    node: str | None = end
    while node is not None:
        path.append(node)
        node = via[node]
    return CriticalPath(nodes=tuple(reversed(path)), length=best[end])


def _beyond(record: NodeRecord, reach: float) -> float:
    """The time ``record`` runs past ``reach`` (the latest end on the chain before it):
    its whole duration when it started after that."""
    if record.start is None or record.end is None:
        return record.duration
    return max(0.0, record.end - max(record.start, reach))


def _timed(records: Iterable[NodeRecord]) -> list[NodeRecord]:
    return [r for r in records if r.start is not None and r.end is not None]


def makespan(graph: Graph) -> float:
    """Seconds from the first node's submission to the last node's end."""
    graph = checked_graph(graph, "makespan")
    timed = _timed(graph.records())
    if not timed:
        return 0.0
    first = min(r.submitted if r.submitted is not None else r.start for r in timed)  # type: ignore[type-var]
    return max(r.end for r in timed if r.end is not None) - first  # type: ignore[operator]


def parallel_efficiency(graph: Graph) -> float:
    """Critical path / makespan: 1.0 means the run took no longer than its longest chain.

    Returns 1.0 for a graph that took no time.
    """
    graph = checked_graph(graph, "parallel_efficiency")
    span = makespan(graph)
    if span <= 0:
        return 1.0
    return critical_path(graph).length / span


def peak_concurrency(graph: Graph, kind: NodeKind | str | None = None) -> int:
    """The most nodes (of one kind, or all) that were running at the same instant."""
    graph = checked_graph(graph, "peak_concurrency")
    events: list[tuple[float, int]] = []
    for record in _timed(graph.records(kind)):
        assert record.start is not None and record.end is not None
        events.append((record.start, 1))
        events.append((record.end, -1))
    # Ends sort before starts at the same instant: a slot handed over is not overlap.
    events.sort(key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def counts_by_kind(graph: Graph) -> dict[str, int]:
    graph = checked_graph(graph, "counts_by_kind")
    return dict(Counter(str(r.kind) for r in graph.records()))


def usage_by_model(graph: Graph) -> dict[str, ModelUsage]:
    """Calls, tokens and cost per model, over every depth of the tree.

    Counts the nodes that made a model call themselves (turns, sub-calls, compactions);
    an ``rlm_call`` node's usage is the sum of its child's nodes and is not counted twice.
    """
    graph = checked_graph(graph, "usage_by_model")
    # Summed in plain numbers, each model's ModelUsage made once: a pydantic attribute
    # set costs as much as the rest of the loop.
    sums: dict[str, list[Any]] = {}
    for record in graph.records():
        usage = record.usage
        if record.model is None or usage is None or record.kind in _NOT_CALLS:
            continue
        entry = sums.get(record.model)
        if entry is None:
            entry = sums[record.model] = [0, 0, 0, 0, 0, 0.0, 0, 0]
        entry[0] += 1
        entry[1] += usage.input_tokens
        entry[2] += usage.output_tokens
        entry[3] += usage.cached_tokens
        entry[4] += usage.cache_write_tokens
        if record.cost is not None:
            entry[5] += record.cost
            entry[7] += 1
        entry[6] += usage.estimated
    return {
        model: ModelUsage(**dict(zip(_USAGE_FIELDS, entry, strict=True)))
        for model, entry in sums.items()
    }


_NOT_CALLS = (NodeKind.RLM_CALL, NodeKind.FUNCTION, NodeKind.REPL_BLOCK)
_USAGE_FIELDS = (
    "calls",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "cost",
    "estimated_calls",
    "priced_calls",
)


def tokens_per_depth(graph: Graph) -> dict[int, int]:
    graph = checked_graph(graph, "tokens_per_depth")
    totals: dict[int, int] = defaultdict(int)
    for record in graph.records():
        if record.kind == NodeKind.RLM_CALL or record.usage is None:
            continue
        totals[record.depth] += record.usage.total_tokens
    return dict(totals)
