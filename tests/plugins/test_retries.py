"""Retries over real HTTP: 429 with Retry-After, 5xx, dropped connections, timeouts; and
the failures that must not be retried (401, 404, 400)."""

from __future__ import annotations

import email.utils
import logging
import re
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from rlm_graph._http.provider import parse_duration, parse_retry_after, retry_delay_from_headers
from rlm_graph._http.retry import exhausted_for
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderNotFound,
    ProviderTimeout,
    RateLimited,
)
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, Reply, last_user_message
from rlm_graph_anthropic import AnthropicProvider
from rlm_graph_openai import OpenAIProvider
from tests.support.http import KEY, anthropic_kwargs, openai_kwargs

REQUEST = ChatRequest(messages=(Message(role="user", content="hello"),), model="gpt-test")


async def _complete(provider: OpenAIProvider | AnthropicProvider) -> str:
    try:
        return (await provider.complete(REQUEST)).content
    finally:
        await provider.aclose()


async def test_429_with_retry_after_waits_then_succeeds() -> None:
    replies = [Reply.error(429, "Rate limit reached", retry_after="0.2"), "ok"]
    with FakeOpenAIServer(replies=replies) as server:
        start = trio.current_time()
        assert await _complete(OpenAIProvider(**openai_kwargs(server))) == "ok"
        waited = trio.current_time() - start
    assert len(server.requests) == 2
    assert 0.2 <= waited < 2.0
    gap = server.requests[1].start - (server.requests[0].end or 0)
    assert gap >= 0.19


async def test_429_retry_after_is_honoured_in_mock_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers = iter(
        [
            httpx.Response(429, headers={"Retry-After": "30"}, json={"error": {"message": "slow"}}),
            httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]}),
        ]
    )
    provider = OpenAIProvider(
        backend="vllm", model_name="m", transport=httpx.MockTransport(lambda r: next(answers))
    )
    start = trio.current_time()
    assert await _complete(provider) == "ok"
    assert 30 <= trio.current_time() - start <= 30 * 1.25


async def test_500_then_success() -> None:
    with FakeOpenAIServer(
        replies=[Reply.error(500, "boom"), Reply.error(503, "busy"), "ok"]
    ) as server:
        assert await _complete(OpenAIProvider(**openai_kwargs(server))) == "ok"
    assert len(server.requests) == 3


async def test_dropped_connection_then_success() -> None:
    with FakeAnthropicServer(replies=[Reply.dropped(), "ok"]) as server:
        assert await _complete(AnthropicProvider(**anthropic_kwargs(server))) == "ok"
    assert len(server.requests) == 2


async def test_slow_answer_times_out_and_is_retried() -> None:
    # Deadlines of 0.5 s, then 1 s: the late answer misses the first, "ok" (its server
    # thread answering at once) has a second to reach the second.
    with FakeOpenAIServer(replies=[Reply(body="late", delay=2.0), "ok"]) as server:
        provider = OpenAIProvider(**openai_kwargs(server, timeout=0.5))
        assert await _complete(provider) == "ok"


async def test_every_attempt_timing_out_raises_provider_timeout() -> None:
    with FakeOpenAIServer(latency=0.5) as server:
        provider = OpenAIProvider(**openai_kwargs(server, timeout=0.1, max_attempts=2))
        # The second attempt had twice the first one's deadline.
        with pytest.raises(ProviderTimeout, match="within 0.2 s"):
            await _complete(provider)


async def test_retries_run_out_with_a_clear_rate_limited_error() -> None:
    with FakeOpenAIServer(lambda body: Reply.error(429, "Too many requests")) as server:
        provider = OpenAIProvider(**openai_kwargs(server, max_attempts=3))
        with pytest.raises(RateLimited) as info:
            await _complete(provider)
    assert len(server.requests) == 3
    message = str(info.value)
    assert "429" in message and "Too many requests" in message
    assert "gave up after 3 attempts" in message and "requests_per_minute" in message


async def test_a_wait_beyond_max_retry_after_fails_at_once() -> None:
    with FakeOpenAIServer(lambda body: Reply.error(429, "quota", retry_after="3600")) as server:
        provider = OpenAIProvider(**openai_kwargs(server, max_retry_after=60))
        with pytest.raises(RateLimited, match="max_retry_after"):
            await _complete(provider)
    assert len(server.requests) == 1


async def test_401_fails_at_once_naming_the_key_and_quoting_the_server() -> None:
    with FakeOpenAIServer(api_key="sk-test-other-9999") as server:
        with pytest.raises(ProviderAuthError) as info:
            await _complete(OpenAIProvider(**openai_kwargs(server)))
    assert len(server.requests) == 1
    message = str(info.value)
    assert "401" in message and "API key" in message and "Incorrect API key provided" in message
    assert KEY not in message
    assert (
        info.value.__cause__ is None
    )  # raised from None: no httpx.Request (with its headers) attached


