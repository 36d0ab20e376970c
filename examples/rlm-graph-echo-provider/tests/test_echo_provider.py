"""Tests of the echo provider over real HTTP, against the fake Echo API."""

from __future__ import annotations

from typing import Any

import pytest

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.errors import ProviderAuthError
from rlm_graph.testing import Reply
from rlm_graph_echo.server import FakeEchoServer


async def test_answers_by_backend_name() -> None:
    with FakeEchoServer() as server:
        async with Engine("echo", {"base_url": server.base_url, "shout": True}) as engine:
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
        async with Engine("echo", {"base_url": server.base_url}) as engine:
            wf = Workflow()
            ref = wf.llm("x")
            result = await engine.arun(wf)
    assert result[ref] == "ok"
    assert len(server.requests) == 2


async def test_a_wrong_key_fails_at_once() -> None:
    with FakeEchoServer(api_key="right") as server:
        engine = Engine("echo", {"base_url": server.base_url, "api_key": "wrong"})
        async with engine:
            wf = Workflow()
            ref = wf.llm("x")
            result = await engine.arun(wf)
    assert result.graph[ref.id].error_type == ProviderAuthError.__name__
    assert "bad X-Echo-Key" in result.errors[ref.id]
    assert len(server.requests) == 1


async def test_a_root_model_s_second_turn_carries_the_whole_conversation() -> None:
    def root(body: dict[str, Any]) -> str:
        turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if turns == 0:
            return "```repl\nx = 41\nprint('x is', x)\n```"
        return "```repl\nFINAL(str(x + 1))\n```"

    with FakeEchoServer(root) as server:
        async with RLM("echo", {"base_url": server.base_url}, environment="local") as rlm:
            result = await rlm.acompletion("some context", root_prompt="what is x + 1?")
        second = server.bodies[1]["messages"]
    assert result.response == "42"
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["text"].startswith("```repl\nx = 41")  # the first reply, kept
    assert "x is 41" in second[2]["text"]  # and what the REPL printed
