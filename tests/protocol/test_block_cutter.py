"""The streaming block cutter against the whole-reply parser: whatever the chunking, the
blocks cut while a reply streams in are the first blocks `find_code_blocks` finds in the
whole reply, and with the rest of the reply run after it, every block, in order."""

from __future__ import annotations

import random

import pytest

from rlm_graph.protocol import find_code_blocks
from rlm_graph.protocol.fences import BlockCutter

PIECES = [
    "```repl\n",
    "```repl \n",
    "  ```repl\n",
    "```\n",
    "``` \n",
    "````\n",
    "```python\n",
    "```repl\r\n",
    "```\r\n",
    "x = 1\n",
    "print(x)\n",
    "\n",
    "Some words. ",
    "`inline` ",
    "``",
    "`",
    "repl",
    "\n",
    "answer['ready'] = True\n",
]


def _reply(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 40)))


def _chunks(rng: random.Random, text: str) -> list[str]:
    if len(text) < 2:
        return [text]
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12))))
    edges = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@pytest.mark.parametrize("seeds", [range(0, 500), range(500, 1000)])
def test_cut_blocks_are_a_prefix_of_the_whole_replys_blocks(seeds: range) -> None:
    for seed in seeds:
        _check(random.Random(seed))


def _check(rng: random.Random) -> None:
    reply = _reply(rng)
    cutter = BlockCutter()
    seen: list[str] = []
    for chunk in _chunks(rng, reply):
        seen += cutter.feed(len(cutter.text), chunk)
        # At every point, what was cut is what the whole reply's parse starts with.
        assert seen == find_code_blocks(reply)[: len(seen)]
    assert cutter.text == reply
    whole = find_code_blocks(reply)
    assert seen == cutter.blocks == whole[: len(seen)]
    # Only a block still open at the end (or closed by the reply's last line) is left.
    assert len(whole) - len(seen) <= 1


def test_a_block_is_cut_when_its_closing_line_ends() -> None:
    cutter = BlockCutter()
    assert cutter.feed(0, "Let me look.\n```repl\nx = 1\n") == []
    assert cutter.feed(len(cutter.text), "```") == []  # could still be ```python
    assert cutter.feed(len(cutter.text), "\nMore words") == ["x = 1"]
    assert cutter.committed == len("Let me look.\n```repl\nx = 1\n```\n")


def test_a_rewind_after_the_cut_blocks_replaces_the_uncut_text() -> None:
    cutter = BlockCutter()
    cutter.feed(0, "```repl\na\n```\n```repl\nb\n")
    assert cutter.blocks == ["a"]
    # A retried attempt agrees up to the end of block a, then says something else.
    assert cutter.feed(len("```repl\na\n```\n"), "```repl\nc\n```\n") == ["c"]
    assert cutter.blocks == ["a", "c"] and not cutter.diverged


def test_a_rewind_into_a_cut_block_is_divergence() -> None:
    cutter = BlockCutter()
    cutter.feed(0, "```repl\na\n```\n")
    assert cutter.feed(3, "other text\n```repl\nz\n```\n") == []
    assert cutter.diverged and cutter.blocks == ["a"]
