from __future__ import annotations

import json
from typing import Any

import networkx as nx
import pytest

from rlm_graph.contracts import Usage
from rlm_graph.errors import GraphError
from rlm_graph.graph import (
    Graph,
    NodeKind,
    NodeRecord,
    NodeStatus,
    critical_path,
    from_json,
    makespan,
    parallel_efficiency,
    peak_concurrency,
    to_dot,
    to_graphml,
    to_json,
    usage_by_model,
)
from rlm_graph.graph.nodes import preview


def node(node_id: str, start: float, end: float, kind: NodeKind = NodeKind.FUNCTION) -> NodeRecord:
    return NodeRecord(id=node_id, kind=kind, start=start, end=end, status=NodeStatus.OK)


def diamond() -> Graph:
    # a(0-1) -> b(1-4), a -> c(1-2); b, c -> d(4-5): critical path a-b-d = 1+3+1 = 5
    g = Graph()
    g.add(node("a", 0, 1))
    g.add(node("b", 1, 4), after=["a"])
    g.add(node("c", 1, 2), after=["a"])
    g.add(node("d", 4, 5), after=["b", "c"])
    return g


def test_critical_path_and_efficiency_on_a_hand_built_graph() -> None:
    g = diamond()
    path = critical_path(g)
    assert path.nodes == ("a", "b", "d")
    assert path.length == pytest.approx(5.0)
    assert makespan(g) == pytest.approx(5.0)
    assert parallel_efficiency(g) == pytest.approx(1.0)
    assert peak_concurrency(g) == 2


def test_efficiency_drops_when_the_run_waited_longer_than_its_longest_chain() -> None:
    g = Graph()
    g.add(node("a", 0, 1))
    g.add(node("b", 3, 4), after=["a"])  # started two seconds after it could have
    assert critical_path(g).length == pytest.approx(2.0)
    assert makespan(g) == pytest.approx(4.0)
    assert parallel_efficiency(g) == pytest.approx(0.5)


def test_spawned_children_do_not_lengthen_the_critical_path() -> None:
    g = Graph()
    g.add(node("turn", 0, 1, NodeKind.ROOT_TURN))
    g.add(node("block", 1, 3, NodeKind.REPL_BLOCK), after=["turn"])
    g.add(node("call", 1.5, 2.5, NodeKind.LLM_CALL), parent="block")
    assert critical_path(g).nodes == ("turn", "block")
    assert parallel_efficiency(g) == pytest.approx(1.0)


def test_a_cycle_is_refused_with_the_cycle_named() -> None:
    g = diamond()
    with pytest.raises(GraphError, match=r"cycle \(a -> b -> d -> a\)"):
        g.add_edge("d", "a")
    with pytest.raises(GraphError, match="cycle"):
        g.add_edge("a", "a")
    assert nx.is_directed_acyclic_graph(g.nx)


def test_unknown_dependency_and_duplicate_id_are_refused() -> None:
    g = diamond()
    with pytest.raises(GraphError, match="'nope', which is not in the graph"):
        g.add(node("e", 0, 1), after=["nope"])
    with pytest.raises(GraphError, match="already in the graph"):
        g.add(node("a", 0, 1))


