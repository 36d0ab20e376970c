"""The event stream: every node's lifecycle in order, seq without gaps, parents right,
a slow consumer that neither slows the run nor loses an event, limit warnings."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from rlm_graph import RLM, Engine, NodeKind, ProviderError, Workflow
from rlm_graph.contracts import ChatRequest
from rlm_graph.events import (
    LimitWarning,
    NodeFinished,
    NodeStarted,
    RunFinished,
    RunStarted,
    parse_event,
)
from rlm_graph.graph import Graph
from tests.support.scripts import is_root_turn, repl, turn_number


def tree_model(root_code: str, child_code: str, grandchild_code: str) -> Any:
    """Depth 0, 1 and 2 each run their own code on turn 1; sub-calls answer ``sub:<prompt>``."""

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        if turn_number(request) > 1:
            return repl("FINAL('no answer')")
        return repl((root_code, child_code, grandchild_code)[request.depth])

    return respond


def check_lifecycle(events: Sequence[Any], graph: Graph) -> None:
    """Every node of ``graph`` starts once and finishes once, start before finish, a
    spawned node inside its parent's span of events; seq is 1..n; run events at the ends."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len({e.run_id for e in events}) == 1
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    started = {e.node_id: e.seq for e in events if isinstance(e, NodeStarted)}
    finished = {e.node_id: e.seq for e in events if isinstance(e, NodeFinished)}
    counts = Counter(e.node_id for e in events if isinstance(e, NodeStarted | NodeFinished))
    ids = {record.id for record in graph.records()}
    assert set(started) == ids and set(finished) == ids
    assert all(n == 2 for n in counts.values())
    for node in ids:
        assert started[node] < finished[node]
        for source, target, kind in graph.edges():
            if target != node:
                continue
            if kind == "after":  # a dependency finished before this node started
                assert finished[source] < started[node]
            else:  # a spawned node runs inside its parent
                assert started[source] < started[node] and finished[node] < finished[source]
    statuses = {e.node_id: e.status for e in events if isinstance(e, NodeFinished)}
    assert statuses == {r.id: r.status for r in graph.records()}


def depth2_rlm(**kwargs: Any) -> RLM:
    respond = tree_model(
        root_code="r = rlm_query_batched(['a', 'b'])\nFINAL(' | '.join(r))",
        child_code="FINAL(rlm_query('deeper ' + context))",
        grandchild_code="FINAL(llm_query('leaf ' + context))",
    )
    return RLM("scripted", {"respond": respond}, max_depth=3, **kwargs)


def test_stream_gives_every_node_of_a_depth_2_run_in_order_with_its_parent() -> None:
    rlm = depth2_rlm()
    with rlm.stream("root context", root_prompt="go") as stream:
        events = list(stream)
    result = events[-1].result
    assert result is stream.result
    assert result.response == "sub:leaf deeper a | sub:leaf deeper b"
    graph = result.graph
    check_lifecycle(events, graph)
    # Completions at depths 0, 1 and 2 (the grandchildren's llm_query is at depth 3).
    assert max(r.depth for r in graph.records(NodeKind.ROOT_TURN)) == 2
    parents = {e.node_id: e.parent_id for e in events if isinstance(e, NodeStarted)}
    depths = {e.node_id: e.depth for e in events if isinstance(e, NodeStarted)}
    for record in graph.records():
        spawn = list(graph.predecessors(record.id, kind="spawn"))
        if record.kind == NodeKind.REPL_BLOCK:  # inside its turn
            turn = next(
                r.id
                for r in graph.records(NodeKind.ROOT_TURN)
                if r.completion == record.completion and r.iteration == record.iteration
            )
            assert parents[record.id] == turn
        elif record.kind == NodeKind.ROOT_TURN and record.depth == 0:
            assert parents[record.id] is None
        else:  # a sub-call inside its block; a child's turn inside its rlm_call
            assert spawn and parents[record.id] == spawn[0]
        assert depths[record.id] == record.depth
    # The grandchildren's turns hang under depth-2 rlm_calls, themselves under depth-1 blocks.
    deep_turns = [r for r in graph.records(NodeKind.ROOT_TURN) if r.depth == 2]
    assert len(deep_turns) == 2
    for turn in deep_turns:
        call = graph[parents[turn.id]]
        assert call.kind == NodeKind.RLM_CALL and call.depth == 2
        block = graph[parents[call.id]]
        assert block.kind == NodeKind.REPL_BLOCK and block.depth == 1


