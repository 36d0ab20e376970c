"""Full RLM completions through each provider plugin against the fake servers: a root
model that writes ```repl code, a child RLM at depth 1, and usage and cost summed across
the tree."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from rlm_graph import RLM, NodeKind
from rlm_graph.graph import to_json
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, last_user_message
from tests.support.http import KEY, anthropic_kwargs, openai_kwargs

ROOT_CODE = """
part = rlm_query("child task")
leaf = llm_query("leaf question")
answer["content"] = part + " | " + leaf
answer["ready"] = True
"""

CHILD_CODE = """
answer["content"] = "child:" + llm_query("child leaf")
answer["ready"] = True
"""


def repl(code: str) -> str:
    return f"I will use the REPL.\n```repl\n{code}\n```\n"


def tree_responder(is_turn: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], str]:
    """Root turns (with a system prompt) get code: the first completion to start is the
    root, the next its child; plain sub-calls answer ``sub:<prompt>``."""
    lock = threading.Lock()
    first_turns = [0]

    def respond(body: dict[str, Any]) -> str:
        if not is_turn(body):
            return "sub:" + last_user_message(body)
        if any(m.get("role") == "assistant" for m in body["messages"]):
            return repl('answer["content"] = "late"; answer["ready"] = True')
        with lock:
            first_turns[0] += 1
            n = first_turns[0]
        return repl(ROOT_CODE if n == 1 else CHILD_CODE)

    return respond


def openai_turn(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "system" for m in body["messages"])


def anthropic_turn(body: dict[str, Any]) -> bool:
    return bool(body.get("system"))


EXPECTED = "child:sub:child leaf | sub:leaf question"


def _check_tree(result: Any, server: Any) -> None:
    assert result.response == EXPECTED, result.response
    assert result.stop_reason is None
    graph = result.graph
    child = next(graph.records(NodeKind.RLM_CALL))
    assert child.depth == 1
    calls = [r for r in graph.records() if r.kind in (NodeKind.ROOT_TURN, NodeKind.LLM_CALL)]
    assert len(calls) == len(server.requests) == 4  # root turn, child turn, 2 leaves
    assert result.usage_summary.total_calls == 4


async def test_openrouter_rlm_depth_2_sums_reported_cost_and_usage() -> None:
    with FakeOpenAIServer(tree_responder(openai_turn), api_key=KEY, cost_per_call=0.0025) as server:
        async with RLM("openrouter", openai_kwargs(server), max_depth=2) as rlm:
            result = await rlm.acompletion("the root context", root_prompt="answer me")
    _check_tree(result, server)
    sent = [payload["usage"] for status, payload in server.responses if status == 200]
    summary = result.usage_summary
    assert summary.total_input_tokens == sum(u["prompt_tokens"] for u in sent)
    assert summary.total_output_tokens == sum(u["completion_tokens"] for u in sent)
    assert summary.total_cost == pytest.approx(4 * 0.0025)
    assert KEY not in to_json(result.graph) and KEY not in str(result.to_dict())


async def test_anthropic_rlm_depth_2_prices_from_the_table() -> None:
    models = {"claude-test": {"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}}
    with FakeAnthropicServer(tree_responder(anthropic_turn), api_key=KEY) as server:
        async with RLM("anthropic", anthropic_kwargs(server), max_depth=2, models=models) as rlm:
            result = await rlm.acompletion("the root context", root_prompt="answer me")
    _check_tree(result, server)
    sent = [payload["usage"] for status, payload in server.responses if status == 200]
    tokens_in = sum(u["input_tokens"] for u in sent)
    tokens_out = sum(u["output_tokens"] for u in sent)
    assert result.usage_summary.total_input_tokens == tokens_in
    assert result.usage_summary.total_cost == pytest.approx((tokens_in * 3 + tokens_out * 15) / 1e6)


def test_sync_completion_through_the_openai_plugin() -> None:
    with FakeOpenAIServer(tree_responder(openai_turn)) as server:
        rlm = RLM("openai", openai_kwargs(server), max_depth=2)
        result = rlm.completion("ctx", root_prompt="q")
        assert rlm.engine.provider._client is None  # type: ignore[attr-defined]
    assert result.response == EXPECTED
