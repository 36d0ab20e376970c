"""Hedged sub-calls over real HTTP: a duplicate goes only past the latency quantile and
within ``max_extra`` (counted at the server), the loser is cancelled, the answers are the
winners', both requests are counted, the journal keeps the winner."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import RLM, ConfigError
from rlm_graph.cli import main
from rlm_graph.graph import NodeKind
from rlm_graph.testing import FakeOpenAIServer, Lognormal, Reply, last_user_message
from tests.support.http import KEY, openai_kwargs

pytestmark = pytest.mark.slow  # real HTTP with latencies, seconds by design

FAST = 0.05  # seconds a sub-call takes at the server
LAG = 0.4  # ... one whose prompt starts with "lag" (the tail of the first round)
SLOW = 2.5  # ... and the first request of a straggler


class Stragglers:
    """A responder: root turns write ``code``; a sub-call answers ``<prompt> #<n>``, n the
    request's number for that prompt (1: the first, 2: its duplicate). The first request
    of a prompt starting with ``slow`` takes `SLOW` seconds, one starting with ``lag``
    `LAG`, every other `FAST`."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Any:
        if any(m.get("role") == "system" for m in body["messages"]):
            return f"```repl\n{self.code}\n```"
        prompt = last_user_message(body)
        with self.lock:
            self.seen[prompt] += 1
            n = self.seen[prompt]
        delay = SLOW if prompt.startswith("slow") and n == 1 else FAST
        if prompt.startswith("lag"):
            delay = LAG
        return Reply(body=f"{prompt} #{n}", delay=delay)


# The first round's latencies: 13 at FAST, 3 at LAG; their 90th percentile is LAG, well
# clear of the jitter of the fast calls of the second round.
ROUNDS = (
    "first = llm_query_batched([f'warm {i}' for i in range(13)] + ['lag 0', 'lag 1', 'lag 2'])\n"
    "second = llm_query_batched([f'fast {i}' for i in range(14)] + ['slow a', 'slow b'])\n"
    "FINAL(' | '.join(first + second))"
)


def _hang_ups(server: Any, expected: int) -> int:
    """The hang-ups the server saw, once ``expected`` of them (or 10 s): each is noticed
    by the request's own server thread, which a loaded machine may run late."""
    deadline = time.monotonic() + 10
    while server.cancelled < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.cancelled


def _llm_calls(result: Any) -> list[Any]:
    return [r for r in result.graph.records() if r.kind == NodeKind.LLM_CALL]


def test_a_straggler_gets_a_duplicate_that_wins_and_its_first_request_is_cancelled() -> None:
    script = Stragglers(ROUNDS)
    with FakeOpenAIServer(script) as server:
        # min_samples=16: the first round's calls learn a delay only when all have answered.
        rlm = RLM("openai", openai_kwargs(server), hedge={"min_samples": 16})
        result = rlm.completion("ctx", root_prompt="q")
        cancelled = _hang_ups(server, 2)
    answers = result.response.split(" | ")
    # In order, every answer right; the stragglers' are their duplicates'.
    first = [f"warm {i}" for i in range(13)] + ["lag 0", "lag 1", "lag 2"]
    second = [f"fast {i}" for i in range(14)] + ["slow a", "slow b"]
    assert [a.rsplit(" #", 1)[0] for a in answers] == first + second
    assert answers[-2:] == ["slow a #2", "slow b #2"]
    # The first round had no delay before its last call answered: nothing in it hedged.
    assert all(script.seen[prompt] == 1 for prompt in first)
    # Only the stragglers got a duplicate (within max_extra, 10% of 32 calls), each once
    # its first request had run past the quantile of the latencies seen (LAG).
    duplicates = [p for p, n in script.seen.items() if n == 2]
    assert set(duplicates) == {"slow a", "slow b"}
    sent = {}
    for request in server.requests:
        prompt = last_user_message(request.body)
        if prompt in duplicates:
            sent.setdefault(prompt, []).append(request.start)
    # (Server-side times: a loaded machine may start the first request's server thread
    # late, within a burst of 16, and the idle server the duplicate's at once.)
    assert all(later - first >= 0.5 * LAG for first, later in sent.values())
    # Their first requests were cancelled: the server saw the client hang up.
    assert cancelled >= 2
    hedged = {r.input_preview: r for r in _llm_calls(result) if r.hedge is not None}
    assert set(hedged) == set(duplicates)
    assert all(r.hedge == "won" and r.attempts == 2 for r in hedged.values())
    # The engine's own times: each waited for the quantile (LAG) before its duplicate,
    # which answered at once.
    assert all(r.end - r.start >= 0.9 * LAG for r in hedged.values())
    # Both requests are counted: a hedged call's usage is twice a plain one's.
    plain = next(r for r in _llm_calls(result) if r.input_preview == "fast 0")
    assert plain.usage is not None and plain.hedge is None
    for record in hedged.values():
        assert record.usage is not None and record.usage.estimated
        assert record.usage.input_tokens == 2 * plain.usage.input_tokens


