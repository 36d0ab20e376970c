"""The direct path: ``RLM(direct_if_fits=True)`` answers in one call when it fits."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ConfigError
from tests.support.scripts import is_root_turn, repl, scripted

WINDOW = {"scripted": {"context_window": 1_000}}  # the direct path may use 500 tokens


def respond(request: ChatRequest) -> str:
    if is_root_turn(request):
        return repl("FINAL('from the loop')")
    return "from one call"


def rlm(**kwargs: object) -> RLM:
    kwargs.setdefault("models", WINDOW)
    return RLM("scripted", {"respond": respond}, direct_if_fits=True, **kwargs)  # type: ignore[arg-type]


async def test_taken_when_question_and_context_fit_the_share_of_the_window() -> None:
    engine = rlm()
    result = await engine.acompletion("a short context", root_prompt="what is it?")
    assert result.response == "from one call"
    (node,) = result.graph.records()
    assert node.id == "direct" and node.kind == NodeKind.LLM_CALL and node.depth == 0
    assert node.reason is not None and "fit in 50% (500) of the 1,000-token window" in node.reason
    assert result.metadata == {"direct_path": "taken: " + node.reason}
    (request,) = scripted(engine).requests
    assert request.prompt == "what is it?\n\na short context"
    assert not any(m.role == "system" for m in request.messages)


async def test_not_taken_when_it_does_not_fit() -> None:
    result = await rlm().acompletion("x" * 2_400, root_prompt="count")
    assert result.response == "from the loop"
    assert "direct" not in [r.id for r in result.graph.records()]
    assert [r.kind for r in result.graph.records()] == [NodeKind.ROOT_TURN, NodeKind.REPL_BLOCK]
    reason = (result.metadata or {})["direct_path"]
    assert reason.startswith("not taken: ~602 tokens of question and context exceed 50% (500)")


async def test_the_share_is_the_users() -> None:
    result = await rlm(direct_share=0.9).acompletion("x" * 2_400, root_prompt="count")
    assert result.response == "from one call"


async def test_not_taken_for_a_model_without_a_stated_window() -> None:
    result = await rlm(models={}).acompletion("tiny")
    assert result.response == "from the loop"
    assert "not in the model table" in (result.metadata or {})["direct_path"]


async def test_off_by_default() -> None:
    engine = RLM("scripted", {"respond": respond}, models=WINDOW)
    result = await engine.acompletion("tiny")
    assert result.response == "from the loop" and result.metadata is None


class Answer(BaseModel):
    value: int


async def test_a_typed_direct_answer_is_validated_and_a_mismatch_goes_to_the_loop() -> None:
    replies = iter(['{"value": 7}', "seven", repl("FINAL({'value': 8})")])
    engine = RLM(
        "scripted", {"respond": lambda r: next(replies)}, models=WINDOW, direct_if_fits=True
    )
    typed = await engine.acompletion("ctx", schema=Answer)
    assert typed.parsed == Answer(value=7)
    assert scripted(engine).requests[0].response_schema is not None
    fallback = await engine.acompletion("ctx", schema=Answer)
    assert fallback.parsed == Answer(value=8)
    direct = next(r for r in fallback.graph.records() if r.id == "direct")
    assert direct.status == NodeStatus.ERROR and direct.error_type == "SchemaMismatch"
    assert (fallback.metadata or {})["direct_path"].startswith("taken, then handed to the RLM loop")
    assert fallback.error is None


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="direct_share"):
        RLM("scripted", {"responses": []}, direct_if_fits=True, direct_share=1.5)
    with pytest.raises(ConfigError, match="persistent"):
        RLM("scripted", {"responses": []}, direct_if_fits=True, persistent=True)
