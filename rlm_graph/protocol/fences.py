"""Finding ```` ```repl ```` blocks in a model's reply, whole or as it streams in."""

from __future__ import annotations

import re

__all__ = ["DIVERGED_NOTE", "BlockCutter", "find_code_blocks"]

# An opening fence whose info string is exactly `repl`, at the start of a line, up to the
# next closing fence at the start of a line (or the end of the reply: a model cut off by
# its token limit still gets its code run).
_BLOCK = re.compile(
    r"^[ \t]*```repl[ \t]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.DOTALL | re.MULTILINE
)
# The same fences, one line at a time (a line without its "\n").
_OPENING = re.compile(r"[ \t]*```repl[ \t]*")
_CLOSING = re.compile(r"[ \t]*```[ \t]*")


DIVERGED_NOTE = (
    "the reply's stream broke off after a block had started, and the retried reply says "
    "something else; the reply ends after the last block that ran"
)
"""The note that ends a reply kept as `BlockCutter.settled` says."""


def find_code_blocks(text: str) -> list[str]:
    """The code of every ```` ```repl ```` block in ``text``, in order; empty ones dropped.

    Fences of other languages (```` ```python ````) are not run: the protocol names
    ``repl`` so that a model can show code without running it.
    """
    blocks = []
    for match in _BLOCK.finditer(text):
        code = match.group(1).rstrip()
        if code.strip():
            blocks.append(code)
    return blocks


class BlockCutter:
    """Cuts ```` ```repl ```` blocks out of a reply while it streams in.

    A block is cut once the line of its closing fence is complete (its ``"\\n"`` has
    arrived): no later text can change it then. So the blocks cut from any prefix of a
    reply are the first blocks `find_code_blocks` finds in the whole reply, in order,
    whatever the reply goes on to say (a block left open at the end, which
    `find_code_blocks` also runs, is never cut here: only the whole reply shows it ends
    open). The cutter looks at each line once, except the last, incomplete one.

    Attributes:
        text: the reply so far.
        blocks: the code of the blocks cut so far (empty blocks are skipped, as
            `find_code_blocks` skips them).
        committed: the length of the text the cut blocks came from (up to the end of the
            last cut block's closing line); text before it may no longer change.
        diverged: a rewind (`feed` with an offset before ``committed``) said that text
            the cut blocks came from has changed.
    """

    __slots__ = ("_open", "_scan", "blocks", "committed", "diverged", "text")

    def __init__(self) -> None:
        self.text = ""
        self.blocks: list[str] = []
        self.committed = 0
        self.diverged = False
        self._scan = 0  # the start of the first line not yet looked at
        self._open: int | None = None  # where the open block's code starts, if one is open

    def feed(self, offset: int, text: str) -> list[str]:
        """Take the reply's text from ``offset`` on (a `rlm_graph.contracts.TextSink`'s
        arguments); the blocks this cuts, in order."""
        if offset < len(self.text):  # a retried attempt's text differs from here on
            if offset < self.committed:
                self.diverged = True
                return []
            self.text = self.text[:offset]
            self._scan, self._open = self.committed, None
        if self.diverged:
            return []
        self.text += text
        if "\n" not in text:
            return []
        return self._cut()

    def settled(self, reply: str) -> str | None:
        """The reply to keep instead of the whole ``reply`` (None: ``reply`` itself).

        ``reply`` is kept when the blocks cut so far are its first blocks. Otherwise (a
        retried attempt said something else than the text they were cut from) the kept
        reply is the text up to the last cut block, then `DIVERGED_NOTE`: code that ran
        is never attributed to a reply that does not contain it.
        """
        blocks = self.blocks
        if not blocks or (not self.diverged and find_code_blocks(reply)[: len(blocks)] == blocks):
            return None
        return self.text[: self.committed] + f"\n[rlm-graph: {DIVERGED_NOTE}]"

    def _cut(self) -> list[str]:
        cut: list[str] = []
        text, scan = self.text, self._scan
        end = text.find("\n", scan)
        while end != -1:
            line = text[scan:end]
            if self._open is None:
                if "```" in line and _OPENING.fullmatch(line):
                    self._open = end + 1
            elif "```" in line and _CLOSING.fullmatch(line):
                code = text[self._open : scan].rstrip()
                self._open = None
                self.committed = end + 1
                if code.strip():
                    self.blocks.append(code)
                    cut.append(code)
            scan = end + 1
            end = text.find("\n", scan)
        self._scan = scan
        return cut