def test_duplicates_stay_within_max_extra_under_a_heavy_tail() -> None:
    code = (
        "got = []\n"
        "for r in range(4):\n"
        "    got += llm_query_batched([f'{r}-{i}' for i in range(32)])\n"
        "FINAL(str(sum(a == f'echo: {r}-{i}' for r in range(4) for i, a in "
        "enumerate(got[32 * r : 32 * r + 32]))))"
    )

    def respond(body: dict[str, Any]) -> str:
        if any(m.get("role") == "system" for m in body["messages"]):
            return f"```repl\n{code}\n```"
        return "echo: " + last_user_message(body)

    latency = Lognormal(median=0.03, p99=0.6, seed=11)
    with FakeOpenAIServer(respond, latency=latency) as server:
        rlm = RLM("openai", openai_kwargs(server), hedge={"max_extra": 0.05, "min_samples": 8})
        result = rlm.completion("ctx", root_prompt="q")
        sub_requests = [r for r in server.requests if "system" not in str(r.body["messages"])]
    assert result.response == "128"
    extra = len(sub_requests) - 128
    hedged = sum(r.hedge is not None for r in _llm_calls(result))
    assert 0 < extra <= hedged <= 0.05 * 128
    # (A duplicate cancelled the moment it got its slot may never reach the server; it
    # is counted all the same: usage may count one too many, never one too few.)


def test_without_hedge_a_straggler_is_waited_for() -> None:
    script = Stragglers("FINAL(llm_query_batched(['fast 1', 'slow c'])[1])")
    with FakeOpenAIServer(script) as server:
        result = RLM("openai", openai_kwargs(server)).completion("ctx", root_prompt="q")
        cancelled = server.cancelled
    assert result.response == "slow c #1"
    assert cancelled == 0


def test_the_journal_keeps_the_winner(tmp_path: Path) -> None:
    journal = tmp_path / "run.sqlite"
    script = Stragglers(ROUNDS)
    with FakeOpenAIServer(script) as server:
        hedge = {"min_samples": 16}
        first = RLM("openai", openai_kwargs(server), hedge=hedge, journal=journal).completion(
            "ctx", root_prompt="q"
        )
        asked = len(server.requests)
        again = RLM("openai", openai_kwargs(server), hedge=hedge, journal=journal).completion(
            "ctx", root_prompt="q"
        )
        assert len(server.requests) == asked  # nothing asked twice
    assert again.response == first.response
    assert again.response.endswith("slow a #2 | slow b #2")


def test_a_duplicate_is_priced_and_counted_against_the_budget() -> None:
    models = {"gpt-test": {"input_usd_per_mtok": 1000.0, "output_usd_per_mtok": 1000.0}}
    script = Stragglers(ROUNDS)
    with FakeOpenAIServer(script) as server:
        rlm = RLM(
            "openai",
            openai_kwargs(server),
            hedge={"min_samples": 16},
            models=models,
            max_budget=100.0,
        )
        result = rlm.completion("ctx", root_prompt="q")
    # A roomy budget: the duplicates went and their cost is in the run's.
    hedged = [r for r in _llm_calls(result) if r.hedge is not None]
    plain = next(r for r in _llm_calls(result) if r.input_preview == "fast 0")
    assert len(hedged) == 2 and plain.cost is not None
    assert all(r.cost == pytest.approx(2 * plain.cost) for r in hedged)
    assert result.usage_summary.total_cost == pytest.approx(
        sum(r.cost or 0.0 for r in result.graph.records())
    )


