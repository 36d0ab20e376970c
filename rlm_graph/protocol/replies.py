"""What the model (and the record) is told of a reply that is not whole, and the usage of
a reply whose server counted none. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from ..contracts import ChatResponse, Message, Usage, estimate_tokens

__all__ = ["estimated_usage", "is_whole", "reply_note", "with_note", "without_note"]

# finish_reason values that mean "cut off by the output-token limit" (OpenAI, Anthropic).
_CUT_OFF = frozenset({"length", "max_tokens"})
# Anthropic's: the reply filled what was left of the model's window.
_WINDOW = "model_context_window_exceeded"
# finish_reason values of a reply the server stopped before the model ended it: filtered
# (OpenAI's ``content_filter``, Gemini's ``safety``...), refused, or aborted (vLLM). Any
# other (``stop``, ``end_turn``, ``tool_calls``, a plugin's own word such as ``complete``,
# ``engine_stop``: the engine stopped reading a stream it had what it wanted of) is whole.
_STOPPED = frozenset(
    {
        "content_filter",
        "refusal",
        "abort",
        "safety",
        "recitation",
        "blocklist",
        "prohibited_content",
        "spii",
        "error",
    }
)


def is_whole(reason: str | None) -> bool:
    """Whether a reply that stopped for ``reason`` is whole (None: the server gave none)."""
    if reason is None:
        return True
    reason = reason.lower()
    return reason not in _CUT_OFF and reason != _WINDOW and reason not in _STOPPED


def reply_note(response: ChatResponse) -> str | None:
    """What the model (and the node) should be told about a reply that is not whole.

    A reply cut off by the output-token limit (or the model's window), refused,
    filtered or aborted by the server, or one with no text at all (OpenAI's ``content:
    null``), is still a reply; passing it on as if it were complete (or as a silent
    ``""``) hides the problem from the model's code and from the user.
    """
    reason = response.finish_reason
    word = (reason or "").lower()
    if word in _CUT_OFF:
        return (
            f"the reply was cut off by the output-token limit (finish_reason={reason}); "
            "ask for less, or raise max_tokens"
        )
    if word == _WINDOW:
        return (
            f"the reply was cut off by the model's context window (finish_reason={reason}); "
            "ask for less, or send a shorter history"
        )
    if word in _STOPPED:
        if word == "refusal":
            return f"the model refused to answer (finish_reason={reason})"
        return f"the reply is not whole: the server stopped it (finish_reason={reason})"
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
