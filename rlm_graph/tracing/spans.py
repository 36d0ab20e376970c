"""OpenTelemetry spans for runs and nodes.

Invariants:
    - One span per node, opened and closed in one ``with`` by `Run.execute` through
      `NodeTracer.node_span`. Its parent is passed explicitly from the graph (the node that
      issued it, or the run's own span), never taken from the ambient context, so spans
      nest as the graph does even when the call came from a REPL worker thread or from a
      subprocess REPL over its pipe.
    - A node's ``after`` dependencies become span links (Jaeger shows them as
      ``FOLLOWS_FROM``) when the tracer was given the run's graph.
    - Span times come from the record's trio-clock times (``submitted`` and ``end``),
      anchored once per tracer to the wall clock, so a span covers queueing plus service
      time exactly as the graph records it, also under trio's ``MockClock``.
    - With no SDK tracer provider (the global no-op one, or ``NoOpTracerProvider``) the
      tracer is disabled: `node_span` returns a shared no-op context manager and does no
      span work at all.
    - Text (prompts, code, outputs, error messages) passes a `Scrubber` before it is put
      on a span; content is captured only when ``capture_content=True``, truncated.
    - Every text on a span is whole UTF-8 (a lone surrogate is U+FFFD): one half a
      character made the OTLP encoder lose its whole batch.

Span names and attributes follow the OpenTelemetry GenAI semantic conventions, version
`SEMCONV_VERSION`; docs/tracing.md has the table, and a test keeps the two in step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import trio
from opentelemetry import context as otel_context, trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TracerProvider,
)

from .._files import utf8_text
from ..contracts import Provider, ProviderCapabilities
from ..errors import message_of
from ..graph import Graph, NodeKind, NodeRecord, NodeStatus
from .scrub import Scrubber

__all__ = ["CONTENT_LIMIT", "SEMCONV_VERSION", "SPAN_ATTRIBUTES", "SPAN_NAMES", "NodeTracer"]

INSTRUMENTATION_NAME = "rlm_graph"
SEMCONV_VERSION = "1.41.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
CONTENT_LIMIT = 2000
# The most characters of a label a server names (the model that answered, why it stopped).
LABEL_LIMIT = 200

# Attribute names used on spans; docs/tracing.md documents each (a test checks both ways).
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
    "gen_ai.tool.type",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "server.address",
    "server.port",
    "error.type",
    "rlm.node.id",
    "rlm.node.kind",
    "rlm.node.status",
    "rlm.completion.id",
    "rlm.depth",
    "rlm.iteration",
    "rlm.batch.index",
    "rlm.batch.size",
    "rlm.cost_usd",
    "rlm.queue_seconds",
    "rlm.stop_reason",
    "rlm.replayed",
    "rlm.hedge",
)

# Span name of each node kind ("{model}" and "{id}" are filled in from the record).
SPAN_NAMES = {
    NodeKind.ROOT_TURN: "chat {model}",
    NodeKind.LLM_CALL: "chat {model}",
    NodeKind.COMPACTION: "chat {model}",
    NodeKind.REPL_BLOCK: "execute_tool repl",
    NodeKind.RLM_CALL: "invoke_agent rlm",
    NodeKind.FUNCTION: "execute_tool {id}",
}

_OPERATION = {kind: name.split(" ", 1)[0] for kind, name in SPAN_NAMES.items()}
_KIND = {
    kind: SpanKind.CLIENT if op == "chat" else SpanKind.INTERNAL for kind, op in _OPERATION.items()
}
_NO_SPAN = nullcontext(INVALID_SPAN)


def _resumed_links(links: Iterable[tuple[str, str]]) -> list[Link]:
    """Span links to the run spans of earlier attempts (``rlm.link = resumes``)."""
    found = []
    for trace_id, span_id in links:
        try:
            context = SpanContext(
                trace_id=int(trace_id, 16),
                span_id=int(span_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
        except ValueError:  # a damaged journal row: no link rather than no run
            continue
        if context.is_valid:
            found.append(Link(context, {"rlm.link": "resumes"}))
    return found


# Fields a newer NodeRecord may carry; looked up once, since pydantic's __getattr__ for a
# missing field costs more than the rest of a span's attributes together.
_HAS_RESPONSE_MODEL = "response_model" in NodeRecord.model_fields
_HAS_SERVER_ADDRESS = "server_address" in NodeRecord.model_fields


def _is_disabled(provider: TracerProvider) -> bool:
    # The global provider before anyone sets one is a proxy that hands out no-op tracers.
    return isinstance(provider, (NoOpTracerProvider, ProxyTracerProvider))


def _span_name(record: NodeRecord) -> str:
    if _OPERATION[record.kind] == "chat":
        return utf8_text(f"chat {record.model}") if record.model else "chat"
    return utf8_text(SPAN_NAMES[record.kind].format(id=record.id))


def _server_table(providers: Iterable[Provider]) -> dict[Any, tuple[str, int | None]]:
    """(provider name, model) and provider name -> (server.address, server.port), from
    the providers' declared capabilities (else their ``base_url``)."""
    table: dict[Any, tuple[str, int | None]] = {}
    for provider in providers:
        capabilities = ProviderCapabilities.of(provider)
        address, port = capabilities.server_address, capabilities.server_port
        if not address and capabilities.base_url:
            parts = urlsplit(capabilities.base_url)
            address = parts.hostname
            port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
        if address:
            table.setdefault((provider.name, provider.model), (address, port))
            table.setdefault(provider.name, (address, port))
    return table


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class NodeTracer:
    """Opens the spans of one run (a completion with all its children, or a workflow).

    The engine makes one per run; `Run.execute` calls `node_span` around every node, and
    the facade wraps the whole run in `run_span`.

    Args:
        tracer_provider: where spans go; ``None`` uses OpenTelemetry's global provider
            (tracing stays disabled, at no cost, until someone sets an SDK provider).
        capture_content: put prompt, code and output text (truncated, scrubbed) on spans.
        content_limit: the most characters of captured text per attribute.
        providers: the engine's providers; their ``server_address``/``server_port`` (or
            ``base_url``) give ``server.address``/``server.port`` on model-call spans.
        secrets: literal values to keep out of spans (API keys from ``backend_kwargs``);
            secret-named environment variables are always redacted.
        graph: the run's graph; when given, ``after`` dependencies become span links.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        capture_content: bool = False,
        content_limit: int = CONTENT_LIMIT,
        providers: Iterable[Provider] = (),
        secrets: Iterable[str] = (),
        graph: Graph | None = None,
    ) -> None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.enabled = not _is_disabled(provider)
        self.capture_content = capture_content
        self.content_limit = content_limit
        self.graph = graph
        self._contexts: dict[str, SpanContext] = {}
        self._live: dict[str, Span] = {}  # the spans of the nodes running now
        self._root: Any = None
        self._anchor: tuple[float, int] | None = None
        self._last_end_ns = 0
        if self.enabled:
            self._tracer = provider.get_tracer(INSTRUMENTATION_NAME, schema_url=SCHEMA_URL)
            self._servers = _server_table(providers)
            self.scrubber = Scrubber(secrets)

    # -- the run ------------------------------------------------------------------------

    def run_span(
        self,
        name: str,
        attributes: Mapping[str, Any],
        links: Iterable[tuple[str, str]] = (),
    ) -> Any:
        """The span of a whole run, parent of every node span without a node parent.

        Args:
            name: ``"invoke_agent rlm"`` for a completion, ``"invoke_workflow"`` for a
                user's graph; the first word becomes ``gen_ai.operation.name``.
            attributes: more attributes (strings are scrubbed). Set ``rlm.stop_reason``
                on the yielded span when a limit stopped the run.
            links: ``(trace_id, span_id)`` hex pairs of earlier spans this run continues
                (a resumed run links to its first attempt's run span).

        Returns:
            A context manager yielding the span (a non-recording one when disabled).
        """
        if not self.enabled:
            return _NO_SPAN
        return self._run_span(name, attributes, links)

    @contextmanager
    def _run_span(
        self, name: str, attributes: Mapping[str, Any], links: Iterable[tuple[str, str]]
    ) -> Iterator[Span]:
        operation, _, agent = name.partition(" ")
        attrs: dict[str, Any] = {"gen_ai.operation.name": operation}
        if operation == "invoke_agent" and agent:
            attrs["gen_ai.agent.name"] = agent
        for key, value in attributes.items():
            if isinstance(value, str):
                value = self.scrubber.scrub(value)
            elif type(value) is int:
                value = _int64(value)
            attrs[key] = value
        span = self._tracer.start_span(
            name, kind=SpanKind.INTERNAL, attributes=attrs, links=_resumed_links(links) or None
        )
        outer, self._root = self._root, trace.set_span_in_context(span)
        try:
            yield span
        except BaseException as exc:
            stopped = _stopped_by(exc)
            if stopped is not None:  # cut, not failed: status UNSET, as its nodes'
                span.set_attribute("rlm.stop_reason", stopped)
            else:
                span.set_status(Status(StatusCode.ERROR, self._describe(message_of(exc))))
                span.set_attribute("error.type", type(exc).__name__)
            raise
        finally:
            self._root = outer
            span.end(end_time=max(time.time_ns(), self._last_end_ns))

    # -- propagation --------------------------------------------------------------------

    def activate(self, node_id: str) -> AbstractContextManager[None]:
        """Make node ``node_id``'s span the current OpenTelemetry context for a while.

        `call_model` wraps the provider's ``complete()`` in it, so that a provider can
        propagate the trace on its requests (``opentelemetry.propagate.inject(headers)``;
        `JSONProvider` does): a gateway's or vLLM's own spans then join the node's trace
        as its children; and so that what the provider notes (a retry's event) lands on
        the node's span while it is open. Does nothing when tracing is off or the node
        has no span.
        """
        if not self.enabled:
            return nullcontext()
        live = self._live.get(node_id)
        if live is not None:
            return _Current(trace.set_span_in_context(live))
        found = self._contexts.get(node_id)
        if found is None:
            return nullcontext()
        return _Current(trace.set_span_in_context(NonRecordingSpan(found)))

    # -- nodes --------------------------------------------------------------------------

    def node_span(self, record: NodeRecord, parent_id: str | None) -> Any:
        """The span of one node; its attributes are completed from the record at exit.

        Args:
            record: the node; ``submitted`` should be set on entry and ``end`` on exit
                (`Run.execute` does both), else the wall clock is used.
            parent_id: the node whose span is the parent; ``None`` (or an id without a
                span) means the run's span.

        Returns:
            A context manager yielding the span (a non-recording one when disabled).
        """
        if not self.enabled:
            return _NO_SPAN
        return _NodeSpan(self, record, parent_id)

    def _ns(self, clock: float | None) -> int:
        """Epoch nanoseconds for a time on the run's clock (trio's)."""
        now = time.time_ns()
        if clock is None:
            return now
        if self._anchor is None:
            self._anchor = (clock, now)
        return self._anchor[1] + int((clock - self._anchor[0]) * 1e9)

    def _start(self, record: NodeRecord, parent_id: str | None, name: str) -> Span:
        parent = self._contexts.get(parent_id) if parent_id else None
        context = trace.set_span_in_context(NonRecordingSpan(parent)) if parent else self._root
        span = self._tracer.start_span(
            name,
            context=context,
            kind=_KIND[record.kind],
            attributes=_start_attributes(record),
            links=self._links(record),
            start_time=self._ns(record.submitted),
        )
        self._contexts[record.id] = span.get_span_context()
        self._live[record.id] = span
        return span

    def _links(self, record: NodeRecord) -> list[Link] | None:
        if self.graph is None or record.id not in self.graph:
            return None
        contexts = self._contexts
        return [
            Link(contexts[dep])
            for dep in self.graph.predecessors(record.id, "after")
            if dep in contexts
        ] or None

    def _finish(
        self,
        span: Span,
        started_as: str,
        record: NodeRecord,
        failed: type[BaseException] | None,
    ) -> None:
        if span.is_recording():
            name = _span_name(record)
            if name != started_as:
                span.update_name(name)
            span.set_attributes(self._end_attributes(record))
            if record.status == NodeStatus.ERROR:
                span.set_status(Status(StatusCode.ERROR, self._describe(record.error or "")))
            elif failed is not None and not record.status.finished:
                # Run.execute records Exception and trio.Cancelled; this is anything else.
                span.set_attribute("error.type", failed.__name__)
                span.set_status(Status(StatusCode.ERROR, failed.__name__))
        end = self._ns(record.end)
        self._last_end_ns = max(self._last_end_ns, end)
        self._live.pop(record.id, None)
        span.end(end_time=end)

    def _describe(self, text: str) -> str:
        return _truncate(self.scrubber.scrub(text), 500)

    def _label(self, text: str) -> str:
        """A word the server chose (``gen_ai.response.model``, a finish reason): the
        server's to say, so scrubbed and bounded as any text it sends."""
        return _truncate(self.scrubber.scrub(text), LABEL_LIMIT)

    def _end_attributes(self, record: NodeRecord) -> dict[str, Any]:
        attrs: dict[str, Any] = {"rlm.node.status": record.status.value}
        if record.model:
            attrs["gen_ai.request.model"] = utf8_text(record.model)
        if record.provider:
            attrs["gen_ai.provider.name"] = utf8_text(record.provider)
        if _OPERATION[record.kind] == "chat":
            _chat_attributes(record, attrs, self._servers, self._label)
        if record.cost is not None:
            attrs["rlm.cost_usd"] = record.cost
        if record.replayed:
            attrs["rlm.replayed"] = True
        if record.hedge is not None:
            attrs["rlm.hedge"] = record.hedge
        if record.start is not None and record.submitted is not None:
            queued = record.start - record.submitted
            if queued > 0:
                attrs["rlm.queue_seconds"] = queued
        if record.status == NodeStatus.ERROR:
            attrs["error.type"] = utf8_text(record.error_type or "_OTHER")
        elif record.status == NodeStatus.CANCELLED:
            attrs["error.type"] = "cancelled"
        if self.capture_content:
            attrs.update(self._content(record))
        return attrs

    def _content(self, record: NodeRecord) -> dict[str, str]:
        """Captured text, on the attributes the GenAI conventions name for it."""
        # The node's whole content where it keeps it (record_content), else its previews.
        given = self._text(record.content_in or record.input_preview)
        got = self._text(record.content_out or record.output_preview)
        if _OPERATION[record.kind] == "chat":
            attrs = {}
            if given:
                attrs["gen_ai.input.messages"] = _messages("user", given)
            if got:
                reason = self._label(record.finish_reason or "stop")
                attrs["gen_ai.output.messages"] = _messages("assistant", got, reason)
            return attrs
        attrs = {}
        if given:
            attrs["gen_ai.tool.call.arguments"] = given
        if got:
            attrs["gen_ai.tool.call.result"] = got
        return attrs

    def _text(self, text: str) -> str:
        return _truncate(self.scrubber.scrub(text), self.content_limit) if text else ""


class _Current:
    """Attach an OpenTelemetry context on entry, detach it on exit (same task)."""

    __slots__ = ("_context", "_token")

    def __init__(self, context: Context) -> None:
        self._context = context

    def __enter__(self) -> None:
        self._token = otel_context.attach(self._context)

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._token)


