"""Persistent sessions: one REPL across completions, with context_N and history_N."""

from __future__ import annotations

from rlm_graph import RLM
from rlm_graph.contracts import ChatRequest
from tests.support.scripts import is_root_turn, repl


def test_three_completions_share_one_repl() -> None:
    calls = {"n": 0}

    def respond(request: ChatRequest) -> str:
        assert is_root_turn(request)
        calls["n"] += 1
        first_message = request.messages[1].content
        if "`context_2`" in first_message:
            return repl(
                "FINAL(' / '.join([context, context_1, context_2, str(len(history_0)), "
                "str(len(history_1)), str(total)]))"
            )
        if "`context_1`" in first_message:
            return repl("total += len(context_1)\nFINAL(str(total))")
        return repl("total = len(context)\nFINAL(str(total))")

    with RLM("scripted", {"respond": respond}, persistent=True) as engine:
        first = engine.completion("aaa")
        second = engine.completion("bbbbb")
        third = engine.completion("cc")
    assert first.response == "3"
    assert second.response == "8"  # `total` survived from the first completion
    # context stays the first prompt; each finished history is kept (system, task,
    # assistant, REPL output = 4 messages... the final turn's reply included).
    parts = third.response.split(" / ")
    assert parts[:3] == ["aaa", "bbbbb", "cc"]
    assert int(parts[3]) >= 3 and int(parts[4]) >= 3
    assert parts[5] == "8"


def test_each_completion_starts_with_a_fresh_answer() -> None:
    def respond(request: ChatRequest) -> str:
        if "`context_1`" in request.messages[1].content:
            return repl("print(answer['ready'])\nFINAL('second')")
        return repl("FINAL('first')")

    engine = RLM("scripted", {"respond": respond}, persistent=True)
    assert engine.completion("x").response == "first"
    assert engine.completion("y").response == "second"
    engine.close()


def test_a_persistent_session_refuses_a_second_completion_from_another_thread() -> None:
    import threading

    import pytest

    from rlm_graph.errors import ConfigError

    started = threading.Event()
    release = threading.Event()

    def respond(request: ChatRequest) -> str:
        if (
            "`context_1`" in request.messages[1].content
            or "`context`" not in request.messages[1].content
        ):
            return repl("FINAL('later')")
        started.set()
        release.wait(10)  # hold the first completion (on the scripted provider's call)
        return repl("FINAL('first')")

    engine = RLM("scripted", {"respond": respond}, persistent=True)
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(engine.completion("x").response))
    first.start()
    try:
        assert started.wait(10)
        with pytest.raises(ConfigError, match="one at a time"):
            engine.completion("y")
    finally:
        release.set()
        first.join(10)
    assert results == ["first"]
    # Once the first is done the session goes on.
    assert engine.completion("z").response == "later"
    engine.close()
