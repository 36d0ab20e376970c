"""The one-file HTML report of a run (see docs/observing.md). Pure: a graph in, text out."""

from __future__ import annotations

from pathlib import Path

from .._files import write_private
from ..graph import Graph
from .data import report_data
from .page import render_page

__all__ = ["render_report", "report_data", "write_report"]


def render_report(
    graph: Graph,
    *,
    title: str = "rlm-graph run",
    stop_reason: str | None = None,
    ended: str | None = None,
) -> str:
    """The report of ``graph`` as one self-contained HTML document (`report_data` says
    what ``stop_reason`` and ``ended`` are)."""
    return render_page(report_data(graph, title=title, stop_reason=stop_reason, ended=ended))


def write_report(
    graph: Graph,
    path: str | Path,
    *,
    title: str = "rlm-graph run",
    stop_reason: str | None = None,
    ended: str | None = None,
) -> Path:
    """Write the report of ``graph`` to ``path`` (folders created) and return the path."""
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    page = render_report(graph, title=title, stop_reason=stop_reason, ended=ended)
    return write_private(target, page)
