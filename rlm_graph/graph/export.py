"""Graph export: JSON that round-trips, GraphML and DOT for graph tools.

The JSON format (``"format": "rlm-graph/1"``) holds every record field and every edge
with its kind; ``from_json(to_json(g))`` gives back an equal graph.
"""

from __future__ import annotations

import io
import json
import math
import re
from typing import Any, get_args

import networkx as nx
from pydantic import ValidationError

from ..errors import GraphError
from .model import EdgeKind, Graph, checked_graph
from .nodes import NodeRecord

__all__ = ["from_json", "to_dot", "to_graphml", "to_json", "to_jsonable"]

FORMAT = "rlm-graph/1"
_EDGE_KINDS: tuple[str, ...] = get_args(EdgeKind)


def to_jsonable(graph: Graph) -> dict[str, Any]:
    graph = checked_graph(graph, "to_jsonable")
    return {
        "format": FORMAT,
        "nodes": [record.model_dump(mode="json") for record in graph.records()],
        "edges": [[source, target, kind] for source, target, kind in graph.edges()],
    }


def to_json(graph: Graph, *, indent: int | None = None) -> str:
    return json.dumps(to_jsonable(graph), indent=indent)


def _no_constant(name: str) -> Any:
    """NaN and infinities are no JSON, nor any number a record holds: refused when read,
    not when a report of them cannot be written."""
    raise ValueError(f"{name} is not a number a graph export holds")


def _finite(text: str) -> float:
    """A JSON number as a float; one past a float's range (``1e400``, which Python
    reads as an infinity) is refused as the literal ``Infinity`` is."""
    value = float(text)
    if not math.isfinite(value):
        _no_constant(text)
    return value


def _first_problem(exc: ValidationError) -> str:
    """Pydantic's report, on one line: the first field it refused, and how many more."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    where = ".".join(str(part) for part in first["loc"]) or "the record"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def from_json(text: str | dict[str, Any]) -> Graph:
    """Rebuild a graph from ``to_json`` output.

    Raises:
        GraphError: the text is not an rlm-graph JSON export.
    """
    try:
        data = (
            json.loads(text, parse_constant=_no_constant, parse_float=_finite)
            if isinstance(text, str)
            else text
        )
    except ValueError as exc:
        raise GraphError(f"not an rlm-graph export: not JSON ({exc})") from None
    except RecursionError:  # json's decoder recurses once per level
        raise GraphError("not an rlm-graph export: its JSON is nested too deep to read") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise GraphError(
            f"not an rlm-graph export (expected a JSON object with format {FORMAT!r}); "
            "write one with Graph export to_json()"
        )
    nodes, edges = data.get("nodes"), data.get("edges", [])
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise GraphError(
            "not a whole rlm-graph export: 'nodes' and 'edges' must be lists; "
            "write one with Graph export to_json()"
        )
    graph = Graph()
    for index, node in enumerate(nodes):
        try:
            graph.add(NodeRecord.model_validate(node))
        except ValidationError as exc:
            raise GraphError(
                f"node {index} of the export is not a node record: {_first_problem(exc)}"
            ) from None
    for index, edge in enumerate(edges):
        if not (
            isinstance(edge, list) and len(edge) == 3 and all(isinstance(e, str) for e in edge)
        ):
            raise GraphError(f"edge {index} of the export is not [source, target, kind]")
        if edge[2] not in _EDGE_KINDS:
            raise GraphError(
                f"edge {index} of the export has kind {edge[2]!r}; an edge's kind is one of "
                f"{', '.join(map(repr, _EDGE_KINDS))}"
            )
        graph.add_edge(*edge)
    return graph


# What XML 1.0 cannot hold, even escaped (a model's reply may hold any of it).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(value: str) -> str:
    """``value`` with each character XML cannot hold written as its escape (``\\x1b``)."""
    return _NOT_XML.sub(lambda m: m[0].encode("unicode_escape", "backslashreplace").decode(), value)


def _flat(record: NodeRecord) -> dict[str, Any]:
    """Record fields as GraphML-able scalars (no None, no nested models), text that
    XML can hold."""
    flat: dict[str, Any] = {}
    for key, value in record.model_dump(mode="json").items():
        if key == "usage":
            if value:
                flat["input_tokens"] = value["input_tokens"]
                flat["output_tokens"] = value["output_tokens"]
        elif isinstance(value, str):
            flat[key] = _xml_text(value)
        elif value is not None:
            flat[key] = value
    flat["duration"] = record.duration
    return flat


def to_graphml(graph: Graph) -> str:
    graph = checked_graph(graph, "to_graphml")
    out = nx.DiGraph()
    for record in graph.records():
        out.add_node(_xml_text(record.id), **_flat(record))
    for source, target, kind in graph.edges():
        out.add_edge(_xml_text(source), _xml_text(target), kind=kind)
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
