"""A workflow's failures as a DAG user expects them: a failed node fails its dependents
(skipped, sending nothing) unless they receive failures; a rejected key stops the run at
once; ``result[node]`` raises `NodeFailed` or `NodeCancelled`; Ctrl-C returns the
partial result."""

from __future__ import annotations

import os
import signal

import pytest
import trio
import trio.testing

from rlm_graph import Engine, NodeCancelled, NodeFailed, NodeStatus, Workflow
from rlm_graph.contracts import ChatRequest, ChatResponse
from rlm_graph.errors import ProviderAuthError, ProviderError, ProviderNotFound
from rlm_graph.testing import FakeOpenAIServer, Reply, last_user_message
from tests.support.http import KEY, openai_kwargs
from tests.support.scripts import scripted


def summaries(wf: Workflow) -> dict[str, object]:
    """The issue's workflow: six parallel summaries, a merge function, a node with two
    dependencies, a final call."""
    maps = [wf.llm(f"Summarize part {i}", id=f"map-{i}") for i in range(6)]
    merged = wf.function(lambda parts: "\n".join(parts), maps, id="merge")
    both = wf.llm(lambda text, first: f"Compare {first} with {text}", merged, maps[0], id="both")
    final = wf.llm(lambda text: f"Conclude: {text}", both, id="final")
    return {"maps": maps, "merge": merged, "both": both, "final": final}


async def test_a_401_stops_the_workflow_at_once_over_http() -> None:
    with FakeOpenAIServer(api_key="sk-the-right-one") as server:
        kwargs = openai_kwargs(server, max_concurrent=1)  # KEY is not the right one
        async with Engine("openai", kwargs) as engine:
            wf = Workflow()
            nodes = summaries(wf)
            result = await engine.arun(wf)
    # One request, refused; nothing after it was sent (before: all eight model nodes).
    assert [status for status, _ in server.responses] == [401]
    assert result.stop_reason == "fatal_error"
    (failed,) = result.errors
    assert result.graph[failed].error_type == "ProviderAuthError"
    with pytest.raises(NodeFailed) as info:
        result[failed]
    assert isinstance(info.value.cause, ProviderAuthError)
    assert isinstance(info.value.__cause__, ProviderAuthError)
    with pytest.raises(NodeCancelled, match=f"node {failed!r} failed with ProviderAuthError"):
        result[nodes["final"]]  # type: ignore[index]
    statuses = {r.id: r.status for r in result.graph.records()}
    assert statuses["final"] == NodeStatus.CANCELLED
    assert KEY not in str(result.errors)


async def test_a_404_unknown_model_stops_the_workflow_at_once_over_http() -> None:
    with FakeOpenAIServer(models=["gpt-real"]) as server:
        kwargs = openai_kwargs(server, max_concurrent=1)  # asks for "gpt-test"
        async with Engine("openai", kwargs) as engine:
            wf = Workflow()
            nodes = summaries(wf)
            result = await engine.arun(wf)
    # One request, refused as an unknown model; nothing after it was sent.
    assert [status for status, _ in server.responses] == [404]
    assert result.stop_reason == "fatal_error"
    (failed,) = result.errors
    assert result.graph[failed].error_type == "ProviderNotFound"
    with pytest.raises(NodeFailed) as info:
        result[failed]
    assert isinstance(info.value.cause, ProviderNotFound)
    with pytest.raises(NodeCancelled, match=f"node {failed!r} failed with ProviderNotFound"):
        result[nodes["final"]]  # type: ignore[index]
    assert result.graph["merge"].status == NodeStatus.CANCELLED  # never started


async def test_a_failed_node_skips_its_dependents_which_send_nothing() -> None:
    def respond(request: object) -> str:
        prompt = request.prompt  # type: ignore[attr-defined]
        if prompt == "Summarize part 3":
            raise ProviderError("upstream exploded", provider="scripted")
        return f"summary of {prompt[-6:]}"

    engine = Engine("scripted", {"respond": respond})
    wf = Workflow()
    nodes = summaries(wf)
    result = await engine.arun(wf)
    # Six summaries asked; the merge, the two-dependency node and the final one skipped.
    assert len(scripted(engine).requests) == 6
    assert result.stop_reason is None and not result.ok
    for node in ("merge", "both", "final"):
        assert result.graph[node].status == NodeStatus.SKIPPED
    assert result.graph["merge"].error == "skipped: dependency 'map-3' failed"
    assert result.graph["final"].error == (
        "skipped: dependency 'both' failed (it was skipped: 'map-3' failed)"
    )
    with pytest.raises(NodeFailed, match="upstream exploded") as failed:
        result["map-3"]
    assert isinstance(failed.value.cause, ProviderError)
    with pytest.raises(NodeFailed, match="was skipped") as skipped:
        result[nodes["final"]]  # type: ignore[index]
    assert skipped.value.upstream == "map-3"
    assert isinstance(skipped.value.__cause__, NodeFailed)
    assert result["map-0"] == "summary of part 0"
    assert set(result.errors) == {"map-3", "merge", "both", "final"}


