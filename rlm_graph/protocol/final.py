"""Text ``FINAL(...)`` / ``FINAL_VAR(...)`` outside code blocks (opt-in only).

Models trained on the paper's protocol end with ``FINAL(answer)`` written as text. The
reference library dropped parsing it after repeated bugs (quotes, nested parentheses,
tags inside code), so rlm-graph accepts it only when the user opts in
(``accept_text_final=True``), and parses it with a scanner that balances parentheses and
skips quoted strings, and never looks inside a code fence.
"""

from __future__ import annotations

import re

__all__ = ["TextFinal", "find_text_final"]

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_START = re.compile(r"^[ \t]*(FINAL_VAR|FINAL)\(", re.MULTILINE)


class TextFinal:
    """A text answer found in a reply: ``kind`` is ``"FINAL"`` or ``"FINAL_VAR"``."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: str) -> None:
        self.kind = kind
        self.value = value

    def __repr__(self) -> str:
        return f"TextFinal({self.kind!r}, {self.value!r})"


def _balanced(text: str, start: int) -> int | None:
    """Index of the ``)`` closing the ``(`` just before ``start``, or None."""
    depth = 1
    quote: str | None = None
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def find_text_final(text: str) -> TextFinal | None:
    """The last ``FINAL(...)``/``FINAL_VAR(...)`` at the start of a line outside fences."""
    prose = _FENCE.sub(lambda m: " " * len(m.group(0)), text)
    found: TextFinal | None = None
    for match in _START.finditer(prose):
        end = _balanced(prose, match.end())
        if end is None:
            continue
        inner = text[match.end() : end]
        found = TextFinal(match.group(1), _unquote(inner))
    return found
