"""The real OTLP/HTTP exporter against a receiver on 127.0.0.1 that decodes the protobuf."""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from rlm_graph import Engine, Workflow
from rlm_graph.tracing import configure_tracing, flush_tracing, tracer_provider_from_env


class Receiver:
    """An OTLP/HTTP traces endpoint: POST /v1/traces, protobuf in, protobuf out."""

    def __init__(self) -> None:
        self.spans: list[dict[str, object]] = []
        self.requests = 0
        self.refuse = 0  # a status to answer with instead of taking the spans
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.refuse:
                    receiver.requests += 1
                    self.send_response(receiver.refuse)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(self.path, request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def add(self, path: str, request: ExportTraceServiceRequest) -> None:
        assert path == "/v1/traces"
        with self.lock:
            self.requests += 1
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        attrs = {a.key: a.value for a in span.attributes}
                        node = attrs.get("rlm.node.id")
                        self.spans.append(
                            {
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex(),
                                "trace_id": span.trace_id.hex(),
                                "name": span.name,
                                "node": node.string_value if node is not None else None,
                                "service": service,
                            }
                        )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    found.thread.start()
    try:
        yield found
    finally:
        found.server.shutdown()
        found.server.server_close()
        found.thread.join(timeout=5)


def fan_out(n: int) -> Workflow:
    wf = Workflow()
    refs = [wf.llm(f"chunk {i}") for i in range(n)]
    wf.function(lambda *parts: len(parts), *refs, id="count")
    return wf


def test_every_span_arrives_and_none_is_lost_at_shutdown(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    provider = configure_tracing("otlp", service_name="rlm-graph-test")
    engine = Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider)
    # More spans than one export batch (512), so the processor sends several requests.
    first = engine.run(fan_out(700))
    assert flush_tracing(provider)
    assert len(receiver.spans) == len(first.graph) + 1
    # Spans still queued when the provider shuts down are sent, not dropped.
    second = engine.run(fan_out(300))
    provider.shutdown()  # type: ignore[attr-defined]
    assert len(receiver.spans) == len(first.graph) + len(second.graph) + 2
    assert receiver.requests >= 3
    assert len({s["span_id"] for s in receiver.spans}) == len(receiver.spans)
    assert {s["service"] for s in receiver.spans} == {"rlm-graph-test"}
    traces: dict[object, list[dict[str, object]]] = {}
    for span in receiver.spans:
        traces.setdefault(span["trace_id"], []).append(span)
    assert len(traces) == 2
    for spans, result in zip(traces.values(), (first, second), strict=True):
        (root,) = [s for s in spans if s["node"] is None]
        assert root["name"] == "invoke_workflow" and root["parent_id"] == ""
        nodes = [s for s in spans if s["node"] is not None]
        assert sorted(s["node"] for s in nodes) == sorted(r.id for r in result.graph.records())  # type: ignore[type-var]
        assert all(s["parent_id"] == root["span_id"] for s in nodes)


def test_the_otel_endpoint_variable_alone_turns_otlp_on(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.removesuffix("/v1/traces"))
    provider = tracer_provider_from_env()
    assert provider is not None and tracer_provider_from_env() is provider
    Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider).run(fan_out(3))
    assert flush_tracing(provider)
    assert len(receiver.spans) == 5
    provider.shutdown()  # type: ignore[attr-defined]


def test_the_otel_variables_configure_a_completion_only_when_asked_and_it_is_flushed(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library does not build a provider behind its application's back: the variables
    alone export nothing; ``tracer_provider=tracer_provider_from_env()`` (what the CLI
    does) exports every span, flushed before completion() returns."""
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.removesuffix("/v1/traces"))
    from rlm_graph import RLM

    def respond(request: object) -> str:
        if any(m.role == "system" for m in request.messages):  # type: ignore[attr-defined]
            return "```repl\nFINAL(','.join(llm_query_batched(['a', 'b'])))\n```"
        return "x"

    RLM("scripted", {"respond": respond}).completion("ctx")
    assert receiver.spans == []
    provider = tracer_provider_from_env()
    assert provider is not None
    result = RLM("scripted", {"respond": respond}, tracer_provider=provider).completion("ctx")
    # No flush called: completion() flushed before returning.
    assert len(receiver.spans) == len(result.graph) + 1
    names = sorted(str(s["name"]) for s in receiver.spans)
    assert names.count("invoke_agent rlm") == 1 and names.count("execute_tool repl") == 1
    provider.shutdown()  # type: ignore[attr-defined]


def test_spans_a_collector_refuses_are_said_lost(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector answering 404 (a wrong path) lost every span while the command said
    nothing: the SDK's flush still reports success."""
    import io

    from rlm_graph.cli.trace import finish_tracing

    receiver.refuse = 404
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    provider = configure_tracing("otlp")
    Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider).run(fan_out(3))
    said = io.StringIO()
    finish_tracing(provider, said)
    assert receiver.requests >= 1 and receiver.spans == []
    assert said.getvalue().startswith(f"rlm-graph: the trace could not be sent to {receiver.url}")
    assert "(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)" in said.getvalue()


def test_the_endpoint_said_unreachable_is_said_without_its_query(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector's credential in the endpoint's query (``?key=...``, a signed URL's
    ``?sig=...``) was printed on stderr with the endpoint."""
    import io

    from rlm_graph.cli.trace import finish_tracing

    receiver.refuse = 404
    endpoint = f"{receiver.url}?key=Qu3ryK3yValue&sig=S1gnatureValue#T0kenFragment"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    provider = configure_tracing("otlp")
    Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider).run(fan_out(1))
    said = io.StringIO()
    finish_tracing(provider, said)
    assert said.getvalue().startswith(f"rlm-graph: the trace could not be sent to {receiver.url} ")
    for secret in ("Qu3ryK3yValue", "S1gnatureValue", "T0kenFragment", "?"):
        assert secret not in said.getvalue()


def half_a_character(tmp_path_factory: pytest.TempPathFactory) -> Workflow:
    """A workflow whose function fails naming a file that is not UTF-8: ``os.listdir``
    gives its name with a lone surrogate (PEP 383), and so does the error message."""
    folder = tmp_path_factory.mktemp("latin1")
    (folder / os.fsdecode(b"caf\xe9.txt")).touch()

    def read_first(_: str) -> str:
        raise ValueError(f"cannot parse {os.listdir(folder)[0]}")

    wf = Workflow()
    wf.function(read_first, wf.llm("hi", id="ask"), id=os.fsdecode(b"read-\xe9"))
    return wf


def test_half_a_character_on_a_span_loses_nothing_at_the_collector(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    provider = configure_tracing("otlp")
    engine = Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider)
    result = engine.run(half_a_character(tmp_path_factory))
    assert flush_tracing(provider)
    provider.shutdown()  # type: ignore[attr-defined]
    assert len(receiver.spans) == len(result.graph) + 1
    assert {s["node"] for s in receiver.spans} == {None, "ask", "read-\ufffd"}