async def test_astream_gives_the_same_lifecycle_in_trio_code() -> None:
    rlm = depth2_rlm()
    async with rlm.astream("root context") as stream:
        events = [event async for event in stream]
    assert stream.result is not None and events[-1].result is stream.result
    check_lifecycle(events, stream.result.graph)


async def test_astream_raises_the_runs_error_and_the_bodys_as_themselves() -> None:
    """The run's error after ``run_finished`` (and one raised in the ``async with`` body)
    came out of ``astream`` in trio's ExceptionGroup: ``except LimitExceeded`` around it,
    which catches ``acompletion``'s, never did."""
    from rlm_graph import LimitExceeded

    respond = lambda request: repl("print(1)")  # noqa: E731 - never FINAL
    rlm = RLM("scripted", {"respond": respond}, max_iterations=2, on_limit="raise")
    events: list[Any] = []
    with pytest.raises(LimitExceeded) as stopped:
        async with rlm.astream("ctx") as stream:
            async for event in stream:
                events.append(event)
    assert stopped.value.result.stop_reason == "max_iterations"
    assert isinstance(events[-1], RunFinished)
    with pytest.raises(KeyError, match="mine") as raised:
        async with rlm.astream("ctx") as stream:
            async for _ in stream:
                raise KeyError("mine") from ValueError("its cause")
    assert repr(raised.value.__cause__) == "ValueError('its cause')"  # its own chain kept
    with pytest.raises(LimitExceeded):
        async with Engine("scripted", {"respond": respond}, on_limit="raise", max_tokens=1).astream(
            _two_calls()
        ) as stream:
            [event async for event in stream]


def _two_calls() -> Workflow:
    workflow = Workflow()
    first = workflow.llm("one", id="one")
    workflow.llm(lambda text: text, first, id="two")
    return workflow


def test_astream_under_asyncio_says_what_to_use_instead() -> None:
    """Under asyncio (a FastAPI endpoint) astream failed with trio's internal
    ``AttributeError: 'RunContext' object has no attribute 'runner'``."""
    import asyncio

    from rlm_graph import ConfigError

    async def read() -> None:
        async with RLM("scripted", {"respond": lambda r: "x"}).astream("ctx") as stream:
            [event async for event in stream]

    with pytest.raises(ConfigError, match=r"under asyncio, read rlm.stream\(...\)"):
        asyncio.run(read())


def fan_out_rlm(calls: int, **kwargs: Any) -> RLM:
    code = f"r = llm_query_batched([str(i) for i in range({calls})])\nFINAL(str(len(r)))"
    return RLM(
        "scripted",
        {"respond": tree_model(code, "", "")},
        batch_max_concurrent=64,
        **kwargs,
    )


@pytest.mark.slow
def test_a_slow_consumer_keeps_memory_bounded_and_loses_no_event() -> None:
    """2,000 sub-calls at zero latency; the consumer sleeps 10 ms per event while the run
    is going. The run does not wait for it: events beyond the buffer's capacity spill to
    disk, and every one comes back in order."""
    capacity = 256
    rlm = fan_out_rlm(2000)
    stream = rlm.stream("ctx", capacity=capacity)
    events = []
    slept_on = 0
    with stream:
        for event in stream:
            events.append(event)
            # Slow while the run goes on; once it is over, draining fast keeps the test short.
            if stream.running:
                time.sleep(0.01)
                slept_on += 1
    assert stream.result is not None and stream.result.response == "2000"
    check_lifecycle(events, stream.result.graph)
    assert len(list(stream.result.graph.records(NodeKind.LLM_CALL))) == 2000
    assert len(events) >= 2 * 2000 + 2
    # The consumer lagged (it slept on events while the run finished without it) ...
    assert slept_on < len(events)
    # ... memory never held more than the capacity: the rest went through the disk.
    assert stream.buffer.peak_in_memory <= capacity
    assert stream.buffer.spilled >= len(events) - slept_on - capacity - 1
    assert stream.buffer.delivered == stream.buffer.received == len(events)


