"""What the model (and the record) is told of a reply that is not whole, and the usage of
a reply whose server counted none. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from ..contracts import ChatResponse, Message, Usage, estimate_tokens

__all__ = ["estimated_usage", "reply_note", "with_note", "without_note"]

# finish_reason values that mean "cut off by the output-token limit" (OpenAI, Anthropic).
_CUT_OFF = frozenset({"length", "max_tokens"})


def reply_note(response: ChatResponse) -> str | None:
    """What the model (and the node) should be told about a reply that is not whole.

    A reply cut off by the output-token limit, or one with no text at all (OpenAI's
    ``content: null``), is still a reply; passing it on as if it were complete (or as a
    silent ``""``) hides the problem from the model's code and from the user.
    """
    reason = response.finish_reason
    if reason in _CUT_OFF:
        return (
            f"the reply was cut off by the output-token limit (finish_reason={reason}); "
            "ask for less, or raise max_tokens"
        )
    if not response.content:
        return f"the model returned no text (finish_reason={reason or 'none'})"
    return None


def with_note(text: str, note: str) -> str:
    """A reply as the model sees it: ``text``, then ``note`` on a line of its own."""
    return f"{text}\n[rlm-graph: {note}]" if text else f"[rlm-graph: {note}]"


def without_note(text: str, note: str | None) -> str:
    """``text`` without the note `with_note` put after it: what the model wrote (the
    code of a block the output limit cut off open ends where the model stopped)."""
    if note is None:
        return text
    marked = with_note("", note)
    if text == marked:
        return ""
    return text.removesuffix("\n" + marked)


def estimated_usage(messages: Sequence[Message], reply: str) -> Usage:
    """The usage of a call whose server reported none (or only zeros): `estimate_tokens`
    of what was sent and of the reply, marked ``estimated`` so the user can tell."""
    return Usage(
        input_tokens=sum(estimate_tokens(m.content) for m in messages),
        output_tokens=estimate_tokens(reply),
        estimated=True,
    )
