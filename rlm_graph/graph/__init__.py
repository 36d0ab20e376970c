"""The graph layer: pure data and analysis, no trio, httpx or opentelemetry."""

from __future__ import annotations

from .analysis import (
    CriticalPath,
    ModelUsage,
    counts_by_kind,
    critical_path,
    makespan,
    parallel_efficiency,
    peak_concurrency,
    tokens_per_depth,
    usage_by_model,
)
from .export import from_json, to_dot, to_graphml, to_json, to_jsonable
from .model import EdgeKind, Graph
from .nodes import NodeKind, NodeRecord, NodeStatus, preview
from .workflow import NodeRef, Workflow

__all__ = [
    "CriticalPath",
    "EdgeKind",
    "Graph",
    "ModelUsage",
    "NodeKind",
    "NodeRecord",
    "NodeRef",
    "NodeStatus",
    "Workflow",
    "counts_by_kind",
    "critical_path",
    "from_json",
    "makespan",
    "parallel_efficiency",
    "peak_concurrency",
    "preview",
    "to_dot",
    "to_graphml",
    "to_json",
    "to_jsonable",
    "tokens_per_depth",
    "usage_by_model",
]
