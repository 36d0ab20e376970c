"""The adaptive concurrency limit over real HTTP: it rises against a roomy server,
settles under a tight one (429s counted at the server), holds across threads, never
passes an explicit ``max_concurrent``, and honours the servers' rate-limit headers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.cli import main
from rlm_graph.concurrency import DEFAULT_INITIAL
from rlm_graph.concurrency.limiter import InProcessLimiter
from rlm_graph.events import ConcurrencyLimit
from rlm_graph.testing import FakeOpenAIServer, Reply
from tests.support.http import KEY, openai_kwargs

pytestmark = pytest.mark.slow  # real HTTP with latencies, seconds by design


def _root_then(code: str):  # type: ignore[no-untyped-def]
    """A responder: root turns (a system message) write ``code``; sub-calls answer
    ``ok <prompt>``."""

    def respond(body: dict[str, Any]) -> str:
        if any(m.get("role") == "system" for m in body["messages"]):
            return f"```repl\n{code}\n```"
        return "ok " + body["messages"][-1]["content"]

    return respond


def _batches(rounds: int, width: int) -> str:
    return (
        "good = 0\n"
        f"for r in range({rounds}):\n"
        f"    got = llm_query_batched([f'{{r}}-{{i}}' for i in range({width})])\n"
        f"    good += sum(a == f'ok {{r}}-{{i}}' for i, a in enumerate(got))\n"
        "FINAL(str(good))"
    )


def _limit_of(rlm: RLM) -> int:
    limiter = rlm.engine.limiter
    assert isinstance(limiter, InProcessLimiter)
    (gate,) = limiter._gates.values()
    return gate.limit.limit


def test_the_limit_rises_past_its_start_against_a_roomy_server() -> None:
    heard: list[ConcurrencyLimit] = []
    # 0.3 s an answer: long enough for well over 64 requests to be in flight at once
    # at the server even on a loaded machine (sending one takes the engine ~1 ms).
    with FakeOpenAIServer(_root_then(_batches(3, 160)), latency=0.3) as server:
        rlm = RLM(
            "openai",
            openai_kwargs(server),
            batch_max_concurrent=160,
            listeners=[lambda e: heard.append(e) if isinstance(e, ConcurrencyLimit) else None],
        )
        result = rlm.completion("ctx", root_prompt="q")
    assert result.response == str(3 * 160)
    assert server.peak_in_flight > DEFAULT_INITIAL
    assert server.refused == 0
    assert _limit_of(rlm) > DEFAULT_INITIAL
    # The event stream said so as it happened (a loaded machine may slow the server as
    # it gets busier, and the limit may step back on that: it still ends above its start).
    assert heard and heard[0].limit > DEFAULT_INITIAL and heard[-1].limit > DEFAULT_INITIAL
    assert {e.provider for e in heard} == {"openai"}  # the backend's name, as docs say


def test_the_limit_settles_under_a_server_that_refuses_past_six() -> None:
    rounds, width = 8, 64
    with FakeOpenAIServer(
        _root_then(_batches(rounds, width)), latency=0.05, max_in_flight=6
    ) as server:
        rlm = RLM("openai", openai_kwargs(server))
        result = rlm.completion("ctx", root_prompt="q")
        sent = len(server.requests)
    # Every slot answered (before, 52 of 64 slots of one batch used up their retries).
    assert result.response == str(rounds * width)
    # The limit came down from 32 to about what the server takes (a little more: the
    # engine counts a request in flight until it has read the answer, the server until
    # it starts writing it), and probes above it rarely.
    assert _limit_of(rlm) <= 10
    assert server.refused < 0.05 * sent


def test_threads_share_one_adaptive_limit() -> None:
    with FakeOpenAIServer(_root_then(_batches(2, 32)), latency=0.05, max_in_flight=6) as server:
        rlm = RLM("openai", openai_kwargs(server))
        answers: list[str] = []

        def work() -> None:
            answers.append(rlm.completion("ctx", root_prompt="q").response)

        pool = [threading.Thread(target=work) for _ in range(3)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(120)
        sent = len(server.requests)
    assert answers == ["64"] * 3
    # One limit for the three threads: it counted every request any of them sent, and
    # came down for all of them: after the first wave (three batches of 16 at once, 6
    # taken) only a few probes were refused.
    limiter = rlm.engine.limiter
    assert isinstance(limiter, InProcessLimiter)
    (gate,) = limiter._gates.values()
    assert gate.limit.sent == sent
    assert gate.limit.limit <= 10
    assert server.refused <= 3 * 16 - 6 + 10


def test_an_explicit_max_concurrent_is_a_ceiling_never_passed() -> None:
    with FakeOpenAIServer(_root_then(_batches(2, 64)), latency=0.02) as server:
        rlm = RLM("openai", openai_kwargs(server, max_concurrent=5), batch_max_concurrent=64)
        result = rlm.completion("ctx", root_prompt="q")
    assert result.response == "128"
    assert server.peak_in_flight == 5
    assert _limit_of(rlm) == 5


def test_a_used_up_rate_window_holds_the_next_request_until_its_reset() -> None:
    code = "a = llm_query('one')\nb = llm_query('two')\nFINAL(a + ' ' + b)"
    window = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}
    replies = [f"```repl\n{code}\n```", Reply(body="first", headers=window), "second"]
    with FakeOpenAIServer(replies=replies) as server:
        result = RLM("openai", openai_kwargs(server)).completion("ctx", root_prompt="q")
        first, second = server.requests[1], server.requests[2]
    assert result.response == "first second"
    assert second.start - first.start >= 0.9


def test_a_named_wait_holds_every_request_to_that_provider() -> None:
    # Slot 0 is refused with Retry-After: 1 while slot 1 waits for a place; slot 1 must
    # not go before the server's wait is over.
    code = "got = llm_query_batched(['a', 'b'])\nFINAL(' '.join(got))"
    replies = [f"```repl\n{code}\n```", Reply.error(429, "slow down", retry_after="1")]
    with FakeOpenAIServer(_root_then(code), replies=replies) as server:
        rlm = RLM("openai", openai_kwargs(server, max_concurrent=1))
        result = rlm.completion("ctx", root_prompt="q")
        refused, later = server.requests[1], server.requests[2:]
    assert result.response == "ok a ok b"
    assert later and all(r.start - refused.start >= 0.9 for r in later)


def test_run_verbose_shows_the_limit_as_it_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    context = tmp_path / "context.txt"
    context.write_text("ctx", encoding="utf-8")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIServer(_root_then(_batches(2, 32)), latency=0.02, max_in_flight=6) as server:
        code = main(
            [
                "run",
                "--context",
                str(context),
                "--query",
                "q",
                "--model",
                "gpt-test",
                "--base-url",
                server.base_url,
                "--api-key-env",
                "OPENAI_API_KEY",
                "--environment",
                "local",
                "-v",
            ]
        )
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() == "64"
    moves = [line for line in err.splitlines() if "concurrency limit of openai:" in line]
    assert moves and "refused so far" in moves[-1]
    # The last progress line carries the limit too.
    assert " limit " in [line for line in err.splitlines() if "sub-calls" in line][-1]


def test_a_provider_that_declares_no_start_keeps_a_fixed_limit() -> None:
    # The scripted provider declares no initial_concurrency: its max_concurrent holds as
    # is, however its calls go; the HTTP providers' limit adapts below theirs.
    code = "```repl\nFINAL(llm_query('x'))\n```"
    rlm = RLM("scripted", {"respond": lambda r: code if r.system else "x", "max_concurrent": 3})
    assert rlm.completion("ctx").response == "x"
    limiter = rlm.engine.limiter
    assert isinstance(limiter, InProcessLimiter)
    (gate,) = limiter._gates.values()
    assert not gate.limit.adaptive and gate.limit.limit == 3


def test_a_named_wait_holds_the_requests_queued_for_a_place_too() -> None:
    # Two places; the first request is refused with Retry-After: 1. The requests queued
    # behind the two (and the one whose place frees first) wait the second out.
    code = "got = llm_query_batched(['a', 'b', 'c', 'd', 'e'])\nFINAL(' '.join(got))"
    replies = [f"```repl\n{code}\n```", Reply.error(429, "slow down", retry_after="1")]
    answer = _root_then(code)

    def slow(body: dict[str, Any]) -> Any:  # answers take 0.2 s; the refusal comes at once
        text = answer(body)
        return text if text.startswith("```") else Reply(body=text, delay=0.2)

    with FakeOpenAIServer(slow, replies=replies) as server:
        rlm = RLM("openai", openai_kwargs(server, max_concurrent=2))
        result = rlm.completion("ctx", root_prompt="q")
        refused, subs = server.requests[1], server.requests[2:]
    assert result.response == "ok a ok b ok c ok d ok e"
    later = [r for r in subs if r.start - refused.start > 0.03]  # not sent beside it
    assert len(later) >= 4 and all(r.start - refused.start >= 0.9 for r in later)
