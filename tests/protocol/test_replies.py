"""What the model is told of a reply that is not whole."""

from __future__ import annotations

import pytest

from rlm_graph.contracts import ChatResponse
from rlm_graph.protocol.replies import is_whole, reply_note


@pytest.mark.parametrize(
    "reason", ["model_context_window_exceeded", "MODEL_CONTEXT_WINDOW_EXCEEDED"]
)
def test_a_reply_cut_by_the_window_says_so_in_any_case(reason: str) -> None:
    note = reply_note(ChatResponse(content="The list: 1, 2,", finish_reason=reason))
    assert note is not None and "cut off by the model's context window" in note


@pytest.mark.parametrize("reason", [None, "", "stop", "STOP", "end_turn", "tool_calls", "complete"])
def test_a_reply_the_model_ended_is_whole(reason: str | None) -> None:
    assert is_whole(reason)
    assert reply_note(ChatResponse(content="done", finish_reason=reason)) is None


@pytest.mark.parametrize("reason", ["length", "MAX_TOKENS", "content_filter", "refusal", "abort"])
def test_a_reply_the_server_stopped_is_not_whole(reason: str) -> None:
    assert not is_whole(reason)
    assert reply_note(ChatResponse(content="half", finish_reason=reason)) is not None
