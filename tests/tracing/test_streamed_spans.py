"""Traces of a streamed run: the same spans, nested the same way, with the same GenAI
usage as the same run with streaming off (over real HTTP, into the OpenTelemetry SDK)."""

from __future__ import annotations

from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer
from tests.support.http import anthropic_kwargs, openai_kwargs
from tests.support.streams import COMMENTARY, FINISH, TurnScript, is_turn, repl
from tests.support.tracing import Memory, parent_id, span_id

pytestmark = pytest.mark.slow  # streams at a set rate: seconds by design

SERVERS: dict[str, Any] = {"openai": FakeOpenAIServer, "anthropic": FakeAnthropicServer}
KWARGS: dict[str, Any] = {"openai": openai_kwargs, "anthropic": anthropic_kwargs}

# Differ from run to run whatever the mode: the fake server's port, time in a queue.
PER_RUN = {"server.port", "rlm.queue_seconds"}


async def _spans(api: str, stream: bool) -> tuple[dict[str, Any], list[bool]]:
    """Node id -> (span name, parent node id, attributes, event names) of one traced run, and whether
    each root turn was asked for as a stream."""
    memory = Memory()
    script = TurnScript(
        [
            repl("x = llm_query('first')\nprint(x)", after=COMMENTARY),
            repl("y = llm_query_batched(['a', 'b'])\nprint(y)", after=COMMENTARY),
            repl(FINISH),
        ]
    )
    try:
        with SERVERS[api](script, stream_rate=2000, prompt_cache=True, cache_min_tokens=64) as s:
            kwargs = KWARGS[api](s, stream=stream)
            async with RLM(api, kwargs, tracer_provider=memory.provider) as rlm:
                result = await rlm.acompletion("ctx", root_prompt="q")
            streamed = [bool(r.body.get("stream")) for r in s.requests if is_turn(r.body)]
        assert result.response == "done:sub:first"
        nodes = {
            span_id(span): str((span.attributes or {}).get("rlm.node.id", "run"))
            for span in memory.spans
        }
        found = {}
        for span in memory.spans:
            attrs = {k: v for k, v in (span.attributes or {}).items() if k not in PER_RUN}
            parent = nodes.get(parent_id(span) or 0)
            events = [event.name for event in span.events]
            found[nodes[span_id(span)]] = (span.name, parent, attrs, events)
        return found, streamed
    finally:
        memory.provider.shutdown()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_streamed_run_has_the_spans_and_usage_of_a_plain_one(api: str) -> None:
    streamed, asked_streamed = await _spans(api, stream=True)
    plain, asked_plain = await _spans(api, stream=False)
    assert asked_streamed == [True, True, True] and asked_plain == [False, False, False]
    assert streamed == plain  # names, nesting, events, every attribute but the per-run two
    usage = {
        node: (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"])
        for node, (name, _, attrs, _) in streamed.items()
        if name.startswith("chat ")
    }
    assert sorted(usage) == [
        "turn-1",
        "turn-1/block-1/llm-1",
        "turn-2",
        "turn-2/block-1/llm-1.0",  # the batch's two slots
        "turn-2/block-1/llm-1.1",
        "turn-3",
    ]
    assert all(tokens > 0 for pair in usage.values() for tokens in pair)
