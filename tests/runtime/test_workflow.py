"""The graph executor: concurrency under shared limits, order, failures, cancellation."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rlm_graph import Engine, NodeStatus, Workflow
from rlm_graph.contracts import Message
from rlm_graph.errors import NodeFailed, ProviderError
from rlm_graph.graph import NodeKind, NodeRecord, peak_concurrency
from rlm_graph.hooks import hookimpl
from rlm_graph.runtime.calls import ModelCall
from rlm_graph.runtime.slots import run_slots
from tests.support.scripts import scripted

L = 1.0  # simulated latency of one model call


def echo_engine(max_concurrent: int = 16, **kwargs: object) -> Engine:
    return Engine(
        "scripted",
        {"respond": lambda r: f"echo:{r.prompt}", "latency": L, "max_concurrent": max_concurrent},
        **kwargs,  # type: ignore[arg-type]
    )


async def test_fan_out_of_64_under_a_limit_of_16_takes_four_latencies(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = echo_engine(max_concurrent=16)
    wf = Workflow()
    refs = [wf.llm(f"chunk {i}") for i in range(64)]
    start = trio.current_time()
    result = await engine.arun(wf)
    assert trio.current_time() - start == pytest.approx(4 * L)
    assert scripted(engine).peak_in_flight == 16
    assert peak_concurrency(result.graph, NodeKind.LLM_CALL) == 16
    assert [result[r] for r in refs] == [f"echo:chunk {i}" for i in range(64)]


async def test_map_reduce_then_final_call(autojump_clock: trio.testing.MockClock) -> None:
    engine = echo_engine()
    wf = Workflow()
    maps = [wf.llm(f"c{i}") for i in range(40)]
    reduced = wf.function(lambda *parts: "|".join(parts), *maps, id="reduce")
    final = wf.llm(lambda text: f"final over {text.count('|') + 1}", reduced, id="final")
    start = trio.current_time()
    result = await engine.arun(wf)
    # 40 calls at 16 at a time: 3 rounds; then the final call: 4 L in all.
    assert trio.current_time() - start == pytest.approx(4 * L)
    assert result[final] == "echo:final over 40"
    assert result.graph["final"].status == NodeStatus.OK
    assert list(result.graph.predecessors("final")) == ["reduce"]


async def test_one_failing_slot_leaves_the_other_63_intact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def respond(request: object) -> str:
        prompt = request.prompt  # type: ignore[attr-defined]
        if prompt == "chunk 17":
            raise ProviderError("upstream exploded", provider="scripted")
        return f"ok:{prompt}"

    engine = Engine("scripted", {"respond": respond, "latency": L})
    wf = Workflow()
    refs = [wf.llm(f"chunk {i}") for i in range(64)]
    result = await engine.arun(wf)
    # A workflow's failed node has no value (the [ERROR] slot is the RLM loop's rule).
    assert result.errors == {refs[17].id: "[ERROR] ProviderError: upstream exploded"}
    with pytest.raises(NodeFailed, match="upstream exploded"):
        result[refs[17]]
    assert [result[r] for r in refs if r != refs[17]] == [
        f"ok:chunk {i}" for i in range(64) if i != 17
    ]
    failed = result.graph[refs[17].id]
    assert failed.status == NodeStatus.ERROR
    assert failed.error == "upstream exploded"
    assert sum(r.status == NodeStatus.OK for r in result.graph.records()) == 63
    assert not result.ok


async def test_a_failed_function_stops_its_dependents_only() -> None:
    engine = echo_engine()
    wf = Workflow()
    bad = wf.function(lambda: 1 / 0, id="bad")
    after_bad = wf.function(lambda x: x, bad, id="after_bad")
    fine = wf.function(lambda: "fine", id="fine")
    result = await engine.arun(wf)
    assert result[fine] == "fine"
    assert result.graph["after_bad"].error_type == "UpstreamFailed"
    with pytest.raises(NodeFailed, match="ZeroDivisionError"):
        result[bad]
    with pytest.raises(NodeFailed):
        result[after_bad]


async def test_two_concurrent_batches_share_the_provider_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = echo_engine(max_concurrent=8)
    run = engine.new_run()
    outputs: dict[str, list[str]] = {}

    async def batch(name: str) -> None:
        async def one(index: int, prompt: str) -> str:
            record = NodeRecord(id=run.new_id("llm"), kind=NodeKind.LLM_CALL)
            call = ModelCall(run, record, [Message(role="user", content=prompt)])
            return await run.execute(record, call.text)

        outputs[name] = await run_slots([f"{name}{i}" for i in range(16)], one, limit=16)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch, "a")
        nursery.start_soon(batch, "b")
    # Each batch allows 16, together 32, but the provider allows 8: 32 calls take 4 L.
    assert scripted(engine).peak_in_flight == 8
    assert peak_concurrency(run.graph, NodeKind.LLM_CALL) == 8
    assert outputs["a"] == [f"echo:a{i}" for i in range(16)]
    assert outputs["b"] == [f"echo:b{i}" for i in range(16)]


async def test_cancelling_mid_flight_marks_every_unfinished_node_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    graphs = []

    class Capture:
        @hookimpl
        def rlm_node_started(self, record: NodeRecord, graph: object) -> None:
            graphs.append(graph)

    engine = echo_engine(max_concurrent=4, observers=[Capture()])
    wf = Workflow()
    for i in range(12):
        wf.llm(f"c{i}")
    tasks_before = trio.lowlevel.current_statistics().tasks_living
    with trio.move_on_after(1.5 * L) as scope:
        await engine.arun(wf)
    assert scope.cancelled_caught
    assert trio.lowlevel.current_statistics().tasks_living == tasks_before
    graph = graphs[0]
    statuses = [r.status for r in graph.records()]
    assert statuses.count(NodeStatus.OK) == 4  # the first round finished at 1 L
    assert statuses.count(NodeStatus.CANCELLED) == 8
    assert all(s.finished for s in statuses)
    assert scripted(engine).in_flight == 0


async def test_max_timeout_stops_a_workflow_with_the_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = echo_engine(max_concurrent=1, max_timeout=2.5 * L)
    wf = Workflow()
    refs = [wf.llm(f"c{i}") for i in range(5)]
    result = await engine.arun(wf)
    assert result.stop_reason == "max_timeout"
    # One call at a time: two finished by 2.5 L, the third was cut off.
    assert sum(r.id in result.values for r in refs) == 2
    assert sum(r.status == NodeStatus.CANCELLED for r in result.graph.records()) == 3
    with pytest.raises(Exception) as info:
        await engine.arun(wf, on_limit="raise")
    assert type(info.value).__name__ == "DeadlineExceeded"


def test_sync_run_from_plain_code() -> None:
    engine = Engine("scripted", {"respond": lambda r: r.prompt.upper()})
    wf = Workflow()
    a = wf.llm("hello")
    b = wf.function(lambda s: s + "!", a)
    assert engine.run(wf)[b] == "HELLO!"
    assert engine.provider.closed  # type: ignore[attr-defined]


def test_parallel_sync_runs_from_threads_share_the_provider_limit() -> None:
    import threading

    engine = Engine(
        "scripted",
        {"respond": lambda r: f"echo:{r.prompt}", "latency": 0.02, "max_concurrent": 4},
    )
    outputs: list[list[str]] = []

    def one_run(name: str) -> None:
        wf = Workflow()
        refs = [wf.llm(f"{name}{i}") for i in range(12)]
        result = engine.run(wf)
        outputs.append([result[r] for r in refs])

    threads = [threading.Thread(target=one_run, args=(f"t{n}-",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outputs) == 3 and all(len(o) == 12 for o in outputs)
    # Three loops, each allowing 4, yet the provider never saw more than 4 at once.
    assert scripted(engine).peak_in_flight == 4