def test_an_error_reaches_the_consumer_after_run_finished() -> None:
    def respond(request: ChatRequest) -> str:
        raise ProviderError("the provider is down")

    rlm = RLM("scripted", {"respond": respond})
    events = []
    with pytest.raises(ProviderError, match="the provider is down"):
        for event in rlm.stream("ctx"):
            events.append(event)
    assert isinstance(events[-1], RunFinished)
    assert "the provider is down" in (events[-1].error or "")
    # The partial result the error carries comes with it (a report can still be written).
    assert events[-1].stop_reason == "provider_error" == events[-1].result.stop_reason
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_closing_the_stream_early_cancels_the_run() -> None:
    seen: list[Any] = []
    rlm = RLM(
        "scripted",
        {"respond": tree_model("FINAL('x')", "", ""), "latency": 3600.0},
        listeners=[seen.append],
    )
    with rlm.stream("ctx") as stream:
        events = iter(stream)
        assert isinstance(next(events), RunStarted)
        assert isinstance(next(events), NodeStarted)  # the first turn waits on its model
    # Leaving the block cancelled the hour-long call instead of waiting for it.
    assert not stream.running and stream.result is None
    finished = [e for e in seen if isinstance(e, NodeFinished)]
    assert [(e.node_id, e.status) for e in finished] == [("turn-1", "cancelled")]
    assert isinstance(seen[-1], RunFinished) and "Cancelled" in (seen[-1].error or "")


@pytest.mark.parametrize("runs", range(3))  # the race: close() before the run has begun
def test_leaving_the_stream_at_once_cancels_the_run_before_it_begins(runs: int) -> None:
    """``with engine.stream(wf): pass`` waited for the whole run: close() came before
    the run's thread had made the scope it cancels, and then only joined it."""
    calls: list[str] = []
    engine = Engine(
        "scripted", {"respond": lambda r: calls.append(r.prompt) or "ok", "latency": 20.0}
    )
    wf = Workflow()
    wf.llm("an hour-long step", id="only")
    started = time.monotonic()
    with engine.stream(wf) as stream:
        pass  # the caller changed their mind
    assert time.monotonic() - started < 10 and not stream.running and stream.result is None
    assert len(calls) <= 1  # a call already sent was cancelled, not waited for


async def test_limit_warnings_come_once_at_80_percent_of_tokens() -> None:
    def respond(request: ChatRequest) -> str:
        return repl("print(1)")  # never answers: tokens run out

    rlm = RLM("scripted", {"respond": respond}, max_tokens=20_000, max_iterations=50)
    async with rlm.astream("ctx") as stream:
        events = [event async for event in stream]
    warnings = [e for e in events if isinstance(e, LimitWarning)]
    assert [w.limit for w in warnings] == ["max_tokens"]
    assert 0.8 <= warnings[0].fraction
    as_json = json.loads(warnings[0].model_dump_json())  # what a dashboard reads
    assert as_json["fraction"] == warnings[0].fraction
    assert parse_event(warnings[0].model_dump_json()) == warnings[0]
    assert events[-1].stop_reason == "max_tokens"
    # The warning came before the stop: some node finished after it.
    assert any(isinstance(e, NodeFinished) and e.seq > warnings[0].seq for e in events)


async def test_the_time_warning_comes_at_80_percent_during_one_long_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # No node starts or ends between 0 s and the 10 s limit: a timer sends the warning.
    wf = Workflow()
    wf.llm("a question that takes 100 s", id="slow")
    engine = Engine("scripted", {"latency": 100.0}, max_timeout=10, on_limit="return")
    async with engine.astream(wf) as stream:
        events = [event async for event in stream]
    warnings = [e for e in events if isinstance(e, LimitWarning)]
    assert [(w.limit, w.used, w.maximum) for w in warnings] == [("max_timeout", 8.0, 10)]
    finished = [e for e in events if isinstance(e, NodeFinished)]
    assert [(e.node_id, e.status) for e in finished] == [("slow", "cancelled")]
    assert warnings[0].seq < finished[0].seq
    assert isinstance(events[-1], RunFinished) and events[-1].stop_reason == "max_timeout"