async def test_anthropic_401_fails_at_once() -> None:
    with FakeAnthropicServer(api_key="sk-test-other-9999") as server:
        with pytest.raises(ProviderAuthError, match="invalid x-api-key"):
            await _complete(AnthropicProvider(**anthropic_kwargs(server)))
    assert len(server.requests) == 1


async def test_404_fails_at_once_naming_model_and_base_url() -> None:
    with FakeOpenAIServer(models=["gpt-real"]) as server:
        with pytest.raises(ProviderNotFound) as info:
            await _complete(OpenAIProvider(**openai_kwargs(server)))
    assert len(server.requests) == 1
    message = str(info.value)
    assert "model name" in message and "base URL" in message and server.base_url in message
    assert "does not exist" in message


async def test_wrong_base_url_is_a_404_naming_it() -> None:
    with FakeOpenAIServer() as server:
        provider = OpenAIProvider(**openai_kwargs(server, base_url=server.url))  # no /v1
        with pytest.raises(ProviderNotFound, match="base URL"):
            await _complete(provider)


async def test_400_is_not_retried() -> None:
    with FakeOpenAIServer(replies=[Reply.error(400, "max_tokens is too large")]) as server:
        with pytest.raises(ProviderError, match="max_tokens is too large") as info:
            await _complete(OpenAIProvider(**openai_kwargs(server)))
    assert len(server.requests) == 1
    assert info.value.status_code == 400 and not info.value.retryable


async def test_connection_refused_is_retried_then_explained() -> None:
    with FakeOpenAIServer() as server:
        url = server.base_url
    provider = OpenAIProvider(
        backend="vllm", model_name="m", base_url=url, backoff_base=0.001, max_attempts=2
    )
    with pytest.raises(ProviderError, match="check base_url"):
        await _complete(provider)


def test_retry_after_seconds_and_http_date() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("0.25") == 0.25
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(12, abs=1)
    assert parse_retry_after("soon") is None


async def test_a_rate_limit_reset_already_past_is_no_wait_and_the_call_is_retried() -> None:
    """An ``x-ratelimit-reset`` time just gone (clock skew, a window that just reset)
    was a negative wait: trio's ValueError failed the call at once, unretried."""
    import time

    past = str(int(time.time()) - 30)
    refused = Reply(429, {"error": {"message": "slow down"}}, headers={"x-ratelimit-reset": past})
    with FakeOpenAIServer(replies=[refused, "ok"]) as server:
        provider = OpenAIProvider(**openai_kwargs(server))
        assert await _complete(provider) == "ok"
    assert len(server.requests) == 2
    assert retry_delay_from_headers({"x-ratelimit-reset": past}) == 0.0


