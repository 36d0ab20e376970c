"""Journal and replay in one process, with the scripted provider."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from rlm_graph import RLM, ConfigError, NodeKind
from rlm_graph.contracts import ChatRequest
from rlm_graph.journal import JournalStore
from tests.support.scripts import is_root_turn, repl, scripted, turn_number

COUNTED = {NodeKind.ROOT_TURN, NodeKind.LLM_CALL, NodeKind.RLM_CALL, NodeKind.COMPACTION}


def _respond(request: ChatRequest) -> str:
    if not is_root_turn(request):
        return f"sub:{request.prompt}"
    if turn_number(request) == 1:
        return repl("parts = llm_query_batched([f'p{i}' for i in range(5)])\nprint(len(parts))")
    return repl("FINAL(' '.join(parts))")


def _counted(result: object) -> int:
    return sum(1 for r in result.graph.records() if r.kind in COUNTED)  # type: ignore[attr-defined]


async def test_a_finished_run_replays_for_free(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    first = RLM("scripted", {"respond": _respond}, journal=str(path))
    one = await first.acompletion("ctx", root_prompt="q")
    assert one.replay is not None and one.replay.attempt == 1
    assert one.replay.live == _counted(one) == 7 and one.replay.replayed == 0

    again = RLM("scripted", {"respond": _respond}, journal=str(path))
    two = await again.acompletion("ctx", root_prompt="q")
    assert scripted(again).requests == []
    assert two.response == one.response == "sub:p0 sub:p1 sub:p2 sub:p3 sub:p4"
    assert two.replay is not None
    assert (two.replay.replayed, two.replay.live, two.replay.diverged) == (7, 0, 0)
    assert two.replay.attempt == 2 and two.replay.resumed
    assert two.replay.tokens_saved == sum(
        r.usage.total_tokens for r in one.graph.records() if r.usage is not None
    )
    replayed = {r.id: r for r in two.graph.records()}
    assert sorted(replayed) == sorted(r.id for r in one.graph.records())
    assert all(r.replayed for r in two.graph.records() if r.kind in COUNTED)
    assert not any(r.replayed for r in two.graph.records(NodeKind.REPL_BLOCK))  # blocks re-ran
    # Original timings: the replayed turn keeps its recorded duration and wall start.
    assert replayed["turn-1"].wall_start == one.graph["turn-1"].wall_start


async def test_other_inputs_are_another_run(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    await RLM("scripted", {"respond": _respond}, journal=str(path)).acompletion(
        "ctx", root_prompt="q"
    )
    other = RLM("scripted", {"respond": _respond}, journal=str(path))
    result = await other.acompletion("another context", root_prompt="q")
    assert result.replay is not None and result.replay.replayed == 0 and result.replay.attempt == 1
    assert len(scripted(other).requests) == 7
    store = JournalStore(path)
    try:
        assert [r.status for r in store.runs()] == ["finished", "finished"]
    finally:
        store.close()


async def test_a_journal_key_tells_samples_of_one_question_apart(tmp_path: Path) -> None:
    """The same question asked again over a journal replays the first answer; a
    ``journal_key`` per sample makes each its own run, replayed as such."""
    path = str(tmp_path / "run.sqlite")
    rlm = RLM("scripted", {"respond": _respond}, journal=path)
    first = await rlm.acompletion("ctx", root_prompt="q", journal_key="sample-1")
    second = await rlm.acompletion("ctx", root_prompt="q", journal_key="sample-2")
    assert [first.replay.replayed, second.replay.replayed] == [0, 0]  # type: ignore[union-attr]
    assert len(scripted(rlm).requests) == 14
    again = RLM("scripted", {"respond": _respond}, journal=path)
    replayed = await again.acompletion("ctx", root_prompt="q", journal_key="sample-2")
    assert replayed.replay is not None and replayed.replay.replayed == 7
    assert scripted(again).requests == []
    unkeyed = await again.acompletion("ctx", root_prompt="q")  # none of the two
    assert unkeyed.replay is not None and unkeyed.replay.replayed == 0


async def test_a_journal_key_that_is_not_text_is_refused(tmp_path: Path) -> None:
    rlm = RLM("scripted", {"respond": _respond}, journal=str(tmp_path / "run.sqlite"))
    with pytest.raises(ConfigError, match="journal_key must be a str, not int"):
        await rlm.acompletion("ctx", root_prompt="q", journal_key=3)  # type: ignore[arg-type]
    assert scripted(rlm).requests == []


def _versioned(request: ChatRequest) -> str:
    if not is_root_turn(request):
        return f"sub:{request.prompt}"
    if turn_number(request) == 1:
        return repl("parts = llm_query_batched([f'p{i}' for i in range(5)])\nprint(version)")
    seen = "v2" if "v2" in request.messages[-1].content else "v1"
    return repl(f"FINAL('answer after {seen}')")


async def test_a_changed_request_goes_live_from_there_and_says_so(tmp_path: Path) -> None:
    path = str(tmp_path / "run.sqlite")
    one = await RLM(
        "scripted", {"respond": _versioned}, custom_tools={"version": "v1"}, journal=path
    ).acompletion("ctx")
    assert one.response == "answer after v1"
    # Same inputs, but a block now prints something else: turn 2 is asked something new.
    rlm = RLM("scripted", {"respond": _versioned}, custom_tools={"version": "v2"}, journal=path)
    two = await rlm.acompletion("ctx")
    assert two.response == "answer after v2"
    assert two.replay is not None
    assert (two.replay.replayed, two.replay.live, two.replay.diverged) == (6, 0, 1)
    assert two.replay.diverged_at == "turn-2"
    asked = scripted(rlm).requests
    assert [r.node_id for r in asked] == ["turn-2"]
    assert not two.graph["turn-2"].replayed and two.graph["turn-1"].replayed
    # The journal now holds the new path: the next run replays all of it.
    again = RLM("scripted", {"respond": _versioned}, custom_tools={"version": "v2"}, journal=path)
    three = await again.acompletion("ctx")
    assert three.response == "answer after v2" and scripted(again).requests == []
    assert three.replay is not None and three.replay.replayed == 7


def _echo_context(request: ChatRequest) -> str:
    if not is_root_turn(request):
        return f"sub:{request.prompt}"
    if turn_number(request) == 1:
        return repl("parts = llm_query_batched([context + str(i) for i in range(20)])")
    return repl("FINAL('|'.join(parts))")


async def test_one_journal_shared_by_two_concurrent_runs_mixes_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = str(tmp_path / "shared.sqlite")
    answers: dict[str, str] = {}

    async def one(context: str) -> None:
        rlm = RLM(
            "scripted",
            {"respond": _echo_context, "latency": 0.1},
            journal=path,
            batch_max_concurrent=4,
        )
        answers[context] = (await rlm.acompletion(context)).response

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "alpha")
        nursery.start_soon(one, "beta")
    assert answers["alpha"] == "|".join(f"sub:alpha{i}" for i in range(20))
    assert answers["beta"] == "|".join(f"sub:beta{i}" for i in range(20))

    for context in ("beta", "alpha"):
        rlm = RLM("scripted", {"respond": _echo_context}, journal=path)
        result = await rlm.acompletion(context)
        assert result.response == answers[context]
        assert scripted(rlm).requests == []
        assert result.replay is not None and result.replay.replayed == 22
    store = JournalStore(path)
    try:
        runs = store.runs()
    finally:
        store.close()
    assert sorted((r.label, r.nodes, r.attempts) for r in runs) == [
        ("alpha", 22, 2),
        ("beta", 22, 2),
    ]


async def test_a_workflow_replays_model_calls_and_json_results(tmp_path: Path) -> None:
    from rlm_graph import Engine, Workflow

    ran: list[str] = []

    def reduce(*parts: str) -> str:
        ran.append("reduce")
        return "|".join(parts)

    def opaque(text: str) -> object:  # not JSON: re-runs on resume
        ran.append("opaque")
        return {1, 2}

    def build() -> Workflow:
        wf = Workflow()
        maps = [wf.llm(f"c{i}") for i in range(6)]
        joined = wf.function(reduce, *maps, id="reduce")
        wf.function(opaque, joined, id="opaque")
        wf.llm(lambda text: f"final over {text}", joined, id="final")
        return wf

    path = str(tmp_path / "wf.sqlite")
    first = Engine("scripted", {"respond": lambda r: f"echo:{r.prompt}"})
    one = await first.arun(build(), journal=path)
    assert ran == ["reduce", "opaque"] and one.replay is not None and one.replay.live == 9
    ran.clear()
    again = Engine("scripted", {"respond": lambda r: f"echo:{r.prompt}"})
    two = await again.arun(build(), journal=path)
    assert two["final"] == one["final"] and two["reduce"] == one["reduce"]
    assert scripted(again).requests == []
    assert ran == ["opaque"]
    assert two.replay is not None
    assert (two.replay.replayed, two.replay.live, two.replay.diverged) == (8, 1, 0)
    assert two.graph["final"].replayed and not two.graph["opaque"].replayed


async def test_a_streamed_workflow_resumes_from_its_journal(tmp_path: Path) -> None:
    from rlm_graph import Engine, Workflow

    def build() -> Workflow:
        wf = Workflow()
        parts = [wf.llm(f"c{i}") for i in range(3)]
        wf.function(lambda *texts: "|".join(texts), *parts, id="joined")
        return wf

    path = str(tmp_path / "wf.sqlite")
    first = Engine("scripted", {"respond": lambda r: f"echo:{r.prompt}"})
    async with first.astream(build(), journal=path) as events:
        async for _ in events:
            pass
    one = events.result
    assert one.replay is not None and one.replay.live == 4
    again = Engine("scripted", {"respond": lambda r: f"echo:{r.prompt}"})
    async with again.astream(build(), journal=path) as events:
        seen = [event async for event in events]
    two = events.result
    assert two["joined"] == one["joined"] == "echo:c0|echo:c1|echo:c2"
    assert scripted(again).requests == []
    assert two.replay is not None and (two.replay.replayed, two.replay.live) == (4, 0)
    assert seen[-1].type == "run_finished" and seen[-1].result is two


async def test_a_bad_journal_is_a_clear_error(tmp_path: Path) -> None:
    import pytest

    from rlm_graph.errors import ConfigError

    other = tmp_path / "other.sqlite"
    import sqlite3

    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(ConfigError, match="not an rlm-graph journal"):
        await RLM("scripted", {"respond": _respond}, journal=str(other)).acompletion("ctx")
    with pytest.raises(ConfigError, match="is a folder"):
        await RLM("scripted", {"respond": _respond}, journal=str(tmp_path)).acompletion("ctx")
    # A device: SQLite failed with "disk I/O error" and left a "/dev/null-journal" beside it.
    with pytest.raises(ConfigError, match="is not a regular file"):
        await RLM("scripted", {"respond": _respond}, journal=os.devnull).acompletion("ctx")
    assert not os.path.exists(os.devnull + "-journal")
    with pytest.raises(ConfigError, match="file path"):
        RLM("scripted", {"respond": _respond}, journal=3)  # type: ignore[arg-type]


async def test_a_resumed_run_links_to_the_first_attempt_trace(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    path = str(tmp_path / "run.sqlite")
    for _ in range(2):
        rlm = RLM("scripted", {"respond": _respond}, journal=path, tracer_provider=provider)
        await rlm.acompletion("ctx", root_prompt="q")
    runs = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent rlm"]
    assert len(runs) == 2
    first, second = runs
    assert not first.links
    (link,) = second.links
    assert link.context.trace_id == first.context.trace_id
    assert link.context.span_id == first.context.span_id
    assert dict(link.attributes or {}) == {"rlm.link": "resumes"}
    replayed = [
        s
        for s in exporter.get_finished_spans()
        if s.context.trace_id == second.context.trace_id
        and (s.attributes or {}).get("rlm.replayed")
    ]
    assert len(replayed) == 7  # 2 turns and 5 sub-calls; the blocks ran again


def _with_tool(request: ChatRequest) -> str:
    if not is_root_turn(request):
        return f"sub:{request.prompt}"
    if turn_number(request) == 1:
        return repl(
            "price = fetch('AAPL')\nnote = llm_query(f'judge {price}')\nlucky = random.randint(0, 10**9)"
        )
    return repl("FINAL(f'{price} {note} {lucky}')")


async def test_a_journaled_tool_is_replayed_and_random_draws_the_same(tmp_path: Path) -> None:
    import random

    calls: list[str] = []

    def fetch(symbol: str) -> dict[str, object]:
        calls.append(symbol)
        return {"symbol": symbol, "price": len(calls) * 100}  # a second call would differ

    path = str(tmp_path / "run.sqlite")
    tools = {"fetch": {"tool": fetch, "journal": True}, "random": random}
    one = await RLM(
        "scripted", {"respond": _with_tool}, custom_tools=tools, journal=path
    ).acompletion("ctx")
    again = RLM("scripted", {"respond": _with_tool}, custom_tools=tools, journal=path)
    two = await again.acompletion("ctx")
    assert calls == ["AAPL"]  # the tool ran once; the resumed run got its recorded result
    assert two.response == one.response and "'price': 100" in two.response
    assert scripted(again).requests == []
    assert two.replay is not None and two.replay.tools_replayed == 1 and two.replay.diverged == 0


async def test_a_run_cut_by_a_limit_resumes_with_a_bigger_one(tmp_path: Path) -> None:
    probe = await RLM("scripted", {"respond": _respond}).acompletion("ctx", root_prompt="q")
    turn = probe.graph["turn-1"].usage
    call = probe.graph["turn-1/block-1/llm-1.0"].usage
    assert turn is not None and call is not None
    limit = turn.total_tokens + 2 * call.total_tokens + 1  # passed during the third sub-call
    path = str(tmp_path / "run.sqlite")
    cut = RLM(
        "scripted", {"respond": _respond}, journal=path, max_tokens=limit, batch_max_concurrent=1
    )
    one = await cut.acompletion("ctx", root_prompt="q")
    assert one.stop_reason == "max_tokens"
    asked_before = len(scripted(cut).requests)
    assert 1 < asked_before < 7
    store = JournalStore(path)
    try:
        (run,) = store.runs()
    finally:
        store.close()
    assert run.status == "stopped"
    # The budget is not part of the run's key: the same question with more room resumes.
    more = RLM(
        "scripted", {"respond": _respond}, journal=path, max_tokens=100_000, batch_max_concurrent=1
    )
    two = await more.acompletion("ctx", root_prompt="q")
    assert two.stop_reason is None and two.response == "sub:p0 sub:p1 sub:p2 sub:p3 sub:p4"
    assert two.replay is not None and two.replay.attempt == 2 and two.replay.diverged == 0
    asked = len(scripted(more).requests)
    assert two.replay.live == asked and two.replay.replayed + asked == 7
    assert two.replay.replayed >= asked_before - 1  # all but the call in flight at the cut


async def test_a_journal_that_cannot_be_written_at_the_end_keeps_the_answer(
    tmp_path: Path, monkeypatch: object, caplog: object
) -> None:
    import sqlite3

    import pytest

    def full(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(JournalStore, "finish", full)
    result = await RLM(
        "scripted", {"respond": _respond}, journal=str(tmp_path / "run.sqlite")
    ).acompletion("ctx")
    assert result.response == "sub:p0 sub:p1 sub:p2 sub:p3 sub:p4"
    assert "writing failed (database or disk is full)" in caplog.text  # type: ignore[attr-defined]


async def test_a_resumed_run_gets_back_exactly_what_the_first_got_secrets_included(
    tmp_path: Path, monkeypatch: object
) -> None:
    """The journal is the user's own 0600 file: it keeps replies exactly, also one that
    holds the value of a secret-named variable; what is scrubbed is what goes to
    traces, logs and reports (the node's preview)."""
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-7f3a9c21e5")

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return "the deploy id is deploy-7f3a9c21e5"
        return repl("FINAL(llm_query('which deploy?'))")

    path = tmp_path / "run.sqlite"
    first = await RLM("scripted", {"respond": respond}, journal=str(path)).acompletion("ctx")
    assert first.response == "the deploy id is deploy-7f3a9c21e5"
    (call,) = first.graph.records(NodeKind.LLM_CALL)
    assert "deploy-7f3a9c21e5" not in call.output_preview  # scrubbed where it is shown
    again = RLM("scripted", {"respond": respond}, journal=str(path))
    second = await again.acompletion("ctx")
    assert scripted(again).requests == []  # all of it from the journal
    assert second.response == first.response  # before: "the deploy id is [REDACTED]"
    assert second.replay is not None and second.replay.diverged == 0


async def test_changed_tools_make_another_run_never_a_mixed_replay(tmp_path: Path) -> None:
    """A child's answer computed with RATE=1 must not come back when RATE is 2: a child
    is replayed whole, so its tools' data and code are in its key (a changed one is a
    divergence there); the same tools again replay everything."""
    path = str(tmp_path / "run.sqlite")

    def respond(request: ChatRequest) -> str:
        if request.depth > 0:
            return repl("FINAL(str(RATE))")
        if turn_number(request) == 1:
            return repl("y = rlm_query('the rate?')\nprint(y)")
        return repl("FINAL(y + '/' + str(RATE) + '/' + scale(1))")

    def scale_one(x: int) -> str:
        return str(x * 10)

    def scale_two(x: int) -> str:
        return str(x * 20)

    answers = []
    for rate, scale in ((1, scale_one), (2, scale_one), (2, scale_two), (2, scale_two)):
        rlm = RLM(
            "scripted",
            {"respond": respond},
            max_depth=2,
            journal=path,
            custom_tools={"RATE": rate, "scale": scale},
        )
        result = await rlm.acompletion("ctx", root_prompt="q")
        assert result.replay is not None
        answers.append((result.response, result.replay.live))
    assert [answer for answer, _ in answers] == ["1/1/10", "2/2/10", "2/2/20", "2/2/20"]
    assert answers[-1][1] == 0  # unchanged tools: nothing asked again


async def test_a_tools_result_json_would_change_is_not_journaled(tmp_path: Path) -> None:
    """A tuple, a dict with int keys, a nested defaultdict: JSON gives them back
    otherwise, so the tool runs again on resume rather than hand back something else."""
    from collections import defaultdict

    path = str(tmp_path / "run.sqlite")
    calls: list[str] = []

    def fetch(kind: str) -> object:
        calls.append(kind)
        values = {"tuple": ("ok", 3), "int-keys": {1: "apple"}, "plain": {"n": [1, 2]}}
        return values.get(kind, {"counts": defaultdict(int)})

    code = (
        "a = fetch('tuple'); b = fetch('int-keys'); c = fetch('nested'); d = fetch('plain')\n"
        "FINAL(repr([a == ('ok', 3), b[1], type(c['counts']).__name__, d]))"
    )
    answers = []
    for _ in range(2):
        rlm = RLM(
            "scripted",
            {"respond": lambda r: repl(code)},
            journal=path,
            custom_tools={"fetch": {"tool": fetch, "journal": True}},
        )
        answers.append((await rlm.acompletion("ctx")).response)
    assert answers[0] == answers[1] == "[True, 'apple', 'defaultdict', {'n': [1, 2]}]"
    assert calls == ["tuple", "int-keys", "nested", "plain", "tuple", "int-keys", "nested"]


def test_another_server_or_extra_body_is_another_run(tmp_path: Path) -> None:
    """The journal never answers one server's (or one setting's) run with another's
    replies: base_url and extra_body are in the run's key."""
    from rlm_graph.testing import FakeOpenAIServer

    path = str(tmp_path / "run.sqlite")
    reply = "```repl\nanswer['content'] = 'done'; answer['ready'] = True\n```"

    def ask(server: FakeOpenAIServer, effort: str) -> None:
        kwargs = {"model_name": "m", "base_url": server.base_url, "stream": False}
        kwargs["extra_body"] = {"reasoning_effort": effort}
        RLM("vllm", kwargs, journal=path).completion("ctx")

    with FakeOpenAIServer(lambda body: reply) as one, FakeOpenAIServer(lambda b: reply) as two:
        ask(one, "low")
        ask(one, "low")  # the same run: replayed
        assert len(one.requests) == 1
        ask(one, "high")
        assert len(one.requests) == 2
        ask(two, "high")
        assert len(two.requests) == 1


def test_a_function_result_json_would_change_inside_runs_again(tmp_path: Path) -> None:
    """A result is kept only if JSON gives it back type for type, nested values too (a
    defaultdict inside a dict came back a dict, and a downstream += failed)."""
    from collections import defaultdict

    from rlm_graph import Engine, Workflow

    path = str(tmp_path / "run.sqlite")
    runs: list[str] = []

    def count() -> dict[str, object]:
        runs.append("count")
        return {"counts": defaultdict(int), "plain": {"a": [1, (2, 3)]}}

    def bump(data: dict[str, Any]) -> int:
        data["counts"]["unseen"] += 1
        return int(data["counts"]["unseen"])

    for _ in range(2):
        wf = Workflow()
        wf.function(bump, wf.function(count), id="bump", cache=False)
        result = Engine("scripted", {"respond": lambda r: "x"}).run(wf, journal=path)
        assert result["bump"] == 1
    assert runs == ["count", "count"]


async def test_a_journaled_tool_called_otherwise_diverges_and_says_so(
    tmp_path: Path, caplog: Any
) -> None:
    path = str(tmp_path / "run.sqlite")
    calls: list[str] = []

    def fetch(symbol: str) -> str:
        calls.append(symbol)
        return f"price of {symbol}"

    def respond(request: ChatRequest) -> str:
        return repl("FINAL(fetch(SYMBOL))")

    for symbol in ("AAPL", "MSFT"):
        tools = {"fetch": {"tool": fetch, "journal": True}, "SYMBOL": symbol}
        result = await RLM(
            "scripted", {"respond": respond}, custom_tools=tools, journal=path
        ).acompletion("ctx")
    assert result.response == "price of MSFT" and calls == ["AAPL", "MSFT"]
    assert result.replay is not None and result.replay.diverged_at == "turn-1/block-1/tool-1"
    assert any("tool call turn-1/block-1/tool-1 differ" in r.getMessage() for r in caplog.records)


async def test_a_resumed_run_has_the_edges_of_the_run_it_resumes(tmp_path: Path) -> None:
    # A call after a batch comes after the batch's last slot to return. Replayed slots
    # return in the order the replay happens to finish them: the journaled ends say
    # which was last, so the resumed graph's edges are the first run's.
    code = "a = llm_query_batched(['slow', 'b', 'c', 'd'])\nx = llm_query('after')\nFINAL(x)"

    def respond(request: ChatRequest) -> str:
        return repl(code) if is_root_turn(request) else "sub:" + request.messages[-1].content

    def latency(request: ChatRequest) -> float:
        return 0.3 if request.messages[-1].content == "slow" else 0.01

    def after_edges(result: Any) -> set[tuple[str, str]]:
        return {(a, b) for a, b, kind in result.graph.edges() if kind == "after"}

    journal = str(tmp_path / "run.sqlite")
    runs = []
    for _ in range(2):
        rlm = RLM("scripted", {"respond": respond, "latency": latency}, journal=journal)
        runs.append(await rlm.acompletion("ctx"))
    first, resumed = runs
    assert resumed.replay is not None and resumed.replay.replayed >= 5
    slow = next(r.id for r in first.graph.records(NodeKind.LLM_CALL) if r.input_preview == "slow")
    later = next(r.id for r in first.graph.records(NodeKind.LLM_CALL) if r.input_preview == "after")
    assert (slow, later) in after_edges(first)
    assert after_edges(resumed) == after_edges(first)


def test_a_journaled_tools_result_is_on_disk_while_its_block_still_runs(tmp_path: Path) -> None:
    """A tool journaled "because it must not happen twice" waited for the next node to
    finish before it was written: a crash in a long block lost calls made seconds ago,
    and the resumed run made them again."""
    path = str(tmp_path / "run.sqlite")

    def on_disk() -> bool:  # what a crash now would keep, read as a resumed run reads it
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            store = JournalStore(path)
            try:
                (run,) = store.runs()
                if any("/tool-" in node_id for node_id in store.load(run.key)):
                    return True
            finally:
                store.close()
            time.sleep(0.05)
        return False

    tools = {"charge": {"tool": lambda n: f"receipt-{n}", "journal": True}, "on_disk": on_disk}
    code = "import time\ntime.sleep(0.5)\nr = charge(1)\nFINAL(f'{r} {on_disk()}')"
    rlm = RLM("scripted", {"respond": lambda request: repl(code)}, custom_tools=tools, journal=path)
    assert rlm.completion("ctx").response == "receipt-1 True"


def test_a_finished_run_that_diverged_keeps_the_journaled_tools_of_its_blocks(
    tmp_path: Path,
) -> None:
    """A run that replays a journaled tool, goes live at a later turn and finishes
    rewrote its journal without the tool's row: the next run paid the tool again."""
    path = str(tmp_path / "run.sqlite")
    calls: list[int] = []
    state = {"printed": "one"}

    def charge(n: int) -> str:
        calls.append(n)
        return f"receipt-{n}"

    def respond(request: ChatRequest) -> str:
        first = turn_number(request) == 1
        return repl("r = charge(7)\nprint(stamp())" if first else "FINAL(r)")

    tools = {"charge": {"tool": charge, "journal": True}, "stamp": lambda: state["printed"]}
    for printed in ("one", "two", "two"):  # the second run diverges at its second turn
        state["printed"] = printed
        result = RLM("scripted", {"respond": respond}, custom_tools=tools, journal=path).completion(
            "ctx"
        )
        assert result.response == "receipt-7"
    assert calls == [7]


def test_a_question_and_an_answer_with_half_a_character_are_listed(tmp_path: Path) -> None:
    """The runs table holds text SQLite can store: a lone surrogate in the question or the
    answer is kept as U+FFFD there (the nodes keep theirs exactly)."""
    path = str(tmp_path / "run.sqlite")
    rlm = RLM("scripted", {"respond": lambda request: repl("FINAL('7 \\ud83d')")}, journal=path)
    assert rlm.completion("ctx", root_prompt="half \ud83d").response == "7 \ud83d"
    store = JournalStore(path)
    try:
        (run,) = store.runs()
    finally:
        store.close()
    assert "half \ufffd" in run.label and run.answer == "7 \ufffd"


def test_a_journaled_tool_called_after_its_run_has_ended_is_only_not_journaled(
    tmp_path: Path,
) -> None:
    """A thread the block left running calls a journaled tool once the run is over: the
    writer it would wake is gone, and the call must not raise in that thread."""
    path = str(tmp_path / "run.sqlite")
    late: list[str] = []
    code = (
        "import threading, time\n"
        "def later(report=report, charge=charge):  # held past the REPL's end\n"
        "    time.sleep(0.3)  # the run has returned by then\n"
        "    try:\n"
        "        report(charge(2))\n"
        "    except BaseException as exc:\n"
        "        report(repr(exc))\n"
        "threading.Thread(target=later).start()\n"
        "FINAL(charge(1))"
    )
    tools = {"charge": {"tool": lambda n: f"receipt-{n}", "journal": True}, "report": late.append}
    rlm = RLM("scripted", {"respond": lambda request: repl(code)}, custom_tools=tools, journal=path)
    assert rlm.completion("ctx").response == "receipt-1"
    deadline = time.monotonic() + 5
    while not late and time.monotonic() < deadline:
        time.sleep(0.05)
    assert late == ["receipt-2"]


@pytest.mark.processes
async def test_environment_keywords_that_change_what_code_may_do_are_another_run(
    tmp_path: Path,
) -> None:
    """``environment_kwargs`` were not in the run key: a run given a ``read_paths`` it
    lacked before replayed the answers made when the file could not be read. A time
    limit only cuts a run: raising it resumes."""
    path = str(tmp_path / "run.sqlite")

    def attempt(**kwargs: Any) -> Any:
        rlm = RLM(
            "scripted",
            {"respond": _respond},
            journal=path,
            environment="subprocess",
            environment_kwargs=kwargs,
        )
        return rlm.acompletion("ctx", root_prompt="q")

    assert (await attempt(timeout=30)).replay.attempt == 1
    assert (await attempt(timeout=60)).replay.attempt == 2  # resumed
    widened = await attempt(timeout=60, read_paths=[str(tmp_path)])
    assert widened.replay.attempt == 1 and widened.replay.replayed == 0


async def test_a_child_cut_by_max_errors_runs_again_with_a_larger_limit(tmp_path: Path) -> None:
    """``max_errors`` is left out of the run key so that a run resumes with a larger
    one; but the child it had cut was journaled as finished, and the resume replayed its
    ``[INCOMPLETE ...]`` answer instead of letting the child go on."""
    path = str(tmp_path / "run.sqlite")

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return "sub"
        turn = turn_number(request)
        if request.depth == 0:
            return repl("c = rlm_query('doc')") if turn == 1 else repl("FINAL('root got: ' + c)")
        return repl("1/0") if turn <= 2 else repl("FINAL('child ok')")

    def attempt(max_errors: int) -> Any:
        rlm = RLM(
            "scripted", {"respond": respond}, max_depth=2, max_errors=max_errors, journal=path
        )
        return rlm.acompletion("ctx", root_prompt="q")

    cut = await attempt(2)
    assert cut.response.startswith("root got: [INCOMPLETE: the child stopped")
    resumed = await attempt(5)
    assert resumed.replay is not None and resumed.replay.attempt == 2
    assert resumed.response == "root got: child ok"
    assert resumed.replay.replayed > 0  # the child's turns before the cut replay


@pytest.mark.processes
def test_a_journaled_local_run_leaves_the_hosts_random_its_own(tmp_path: Path) -> None:
    """The ``local`` REPL's ``random`` is the host's, and a journaled run seeds it per
    block: after ``completion()`` returned, the host drew the same numbers in every
    process."""
    import subprocess
    import sys

    code = (
        "import random, sys\n"
        "from rlm_graph import RLM\n"
        "answer = '```repl\\nimport random\\nx = random.random()\\nFINAL(str(x))\\n```'\n"
        "rlm = RLM('scripted', {'respond': lambda r: answer}, environment='local', journal=sys.argv[1])\n"
        "first = rlm.completion('ctx').response\n"
        "print(first, random.random())\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / f"run-{n}.sqlite")],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split()
        for n in range(2)
    ]
    assert runs[0][0] == runs[1][0]  # the block's draw: seeded by the run, as documented
    assert runs[0][1] != runs[1][1]  # the host's next draw: its own again


@pytest.mark.processes
async def test_a_batch_over_a_set_replays_in_a_guest_with_other_hashes(tmp_path: Path) -> None:
    """Each subprocess guest salts str hashes afresh, so a set of words is iterated in
    another order on resume (8 words: one chance in 40,320 of the same order)."""

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        words = "alpha beta gamma delta epsilon zeta eta theta"
        return repl(f"FINAL(' '.join(sorted(llm_query_batched(list(set({words.split()!r}))))))")

    def attempt() -> Any:
        path = str(tmp_path / "run.sqlite")
        return RLM("scripted", {"respond": respond}, journal=path, environment="subprocess")

    one = await attempt().acompletion("ctx")
    again = attempt()
    two = await again.acompletion("ctx")
    assert two.response == one.response and "sub:theta" in two.response
    assert scripted(again).requests == []
    assert two.replay is not None and (two.replay.replayed, two.replay.diverged) == (9, 0)


async def test_a_batch_asked_in_another_order_replays_each_slot_by_its_request(
    tmp_path: Path,
) -> None:
    """A batch built from a set comes in another order in another process (str hashes
    are salted per process): every slot was a divergence, and the run was asked again.
    Here the order comes from a file the block reads; each slot is replayed with its
    own request's answer."""
    order = tmp_path / "order.txt"

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        return repl(
            f"words = __import__('pathlib').Path({str(order)!r}).read_text().split()\n"
            "FINAL(' '.join(llm_query_batched(words)))"
        )

    path = tmp_path / "run.sqlite"
    order.write_text("x y x z")
    one = await RLM("scripted", {"respond": respond}, journal=str(path)).acompletion("ctx")
    assert one.response == "sub:x sub:y sub:x sub:z"

    order.write_text("z x x y")
    again = RLM("scripted", {"respond": respond}, journal=str(path))
    two = await again.acompletion("ctx")
    assert two.response == "sub:z sub:x sub:x sub:y"
    assert scripted(again).requests == []
    assert two.replay is not None
    assert (two.replay.replayed, two.replay.live, two.replay.diverged) == (5, 0, 0)

    order.write_text("z x w y")  # a new request: from it on the run is live, as ever
    three_rlm = RLM("scripted", {"respond": respond}, journal=str(path))
    three = await three_rlm.acompletion("ctx")
    assert three.response == "sub:z sub:x sub:w sub:y"
    assert [r.prompt for r in scripted(three_rlm).requests] == ["w", "y"]

    # The slots replayed from another place were journaled in this order's places: the
    # same inputs again replay all (a mix of both orders diverged at slot 0).
    four_rlm = RLM("scripted", {"respond": respond}, journal=str(path))
    four = await four_rlm.acompletion("ctx")
    assert four.response == three.response and scripted(four_rlm).requests == []


async def test_a_journaled_slot_answers_one_slot_only(tmp_path: Path) -> None:
    """Two slots asking what one journaled slot asked got the same journaled answer:
    two samples became one. The second goes live."""
    order = tmp_path / "order.txt"
    asked: list[str] = []

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            asked.append(request.prompt)
            return f"{request.prompt}#{len(asked)}"
        return repl(
            f"words = __import__('pathlib').Path({str(order)!r}).read_text().split()\n"
            "FINAL(' '.join(llm_query_batched(words)))"
        )

    path = str(tmp_path / "run.sqlite")
    order.write_text("y x")
    one = await RLM("scripted", {"respond": respond}, journal=path).acompletion("ctx")
    assert one.response == "y#1 x#2"
    order.write_text("x x")
    two = await RLM("scripted", {"respond": respond}, journal=path).acompletion("ctx")
    first, second = two.response.split()
    assert first == "x#2" and second.startswith("x#") and second != first


async def test_a_compaction_setting_is_part_of_the_run_key(tmp_path: Path) -> None:
    """``compaction_kwargs={"target_pct": 0.1}`` on a journal written with 0.5 replayed
    the old run, compactions and all: the new setting had no effect."""
    path = str(tmp_path / "run.sqlite")

    def attempt(target_pct: float) -> Any:
        rlm = RLM(
            "scripted",
            {"respond": _respond},
            journal=path,
            compaction="truncate",
            compaction_kwargs={"target_pct": target_pct},
        )
        return rlm.acompletion("ctx", root_prompt="q")

    assert (await attempt(0.5)).replay.attempt == 1
    assert (await attempt(0.5)).replay.attempt == 2  # the same settings resume
    assert (await attempt(0.1)).replay.attempt == 1  # another history: another run


class _Counting:
    """A strategy that counts its compactions: what it holds beyond its settings."""

    name = "counting"

    def __init__(self, keep: int = 1) -> None:
        self.keep = keep
        self.compactions = 0

    def should_compact(self, messages: list[object], **sizes: object) -> bool:
        return len(messages) > 3

    async def compact(self, messages: list[Any], ctx: object) -> list[Any]:
        self.compactions += 1
        return [*messages[:2], *messages[-self.keep :]]


async def test_what_a_strategy_counts_is_not_part_of_the_run_key(tmp_path: Path) -> None:
    """Every plain attribute of a strategy was in the run key: one that counts its
    compactions made the same question asked again a new run."""
    strategy = _Counting()
    rlm = RLM("scripted", {"respond": _respond}, journal=str(tmp_path / "j"), compaction=strategy)
    assert (await rlm.acompletion("ctx", root_prompt="q")).replay.attempt == 1
    assert strategy.compactions > 0
    assert (await rlm.acompletion("ctx", root_prompt="q")).replay.attempt == 2
    # The same strategy object given to another RLM after it has counted: the same run.
    other = RLM("scripted", {"respond": _respond}, journal=str(tmp_path / "j"), compaction=strategy)
    assert (await other.acompletion("ctx", root_prompt="q")).replay.attempt == 3
    # A setting kept private under its parameter's name is a setting: another value of
    # it is another run.
    for keep, attempt in ((1, 1), (1, 2), (2, 1)):
        private = RLM(
            "scripted",
            {"respond": _respond},
            journal=str(tmp_path / "p"),
            compaction=_Private(keep),
        )
        assert (await private.acompletion("ctx", root_prompt="q")).replay.attempt == attempt


class _Private(_Counting):
    def __init__(self, keep: int = 1) -> None:  # noqa: D107 - not the parent's: keep is private
        self._keep = keep
        self.compactions = 0

    @property  # type: ignore[override]
    def keep(self) -> int:
        return self._keep


async def test_children_asked_in_another_order_never_take_each_others_answers(
    tmp_path: Path,
) -> None:
    """A child RLM's slot replays only in its own place (its nodes are journaled under
    its id): reordered children run again rather than answer with a sibling's child."""
    order = tmp_path / "order.txt"

    def respond(request: ChatRequest) -> str:
        if request.depth > 0:  # a child: its context is the word it was given
            return repl("FINAL('child:' + context)")
        return repl(
            f"words = __import__('pathlib').Path({str(order)!r}).read_text().split()\n"
            "FINAL(' '.join(rlm_query_batched(words)))"
        )

    path = str(tmp_path / "run.sqlite")
    order.write_text("alpha beta")
    one = await RLM("scripted", {"respond": respond}, journal=path, max_depth=2).acompletion("c")
    order.write_text("beta alpha")
    two = await RLM("scripted", {"respond": respond}, journal=path, max_depth=2).acompletion("c")
    first, second = one.response.split(), two.response.split()
    assert first == ["child:alpha", "child:beta"]
    assert second == ["child:beta", "child:alpha"]  # each slot its own child's answer
