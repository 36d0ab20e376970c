"""The streaming block cutter against the whole-reply parser: whatever the chunking, the
blocks cut while a reply streams in are the first blocks `find_code_blocks` finds in the
whole reply, and with the rest of the reply run after it, every block, in order."""

from __future__ import annotations

import random

import pytest

from rlm_graph.protocol import find_code_blocks
from rlm_graph.protocol.fences import INVENTED_NOTE, BlockCutter, invented_output

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
    assert cutter.text == reply or cutter.invented is not None
    whole = find_code_blocks(reply)
    assert seen == cutter.blocks == whole[: len(seen)]
    # What the reply keeps (up to any invented output, found the same way whole) has
    # the cut blocks and at most one more: open at the end, or closed by its last line.
    cut = invented_output(reply)
    assert cutter.invented is None or cutter.invented == cut
    kept = find_code_blocks(reply if cut is None else reply[:cut])
    assert kept[: len(seen)] == seen and len(kept) - len(seen) <= 1


def test_a_rewound_reply_is_cut_as_the_reply_it_became() -> None:
    # A retried attempt that agrees up to a point at or after the last cut block, then
    # says something else: the blocks are those of the reply it became, as if it had
    # streamed that way from the start.
    for seed in range(600):
        rng = random.Random(seed)
        first, cutter = _reply(rng), BlockCutter()
        pieces = _chunks(rng, first)
        for chunk in pieces[: rng.randint(0, len(pieces))]:
            cutter.feed(len(cutter.text), chunk)
        if cutter.diverged or cutter.invented is not None:
            continue
        offset = rng.randint(cutter.committed, len(cutter.text))
        became = cutter.text[:offset] + _reply(rng)
        for i, chunk in enumerate(_chunks(rng, became[offset:])):
            cutter.feed(offset if i == 0 else len(cutter.text), chunk)
        fresh = BlockCutter()
        fresh.feed(0, became)
        assert (cutter.blocks, cutter.invented) == (fresh.blocks, fresh.invented), seed
        if cutter.invented is None:
            assert cutter.text == became


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


@pytest.mark.parametrize(
    "after",
    [
        "Output:\n```\n2\n```\n",
        "```\n2\n```\n",
        "\n```output\n2\n```",
        "**REPL output:**\n2",
        "### Result\n",
    ],
)
def test_a_reply_that_writes_its_blocks_output_is_cut_there(after: str) -> None:
    reply = "Let me see.\n```repl\nprint(1 + 1)\n```\n" + after
    start = reply.index("```\n", reply.index("```repl")) + 4
    cut = invented_output(reply)
    assert cut is not None and reply[start:cut].strip() == ""
    cutter = BlockCutter()
    stops = [cutter.feed(len(cutter.text), piece) or cutter.invented for piece in reply]
    assert cutter.invented == cut and any(stops)
    kept, note = cutter.settled(reply) or ("", "")
    assert kept == reply[:cut] + f"[rlm-graph: {INVENTED_NOTE}]" and note == INVENTED_NOTE


@pytest.mark.parametrize(
    "after",
    [
        "The output will tell.\n",
        "```python\nprint(2)\n```\n",
        "```repl\nprint(2)\n```\n",
        "Output: 2 is next\n",
    ],
)
def test_words_code_and_more_blocks_after_a_block_are_not_output(after: str) -> None:
    assert invented_output("```repl\nx = 1\n```\n" + after) is None


@pytest.mark.parametrize("line", ["output" + " " * 200_000 + "x", "```" + " " * 200_000 + "x"])
def test_a_long_run_of_blanks_after_a_block_is_read_in_one_pass(line: str) -> None:
    # Each split of the blanks between two runs that may hold them was tried once: this
    # line took about two minutes of the loop's time, stalling every run in the process.
    assert invented_output("```repl\nx = 1\n```\n" + line + "\n") is None
    assert invented_output("```repl\nx = 1\n```\n" + line[:-1] + "\n") is not None
