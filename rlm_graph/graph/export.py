"""Graph export: JSON that round-trips, GraphML and DOT for graph tools.

The JSON format (``"format": "rlm-graph/1"``) holds every record field and every edge
with its kind; ``from_json(to_json(g))`` gives back an equal graph.
"""

from __future__ import annotations

import io
import json
from typing import Any

import networkx as nx

from ..errors import GraphError
from .model import Graph, checked_graph
from .nodes import NodeRecord

__all__ = ["from_json", "to_dot", "to_graphml", "to_json", "to_jsonable"]

FORMAT = "rlm-graph/1"


def to_jsonable(graph: Graph) -> dict[str, Any]:
    graph = checked_graph(graph, "to_jsonable")
    return {
        "format": FORMAT,
        "nodes": [record.model_dump(mode="json") for record in graph.records()],
        "edges": [[source, target, kind] for source, target, kind in graph.edges()],
    }


def to_json(graph: Graph, *, indent: int | None = None) -> str:
    return json.dumps(to_jsonable(graph), indent=indent)


def from_json(text: str | dict[str, Any]) -> Graph:
    """Rebuild a graph from ``to_json`` output.

    Raises:
        GraphError: the text is not an rlm-graph JSON export.
    """
    data = json.loads(text) if isinstance(text, str) else text
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise GraphError(
            f"not an rlm-graph export (expected a JSON object with format {FORMAT!r}); "
            "write one with Graph export to_json()"
        )
    graph = Graph()
    for node in data["nodes"]:
        graph.add(NodeRecord.model_validate(node))
    for source, target, kind in data["edges"]:
        graph.add_edge(source, target, kind)
    return graph


def _flat(record: NodeRecord) -> dict[str, Any]:
    """Record fields as GraphML-able scalars (no None, no nested models)."""
    flat: dict[str, Any] = {}
    for key, value in record.model_dump(mode="json").items():
        if key == "usage":
            if value:
                flat["input_tokens"] = value["input_tokens"]
                flat["output_tokens"] = value["output_tokens"]
        elif value is not None:
            flat[key] = value
    flat["duration"] = record.duration
    return flat


def to_graphml(graph: Graph) -> str:
    graph = checked_graph(graph, "to_graphml")
    out = nx.DiGraph()
    for record in graph.records():
        out.add_node(record.id, **_flat(record))
    for source, target, kind in graph.edges():
        out.add_edge(source, target, kind=kind)
    buffer = io.BytesIO()
    nx.write_graphml(out, buffer)
    return buffer.getvalue().decode("utf-8")


def dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_DOT_SHAPES = {
    "root_turn": "box",
    "repl_block": "note",
    "llm_call": "ellipse",
    "rlm_call": "doubleoctagon",
    "compaction": "hexagon",
    "function": "component",
}


def to_dot(graph: Graph) -> str:
    """Graphviz DOT text: one node per record, dashed edges for ``spawn``."""
    graph = checked_graph(graph, "to_dot")
    lines = ["digraph rlm_graph {", "  rankdir=LR;"]
    for record in graph.records():
        label = f"{record.id}\n{record.kind} [{record.status}]\n{record.duration:.3f}s"
        if record.model:
            label += f"\n{record.model}"
        shape = _DOT_SHAPES.get(str(record.kind), "box")
        lines.append(f"  {dot_quote(record.id)} [label={dot_quote(label)}, shape={shape}];")
    for source, target, kind in graph.edges():
        style = " [style=dashed]" if kind == "spawn" else ""
        lines.append(f"  {dot_quote(source)} -> {dot_quote(target)}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"
