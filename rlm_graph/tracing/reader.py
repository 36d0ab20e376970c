"""Reading trace files back: spans from either format, and the graph they describe.

`load_trace` reads an OTLP JSON Lines file (ours or any OTLP/JSON producer's, hex or
base64 ids) or a Jaeger JSON file into `TraceSpan` records; `to_graph` rebuilds the run's
graph from the ``rlm.node.*`` attributes: a node's parent span gives its ``spawn`` edge,
and its span links (Jaeger ``FOLLOWS_FROM``) its ``after`` edges.

Invariants:
    - Times are integer microseconds since the epoch; a graph rebuilt from a trace has
      its times in seconds from the trace's first span.
    - What a file holds that cannot be read (a text where a count goes, a node kind or
      status of another version, a repeated node id, a Jaeger id that is not hex) is a
      `TraceFileError` naming the span and the field, never another exception. A NaN or
      infinite cost or queueing time (``"inf"`` in a Jaeger file), or one past a float's
      range, is unknown: read as absent. A count past int64 is written as its digits,
      and read back as the number.
    - A time is a whole number from 0 to 2^64 - 1 nanoseconds since the epoch (OTLP's
      fixed64; the year 2554): another (negative, of hundreds of digits, a text) is a
      `TraceFileError` naming the span and the field, so any time or duration converts
      to a float.
    - Spans appear once each, in start order, whatever order the file holds them in.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .._files import UnreadableFile, read_once
from ..contracts import Usage
from ..errors import GraphError
from ..graph import Graph, NodeKind, NodeRecord, NodeStatus
from .fields import (
    TraceFileError,
    checked,
    jaeger_times,
    listed,
    one_line,
    shown,
    span_named,
    time_ns,
)

__all__ = [
    "TraceFileError",
    "TraceSpan",
    "choose_run",
    "load_trace",
    "parse_trace",
    "split_runs",
    "split_traces",
    "to_graph",
]

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}
# Jaeger has no array tags: arrays travel as JSON text, which a reader cannot tell from a
# string attribute holding JSON (gen_ai.input.messages); decode only the known arrays.
_ARRAY_ATTRIBUTES = frozenset({"gen_ai.response.finish_reasons"})
_HEX = frozenset("0123456789abcdef")
_JAEGER_SPECIAL = frozenset(
    {
        "span.kind",
        "otel.status_code",
        "otel.status_description",
        "error",
        "otel.scope.name",
        "otel.scope.version",
    }
)


class TraceSpan(BaseModel):
    """One span read from a trace file.

    Attributes:
        start_us, duration_us: epoch microseconds and length in microseconds.
        links: span ids this span follows from (its node's ``after`` dependencies).
        service: ``service.name`` of the process that emitted it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    trace_id: str
    span_id: str
    parent_id: str | None = None
    name: str
    kind: str = "internal"
    start_us: int
    duration_us: int
    attributes: dict[str, Any] = Field(default_factory=dict)
    status: Literal["unset", "ok", "error"] = "unset"
    status_message: str = ""
    links: tuple[str, ...] = ()
    service: str = ""

    @property
    def end_us(self) -> int:
        return self.start_us + self.duration_us

    @property
    def node_id(self) -> str | None:
        value = self.attributes.get("rlm.node.id")
        return str(value) if value is not None else None


_A_TRACE = "give a trace file (OTLP JSON Lines or Jaeger JSON)"


def load_trace(path: str | os.PathLike[str]) -> list[TraceSpan]:
    """Every span of a trace file, in start order. The file is read once
    (`rlm_graph._files.read_once`): a pipe works, a device or a named pipe nobody writes
    to is refused.

    Raises:
        TraceFileError: the file is missing, a folder, a device, or neither OTLP JSON
            (Lines) nor Jaeger JSON.
    """
    try:
        data = read_once(path, wanted=_A_TRACE) or b""  # no ``stop``: never None
    except UnreadableFile as exc:
        raise TraceFileError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceFileError(
            f"{os.fspath(path)}: not a trace file (not UTF-8 text); a trace file is OTLP JSON "
            "Lines or Jaeger JSON as written by rlm-graph --trace file (a journal or a graph "
            "JSON: use rlm-graph trace export or rlm-graph report)"
        ) from None
    try:
        return parse_trace(text)
    except TraceFileError as exc:
        raise TraceFileError(f"{os.fspath(path)}: {exc}") from None


def parse_trace(text: str) -> list[TraceSpan]:
    """`load_trace` for text already read."""
    try:
        documents = _documents(text)
        spans = list(_spans(documents))
    except RecursionError:  # json's decoder recurses once per level
        raise TraceFileError(
            "malformed trace: its JSON is nested too deep to read; expected OTLP JSON Lines "
            "or Jaeger JSON as written by rlm-graph --trace file"
        ) from None
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        OverflowError,
        binascii.Error,
    ) as exc:
        if isinstance(exc, TraceFileError):
            raise
        raise TraceFileError(
            f"malformed trace ({type(exc).__name__}: {one_line(exc)}); expected OTLP JSON Lines or "
            "Jaeger JSON as written by rlm-graph --trace file"
        ) from None
    unique = {(span.trace_id, span.span_id): span for span in spans}
    return sorted(unique.values(), key=lambda span: (span.start_us, -span.duration_us))


