"""Trace files that Jaeger's UI opens: OTLP JSON Lines and Jaeger JSON.

Two formats, one file of each per trace, named ``<UTC start>-<trace id>`` in the trace
directory (``traces/`` by default):

- ``*.otlp.jsonl``: one OTLP/JSON ``ExportTraceServiceRequest`` per line, one line per
  exported batch (what Jaeger 1.55+ accepts by upload, and what an OTLP/HTTP JSON
  receiver takes as a request body). Ids are hex, enums integers, times nanoseconds.
- ``*.jaeger.json``: Jaeger's query-API JSON, ``{"data": [{"traceID", "spans",
  "processes"}]}``, which any Jaeger UI opens from "Upload JSON" without a backend.
  Times are microseconds; the parent is a ``CHILD_OF`` reference and span links
  (a node's ``after`` dependencies) are ``FOLLOWS_FROM`` references.

Invariants:
    - Export runs in the batch processor's worker thread, never in the trio loop.
    - The Jaeger file of a trace is rewritten whole at every batch that touches the trace,
      so it is valid JSON holding every span exported so far; its buffer is dropped once
      the trace's local root span (the run's span, which ends last) has been written.
    - Every string (names, attribute values, status messages, events) passes a `Scrubber`
      on its way to disk, a second line of defence behind the tracer's own scrubbing.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped,unused-ignore]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from .._files import open_private, utf8_text, write_private
from ..errors import ConfigError
from .scrub import Scrubber

__all__ = [
    "DEFAULT_FORMATS",
    "SUFFIXES",
    "TraceFileExporter",
    "TraceFormat",
    "jaeger_span",
    "otlp_json",
    "utf8_span",
]

logger = logging.getLogger(__name__)

TraceFormat = Literal["jaeger", "otlp"]
DEFAULT_FORMATS: tuple[TraceFormat, ...] = ("jaeger", "otlp")
SUFFIXES: dict[str, str] = {"jaeger": ".jaeger.json", "otlp": ".otlp.jsonl"}

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})
_TEXT_KEYS = frozenset({"stringValue", "name", "message"})


# -- OTLP JSON ---------------------------------------------------------------------------


def otlp_json(spans: Sequence[ReadableSpan], scrub: Scrubber) -> dict[str, Any]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` holding ``spans`` (hex ids)."""
    try:
        encoded = encode_spans(spans)
    except UnicodeEncodeError:  # half a character in one span: not the batch's loss
        encoded = encode_spans([utf8_span(span) for span in spans])
    message = MessageToDict(encoded, use_integers_for_enums=True)
    return _fix_otlp(message, scrub)  # type: ignore[no-any-return]


def utf8_span(span: ReadableSpan) -> ReadableSpan:
    """``span`` with each lone surrogate of its texts as U+FFFD (`utf8_text`): what the
    OTLP encoder can write. Another tracer's span may hold one (ours never do)."""
    status = span.status
    if status.description:
        status = Status(status.status_code, utf8_text(status.description))
    return ReadableSpan(
        name=utf8_text(span.name),
        context=span.context,
        parent=span.parent,
        resource=Resource(_utf8_attributes(span.resource.attributes), span.resource.schema_url),
        attributes=_utf8_attributes(span.attributes),
        events=[
            Event(utf8_text(e.name), _utf8_attributes(e.attributes), e.timestamp)
            for e in span.events
        ],
        links=[Link(link.context, _utf8_attributes(link.attributes)) for link in span.links],
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _utf8_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {utf8_text(key): _utf8_value(value) for key, value in (attributes or {}).items()}


def _utf8_value(value: Any) -> Any:
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, tuple | list):
        return tuple(_utf8_value(item) for item in value)
    return value