class _NodeSpan:
    """The context manager `NodeTracer.node_span` returns (a class: this is a hot path)."""

    __slots__ = ("_name", "_parent_id", "_record", "_span", "_tracer")

    def __init__(self, tracer: NodeTracer, record: NodeRecord, parent_id: str | None) -> None:
        self._tracer = tracer
        self._record = record
        self._parent_id = parent_id

    def __enter__(self) -> Span:
        self._name = _span_name(self._record)
        self._span = self._tracer._start(self._record, self._parent_id, self._name)
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._tracer._finish(self._span, self._name, self._record, exc_type)


def _start_attributes(record: NodeRecord) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": _OPERATION[record.kind],
        "rlm.node.id": utf8_text(record.id),
        "rlm.node.kind": record.kind.value,
        "rlm.depth": record.depth,
        "rlm.completion.id": utf8_text(record.completion),
    }
    if record.kind == NodeKind.REPL_BLOCK:
        attrs["gen_ai.tool.name"] = "repl"
        attrs["gen_ai.tool.type"] = "extension"
    elif record.kind == NodeKind.FUNCTION:
        attrs["gen_ai.tool.name"] = attrs["rlm.node.id"]
        attrs["gen_ai.tool.type"] = "function"
    elif record.kind == NodeKind.RLM_CALL:
        attrs["gen_ai.agent.name"] = "rlm"
    if record.iteration is not None:
        attrs["rlm.iteration"] = record.iteration
    if record.batch_index is not None:
        attrs["rlm.batch.index"] = record.batch_index
        attrs["rlm.batch.size"] = record.batch_size or 0
    return attrs


