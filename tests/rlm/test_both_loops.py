"""The same RLM tests under trio and under plain ``asyncio.run``: an asyncio application
awaits ``rlm.acompletion(...)`` (and ``engine.arun``) exactly as trio code does, and
cancelling the awaiting task cancels the run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from rlm_graph import (
    RLM,
    Engine,
    NodeKind,
    NodeRecord,
    NodeStatus,
    ProviderError,
    Workflow,
    hookimpl,
)
from rlm_graph.contracts import ChatRequest
from rlm_graph.testing import FakeOpenAIServer
from tests.support.scripts import is_root_turn, repl, root_and_sub, turn_number

AsyncFn = Callable[[], Awaitable[Any]]


class Loop:
    """Runs a test's async body under one event loop library."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, body: AsyncFn) -> Any:
        if self.name == "trio":
            return trio.run(body)
        return asyncio.run(body())

    async def gather(self, *bodies: AsyncFn) -> list[Any]:
        """Run ``bodies`` at once, in this loop library's own way."""
        if self.name == "asyncio":
            return list(await asyncio.gather(*(b() for b in bodies)))
        results: list[Any] = [None] * len(bodies)

        async def one(index: int, body: AsyncFn) -> None:
            results[index] = await body()

        async with trio.open_nursery() as nursery:
            for index, body in enumerate(bodies):
                nursery.start_soon(one, index, body)
        return results


@pytest.fixture(params=["trio", "asyncio"])
def loop(request: pytest.FixtureRequest) -> Loop:
    return Loop(request.param)


BATCH = (
    "answers = llm_query_batched([context[i:i+3] for i in range(0, len(context), 3)])\n"
    'answer["content"] = "|".join(answers)\nanswer["ready"] = True'
)


def test_completions_with_batches_run_concurrently_in_order(loop: Loop) -> None:
    rlm = RLM("scripted", {"respond": root_and_sub([repl(BATCH)]), "latency": 0.01})

    async def body() -> list[Any]:
        async with rlm:
            return await loop.gather(
                lambda: rlm.acompletion("aaabbbccc"), lambda: rlm.acompletion("xxxyyy")
            )

    first, second = loop.run(body)
    assert first.response == "sub:aaa|sub:bbb|sub:ccc"
    assert second.response == "sub:xxx|sub:yyy"
    assert len(list(first.graph.records(NodeKind.LLM_CALL))) == 3


def test_child_completions(loop: Loop) -> None:
    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        if request.depth == 0:
            return repl("FINAL(rlm_query('child task'))")
        return repl("FINAL('child saw: ' + context)")

    rlm = RLM("scripted", {"respond": respond}, max_depth=2)
    result = loop.run(lambda: rlm.acompletion("root context"))
    assert result.response == "child saw: child task"
    assert len(list(result.graph.records(NodeKind.RLM_CALL))) == 1


def test_a_limit_returns_the_partial_answer(loop: Loop) -> None:
    code = 'answer["content"] = "partial"\nprint("working")'
    rlm = RLM("scripted", {"respond": root_and_sub([repl(code)])}, max_iterations=2)
    result = loop.run(lambda: rlm.acompletion("ctx"))
    assert result.stop_reason == "max_iterations"


def test_a_provider_error_is_raised_with_the_partial_answer(loop: Loop) -> None:
    def respond(request: ChatRequest) -> str:
        if turn_number(request) == 2:
            raise ProviderError("the server is gone", provider="scripted")
        return repl('answer["content"] = "half"\nprint(1)')

    rlm = RLM("scripted", {"respond": respond})
    with pytest.raises(ProviderError, match="the server is gone") as info:
        loop.run(lambda: rlm.acompletion("ctx"))
    assert info.value.partial == "half"


def test_a_provider_error_keeps_its_own_cause(loop: Loop) -> None:
    """The engine took the error out of trio's exception group with ``raise ... from
    None``, which dropped the cause a plugin gave it (the underlying error of its client)."""

    def respond(request: ChatRequest) -> str:
        try:
            raise ConnectionResetError("the socket went away")
        except ConnectionResetError as exc:
            raise ProviderError("the server is gone", provider="scripted") from exc

    rlm = RLM("scripted", {"respond": respond})
    with pytest.raises(ProviderError, match="the server is gone") as info:
        loop.run(lambda: rlm.acompletion("ctx"))
    assert repr(info.value.__cause__) == "ConnectionResetError('the socket went away')"
    # And sync, and from a stream (the run's error comes after run_finished).
    with pytest.raises(ProviderError) as sync:
        rlm.completion("ctx")
    assert isinstance(sync.value.__cause__, ConnectionResetError)
    with pytest.raises(ProviderError) as streamed:
        for _ in rlm.stream("ctx"):
            pass
    assert isinstance(streamed.value.__cause__, ConnectionResetError)