async def test_no_time_warning_after_a_run_that_ended_early(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wf = Workflow()
    wf.llm("quick", id="quick")
    engine = Engine("scripted", {"latency": 1.0}, max_timeout=10)
    before = trio.lowlevel.current_statistics().tasks_living
    async with engine.astream(wf) as stream:
        events = [event async for event in stream]
    await trio.testing.wait_all_tasks_blocked()
    # The timer set for 8 s ended with the run: no task left to warn after run_finished.
    assert trio.lowlevel.current_statistics().tasks_living == before
    assert not [e for e in events if isinstance(e, LimitWarning)]
    assert isinstance(events[-1], RunFinished)


def test_engine_streams_a_workflow() -> None:
    wf = Workflow()
    a = wf.function(lambda: 1, id="a")
    b = wf.function(lambda x: x + 1, a, id="b")
    wf.function(lambda x: x * 10, b, id="c")
    events = list(Engine("scripted").stream(wf))
    result = events[-1].result
    assert result["c"] == 20
    check_lifecycle(events, result.graph)
    assert events[0].operation == "workflow"


async def test_engine_astream_and_the_observers_see_the_same_nodes() -> None:
    from rlm_graph import hookimpl

    seen: list[tuple[str, str]] = []

    class Observer:
        @hookimpl
        def rlm_node_started(self, record: Any, graph: Graph) -> None:
            seen.append(("started", record.id))

        @hookimpl
        def rlm_node_finished(self, record: Any, graph: Graph) -> None:
            seen.append(("finished", record.id))

    wf = Workflow()
    a = wf.function(lambda: 1, id="a")
    wf.function(lambda x: x + 1, a, id="b")
    async with Engine("scripted", observers=[Observer()]).astream(wf) as stream:
        events = [e async for e in stream]
    from_stream = [
        ("started" if isinstance(e, NodeStarted) else "finished", e.node_id)
        for e in events
        if isinstance(e, NodeStarted | NodeFinished)
    ]
    assert (
        seen
        == from_stream
        == [("started", "a"), ("finished", "a"), ("started", "b"), ("finished", "b")]
    )


def test_listeners_on_the_engine_get_every_event() -> None:
    got: list[Any] = []
    rlm = depth2_rlm(listeners=[got.append])
    result = rlm.completion("root context")
    check_lifecycle(got, result.graph)
    assert got[-1].result is result


def test_stream_events_round_trip_through_json() -> None:
    from rlm_graph.events import parse_event

    events = list(depth2_rlm().stream("root context"))
    for event in events[:-1]:
        assert parse_event(event.model_dump_json()) == event
    assert '"result"' not in events[-1].model_dump_json()


def test_a_model_call_s_start_says_its_model_and_its_prompt_with_known_secrets_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """node_started carries the model a call goes to and what it asks (docs/observing.md),
    a key the engine knows redacted before the event leaves (the prompt here echoes it)."""
    key = "sk-live-abcdefgh12345678"
    monkeypatch.setenv("OPENAI_API_KEY", key)  # a secret-named variable: a known secret
    events: list[Any] = []

    def respond(request: ChatRequest) -> str:
        if is_root_turn(request):
            return repl(f"FINAL(llm_query('the key is {key}'))")
        return "fine"

    rlm = RLM(
        "scripted",
        {"model_name": "root-model", "respond": respond},
        listeners=[events.append],
    )
    assert rlm.completion("ctx", root_prompt="q").response == "fine"
    started = {e.kind: e for e in events if isinstance(e, NodeStarted)}
    turn, call = started[NodeKind.ROOT_TURN], started[NodeKind.LLM_CALL]
    assert turn.model == "root-model" and turn.input_preview  # the turn's last message
    assert call.model == "root-model"
    assert call.input_preview.startswith("the key is ") and key not in call.input_preview
    assert "[REDACTED]" in call.input_preview


def test_a_workflow_model_node_s_start_says_its_model() -> None:
    events: list[Any] = []
    wf = Workflow()
    first = wf.llm("hello")
    wf.llm(lambda text: f"again {text}", first, model="big-model")
    engine = Engine(
        "scripted",
        {"model_name": "m1", "respond": lambda r: "x"},
        other_backends=["scripted"],
        other_backend_kwargs=[{"model_name": "big-model", "respond": lambda r: "y"}],
        listeners=[events.append],
    )
    assert engine.run(wf).ok
    models = [e.model for e in events if isinstance(e, NodeStarted)]
    assert models == ["m1", "big-model"]
