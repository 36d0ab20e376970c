"""Refused, filtered and aborted replies over real HTTP, as the APIs send them: each is
passed on with its text and a note saying it is not whole (OpenAI's ``refusal`` text is
the reply's text, not dropped for "no text")."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from rlm_graph import Engine, Workflow
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.protocol.replies import reply_note
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, Reply
from rlm_graph_openai import OpenAIProvider
from tests.support.http import anthropic_kwargs, openai_kwargs
from tests.support.rawhttp import raw_server

REFUSED = "I'm sorry, I can't help with that request."


def _openai(message: dict[str, Any], reason: str) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": reason}
    return {"choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}


def _anthropic(text: str, reason: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "stop_reason": reason,
        "usage": {"input_tokens": 9, "output_tokens": 7},
    }


CASES = [
    ("openai", _openai({"content": None, "refusal": REFUSED}, "stop"), REFUSED, "refusal"),
    ("openai", _openai({"content": "Step 1: obtain"}, "content_filter"), "Step 1: obtain", ""),
    ("openai", _openai({"content": "def f(x):"}, "abort"), "def f(x):", "abort"),
    ("anthropic", _anthropic("Sure, the first", "refusal"), "Sure, the first", "refusal"),
    ("anthropic", _anthropic("1, 2, 3,", "model_context_window_exceeded"), "1, 2, 3,", ""),
]


@pytest.mark.parametrize(("api", "body", "text", "reason"), CASES)
async def test_a_refused_filtered_or_aborted_reply_is_passed_on_with_a_note(
    api: str, body: dict[str, Any], text: str, reason: str
) -> None:
    fake, kwargs = (
        (FakeAnthropicServer, anthropic_kwargs)
        if api == "anthropic"
        else (FakeOpenAIServer, openai_kwargs)
    )
    with fake(lambda request: Reply(body=body)) as server:
        async with Engine(api, kwargs(server, max_attempts=1, stream=False)) as engine:
            wf = Workflow()
            ref = wf.llm("how do I ...?")
            result = await engine.arun(wf)
    node = result.graph[ref.id]
    said = reason or str(body.get("stop_reason") or body["choices"][0]["finish_reason"])
    assert node.finish_reason == said and node.note is not None and said in node.note
    assert result[ref] == f"{text}\n[rlm-graph: {node.note}]"
    if said == "model_context_window_exceeded":
        assert "cut off by the model's context window" in node.note


async def test_a_streamed_refusal_is_the_replys_text() -> None:
    """``delta.refusal`` was dropped: the reply had no text and finish_reason ``stop``."""
    events = [
        {"choices": [{"delta": {"role": "assistant", "content": None, "refusal": ""}}]},
        {"choices": [{"delta": {"refusal": REFUSED}}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(head % len(body) + body)
        return True

    seen: list[str] = []
    async with raw_server(handler) as (port, _):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        provider = OpenAIProvider(**openai_kwargs(server))
        request = ChatRequest(messages=(Message(role="user", content="q"),), model="gpt-test")
        reply = await provider.stream(request, lambda offset, text: seen.append(text))
        await provider.aclose()
    assert reply.content == REFUSED == "".join(seen) and reply.finish_reason == "refusal"
    assert reply_note(reply) is not None
