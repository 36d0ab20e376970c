"""Prompt caching over real HTTP: Anthropic root turns mark their prefix with
``cache_control``, OpenAI turns keep one ``prompt_cache_key`` and a byte-stable prefix,
and cached input is priced at the model's cached rate, in the cost and in ``max_budget``."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.contracts import ModelInfo, Usage
from rlm_graph.errors import ConfigError, ProviderError
from rlm_graph.events import RunFinished
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, Reply
from tests.support.http import anthropic_kwargs, openai_kwargs
from tests.support.streams import FINISH, TurnScript, is_turn, repl

THREE_TURNS = [
    repl("x = llm_query('one')\nprint(x)", after="Next I look closer."),
    repl("x = llm_query('two')\nprint(x)", after="Nearly there."),
    repl(FINISH),
]
CLAUDE = {
    "claude-test": {
        "input_usd_per_mtok": 3.0,
        "output_usd_per_mtok": 15.0,
        "cached_input_usd_per_mtok": 0.3,
        "cache_write_usd_per_mtok": 3.75,
    }
}
GPT = {
    "gpt-test": {
        "input_usd_per_mtok": 1.25,
        "output_usd_per_mtok": 10.0,
        "cached_input_usd_per_mtok": 0.125,
    }
}


def _marked(blocks: Any) -> bool:
    return isinstance(blocks, list) and any("cache_control" in b for b in blocks)


async def test_anthropic_root_turns_mark_their_prefix_with_cache_control() -> None:
    with FakeAnthropicServer(TurnScript(THREE_TURNS)) as server:
        async with RLM("anthropic", anthropic_kwargs(server)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
        bodies = server.bodies
    assert result.response == "done:sub:two"
    turns = [b for b in bodies if is_turn(b)]
    assert len(turns) == 3
    for body in turns[1:]:  # from the second turn on (the first one too: it writes)
        assert _marked(body["system"])
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert _marked(body["messages"][-1]["content"])
        assert not any(_marked(m["content"]) for m in body["messages"][:-1])
    # Sub-calls repeat nothing: they are not marked.
    subs = [b for b in bodies if not is_turn(b)]
    assert subs and not any(_marked(m["content"]) for b in subs for m in b["messages"])


async def test_prompt_caching_can_be_turned_off_for_anthropic() -> None:
    with FakeAnthropicServer(TurnScript(THREE_TURNS)) as server:
        async with RLM("anthropic", anthropic_kwargs(server, prompt_caching=False)) as rlm:
            await rlm.acompletion("ctx", root_prompt="q")
    assert not any("cache_control" in json.dumps(b) for b in server.bodies)


async def test_openai_turns_keep_one_cache_key_and_a_byte_stable_prefix() -> None:
    with FakeOpenAIServer(TurnScript(THREE_TURNS)) as server:
        async with RLM("openai", openai_kwargs(server)) as rlm:
            await rlm.acompletion("ctx", root_prompt="q")
        turns = [b for b in server.bodies if is_turn(b)]
        subs = [b for b in server.bodies if not is_turn(b)]
    keys = {b["prompt_cache_key"] for b in turns}
    assert len(keys) == 1 and all("prompt_cache_key" not in b for b in subs)
    # Each turn's messages, as sent, start with the whole of the turn before's.
    for before, after in zip(turns, turns[1:], strict=False):
        sent = json.dumps(before["messages"])[:-1]
        assert json.dumps(after["messages"]).startswith(sent)


async def test_the_cache_key_goes_only_to_servers_that_take_it() -> None:
    with FakeOpenAIServer(TurnScript(THREE_TURNS)) as server:
        async with RLM("vllm", {**openai_kwargs(server), "api_key": None}) as rlm:
            await rlm.acompletion("ctx", root_prompt="q")
        plain = server.bodies
    with FakeOpenAIServer(TurnScript(THREE_TURNS)) as server:
        kwargs = {**openai_kwargs(server), "api_key": None, "prompt_cache_key": True}
        async with RLM("vllm", kwargs) as rlm:
            await rlm.acompletion("ctx", root_prompt="q")
        asked = server.bodies
    assert not any("prompt_cache_key" in b for b in plain)
    assert all("prompt_cache_key" in b for b in asked if is_turn(b))


def _billed(info: dict[str, float], usages: list[Usage]) -> float:
    price = ModelInfo(**info)
    return sum(price.price(u) or 0.0 for u in usages)


async def test_the_cost_of_a_run_with_cached_tokens_is_the_priced_figure() -> None:
    seen: list[Any] = []
    server = FakeAnthropicServer(TurnScript(THREE_TURNS), prompt_cache=True, cache_min_tokens=64)
    with server:
        async with RLM(
            "anthropic", anthropic_kwargs(server), models=CLAUDE, listeners=[seen.append]
        ) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    sent = [payload["usage"] for status, payload in server.responses if status == 200]
    usages = [
        Usage(
            input_tokens=u["input_tokens"]
            + u["cache_read_input_tokens"]
            + u["cache_creation_input_tokens"],
            output_tokens=u["output_tokens"],
            cached_tokens=u["cache_read_input_tokens"],
            cache_write_tokens=u["cache_creation_input_tokens"],
        )
        for u in sent
    ]
    read = sum(u.cached_tokens for u in usages)
    written = sum(u.cache_write_tokens for u in usages)
    assert read > 0 and written > 0  # turn 2 read what turn 1 wrote, and so on
    summary = result.usage_summary.model_usage_summaries["claude-test"]
    assert summary.cached_tokens == read and summary.cache_write_tokens == written
    assert summary.total_input_tokens == sum(u.input_tokens for u in usages)
    expected = _billed(CLAUDE["claude-test"], usages)
    assert summary.total_cost == pytest.approx(expected)
    # Without the cache prices the same tokens would cost something else: it is not a fluke.
    plain = {k: v for k, v in CLAUDE["claude-test"].items() if "cache" not in k}
    assert _billed(plain, usages) != pytest.approx(expected)
    # What max_budget counts is what was billed.
    final = seen[-1]
    assert isinstance(final, RunFinished) and final.cost == pytest.approx(expected)
    # The run's running totals (the event stream's, a child's rlm_call node's) kept the
    # tokens read from the cache and dropped those written to it.
    assert (final.usage.cached_tokens, final.usage.cache_write_tokens) == (read, written)
    assert (
        result.usage_summary.to_dict()["model_usage_summaries"]["claude-test"]["cached_tokens"]
        == read
    )


async def test_openai_cached_tokens_are_priced_at_the_cached_rate() -> None:
    server = FakeOpenAIServer(TurnScript(THREE_TURNS), prompt_cache=True, cache_min_tokens=64)
    with server:
        async with RLM("openai", openai_kwargs(server), models=GPT) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    sent = [payload["usage"] for status, payload in server.responses if status == 200]
    usages = [
        Usage(
            input_tokens=u["prompt_tokens"],
            output_tokens=u["completion_tokens"],
            cached_tokens=u["prompt_tokens_details"]["cached_tokens"],
        )
        for u in sent
    ]
    summary = result.usage_summary.model_usage_summaries["gpt-test"]
    assert summary.cached_tokens == sum(u.cached_tokens for u in usages) > 0
    assert summary.total_cost == pytest.approx(_billed(GPT["gpt-test"], usages))


async def _cost(models: dict[str, Any], **limits: Any) -> Any:
    server = FakeOpenAIServer(TurnScript(THREE_TURNS), prompt_cache=True, cache_min_tokens=64)
    with server:
        async with RLM("openai", openai_kwargs(server), models=models, **limits) as rlm:
            return await rlm.acompletion("ctx", root_prompt="q")


async def test_max_budget_counts_what_is_billed_with_the_cache() -> None:
    plain_table = {"gpt-test": {"input_usd_per_mtok": 1.25, "output_usd_per_mtok": 10.0}}
    billed = (await _cost(GPT)).usage_summary.total_cost
    list_price = (await _cost(plain_table)).usage_summary.total_cost
    assert billed is not None and list_price is not None and billed < list_price
    budget = (billed + list_price) / 2
    # The run fits the budget because its cached input is billed at the cached rate...
    fits = await _cost(GPT, max_budget=budget)
    assert fits.stop_reason is None and fits.response == "done:sub:two"
    # ...and the same run priced at the plain input rate passes it.
    stopped = await _cost(plain_table, max_budget=budget)
    assert stopped.stop_reason == "max_budget"


async def test_a_server_refusing_the_cache_key_is_asked_again_without_it_and_never_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A gateway that refuses fields it does not know (a 400 naming the field) failed
    every root turn of the `openai` backend pointed at it."""
    script = TurnScript(THREE_TURNS)

    def strict(body: dict[str, Any]) -> Any:
        if "prompt_cache_key" in body:
            return Reply.error(400, "Unrecognized request argument supplied: prompt_cache_key")
        return script(body)

    with FakeOpenAIServer(strict) as server:
        url = server.base_url.replace("http://", "http://gate:GatewayPassw0rd@")
        with caplog.at_level("WARNING", logger="rlm_graph"):
            async with RLM("openai", openai_kwargs(server, base_url=url)) as rlm:
                first = await rlm.acompletion("ctx", root_prompt="q")
                second = await rlm.acompletion("ctx", root_prompt="q again")
        refused = [status for status, _ in server.responses if status == 400]
    assert first.response.startswith("done:") and second.response.startswith("done:")
    assert len(refused) == 1  # the first turn's; no call sends the key after it
    assert caplog.text.count("refused the prompt_cache_key field") == 1
    assert "GatewayPassw0rd" not in caplog.text


