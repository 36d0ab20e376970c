"""OpenTelemetry spans for runs and nodes.

One span per node, opened and closed in one ``with`` by `Run.execute`; its parent is
passed explicitly from the graph (never taken from the ambient context), so spans nest
as the graph does even when the call came from a REPL worker thread.

Span names and attributes follow the OpenTelemetry GenAI semantic conventions (see
docs/tracing.md for the version followed and the full table).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from .graph import NodeKind, NodeRecord, NodeStatus

__all__ = ["NodeTracer", "SPAN_ATTRIBUTES"]

INSTRUMENTATION_NAME = "rlm_graph"

# Attribute names used on spans; docs/tracing.md documents each (a test checks).
SPAN_ATTRIBUTES = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "gen_ai.agent.name",
    "gen_ai.tool.name",
    "error.type",
    "rlm.node.id",
    "rlm.node.kind",
    "rlm.node.status",
    "rlm.depth",
    "rlm.iteration",
    "rlm.batch.index",
    "rlm.batch.size",
    "rlm.cost_usd",
)

_OPERATION = {
    NodeKind.ROOT_TURN: "chat",
    NodeKind.LLM_CALL: "chat",
    NodeKind.COMPACTION: "chat",
    NodeKind.REPL_BLOCK: "execute_tool",
    NodeKind.RLM_CALL: "invoke_agent",
    NodeKind.FUNCTION: "execute_tool",
}


def _span_name(record: NodeRecord) -> str:
    operation = _OPERATION[record.kind]
    if operation == "chat":
        return f"chat {record.model}" if record.model else "chat"
    if record.kind == NodeKind.REPL_BLOCK:
        return "execute_tool repl"
    if record.kind == NodeKind.RLM_CALL:
        return "invoke_agent rlm"
    return f"execute_tool {record.id}"


def _start_attributes(record: NodeRecord) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": _OPERATION[record.kind],
        "rlm.node.id": record.id,
        "rlm.node.kind": record.kind.value,
        "rlm.depth": record.depth,
    }
    if record.kind == NodeKind.REPL_BLOCK:
        attrs["gen_ai.tool.name"] = "repl"
    elif record.kind == NodeKind.FUNCTION:
        attrs["gen_ai.tool.name"] = record.id
    elif record.kind == NodeKind.RLM_CALL:
        attrs["gen_ai.agent.name"] = "rlm"
    if record.iteration is not None:
        attrs["rlm.iteration"] = record.iteration
    if record.batch_index is not None:
        attrs["rlm.batch.index"] = record.batch_index
        attrs["rlm.batch.size"] = record.batch_size or 0
    return attrs


def _end_attributes(record: NodeRecord) -> dict[str, Any]:
    attrs: dict[str, Any] = {"rlm.node.status": record.status.value}
    if record.provider:
        attrs["gen_ai.provider.name"] = record.provider
    if record.model:
        attrs["gen_ai.request.model"] = record.model
        if _OPERATION[record.kind] == "chat":
            attrs["gen_ai.response.model"] = record.model
    if record.usage is not None:
        attrs["gen_ai.usage.input_tokens"] = record.usage.input_tokens
        attrs["gen_ai.usage.output_tokens"] = record.usage.output_tokens
    if record.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = (record.finish_reason,)
    if record.cost is not None:
        attrs["rlm.cost_usd"] = record.cost
    if record.status == NodeStatus.ERROR:
        attrs["error.type"] = record.error_type or "Exception"
    elif record.status == NodeStatus.CANCELLED:
        attrs["error.type"] = "cancelled"
    return attrs


class NodeTracer:
    """Opens the spans of one run.

    Args:
        tracer_provider: where spans go; ``None`` uses OpenTelemetry's global provider
            (a no-op until someone configures one).
        capture_content: put prompt, code and output text (truncated) on spans.
    """

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, capture_content: bool = False
    ) -> None:
        self.capture_content = capture_content
        provider = tracer_provider or trace.get_tracer_provider()
        self._tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        self._contexts: dict[str, otel_context.Context] = {}
        self._root: otel_context.Context | None = None
        self.enabled = True

    @contextmanager
    def run_span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """The span of a whole run (``invoke_agent`` or ``invoke_workflow``)."""
        span = self._tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=dict(attributes))
        self._root = trace.set_span_in_context(span)
        try:
            yield span
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.set_attribute("error.type", type(exc).__name__)
            raise
        finally:
            span.end()

    @contextmanager
    def node_span(self, record: NodeRecord, parent_id: str | None) -> Iterator[Span]:
        """The span of one node; its attributes are completed from the record at exit."""
        parent = self._contexts.get(parent_id) if parent_id else None
        kind = SpanKind.CLIENT if _OPERATION[record.kind] == "chat" else SpanKind.INTERNAL
        span = self._tracer.start_span(
            _span_name(record),
            context=parent or self._root,
            kind=kind,
            attributes=_start_attributes(record),
        )
        self._contexts[record.id] = trace.set_span_in_context(span)
        try:
            yield span
        finally:
            span.update_name(_span_name(record))
            span.set_attributes(_end_attributes(record))
            if record.status == NodeStatus.ERROR:
                span.set_status(Status(StatusCode.ERROR, record.error or ""))
            span.end()
