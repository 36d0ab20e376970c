"""A server that hangs for good fails a call after ``max_timeouts`` growing deadlines
(60 + 120 + 240 s by default), not after ``max_attempts`` of them, and the run's first
timeout is a WARNING when it happens. Real HTTP against the fake server (its own thread);
trio's MockClock stands in for the minutes of waiting."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
import trio.testing

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.errors import ConfigError, ProviderTimeout
from rlm_graph.testing import FakeOpenAIServer, Reply, last_user_message
from rlm_graph_openai import OpenAIProvider
from tests.support.http import KEY, openai_kwargs

pytestmark = pytest.mark.slow  # deadlines that must pass: seconds by design

REQUEST = ChatRequest(messages=(Message(role="user", content="hello"),), model="gpt-test")


class _MockTimeRecords(logging.Handler):
    """Every record at WARNING or above, with the trio (mock) time it was logged at."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((trio.current_time(), record.getMessage()))


@pytest.fixture
def warnings() -> Iterator[_MockTimeRecords]:
    handler = _MockTimeRecords()
    logger = logging.getLogger("rlm_graph")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def _seen(server: FakeOpenAIServer, done: Callable[[], bool]) -> None:
    """Wait (in real time, on a thread) until the server has read what the client sent:
    a request whose client already hung up may still be in the server's accept queue."""

    def wait() -> None:
        for _ in range(1000):
            if done():
                return
            time.sleep(0.01)

    await trio.to_thread.run_sync(wait)


async def test_a_hung_server_fails_the_call_after_three_growing_deadlines(
    patient_clock: trio.testing.MockClock, warnings: _MockTimeRecords
) -> None:
    with FakeOpenAIServer(lambda body: Reply.hang(30)) as server:
        provider = OpenAIProvider(**openai_kwargs(server, timeout=60.0))  # the defaults
        assert (provider.retry.max_attempts, provider.retry.max_timeouts) == (10, 3)
        start = trio.current_time()
        try:
            with pytest.raises(ProviderTimeout) as info:
                await provider.complete(REQUEST)
            failed_after = trio.current_time() - start
        finally:
            await provider.aclose()
        await _seen(server, lambda: len(server.requests) >= 3)
        assert len(server.requests) == 3  # not max_attempts=10
    message = str(info.value)
    assert "3 attempts in a row timed out" in message and "60 s, 120 s, 240 s" in message
    assert "max_timeouts=3" in message and "timeout" in message and KEY not in message
    # 7 minutes of deadlines (plus the test's millisecond backoffs), not about an hour.
    assert 420 <= failed_after < 421
    # The user hears of it at the first timeout, a minute in, and only once.
    [(when, warning)] = warnings.seen
    assert 60 <= when - start < 61
    assert "within 60 s" in warning and "120 s deadline" in warning and "max_timeouts=3" in warning


async def test_any_other_answer_starts_the_count_and_the_deadline_again(
    patient_clock: trio.testing.MockClock,
) -> None:
    # A server that answers a 500 in between is alive, not hung: two timeouts, a 500, two
    # more timeouts never make three in a row.
    hang = Reply.hang(30)
    replies = [hang, hang, Reply.error(500, "boom"), hang, hang, "ok"]
    with FakeOpenAIServer(replies=replies) as server:
        provider = OpenAIProvider(**openai_kwargs(server, timeout=60.0))
        start = trio.current_time()
        try:
            assert (await provider.complete(REQUEST)).content == "ok"
        finally:
            await provider.aclose()
        took = trio.current_time() - start
    assert len(server.requests) == 6
    # Deadlines 60 + 120, then from 60 again: 60 + 120 (plus millisecond backoffs).
    assert 360 <= took < 361


async def test_max_timeouts_1_fails_at_the_first_timeout(
    patient_clock: trio.testing.MockClock, warnings: _MockTimeRecords
) -> None:
    with FakeOpenAIServer(lambda body: Reply.hang(30)) as server:
        provider = OpenAIProvider(**openai_kwargs(server, timeout=30.0, max_timeouts=1))
        try:
            with pytest.raises(
                ProviderTimeout, match=r"1 attempt timed out \(deadlines 30 s; 1 attempt in all"
            ):
                await provider.complete(REQUEST)
        finally:
            await provider.aclose()
        await _seen(server, lambda: len(server.requests) >= 1)
        assert len(server.requests) == 1
    assert warnings.seen == []  # the error says it all; nothing is retried


ROOT_CODE = """
r = llm_query_batched(["hang", "fine"])
answer["content"] = r[0] + " || " + r[1]
answer["ready"] = True
"""


def _respond(body: dict[str, Any]) -> str | Reply:
    if any(m.get("role") == "system" for m in body["messages"]):
        return f"```repl\n{ROOT_CODE}\n```"
    prompt = last_user_message(body)
    return Reply.hang(30) if prompt == "hang" else "sub:" + prompt


async def test_a_hung_sub_call_is_an_error_slot_naming_its_timeouts(
    patient_clock: trio.testing.MockClock,
) -> None:
    with FakeOpenAIServer(_respond) as server:
        async with RLM("openai", openai_kwargs(server, timeout=60.0)) as rlm:
            result = await rlm.acompletion("the context")
        hung = lambda: [b for b in server.bodies if last_user_message(b) == "hang"]  # noqa: E731
        await _seen(server, lambda: len(hung()) >= 3)
        assert len(hung()) == 3
    error, fine = result.response.split(" || ")
    assert error.startswith("[ERROR] ProviderTimeout:") and "3 attempts in a row timed out" in error
    assert fine == "sub:fine"
    [call] = [r for r in result.graph.records(NodeKind.LLM_CALL) if r.status == NodeStatus.ERROR]
    assert call.attempts == 3


@pytest.mark.parametrize("bad", [0, -1, "three"])
def test_a_bad_max_timeouts_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_timeouts"):
        OpenAIProvider(backend="vllm", model_name="m", max_timeouts=bad)
