"""Where spans go: OTLP/HTTP, trace files, the console, or nowhere.

Invariants:
    - Every provider built here exports through a ``BatchSpanProcessor``: ending a span
      only appends it to a queue, and a worker thread does the I/O, so tracing never
      blocks the trio loop. `flush_tracing` drains the queue; the engine calls it before
      ``completion()`` returns.
    - A library does not configure OpenTelemetry behind its application's back: the
      engine uses the provider it is given, else OpenTelemetry's global one (the
      application's: its sampler, resource and exporters). Only the CLI and an explicit
      call here (`configure_tracing`, `tracer_provider_from_env`) build an SDK provider.
    - `tracer_provider_from_env` honours the standard ``OTEL_*`` variables and builds at
      most one provider per distinct configuration per process (one worker thread, not
      one per engine).
    - OTLP goes over HTTP/protobuf, or over gRPC when ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``
      and the ``grpc`` extra (``opentelemetry-exporter-otlp-proto-grpc``) is installed.
    - ``"none"`` gives a ``NoOpTracerProvider``: the engine's tracer is then disabled at
      no cost, even when ``OTEL_*`` variables are set.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import NoOpTracerProvider, TracerProvider

from .._files import destination_problem
from ..errors import ConfigError
from .files import DEFAULT_FORMATS, TraceFileExporter, TraceFormat

__all__ = [
    "TRACE_DIR_ENV",
    "TraceMode",
    "close_tracing",
    "configure_tracing",
    "flush_tracing",
    "trace_files",
    "trace_mode_from_env",
    "tracer_provider_from_env",
]

TraceMode = Literal["otlp", "file", "console", "none"]
TRACE_MODES: tuple[str, ...] = get_args(TraceMode)
TRACE_DIR_ENV = "RLM_GRAPH_TRACE_DIR"
DEFAULT_TRACE_DIR = "traces"
DEFAULT_SERVICE_NAME = "rlm-graph"

_ENV_KEYS = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    TRACE_DIR_ENV,
)
_from_env: dict[tuple[str | None, ...], TracerProvider] = {}
_from_env_lock = threading.Lock()
_file_exporters: weakref.WeakKeyDictionary[TracerProvider, TraceFileExporter] = (
    weakref.WeakKeyDictionary()
)
_watched: weakref.WeakKeyDictionary[TracerProvider, _Watched] = weakref.WeakKeyDictionary()

FILE_QUEUE_SPANS = 1 << 20
"""Spans a trace file's processor holds while its writer catches up (the SDK's default,
2,048, drops the rest: a file trace is written whole)."""


def configure_tracing(
    mode: TraceMode,
    *,
    directory: str | os.PathLike[str] | None = None,
    formats: Sequence[TraceFormat] = DEFAULT_FORMATS,
    service_name: str | None = None,
    exporter: SpanExporter | None = None,
) -> TracerProvider:
    """A tracer provider that sends every span to one place.

    Args:
        mode: ``"otlp"`` (OTLP/HTTP protobuf; endpoint, headers and timeout from the
            standard ``OTEL_EXPORTER_OTLP_*`` variables, default ``http://localhost:4318``),
            ``"file"`` (trace files, see `TraceFileExporter`), ``"console"`` (JSON spans
            on stderr) or ``"none"``.
        directory: for ``"file"``: where trace files go (default ``$RLM_GRAPH_TRACE_DIR``
            or ``traces/``).
        formats: for ``"file"``: ``"jaeger"`` and/or ``"otlp"``.
        service_name: ``service.name`` of the resource, unless ``OTEL_SERVICE_NAME`` or
            ``OTEL_RESOURCE_ATTRIBUTES`` sets one (default ``"rlm-graph"``).
        exporter: use this exporter instead of the one ``mode`` names (tests, custom sinks).

    Returns:
        An SDK ``TracerProvider`` with a batch processor, or a ``NoOpTracerProvider`` for
        ``"none"``. Pass it as ``tracer_provider=`` and call `flush_tracing` when done.

    Raises:
        ConfigError: an unknown mode, an OTLP protocol other than ``http/protobuf`` and
            ``grpc``, ``grpc`` without the ``grpc`` extra installed, or ``OTEL_BSP_*``
            settings the SDK refuses or that are not whole numbers.
    """
    if mode not in TRACE_MODES:
        raise ConfigError(f"unknown trace mode {mode!r}; choose one of {', '.join(TRACE_MODES)}")
    if mode == "none":
        return NoOpTracerProvider()
    settings = _check_batch_settings(os.environ)
    provider = SDKTracerProvider(resource=_resource(service_name))
    exporter = exporter or _exporter(mode, directory, formats)
    try:
        if isinstance(exporter, TraceFileExporter):
            # A file keeps every span: the SDK's queue of 2,048 dropped spans of a run that
            # ended them faster than the file was written (half of a 20,000-node run's).
            settings.update(max_queue_size=FILE_QUEUE_SPANS, max_export_batch_size=2048)
        processor = BatchSpanProcessor(exporter, **settings)
    except ValueError as exc:  # the SDK's check of the OTEL_BSP_* values' range
        raise _batch_settings_refused(str(exc)) from None
    if isinstance(exporter, TraceFileExporter):
        _file_exporters[provider] = exporter
    if isinstance(exporter, _Watched):
        _watched[provider] = exporter
    provider.add_span_processor(processor)
    return provider


_BATCH_SETTINGS = {  # each variable, the SDK's keyword for it and the SDK's default
    "OTEL_BSP_SCHEDULE_DELAY": ("schedule_delay_millis", 5000),
    "OTEL_BSP_EXPORT_TIMEOUT": ("export_timeout_millis", 30000),
    "OTEL_BSP_MAX_QUEUE_SIZE": ("max_queue_size", 2048),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": ("max_export_batch_size", 512),
}


def _check_batch_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """Refuse an ``OTEL_BSP_*`` value that is not a whole number. The SDK reads them with
    ``int()`` too, but logs its own traceback and goes on with its default. An empty one
    is unset, as OpenTelemetry's specification says: returned is its default, given to
    the SDK by keyword (which then does not read the variable)."""
    unset: dict[str, Any] = {}
    for name, (keyword, default) in _BATCH_SETTINGS.items():
        value = environ.get(name)
        if value is None:
            continue
        if not value.strip():
            unset[keyword] = default
            continue
        try:
            int(value)
        except ValueError:
            raise _batch_settings_refused(f"{name} is not a whole number") from None
    return unset


def _batch_settings_refused(reason: str) -> ConfigError:
    bsp = [f"{k}={v!r}" for k, v in sorted(os.environ.items()) if k.startswith("OTEL_BSP_")]
    return ConfigError(
        f"the span batch settings are refused ({reason}): {', '.join(bsp) or 'none set'}; "
        "each must be a positive whole number, OTEL_BSP_MAX_EXPORT_BATCH_SIZE at most "
        "OTEL_BSP_MAX_QUEUE_SIZE"
    )


class _Watched(SpanExporter):
    """An exporter that remembers the spans it could not export: a collector that
    refused them (404, 400) answers at once, and the SDK's flush still says all is well."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.lost = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            self.lost += len(spans)
            raise
        if result is not SpanExportResult.SUCCESS:
            self.lost += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _exporter(
    mode: TraceMode, directory: str | os.PathLike[str] | None, formats: Sequence[TraceFormat]
) -> SpanExporter:
    if mode == "otlp":
        return _Watched(_otlp_exporter(_check_protocol(os.environ)))
    if mode == "file":
        folder = directory or os.environ.get(TRACE_DIR_ENV) or DEFAULT_TRACE_DIR
        problem = destination_problem(folder, folder=True)
        if problem is not None:  # said now, not after the run it was to record
            raise ConfigError(f"trace files cannot be written: {problem}")
        return TraceFileExporter(Path(folder), formats=formats)
    # stderr: on stdout the spans would mix with the answer `rlm-graph run` prints.
    return ConsoleSpanExporter(out=sys.stderr)


GRPC_EXTRA = "rlm-graph[grpc]"


def _check_protocol(environ: Mapping[str, str]) -> str:
    """The OTLP protocol the variables ask for: ``"http/protobuf"`` or ``"grpc"``."""
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol not in ("http/protobuf", "grpc"):
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported: use 'http/protobuf' "
            "(port 4318) or 'grpc' (port 4317, with the grpc extra installed)"
        )
    if protocol == "grpc" and importlib.util.find_spec(_GRPC_MODULE.rpartition(".")[0]) is None:
        raise ConfigError(
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the OTLP gRPC exporter: "
            f"pip install '{GRPC_EXTRA}' (opentelemetry-exporter-otlp-proto-grpc), or set "
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and use port 4318"
        )
    return protocol


