"""Tracing helpers: an SDK provider into memory (`Memory`), span-tree checks, a keyed
provider plugin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlm_graph.contracts import ChatRequest, ChatResponse, Usage
from rlm_graph.graph import Graph
from rlm_graph.hooks import hookimpl
from rlm_graph_scripted import ScriptedProvider


class Memory:
    """A tracer provider whose spans land in a list, exported as each span ends."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def by_node(self) -> dict[str, ReadableSpan]:
        found = {}
        for span in self.spans:
            node = (span.attributes or {}).get("rlm.node.id")
            if node is not None:
                assert node not in found, f"two spans for node {node}"
                found[str(node)] = span
        return found

    def run_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans if "rlm.node.id" not in (s.attributes or {})]


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def expected_parent(graph: Graph, node: str) -> str | None:
    """The node whose span must be ``node``'s parent (None: the run's span).

    A node's spawn edge names the node that issued it; a REPL block runs inside its turn.
    """
    spawned_by = list(graph.predecessors(node, "spawn"))
    if spawned_by:
        return spawned_by[0]
    if str(graph[node].kind) == "repl_block":
        turns = [p for p in graph.predecessors(node, "after") if str(graph[p].kind) == "root_turn"]
        return turns[0] if turns else None
    return None


def assert_nesting(graph: Graph, spans: dict[str, ReadableSpan], run: ReadableSpan) -> None:
    """Every node's span has the parent the graph says, and all share the run's trace."""
    trace_id = run.get_span_context().trace_id  # type: ignore[union-attr]
    for record in graph.records():
        span = spans[record.id]
        assert span.get_span_context().trace_id == trace_id  # type: ignore[union-attr]
        parent = expected_parent(graph, record.id)
        want = span_id(run) if parent is None else span_id(spans[parent])
        assert parent_id(span) == want, f"{record.id}: parent should be {parent or 'the run'}"


class KeyedProvider(ScriptedProvider):
    """A scripted provider that takes an API key (and, like a careless client, puts it in
    its error messages) and a base URL, as a real HTTP provider would."""

    name = "keyed"

    def __init__(
        self, *, api_key: str, base_url: str = "https://api.example.com:8443/v1", **kwargs: object
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.api_key = api_key
        self.base_url = base_url


class KeyedPlugin:
    @hookimpl
    def rlm_register_providers(self) -> dict[str, object]:
        return {"keyed": KeyedProvider}


def reply(text: str, request: ChatRequest, reason: str = "stop") -> ChatResponse:
    return ChatResponse(
        content=text,
        model=request.model,
        usage=Usage(input_tokens=7, output_tokens=3),
        finish_reason=reason,
    )


def tree_names(spans: Sequence[ReadableSpan]) -> list[str]:
    return sorted(span.name for span in spans)


def attrs(span: ReadableSpan) -> Mapping[str, Any]:
    """A span's attributes (empty when it has none)."""
    return span.attributes or {}