def _documents(text: str) -> list[Any]:
    stripped = text.strip()
    if not stripped:
        raise TraceFileError("the file is empty")
    try:
        return [json.loads(stripped)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in stripped.splitlines() if line.strip()]


def _spans(documents: Iterable[Any]) -> Iterator[TraceSpan]:
    for document in documents:
        if isinstance(document, dict) and "data" in document:
            yield from _jaeger(document)
        elif isinstance(document, dict) and "resourceSpans" in document:
            yield from _otlp(document)
        else:
            raise TraceFileError(
                'not a trace: expected Jaeger JSON ({"data": [...]}) or OTLP JSON '
                '({"resourceSpans": [...]}) on every line'
            )


# -- OTLP JSON ---------------------------------------------------------------------------


def _hex_id(value: str, length: int) -> str:
    if len(value) == length and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    return base64.b64decode(value).hex()


def _any_value(value: Mapping[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return _attributes(value["kvlistValue"].get("values", []))
    return None


def _attributes(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _any_value(item.get("value", {})) for item in items}


def _enum(value: Any, names: Mapping[int, str], prefix: str) -> str:
    if isinstance(value, str) and not value.isdigit():
        return value.removeprefix(prefix).lower()
    return names.get(int(value or 0), names[0])


def _otlp(document: Mapping[str, Any]) -> Iterator[TraceSpan]:
    for resource_spans in document["resourceSpans"]:
        resource = _attributes(resource_spans.get("resource", {}).get("attributes", []))
        service = str(resource.get("service.name", ""))
        scopes = resource_spans.get("scopeSpans") or resource_spans.get(
            "instrumentationLibrarySpans", []
        )
        for scope_spans in scopes:
            for span in scope_spans.get("spans", []):
                yield _otlp_span(span, service)


def _otlp_span(span: Mapping[str, Any], service: str) -> TraceSpan:
    start = time_ns(span, "startTimeUnixNano", span["startTimeUnixNano"], 1)
    end = time_ns(span, "endTimeUnixNano", span.get("endTimeUnixNano") or start, 1)
    status = span.get("status", {})
    parent = span.get("parentSpanId") or None
    return TraceSpan(
        trace_id=_hex_id(span["traceId"], 32),
        span_id=_hex_id(span["spanId"], 16),
        parent_id=_hex_id(parent, 16) if parent else None,
        name=span["name"],
        kind=_enum(span.get("kind", 0), _KINDS, "SPAN_KIND_"),
        start_us=start // 1000,
        duration_us=max(0, end - start) // 1000,
        attributes=checked(_attributes(span.get("attributes", [])), span),
        status=_enum(status.get("code", 0), _STATUS, "STATUS_CODE_"),  # type: ignore[arg-type]
        status_message=status.get("message", ""),
        links=tuple(_hex_id(link["spanId"], 16) for link in span.get("links", [])),
        service=service,
    )


# -- Jaeger JSON -------------------------------------------------------------------------


def _tag_value(tag: Mapping[str, Any]) -> Any:
    value, kind = tag.get("value"), tag.get("type", "string")
    key = tag.get("key")
    if kind == "int64":
        return int(value)  # type: ignore[arg-type]
    if kind == "float64":
        return float(value)  # type: ignore[arg-type]
    if kind == "bool":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    if key in _ARRAY_ATTRIBUTES and isinstance(value, str) and value.startswith("["):
        try:
            decoded = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            return value
        return decoded if isinstance(decoded, list) else value
    return value


def _jaeger(document: Mapping[str, Any]) -> Iterator[TraceSpan]:
    for trace in document["data"]:
        processes = trace.get("processes") or {}
        for span in trace["spans"]:
            yield _jaeger_span(span, processes)


def _jaeger_span(span: Mapping[str, Any], processes: Mapping[str, Any]) -> TraceSpan:
    tags = {tag["key"]: _tag_value(tag) for tag in span.get("tags") or []}
    references = span.get("references") or []
    parents = [r["spanID"] for r in references if r.get("refType") == "CHILD_OF"]
    if not parents and span.get("parentSpanID"):
        parents = [span["parentSpanID"]]
    status = str(tags.get("otel.status_code", "unset")).lower()
    if tags.get("error") is True:
        status = "error"
    process = processes.get(span.get("processID", ""), {})
    start, duration = jaeger_times(span)
    return TraceSpan(
        trace_id=_jaeger_id(span["traceID"], 32, "traceID"),
        span_id=_jaeger_id(span["spanID"], 16, "spanID"),
        parent_id=_jaeger_id(parents[0], 16, "parent spanID") if parents else None,
        name=span["operationName"],
        kind=str(tags.get("span.kind", "internal")),
        start_us=start,
        duration_us=duration,
        attributes=checked({k: v for k, v in tags.items() if k not in _JAEGER_SPECIAL}, span),
        status=status if status in ("unset", "ok", "error") else "unset",  # type: ignore[arg-type]
        status_message=str(tags.get("otel.status_description", "")),
        links=tuple(
            _jaeger_id(r["spanID"], 16, "reference spanID")
            for r in references
            if r.get("refType") == "FOLLOWS_FROM"
        ),
        service=str(process.get("serviceName", "")),
    )


def _jaeger_id(value: Any, length: int, field: str) -> str:
    """A Jaeger id as hex of ``length`` digits (Jaeger drops leading zeros)."""
    text = value.lower() if isinstance(value, str) else ""
    if not 0 < len(text) <= length or not set(text) <= _HEX:
        raise TraceFileError(
            f"a Jaeger {field} is {shown(value)}, not hex of at most {length} digits"
        )
    return text.rjust(length, "0")


# -- the graph ---------------------------------------------------------------------------


def split_traces(spans: Sequence[TraceSpan]) -> dict[str, list[TraceSpan]]:
    """Spans by trace id, traces in order of their first span."""
    traces: dict[str, list[TraceSpan]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def split_runs(spans: Sequence[TraceSpan]) -> dict[str, list[TraceSpan]]:
    """Spans by run: a trace holding one run is keyed by its trace id; one holding
    several (a program that ran ``completion()`` twice under a span of its own) by
    ``<trace id>/<run span id>`` for each, its run span and the spans below it."""
    runs: dict[str, list[TraceSpan]] = {}
    for trace_id, group in split_traces(spans).items():
        heads = [s for s in group if s.node_id is None and s.name.startswith(_RUN_SPANS)]
        if len(heads) <= 1:
            runs[trace_id] = group
            continue
        by_id = {span.span_id: span for span in group}
        keys = {head.span_id: f"{trace_id}/{head.span_id}" for head in heads}
        for span in group:
            above: TraceSpan | None = span
            for _ in range(len(group)):  # a file's parents may loop: never more steps
                if above is None or above.span_id in keys:
                    break
                above = by_id.get(above.parent_id or "")
            if above is not None and above.span_id in keys:
                runs.setdefault(keys[above.span_id], []).append(span)
    return runs


_RUN_SPANS = ("invoke_agent", "invoke_workflow")


def choose_run(spans: Sequence[TraceSpan], trace_id: str | None = None) -> list[TraceSpan]:
    """The spans of the one run ``trace_id`` names (a trace id, or ``<trace id>/<run
    span id>`` where a trace holds several runs); with no ``trace_id``, the file's only one.

    Raises:
        TraceFileError: several runs and no ``trace_id`` naming one, or an unknown one.
    """
    runs = split_runs(spans)
    if trace_id is None and len(runs) > 1:
        raise TraceFileError(
            f"the file holds {len(runs)} runs ({listed(runs)}); choose one with --trace-id"
        )
    chosen = runs.get(trace_id) if trace_id else next(iter(runs.values()), [])
    if chosen is None:
        several = [key for key in runs if key.startswith(f"{trace_id}/")]
        if several:
            raise TraceFileError(
                f"trace {trace_id} holds {len(several)} runs ({listed(several)}); choose "
                "one with --trace-id"
            )
        raise TraceFileError(f"no trace {shown(trace_id)} in the file; it holds {listed(runs)}")
    return chosen


def to_graph(spans: Sequence[TraceSpan], trace_id: str | None = None) -> Graph:
    """The graph of the run a trace recorded.

    Args:
        spans: spans of a trace file (`load_trace`).
        trace_id: which run, when the file holds several (`choose_run`).

    Raises:
        TraceFileError: several runs and no ``trace_id``, an unknown ``trace_id``, or no
            span with ``rlm.node.*`` attributes.
    """
    chosen = choose_run(spans, trace_id)
    nodes = [span for span in chosen if span.node_id is not None]
    if not nodes:
        raise TraceFileError(
            "no span of this trace has rlm.node.* attributes: not an rlm-graph run"
        )
    origin = min(span.start_us for span in chosen)
    node_of = {span.span_id: str(span.node_id) for span in nodes}
    graph = Graph()
    for span in nodes:
        try:
            record = _record(span, origin)
        except (TypeError, ValueError, OverflowError) as exc:  # pydantic's; ours pass through
            if isinstance(exc, TraceFileError):
                raise
            raise TraceFileError(f"{_named(span)}: {one_line(exc)}") from None
        if record.id in graph:
            raise TraceFileError(
                f"{_named(span)}: rlm.node.id {shown(record.id)} is another span's too; a "
                "node has one span"
            )
        graph.add(record)
    try:
        for span in nodes:
            for source, kind in _edges(span, node_of, graph):
                graph.add_edge(source, str(span.node_id), kind)
    except GraphError as exc:
        raise TraceFileError(f"the trace does not describe a graph: {one_line(exc)}") from None
    return graph


def _edges(
    span: TraceSpan, node_of: Mapping[str, str], graph: Graph
) -> Iterator[tuple[str, Literal["after", "spawn"]]]:
    """A node's edges: its links are ``after`` edges; its parent span is the node that
    spawned it, except for a REPL block, whose span sits in its turn's but runs after it."""
    for link in span.links:
        if link in node_of:
            yield node_of[link], "after"
    parent = node_of.get(span.parent_id or "")
    if parent is None:
        return
    block_in_turn = (
        span.attributes.get("rlm.node.kind") == NodeKind.REPL_BLOCK.value
        and graph[parent].kind == NodeKind.ROOT_TURN
    )
    if not (block_in_turn and parent in {node_of.get(link) for link in span.links}):
        yield parent, "after" if block_in_turn else "spawn"


def _record(span: TraceSpan, origin_us: int) -> NodeRecord:
    attrs = span.attributes
    submitted = (span.start_us - origin_us) / 1e6
    queued = float(attrs.get("rlm.queue_seconds", 0.0))
    status = _known(
        span, "rlm.node.status", NodeStatus, "error" if span.status == "error" else "ok"
    )
    usage = None
    if "gen_ai.usage.input_tokens" in attrs or "gen_ai.usage.output_tokens" in attrs:
        usage = Usage(
            input_tokens=attrs.get("gen_ai.usage.input_tokens", 0),
            output_tokens=attrs.get("gen_ai.usage.output_tokens", 0),
        )
    reasons = attrs.get("gen_ai.response.finish_reasons") or []
    failed = status == NodeStatus.ERROR
    return NodeRecord(
        id=str(attrs["rlm.node.id"]),
        kind=_known(span, "rlm.node.kind", NodeKind, "function"),
        depth=attrs.get("rlm.depth", 0),
        completion=str(attrs.get("rlm.completion.id", "root")),
        model=_text(attrs.get("gen_ai.request.model")),
        provider=_text(attrs.get("gen_ai.provider.name")),
        iteration=attrs.get("rlm.iteration"),
        batch_index=attrs.get("rlm.batch.index"),
        batch_size=attrs.get("rlm.batch.size"),
        status=status,
        submitted=submitted,
        start=submitted + queued,
        end=(span.end_us - origin_us) / 1e6,
        wall_start=span.start_us / 1e6 + queued,
        usage=usage,
        cost=attrs.get("rlm.cost_usd"),
        error=span.status_message or None if failed else None,
        error_type=_text(attrs.get("error.type")) if failed else None,
        finish_reason=str(reasons[0]) if isinstance(reasons, list) and reasons else None,
    )


def _known(span: TraceSpan, key: str, kind: type[Any], default: str) -> Any:
    """The member of the enum ``kind`` that attribute ``key`` names."""
    value = span.attributes.get(key) or default
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(member.value for member in kind)
        raise TraceFileError(
            f"{_named(span)}: {key} is {shown(value)}, which this "
            f"version does not know (it knows {names}); a trace of a newer rlm-graph?"
        ) from None


def _named(span: TraceSpan) -> str:
    return span_named(span.span_id, span.name)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
