"""A server that omits ``usage`` does not make ``max_tokens`` blind: the engine counts
about four characters per token and marks the usage estimated."""

from __future__ import annotations

from typing import Any

from rlm_graph import RLM, Engine, NodeKind, NodeStatus, Workflow
from rlm_graph.testing import FakeOpenAIServer, last_user_message
from tests.support.http import openai_kwargs

REPLY = "z" * 8_000  # 2,000 tokens at four characters per token


def without_usage(text: str, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped answer with no ``usage`` field at all."""
    return {
        "id": "chatcmpl-no-usage",
        "object": "chat.completion",
        "model": body.get("model", ""),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
    }


async def test_50_calls_of_8000_characters_without_usage_stop_at_max_tokens_1000() -> None:
    with FakeOpenAIServer(lambda body: without_usage(REPLY, body)) as server:
        kwargs = openai_kwargs(server, max_concurrent=1)
        async with Engine("openai", kwargs, max_tokens=1_000) as engine:
            wf = Workflow()
            refs = [wf.llm(f"part {i}") for i in range(50)]
            result = await engine.arun(wf)
        sent = len(server.requests)
    assert result.stop_reason == "max_tokens"
    done = [result.graph[r.id] for r in refs if result.graph[r.id].status == NodeStatus.OK]
    assert len(done) == 1 and sent <= 2  # the one call that crossed the line (and one in the pipe)
    usage = done[0].usage
    assert usage is not None and usage.estimated
    assert usage.output_tokens == 2_000 and usage.input_tokens == 2  # "part 0": 6 characters


async def test_model_code_looping_over_a_usage_less_server_is_stopped_and_told_estimated() -> None:
    def respond(body: dict[str, Any]) -> dict[str, Any]:
        if any(m.get("role") == "system" for m in body["messages"]):
            code = "for i in range(50):\n    llm_query(f'chunk {i}')\nFINAL('read all 50')"
            return without_usage(f"```repl\n{code}\n```", body)
        return without_usage(REPLY + last_user_message(body), body)

    with FakeOpenAIServer(respond) as server:
        async with RLM("openai", openai_kwargs(server), max_tokens=20_000) as rlm:
            result = await rlm.acompletion("ctx")
    assert result.stop_reason == "max_tokens"
    calls = [r for r in result.graph.records(NodeKind.LLM_CALL) if r.status == NodeStatus.OK]
    assert 1 <= len(calls) <= 10  # 20,000 tokens at 2,000 a call, not 50 calls
    assert all(
        r.usage is not None and r.usage.estimated
        for r in result.graph.records(NodeKind.LLM_CALL)
        if r.usage
    )
    summary = result.usage_summary.to_dict()["model_usage_summaries"]["gpt-test"]
    assert summary["estimated_calls"] == summary["total_calls"] >= 2