_GRPC_MODULE = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"


def _otlp_exporter(protocol: str) -> SpanExporter:
    if protocol == "grpc":
        module = importlib.import_module(_GRPC_MODULE)
        exporter: SpanExporter = module.OTLPSpanExporter()
        return exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _resource(service_name: str | None) -> Resource:
    detected = Resource.create({})
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: service_name or DEFAULT_SERVICE_NAME}))
    from .._version import __version__

    return detected.merge(Resource({SERVICE_VERSION: __version__}))


def trace_mode_from_env(environ: Mapping[str, str] | None = None) -> TraceMode | None:
    """The trace mode the standard ``OTEL_*`` variables ask for, or ``None``.

    ``OTEL_SDK_DISABLED=true`` and ``OTEL_TRACES_EXPORTER=none`` give ``"none"``;
    ``OTEL_TRACES_EXPORTER`` of ``otlp`` or ``console`` gives that mode; otherwise a set
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` gives
    ``"otlp"``.

    Raises:
        ConfigError: ``OTEL_TRACES_EXPORTER`` names an exporter rlm-graph does not have.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "none"
    exporters = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if exporters:
        unknown = [e for e in exporters if e not in ("otlp", "console", "none")]
        if unknown:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={','.join(exporters)!r}: rlm-graph supports "
                "'otlp', 'console' and 'none'"
            )
        if len(exporters) > 1:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={','.join(exporters)!r}: rlm-graph exports to one "
                "place; name one exporter"
            )
        return exporters[0]  # type: ignore[return-value]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return "otlp"
    return None


def tracer_provider_from_env(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """The tracer provider the ``OTEL_*`` variables configure, or ``None`` if they don't.

    What ``rlm-graph run`` and ``demo`` use without ``--trace``; a program that wants the
    same asks for it explicitly (``RLM(..., tracer_provider=tracer_provider_from_env())``):
    the engine never builds one on its own. The same configuration gives the same
    provider for the whole process.

    Raises:
        ConfigError: see `trace_mode_from_env` and `configure_tracing`.
    """
    env = os.environ if environ is None else environ
    mode = trace_mode_from_env(env)
    if mode is None:
        return None
    key = tuple(env.get(name) for name in _ENV_KEYS)
    with _from_env_lock:
        found = _from_env.get(key)
        if found is None:
            if mode == "otlp":
                _check_protocol(env)
            found = _from_env[key] = configure_tracing(mode)
        return found


def flush_tracing(provider: TracerProvider | None, timeout_millis: int = 5_000) -> bool:
    """Export every span ended so far, waiting at most ``timeout_millis``.

    The wait is bounded even when the collector is down (the SDK's own flush is not):
    the flush runs in a helper thread, and whatever it has not sent by the deadline
    stays queued for the batch processor's next export or for shutdown.

    Call it where blocking is fine: after ``trio.run`` returns, or from trio through
    ``await trio.to_thread.run_sync(flush_tracing, provider)``.

    Args:
        provider: the provider spans went to; ``None`` means OpenTelemetry's global one.
        timeout_millis: the longest wait.

    Returns:
        ``True`` when everything was exported (or there was nothing to flush).
    """
    target = provider if provider is not None else trace.get_tracer_provider()
    force_flush = getattr(target, "force_flush", None)
    if force_flush is None:
        return True
    outcome: list[bool] = []

    def flush() -> None:
        outcome.append(bool(force_flush(timeout_millis)))

    worker = threading.Thread(target=flush, name="rlm-graph-trace-flush", daemon=True)
    worker.start()
    worker.join(timeout_millis / 1000)
    return bool(outcome and outcome[0])


def close_tracing(provider: TracerProvider | None, timeout_millis: int = 1_000) -> bool:
    """`flush_tracing`, then shut ``provider`` down, waiting at most ``timeout_millis``
    for each (and not for the shutdown when the flush could not send): for a program about
    to exit, which the SDK's own shutdown at exit would hold up for as long as its exporter
    retries a collector that is down (spans not sent by then are dropped). A provider
    writing trace files (``configure_tracing("file")``) is flushed and shut down whole,
    however long a large trace takes: a disk is not a collector that may be down.

    Returns:
        ``True`` when every span was exported (an OTLP collector refusing some is not).
    """
    if provider is not None and provider in _file_exporters:
        sent = flush_tracing(provider, 3_600_000)
        provider.shutdown()  # type: ignore[attr-defined]
        return sent
    watched = _watched.get(provider) if provider is not None else None
    sent = flush_tracing(provider, timeout_millis) and not (watched and watched.lost)
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        at_exit = getattr(provider, "_atexit_handler", None)  # the SDK's, unbounded
        if at_exit is not None:
            atexit.unregister(at_exit)
        worker = threading.Thread(target=shutdown, name="rlm-graph-trace-close", daemon=True)
        worker.start()
        worker.join(timeout_millis / 1000 if sent else 0)  # unsent: it would retry to no end
    return sent


def trace_files(provider: TracerProvider | None) -> list[Path]:
    """The trace files a ``"file"`` provider has written so far (flush first)."""
    exporter = _file_exporters.get(provider) if provider is not None else None
    return exporter.paths if exporter is not None else []
