"""Trace files: OTLP JSON Lines and Jaeger JSON carry every span, right ids and references,
read back into the same spans and graph, and never hold a secret."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.contracts import ChatRequest, ChatResponse, Usage
from rlm_graph.errors import ProviderAuthError
from rlm_graph.graph import Graph
from rlm_graph.runtime.workflow import WorkflowRun, run_workflow
from rlm_graph.tracing import (
    NodeTracer,
    TraceFileExporter,
    close_tracing,
    configure_tracing,
    load_trace,
    to_graph,
    trace_files,
)
from tests.support.tracing import KeyedPlugin, Memory, parent_id, span_id

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
API_KEY = "sk-planted-0123456789abcdefXYZ"
ENV_SECRET = "plain-env-secret-value-42"
LITERAL = "zebra-literal-777"


def keyed_respond(request: ChatRequest) -> str:
    if "bad" in request.prompt:
        raise ProviderAuthError(f"401 Unauthorized: invalid key {API_KEY}", provider="keyed")
    return f"done with {request.prompt[:40]}"


async def traced_workflow(memory: Memory, directory: Path) -> tuple[Graph, TraceFileExporter]:
    exporter = TraceFileExporter(directory)
    memory.provider.add_span_processor(BatchSpanProcessor(exporter))
    engine = Engine(
        "keyed",
        {"api_key": API_KEY, "respond": keyed_respond},
        plugins=[KeyedPlugin()],
        entry_points=False,
    )
    run = engine.new_run()
    run.tracer = NodeTracer(
        memory.provider,
        capture_content=True,
        graph=run.graph,
        secrets=[LITERAL, API_KEY],
        providers=engine.providers,
    )
    wf = Workflow()
    maps = [wf.llm(f"part {i} {LITERAL} {ENV_SECRET} {API_KEY}") for i in range(4)]
    bad = wf.llm("bad call", id="bad")
    joined = wf.function(lambda *parts: "|".join(parts), *maps, bad, id="join")
    wf.llm(lambda text: f"final over {len(text)}", joined, id="final")
    with run.tracer.run_span("invoke_workflow", {}):
        await run_workflow(run, WorkflowRun(wf, None))
    memory.provider.force_flush()
    return run.graph, exporter


def files(exporter: TraceFileExporter) -> tuple[Path, Path]:
    (jaeger,) = [p for p in exporter.paths if p.name.endswith(".jaeger.json")]
    (otlp,) = [p for p in exporter.paths if p.name.endswith(".otlp.jsonl")]
    return jaeger, otlp


def hex_span(span: ReadableSpan) -> str:
    return f"{span_id(span):016x}"


async def test_jaeger_json_carries_every_span_with_ids_times_and_references(
    memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLMG_TEST_SERVICE_TOKEN", ENV_SECRET)
    graph, exporter = await traced_workflow(memory, tmp_path)
    jaeger, _ = files(exporter)
    (trace,) = json.loads(jaeger.read_text())["data"]
    spans = {s["spanID"]: s for s in trace["spans"]}
    expected = {hex_span(s): s for s in memory.spans}
    assert spans.keys() == expected.keys()
    assert HEX32.match(trace["traceID"])
    assert trace["processes"]["p1"]["serviceName"]
    for sid, span in spans.items():
        source = expected[sid]
        assert HEX16.match(sid) and span["traceID"] == trace["traceID"]
        assert span["operationName"] == source.name
        assert span["startTime"] == source.start_time // 1000  # type: ignore[operator]
        assert span["duration"] == (source.end_time - source.start_time) // 1000  # type: ignore[operator]
        assert span["processID"] == "p1"
        child_of = [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"]
        want = [f"{parent_id(source):016x}"] if parent_id(source) else []
        assert child_of == want
        follows = {r["spanID"] for r in span["references"] if r["refType"] == "FOLLOWS_FROM"}
        assert follows == {f"{link.context.span_id:016x}" for link in source.links}
    bad = next(
        s
        for s in spans.values()
        if {"key": "rlm.node.id", "type": "string", "value": "bad"} in s["tags"]
    )
    tags = {t["key"]: t["value"] for t in bad["tags"]}
    assert tags["error"] is True and tags["otel.status_code"] == "ERROR"
    assert tags["error.type"] == "ProviderAuthError" and tags["span.kind"] == "client"
    assert graph["bad"].status.value == "error"


async def test_otlp_json_lines_carry_every_span_with_hex_ids(
    memory: Memory, tmp_path: Path
) -> None:
    _, exporter = await traced_workflow(memory, tmp_path)
    _, otlp = files(exporter)
    found = {}
    for line in otlp.read_text().splitlines():
        request = json.loads(line)
        for resource_spans in request["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    found[span["spanId"]] = span
    expected = {hex_span(s): s for s in memory.spans}
    assert found.keys() == expected.keys()
    for sid, span in found.items():
        source = expected[sid]
        assert HEX32.match(span["traceId"]) and HEX16.match(sid)
        assert span.get("parentSpanId", "") == (
            f"{parent_id(source):016x}" if parent_id(source) else ""
        )
        assert int(span["startTimeUnixNano"]) == source.start_time
        assert int(span["endTimeUnixNano"]) == source.end_time
        assert isinstance(span["kind"], int)
        assert {link["spanId"] for link in span.get("links", [])} == {
            f"{link.context.span_id:016x}" for link in source.links
        }


async def test_both_formats_read_back_to_the_same_spans_and_graph(
    memory: Memory, tmp_path: Path
) -> None:
    graph, exporter = await traced_workflow(memory, tmp_path)
    jaeger, otlp = files(exporter)
    from_jaeger, from_otlp = load_trace(jaeger), load_trace(otlp)
    assert len(from_jaeger) == len(memory.spans)

    def key(s: Any) -> tuple[Any, ...]:
        return (s.span_id, s.parent_id, s.name, s.start_us, s.duration_us, s.links, s.status)

    assert sorted(map(key, from_jaeger)) == sorted(map(key, from_otlp))
    for a, b in zip(from_jaeger, from_otlp, strict=True):
        assert a.attributes == b.attributes, {
            k: (a.attributes.get(k), b.attributes.get(k))
            for k in a.attributes.keys() | b.attributes.keys()
            if a.attributes.get(k) != b.attributes.get(k)
        }
    for spans in (from_jaeger, from_otlp):
        rebuilt = to_graph(spans)
        assert sorted(rebuilt.edges()) == sorted(graph.edges())
        for record in graph.records():
            again = rebuilt[record.id]
            assert (again.kind, again.status, again.model, again.usage) == (
                record.kind,
                record.status,
                record.model,
                record.usage,
            )


async def test_planted_secrets_appear_nowhere(
    memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLMG_TEST_SERVICE_TOKEN", ENV_SECRET)
    _, exporter = await traced_workflow(memory, tmp_path)
    text = "".join(path.read_text() for path in exporter.paths)
    assert "[REDACTED]" in text  # content was captured, and redacted
    for secret in (API_KEY, ENV_SECRET, LITERAL, "0123456789abcdef"):
        assert secret not in text


async def test_an_rlm_run_with_a_keyed_backend_leaks_no_key(
    memory: Memory, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    exporter = TraceFileExporter(tmp_path)
    memory.provider.add_span_processor(BatchSpanProcessor(exporter))
    code = "a = llm_query('bad ' + context)\nFINAL(llm_query('fine ' + context))"

    def respond(request: ChatRequest) -> str:
        if any(m.role == "system" for m in request.messages):
            return f"```repl\n{code}\n```"
        return keyed_respond(request)

    rlm = RLM(
        "keyed",
        {"api_key": API_KEY, "respond": respond},
        environment="local",
        plugins=[KeyedPlugin()],
        tracer_provider=memory.provider,
        trace_content=True,
    )
    result = await rlm.acompletion(f"my key is {API_KEY}", root_prompt=f"use {API_KEY}")
    memory.provider.force_flush()
    text = "".join(path.read_text() for path in exporter.paths)
    assert API_KEY not in text and "0123456789abcdef" not in text
    rebuilt = to_graph(load_trace(files(exporter)[0]))
    assert {r.id for r in rebuilt.records()} == {r.id for r in result.graph.records()}
    assert sorted(e for e in rebuilt.edges() if e[2] == "spawn") == sorted(
        e for e in result.graph.edges() if e[2] == "spawn"
    )


def test_the_jaeger_file_is_valid_after_every_batch(memory: Memory, tmp_path: Path) -> None:
    tracer = NodeTracer(memory.provider)
    with tracer.run_span("invoke_workflow", {}) as root:
        for i in range(4):
            context = trace.set_span_in_context(root)
            memory.provider.get_tracer("t").start_span(f"s{i}", context=context).end()
    spans = memory.spans
    exporter = TraceFileExporter(tmp_path, formats=["jaeger"])
    exporter.export(spans[:2])
    (path,) = exporter.paths
    assert len(json.loads(path.read_text())["data"][0]["spans"]) == 2
    exporter.export(spans[2:])
    assert len(json.loads(path.read_text())["data"][0]["spans"]) == len(spans)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_secret_in_the_service_name_is_redacted_in_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    monkeypatch.setenv("RLMG_TEST_SERVICE_TOKEN", ENV_SECRET)
    exporter = TraceFileExporter(tmp_path)
    provider = TracerProvider(resource=Resource({"service.name": f"svc-{ENV_SECRET}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("invoke_agent rlm"):
        pass
    provider.shutdown()
    jaeger, otlp = files(exporter)
    for path in (jaeger, otlp):
        assert ENV_SECRET not in path.read_text() and "[REDACTED]" in path.read_text()


def test_closing_a_file_trace_writes_every_span_however_long_it_takes(tmp_path: Path) -> None:
    """close_tracing bounds its wait for a collector that may be down, not for a disk:
    a trace of thousands of large spans is written whole."""
    from rlm_graph.tracing import close_tracing, configure_tracing, load_trace

    provider = configure_tracing("file", directory=tmp_path, formats=("otlp",))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("root"):
        for i in range(2000):
            with tracer.start_as_current_span(f"child-{i}") as span:
                span.set_attribute("rlm.text", "y" * 2000)
    assert close_tracing(provider)
    (written,) = tmp_path.glob("*.otlp.jsonl")
    assert len(load_trace(written)) == 2001


def test_a_file_trace_keeps_every_span_of_a_run_faster_than_its_writer(tmp_path: Path) -> None:
    """Spans ended faster than the file is written wait for it: the SDK's default queue
    (2,048) dropped the rest, half of a 20,000-node run's, with one log line."""
    import time

    from rlm_graph.tracing import TraceFileExporter, close_tracing, configure_tracing, load_trace

    class SlowDisk(TraceFileExporter):
        def export(self, spans: Any) -> Any:
            time.sleep(0.05)
            return super().export(spans)

    exporter = SlowDisk(tmp_path, formats=("otlp",))
    provider = configure_tracing("file", exporter=exporter)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("root"):
        for i in range(6000):
            with tracer.start_as_current_span(f"child-{i}"):
                pass
    assert close_tracing(provider)
    (written,) = tmp_path.glob("*.otlp.jsonl")
    assert len(load_trace(written)) == 6001


