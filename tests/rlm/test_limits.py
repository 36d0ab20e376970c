"""Limits stop the whole tree as the run goes, and leave the best partial answer."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import ChatRequest, ChatResponse, Usage
from rlm_graph.errors import BudgetExceeded, TokenLimitExceeded
from tests.support.scripts import is_root_turn, repl, root_and_sub, scripted, turn_number


async def test_max_timeout_stops_a_block_that_never_ends(
    patient_clock: trio.testing.MockClock,
) -> None:
    spins = [0]
    engine = RLM(
        "scripted",
        {
            "respond": root_and_sub(
                [repl('answer["content"] = "partial: 41"\nwhile True:\n    SPINS[0] += 1')]
            )
        },
        max_timeout=30,
        custom_tools={"SPINS": spins},
    )
    start = trio.current_time()
    result = await engine.acompletion("ctx")
    assert trio.current_time() - start == pytest.approx(30)
    assert result.stop_reason == "max_timeout"
    assert result.response == "partial: 41"
    block = next(result.graph.records(NodeKind.REPL_BLOCK))
    assert block.status == NodeStatus.CANCELLED
    # The spinning worker thread was interrupted, not left behind spinning.
    await trio.to_thread.run_sync(time.sleep, 0.05)
    before = spins[0]
    await trio.to_thread.run_sync(time.sleep, 0.1)
    assert before > 0
    assert spins[0] == before


async def test_max_timeout_cancels_sub_calls_in_flight(
    patient_clock: trio.testing.MockClock,
) -> None:
    engine = RLM(
        "scripted",
        {
            "respond": root_and_sub([repl("r = llm_query_batched(['a'] * 20)\nFINAL('never')")]),
            "latency": lambda request: 0 if is_root_turn(request) else 100,
        },
        max_timeout=10,
    )
    result = await engine.acompletion("ctx")
    assert result.stop_reason == "max_timeout"
    calls = list(result.graph.records(NodeKind.LLM_CALL))
    assert calls and all(c.status == NodeStatus.CANCELLED for c in calls)
    assert scripted(engine).in_flight == 0


async def test_max_tokens_stops_the_tree_mid_block() -> None:
    code = (
        'answer["content"] = "so far: 3 chunks"\n'
        "for i in range(100):\n"
        "    llm_query('x' * 400)\n"
        "FINAL('finished all')"
    )
    engine = RLM("scripted", {"respond": root_and_sub([repl(code)])}, max_tokens=2_000)
    result = await engine.acompletion("ctx")
    assert result.stop_reason == "max_tokens"
    assert result.response == "so far: 3 chunks"
    calls = list(result.graph.records(NodeKind.LLM_CALL))
    assert 3 <= len(calls) < 100  # stopped during the block, not after it
    spent = sum(
        r.usage.total_tokens
        for r in result.graph.records()
        if r.usage and r.kind != NodeKind.RLM_CALL
    )
    assert spent > 2_000
    assert spent < 2_000 + 200  # at most the call that crossed the line


async def test_max_budget_counts_children_and_can_raise() -> None:
    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return "leaf"
        if request.depth == 0:
            return repl("r = rlm_query_batched(['a', 'b', 'c', 'd'])\nFINAL('all done')")
        return repl("for i in range(10):\n    llm_query('more')\nFINAL('child done')")

    engine = RLM(
        "scripted",
        {"respond": respond, "cost_per_call": 0.01},
        max_depth=2,
        max_budget=0.1,
        on_limit="raise",
        max_concurrent_subcalls=1,
    )
    with pytest.raises(BudgetExceeded) as info:
        await engine.acompletion("ctx")
    result = info.value.result
    assert result.stop_reason == "max_budget"  # type: ignore[attr-defined]
    assert result.usage_summary.total_cost == pytest.approx(0.11)  # type: ignore[attr-defined]


async def test_max_errors_stops_after_consecutive_failing_turns() -> None:
    def root(request: ChatRequest) -> str:
        n = turn_number(request)
        if n == 1:
            return repl('answer["content"] = "half an answer"')
        return repl("undefined_name + 1")

    engine = RLM("scripted", {"respond": root_and_sub(root)}, max_errors=3)
    result = await engine.acompletion("ctx")
    assert result.stop_reason == "max_errors"
    assert result.response == "half an answer"
    assert result.iterations == 4


async def test_on_limit_raise_carries_the_partial_answer() -> None:
    engine = RLM(
        "scripted",
        {
            "respond": root_and_sub(
                [repl('answer["content"] = "p"\nllm_query("x" * 4000)\nFINAL("no")')]
            )
        },
        max_tokens=1_500,
        on_limit="raise",
    )
    with pytest.raises(TokenLimitExceeded) as info:
        await engine.acompletion("ctx")
    assert info.value.partial == "p"
    assert info.value.reason == "max_tokens"


async def test_cancelling_a_completion_cancels_every_unfinished_node(
    autojump_clock: trio.testing.MockClock,
) -> None:
    graphs = []

    class Capture:
        from rlm_graph.hooks import hookimpl

        @hookimpl
        def rlm_node_started(self, record: object, graph: object) -> None:
            graphs.append(graph)

    engine = RLM(
        "scripted",
        {
            "respond": root_and_sub([repl("r = llm_query_batched(['q'] * 8)\nFINAL('x')")]),
            "latency": 5,
        },
        observers=[Capture()],
    )
    with trio.move_on_after(7):
        await engine.acompletion("ctx")
    records = list(graphs[0].records())
    assert all(r.status.finished for r in records)
    assert {r.status for r in records if r.kind != NodeKind.ROOT_TURN} == {NodeStatus.CANCELLED}


def _batch_of(prompt: str, n: int = 16) -> str:
    return repl(f"r = llm_query_batched([{prompt!r} + str(i) for i in range({n})])\nFINAL('done')")


async def test_a_reported_cost_is_estimated_by_size_so_the_budget_holds() -> None:
    """A provider that reports its own costs: each sub-call was estimated at the largest
    cost seen so far (the root turn's $0.001), so all 16 sub-calls over big chunks
    ($0.01 each) went at once under ``max_budget=0.02``: $0.16 sent."""
    sent: list[str] = []

    def sending(request: ChatRequest) -> float:  # each request, as it goes out
        sent.append(request.prompt)
        return 0.05

    def respond(request: ChatRequest) -> ChatResponse:
        if request.prompt.startswith("chunk"):
            return ChatResponse(content="ok", usage=Usage(input_tokens=12_000), cost=0.01)
        return ChatResponse(
            content=_batch_of("chunk " + "x" * 48_000), usage=Usage(input_tokens=600), cost=0.001
        )

    kwargs = {"respond": respond, "latency": sending, "cost_per_call": 0.001}  # reports costs
    rlm = RLM("scripted", kwargs, max_budget=0.02)
    result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.stop_reason == "max_budget"
    assert len(sent) <= 4  # the root turn, and about the budget's worth of sub-calls
    assert result.usage_summary.total_cost <= 0.02 + 0.01 + 1e-9  # the budget and a call


async def test_a_prompt_of_one_token_a_character_is_reserved_as_such() -> None:
    """CJK text is about a token a character; reserved at four characters a token, 8 of
    16 sub-calls of 10,000 characters went at once under ``max_tokens=30000``: 80,000
    tokens sent."""
    sent: list[int] = []

    def sending(request: ChatRequest) -> float:  # each request, as it goes out
        sent.append(len(request.prompt))
        return 0.05

    def respond(request: ChatRequest) -> ChatResponse:
        if request.prompt.startswith("塊"):
            return ChatResponse(content="好", usage=Usage(input_tokens=len(request.prompt)))
        return ChatResponse(content=_batch_of("塊" * 10_000), usage=Usage(input_tokens=600))

    rlm = RLM("scripted", {"respond": respond, "latency": sending}, max_tokens=30_000)
    result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.stop_reason == "max_tokens"
    assert sum(sent) <= 30_000 + 10_010  # passed by at most about one call's worth


async def test_a_short_prompts_count_does_not_make_later_calls_wait() -> None:
    """A two-character prompt is estimated at 1 token and counted at 9 (the chat
    template's own): taken as the model's ratio, every later prompt was reserved 8x over
    and a batch that fits the limit went out in waves."""
    flying: list[int] = [0, 0]  # in flight, most at once

    def sending(request: ChatRequest) -> float:
        if request.prompt.startswith("chunk"):
            flying[0] += 1
            flying[1] = max(flying)
        return 0.05

    def respond(request: ChatRequest) -> ChatResponse:
        if request.prompt.startswith("chunk"):
            flying[0] -= 1
            return ChatResponse(content="ok", usage=Usage(input_tokens=2_000))
        if request.prompt == "hi":
            return ChatResponse(content="hello", usage=Usage(input_tokens=9))
        batch = "llm_query_batched(['chunk ' + 'x' * 8000 + str(i) for i in range(8)])"
        code = repl(f"llm_query('hi')\nr = {batch}\nFINAL('done')")
        return ChatResponse(content=code, usage=Usage(input_tokens=600))

    rlm = RLM("scripted", {"respond": respond, "latency": sending}, max_tokens=60_000)
    result = await rlm.acompletion("ctx", root_prompt="q")
    assert result.stop_reason is None
    assert flying[1] == 8  # the whole batch at once: 8 x ~3,000 tokens reserved fit
