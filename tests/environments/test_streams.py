"""The process's ``sys.stdout``, ``sys.stderr`` and ``sys.stdin`` around completions in the
``local`` environment: captured per thread while blocks run, the caller's own objects
again once none runs, and a caller's swap during a run left in place."""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rlm_graph import RLM, RLMChatCompletion
from rlm_graph.contracts import ChatRequest
from tests.support.scripts import repl, root_and_sub, turn_number


def streams() -> tuple[object, object, object]:
    return sys.stdout, sys.stderr, sys.stdin


@contextmanager
def own_streams() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """The test's own streams in place of pytest's (which pytest puts back at the start of
    each test phase, so a fixture cannot do this), restored whatever the test left."""
    saved = streams()
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr, sys.stdin = saved  # type: ignore[assignment]


def test_after_a_completion_the_streams_are_the_callers_own_objects_again() -> None:
    code = "import sys\nprint('from the block')\nprint('to stderr', file=sys.stderr)\nFINAL('ok')"
    rlm = RLM("scripted", {"respond": root_and_sub([repl(code)])}, environment="local")
    with own_streams() as (out, err):
        before = streams()
        result = rlm.completion("context")
        after = streams()
        print("the caller's own line")
    assert result.response == "ok"
    assert all(a is b for a, b in zip(after, before, strict=True))  # the very objects
    # The block's prints were captured (they went to the model), not to the caller's streams.
    assert out.getvalue() == "the caller's own line\n" and err.getvalue() == ""


def test_a_stream_the_caller_swaps_in_during_a_run_is_kept_and_blocks_are_still_captured() -> None:
    swapped = io.StringIO()
    outputs: list[str] = []

    def root(request: ChatRequest) -> str:
        turn = turn_number(request)
        if turn == 2:
            # Between two blocks of the run, the caller (here on the engine's thread)
            # puts a stream of its own in place and writes to it.
            sys.stdout = swapped
            print("the caller, mid-run")
            outputs.append(request.messages[-1].content)
            return repl("print('block two')")
        if turn == 3:
            outputs.append(request.messages[-1].content)
            return repl("FINAL('ok')")
        return repl("print('block one')")

    rlm = RLM("scripted", {"respond": root_and_sub(root)}, environment="local")
    with own_streams() as (out, _):
        result = rlm.completion("c")
        after = sys.stdout
    assert result.response == "ok"
    assert after is swapped  # not clobbered by the end of the run, nor wrapped
    assert swapped.getvalue() == "the caller, mid-run\n"  # nothing of the blocks in it
    assert "block one" in outputs[0] and "block two" in outputs[1]  # both reached the model
    assert out.getvalue() == ""


def test_the_streams_come_back_only_when_the_last_of_concurrent_runs_ends() -> None:
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def wait_inside() -> None:  # a custom tool: called by the long run's block
        inside.set()
        release.wait(30)

    def long_root(request: ChatRequest) -> str:
        if turn_number(request) == 1:
            return repl("wait()\nprint('long block')")
        seen["fed back"] = request.messages[-1].content
        return repl("FINAL('long done')")

    long_run = RLM(
        "scripted",
        {"respond": root_and_sub(long_root)},
        environment="local",
        custom_tools={"wait": {"tool": wait_inside, "description": "wait()"}},
    )
    short_run = RLM(
        "scripted",
        {"respond": root_and_sub([repl("print('short')\nFINAL('short done')")])},
        environment="local",
    )
    results: list[RLMChatCompletion] = []
    with own_streams() as (out, _):
        before = streams()
        thread = threading.Thread(target=lambda: results.append(long_run.completion("x")))
        thread.start()
        try:
            assert inside.wait(30)
            short = short_run.completion("y")
            during = sys.stdout  # the long run's block still runs
        finally:
            release.set()
            thread.join(30)
        after = streams()
    assert short.response == "short done" and results[0].response == "long done"
    assert during is not before[0]  # still dispatched: the long block's prints are captured
    assert all(a is b for a, b in zip(after, before, strict=True))
    assert "long block" in str(seen["fed back"])  # captured for its model...
    assert out.getvalue() == ""  # ...not printed to the caller's stream
