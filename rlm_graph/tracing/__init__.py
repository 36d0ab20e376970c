"""Tracing: a span for every node, where the spans go, and trace files read back.

Layout (bottom to top):

- ``scrub``: `Scrubber`, which keeps API keys and other secrets out of every span.
- ``spans``: `NodeTracer` (one per run; `Run.execute` opens a node's span through it),
  the span names and the `SPAN_ATTRIBUTES` table docs/tracing.md documents.
- ``files``: `TraceFileExporter`, writing OTLP JSON Lines and Jaeger JSON trace files.
- ``config``: `configure_tracing` (``otlp``, ``file``, ``console``, ``none``),
  `tracer_provider_from_env` (the standard ``OTEL_*`` variables) and `flush_tracing`.
- ``fields``, ``reader`` and ``view``: `load_trace`, `to_graph` and `render_trace`,
  behind ``rlm-graph trace show|export`` (``fields`` checks a file's counts, amounts
  and times).

Only this package imports opentelemetry; the graph layer below it stays pure.
"""

from __future__ import annotations

from .config import (
    TraceMode as TraceMode,
    close_tracing as close_tracing,
    configure_tracing as configure_tracing,
    flush_tracing as flush_tracing,
    trace_files as trace_files,
    trace_mode_from_env as trace_mode_from_env,
    tracer_provider_from_env as tracer_provider_from_env,
)
from .files import TraceFileExporter as TraceFileExporter
from .reader import (
    TraceFileError as TraceFileError,
    TraceSpan as TraceSpan,
    choose_run as choose_run,
    load_trace as load_trace,
    to_graph as to_graph,
)
from .scrub import Scrubber as Scrubber, secret_values as secret_values
from .spans import (
    SEMCONV_VERSION as SEMCONV_VERSION,
    SPAN_ATTRIBUTES as SPAN_ATTRIBUTES,
    SPAN_NAMES as SPAN_NAMES,
    NodeTracer as NodeTracer,
)
from .view import render_trace as render_trace, render_traces as render_traces

__all__ = [
    "SEMCONV_VERSION",
    "SPAN_ATTRIBUTES",
    "SPAN_NAMES",
    "NodeTracer",
    "Scrubber",
    "TraceFileError",
    "TraceFileExporter",
    "TraceMode",
    "TraceSpan",
    "choose_run",
    "configure_tracing",
    "close_tracing",
    "flush_tracing",
    "load_trace",
    "render_trace",
    "render_traces",
    "secret_values",
    "to_graph",
    "trace_files",
    "trace_mode_from_env",
    "tracer_provider_from_env",
]