def test_reset_headers() -> None:
    assert parse_duration("6m0s") == 360
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_duration("1s") == 1
    assert parse_duration("1x") is None
    now = 1_700_000_000.0
    assert retry_delay_from_headers({"retry-after-ms": "1500"}, now) == 1.5
    assert (
        retry_delay_from_headers(
            {"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "6m0s"}, now
        )
        == 360
    )
    assert retry_delay_from_headers({"x-ratelimit-reset": str(now + 5)}, now) == pytest.approx(5)
    anthropic = {"anthropic-ratelimit-requests-reset": "2023-11-14T22:13:30Z"}
    assert retry_delay_from_headers(anthropic, now) == pytest.approx(10)
    assert retry_delay_from_headers({}, now) is None


def test_an_answer_saying_its_rate_window_is_used_up_names_the_wait() -> None:
    headers = httpx.Headers(
        {"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "1.5s"}
    )
    assert exhausted_for(headers) == pytest.approx(1.5)
    room = {"x-ratelimit-remaining-requests": "12", "x-ratelimit-reset-requests": "1s"}
    assert exhausted_for(room) is None
    tokens = {"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": "2s"}
    assert exhausted_for(tokens) == pytest.approx(2.0)
    assert exhausted_for({"x-ratelimit-remaining-requests": "zero"}) is None


def test_a_wait_beyond_max_retry_after_still_holds_the_providers_other_requests() -> None:
    """The call asked to wait an hour fails at once, as before; the provider's other
    requests were sent straight after it, each refused in turn, instead of waiting (up
    to the engine's 60 s hold) as a shorter wait makes them."""
    from rlm_graph import Engine, Workflow

    refused = Reply.error(429, "Quota used up", retry_after="3600")
    with FakeOpenAIServer(replies=[refused, "ok", "ok"]) as server:
        engine = Engine("openai", openai_kwargs(server, max_concurrent=1), max_timeout=1)
        wf = Workflow()
        wf.llm("first", id="first")
        wf.llm("second", id="second")
        result = engine.run(wf)
    (refused_node,) = result.errors  # whichever went first
    assert "more than max_retry_after" in result.errors[refused_node]
    assert len(server.requests) == 1  # the other waited, and the run's deadline came
    assert result.stop_reason == "max_timeout"


async def test_a_429_waits_for_the_reset_of_the_window_it_used_up() -> None:
    """The requests window is used up and resets at once; the tokens window has room and
    resets fully in 6 minutes. The wait was the longest reset (360 s, past
    max_retry_after: the call failed at once), not the used-up window's."""
    windows = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "20ms",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    refused = Reply(429, {"error": {"message": "Rate limit reached"}}, headers=windows)
    with FakeOpenAIServer(replies=[refused, "ok"]) as server:
        assert await _complete(OpenAIProvider(**openai_kwargs(server))) == "ok"
    assert len(server.requests) == 2
    assert retry_delay_from_headers(windows) == pytest.approx(0.02)
    # No window said used up: the longest reset, as before (a tokens window with some
    # room may still be too small for the request).
    room = {**windows, "x-ratelimit-remaining-requests": "3"}
    assert retry_delay_from_headers(room) == 360


# OpenAI's headers on every answer, a 500 included: both windows have room, the tokens
# window refills fully in 6 minutes.
_OPENAI_WINDOWS = {
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-reset-requests": "120ms",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-tokens": "6m0s",
}


@pytest.mark.parametrize(
    "failed",
    [
        Reply(500, {"error": {"message": "The server had an error"}}, headers=_OPENAI_WINDOWS),
        Reply(body="cut", fault="truncated", headers=_OPENAI_WINDOWS),
        Reply(
            503,
            {"error": {"message": "overloaded"}},
            headers={**_OPENAI_WINDOWS, "x-ratelimit-remaining-tokens": "0"},
        ),
    ],
    ids=["500", "truncated 200", "503 with a used-up window"],
)
async def test_a_server_error_carrying_reset_headers_is_retried_on_the_backoff(
    failed: Reply, caplog: pytest.LogCaptureFixture
) -> None:
    """The reset headers OpenAI sends on every answer were read as a wait on a 500 or a
    cut-off 200: the 6-minute refill of the tokens window is past max_retry_after, so the
    call failed at once ("asked to wait 360 s") instead of being retried; a 503 naming a
    used-up window held the call (and the provider) for that window's reset."""
    with FakeOpenAIServer(replies=[failed, "ok"]) as server:
        provider = OpenAIProvider(**openai_kwargs(server, backoff_base=0.05))
        with caplog.at_level(logging.DEBUG, logger="rlm_graph.providers"):
            assert await _complete(provider) == "ok"
    assert len(server.requests) == 2
    (wait,) = _waits(caplog)
    assert wait <= 0.05  # the computed backoff, not a reset
    # Retry-After on a 5xx is still a named wait.
    assert retry_delay_from_headers({"retry-after": "2"}, rate_limited=False) == 2
    assert retry_delay_from_headers(_OPENAI_WINDOWS, rate_limited=False) is None


def _waits(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The waits the provider chose before its retries, from its DEBUG lines."""
    found = [re.search(r"retrying in ([\d.]+) s", r.getMessage()) for r in caplog.records]
    return [float(match.group(1)) for match in found if match]


@pytest.mark.parametrize("named", ["0", "-5", "Wed, 21 Oct 2015 07:28:00 GMT"])
async def test_a_retry_after_of_nothing_waits_no_less_than_the_backoff(
    named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``Retry-After: 0`` (or negative, or a date already past) was a retry at once: a
    storm of them used all ten attempts up in well under a second."""
    refused = Reply.error(429, "quota", retry_after=named)
    with FakeOpenAIServer(replies=[refused, refused, "ok"]) as server:
        provider = OpenAIProvider(**openai_kwargs(server, backoff_base=0.05))
        with caplog.at_level(logging.DEBUG, logger="rlm_graph.providers"):
            assert await _complete(provider) == "ok"
    assert len(server.requests) == 3
    # The computed backoff of retries 1 and 2: 0.05 and 0.1 s, less up to 25% jitter
    # (the log rounds to hundredths).
    first, second = _waits(caplog)
    assert first >= 0.03 and second >= 0.07


async def test_the_jitter_never_takes_a_named_wait_past_max_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server asking for 0.3 s with max_retry_after=0.3: the wait was up to 25% more
    (the jitter), past the longest wait the user allowed."""
    refused = Reply.error(429, "quota", retry_after="0.3")
    with FakeOpenAIServer(replies=[refused] * 4 + ["ok"]) as server:
        kwargs = openai_kwargs(server, backoff_base=0.01, max_retry_after=0.3)
        with caplog.at_level(logging.DEBUG, logger="rlm_graph.providers"):
            assert await _complete(OpenAIProvider(**kwargs)) == "ok"
    waits = _waits(caplog)
    assert waits == [0.3] * 4  # the log rounds to hundredths


async def test_a_huge_named_wait_is_said_readably() -> None:
    refused = Reply.error(429, "slow down", retry_after="1e300")
    with FakeOpenAIServer(replies=[refused]) as server:
        provider = OpenAIProvider(**openai_kwargs(server, max_retry_after=0.5))
        with pytest.raises(RateLimited) as info:
            await _complete(provider)
    message = str(info.value)
    assert "asked to wait more than a day, more than max_retry_after=0.5 s" in message
    assert "0000" not in message  # not the 301 digits of 1e300


@pytest.mark.parametrize("max_concurrent", [None, 1])  # an adaptive limit, a fixed one
def test_a_wait_past_max_retry_after_holds_the_others_no_longer_than_it(
    max_concurrent: int | None,
) -> None:
    """The refused call fails at once; the next sub-call was held for the server's 30 s
    (up to the engine's 60 s), whatever max_retry_after said."""
    from rlm_graph import RLM

    code = "a = llm_query('first')\nb = llm_query('second')\nFINAL(a + ' || ' + b)"

    def respond(body: dict[str, object]) -> str | Reply:
        if any(m.get("role") == "system" for m in body["messages"]):  # type: ignore[attr-defined]
            return f"```repl\n{code}\n```"
        if last_user_message(body) == "first":
            return Reply.error(429, "slow down", retry_after="30")
        return "echo " + last_user_message(body)

    with FakeOpenAIServer(respond) as server:
        kwargs = openai_kwargs(server, max_retry_after=0.2, max_concurrent=max_concurrent)
        # Held for the server's 30 s, the second sub-call would meet the run's deadline.
        result = RLM("openai", kwargs, max_timeout=20).completion("ctx", root_prompt="q")
    first, second = result.response.split(" || ")
    assert first.startswith("[ERROR] RateLimited") and "max_retry_after=0.2 s" in first
    assert second == "echo second"
    assert result.stop_reason != "max_timeout"


def test_a_streamed_refusals_window_holds_the_others_no_longer_than_max_retry_after() -> None:
    """A streamed turn (a child's root turn) refused with a 429 whose window headers say
    used up, resetting in 30 s: the provider's other requests were held the 30 s,
    whatever max_retry_after said, since a streamed answer's headers were noted before
    its status was looked at (a whole reply's only when it is an answer)."""
    from rlm_graph import RLM

    used_up = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s"}
    code = "a = rlm_query('child task')\nb = llm_query('second')\nFINAL(a[:40] + ' || ' + b)"
    streamed: list[bool] = []

    def respond(body: dict[str, Any]) -> str | Reply:
        if any(m.get("role") == "system" for m in body["messages"]):
            streamed.append(bool(body.get("stream")))
            if len(streamed) == 2:  # the child's root turn
                return Reply(429, {"error": {"message": "Rate limit reached"}}, headers=used_up)
            return f"```repl\n{code}\n```"
        return "echo " + last_user_message(body)

    with FakeOpenAIServer(respond) as server:
        kwargs = openai_kwargs(server, max_retry_after=0.2)
        result = RLM("openai", kwargs, max_timeout=20, max_depth=2).completion(
            "ctx", root_prompt="q"
        )
    assert streamed[:2] == [True, True]
    child, second = result.response.split(" || ")
    assert child.startswith("[ERROR] RateLimited")
    assert second == "echo second"  # not held past the run's deadline
    assert result.stop_reason != "max_timeout"


def test_a_retry_cancelled_during_its_wait_is_not_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's deadline came while the call waited the 30 s its 500 asked for: one
    request went, one attempt (the node said 2, and the run's summary "1 retry")."""
    from rlm_graph import Engine, Workflow

    with FakeOpenAIServer(lambda body: Reply.error(500, "oops", retry_after="30")) as server:
        engine = Engine("openai", openai_kwargs(server), max_timeout=0.5)
        wf = Workflow()
        wf.llm("first", id="first")
        with caplog.at_level(logging.WARNING, logger="rlm_graph"):
            result = engine.run(wf)
    assert result.stop_reason == "max_timeout"
    assert len(server.requests) == 1
    assert result.graph["first"].attempts == 1
    assert not [r for r in caplog.records if "retr" in r.getMessage()]
