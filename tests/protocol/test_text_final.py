"""A text ``FINAL(...)`` in a reply (``accept_text_final=True``): the last one whose
parentheses close, found in bounded work whatever the reply holds."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from rlm_graph.protocol import final
from rlm_graph.protocol.final import find_text_final


def test_the_last_closed_final_wins_and_unclosed_ones_are_passed_over() -> None:
    reply = "FINAL(first)\nFINAL(never closed\nFINAL_VAR(\"a (quoted) ')' name\")\nFINAL(\n"
    found = find_text_final(reply)
    assert found is not None
    assert (found.kind, found.value) == ("FINAL_VAR", "a (quoted) ')' name")
    assert find_text_final("```\nFINAL(in a fence)\n```") is None


class _Counted:
    """`final._SPECIAL`, counting the characters the scans visit."""

    def __init__(self) -> None:
        self.pattern = re.compile(r"[()\"'\\]")
        self.visited = 0

    def finditer(self, text: str, start: int) -> Iterator[re.Match[str]]:
        for match in self.pattern.finditer(text, start):
            self.visited += 1
            yield match


def test_many_unclosed_finals_cost_bounded_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each unclosed ``FINAL(`` was scanned to the end of the reply: 10,000 such lines
    (70 KB) held the event loop a minute, and no max_timeout could stop it."""
    counted = _Counted()
    monkeypatch.setattr(final, "_SPECIAL", counted)
    reply = "FINAL(\n" * 5_000
    assert find_text_final(reply) is None
    assert counted.visited <= final._WORK + 1  # not 5,000 scans of the rest of the reply
    counted.visited = 0
    found = find_text_final(reply + "FINAL(yes)")  # the last one, closed: found first
    assert found is not None and found.value == "yes"
    assert counted.visited == 1
