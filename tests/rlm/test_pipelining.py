"""Blocks that run as they are written: the scripted provider streams each root reply in
small pieces (trio's mock clock between them), and every completion is run twice, streamed
and whole, to check that the model sees, the graph holds and the answer is the same."""

from __future__ import annotations

from typing import Any

import pytest
import trio.testing

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import ChatRequest, ChatResponse
from rlm_graph.protocol.fences import INVENTED_NOTE
from tests.support.scripts import is_root_turn, repl, scripted, turn_number

SCRIPTS: dict[str, list[Any]] = {
    "two blocks, then the answer": [
        "First this.\n```repl\nx = llm_query('a')\nprint(x)\n```\nThen that.\n"
        "```repl\ny = x.upper()\nprint(y)\n```\nWords after the blocks.",
        repl('answer["content"] = y\nanswer["ready"] = True'),
    ],
    "the answer in the first block, a second block after it": [
        "```repl\nFINAL('early')\n```\nand then\n```repl\nprint('never runs')\n```\nbye",
    ],
    "a failing block, a python fence that is shown, not run": [
        "```repl\n1 / 0\n```\n```python\nprint('shown')\n```\n```repl\nprint('after')\n```",
        repl("FINAL('recovered')"),
    ],
    "no block at all, then one": ["Just words, no code.", repl("FINAL(6 * 7)")],
    "output invented after the block, and a block after that": [
        "```repl\nx = llm_query('a')\nprint(x)\n```\nOutput:\n```\nsub:a\n```\n"
        "So x is known, and I finish.\n```repl\nFINAL(x)\n```\nThat is all.",
        repl("FINAL('turn 2 says ' + x)"),
    ],
    "a reply cut off by max_tokens inside its second block": [
        ChatResponse(
            content="```repl\nx = 40\n```\nnow the next one\n```repl\nx += 2\nprint(x)",
            finish_reason="length",
        ),
        repl("FINAL(x)"),
    ],
}


def _respond(script: list[Any]) -> Any:
    def respond(request: ChatRequest) -> Any:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        return script[min(turn_number(request), len(script)) - 1]

    return respond


async def _complete(script: list[Any], streamed: bool) -> tuple[Any, RLM]:
    kwargs: dict[str, Any] = {"respond": _respond(script), "latency": 1.0}
    if streamed:
        kwargs.update(stream_chunk=3, stream_delay=0.05)
    engine = RLM("scripted", kwargs)
    return await engine.acompletion("ctx", root_prompt="q"), engine


def _seen(engine: RLM) -> list[Any]:
    """What the model was sent, turn by turn."""
    return [[m.model_dump() for m in r.messages] for r in scripted(engine).requests]


def _graph(result: Any) -> list[Any]:
    records = sorted(
        (r.id, str(r.kind), str(r.status), r.output_preview, r.note, r.error_type)
        for r in result.graph.records()
    )
    return records + sorted(result.graph.edges())


@pytest.mark.parametrize("name", sorted(SCRIPTS))
async def test_streamed_and_whole_replies_make_the_same_run(
    name: str, autojump_clock: trio.testing.MockClock
) -> None:
    streamed, streamed_engine = await _complete(SCRIPTS[name], True)
    whole, whole_engine = await _complete(SCRIPTS[name], False)
    assert streamed.response == whole.response
    assert streamed.stop_reason == whole.stop_reason
    assert _seen(streamed_engine) == _seen(whole_engine)
    assert _graph(streamed) == _graph(whole)


@pytest.mark.slow
async def test_a_block_runs_while_the_rest_of_the_reply_is_written() -> None:
    # Real time (the blocks run in threads, which a mock clock would not wait for), short.
    script = SCRIPTS["two blocks, then the answer"]
    latency = lambda request: 0.05 if is_root_turn(request) else 0.0  # noqa: E731
    engine = RLM(
        "scripted",
        {"respond": _respond(script), "latency": latency, "stream_chunk": 4, "stream_delay": 0.02},
    )
    result = await engine.acompletion("ctx", root_prompt="q")
    graph = result.graph
    turn, first, second = graph["turn-1"], graph["turn-1/block-1"], graph["turn-1/block-2"]
    assert first.end is not None and second.start is not None and turn.end is not None
    # Both blocks, in order, and both started before the reply was over.
    assert first.end <= second.start < turn.end
    assert graph["turn-1/block-1/llm-1"].start < turn.end  # type: ignore[operator]
    assert result.response == "SUB:A"
    # The critical path counts what overlapped once.
    assert result.parallel_efficiency <= 1.0 + 1e-9


async def test_after_the_answer_the_reply_streams_to_its_end_and_nothing_else_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result, _ = await _complete(
        SCRIPTS["the answer in the first block, a second block after it"], True
    )
    assert result.response == "early"
    blocks = list(result.graph.records(NodeKind.REPL_BLOCK))
    assert [b.id for b in blocks] == ["turn-1/block-1"]
    assert result.graph["turn-1"].status == NodeStatus.OK


async def test_a_limit_that_cuts_the_reply_after_the_answer_keeps_the_answer(
    patient_clock: trio.testing.MockClock,
) -> None:
    """The reply streams to its end after a block gave FINAL; a ``max_timeout`` that
    fell meanwhile (a server trickling prose) returned an empty answer, the FINAL lost."""
    # The block runs in a thread: the clock waits 0.5 s of real idleness before each of
    # its two jumps (to the second piece at 8 s, to the deadline at 10 s).
    script = ["```repl\nFINAL('the answer')\n```\n" + "and then some more prose " * 200]
    kwargs = {"respond": _respond(script), "stream_chunk": 1000, "stream_delay": 8}
    result = await RLM("scripted", kwargs, max_timeout=10).acompletion("ctx", root_prompt="q")
    assert result.stop_reason == "max_timeout"  # the reply takes 40 s to stream
    assert result.response == "the answer"
    assert result.graph["turn-1/block-1"].status == NodeStatus.OK


async def test_a_reply_cut_off_by_max_tokens_runs_its_open_block_once_it_has_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result, engine = await _complete(
        SCRIPTS["a reply cut off by max_tokens inside its second block"], True
    )
    graph = result.graph
    turn, closed, cut = graph["turn-1"], graph["turn-1/block-1"], graph["turn-1/block-2"]
    assert turn.note is not None and "cut off" in turn.note
    # The closed block ran as it arrived; the block the cut left open ran after the reply
    # ended, without the note the model is shown after its reply.
    assert closed.start < turn.end <= cut.start  # type: ignore[operator]
    assert cut.status == NodeStatus.OK
    assert result.response == "42"
    second = scripted(engine).requests[-1].messages
    assert second[-2].content.endswith("[rlm-graph: " + turn.note + "]")
    assert "42" in second[-1].content


async def test_a_reply_that_invents_its_blocks_output_is_stopped_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = SCRIPTS["output invented after the block, and a block after that"]
    result, engine = await _complete(script, True)
    turn = result.graph["turn-1"]
    assert turn.finish_reason == "engine_stop" and turn.note == INVENTED_NOTE
    assert [b.id for b in result.graph.records(NodeKind.REPL_BLOCK)] == [
        "turn-1/block-1",
        "turn-2/block-1",
    ]
    assert result.response == "turn 2 says sub:a"  # the invented part's FINAL never ran
    said = scripted(engine).requests[-1].messages[2].content
    assert said.endswith("```\n[rlm-graph: " + INVENTED_NOTE + "]") and "Output:" not in said
