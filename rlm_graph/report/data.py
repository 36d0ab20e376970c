"""What the HTML report draws, computed once from a run's graph. Pure.

The page gets columns, not objects (one array per field, indexes into tables of kinds and
models), so a 10,000-node run is a few megabytes of JSON that the browser parses in
milliseconds, and the drawing code walks flat arrays.

Layout, decided here rather than in the browser:
    - timeline lanes: nodes by start time, each on the lowest lane free at its start
      (interval partitioning), so there are as many lanes as nodes were ever in flight
      at once, and no two nodes of a lane overlap;
    - the DAG: a node's column is its longest path from a source (over every edge), its
      row its place in that column, ordered by its predecessors' rows so that a batch's
      slots sit next to the block that issued them.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from ..graph import (
    Graph,
    NodeKind,
    NodeRecord,
    NodeStatus,
    critical_path,
    makespan,
    usage_by_model,
)

__all__ = ["STATUSES", "report_data"]

STATUSES = ("ok", "error", "cancelled", "pending", "running", "skipped")


def report_data(
    graph: Graph,
    *,
    title: str = "rlm-graph run",
    stop_reason: str | None = None,
    ended: str | None = None,
) -> dict[str, Any]:
    """The report's data for ``graph`` (JSON-ready).

    Args:
        graph: a finished run's graph (from a result, a graph JSON or a trace file).
        title: shown at the top of the page.
        stop_reason: the limit that stopped the run, if one did.
        ended: how the run ended, in words that follow "the run" ("failed (...)"), where
            no stop reason says it (a journal keeps a run's status only); shown instead
            of the stop reason.
    """
    records = list(graph.records())
    index = {record.id: i for i, record in enumerate(records)}
    kinds = sorted({str(r.kind) for r in records})
    models = sorted({r.model for r in records if r.model})
    edges: list[int] = []
    for source, target, kind in graph.edges():
        edges += [index[source], index[target], 1 if kind == "spawn" else 0]
    path = critical_path(graph)
    failed = [i for i, r in enumerate(records) if r.status == NodeStatus.ERROR]
    nodes = _node_columns(graph, records, index, kinds, models)
    trajectory = _trajectory(graph, records, index)
    if trajectory is not None:
        # A node that did not finish kept no content (a cancelled block, a failed
        # sub-call): its input's preview stands in, marked as one.
        shown = [_unfinished_input(r) for r in records]
        nodes["content_in"] = [
            r.content_in if s is None else s for r, s in zip(records, shown, strict=True)
        ]
        nodes["content_out"] = [r.content_out for r in records]
        nodes["content_preview"] = [1 if s is not None else 0 for s in shown]
    return {
        "title": title,
        "stop_reason": stop_reason,
        "ended": ended,
        "makespan": makespan(graph),
        "kinds": kinds,
        "models": models,
        "statuses": list(STATUSES),
        "nodes": nodes,
        "trajectory": trajectory,
        "edges": edges,
        "critical": [index[n] for n in path.nodes],
        "critical_seconds": path.length,
        "usage": _usage_rows(graph),
        "errors": failed,
        "cancelled": sum(1 for r in records if r.status == NodeStatus.CANCELLED),
    }


def _node_columns(
    graph: Graph,
    records: list[NodeRecord],
    index: dict[str, int],
    kinds: list[str],
    models: list[str],
) -> dict[str, list[Any]]:
    """The nodes as columns (one list per field, a node's place its index)."""
    starts = [r.start for r in records if r.start is not None]
    t0 = min(starts) if starts else 0.0
    columns, rows = _dag_layout(graph, records, index)
    model_at = {model: place for place, model in enumerate(models)}  # not models.index: n*m
    return {
        "id": [r.id for r in records],
        "kind": [kinds.index(str(r.kind)) for r in records],
        "status": [STATUSES.index(str(r.status)) for r in records],
        "depth": [r.depth for r in records],
        "start": [_rel(r.start, t0) for r in records],
        "end": [_rel(r.end, t0) for r in records],
        "lane": _lanes(records, t0),
        "col": columns,
        "row": rows,
        "model": [model_at[r.model] if r.model else -1 for r in records],
        "tokens": [r.usage.total_tokens if r.usage else 0 for r in records],
        "cost": [r.cost for r in records],
        "input": [r.input_preview for r in records],
        "output": [r.output_preview for r in records],
        "error": [_error_text(r) for r in records],
    }


ERROR_CHARS = 2_000
"""Characters of a node's error the report shows (the page shows it twice; one line of
model code can raise an error of megabytes)."""


def _error_text(record: NodeRecord) -> str:
    """A node's error as the report shows it, cut to `ERROR_CHARS` (saying so)."""
    if not record.error:
        return ""
    text = f"{record.error_type or 'error'}: {record.error}"
    if len(text) <= ERROR_CHARS:
        return text
    return f"{text[:ERROR_CHARS]}… [cut: {len(text) - ERROR_CHARS:,} more characters]"


_STEPS = (NodeKind.ROOT_TURN, NodeKind.COMPACTION)
_UNFINISHED = (NodeStatus.ERROR, NodeStatus.CANCELLED)


def _unfinished_input(record: NodeRecord) -> str | None:
    """The input preview the trajectory shows for a node that kept no content because
    it did not finish (None: it kept its content, or has no preview)."""
    if record.content_in is None and record.status in _UNFINISHED and record.input_preview:
        return record.input_preview
    return None


def _trajectory(
    graph: Graph, records: list[NodeRecord], index: dict[str, int]
) -> list[list[int]] | None:
    """The run as it unfolded, for a run that recorded content (else None): ``[node,
    level]`` rows in reading order: each turn of a completion, then its blocks, each
    block followed by the sub-calls it made; a child completion's rows come under its
    ``rlm_call``, one level deeper; a node no block made (a one-call answer, a
    workflow's node) in its own row."""
    if not any(r.content_in is not None or r.content_out is not None for r in records):
        return None
    by_completion: dict[str, list[NodeRecord]] = defaultdict(list)
    for record in records:
        by_completion[record.completion].append(record)
    rows: list[list[int]] = []
    # Depth first, a child completion's rows right under its rlm_call; a stack of the
    # completions being written, not recursion (a deep tree must not overflow).
    stack = [_rows_of(graph, by_completion.get("root", []), 0)]
    seen = {"root"}
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            continue
        node_id, level = step
        rows.append([index[node_id], level])
        if graph[node_id].kind == NodeKind.RLM_CALL and node_id not in seen:
            seen.add(node_id)
            stack.append(_rows_of(graph, by_completion.get(node_id, []), level + 1))
    return rows


def _rows_of(graph: Graph, records: list[NodeRecord], level: int) -> Iterator[tuple[str, int]]:
    """One completion's rows: its turns and blocks in order, each block followed by the
    sub-calls it made in the order they started."""
    for record in _in_order(records):
        spawned = next(graph.predecessors(record.id, "spawn"), None) is not None
        if spawned and record.kind not in _STEPS:
            continue  # a sub-call: it comes under the block that made it
        yield record.id, level + (record.kind == NodeKind.REPL_BLOCK)
        if record.kind == NodeKind.REPL_BLOCK:
            for call in sorted(
                graph.successors(record.id, "spawn"), key=lambda c: _started(graph, c)
            ):
                yield call, level + 2


def _started(graph: Graph, node_id: str) -> tuple[float, list[Any]]:
    start = graph[node_id].start
    return (start if start is not None else math.inf, _natural(node_id))


def _in_order(records: list[NodeRecord]) -> list[NodeRecord]:
    """A completion's turns, compactions and blocks in the order they ran."""
    return sorted(
        records, key=lambda r: (r.iteration or 0, r.kind != NodeKind.COMPACTION, _natural(r.id))
    )


def _natural(node_id: str) -> list[Any]:
    """``turn-1/block-10`` after ``turn-1/block-9``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", node_id)]


def _usage_rows(graph: Graph) -> list[dict[str, Any]]:
    return [
        {
            "model": name,
            "calls": u.calls,
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cost": u.cost,
        }
        for name, u in sorted(usage_by_model(graph).items())
    ]


def _rel(value: float | None, t0: float) -> float | None:
    return None if value is None else round(value - t0, 6)


def _lanes(records: list[Any], t0: float) -> list[int]:
    """Interval partitioning: each timed node on the lowest lane free when it starts."""
    lanes = [-1] * len(records)
    timed = sorted(
        (i for i, r in enumerate(records) if r.start is not None),
        key=lambda i: (records[i].start, i),
    )
    busy: list[tuple[float, int]] = []  # (end, lane) of lanes in use
    free: list[int] = []
    count = 0
    for i in timed:
        start = records[i].start
        end = records[i].end if records[i].end is not None else start
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, count = count, count + 1
        lanes[i] = lane
        heapq.heappush(busy, (max(end, start), lane))
    return lanes


def _dag_layout(
    graph: Graph, records: list[Any], index: dict[str, int]
) -> tuple[list[int], list[int]]:
    """Column: the longest path from a source; row: the place in the column, by the mean
    row of the node's predecessors, then followers before spawned nodes, then insertion
    order."""
    column = [0] * len(records)
    for node_id in graph.topological_order():
        i = index[node_id]
        for target in graph.successors(node_id):
            j = index[target]
            column[j] = max(column[j], column[i] + 1)
    by_column: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(column):
        by_column[c].append(i)
    row = [0] * len(records)
    for c in sorted(by_column):

        def weight(i: int) -> tuple[float, int, int]:
            # A node that follows another (a turn after a block) keeps that row; spawned
            # nodes (a batch's slots) fan out below it.
            preds = [row[index[p]] for p in graph.predecessors(records[i].id)]
            spawned = 1 if any(True for _ in graph.predecessors(records[i].id, kind="spawn")) else 0
            return (sum(preds) / len(preds) if preds else 0.0, spawned, i)

        for place, i in enumerate(sorted(by_column[c], key=weight)):
            row[i] = place
    return column, row
