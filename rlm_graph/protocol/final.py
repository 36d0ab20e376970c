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

# A fence opens at the start of a line, or ends one after a colon ("Let me run: ```repl",
# a block that runs), and closes at the start of a line; three backticks inside a line
# are text ("I'd write a ```repl block, but...").
_FENCE = re.compile(
    r"(?:^[ \t]*```|:[ \t]*```[\w+-]*[ \t\r]*$).*?(?:^[ \t]*```[^\n]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
_START = re.compile(r"^[ \t]*(FINAL_VAR|FINAL)[ \t]*\(", re.MULTILINE)


class TextFinal:
    """A text answer found in a reply: ``kind`` is ``"FINAL"`` or ``"FINAL_VAR"``."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: str) -> None:
        self.kind = kind
        self.value = value

    def __repr__(self) -> str:
        return f"TextFinal({self.kind!r}, {self.value!r})"


_SPECIAL = re.compile(r"[()\"'\\]")
"""What the balancing scan stops at; the text between goes by at the regex's speed."""

_WORK = 200_000
"""Characters of that kind one reply's scans may visit in all: a reply of many
``FINAL(`` lines that never close would otherwise cost its length squared."""


def _balanced(text: str, start: int, budget: list[int], quotes: bool = True) -> int | None:
    """Index of the ``)`` closing the ``(`` just before ``start``, or None (not closed,
    or ``budget[0]``, the work left, ran out). ``quotes``: parentheses inside quoted
    strings do not count (without, quotes are text: an apostrophe, an inch mark)."""
    depth = 1
    quote: str | None = None
    skip = -1  # the character after a backslash in a string
    for match in _SPECIAL.finditer(text, start):
        at = match.start()
        if at <= skip:
            continue
        budget[0] -= 1
        if budget[0] < 0:
            return None
        ch = match.group()
        if quote:
            if ch == "\\":
                skip = at + 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch if quotes else None
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return at
    return None


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def find_text_final(text: str) -> TextFinal | None:
    """The last ``FINAL(...)``/``FINAL_VAR(...)`` at the start of a line outside fences
    whose parentheses close (outside quoted strings; or, where a quote never closes, as
    an apostrophe in ``FINAL(Bob's)`` does, counting every parenthesis); looked for from
    the end, within a bounded amount of work (`_WORK`), so that a hostile reply costs no
    more than a long one."""
    prose = _FENCE.sub(lambda m: " " * len(m.group(0)), text)
    budget = [_WORK]
    for match in reversed(list(_START.finditer(prose))):
        end = _balanced(prose, match.end(), budget)
        if end is None and budget[0] >= 0:  # a quote that never closed is prose ("Bob's")
            end = _balanced(prose, match.end(), budget, quotes=False)
        if end is not None:
            return TextFinal(match.group(1), _unquote(text[match.end() : end]))
        if budget[0] < 0:
            return None
    return None
