"""Tests of the echo provider over real HTTP, against the fake Echo API."""

from __future__ import annotations

import pytest

from rlm_graph import Engine, Workflow
from rlm_graph.errors import ProviderAuthError
from rlm_graph.testing import Reply
from rlm_graph_echo import FakeEchoServer


async def test_answers_by_backend_name() -> None:
    with FakeEchoServer() as server:
        async with Engine("echo", {"base_url": server.url, "shout": True}) as engine:
            wf = Workflow()
            hello = wf.llm("hello there")
            result = await engine.arun(wf)
    assert result[hello] == "HELLO THERE"
    record = result.graph[hello.id]
    assert record.provider == "echo"
    assert record.usage.input_tokens == 2
    assert record.cost == pytest.approx((2 * 1.0 + 2 * 2.0) / 1_000_000)


async def test_retries_a_429_then_succeeds() -> None:
    replies = [Reply.error(429, "slow down", retry_after="0.01"), "ok"]
    with FakeEchoServer(replies=replies) as server:
        async with Engine("echo", {"base_url": server.url}) as engine:
            wf = Workflow()
            ref = wf.llm("x")
            result = await engine.arun(wf)
    assert result[ref] == "ok"
    assert len(server.requests) == 2


async def test_a_wrong_key_fails_at_once() -> None:
    with FakeEchoServer(api_key="right") as server:
        engine = Engine("echo", {"base_url": server.url, "api_key": "wrong"})
        async with engine:
            wf = Workflow()
            ref = wf.llm("x")
            result = await engine.arun(wf)
    assert result.graph[ref.id].error_type == ProviderAuthError.__name__
    assert "bad X-Echo-Key" in result.errors[ref.id]
    assert len(server.requests) == 1