@pytest.mark.parametrize(
    ("hedge", "message"),
    [
        ({"quantile": 1.5}, "quantile"),
        ({"qantile": 0.9}, "qantile"),
        ("yes", "hedge must be True, False or a dict"),
    ],
)
def test_bad_hedge_settings_name_the_fix(hedge: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RLM("scripted", {"respond": lambda r: "x"}, hedge=hedge)


def test_a_duplicate_that_would_pass_the_budget_does_not_go() -> None:
    # Each call reserves about $1.03 (its prompt and 1,024 output tokens at $1,000 a
    # million) and costs about $0.02: under max_budget=1.5 one call at a time fits, a
    # call and its duplicate do not.
    models = {"gpt-test": {"input_usd_per_mtok": 1000.0, "output_usd_per_mtok": 1000.0}}
    code = (
        "llm_query_batched([f'warm {i}' for i in range(8)] + ['lag 0', 'lag 1'])\n"
        "FINAL(llm_query('slow d'))"
    )
    script = Stragglers(code)
    with FakeOpenAIServer(script) as server:
        rlm = RLM("openai", openai_kwargs(server), hedge=True, models=models, max_budget=1.5)
        result = rlm.completion("ctx", root_prompt="q")
    assert result.response == "slow d #1"
    assert script.seen["slow d"] == 1
    assert result.stop_reason is None


def test_the_cli_hedges_with_a_flag_and_names_a_bad_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    context = tmp_path / "context.txt"
    context.write_text("ctx", encoding="utf-8")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    script = Stragglers(ROUNDS)
    with FakeOpenAIServer(script) as server:
        args = ["run", "--context", str(context), "--query", "q", "--model", "gpt-test"]
        args += ["--base-url", server.base_url, "--api-key-env", "OPENAI_API_KEY"]
        args += ["--environment", "local", "--max-timeout", "60"]
        assert main([*args, "--hedge", '{"min_samples": 16}']) == 0
        assert capsys.readouterr().out.strip().endswith("slow a #2 | slow b #2")
        assert main([*args, "--hedge"]) == 0
        capsys.readouterr()
        assert main([*args, "--hedge", "often"]) == 2
    assert "--hedge takes no value or a JSON object" in capsys.readouterr().err


def test_a_straggler_of_the_first_batch_is_hedged_once_enough_have_answered() -> None:
    # No latency is known when the batch starts; after 8 answers one is, and the
    # straggler (started with them) gets its duplicate then. (max_extra=0.5: the fast
    # calls still in flight at that moment may take a duplicate too.)
    script = Stragglers(
        "FINAL(llm_query_batched([f'fast {i}' for i in range(12)] + ['slow e'])[-1])"
    )
    with FakeOpenAIServer(script) as server:
        rlm = RLM("openai", openai_kwargs(server), hedge={"max_extra": 0.5})
        result = rlm.completion("ctx", root_prompt="q")
    assert result.response == "slow e #2"


def test_a_duplicate_left_waiting_for_a_slot_is_not_counted() -> None:
    # max_concurrent=1: the straggler's duplicate waits for the slot its first request
    # holds, gets it only as that request answers, and never goes.
    code = (
        "llm_query_batched([f'warm {i}' for i in range(8)] + ['lag 0', 'lag 1'])\n"
        "FINAL(llm_query('slow f'))"
    )
    script = Stragglers(code)
    with FakeOpenAIServer(script) as server:
        rlm = RLM("openai", openai_kwargs(server, max_concurrent=1), hedge=True)
        result = rlm.completion("ctx", root_prompt="q")
    assert result.response == "slow f #1" and script.seen["slow f"] == 1
    record = next(r for r in _llm_calls(result) if r.input_preview == "slow f")
    assert record.hedge is None and record.attempts == 1
    assert record.usage is not None and not record.usage.estimated


class FailingDuplicates(Stragglers):
    """`Stragglers`, but a straggler's duplicate is refused at once (a 400)."""

    def __call__(self, body: dict[str, Any]) -> Any:
        reply = super().__call__(body)
        prompt = last_user_message(body)
        if prompt.startswith("slow") and self.seen[prompt] == 2:
            return Reply.error(400, "no duplicates here")
        return reply


def test_a_duplicate_that_failed_is_not_billed() -> None:
    script = FailingDuplicates(ROUNDS)
    with FakeOpenAIServer(script) as server:
        rlm = RLM("openai", openai_kwargs(server), hedge={"min_samples": 16})
        result = rlm.completion("ctx", root_prompt="q")
    assert result.response.endswith("slow a #1 | slow b #1")
    plain = next(r for r in _llm_calls(result) if r.input_preview == "fast 0")
    for prompt in ("slow a", "slow b"):
        record = next(r for r in _llm_calls(result) if r.input_preview == prompt)
        assert record.hedge == "lost" and record.status == "ok"
        assert record.usage is not None and plain.usage is not None
        assert record.usage.input_tokens == plain.usage.input_tokens  # one request billed


def test_a_duplicate_takes_the_providers_rate_buckets_as_any_request_does() -> None:
    """With ``requests_per_minute=31`` a batch of thirty (and the root turn) empties the
    bucket: the two stragglers' duplicates went out at once all the same. Now they wait
    for it (a token every 60/31 seconds after the first request): on a quick machine the
    stragglers answer first and no duplicate goes; on a slow one a duplicate may go, but
    never before its token."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    code = "got = llm_query_batched([f'fast {i}' for i in range(28)] + ['slow a', 'slow b'])"

    def respond(body: dict[str, Any]) -> Any:
        if any(m.get("role") == "system" for m in body["messages"]):
            turn = sum(m.get("role") == "assistant" for m in body["messages"])
            return f"```repl\n{code}\n```" if turn == 0 else "```repl\nFINAL(' | '.join(got))\n```"
        prompt = last_user_message(body)
        with lock:
            seen[prompt] += 1
        slow = prompt.startswith("slow") and seen[prompt] == 1
        return Reply(body=prompt, delay=1.2 if slow else 0.05)

    with FakeOpenAIServer(respond) as server:
        kwargs = openai_kwargs(server, requests_per_minute=31)
        rlm = RLM("openai", kwargs, hedge={"quantile": 0.5, "min_samples": 4, "max_extra": 1.0})
        result = rlm.completion("ctx", root_prompt="q")
    assert result.response.split(" | ") == [f"fast {i}" for i in range(28)] + ["slow a", "slow b"]
    starts = sorted(r.start for r in server.requests)
    for extra, start in enumerate(starts[31:], start=1):  # past the minute's 31 requests
        assert start - starts[0] >= extra * 60 / 31 - 0.25  # each waited for its token
    assert max(seen.values()) <= 2
