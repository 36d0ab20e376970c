"""The Anthropic Messages provider: the wire format and real HTTP against a fake server."""

from __future__ import annotations

import json

import httpx
import pytest

from rlm_graph import Engine, Workflow
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.errors import ConfigError
from rlm_graph.testing import FakeAnthropicServer, Reply, last_user_message
from rlm_graph_anthropic import AnthropicProvider
from tests.support.http import KEY, anthropic_kwargs


async def test_system_split_out_turns_merged_and_max_tokens_defaulted() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            json={
                "model": "claude-test",
                "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 4,
                    "cache_read_input_tokens": 100,
                    "cache_creation_input_tokens": 20,
                },
            },
        )

    provider = AnthropicProvider(
        model_name="claude-test", api_key=KEY, transport=httpx.MockTransport(handler)
    )
    messages = (
        Message(role="system", content="rules"),
        Message(role="user", content="a"),
        Message(role="user", content="b"),
        Message(role="assistant", content="c"),
        Message(role="user", content="d"),
    )
    request = ChatRequest(
        messages=messages, model="claude-test", temperature=0.5, stop=("X",), seed=3
    )
    response = await provider.complete(request)
    await provider.aclose()

    sent = seen[0]
    assert str(sent.url) == "https://api.anthropic.com/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert json.loads(sent.content) == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "rules",
        "messages": [
            {"role": "user", "content": "a\n\nb"},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
        "temperature": 0.5,
        "stop_sequences": ["X"],
    }
    assert response.content == "ok"
    assert response.finish_reason == "end_turn"
    assert response.usage.input_tokens == 130
    assert response.usage.cached_tokens == 100
    assert response.usage.output_tokens == 4


def test_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        Engine("anthropic", {"model_name": "claude-sonnet-4-5"})


async def test_workflow_over_real_http() -> None:
    with FakeAnthropicServer(lambda b: "A:" + last_user_message(b), api_key=KEY) as server:
        async with Engine("anthropic", anthropic_kwargs(server)) as engine:
            wf = Workflow()
            refs = [wf.llm(f"q{i}", system="terse") for i in range(4)]
            result = await engine.arun(wf)
    assert [result[r] for r in refs] == [f"A:q{i}" for i in range(4)]
    assert all(b["system"] == "terse" for b in server.bodies)
    record = result.graph[refs[0].id]
    assert record.provider == "anthropic"
    assert record.usage.output_tokens > 0 and record.finish_reason == "end_turn"


async def test_overloaded_529_is_retried() -> None:
    replies = [Reply.error(529, "Overloaded"), "fine"]
    with FakeAnthropicServer(replies=replies) as server:
        provider = AnthropicProvider(**anthropic_kwargs(server))
        request = ChatRequest(messages=(Message(role="user", content="x"),), model="claude-test")
        try:
            response = await provider.complete(request)
        finally:
            await provider.aclose()
    assert response.content == "fine"
    assert len(server.requests) == 2