async def test_a_price_given_for_a_known_model_replaces_its_cached_rate_too() -> None:
    """Prices given for a model the plugins price kept the plugin's cached rate, set
    against its own input rate: a model made free still billed its cached tokens."""
    free = {"gpt-5-mini": {"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0}}
    server = FakeOpenAIServer(TurnScript(THREE_TURNS), prompt_cache=True, cache_min_tokens=64)
    with server:
        kwargs = openai_kwargs(server, model_name="gpt-5-mini")
        async with RLM("openai", kwargs, models=free, max_budget=1.0) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    summary = result.usage_summary.model_usage_summaries["gpt-5-mini"]
    assert summary.cached_tokens > 0 and summary.total_cost == 0.0


async def test_a_cache_key_given_as_text_or_in_extra_body_is_the_one_sent() -> None:
    """``prompt_cache_key="tenant-42"`` (OpenAI's own field is text) was taken as on and
    the derived key sent instead; one in ``extra_body`` was overwritten on root turns."""
    sent: dict[str, set[str]] = {}
    for name, overrides in (
        ("text", {"prompt_cache_key": "tenant-42"}),
        ("extra", {"extra_body": {"prompt_cache_key": "tenant-7"}}),
    ):
        with FakeOpenAIServer(TurnScript(THREE_TURNS)) as server:
            async with RLM("openai", openai_kwargs(server, **overrides)) as rlm:
                await rlm.acompletion("ctx", root_prompt="q")
                await rlm.acompletion("other ctx", root_prompt="another q")
            sent[name] = {b["prompt_cache_key"] for b in server.bodies if is_turn(b)}
    assert sent == {"text": {"tenant-42"}, "extra": {"tenant-7"}}


def test_prompt_caching_that_is_not_true_or_false_is_refused() -> None:
    with pytest.raises(ConfigError, match="prompt_caching must be True or False, not 'false'"):
        RLM("anthropic", {"model_name": "claude-test", "api_key": "k", "prompt_caching": "false"})


@pytest.mark.parametrize(
    "overrides", [{"extra_body": {"prompt_cache_key": "mine"}}, {"prompt_cache_key": False}]
)
async def test_a_refusal_naming_a_key_the_provider_did_not_add_is_not_asked_again(
    overrides: dict[str, Any],
) -> None:
    """A key of the user's own (``extra_body``) is theirs to drop; a 400 that only
    mentions the field, for a provider that sent none, is the call's failure."""

    def refuse(body: dict[str, Any]) -> Any:
        return Reply.error(400, "Unrecognized request argument supplied: prompt_cache_key")

    with FakeOpenAIServer(refuse) as server:
        async with RLM("openai", openai_kwargs(server, **overrides)) as rlm:
            with pytest.raises(ProviderError, match="answered 400"):
                await rlm.acompletion("ctx", root_prompt="q")
        assert len(server.requests) == 1


async def test_completions_refused_the_cache_key_at_once_are_each_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two completions' first turns refused together: the second's refusal came after the
    first had switched the key off, and was to be asked again all the same."""
    import trio

    script = TurnScript(THREE_TURNS)
    arrived: list[int] = []

    def strict(body: dict[str, Any]) -> Any:
        if "prompt_cache_key" in body:
            arrived.append(1)
            while len(arrived) < 2:  # both in flight before either is refused
                time.sleep(0.01)
            return Reply.error(400, "Unrecognized request argument supplied: prompt_cache_key")
        return script(body)

    answers: list[str] = []
    with FakeOpenAIServer(strict) as server:
        with caplog.at_level("WARNING", logger="rlm_graph"):
            async with RLM("openai", openai_kwargs(server)) as rlm:

                async def one(prompt: str) -> None:
                    answers.append((await rlm.acompletion("ctx", root_prompt=prompt)).response)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(one, "q")
                    nursery.start_soon(one, "another q")
        refused = [status for status, _ in server.responses if status == 400]
    assert len(answers) == 2 and all(a.startswith("done:") for a in answers)
    assert len(refused) == 2  # each first turn once; nothing sends the key after
    assert caplog.text.count("refused the prompt_cache_key field") == 1
