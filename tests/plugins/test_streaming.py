"""Streamed root turns over real HTTP, against the fake servers streaming at a set rate:
blocks that start while the reply is still being written, the same run with streaming on
and off, cut and stalled streams, and what a retried stream may and may not do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.errors import ProviderError
from rlm_graph.events import NodeFinished, TextDelta
from rlm_graph.journal import JournalStore
from rlm_graph.protocol.fences import DIVERGED_NOTE, INVENTED_NOTE
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, Reply
from tests.support.http import anthropic_kwargs, openai_kwargs
from tests.support.streams import COMMENTARY, FINISH, TurnScript, is_turn, repl

pytestmark = pytest.mark.slow  # streams at a set rate: seconds by design

SERVERS: dict[str, Any] = {"openai": FakeOpenAIServer, "anthropic": FakeAnthropicServer}
KWARGS: dict[str, Any] = {"openai": openai_kwargs, "anthropic": anthropic_kwargs}
APIS = pytest.mark.parametrize("api", ["openai", "anthropic"])

FIRST = repl("x = llm_query('first')\nprint(x)", after=COMMENTARY)
BLOCK_END = FIRST.index("```\n", FIRST.index("```repl")) + len("```\n")


def _turns(server: Any) -> list[Any]:
    return [r for r in server.requests if is_turn(r.body)]


def _subcalls(server: Any) -> list[Any]:
    return [r for r in server.requests if not is_turn(r.body)]


@APIS
async def test_a_blocks_first_sub_call_reaches_the_server_before_the_root_stream_ends(
    api: str,
) -> None:
    script = TurnScript([FIRST, repl(FINISH)])
    with SERVERS[api](script, stream_rate=200) as server:
        async with RLM(api, KWARGS[api](server)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.response == "done:sub:first"
    root, sub = _turns(server)[0], _subcalls(server)[0]
    assert root.body["stream"] is True
    # Counted at the server: the sub-call arrived while the root's reply was still going out.
    assert root.end is not None and sub.start < root.end
    # The graph keeps its shape: the block follows its turn, the sub-call its block.
    block = result.graph["turn-1/block-1"]
    assert block.start is not None and result.graph["turn-1"].end is not None
    assert block.start < result.graph["turn-1"].end
    assert result.parallel_efficiency <= 1.0 + 1e-6


def _run(tmp_path: Path, api: str, name: str, stream: bool) -> tuple[Any, Any]:
    script = TurnScript(
        [
            FIRST,
            repl("rows = llm_query_batched(['a', 'b', 'c'])\nprint(rows)\n1 / 0", after="Hm."),
            repl(FINISH, after="That should be it."),
        ]
    )
    journal = tmp_path / f"{name}.sqlite"
    with SERVERS[api](script, stream_rate=2000) as server:
        rlm = RLM(api, KWARGS[api](server, stream=stream), journal=str(journal))
        result = rlm.completion("ctx", root_prompt="q")
        bodies = server.bodies
    store = JournalStore(journal)
    try:
        (run,) = store.runs()
        nodes = {
            node_id: (n.hash, n.value, n.after, n.parent, n.record.usage)
            for node_id, n in store.load(run.key).items()
        }
    finally:
        store.close()
    return (result, bodies), nodes


def _shape(result: Any) -> list[Any]:
    graph = result.graph
    return sorted(
        (r.id, str(r.kind), str(r.status), r.usage, r.output_preview, r.error_type)
        for r in graph.records()
    ) + sorted(graph.edges())


@APIS
def test_the_same_answer_graph_and_journal_with_streaming_on_and_off(
    tmp_path: Path, api: str
) -> None:
    (streamed, streamed_bodies), streamed_journal = _run(tmp_path, api, "on", True)
    (plain, plain_bodies), plain_journal = _run(tmp_path, api, "off", False)
    assert streamed.response == plain.response == "done:sub:first"
    assert _shape(streamed) == _shape(plain)
    assert streamed.usage_summary == plain.usage_summary
    assert streamed_journal == plain_journal
    # What the model saw each turn (its history, REPL output included) is the same.
    turns = [
        [(b.get("system"), b["messages"]) for b in bodies if is_turn(b)]
        for bodies in (streamed_bodies, plain_bodies)
    ]
    assert turns[0] == turns[1]
    assert any(b.get("stream") for b in streamed_bodies)
    assert not any(b.get("stream") for b in plain_bodies)


@APIS
@pytest.mark.parametrize("fault", ["truncated", "reset", "error"])
async def test_a_stream_cut_off_midway_is_retried_and_nothing_is_counted_twice(
    api: str, fault: str
) -> None:
    # The first attempt breaks off after the block's closing fence: the block has started.
    cut = Reply(body=FIRST, fault=fault, keep=BLOCK_END + 10)
    script = TurnScript([[cut, FIRST], repl(FINISH)])
    with SERVERS[api](script, stream_rate=2000) as server:
        async with RLM(api, KWARGS[api](server)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
        sent = [payload["usage"] for status, payload in server.responses if status == 200]
    assert result.response == "done:sub:first"
    assert script.attempts == {1: 2, 2: 1}
    assert script.subcalls == ["first"]  # the block ran once, from the first attempt's text
    turn = result.graph["turn-1"]
    assert turn.attempts == 2 and turn.note is None
    summary = result.usage_summary
    assert summary.total_calls == 3  # two turns and one sub-call: the cut attempt is not one
    inputs = "prompt_tokens" if api == "openai" else "input_tokens"
    outputs = "completion_tokens" if api == "openai" else "output_tokens"
    assert summary.total_input_tokens == sum(u[inputs] for u in sent)
    assert summary.total_output_tokens == sum(u[outputs] for u in sent)


@APIS
async def test_a_retry_that_says_something_else_is_not_read_to_its_end(api: str) -> None:
    """Once a retried attempt differs from the block that ran, nothing more of it is
    used: its whole length was read (and paid for) all the same."""
    other = repl("x = llm_query('second')\nprint(x)", after="Something else. " * 300)
    script = TurnScript(
        [[Reply(body=FIRST, fault="truncated", keep=BLOCK_END + 5), other], repl(FINISH)]
    )
    with SERVERS[api](script, stream_rate=2000) as server:
        async with RLM(api, KWARGS[api](server)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
        streamed = list(server.streamed)
    assert result.response == "done:sub:first" and script.subcalls == ["first"]
    retried = streamed[1]  # (tokens sent, tokens in the reply) of the retried attempt
    assert retried[0] < retried[1] / 2


@APIS
async def test_a_final_answer_stands_when_the_rest_of_its_reply_never_arrives(api: str) -> None:
    """The block gave FINAL while the reply streamed; then every attempt of the turn broke
    off: the run failed with an empty partial answer."""
    reply = repl("FINAL('the answer is 42')", after="Let me explain at length. " * 40)
    cut = Reply(body=reply, fault="error", keep=len(reply) - 100)
    script = TurnScript([[cut]])
    with SERVERS[api](script, stream_rate=4000) as server:
        async with RLM(api, KWARGS[api](server, max_attempts=2)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.response == "the answer is 42"
    assert script.attempts == {1: 2}
    assert result.graph["turn-1"].status == NodeStatus.ERROR


@APIS
async def test_a_retry_that_says_something_else_ends_the_reply_after_the_block_that_ran(
    api: str,
) -> None:
    other = repl("x = llm_query('second')\nprint(x)", after="Something else entirely.")
    script = TurnScript(
        [[Reply(body=FIRST, fault="truncated", keep=BLOCK_END + 5), other], repl(FINISH)]
    )
    with SERVERS[api](script, stream_rate=2000) as server:
        async with RLM(api, KWARGS[api](server)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
        second_turn = _turns(server)[-1].body
    assert result.response == "done:sub:first"
    assert script.subcalls == ["first"]  # the retried reply's block never ran
    assert result.graph["turn-1"].note == DIVERGED_NOTE
    assert [r.id for r in result.graph.records(NodeKind.REPL_BLOCK)] == [
        "turn-1/block-1",
        "turn-2/block-1",
    ]
    kept = FIRST[:BLOCK_END] + f"\n[rlm-graph: {DIVERGED_NOTE}]"
    said = [m for m in second_turn["messages"] if m["role"] == "assistant"][0]["content"]
    text = said if isinstance(said, str) else "".join(b["text"] for b in said)
    assert text == kept


@APIS
async def test_a_stalled_stream_times_out_and_is_retried(api: str) -> None:
    stall = Reply.stalled(FIRST, seconds=30, keep=BLOCK_END + 10)
    script = TurnScript([[stall, FIRST], repl(FINISH)])
    with SERVERS[api](script, stream_rate=2000) as server:
        # A 2 s silence deadline for every call: the stall (30 s) passes it, a loaded
        # machine's pause between two pieces of the other replies does not.
        async with RLM(api, KWARGS[api](server, timeout=2.0)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.response == "done:sub:first"
    assert result.graph["turn-1"].attempts == 2
    assert script.subcalls == ["first"]


@pytest.mark.slow
async def test_a_stream_longer_than_the_timeout_is_fine_while_it_keeps_coming() -> None:
    # About 2 s of reply at 15 tokens a second, with a 1 s timeout: each gap is short.
    slow = repl("x = 7", before="Slowly. " * 12) + "And on. " * 12
    script = TurnScript([slow, repl(FINISH)])
    with FakeOpenAIServer(script, stream_rate=15) as server:
        async with RLM("openai", openai_kwargs(server, timeout=1.0)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.response == "done:7"
    assert result.graph["turn-1"].attempts == 1


async def test_the_event_stream_carries_partial_text_before_the_turns_finish() -> None:
    script = TurnScript([FIRST, repl(FINISH)])
    with FakeOpenAIServer(script, stream_rate=500) as server:
        async with RLM("openai", openai_kwargs(server)) as rlm:
            async with rlm.astream("ctx", root_prompt="q") as events:
                seen = [event async for event in events]
    assert events.result is not None and events.result.response == "done:sub:first"
    finished = next(
        i for i, e in enumerate(seen) if isinstance(e, NodeFinished) and e.node_id == "turn-1"
    )
    deltas = [e for e in seen[:finished] if isinstance(e, TextDelta) and e.node_id == "turn-1"]
    assert len(deltas) > 1  # partial text, more than once, before the turn's finish
    assert deltas[0].offset == 0 and all(d.kind == NodeKind.ROOT_TURN for d in deltas)
    assert "".join(d.text for d in deltas) == FIRST
    assert not any(isinstance(e, TextDelta) and e.node_id == "turn-1" for e in seen[finished:])


async def test_a_turn_that_fails_after_its_block_ran_leaves_the_blocks_effects() -> None:
    broken = Reply(body=repl("kept = 41", after=COMMENTARY), fault="reset", keep=40)
    script = TurnScript([broken])
    with FakeOpenAIServer(script, stream_rate=2000) as server:
        rlm = RLM("openai", openai_kwargs(server, max_attempts=1), persistent=True)
        with pytest.raises(ProviderError):
            await rlm.acompletion("ctx", root_prompt="q")
        # The block ran before the call failed: what it did to the REPL is real.
        script.turns = [[repl('answer["content"] = str(kept + 1)\nanswer["ready"] = True')]]
        result = await rlm.acompletion("again", root_prompt="q")
        await rlm.aclose()
    assert result.response == "42"


async def test_a_server_that_ignores_stream_is_read_as_a_plain_answer() -> None:
    whole = {
        "choices": [
            {"message": {"role": "assistant", "content": repl(FINISH.replace("str(x)", "'x'"))}}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }
    with FakeOpenAIServer(TurnScript([whole])) as server:
        async with RLM("openai", openai_kwargs(server)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.response == "done:x"
    assert server.bodies[0]["stream"] is True


@APIS
async def test_a_reply_that_invents_its_blocks_output_is_stopped_at_the_server(api: str) -> None:
    invented = repl("x = llm_query('first')\nprint(x)", after="Output:\n```\n" + "made up\n" * 80)
    script = TurnScript([invented, repl(FINISH)])
    with SERVERS[api](script, stream_rate=400) as server:
        async with RLM(api, KWARGS[api](server)) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
        streamed = server.streamed
    assert result.response == "done:sub:first"
    turn = result.graph["turn-1"]
    assert turn.finish_reason == "engine_stop" and turn.note == INVENTED_NOTE
    assert turn.usage is not None and turn.usage.estimated  # the server's count never came
    sent, total = streamed[0]
    assert sent < total / 2  # the rest was never generated for us


async def test_streaming_through_httpx_own_pool() -> None:
    cut = Reply(body=FIRST, fault="truncated", keep=BLOCK_END + 10)
    script = TurnScript([[cut, FIRST], repl(FINISH)])
    with FakeOpenAIServer(script, stream_rate=2000) as server:
        async with RLM("openai", openai_kwargs(server, http_transport="httpx")) as rlm:
            result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.response == "done:sub:first"
    assert script.subcalls == ["first"] and result.graph["turn-1"].attempts == 2


def test_a_streamed_run_replays_from_its_journal(tmp_path: Path) -> None:
    journal = str(tmp_path / "run.sqlite")
    script = TurnScript([FIRST, repl(FINISH)])
    with FakeOpenAIServer(script, stream_rate=2000) as server:
        first = RLM("openai", openai_kwargs(server), journal=journal).completion(
            "ctx", root_prompt="q"
        )
        asked = len(server.requests)
        again = RLM("openai", openai_kwargs(server), journal=journal).completion(
            "ctx", root_prompt="q"
        )
        assert len(server.requests) == asked  # all of it from the journal
    assert first.response == again.response == "done:sub:first"
    assert again.replay is not None and again.replay.live == 0


def test_no_stream_on_the_command_line_asks_for_whole_replies() -> None:
    import argparse

    from rlm_graph.cli.run import _backend_kwargs

    flags = dict.fromkeys(
        [
            "base_url",
            "api_key_env",
            "max_concurrent",
            "requests_per_minute",
            "max_attempts",
            "timeout",
            "max_timeouts",
        ]
    )
    assert _backend_kwargs(argparse.Namespace(**flags, no_stream=True), "m")["stream"] is False
    assert "stream" not in _backend_kwargs(argparse.Namespace(**flags, no_stream=False), "m")