def _fix_otlp(value: Any, scrub: Scrubber) -> Any:
    """Protobuf's JSON has base64 ids; OTLP/JSON wants hex. And scrub every text."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _ID_KEYS and isinstance(item, str):
                out[key] = base64.b64decode(item).hex()
            elif key in _TEXT_KEYS and isinstance(item, str):
                out[key] = scrub(item)
            else:
                out[key] = _fix_otlp(item, scrub)
        return out
    if isinstance(value, list):
        return [_fix_otlp(item, scrub) for item in value]
    return value


# -- Jaeger JSON -------------------------------------------------------------------------

_INT64 = range(-(2**63), 2**63)


def _tag(key: str, value: Any, scrub: Scrubber) -> dict[str, Any]:
    """A Jaeger tag. The file is read with strict JSON parsers (the Jaeger UI's
    ``JSON.parse``), and as int64: an int past int64 is its digits as a string, an
    infinite or NaN float is ``"inf"``, ``"-inf"`` or ``"nan"`` (``json.dumps`` writes
    ``Infinity``, which no strict parser takes)."""
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        if value in _INT64:
            return {"key": key, "type": "int64", "value": value}
        return {"key": key, "type": "string", "value": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"key": key, "type": "float64", "value": value}
        return {"key": key, "type": "string", "value": str(value)}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": scrub(value)}
    # Jaeger has no array tags; its own OTLP translator writes arrays as JSON text.
    return {"key": key, "type": "string", "value": scrub(json.dumps(list(value)))}


def _tags(attributes: Mapping[str, Any] | None, scrub: Scrubber) -> list[dict[str, Any]]:
    return [_tag(key, value, scrub) for key, value in (attributes or {}).items()]


def _span_tags(span: ReadableSpan, scrub: Scrubber) -> list[dict[str, Any]]:
    tags = _tags(span.attributes, scrub)
    if span.kind != SpanKind.INTERNAL:
        tags.append(_tag("span.kind", span.kind.name.lower(), scrub))
    if span.status.status_code != StatusCode.UNSET:
        tags.append(_tag("otel.status_code", span.status.status_code.name, scrub))
    if span.status.status_code == StatusCode.ERROR:
        tags.append(_tag("error", True, scrub))
        if span.status.description:
            tags.append(_tag("otel.status_description", span.status.description, scrub))
    scope = span.instrumentation_scope
    if scope is not None:
        tags.append(_tag("otel.scope.name", scope.name, scrub))
        if scope.version:
            tags.append(_tag("otel.scope.version", scope.version, scrub))
    return tags


def jaeger_span(span: ReadableSpan, process_id: str, scrub: Scrubber) -> dict[str, Any]:
    """One span in Jaeger's JSON (µs times, hex ids, ``CHILD_OF``/``FOLLOWS_FROM``)."""
    context = span.get_span_context()
    assert context is not None
    trace_id = f"{context.trace_id:032x}"
    references = []
    if span.parent is not None:
        references.append(
            {"refType": "CHILD_OF", "traceID": trace_id, "spanID": f"{span.parent.span_id:016x}"}
        )
    for link in span.links:
        references.append(
            {
                "refType": "FOLLOWS_FROM",
                "traceID": f"{link.context.trace_id:032x}",
                "spanID": f"{link.context.span_id:016x}",
            }
        )
    start = span.start_time or 0
    end = span.end_time or start
    return {
        "traceID": trace_id,
        "spanID": f"{context.span_id:016x}",
        "operationName": scrub(span.name),
        "references": references,
        "flags": int(context.trace_flags),
        "startTime": start // 1000,
        "duration": max(0, end - start) // 1000,
        "tags": _span_tags(span, scrub),
        "logs": [
            {
                "timestamp": event.timestamp // 1000,
                "fields": [_tag("event", event.name, scrub), *_tags(event.attributes, scrub)],
            }
            for event in span.events
        ],
        "processID": process_id,
        "warnings": None,
    }


