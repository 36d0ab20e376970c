"""A workflow node's own controls (retries, timeout, cache, checked parameters), its
arguments (references, constants, keywords, nested), the plan before a run, the
result's usage and timing, and where functions run (threads, trio, asyncio)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from rlm_graph import ConfigError, Engine, NodeFailed, NodeStatus, Workflow
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ProviderAuthError, ProviderError
from rlm_graph.testing import FakeOpenAIServer, Reply
from tests.support.http import openai_kwargs
from tests.support.scripts import scripted


def flaky(failures: int, error: Exception | None = None) -> object:
    """A respond function failing its first ``failures`` calls."""
    calls = []

    def respond(request: ChatRequest) -> str:
        calls.append(request.prompt)
        if len(calls) <= failures:
            raise error or ProviderError("overloaded", provider="scripted")
        return f"ok after {len(calls)}"

    return respond


async def test_retries_try_a_failed_model_call_again() -> None:
    engine = Engine("scripted", {"respond": flaky(2)})
    wf = Workflow()
    node = wf.llm("q", retries=2)
    result = await engine.arun(wf)
    assert result[node] == "ok after 3"
    assert result.graph[node.id].attempts == 3
    assert result.graph[node.id].status == NodeStatus.OK


async def test_retries_over_http_after_the_provider_s_own_ran_out() -> None:
    replies = [Reply.error(500, "overloaded"), Reply.error(500, "overloaded"), "answer"]
    with FakeOpenAIServer(replies=replies) as server:
        async with Engine("openai", openai_kwargs(server, max_attempts=1)) as engine:
            wf = Workflow()
            node = wf.llm("q", retries=2)
            result = await engine.arun(wf)
    assert result[node] == "answer"
    assert [status for status, _ in server.responses] == [500, 500, 200]
    assert result.graph[node.id].attempts == 3


async def test_retries_run_out_and_do_not_retry_a_rejected_key() -> None:
    engine = Engine("scripted", {"respond": flaky(5)})
    wf = Workflow()
    node = wf.llm("q", retries=1)
    assert (await engine.arun(wf)).exception(node) is not None
    assert len(scripted(engine).requests) == 2
    engine = Engine("scripted", {"respond": flaky(5, ProviderAuthError("no", provider="x"))})
    wf = Workflow()
    node = wf.llm("q", retries=3)
    result = await engine.arun(wf)
    assert len(scripted(engine).requests) == 1
    assert result.stop_reason == "fatal_error"


async def test_retries_of_a_function() -> None:
    calls: list[int] = []

    def sometimes(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise RuntimeError("not yet")
        return x * 2

    wf = Workflow()
    node = wf.function(sometimes, 21, retries=2)
    result = await Engine("scripted").arun(wf)
    assert result[node] == 42
    assert calls == [21, 21, 21]
    assert result.graph[node.id].attempts == 3


async def test_a_node_timeout_fails_that_node_only(autojump_clock: trio.testing.MockClock) -> None:
    engine = Engine(
        "scripted",
        {"respond": lambda r: r.prompt, "latency": lambda r: 100.0 if r.prompt == "slow" else 1.0},
    )
    wf = Workflow()
    slow = wf.llm("slow", timeout=10, retries=1)
    fast = wf.llm("fast", timeout=10)
    start = trio.current_time()
    result = await engine.arun(wf)
    assert trio.current_time() - start == pytest.approx(20.0)  # two tries of 10 s
    assert result[fast] == "fast"
    assert result.graph[slow.id].error_type == "TimeoutError"
    assert len([r for r in scripted(engine).requests if r.prompt == "slow"]) == 2
    with pytest.raises(NodeFailed, match="did not finish within timeout=10 s"):
        result[slow]


async def test_cache_false_is_never_replayed(tmp_path: Path) -> None:
    journal = tmp_path / "wf.sqlite"
    engine = Engine("scripted", {"respond": lambda r: f"answer to {r.prompt}"})

    def build() -> Workflow:
        wf = Workflow()
        wf.llm("kept", id="kept")
        wf.llm("fresh", id="fresh", cache=False)
        return wf

    await engine.arun(build(), journal=journal)
    again = await engine.arun(build(), journal=journal)
    prompts = [r.prompt for r in scripted(engine).requests]
    assert prompts.count("kept") == 1 and prompts.count("fresh") == 2
    assert again.graph["kept"].replayed and not again.graph["fresh"].replayed


def test_request_parameters_are_checked_when_the_node_is_added() -> None:
    wf = Workflow()
    with pytest.raises(
        ConfigError,
        match=r"unknown request parameter 'temprature' \(did you mean 'temperature'\?\)",
    ):
        wf.llm("x", temprature=0.2)
    with pytest.raises(ConfigError, match="temperature: Input should be a valid number"):
        wf.llm("x", temperature="hot")
    with pytest.raises(ConfigError, match="retries must be a whole number"):
        wf.llm("x", retries=-1)
    with pytest.raises(ConfigError, match="timeout must be a positive number"):
        wf.function(print, timeout=0)
    # Values no server takes are refused now, not by the server at the first request.
    for params, says in [
        ({"temperature": float("nan")}, "temperature: Input should be a finite number"),
        ({"temperature": -1}, "temperature: Input should be greater than or equal to 0"),
        ({"top_p": 2}, "top_p: Input should be less than or equal to 1"),
        ({"max_tokens": True}, "max_tokens: Input should be a valid integer"),
    ]:
        with pytest.raises(ConfigError, match=says):
            wf.llm("x", **params)
    wf.llm("x", temperature=0.2, max_tokens=10, extra={"reasoning_effort": "low"})
    assert [spec.id for spec in wf] == ["llm-1"]  # refused nodes took no ordinal


async def test_one_stop_sequence_may_be_given_as_a_string() -> None:
    engine = Engine("scripted", {"respond": lambda r: "ok"})
    wf = Workflow()
    node = wf.llm("x", stop="END")
    result = await engine.arun(wf)
    assert result[node] == "ok"
    assert scripted(engine).requests[0].stop == ("END",)


async def test_arguments_mix_references_constants_keywords_and_nesting() -> None:
    engine = Engine("scripted", {"respond": lambda r: r.prompt.upper()})
    wf = Workflow()
    a, b, c = wf.llm("a"), wf.llm("b"), wf.llm("c")

    def combine(pairs: list[object], table: dict[str, object], n: int, *, sep: str) -> str:
        return sep.join([*map(str, pairs), str(table), str(n)])

    joined = wf.function(combine, [a, (b, "const")], {"c": c, "d": [c]}, 3, sep="|")
    prompt = wf.llm(lambda *, x, ys: f"{x}+{'/'.join(ys)}", kwargs={"x": a, "ys": [b, c]})
    result = await engine.arun(wf)
    assert result[joined] == "A|('B', 'const')|{'c': 'C', 'd': ['C']}|3"
    assert result[prompt] == "A+B/C"
    assert sorted(result.graph.predecessors(joined.id)) == [a.id, b.id, c.id]


def test_the_plan_shows_before_a_run() -> None:
    wf = Workflow()
    maps = [wf.llm(f"part {i}", id=f"map-{i}", model="small") for i in range(2)]
    merged = wf.function(lambda parts: "".join(parts), maps, id="merge", retries=2)
    wf.llm(lambda text: text, merged, id="final", timeout=30, temperature=0)
    plan = json.loads(wf.to_json())
    assert plan["edges"] == [["map-0", "merge"], ["map-1", "merge"], ["merge", "final"]]
    final = plan["nodes"][-1]
    assert final["params"] == {"temperature": 0} and final["timeout"] == 30
    assert plan["nodes"][2]["args"] == [[{"ref": "map-0"}, {"ref": "map-1"}]]
    dot = wf.to_dot()
    assert '"map-0" -> "merge";' in dot and "retries=2" in dot and "llm small" in dot


async def test_the_result_has_usage_cost_critical_path_and_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = Engine("scripted", {"respond": lambda r: "x", "latency": 1.0, "cost_per_call": 0.25})
    wf = Workflow()
    maps = [wf.llm(f"m{i}") for i in range(4)]
    merged = wf.function(lambda parts: len(parts), maps, id="merge")
    final = wf.llm(lambda n: f"n={n}", merged, id="final")
    result = await engine.arun(wf)
    assert result.usage_summary.total_calls == 5
    assert result.cost == pytest.approx(1.25)
    assert result.critical_path.nodes[-2:] == ("merge", final.id)
    assert result.critical_path.length == pytest.approx(2.0)
    assert result.parallel_efficiency == pytest.approx(1.0)
    assert result.execution_time >= 0 and result.to_dict()["usage_summary"]


async def test_a_sync_function_runs_in_a_thread_and_never_blocks_the_scheduler() -> None:
    ready = threading.Event()
    wf = Workflow()
    # waits for the other node; on the scheduler's thread, the other could never run
    waiting = wf.function(lambda: ready.wait(timeout=5), id="waiting")
    wf.function(ready.set, id="setter")
    result = await Engine("scripted").arun(wf)
    assert result[waiting] is True


async def test_the_deadline_holds_over_a_blocked_sync_function(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = threading.Event()
    wf = Workflow()
    stuck = wf.function(lambda: release.wait(timeout=5), id="stuck")
    other = wf.llm("other")
    try:
        engine = Engine("scripted", {"respond": lambda r: r.prompt}, max_timeout=1.0)
        result = await engine.arun(wf)
    finally:
        release.set()
    assert result.stop_reason == "max_timeout"
    assert result.graph[stuck.id].status == NodeStatus.CANCELLED
    assert result[other] == "other"
    assert result.leaked_threads == 1  # the thread ran on after its node was cancelled


async def test_an_async_function_whose_code_names_asyncio_runs_on_asyncio_s_loop() -> None:
    async def fetch() -> str:
        await asyncio.sleep(0)  # without loop=: the code names asyncio
        return "slept"

    async def both() -> str:  # names trio as well: left on trio's loop
        await trio.sleep(0)
        return "trio" if asyncio.iscoroutinefunction(both) else "?"

    wf = Workflow()
    slept, native = wf.function(fetch), wf.function(both)
    result = await Engine("scripted").arun(wf)
    assert (result[slept], result[native]) == ("slept", "trio")
    loops = {node["id"]: node["loop"] for node in wf.to_jsonable()["nodes"]}
    assert loops == {slept.id: "asyncio", native.id: "trio"}  # the plan says which


async def test_an_async_function_may_be_written_for_asyncio() -> None:
    async def fetch(name: str) -> str:
        await asyncio.sleep(0)
        assert asyncio.current_task() is not None
        return f"fetched {name}"

    async def native(text: str) -> str:
        await trio.sleep(0)
        return text + "!"

    wf = Workflow()
    fetched = wf.function(fetch, "page", loop="asyncio")
    done = wf.function(native, fetched)
    result = await Engine("scripted").arun(wf)
    assert result[done] == "fetched page!"
    with pytest.raises(ConfigError, match="loop='asyncio' is for an async function"):
        wf.function(print, loop="asyncio")


async def sleeps_on_asyncio() -> str:
    await asyncio.sleep(0)  # a bare yield: trio says "unrecognized yield message"
    return "slept"


async def asks_for_asyncio_s_loop() -> str:
    asyncio.get_running_loop()  # RuntimeError: no running event loop
    return "found"


@pytest.mark.parametrize(
    "fn, original",
    [(sleeps_on_asyncio, TypeError), (asks_for_asyncio_s_loop, RuntimeError)],
    ids=["asyncio.sleep", "get_running_loop"],
)
async def test_asyncio_code_on_trio_s_loop_names_the_fix(
    fn: object, original: type[Exception]
) -> None:
    wf = Workflow()
    # Forced onto trio's loop (as a function that reaches asyncio only through a helper
    # it calls would be by default): its node fails saying how to run it.
    node = wf.function(fn, id="fetch", loop="trio")  # type: ignore[arg-type]
    after = wf.function(lambda text: text, node, id="after")
    result = await Engine("scripted").arun(wf)
    with pytest.raises(
        NodeFailed, match="written for asyncio\\? pass loop='asyncio' to wf.function"
    ) as info:
        result[node]
    # asyncio's (or trio's) own error is the cause, as docs/graph-executor.md says.
    assert isinstance(info.value.cause, original) and info.value.__cause__ is info.value.cause
    assert "written for asyncio" in str(result.exception(node))
    assert result.graph[after.id].status == NodeStatus.SKIPPED
    wf = Workflow()
    fixed = wf.function(fn, id="fetch", loop="asyncio")  # type: ignore[arg-type]
    assert (await Engine("scripted").arun(wf))[fixed] in ("slept", "found")


async def test_an_asyncio_function_is_cancelled_in_its_own_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    autojump_clock.autojump_threshold = math.inf  # the clock moves when the test says
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def past_the_timeout() -> None:
        await trio.to_thread.run_sync(started.wait)
        autojump_clock.jump(10)

    wf = Workflow()
    node = wf.function(forever, loop="asyncio", timeout=5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(past_the_timeout)
        result = await Engine("scripted").arun(wf)
    assert result.graph[node.id].error_type == "TimeoutError"
    assert cancelled.wait(timeout=10)  # the coroutine saw CancelledError in its own loop


def test_a_function_node_given_no_function_names_what_it_got() -> None:
    with pytest.raises(ConfigError, match="wf.function\\(\\) for node 'x' needs a function"):
        Workflow().function("notfn", id="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not str 'notfn'; pass the function itself"):
        Workflow().function("notfn")  # type: ignore[arg-type]
