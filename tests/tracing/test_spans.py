"""Node spans of workflow runs: one per node, nested as the graph, GenAI attributes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.errors import ProviderError
from rlm_graph.graph import NodeKind, NodeRecord, NodeStatus
from rlm_graph.runtime.workflow import WorkflowRun, run_workflow
from rlm_graph.tracing import NodeTracer
from rlm_graph.tracing.spans import CONTENT_LIMIT
from tests.support.tracing import (
    KeyedPlugin,
    Memory,
    assert_nesting,
    attrs,
    parent_id,
    reply,
    span_id,
)

L = 1.0


def map_reduce(n: int = 5) -> Workflow:
    wf = Workflow()
    maps = [wf.llm(f"chunk {i}") for i in range(n)]
    reduced = wf.function(lambda *parts: "|".join(parts), *maps, id="reduce")
    wf.llm(lambda text: f"summarise {text}", reduced, id="final")
    return wf


def echo_engine(memory: Memory, **kwargs: object) -> Engine:
    backend = {"respond": lambda r: reply(f"echo:{r.prompt}", r), "latency": L}
    backend.update(kwargs.pop("backend_kwargs", {}))  # type: ignore[arg-type]
    return Engine("scripted", backend, tracer_provider=memory.provider, **kwargs)  # type: ignore[arg-type]


async def test_one_span_per_node_all_under_the_workflow_span(
    memory: Memory, autojump_clock: trio.testing.MockClock
) -> None:
    result = await echo_engine(memory).arun(map_reduce())
    spans = memory.by_node()
    (run,) = memory.run_spans()
    assert run.name == "invoke_workflow"
    assert attrs(run)["gen_ai.operation.name"] == "invoke_workflow"
    assert sorted(spans) == sorted(r.id for r in result.graph.records())
    assert len(memory.spans) == len(result.graph) + 1
    assert_nesting(result.graph, spans, run)
    assert all(parent_id(s) == span_id(run) for s in spans.values())


async def test_chat_span_attributes(memory: Memory, autojump_clock: trio.testing.MockClock) -> None:
    result = await echo_engine(memory, models={"scripted": {"input_usd_per_mtok": 1.0}}).arun(
        map_reduce(2)
    )
    span = memory.by_node()["final"]
    record = result.graph["final"]
    assert span.name == "chat scripted"
    assert span.kind == SpanKind.CLIENT
    assert span.status.status_code == StatusCode.UNSET
    attrs = dict(span.attributes or {})
    # The model that answered, once records carry it (NodeRecord.response_model).
    if "response_model" in NodeRecord.model_fields:
        assert attrs.pop("gen_ai.response.model") == "scripted"
    assert attrs == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.finish_reasons": ("stop",),
        "rlm.node.id": "final",
        "rlm.node.kind": "llm_call",
        "rlm.node.status": "ok",
        "rlm.completion.id": "root",
        "rlm.depth": 0,
        "rlm.cost_usd": pytest.approx(7e-6),
    }
    assert record.cost == pytest.approx(7e-6)


async def test_function_span_attributes(memory: Memory) -> None:
    await echo_engine(memory, backend_kwargs={"latency": 0}).arun(map_reduce(2))
    span = memory.by_node()["reduce"]
    assert span.name == "execute_tool reduce"
    assert span.kind == SpanKind.INTERNAL
    assert attrs(span)["gen_ai.operation.name"] == "execute_tool"
    assert attrs(span)["gen_ai.tool.name"] == "reduce"
    assert attrs(span)["gen_ai.tool.type"] == "function"
    assert attrs(span)["rlm.node.kind"] == "function"


async def test_a_failed_call_is_an_error_span_and_the_others_are_not(memory: Memory) -> None:
    def respond(request: object) -> object:
        if request.prompt == "chunk 2":  # type: ignore[attr-defined]
            raise ProviderError("upstream exploded", provider="scripted")
        return reply("ok", request)  # type: ignore[arg-type]

    engine = Engine("scripted", {"respond": respond}, tracer_provider=memory.provider)
    wf = Workflow()
    refs = [wf.llm(f"chunk {i}") for i in range(4)]
    await engine.arun(wf)
    spans = memory.by_node()
    failed = spans[refs[2].id]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "upstream exploded"
    assert attrs(failed)["error.type"] == "ProviderError"
    assert attrs(failed)["rlm.node.status"] == "error"
    assert "gen_ai.response.model" not in failed.attributes  # type: ignore[operator]
    others = [spans[r.id] for r in refs if r is not refs[2]]
    assert all(s.status.status_code == StatusCode.UNSET for s in others)
    assert all("error.type" not in (s.attributes or {}) for s in others)


async def test_cancelled_nodes_say_so(
    memory: Memory, autojump_clock: trio.testing.MockClock
) -> None:
    engine = echo_engine(memory, backend_kwargs={"max_concurrent": 1}, max_timeout=1.5 * L)
    wf = Workflow()
    for i in range(3):
        wf.llm(f"c{i}")
    result = await engine.arun(wf)
    assert result.stop_reason == "max_timeout"
    statuses = sorted(attrs(s)["rlm.node.status"] for s in memory.by_node().values())
    # One finished; one was cut off mid-call, one while waiting for the provider's slot.
    assert statuses == ["cancelled", "cancelled", "ok"]
    cancelled = next(
        s for s in memory.by_node().values() if attrs(s)["rlm.node.status"] == "cancelled"
    )
    assert attrs(cancelled)["error.type"] == "cancelled"


async def test_span_times_are_the_run_clock_queueing_included(
    memory: Memory, autojump_clock: trio.testing.MockClock
) -> None:
    engine = echo_engine(memory, backend_kwargs={"max_concurrent": 2})
    wf = Workflow()
    refs = [wf.llm(f"c{i}") for i in range(4)]
    await engine.arun(wf)
    spans = memory.by_node()
    durations = sorted(
        round((spans[r.id].end_time - spans[r.id].start_time) / 1e9, 6)
        for r in refs  # type: ignore[operator]
    )
    queued = sorted(spans[r.id].attributes.get("rlm.queue_seconds", 0.0) for r in refs)  # type: ignore[union-attr]
    # Two at a time: two calls ran at once for 1 L, two waited 1 L then ran for 1 L.
    assert durations == [L, L, 2 * L, 2 * L]
    assert queued == [0.0, 0.0, L, L]
    (run,) = memory.run_spans()
    assert run.start_time <= min(s.start_time for s in spans.values())  # type: ignore[operator,type-var]
    assert run.end_time >= max(s.end_time for s in spans.values())  # type: ignore[operator,type-var]


async def test_after_edges_become_span_links_when_the_tracer_has_the_graph(memory: Memory) -> None:
    engine = echo_engine(memory, backend_kwargs={"latency": 0})
    run = engine.new_run()
    run.tracer = NodeTracer(memory.provider, graph=run.graph)
    with run.tracer.run_span("invoke_workflow", {}):
        await run_workflow(run, WorkflowRun(map_reduce(3), None))
    spans = memory.by_node()
    linked = {span_id(spans[n]) for n in run.graph.predecessors("reduce", "after")}
    assert {link.context.span_id for link in spans["reduce"].links} == linked
    assert [link.context.span_id for link in spans["final"].links] == [span_id(spans["reduce"])]
    assert not spans["llm-1"].links


def test_no_sdk_provider_means_no_span_work() -> None:
    record = NodeRecord(id="a", kind=NodeKind.LLM_CALL)
    for tracer in (NodeTracer(), NodeTracer(NoOpTracerProvider())):
        assert not tracer.enabled
        first, second = tracer.node_span(record, None), tracer.node_span(record, "x")
        assert first is second  # one shared no-op context manager: nothing allocated
        with tracer.run_span("invoke_agent rlm", {}) as span, first as inner:
            assert not span.is_recording() and not inner.is_recording()


def test_content_is_captured_only_on_request_truncated_and_scrubbed(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLMG_TEST_DB_PASSWORD", "correct-horse-battery")
    secret = "sk-live-0123456789abcdef"
    record = NodeRecord(
        id="llm-1",
        kind=NodeKind.LLM_CALL,
        model="m",
        provider="keyed",
        input_preview=f"use {secret} and correct-horse-battery and literal-key-42 " + "x" * 500,
        output_preview="Authorization: Bearer abcdefghijklmnop",
        status=NodeStatus.OK,
    )
    plain = NodeTracer(memory.provider)
    with plain.node_span(record, None):
        pass
    captured = NodeTracer(
        memory.provider, capture_content=True, content_limit=100, secrets=["literal-key-42"]
    )
    with captured.node_span(record, None):
        pass
    without, with_ = memory.spans
    assert not any(k.startswith("gen_ai.input") for k in without.attributes or {})
    messages = json.loads(with_.attributes["gen_ai.input.messages"])  # type: ignore[arg-type,index]
    text = messages[0]["parts"][0]["content"]
    assert messages[0]["role"] == "user"
    assert len(text) == 100 and text.endswith("…")
    assert text.startswith("use [REDACTED] and [REDACTED] and [REDACTED] ")
    output = attrs(with_)["gen_ai.output.messages"]
    assert "abcdefghijklmnop" not in output  # type: ignore[operator]


def test_error_descriptions_are_scrubbed(memory: Memory) -> None:
    record = NodeRecord(
        id="llm-1",
        kind=NodeKind.LLM_CALL,
        status=NodeStatus.ERROR,
        error_type="ProviderAuthError",
        error="401 for key sk-proj-ABCDEFGHIJKLMNOP at https://x?api_key=hunter2hunter2",
    )
    with NodeTracer(memory.provider).node_span(record, None):
        pass
    (span,) = memory.spans
    assert span.status.description == "401 for key [REDACTED] at https://x?api_key=[REDACTED]"


def test_server_address_and_port_come_from_the_provider(memory: Memory) -> None:
    engine = Engine(
        "keyed",
        {"api_key": "sk-test-000000000000", "respond": lambda r: "hi"},
        plugins=[KeyedPlugin()],
        entry_points=False,
    )
    tracer = NodeTracer(memory.provider, providers=engine.providers)
    record = NodeRecord(
        id="turn-1",
        kind=NodeKind.ROOT_TURN,
        model="scripted",
        provider="keyed",
        status=NodeStatus.OK,
        iteration=1,
    )
    with tracer.node_span(record, None):
        pass
    (span,) = memory.spans
    assert attrs(span)["server.address"] == "api.example.com"
    assert attrs(span)["server.port"] == 8443
    assert attrs(span)["rlm.iteration"] == 1
    assert span.name == "chat scripted"


def test_a_non_exception_escape_still_ends_the_span_as_an_error(memory: Memory) -> None:
    record = NodeRecord(id="b", kind=NodeKind.REPL_BLOCK, status=NodeStatus.RUNNING)
    with pytest.raises(KeyboardInterrupt), NodeTracer(memory.provider).node_span(record, None):
        raise KeyboardInterrupt
    (span,) = memory.spans
    assert span.status.status_code == StatusCode.ERROR
    assert attrs(span)["error.type"] == "KeyboardInterrupt"
    assert span.name == "execute_tool repl"


async def test_run_span_names_the_agent_and_records_a_failure(memory: Memory) -> None:
    tracer = NodeTracer(memory.provider)
    with pytest.raises(RuntimeError), tracer.run_span("invoke_agent rlm", {"rlm.depth": 0}):
        raise RuntimeError("boom with sk-abcdefghijklmnopqrst")
    (span,) = memory.spans
    assert span.name == "invoke_agent rlm"
    assert attrs(span)["gen_ai.operation.name"] == "invoke_agent"
    assert attrs(span)["gen_ai.agent.name"] == "rlm"
    assert attrs(span)["error.type"] == "RuntimeError"
    assert span.status.description == "boom with [REDACTED]"


def test_captured_content_is_the_node_s_whole_text_up_to_the_limit(memory: Memory) -> None:
    """With the node's content kept (``record_content``, which ``--trace-content`` sets),
    a span carries up to `CONTENT_LIMIT` characters of it, not the 200 of a preview."""
    long_in, long_out = "q" * 5000, "a" * 700
    record = NodeRecord(
        id="llm-1",
        kind=NodeKind.LLM_CALL,
        model="m",
        provider="keyed",
        input_preview=long_in[:200],
        output_preview=long_out[:200],
        status=NodeStatus.OK,
    )
    record.keep_content(long_in, long_out)
    with NodeTracer(memory.provider, capture_content=True).node_span(record, None):
        pass
    (span,) = memory.spans
    given = json.loads(span.attributes["gen_ai.input.messages"])  # type: ignore[arg-type,index]
    got = json.loads(span.attributes["gen_ai.output.messages"])  # type: ignore[arg-type,index]
    assert len(given[0]["parts"][0]["content"]) == CONTENT_LIMIT
    assert got[0]["parts"][0]["content"] == long_out


async def test_a_run_cut_by_ctrl_c_or_by_its_caller_is_not_an_error(memory: Memory) -> None:
    """Its span keeps status UNSET and says why (`rlm.stop_reason`), as its nodes do: it
    was an ERROR with ``KeyboardInterrupt``, a nursery's group or trio's ``Cancelled``,
    and a report rebuilt from the trace lost "interrupted"."""
    tracer = NodeTracer(memory.provider)
    with trio.CancelScope() as caller:  # a stream left early cancels the run like this
        with tracer.run_span("invoke_agent rlm", {}):
            caller.cancel()
            await trio.sleep(1)
    with pytest.raises(KeyboardInterrupt), tracer.run_span("invoke_agent rlm", {}):
        raise KeyboardInterrupt
    group = BaseExceptionGroup("a nursery's", [KeyboardInterrupt(), trio.Cancelled._create()])
    with pytest.raises(BaseExceptionGroup), tracer.run_span("invoke_workflow", {}):
        raise group
    mixed = BaseExceptionGroup("a failure too", [KeyboardInterrupt(), RuntimeError("boom")])
    with pytest.raises(BaseExceptionGroup), tracer.run_span("invoke_workflow", {}):
        raise mixed
    cancelled, interrupted, in_group, failed = memory.spans
    for span, why in [
        (cancelled, "cancelled"),
        (interrupted, "interrupted"),
        (in_group, "interrupted"),
    ]:
        assert span.status.status_code == StatusCode.UNSET
        assert attrs(span)["rlm.stop_reason"] == why
        assert "error.type" not in attrs(span)
    assert failed.status.status_code == StatusCode.ERROR


def test_a_workflow_stopped_by_ctrl_c_says_so_on_its_span(memory: Memory) -> None:
    import os
    import signal

    engine = Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=memory.provider)
    wf = Workflow()

    async def press_ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await trio.sleep_forever()

    wf.function(press_ctrl_c, id="pressed")
    assert engine.run(wf).stop_reason == "interrupted"
    (run,) = memory.run_spans()
    assert run.status.status_code == StatusCode.UNSET
    assert attrs(run)["rlm.stop_reason"] == "interrupted"


def test_a_node_cut_by_ctrl_c_is_cancelled_on_its_span_not_an_error(memory: Memory) -> None:
    """Its span said ERROR, ``error.type=KeyboardInterrupt`` and ``rlm.node.status=
    running`` (which ``trace show`` counted as an error), where docs/tracing.md says it
    keeps UNSET and says ``cancelled``."""

    def interrupted(request: object) -> str:
        raise KeyboardInterrupt

    rlm = RLM("scripted", {"respond": interrupted}, tracer_provider=memory.provider)
    with pytest.raises(KeyboardInterrupt):
        rlm.completion("ctx", root_prompt="q")

    def in_a_batch(request: Any) -> str:  # the block's node meets it in a nursery's group
        if any(m.role == "system" for m in request.messages):
            return "```repl\nr = llm_query_batched(['a', 'b', 'c'])\nFINAL(str(r))\n```"
        raise KeyboardInterrupt

    rlm = RLM("scripted", {"respond": in_a_batch}, tracer_provider=memory.provider)
    with pytest.raises(KeyboardInterrupt):
        rlm.completion("ctx", root_prompt="q")
    kinds = [(attrs(s).get("rlm.node.kind"), attrs(s).get("rlm.node.status")) for s in memory.spans]
    assert kinds.count(("root_turn", "cancelled")) == 1  # the first run's; the second answered
    assert kinds.count(("repl_block", "cancelled")) == 1
    for span in memory.spans:
        if attrs(span).get("rlm.node.kind") not in ("repl_block", "llm_call") and (
            attrs(span).get("rlm.node.status") != "cancelled"
        ):
            continue  # the runs' own spans, the second run's turn
        assert span.status.status_code == StatusCode.UNSET, span.name
        assert attrs(span)["rlm.node.status"] == "cancelled"
        assert attrs(span)["error.type"] == "cancelled"
