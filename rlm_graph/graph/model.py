"""The graph of a run: topology in a networkx DiGraph, one `NodeRecord` per node.

Invariants:
    - The graph only grows while a run goes: nodes and edges are added, never removed
      or rewired, so anything computed from a prefix of the run stays true.
    - It is acyclic. ``add_edge`` refuses an edge that would close a cycle and names it.
    - Edges have a ``kind``: ``"after"`` (the target starts after the source finished:
      data or sequence dependency) or ``"spawn"`` (the target was issued by, and runs
      inside, the source: a REPL block's sub-calls, a child completion's turns). Timing
      analysis follows ``after`` edges only, since a spawned node's time is already inside
      its parent's.
    - Reading a graph never makes a reference cycle: networkx caches some views of a
      graph in the graph itself (``in_degree``, ``edges``), and a graph holding a view
      that holds it back lives on as garbage until Python's full collection, a pause
      that grows with the heap (a batch made one per completion). So the methods here
      read the adjacency dicts (``succ``, ``pred``), whose views do not point back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import networkx as nx

from ..errors import GraphError
from .nodes import NodeKind, NodeRecord

__all__ = ["EdgeKind", "Graph", "checked_graph"]

EdgeKind = Literal["after", "spawn"]


class Graph:
    """A run's DAG of node records.

    Example:
        >>> g = Graph()
        >>> a = g.add(NodeRecord(id="a", kind=NodeKind.FUNCTION))
        >>> b = g.add(NodeRecord(id="b", kind=NodeKind.FUNCTION), after=["a"])
        >>> list(g.predecessors("b"))
        ['a']
    """

    __slots__ = ("_g",)

    def __init__(self) -> None:
        self._g: nx.DiGraph = nx.DiGraph()

    # -- building -----------------------------------------------------------------------

    def add(
        self,
        record: NodeRecord,
        *,
        after: Iterable[str] = (),
        parent: str | None = None,
    ) -> NodeRecord:
        """Add a node, with ``after`` edges from its dependencies and a ``spawn`` edge from
        the node that issued it.

        Raises:
            GraphError: the id is taken, or a named dependency does not exist.
        """
        if record.id in self._g:
            raise GraphError(f"node id {record.id!r} is already in the graph; ids must be unique")
        sources = [(dep, "after") for dep in after]
        if parent is not None:
            sources.append((parent, "spawn"))
        for dep, _ in sources:
            if dep not in self._g:
                raise GraphError(
                    f"node {record.id!r} depends on {dep!r}, which is not in the graph; "
                    "add dependencies before the nodes that use them"
                )
        self._g.add_node(record.id, record=record)
        for dep, kind in sources:
            self._g.add_edge(dep, record.id, kind=kind)
        return record

    def add_edge(self, source: str, target: str, kind: EdgeKind = "after") -> None:
        """Add a dependency between two existing nodes.

        Raises:
            GraphError: a node is missing, or the edge would close a cycle (the message
                names the cycle).
        """
        for node in (source, target):
            if node not in self._g:
                raise GraphError(f"no node {node!r} in the graph")
        if source == target or nx.has_path(self._g, target, source):
            path = [source] if source == target else nx.shortest_path(self._g, target, source)
            cycle = " -> ".join([*path, target]) if source != target else f"{source} -> {source}"
            raise GraphError(
                f"edge {source!r} -> {target!r} would make a cycle ({cycle}); "
                "a graph must be acyclic: drop one of these dependencies"
            )
        self._g.add_edge(source, target, kind=kind)

    # -- reading ------------------------------------------------------------------------

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._g

    def __len__(self) -> int:
        count: int = self._g.number_of_nodes()
        return count

    def __iter__(self) -> Iterator[NodeRecord]:
        return self.records()

    def __getitem__(self, node_id: str) -> NodeRecord:
        try:
            record: NodeRecord = self._g.nodes[node_id]["record"]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the graph") from None
        return record

    def records(self, kind: NodeKind | str | None = None) -> Iterator[NodeRecord]:
        """All records in insertion order, optionally of one kind."""
        for _, data in self._g.nodes(data=True):
            record: NodeRecord = data["record"]
            if kind is None or record.kind == kind:
                yield record

    def predecessors(self, node_id: str, kind: EdgeKind | None = None) -> Iterator[str]:
        for source, data in self._g.pred[node_id].items():
            if kind is None or data["kind"] == kind:
                yield source

    @property
    def incoming(self) -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
        """Node id -> the edges into it (source id -> the edge's data, ``{"kind": ...}``).

        The graph's own map, not a copy, for code that walks every node (the journal
        does, once per node): read it, do not change it.
        """
        pred: Mapping[str, Mapping[str, Mapping[str, Any]]] = self._g._pred
        return pred

    def successors(self, node_id: str, kind: EdgeKind | None = None) -> Iterator[str]:
        for target, data in self._g.succ[node_id].items():
            if kind is None or data["kind"] == kind:
                yield target

    def edges(self) -> Iterator[tuple[str, str, EdgeKind]]:
        for source, targets in self._g.succ.items():
            for target, data in targets.items():
                yield source, target, data["kind"]

    def topological_order(self) -> list[str]:
        """Node ids, every node after its predecessors: generation by generation (the
        nodes whose predecessors are all in earlier generations), each in insertion
        order, as ``networkx.topological_sort`` orders them."""
        pred, succ = self._g.pred, self._g.succ
        waiting = {node: len(sources) for node, sources in pred.items() if sources}
        generation = [node for node, sources in pred.items() if not sources]
        order: list[str] = []
        while generation:
            order.extend(generation)
            ready: list[str] = []
            for node in generation:
                for child in succ[node]:
                    waiting[child] -= 1
                    if not waiting[child]:
                        ready.append(child)
                        del waiting[child]
            generation = ready
        return order

    @property
    def nx(self) -> nx.DiGraph:
        """The underlying networkx graph (read it; do not change it)."""
        return self._g


def checked_graph(graph: object, function: str) -> Graph:
    """``graph``, when it is a `Graph`; else a ``TypeError`` saying what ``function``
    takes (a `Workflow` is a plan, not a run's graph: it has its own exports)."""
    if isinstance(graph, Graph):
        return graph
    hint = (
        "; for a Workflow's plan before it runs, use wf.to_json() or wf.to_dot()"
        if type(graph).__name__ == "Workflow"
        else ""
    )
    raise TypeError(
        f"{function}() takes a run's Graph (result.graph), not {type(graph).__name__}{hint}"
    )
