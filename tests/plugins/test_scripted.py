"""The scripted provider: responses, rules, functions, failures, latency, records."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rlm_graph import ChatResponse, Message, Usage
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ConfigError, ProviderError
from rlm_graph_scripted import ScriptedProvider, ScriptExhausted


def request(text: str, system: str | None = None) -> ChatRequest:
    messages = [Message(role="user", content=text)]
    if system:
        messages.insert(0, Message(role="system", content=system))
    return ChatRequest(messages=tuple(messages), model="m")


async def test_responses_are_used_in_order_then_run_out() -> None:
    provider = ScriptedProvider(responses=["one", "two"])
    assert (await provider.complete(request("a"))).content == "one"
    assert (await provider.complete(request("b"))).content == "two"
    with pytest.raises(ScriptExhausted, match="no response left for call 3"):
        await provider.complete(request("c"))
    assert [r.prompt for r in provider.requests] == ["a", "b", "c"]


async def test_rules_match_the_last_user_message_first() -> None:
    provider = ScriptedProvider(
        rules=[
            (r"capital of (\w+)", lambda req, m: f"capital:{m.group(1)}"),
            ("boom", ProviderError("scripted failure")),
        ],
        respond=lambda req: "default",
    )
    assert (await provider.complete(request("the capital of France?"))).content == "capital:France"
    assert (await provider.complete(request("anything"))).content == "default"
    with pytest.raises(ProviderError, match="scripted failure"):
        await provider.complete(request("boom"))


async def test_match_all_sees_the_whole_conversation() -> None:
    provider = ScriptedProvider(
        rules=[("SYSTEM-MARK", "root")], match="all", respond=lambda r: "sub"
    )
    assert (await provider.complete(request("q", system="SYSTEM-MARK"))).content == "root"
    assert (await provider.complete(request("q"))).content == "sub"


async def test_async_respond_and_chat_response_pass_through() -> None:
    async def respond(req: ChatRequest) -> ChatResponse:
        await trio.sleep(0)
        return ChatResponse(content="x", usage=Usage(input_tokens=7, output_tokens=1), cost=0.5)

    reply = await ScriptedProvider(respond=respond).complete(request("q"))
    assert reply.usage.input_tokens == 7 and reply.cost == 0.5


async def test_usage_is_estimated_from_text() -> None:
    reply = await ScriptedProvider(responses=["x" * 40]).complete(request("y" * 400))
    assert reply.usage == Usage(input_tokens=100, output_tokens=10)
    assert reply.finish_reason == "stop"


async def test_latency_sleeps_on_trios_clock_and_peak_is_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider(respond=lambda r: "ok", latency=2.0)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(provider.complete, request(str(i)))
    assert trio.current_time() - start == pytest.approx(2.0)
    assert provider.peak_in_flight == 5
    assert provider.in_flight == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="match must be"):
        ScriptedProvider(match="first")
    with pytest.raises(ConfigError, match="latency"):
        ScriptedProvider(latency=-1)


@pytest.mark.parametrize(
    ("keywords", "says"),
    [
        ({"max_concurrent": "4"}, "max_concurrent must be a whole number >= 1, not '4'"),
        ({"max_concurrent": 0}, "max_concurrent must be a whole number >= 1, not 0"),
        ({"latency": float("nan")}, "latency must be a number >= 0, not nan"),
        ({"stream_chunk": 2.5}, "stream_chunk must be a whole number >= 0"),
        ({"stream_delay": "fast"}, "stream_delay must be a number >= 0"),
        ({"cost_per_call": -1}, "cost_per_call must be a number >= 0"),
    ],
)
def test_a_keyword_of_the_wrong_shape_is_named(keywords: dict[str, object], says: str) -> None:
    """What --backend-kwargs passes as JSON may be any shape: each keyword is named, not a
    TypeError from a comparison."""
    with pytest.raises(ConfigError, match=f"scripted: {says}"):
        ScriptedProvider(**keywords)  # type: ignore[arg-type]