def test_json_round_trips_every_field_and_edge() -> None:
    g = diamond()
    g["b"].usage = Usage(input_tokens=10, output_tokens=3)
    g["b"].model = "m"
    g["b"].cost = 0.25
    g.add(
        NodeRecord(id="x", kind=NodeKind.LLM_CALL, error="boom", status=NodeStatus.ERROR),
        parent="b",
    )
    text = to_json(g)
    back = from_json(text)
    assert [r.model_dump() for r in back.records()] == [r.model_dump() for r in g.records()]
    assert sorted(back.edges()) == sorted(g.edges())
    assert to_json(back) == text
    assert json.loads(text)["format"] == "rlm-graph/1"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"nodes": []}', "not an rlm-graph export"),
        ("{not json", "not an rlm-graph export: not JSON"),
        ('{"format": "rlm-graph/1"}', "'nodes' and 'edges' must be lists"),
        ('{"format": "rlm-graph/1", "nodes": [{"id": 3}]}', "node 0 of the export is not a node"),
        (
            '{"format": "rlm-graph/1", "nodes": [], "edges": [["a", "b"]]}',
            "edge 0 of the export is not",
        ),
        (
            '{"format": "rlm-graph/1", "nodes": [{"id": "a", "kind": "function"}, '
            '{"id": "b", "kind": "function"}], "edges": [["a", "b", "sideways"]]}',
            "edge 0 of the export has kind 'sideways'; an edge's kind is one of 'after', 'spawn'",
        ),
        (
            '{"format": "rlm-graph/1", "nodes": [{"id": "a", "kind": "function", "start": 1e400}]}',
            "not JSON \\(1e400 is not a number a graph export holds\\)",
        ),
        (
            '{"format": "rlm-graph/1", "nodes": [{"cost": 1e999}]}',
            "1e999 is not a number a graph export holds",
        ),
        (
            '{"format": "rlm-graph/1", "nodes": [{"id": "a"}]}',
            r"not a node record: kind: Field required$",
        ),
    ],
)
def test_from_json_rejects_something_else(text: str, says: str) -> None:
    with pytest.raises(GraphError, match=says):
        from_json(text)


def test_graphml_holds_a_reply_with_characters_xml_cannot() -> None:
    """A model's reply is untrusted text: a terminal escape or a NUL in a preview must
    not make the export something no XML reader opens."""
    import io
    import xml.dom.minidom

    g = diamond()
    g["b"].output_preview = "\x1b[31mred\x1b[0m and \x00 nul"
    graphml = to_graphml(g)
    xml.dom.minidom.parseString(graphml)  # raises on a character XML cannot hold
    back = nx.read_graphml(io.StringIO(graphml))
    assert back.nodes["b"]["output_preview"] == "\\x1b[31mred\\x1b[0m and \\x00 nul"


def test_graphml_and_dot_exports_carry_nodes_and_edges() -> None:
    g = diamond()
    g["b"].usage = Usage(input_tokens=7, output_tokens=2)
    graphml = to_graphml(g)
    import io

    back = nx.read_graphml(io.StringIO(graphml))
    assert set(back.nodes) == {"a", "b", "c", "d"}
    assert back.nodes["b"]["input_tokens"] == 7
    assert back.edges["a", "b"]["kind"] == "after"
    dot = to_dot(g)
    assert dot.startswith("digraph")
    assert '"a" -> "b";' in dot


def test_usage_by_model_counts_calls_tokens_and_cost() -> None:
    g = Graph()
    for i, model in enumerate(["big", "small", "small"]):
        g.add(
            NodeRecord(
                id=f"n{i}",
                kind=NodeKind.LLM_CALL,
                model=model,
                usage=Usage(input_tokens=10, output_tokens=5),
                cost=0.5,
            )
        )
    summary = usage_by_model(g)
    assert summary["small"].calls == 2
    assert summary["small"].input_tokens == 20
    assert summary["big"].cost == pytest.approx(0.5)


def test_a_free_model_costs_zero_and_an_unpriced_one_is_unknown() -> None:
    """A local model priced 0 (``--price 0 0``) cost $0, not an unknown cost (its total
    was None, and batch and eval said null and N/A)."""
    from rlm_graph.result import UsageSummary

    g = Graph()
    for i, (model, cost) in enumerate([("local", 0.0), ("local", 0.0), ("mystery", None)]):
        usage = Usage(input_tokens=10, output_tokens=5)
        g.add(NodeRecord(id=f"n{i}", kind=NodeKind.LLM_CALL, model=model, usage=usage, cost=cost))
    by_model = UsageSummary.from_graph(g).model_usage_summaries
    assert by_model["local"].total_cost == 0.0
    assert by_model["mystery"].total_cost is None
    assert usage_by_model(g)["local"].priced_calls == 2


