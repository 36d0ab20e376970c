"""Typed sub-calls over real HTTP: the structured-output request each wire format sends
(checked in the body the fake server received), and the answer read back."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from rlm_graph import RLM
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, last_user_message
from tests.support.http import KEY, anthropic_kwargs, openai_kwargs


class Fact(BaseModel):
    subject: str
    year: int


ROOT = """```repl
fact = llm_query("When was the Eiffel tower built?", schema=Fact)
tags = llm_query("tags please", schema=list[str])
FINAL(f"{type(fact).__name__}:{fact.subject}:{fact.year}|{','.join(tags)}")
```"""


def responder(is_turn: Any) -> Any:
    def respond(body: dict[str, Any]) -> str:
        if is_turn(body):
            return ROOT
        if "tags" in last_user_message(body):
            return '{"value": ["iron", "paris"]}' if "tools" in body else '["iron", "paris"]'
        return '{"subject": "Eiffel tower", "year": 1889}'

    return respond


def _sub_bodies(server: Any, is_turn: Any) -> list[dict[str, Any]]:
    return [b for b in server.bodies if not is_turn(b)]


async def test_openai_sends_response_format_json_schema() -> None:
    def is_turn(body: dict[str, Any]) -> bool:
        return any(m.get("role") == "system" for m in body["messages"])

    with FakeOpenAIServer(responder(is_turn), api_key=KEY) as server:
        async with RLM("openai", openai_kwargs(server), custom_tools={"Fact": Fact}) as rlm:
            result = await rlm.acompletion("ctx")
    assert result.response == "Fact:Eiffel tower:1889|iron,paris"
    fact_body, tags_body = _sub_bodies(server, is_turn)
    assert fact_body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Fact", "schema": Fact.model_json_schema()},
    }
    assert tags_body["response_format"]["json_schema"]["schema"] == {
        "type": "array",
        "items": {"type": "string"},
    }
    assert "tools" not in fact_body
    # Root turns ask for no structured output.
    assert all("response_format" not in b for b in server.bodies if is_turn(b))


async def test_anthropic_forces_a_tool_whose_input_is_the_answer() -> None:
    def is_turn(body: dict[str, Any]) -> bool:
        return bool(body.get("system"))

    with FakeAnthropicServer(responder(is_turn), api_key=KEY) as server:
        async with RLM("anthropic", anthropic_kwargs(server), custom_tools={"Fact": Fact}) as rlm:
            result = await rlm.acompletion("ctx")
    assert result.response == "Fact:Eiffel tower:1889|iron,paris"
    fact_body, tags_body = _sub_bodies(server, is_turn)
    (tool,) = fact_body["tools"]
    assert tool["name"] == "Fact" and tool["input_schema"] == Fact.model_json_schema()
    assert fact_body["tool_choice"] == {"type": "tool", "name": "Fact"}
    # A list is not an object: it travels wrapped as {"value": [...]}.
    (wrapped,) = tags_body["tools"]
    assert wrapped["input_schema"] == {
        "type": "object",
        "properties": {"value": {"type": "array", "items": {"type": "string"}}},
        "required": ["value"],
    }
    # The server answered with tool_use blocks, not text.
    sub_answers = [p for status, p in server.responses if p.get("stop_reason") == "tool_use"]
    assert [a["content"][0]["type"] for a in sub_answers] == ["tool_use", "tool_use"]
    assert "response_format" not in fact_body


async def test_openai_answer_that_ignores_the_schema_is_refused_per_slot() -> None:
    root = """```repl
got = llm_query_batched(["one", "two"], schema={"type": "object", "required": ["year"]})
FINAL(json.dumps(got))
```"""

    def respond(body: dict[str, Any]) -> str:
        if any(m.get("role") == "system" for m in body["messages"]):
            return "```repl\nimport json\n```\n" + root
        return '{"year": 1}' if last_user_message(body).startswith("one") else "no JSON here"

    with FakeOpenAIServer(respond, api_key=KEY) as server:
        async with RLM("openai", openai_kwargs(server)) as rlm:
            result = await rlm.acompletion("ctx")
    first, second = json.loads(result.response)
    assert first == {"year": 1}
    assert second.startswith("[ERROR] SchemaMismatch: the answer is not JSON")
