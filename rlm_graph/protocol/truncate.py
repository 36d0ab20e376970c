"""Cutting REPL output to what the next turn can afford."""

from __future__ import annotations

__all__ = ["DEFAULT_OUTPUT_CHARS", "truncate_output"]

DEFAULT_OUTPUT_CHARS = 20_000


def truncate_output(text: str, limit: int = DEFAULT_OUTPUT_CHARS, *, dropped: int = 0) -> str:
    """Keep the head of ``text`` (and a short tail) within ``limit`` characters.

    Args:
        text: the output.
        limit: the most characters to keep.
        dropped: characters already dropped before ``text`` reached us (a capped capture
            buffer counts what it did not store).

    The marker says how many characters were cut, so the model knows to slice or
    delegate instead of printing everything.
    """
    total = len(text) + dropped
    if total <= limit:
        return text
    tail = min(limit // 10, 2_000)
    head = limit - tail
    cut = total - head - tail
    return (
        text[:head]
        + f"\n... [{cut:,} characters truncated: print less, slice, or use llm_query] ...\n"
        + (text[-tail:] if tail else "")
    )