def test_a_persistent_session_keeps_its_repl(loop: Loop) -> None:
    replies = [repl("FINAL(str(len(context_0)))"), repl("FINAL(context_0 + '+' + context_1)")]
    answers = iter(replies)
    rlm = RLM("scripted", {"respond": lambda r: next(answers)}, persistent=True)

    async def body() -> tuple[str, str]:
        async with rlm:
            first = await rlm.acompletion("abc")
            second = await rlm.acompletion("def")
        return first.response, second.response

    assert loop.run(body) == ("3", "abc+def")


def test_over_real_http(loop: Loop) -> None:
    def respond(body: dict[str, Any]) -> str:
        if any(m.get("role") == "system" for m in body["messages"]):
            return "```repl\nFINAL(llm_query('hello'))\n```"
        return "world"

    with FakeOpenAIServer(respond) as server:
        rlm = RLM("openai", {"model_name": "m", "base_url": server.base_url, "api_key": "k"})

        async def body() -> Any:
            async with rlm:
                return await rlm.acompletion("ctx")

        result = loop.run(body)
        assert len(server.requests) == 2
    assert result.response == "world"
    assert result.usage_summary.model_usage_summaries["m"].total_calls == 2


def test_engine_arun(loop: Loop) -> None:
    engine = Engine("scripted", {"respond": lambda r: r.prompt.upper()})
    wf = Workflow()
    refs = [wf.llm(p) for p in ("a", "b")]
    joined = wf.function(lambda a, b: a + b, *refs)

    async def body() -> Any:
        async with engine:
            return await engine.arun(wf)

    assert loop.run(body)[joined] == "AB"


# -- cancellation ----------------------------------------------------------------------


class Statuses:
    """Records each finished node's status (from whichever thread runs the engine)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.finished: list[tuple[NodeKind, NodeStatus]] = []
        self.started = threading.Event()

    @hookimpl
    def rlm_node_started(self, record: NodeRecord, graph: object) -> None:
        if record.kind == NodeKind.LLM_CALL:
            self.started.set()

    @hookimpl
    def rlm_node_finished(self, record: NodeRecord, graph: object) -> None:
        with self.lock:
            self.finished.append((record.kind, record.status))


def test_cancelling_the_asyncio_task_cancels_the_run() -> None:
    statuses = Statuses()
    sub_latency = 600.0  # a sub-call that would hang the test if not cancelled
    rlm = RLM(
        "scripted",
        {
            "respond": root_and_sub([repl("FINAL(llm_query('slow'))")]),
            "latency": lambda r: 0.0 if is_root_turn(r) else sub_latency,
        },
        observers=[statuses],
    )

    async def body() -> tuple[float, list[tuple[NodeKind, NodeStatus]]]:
        task = asyncio.create_task(rlm.acompletion("ctx"))
        while not statuses.started.is_set():
            await asyncio.sleep(0.01)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with statuses.lock:
            return time.monotonic() - started, list(statuses.finished)

    took, finished = asyncio.run(body())
    assert took < sub_latency
    kinds = {kind: status for kind, status in finished}
    # By the time CancelledError reached the caller, the run had unwound: the sub-call
    # and its REPL block are recorded as cancelled.
    assert kinds[NodeKind.LLM_CALL] == NodeStatus.CANCELLED
    assert kinds[NodeKind.REPL_BLOCK] == NodeStatus.CANCELLED


def test_asyncio_wait_for_times_out_the_run() -> None:
    statuses = Statuses()
    rlm = RLM(
        "scripted",
        {
            "respond": root_and_sub([repl("FINAL(llm_query('slow'))")]),
            "latency": lambda r: 0.0 if is_root_turn(r) else 600.0,
        },
        observers=[statuses],
    )

    async def body() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(rlm.acompletion("ctx"), timeout=2.0)  # the sub-call: 600 s

    asyncio.run(body())
    assert (NodeKind.LLM_CALL, NodeStatus.CANCELLED) in statuses.finished


def _connections_to(port: int) -> int:
    """This machine's established TCP connections to ``port`` on 127.0.0.1 (Linux)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.read().splitlines()[1:]]
    return sum(int(row[2].split(":")[1], 16) == port and row[3] == "01" for row in rows)


def test_a_sync_close_closes_what_asyncio_callers_opened() -> None:
    """Jupyter's ``with RLM(...) as rlm: await rlm.acompletion(...)``: the sync close ran
    in a trio loop of its own and left the connections the asyncio door had opened (on
    the trio thread asyncio callers share) open until the process ended."""
    with FakeOpenAIServer(lambda body: "```repl\nFINAL('ok')\n```") as server:
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        rlm = RLM("openai", {"model_name": "m", "base_url": server.base_url, "api_key": "k"})

        async def cell() -> str:
            with rlm:
                result = await rlm.acompletion("ctx")
                assert _connections_to(port) >= 1  # a kept-alive connection, as it should
            return result.response

        assert asyncio.run(cell()) == "ok"
        deadline = time.monotonic() + 5
        while _connections_to(port) and time.monotonic() < deadline:
            time.sleep(0.02)  # the server's side closes a moment after the client's
        assert _connections_to(port) == 0
