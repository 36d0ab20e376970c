"""OpenTelemetry manners of a library: the application's global provider is used, the
``OTEL_*`` variables build nothing on their own, OTLP goes over gRPC when asked, and every
provider request carries the calling node's ``traceparent``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from rlm_graph import ConfigError, Engine, Workflow
from rlm_graph.testing import FakeOpenAIServer
from rlm_graph.tracing import configure_tracing, flush_tracing
from tests.support.tracing import Memory

GLOBAL_PROVIDER_SCRIPT = textwrap.dedent(
    """
    import json
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from rlm_graph import RLM

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "my-app"}),
        sampler=ParentBased(TraceIdRatioBased(1.0)),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    def respond(request):
        if any(m.role == "system" for m in request.messages):
            return "```repl\\nFINAL(llm_query('a'))\\n```"
        return "x"

    tracer = trace.get_tracer("my-app")
    with tracer.start_as_current_span("handle request") as outer:
        result = RLM("scripted", {"respond": respond}).completion("ctx")
    spans = exporter.get_finished_spans()
    print(json.dumps({
        "nodes": len(result.graph),
        "services": sorted({s.resource.attributes["service.name"] for s in spans}),
        "names": sorted(s.name for s in spans),
        "run_parent": [s.parent.span_id for s in spans if s.name == "invoke_agent rlm"][0],
        "outer": outer.get_span_context().span_id,
    }))
    """
)


@pytest.mark.processes
def test_the_applications_global_provider_is_used_and_otel_variables_build_nothing() -> None:
    """In a fresh process (a global provider can be set once): the application's provider
    gets every span, under the application's own span, with its resource; the OTLP and
    console variables set beside it do not make the library build a provider of its own
    (the console exporter would print to stderr)."""
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_plain_env(), **env},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    seen = json.loads(done.stdout)
    assert seen["services"] == ["my-app"]
    assert len(seen["names"]) == seen["nodes"] + 2  # every node, the run, the app's span
    assert "invoke_agent rlm" in seen["names"] and "handle request" in seen["names"]
    assert seen["run_parent"] == seen["outer"]


def _plain_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def test_under_asyncio_the_run_nests_under_the_callers_span(memory: Memory) -> None:
    import asyncio

    from rlm_graph import RLM

    rlm = RLM(
        "scripted",
        {"respond": lambda r: "```repl\nFINAL('ok')\n```"},
        tracer_provider=memory.provider,
    )

    async def handler() -> int:
        with memory.provider.get_tracer("app").start_as_current_span("GET /answer") as span:
            assert (await rlm.acompletion("ctx")).response == "ok"
            return span.get_span_context().span_id

    outer = asyncio.run(handler())
    (run,) = [s for s in memory.spans if s.name == "invoke_agent rlm"]
    assert run.parent is not None and run.parent.span_id == outer


def test_a_streamed_run_nests_under_the_callers_span_too(memory: Memory) -> None:
    """rlm.stream() and engine.stream() run on a thread of their own: the caller's
    context goes with them, as with completion()."""
    from rlm_graph import RLM

    rlm = RLM(
        "scripted",
        {"respond": lambda r: "```repl\nFINAL('ok')\n```"},
        tracer_provider=memory.provider,
    )
    engine = Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=memory.provider)
    wf = Workflow()
    wf.llm("q")
    tracer = memory.provider.get_tracer("app")
    with tracer.start_as_current_span("handle request") as outer:
        with rlm.stream("ctx") as events:
            kinds = [event.type for event in events]
        with engine.stream(wf) as events:
            kinds += [event.type for event in events]
    assert kinds.count("run_finished") == 2
    runs = [s for s in memory.spans if s.name in ("invoke_agent rlm", "invoke_workflow")]
    assert len(runs) == 2
    outer_id = outer.get_span_context().span_id
    assert all(run.parent is not None and run.parent.span_id == outer_id for run in runs)


# -- traceparent -----------------------------------------------------------------------


def test_provider_requests_carry_the_nodes_traceparent(memory: Memory) -> None:
    with FakeOpenAIServer(lambda body: "ok") as server:
        engine = Engine(
            "openai",
            {"model_name": "m", "base_url": server.base_url, "api_key": "sk-test-x"},
            tracer_provider=memory.provider,
        )
        wf = Workflow()
        refs = [wf.llm(f"q{i}") for i in range(3)]
        engine.run(wf)
        headers = [r.headers.get("traceparent") for r in server.requests]
    spans = memory.by_node()
    expected = {
        f"00-{spans[r.id].context.trace_id:032x}-{spans[r.id].context.span_id:016x}" for r in refs
    }
    assert len(headers) == 3 and all(h is not None for h in headers)
    assert {h.rpartition("-")[0] for h in headers if h} == expected  # version-trace-parent
    assert all(int(h.rpartition("-")[2], 16) & 1 for h in headers if h)  # flags: sampled


def test_no_traceparent_without_tracing() -> None:
    with FakeOpenAIServer(lambda body: "ok") as server:
        engine = Engine("openai", {"model_name": "m", "base_url": server.base_url, "api_key": "k"})
        wf = Workflow()
        wf.llm("q")
        engine.run(wf)
        assert "traceparent" not in server.requests[0].headers


# -- OTLP over gRPC --------------------------------------------------------------------


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.names: list[str] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        with self.lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.names.extend(span.name for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[_Collector, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = _Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(grace=None)


def test_otlp_over_grpc_when_the_protocol_says_so(
    collector: tuple[_Collector, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer, port = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    provider = configure_tracing("otlp")
    wf = Workflow()
    wf.function(lambda: 1, id="one")
    Engine("scripted", tracer_provider=provider).run(wf)
    assert flush_tracing(provider)
    provider.shutdown()  # type: ignore[attr-defined]
    assert sorted(servicer.names) == ["execute_tool one", "invoke_workflow"]


def test_grpc_without_the_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # What an installation without the extra looks like to the import system.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ConfigError, match=r"pip install 'rlm-graph\[grpc\]'"):
        configure_tracing("otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match="'http/protobuf'"):
        configure_tracing("otlp")


def test_a_skipped_model_node_has_its_span_named_with_its_model(memory: Memory) -> None:
    def broken() -> str:
        raise ValueError("no data")

    engine = Engine(
        "scripted",
        {"respond": lambda r: "ok", "model_name": "m-1"},
        tracer_provider=memory.provider,
    )
    wf = Workflow()
    data = wf.function(broken)
    wf.llm(lambda text: f"summarise {text}", data, id="summary")
    engine.run(wf)
    span = memory.by_node()["summary"]
    assert (span.attributes or {})["rlm.node.status"] == "skipped"
    assert span.name == "chat m-1" and (span.attributes or {})["gen_ai.request.model"] == "m-1"
