"""Structural node ids: the same work has the same id in every run, whatever finishes first."""

from __future__ import annotations

import trio
import trio.testing

from rlm_graph import RLM
from rlm_graph.contracts import ChatRequest
from tests.support.scripts import is_root_turn, repl, turn_number


def _model(latency_of: dict[str, float]) -> tuple[object, object]:
    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        if request.depth == 1:
            return repl("FINAL(llm_query('leaf ' + context))")
        if turn_number(request) == 1:
            return repl(
                "a = llm_query('first')\n"
                "b = llm_query_batched(['p0', 'p1', 'p2', 'p3'])\n"
                "c = rlm_query_batched(['x', 'y'])"
            )
        return repl("FINAL(str(b + c))")

    def latency(request: ChatRequest) -> float:
        return latency_of.get(request.prompt, 1.0)

    return respond, latency


async def _ids(latency_of: dict[str, float]) -> tuple[list[str], str]:
    respond, latency = _model(latency_of)
    rlm = RLM("scripted", {"respond": respond, "latency": latency}, max_depth=2)
    result = await rlm.acompletion("ctx")
    return sorted(r.id for r in result.graph.records()), result.response


async def test_ids_name_the_place_of_the_work_not_the_order_it_finished(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Slot 3 of the batch and child "y" finish first in one run, last in the other.
    fast_last, answer = await _ids({"p3": 0.1, "leaf y": 0.1})
    fast_first, again = await _ids({"p0": 0.1, "leaf x": 0.1})
    assert fast_last == fast_first and answer == again
    assert {
        "turn-1",
        "turn-1/block-1",
        "turn-1/block-1/llm-1",
        "turn-1/block-1/llm-2.0",
        "turn-1/block-1/llm-2.3",
        "turn-1/block-1/rlm-3.1",
        "turn-1/block-1/rlm-3.1/turn-1",
        "turn-1/block-1/rlm-3.1/turn-1/block-1",
        "turn-1/block-1/rlm-3.1/turn-1/block-1/llm-1",
        "turn-2/block-1",
    } <= set(fast_last)