async def test_over_http_a_failed_summary_sends_nothing_after_it() -> None:
    def respond(body: dict[str, object]) -> object:
        prompt = last_user_message(body)
        return Reply.error(500, "overloaded") if prompt == "Summarize part 3" else "fine"

    with FakeOpenAIServer(respond) as server:
        async with Engine("openai", openai_kwargs(server, max_attempts=1)) as engine:
            wf = Workflow()
            nodes = summaries(wf)
            result = await engine.arun(wf)
        prompts = [last_user_message(body) for body in server.bodies]
    # The six summaries were asked; nothing built on the failed one was sent.
    assert sorted(prompts) == [f"Summarize part {i}" for i in range(6)]
    assert result.stop_reason is None
    assert result.graph["final"].status == NodeStatus.SKIPPED
    with pytest.raises(NodeFailed, match="skipped"):
        result[nodes["final"]]  # type: ignore[index]


async def test_a_node_that_receives_failures_runs_and_sees_the_error() -> None:
    engine = Engine("scripted", {"respond": lambda r: "fine"})
    wf = Workflow()
    bad = wf.function(lambda: 1 / 0, id="bad")
    good = wf.llm("hello", id="good")
    seen = wf.function(
        lambda results: [type(r).__name__ for r in results],
        [bad, good],
        id="seen",
        receive_failures=True,
    )
    result = await engine.arun(wf)
    assert result[seen] == ["NodeFailed", "str"]


async def test_a_failed_function_keeps_its_traceback() -> None:
    def parse(text: str) -> int:
        return int(text)  # the line the traceback must show

    engine = Engine("scripted")
    wf = Workflow()
    node = wf.function(parse, "not a number", id="parse")
    result = await engine.arun(wf)
    with pytest.raises(NodeFailed) as info:
        result[node]
    assert isinstance(info.value.__cause__, ValueError)
    assert "return int(text)  # the line the traceback must show" in info.value.traceback
    assert "in parse" in info.value.traceback
    assert result.exception(node) is not None
    with pytest.raises(KeyError):
        result["no-such-node"]


async def test_a_cancelled_node_raises_node_cancelled_not_key_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = Engine("scripted", {"latency": 10.0}, max_timeout=5.0)
    wf = Workflow()
    started = wf.llm("slow", id="started")
    after = wf.function(lambda text: text, started, id="after")
    result = await engine.arun(wf)
    assert result.stop_reason == "max_timeout"
    with pytest.raises(NodeCancelled, match="'started' was cancelled: the run stopped") as info:
        result[started]
    assert info.value.stop_reason == "max_timeout"
    with pytest.raises(NodeCancelled, match="'after' never ran"):
        result[after]


def test_ctrl_c_returns_the_partial_result() -> None:
    engine = Engine("scripted", {"respond": lambda r: f"done: {r.prompt}"})
    wf = Workflow()
    first = wf.llm("first", id="first")

    async def press_ctrl_c(text: str) -> str:
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in a terminal sends
        await trio.sleep_forever()
        return text

    interrupted = wf.function(press_ctrl_c, first, id="interrupted")
    result = engine.run(wf)  # returns, rather than raising KeyboardInterrupt
    assert result.stop_reason == "interrupted"
    assert result[first] == "done: first"
    with pytest.raises(NodeCancelled, match="interrupted"):
        result[interrupted]
    assert result.graph["interrupted"].status == NodeStatus.CANCELLED


class _OneBadAnswer:
    """A provider that breaks its contract for one prompt, and answers the rest slowly."""

    name, model, max_concurrent = "flaky", "m", 8

    async def complete(self, request: ChatRequest) -> ChatResponse | None:
        if request.prompt == "odd":
            return None  # a forgotten `return` on one branch
        await trio.sleep(0.05)
        return ChatResponse(content=f"fine: {request.prompt}")

    async def aclose(self) -> None:
        pass


def _builds_a_bad_rlm() -> str:
    from rlm_graph import RLM

    RLM("scripted-typo")  # the function's own ConfigError (an unknown backend)
    return "unreachable"


async def test_one_nodes_own_error_or_bad_answer_fails_that_node_only() -> None:
    """A provider's one answer outside the contract (a `PluginError`) and a function's own
    `ConfigError` stopped the workflow as a "fatal error": every independent node in
    flight was cancelled, and such a node was never retried."""
    wf = Workflow()
    odd = wf.llm("odd", id="odd")
    own = wf.function(_builds_a_bad_rlm, id="own", retries=1)
    fine = [wf.llm(f"q{i}", id=f"q{i}") for i in range(3)]
    result = await Engine(_OneBadAnswer()).arun(wf)
    assert result.stop_reason is None
    assert [result[node] for node in fine] == ["fine: q0", "fine: q1", "fine: q2"]
    assert result.graph["odd"].error_type == "PluginError"
    assert result.graph["own"].error_type == "PluginError"  # unknown backend
    assert result.graph["own"].attempts == 2  # retried: the node's own error
    for node in (odd, own):
        with pytest.raises(NodeFailed):
            result[node]
