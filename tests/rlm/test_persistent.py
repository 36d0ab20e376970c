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


def test_a_persistent_session_refuses_a_second_completion_or_close_while_one_runs() -> None:
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
        # Nor may it be closed under the running completion (it crashed with an
        # AssertionError in the run).
        with pytest.raises(ConfigError, match="after the completion returns"):
            engine.close()
    finally:
        release.set()
        first.join(10)
    assert results == ["first"]
    # Once the first is done the session goes on.
    assert engine.completion("z").response == "later"
    engine.close()


def test_a_closed_session_starts_a_new_conversation() -> None:
    """close() drops the REPL: the next completion is context_0 again, with no history,
    and its task message says so (not context_1 of a REPL that no longer has it)."""
    tasks: list[str] = []

    def respond(request: ChatRequest) -> str:
        tasks.append(request.messages[1].content)
        if len(tasks) == 1:
            return repl("keep = 7\nFINAL('first')")
        return repl(
            "FINAL(' / '.join([context, context_0, str('keep' in globals()), "
            "str('history_0' in globals())]))"
        )

    engine = RLM("scripted", {"respond": respond}, persistent=True)
    assert engine.completion("one").response == "first"
    engine.close()
    assert engine.completion("two").response == "two / two / False / False"
    assert "`context_1`" not in tasks[1] and "history_0" not in tasks[1]
    engine.close()


def test_history_stays_the_first_completions_when_a_later_one_compacts() -> None:
    """A compaction points `history` at the running completion's trajectory; once that
    completion ends, `history` is the first completion's history again (docs/rlm.md)."""
    big = "print('x' * 1600)\n"
    second_turns = [0]

    def respond(request: ChatRequest) -> str:
        task = request.messages[1].content
        if "`context_2`" in task:
            return repl("FINAL(str(history == history_0) + ' ' + str(len(history_0)))")
        if "`context_1`" in task:
            second_turns[0] += 1
            if second_turns[0] < 5:
                return repl(big)  # long enough to cross the threshold
        return repl("FINAL('ok')")

    engine = RLM(
        "scripted",
        {"respond": respond},
        persistent=True,
        models={"scripted": {"context_window": 2_000}},
        compaction="truncate",
    )
    assert engine.completion("a").response == "ok"
    second = engine.completion("b")
    assert second.response == "ok"
    assert any(n.kind.value == "compaction" for n in second.graph.records())
    verdict, size = engine.completion("c").response.split()
    assert verdict == "True" and int(size) >= 3
    engine.close()


def test_a_completion_stopped_by_a_limit_keeps_its_place_in_the_session() -> None:
    """A completion stopped by ``max_budget`` (or an error) skipped the session's
    bookkeeping: the next completion's context overwrote its ``context_1`` and its
    ``history_1`` was never kept."""

    def respond(request: ChatRequest) -> str:
        task = request.messages[1].content
        if "`context_2`" in task:
            names = "sorted(k for k in globals() if k.startswith(('context_', 'history_')))"
            return repl(f"FINAL(repr(context_1) + ' ' + repr({names}))")
        if "`context_1`" in task:
            return repl("print('looking')")  # never answers: the budget stops it
        return repl("FINAL('first')")

    scripted = {"respond": respond, "cost_per_call": 0.01}
    with RLM("scripted", scripted, persistent=True, max_budget=0.025) as engine:
        assert engine.completion("ctx 0").response == "first"
        assert engine.completion("ctx 1").stop_reason == "max_budget"
        third = engine.completion("ctx 2").response
    assert third == "'ctx 1' ['context_0', 'context_1', 'context_2', 'history_0', 'history_1']"
