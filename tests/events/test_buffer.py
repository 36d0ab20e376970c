"""EventBuffer: the overflow rule (memory up to capacity, the rest through a file), order
kept across spill and read-back, run_finished last, never a drop."""

from __future__ import annotations

import random
import threading

import pytest

from rlm_graph.errors import ConfigError
from rlm_graph.events import EventBuffer, NodeStarted, RunFinished
from rlm_graph.events.buffer import EMPTY, END


def started(seq: int) -> NodeStarted:
    return NodeStarted(
        seq=seq,
        run_id="r",
        time=0.0,
        elapsed=0.0,
        node_id=f"n{seq}",
        input_preview="p" * (seq % 50),
    )


def test_interleaved_puts_and_gets_keep_order_through_the_spill_file() -> None:
    rng = random.Random(3)
    buffer = EventBuffer(capacity=8)
    got: list[int] = []
    seq = 0
    while seq < 2000:
        for _ in range(rng.randint(0, 30)):  # bursts past the capacity
            seq += 1
            buffer.put(started(seq))
        for _ in range(rng.randint(0, 20)):
            item = buffer.get_nowait()
            if item is EMPTY:
                break
            got.append(item.seq)
    buffer.put(RunFinished(seq=seq + 1, run_id="r", time=0.0, elapsed=0.0, result=object()))
    buffer.close()
    while (item := buffer.get_nowait()) is not END:
        got.append(item.seq)
    assert got == list(range(1, seq + 2))
    assert buffer.peak_in_memory <= 8 and buffer.spilled > 0
    assert buffer.received == buffer.delivered == seq + 1


def test_run_finished_waits_for_everything_before_it() -> None:
    buffer = EventBuffer(capacity=2)
    for seq in range(1, 6):
        buffer.put(started(seq))
    result = object()
    buffer.put(RunFinished(seq=6, run_id="r", time=0.0, elapsed=0.0, result=result))
    out = [buffer.get_nowait() for _ in range(6)]
    assert [e.seq for e in out] == [1, 2, 3, 4, 5, 6] and out[-1].result is result
    assert buffer.get_nowait() is EMPTY  # not closed yet: more may come
    buffer.close()
    assert buffer.get_nowait() is END


def test_a_consumer_thread_waits_and_gets_all() -> None:
    buffer = EventBuffer(capacity=4)
    got: list[int] = []

    def consume() -> None:
        while (item := buffer.get(timeout=30)) is not END:
            assert item is not EMPTY
            got.append(item.seq)

    thread = threading.Thread(target=consume)
    thread.start()
    for seq in range(1, 501):
        buffer.put(started(seq))
    buffer.close()
    thread.join(30)
    assert got == list(range(1, 501))


@pytest.mark.parametrize("capacity", [0, "100", 2.5, True])
def test_capacity_must_be_a_whole_number_at_least_1(capacity: object) -> None:
    with pytest.raises(ConfigError, match="capacity .* must be a whole number, at least 1"):
        EventBuffer(capacity=capacity)  # type: ignore[arg-type]


@pytest.mark.parametrize("capacity", [1, 1024])
def test_half_a_character_a_repl_printed_drops_no_event_spilled_or_not(capacity: int) -> None:
    """Code in the local environment printing ``chr(0xd83d)`` (half an emoji): its
    events keep every ``seq``, whether they wait in memory or spill to disk, and say the
    same (U+FFFD for the half character) either way."""
    from rlm_graph import RLM
    from rlm_graph.events import NodeFinished

    rlm = RLM(
        "scripted",
        {
            "responses": [
                "```repl\nprint('half: ' + chr(0xd83d))\n```",
                "```repl\nFINAL('x')\n```",
            ]
        },
        environment="local",
    )
    with rlm.stream("ctx", root_prompt="q", capacity=capacity) as events:
        got = list(events)
    assert [event.seq for event in got] == list(range(1, len(got) + 1))
    assert events.buffer.delivered == events.buffer.received
    (block,) = [e for e in got if isinstance(e, NodeFinished) and e.kind == "repl_block"][:1]
    assert block.preview == "half: \ufffd\n"