def test_topological_order_is_networkx_order_on_random_dags() -> None:
    import random

    rng = random.Random(7)
    for _ in range(30):
        g = Graph()
        ids: list[str] = []
        for n in range(rng.randint(1, 25)):
            deps = rng.sample(ids, rng.randint(0, min(3, len(ids))))
            parent = rng.choice(ids) if ids and rng.random() < 0.3 else None
            g.add(node(f"n{n}", 0, 1), after=[d for d in deps if d != parent], parent=parent)
            ids.append(f"n{n}")
        assert g.topological_order() == list(nx.topological_sort(g.nx))
        assert sorted(g.edges()) == sorted((s, t, k) for s, t, k in g.nx.edges(data="kind"))


def test_reading_a_graph_leaves_no_reference_cycle() -> None:
    # networkx caches some views in the graph itself; a graph that held one would only
    # be freed by Python's full collection (a pause every completion of a batch shares).
    import gc
    import weakref

    g = Graph()
    g.add(node("a", 0, 1))
    g.add(node("b", 1, 2), after=["a"])
    g.add(node("c", 1, 3), parent="a")
    assert critical_path(g).nodes == ("a", "b")
    assert list(g.predecessors("b", kind="after")) == ["a"] and list(g.successors("a")) == [
        "b",
        "c",
    ]
    assert len(list(g.edges())) == 2 and g.topological_order() == ["a", "b", "c"]
    usage_by_model(g)
    makespan(g)
    gone = weakref.ref(g.nx)
    gc.disable()
    try:
        del g
        assert gone() is None
    finally:
        gc.enable()


def test_a_fresh_record_is_the_validated_record_of_the_same_values() -> None:
    # The engine builds its own nodes unvalidated (NodeRecord.fresh); they must be the
    # records the validating constructor makes, every default included, and dump alike.
    fields: dict[str, Any] = {
        "depth": 2,
        "completion": "turn-1/block-1/rlm-1",
        "iteration": 3,
        "batch_index": 4,
        "batch_size": 8,
        "input_preview": "sq 1003",
        "reason": "fits",
    }
    fresh = NodeRecord.fresh("turn-1/block-1/llm-1.4", NodeKind.LLM_CALL, **fields)
    validated = NodeRecord(id="turn-1/block-1/llm-1.4", kind=NodeKind.LLM_CALL, **fields)
    assert fresh == validated
    assert fresh.model_dump(mode="json") == validated.model_dump(mode="json")
    assert fresh.status is NodeStatus.PENDING and fresh.attempts == 1 and fresh.usage is None
    # Two fresh records share no mutable state.
    other = NodeRecord.fresh("b", NodeKind.FUNCTION)
    other.input_preview, other.attempts = "changed", 3
    assert fresh.input_preview == "sq 1003" and fresh.attempts == 1


def test_analysis_and_export_given_a_workflow_say_what_they_take() -> None:
    from rlm_graph import Workflow

    wf = Workflow()
    wf.llm("q")
    for function in (critical_path, makespan, to_json, to_dot, usage_by_model, peak_concurrency):
        with pytest.raises(
            TypeError, match=r"takes a run's Graph \(result.graph\), not Workflow; .*wf.to_json\(\)"
        ):
            function(wf)  # type: ignore[arg-type]


def test_a_preview_of_a_huge_value_reads_only_what_it_shows() -> None:
    """The preview of a node's value wrote the whole repr out to keep 200 characters: a
    function node returning millions of rows held the scheduler for seconds."""
    written = []

    class Row:
        def __repr__(self) -> str:
            written.append(1)
            return "Row()"

    rows = [Row() for _ in range(100_000)]
    shown = preview(rows)
    assert shown.startswith("[Row(), Row()") and len(shown) <= 200
    assert len(written) <= 250  # not 100,000
    assert preview({"a": [1, "x"]}) == "{'a': [1, 'x']}"  # a small value reads as repr