def _chat_attributes(
    record: NodeRecord,
    attrs: dict[str, Any],
    servers: Mapping[Any, tuple[str, int | None]],
    label: Callable[[str], str],
) -> None:
    response_model = getattr(record, "response_model", None) if _HAS_RESPONSE_MODEL else None
    if response_model:
        attrs["gen_ai.response.model"] = label(response_model)
    if record.usage is not None:
        attrs["gen_ai.usage.input_tokens"] = _int64(record.usage.input_tokens)
        attrs["gen_ai.usage.output_tokens"] = _int64(record.usage.output_tokens)
    if record.finish_reason:
        attrs["gen_ai.response.finish_reasons"] = (label(record.finish_reason),)
    server = getattr(record, "server_address", None) if _HAS_SERVER_ADDRESS else None
    found = (server, None) if server else servers.get((record.provider, record.model))
    found = found or servers.get(record.provider)
    if found:
        attrs["server.address"] = found[0]
        if found[1] is not None:
            attrs["server.port"] = found[1]


_INT64 = range(-(2**63), 2**63)


def _int64(value: int) -> int | str:
    """``value``, or its digits as text when it is past what OTLP can carry (int64): a
    plugin's bogus count of 2**64 tokens made the OTLP encoder log a traceback and drop
    the attribute, and the Jaeger file hold a number no int64 reader takes."""
    return value if value in _INT64 else str(value)


def _messages(role: str, text: str, finish_reason: str | None = None) -> str:
    message: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": text}]}
    if finish_reason is not None:
        message["finish_reason"] = finish_reason
    return json.dumps([message], ensure_ascii=False)


def _stopped_by(exc: BaseException) -> str | None:
    """Why a run ended by ``exc`` was cut rather than failed: ``"interrupted"`` (Ctrl-C,
    SIGTERM), ``"cancelled"`` (its caller cancelled it: a stream left early, a cancel
    scope around it); None for a failure (anything else among them makes it one)."""
    leaves: list[BaseException] = []
    todo = [exc]
    while todo:
        one = todo.pop()
        if isinstance(one, BaseExceptionGroup):
            todo.extend(one.exceptions)
        else:
            leaves.append(one)
    if not all(isinstance(one, KeyboardInterrupt | trio.Cancelled) for one in leaves):
        return None
    return (
        "interrupted" if any(isinstance(one, KeyboardInterrupt) for one in leaves) else "cancelled"
    )
