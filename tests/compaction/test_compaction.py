"""Compaction: long scripted runs that cross the window's threshold several times."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import (
    ChatRequest,
    ChatResponse,
    CompactionContext,
    Message,
    Usage,
    estimate_tokens,
)
from rlm_graph.errors import ConfigError, PluginError, ProviderError
from rlm_graph.hooks import hookimpl
from rlm_graph_compaction import SUMMARY_PROMPT
from tests.support.scripts import is_root_turn, repl, scripted

WINDOW = 2_000
THRESHOLD = 0.85
STEPS = 10

# Each turn adds a step to `parts` and prints ~400 tokens: the history crosses 85% of a
# 2,000-token window every two or three turns. The last step answers from the REPL's
# state (which compaction must not touch) and from `history`.
STEP = f"""\
try:
    parts
except NameError:
    parts = []
parts.append(len(parts))
print(f"step-{{len(parts)}} " + "x" * 1600)
if len(parts) == {STEPS}:
    full = globals().get("history", [])
    early = any(m["content"].startswith("REPL output:\\nstep-1 ") for m in full)
    FINAL(f"{{sum(parts)}}|{{early}}|{{full[0]['role'] if full else 'none'}}")"""


def respond(request: ChatRequest) -> str:
    if request.messages[-1].content == SUMMARY_PROMPT:
        return "Summary: `parts` holds one entry per step so far. Next: the next step."
    assert is_root_turn(request)
    return repl(STEP)


def tokens_of(request: ChatRequest) -> int:
    return sum(estimate_tokens(m.content) for m in request.messages)


def long_run(compaction: Any, **kwargs: Any) -> RLM:
    return RLM(
        "scripted",
        {"respond": kwargs.pop("respond", respond)},
        models={"scripted": {"context_window": WINDOW}},
        compaction=compaction,
        compaction_threshold_pct=THRESHOLD,
        **kwargs,
    )


def root_turns(rlm: RLM) -> list[ChatRequest]:
    requests = scripted(rlm).requests
    return [r for r in requests if r.messages[-1].content != SUMMARY_PROMPT]


def check_compactions(rlm: RLM, result: Any) -> list[Any]:
    """Every root turn fits under the threshold; each compaction is one node between
    the turn before it and the turn after it."""
    compactions = list(result.graph.records(NodeKind.COMPACTION))
    turns = root_turns(rlm)
    assert len(turns) == STEPS
    # Without compaction the history would pass the threshold at once, and grow by a
    # full step per turn; with it, no root turn is sent above the threshold.
    assert tokens_of(turns[-1]) < THRESHOLD * WINDOW
    assert all(tokens_of(t) < THRESHOLD * WINDOW for t in turns)
    assert len(compactions) >= 3
    for node in compactions:
        assert node.status == NodeStatus.OK
        (before,) = result.graph.predecessors(node.id, kind="after")
        (after,) = result.graph.successors(node.id, kind="after")
        assert result.graph[after].kind == NodeKind.ROOT_TURN
        assert result.graph[before].kind == NodeKind.REPL_BLOCK
    return compactions


@pytest.mark.parametrize("environment", ["local", "subprocess"])
async def test_summarize_compacts_each_time_the_threshold_is_crossed(environment: str) -> None:
    rlm = long_run(True, environment=environment, max_iterations=20)
    result = await rlm.acompletion("ctx", root_prompt="count the steps")
    assert result.response == f"{sum(range(STEPS))}|True|system"
    compactions = check_compactions(rlm, result)
    summaries = [r for r in scripted(rlm).requests if r.messages[-1].content == SUMMARY_PROMPT]
    assert len(summaries) == len(compactions)  # one model call per compaction node
    assert all(node.usage is not None and node.usage.input_tokens > 0 for node in compactions)
    assert all(node.model == "scripted" for node in compactions)
    # The turn after a compaction starts from system, task, summary and a note.
    after_first = next(
        t
        for t in root_turns(rlm)
        if t.messages[-1].content.startswith("[Your conversation was compacted")
    )
    roles = [m.role for m in after_first.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert "Question: count the steps" in after_first.messages[1].content
    assert after_first.messages[2].content.startswith("Summary:")
    assert "`history`" in after_first.messages[3].content


async def test_truncate_drops_the_oldest_turns_and_keeps_system_and_task() -> None:
    rlm = long_run("truncate", max_iterations=20)
    result = await rlm.acompletion("ctx", root_prompt="count the steps")
    assert result.response == f"{sum(range(STEPS))}|True|system"
    compactions = check_compactions(rlm, result)
    assert all(node.usage is None for node in compactions)  # no model call
    last = root_turns(rlm)[-1]
    assert last.messages[0].role == "system"
    assert "Question: count the steps" in last.messages[1].content
    assert "Earlier turns were dropped" in last.messages[1].content
    assert not any(m.content.startswith("REPL output:\nstep-1 ") for m in last.messages)
    assert [m.role for m in last.messages[2:]] == ["assistant", "user"] * (
        (len(last.messages) - 2) // 2
    )


async def test_an_unknown_model_gets_the_default_window_and_is_not_compacted() -> None:
    rlm = RLM("scripted", {"respond": respond}, compaction=True, max_iterations=20)
    result = await rlm.acompletion("ctx")
    assert result.response == f"{sum(range(STEPS))}|False|none"
    assert not list(result.graph.records(NodeKind.COMPACTION))


async def test_a_failed_summary_is_recorded_and_the_run_goes_on() -> None:
    def flaky(request: ChatRequest) -> Any:
        if request.messages[-1].content == SUMMARY_PROMPT:
            return ProviderError("the summary call failed", provider="scripted")
        return repl(STEP)

    rlm = long_run(True, respond=flaky, max_iterations=20)
    result = await rlm.acompletion("ctx")
    assert result.response == f"{sum(range(STEPS))}|False|none"
    failed = list(result.graph.records(NodeKind.COMPACTION))
    assert failed and all(node.status == NodeStatus.ERROR for node in failed)


@pytest.mark.parametrize(
    "summary",
    [
        ChatResponse(content="", finish_reason="content_filter"),
        ChatResponse(content="", finish_reason="stop"),
        ChatResponse(content="Summary: `parts` holds one entry per st", finish_reason="length"),
    ],
)
async def test_a_summary_that_is_not_whole_keeps_the_history(summary: ChatResponse) -> None:
    """A refused, empty or cut-off summary replaced the whole history all the same (the
    next turn saw the engine's note about an empty reply, or half a summary)."""

    def respond_with(request: ChatRequest) -> Any:
        return summary if request.messages[-1].content == SUMMARY_PROMPT else repl(STEP)

    await _never_compacted(respond_with, "the summary is not whole")


async def _never_compacted(respond: Any, says: str) -> RLM:
    """A long run whose every compaction failed, saying ``says``: the run answered from
    its uncompacted history."""
    rlm = long_run(True, respond=respond, max_iterations=20)
    result = await rlm.acompletion("ctx")
    assert result.response == f"{sum(range(STEPS))}|False|none"  # never compacted
    nodes = list(result.graph.records(NodeKind.COMPACTION))
    assert nodes and all(node.status == NodeStatus.ERROR for node in nodes)
    assert all(says in (node.error or "") for node in nodes)
    return rlm


async def test_hidden_reasoning_does_not_count_as_history() -> None:
    """A thinking model's reasoning tokens are output tokens never sent again: counted as
    history, a history of a few hundred tokens was summarised before every turn."""
    turns = {"n": 0}

    def thinking(request: ChatRequest) -> Any:
        if request.messages[-1].content == SUMMARY_PROMPT:
            return "Summary."
        turns["n"] += 1
        code = "FINAL('done')" if turns["n"] == 6 else "print('a short result')"
        usage = Usage(input_tokens=200, output_tokens=28_000, reasoning_tokens=27_990)
        return ChatResponse(content=repl(code), usage=usage)

    rlm = RLM(
        "scripted",
        {"respond": thinking},
        models={"scripted": {"context_window": 32_000}},
        compaction=True,
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "done"
    assert not list(result.graph.records(NodeKind.COMPACTION))


async def test_the_summary_call_takes_the_root_turns_parameters_and_cache_key() -> None:
    """The summary went without the root's sampling parameters and without its cache
    key, so a provider with prompt caching paid its whole, already cached prefix again."""
    rlm = long_run(True, max_iterations=20, sampling_args={"temperature": 0.25, "max_tokens": 50})
    await rlm.acompletion("ctx")
    requests = scripted(rlm).requests
    summaries = [r for r in requests if r.messages[-1].content == SUMMARY_PROMPT]
    turn = next(r for r in requests if r.messages[-1].content != SUMMARY_PROMPT)
    assert summaries and turn.cache_key is not None and turn.max_tokens == 50
    for request in summaries:
        assert request.temperature == 0.25 and request.cache_key == turn.cache_key
        assert request.max_tokens is None  # a summary needs its room


class KeepLastTurn:
    """A test strategy: keep system, task and the last turn pair, past 1,000 tokens."""

    name = "keep_last_turn"

    def should_compact(
        self, messages: Sequence[Message], *, tokens: int, context_window: int, threshold_pct: float
    ) -> bool:
        return tokens > 1_000 and len(messages) > 4

    async def compact(self, messages: Sequence[Message], ctx: CompactionContext) -> list[Message]:
        assert ctx.context_window == WINDOW and ctx.model == "scripted"
        return [*messages[:2], *messages[-2:]]


class StrategyPlugin:
    @hookimpl
    def rlm_register_compaction_strategies(self) -> dict[str, Any]:
        return {"keep_last_turn": KeepLastTurn}


async def test_a_strategy_registered_by_a_plugin_is_used_by_name() -> None:
    rlm = long_run("keep_last_turn", plugins=[StrategyPlugin()], max_iterations=20)
    result = await rlm.acompletion("ctx")
    assert result.response == f"{sum(range(STEPS))}|True|system"
    compactions = list(result.graph.records(NodeKind.COMPACTION))
    assert len(compactions) >= 3
    assert all(len(t.messages) <= 6 for t in root_turns(rlm))


def test_an_unknown_strategy_fails_at_configuration() -> None:
    with pytest.raises(
        PluginError, match="unknown compaction strategy 'zip'; registered: .*summarize"
    ):
        RLM("scripted", {"responses": []}, compaction="zip")


@pytest.mark.parametrize(
    ("result", "says"),
    [
        (lambda messages: None, "returned NoneType, not a list"),
        (lambda messages: ["hello"], "holding str; every item must be a Message"),
        (lambda messages: [m.model_dump() for m in messages], "holding dict"),
        (lambda messages: [], "no user message"),
        (lambda m: [*m[:2], Message(role="assistant", content="ok")], "ending with 'assistant'"),
    ],
)
def test_a_strategy_returning_a_bad_history_is_named(result: Any, says: str) -> None:
    """Not an IndexError or AttributeError from deep inside the next turn."""

    class Broken:
        name = "broken"

        def should_compact(self, messages: Sequence[Message], **kwargs: object) -> bool:
            return True

        async def compact(self, messages: Sequence[Message], ctx: object) -> object:
            return result(messages)

    rlm = long_run(Broken())
    with pytest.raises(PluginError, match=f"compaction strategy 'broken': compact.. .*{says}"):
        rlm.completion("ctx")


async def test_a_summary_longer_than_the_history_is_not_taken() -> None:
    """A summary bigger than what it summarised was taken as the new history, marked
    ok: every turn after it was sent larger than before, over the window."""

    def verbose(request: ChatRequest) -> str:
        if request.messages[-1].content == SUMMARY_PROMPT:
            return "Summary: " + "y" * 40_000  # ~10,000 tokens: more than the history
        return repl(STEP)

    rlm = await _never_compacted(verbose, "no smaller, so the history is kept")
    assert all("y" * 100 not in m.content for r in root_turns(rlm) for m in r.messages)


class _Raising:
    name = "raising"

    def __init__(self, where: str) -> None:
        self.where = where

    def should_compact(self, messages: Sequence[Message], **sizes: object) -> bool:
        if self.where == "should_compact":
            raise ValueError("cannot tell")
        return True

    async def compact(self, messages: Sequence[Message], ctx: object) -> list[Message]:
        raise KeyError("oops")


@pytest.mark.parametrize("where", ["should_compact", "compact"])
def test_a_strategy_that_raises_is_named_as_its_failure(where: str) -> None:
    """A strategy's own bug reached the user as a bare KeyError from deep inside a turn."""
    with pytest.raises(PluginError, match=f"compaction strategy 'raising': {where}.. raised"):
        long_run(_Raising(where)).completion("ctx")


class _KeepTask:
    name = "keep_task"

    def should_compact(self, messages: Sequence[Message], *, tokens: int, **rest: object) -> bool:
        return tokens > 1_000

    async def compact(self, messages: Sequence[Message], ctx: object) -> list[Message]:
        return list(messages[:2])


class _Positional(_KeepTask):
    def should_compact(  # type: ignore[override]
        self, messages: Sequence[Message], tokens: int, window: int, pct: float, /
    ) -> bool:
        return False


def test_a_strategy_class_or_one_that_cannot_take_the_sizes_is_refused_when_built() -> None:
    """``compaction=KeepTask`` (the class) and a ``should_compact`` taking the sizes by
    position were accepted, and failed at the first turn with a TypeError."""
    with pytest.raises(ConfigError, match=r"takes a strategy object \(_KeepTask\(\)\)"):
        long_run(_KeepTask)
    with pytest.raises(PluginError, match="cannot take .messages, .*tokens, context_window"):
        long_run(_Positional())


async def test_a_compaction_records_the_history_it_rewrote_when_content_is_kept() -> None:
    rlm = long_run(_KeepTask(), record_content=True)
    result = await rlm.acompletion("ctx")
    node = next(iter(result.graph.records(NodeKind.COMPACTION)))
    assert node.status == NodeStatus.OK
    assert node.content_in is not None and "[user] REPL output:" in node.content_in
    assert node.content_out == ""  # only the system prompt and the task are left


async def test_a_text_final_in_the_last_turn_is_the_answer() -> None:
    """With ``accept_text_final``, the forced last turn's ``FINAL_VAR(x)`` written as
    text was returned as the literal answer ``"FINAL_VAR(x)"``."""
    for last, answer in (("FINAL_VAR(x)", "41"), ("FINAL(42)", "42")):
        replies = [repl("x = 41"), repl("print(x)"), last]
        rlm = RLM("scripted", {"responses": replies}, accept_text_final=True, max_iterations=2)
        result = await rlm.acompletion("ctx")
        assert (result.response, result.stop_reason) == (answer, "max_iterations")
