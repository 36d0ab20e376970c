"""Concurrent calls reserve their estimate before going out: a budget is passed by at most
one call's worth, not by ``max_concurrent`` calls' worth (real HTTP, calls overlapping)."""

from __future__ import annotations

import pytest

from rlm_graph import RLM, Engine, NodeKind, Workflow
from rlm_graph.testing import FakeOpenAIServer
from tests.support.http import openai_kwargs

PROMPT = "y" * 4_000  # 1,000 input tokens
REPLY = "x" * 400  # 100 output tokens
PRICES = {"gpt-test": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 10.0}}
ONE_CALL = (1_000 * 1.0 + 100 * 10.0) / 1e6  # $0.002


@pytest.mark.parametrize("max_tokens", [100, None])  # the request's output cap, or the default
async def test_64_concurrent_calls_pass_the_budget_by_at_most_one_call(
    max_tokens: int | None,
) -> None:
    budget = 5.5 * ONE_CALL
    params = {"max_tokens": max_tokens} if max_tokens else {}
    with FakeOpenAIServer(lambda body: REPLY, latency=0.02) as server:
        kwargs = openai_kwargs(server, max_concurrent=16)
        async with Engine("openai", kwargs, models=PRICES, max_budget=budget) as engine:
            wf = Workflow()
            for _ in range(64):
                wf.llm(PROMPT, **params)
            result = await engine.arun(wf)
        sent = len(server.requests)
    assert result.stop_reason == "max_budget"
    spent = sum(r.cost or 0.0 for r in result.graph.records())
    assert budget < spent <= budget + ONE_CALL + 1e-12
    # Every request the server saw was paid for: nothing in flight was thrown away.
    assert sent == 6


async def test_concurrent_tokens_pass_max_tokens_by_at_most_one_call() -> None:
    with FakeOpenAIServer(lambda body: REPLY, latency=0.02) as server:
        kwargs = openai_kwargs(server, max_concurrent=16)
        async with Engine("openai", kwargs, max_tokens=5_500) as engine:
            wf = Workflow()
            for _ in range(64):
                wf.llm(PROMPT, max_tokens=100)
            result = await engine.arun(wf)
        sent = len(server.requests)
    assert result.stop_reason == "max_tokens"
    assert sent == 6  # 1,100 tokens a call: five fit, the sixth crosses the line


async def test_model_code_fanning_out_a_batch_cannot_spend_around_max_budget() -> None:
    def respond(body: dict[str, object]) -> str:
        messages = body["messages"]
        assert isinstance(messages, list)
        if any(m.get("role") == "system" for m in messages):
            return "```repl\nr = llm_query_batched([context] * 200)\nFINAL('spent it')\n```"
        return REPLY

    with FakeOpenAIServer(respond, latency=0.02) as server:
        async with RLM(
            "openai",
            openai_kwargs(server, max_concurrent=32),
            models=PRICES,
            max_budget=0.02,
            batch_max_concurrent=32,
            sub_sampling_args={"max_tokens": 100},
        ) as rlm:
            result = await rlm.acompletion(PROMPT)
    assert result.stop_reason == "max_budget"
    turn_cost = sum(r.cost or 0.0 for r in result.graph.records(NodeKind.ROOT_TURN))
    calls = [r for r in result.graph.records(NodeKind.LLM_CALL) if r.cost]
    largest = max(r.cost or 0.0 for r in calls)
    assert result.usage_summary.total_cost is not None
    assert 0.02 < result.usage_summary.total_cost <= 0.02 + max(largest, turn_cost) + 1e-12
    assert len(calls) < 32  # without reservations, the first wave alone was 32 calls
