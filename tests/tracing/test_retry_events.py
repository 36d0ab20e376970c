"""A retry leaves a trace: one ``rlm.retry`` event per retried attempt on the model
call's span (real HTTP against a fake server that fails first)."""

from __future__ import annotations

from rlm_graph import Engine, Workflow
from rlm_graph.testing import FakeOpenAIServer, Reply
from tests.support.http import KEY, openai_kwargs
from tests.support.tracing import Memory


async def test_each_retry_is_an_event_on_the_node_span(memory: Memory) -> None:
    replies = [Reply.error(500, f"boom {KEY}"), Reply.error(429, "slow", retry_after="0.01"), "ok"]
    with FakeOpenAIServer(replies=replies) as server:
        async with Engine(
            "openai", openai_kwargs(server), tracer_provider=memory.provider
        ) as engine:
            wf = Workflow()
            node = wf.llm("q")
            result = await engine.arun(wf)
    assert result[node] == "ok"
    span = memory.by_node()[node.id]
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    assert [name for name, _ in events] == ["rlm.retry", "rlm.retry"]
    assert [a["rlm.retry.attempt"] for _, a in events] == [2, 3]
    assert [a["rlm.retry.reason"] for _, a in events] == ["500", "429"]
    assert all(a["rlm.retry.wait_seconds"] >= 0 for _, a in events)
    assert KEY not in repr(events)
    assert result.graph[node.id].attempts == 3