def test_half_a_character_in_a_failed_node_loses_no_trace_file(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A node failing with a file name that is not UTF-8 in its message: both trace
    files are written, and read back with U+FFFD for the half character."""
    from rlm_graph.tracing import close_tracing, configure_tracing, trace_files
    from tests.tracing.test_otlp_http import half_a_character

    provider = configure_tracing("file", directory=tmp_path)
    engine = Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider)
    engine.run(half_a_character(tmp_path_factory))
    assert close_tracing(provider)
    written = trace_files(provider)
    assert sorted(p.name.split(".", 1)[1] for p in written) == ["jaeger.json", "otlp.jsonl"]
    for path in written:
        (read,) = [s for s in load_trace(path) if s.attributes.get("rlm.node.id") == "read-\ufffd"]
        assert read.status_message == "cannot parse caf\ufffd.txt"


def test_a_span_of_another_tracer_with_half_a_character_loses_not_its_batch(
    tmp_path: Path,
) -> None:
    from rlm_graph.tracing import close_tracing, configure_tracing

    provider = configure_tracing("file", directory=tmp_path, formats=("otlp",))
    tracer = provider.get_tracer("an application's own")
    with tracer.start_as_current_span("outer"):
        with tracer.start_as_current_span(os.fsdecode(b"open caf\xe9")) as span:
            span.set_attribute("path", os.fsdecode(b"caf\xe9.txt"))
    assert close_tracing(provider)
    (written,) = tmp_path.glob("*.otlp.jsonl")
    spans = load_trace(written)
    assert sorted(s.name for s in spans) == ["open caf\ufffd", "outer"]


def test_counts_past_int64_and_an_infinite_cost_leave_both_files_valid(tmp_path: Path) -> None:
    """A plugin's bogus usage: 2**64 tokens made the OTLP encoder log a traceback and drop
    the attribute (and the Jaeger file held an int past int64); 10**305 tokens priced cost
    ``inf``, which the Jaeger file held as ``Infinity``, refused by strict JSON parsers
    such as the Jaeger UI's ``JSON.parse``."""
    usage = Usage(input_tokens=10**305, output_tokens=2**64)
    reply = ChatResponse(content="ok", model="m", usage=usage)
    provider = configure_tracing("file", directory=tmp_path)
    engine = Engine(
        "scripted",
        {"model_name": "m", "respond": lambda request: reply},
        models={"m": {"input_usd_per_mtok": 1e6}},
        tracer_provider=provider,
    )
    workflow = Workflow()
    workflow.llm("q", id="ask")
    assert engine.run(workflow).ok
    assert close_tracing(provider)
    jaeger, otlp = sorted(trace_files(provider), key=lambda path: path.suffix)

    def strict(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    (trace_data,) = json.loads(jaeger.read_text(), parse_constant=strict)["data"]
    (call,) = [s for s in trace_data["spans"] if s["operationName"] == "chat m"]
    tags = {tag["key"]: tag for tag in call["tags"]}
    assert tags["gen_ai.usage.input_tokens"] == {
        "key": "gen_ai.usage.input_tokens",
        "type": "string",
        "value": str(10**305),
    }
    assert tags["gen_ai.usage.output_tokens"]["value"] == "18446744073709551616"
    assert tags["rlm.cost_usd"] == {"key": "rlm.cost_usd", "type": "string", "value": "inf"}
    lines = [json.loads(line, parse_constant=strict) for line in otlp.read_text().splitlines()]
    (otlp_call,) = [
        span
        for line in lines
        for resource in line["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
        if span["name"] == "chat m"
    ]
    attributes = {a["key"]: a["value"] for a in otlp_call["attributes"]}
    assert attributes["gen_ai.usage.input_tokens"] == {"stringValue": str(10**305)}
    assert attributes["gen_ai.usage.output_tokens"] == {"stringValue": "18446744073709551616"}
    for path in (jaeger, otlp):  # and `rlm-graph trace show` reads both back
        (read,) = [s for s in load_trace(path) if s.name == "chat m"]
        assert read.attributes["gen_ai.usage.input_tokens"] == 10**305
        assert "rlm.cost_usd" not in read.attributes  # infinite: unknown