class _JaegerTrace:
    """The spans of one trace so far, with their processes (one per resource). Each span
    is encoded once, when it comes: the file is the same document again at every batch,
    and encoding all of it each time made a long run's trace quadratic to write."""

    __slots__ = ("encoded", "processes", "resource_ids", "trace_id")

    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id
        self.encoded: list[str] = []  # each span's JSON
        self.processes: dict[str, dict[str, Any]] = {}
        self.resource_ids: dict[str, str] = {}

    @classmethod
    def load(cls, path: Path, trace_id: str) -> _JaegerTrace:
        found = cls(trace_id)
        data = json.loads(path.read_text(encoding="utf-8"))["data"][0]
        found.encoded = [_compact(span) for span in data["spans"]]
        found.processes = data["processes"]
        for pid, process in found.processes.items():
            found.resource_ids[json.dumps(process, sort_keys=True)] = pid
        return found

    def add(self, span: ReadableSpan, scrub: Scrubber) -> None:
        self.encoded.append(_compact(jaeger_span(span, self._process_id(span, scrub), scrub)))

    def _process_id(self, span: ReadableSpan, scrub: Scrubber) -> str:
        attributes = dict(span.resource.attributes)
        service = scrub(str(attributes.pop("service.name", "unknown_service")))
        process = {"serviceName": service, "tags": _tags(attributes, scrub)}
        key = json.dumps(process, sort_keys=True)
        pid = self.resource_ids.get(key)
        if pid is None:
            pid = self.resource_ids[key] = f"p{len(self.resource_ids) + 1}"
            self.processes[pid] = process
        return pid

    def text(self) -> str:
        """The trace's document (Jaeger's JSON), compact."""
        return (
            f'{{"data":[{{"traceID":{_compact(self.trace_id)},"spans":['
            + ",".join(self.encoded)
            + f'],"processes":{_compact(self.processes)},"warnings":null}}]}}'
        )


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# -- the exporter ------------------------------------------------------------------------


class TraceFileExporter(SpanExporter):
    """Writes every span to trace files, one file per trace and format.

    Args:
        directory: where the files go; created on the first export.
        formats: ``"jaeger"`` and/or ``"otlp"``.
        secrets: literal values to redact besides secret-named environment variables.

    Attributes:
        paths: every file written so far, in order of first write.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] = "traces",
        *,
        formats: Sequence[TraceFormat] = DEFAULT_FORMATS,
        secrets: Sequence[str] = (),
    ) -> None:
        unknown = [f for f in formats if f not in SUFFIXES]
        if unknown or not formats:
            raise ConfigError(
                f"trace file formats {list(formats)!r}: choose from {', '.join(SUFFIXES)}"
            )
        self.directory = Path(directory)
        self.formats = tuple(formats)
        self.paths: list[Path] = []
        self._scrub = Scrubber(secrets)
        self._stems: dict[str, str] = {}
        self._open: dict[str, _JaegerTrace] = {}
        self._lock = threading.Lock()
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        by_trace: dict[str, list[ReadableSpan]] = {}
        for span in spans:
            context = span.get_span_context()
            if context is not None:
                by_trace.setdefault(f"{context.trace_id:032x}", []).append(span)
        try:
            with self._lock:
                self.directory.mkdir(parents=True, exist_ok=True)
                for trace_id, group in by_trace.items():
                    self._write(trace_id, group)
        except OSError as exc:
            logger.error("rlm-graph could not write trace files in %s: %s", self.directory, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _path(self, trace_id: str, group: Sequence[ReadableSpan], fmt: str) -> Path:
        stem = self._stems.get(trace_id)
        if stem is None:
            start = min(span.start_time or 0 for span in group) / 1e9
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start))
            stem = self._stems[trace_id] = f"{stamp}-{trace_id}"
        path = self.directory / f"{stem}{SUFFIXES[fmt]}"
        if path not in self.paths:
            self.paths.append(path)
        return path

    def _write(self, trace_id: str, group: Sequence[ReadableSpan]) -> None:
        if "otlp" in self.formats:
            line = json.dumps(otlp_json(group, self._scrub), separators=(",", ":"))
            with open_private(self._path(trace_id, group, "otlp"), "a") as out:
                out.write(line + "\n")
        if "jaeger" in self.formats:
            path = self._path(trace_id, group, "jaeger")
            found = self._open.get(trace_id)
            if found is None:
                found = (
                    _JaegerTrace.load(path, trace_id) if path.exists() else _JaegerTrace(trace_id)
                )
                self._open[trace_id] = found
            for span in group:
                found.add(span, self._scrub)
            _replace(path, found.text())
            if any(span.parent is None or span.parent.is_remote for span in group):
                del self._open[trace_id]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._open.clear()


def _replace(path: Path, text: str) -> None:
    """Write ``path`` atomically: a reader never sees half a file (unless it is a file
    with other names, hard links, which `write_private` writes in place)."""
    write_private(path, text)
