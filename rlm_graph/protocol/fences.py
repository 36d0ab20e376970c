"""Finding ```` ```repl ```` blocks in a model's reply, whole or as it streams in."""

from __future__ import annotations

import re

from ..errors import PluginError

__all__ = ["DIVERGED_NOTE", "INVENTED_NOTE", "BlockCutter", "find_code_blocks", "invented_output"]

# An opening fence whose info string is exactly `repl`, ending its line (at its start, or
# after words that end in a colon: "Let me run: ```repl", as the reference library reads
# it; "blocks marked ```repl" is prose), up to the next closing fence at the start of a
# line (or the end of the
# reply: a model cut off by its token limit still gets its code run). Lines may end in
# "\r\n" (the code keeps them: Python reads them as "\n"); an indented fence (in a list
# item) has its indentation taken off the code's lines, as Markdown does.
_BLOCK = re.compile(
    r"^(?:([ \t]*)|[^\n]*:[ \t]*)```repl[ \t\r]*\n(.*?)(?:^[ \t]*```[ \t\r]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
# The same fences, one line at a time (a line without its "\n").
_OPENING = re.compile(r"(?:[ \t]*|.*:[ \t]*)```repl[ \t\r]*")
_CLOSING = re.compile(r"[ \t]*```[ \t\r]*")
# The first line after a block, when the model goes on to write the block's output
# itself: a bare or output-like fence (```, ```output, ```text...) or a label line
# (Output:, **REPL output:**, ### Result). The line is the model's: every run of blanks
# is possessive (``*+``), since two runs that could share the same blanks ("output" and
# 80,000 spaces) made `fullmatch` try every split of them, a minute on the loop.
_INVENTED = re.compile(
    r"[ \t]*+```[ \t]*+(?:output|text|txt|stdout|console|plaintext|result|repl[ _-]?output)?"
    r"[ \t\r]*+"
    r"|[ \t>#*_]*+(?:(?:repl|execution|console|code)[ \t]++)?(?:output|result|stdout)"
    r"[ \t]*+:?[ \t*_\r]*+",
    re.IGNORECASE,
)


DIVERGED_NOTE = (
    "the reply's stream broke off after a block had started, and the retried reply says "
    "something else; the reply ends after the last block that ran"
)
"""The note that ends a reply kept as `BlockCutter.settled` says."""

INVENTED_NOTE = (
    "the reply went on to write its block's output itself; that part was left out, and "
    "the REPL's own output follows"
)
"""The note that ends a reply that invented its block's output (`invented_output`)."""


def invented_output(text: str) -> int | None:
    """Where ``text`` starts to invent a block's output: the start of the first
    non-blank line after a ```` ```repl ```` block's closing fence, when that line opens
    a bare or output-like fence or is an output label (see `BlockCutter`). None when it
    does not. The reply's end counts as the end of its last line."""
    cutter = BlockCutter()
    cutter.feed(0, text + "\n")
    return cutter.invented


def find_code_blocks(text: str) -> list[str]:
    """The code of every ```` ```repl ```` block in ``text``, in order; empty ones dropped.

    Fences of other languages (```` ```python ````) are not run: the protocol names
    ``repl`` so that a model can show code without running it.
    """
    blocks = []
    for match in _BLOCK.finditer(text):
        indent, code = match.group(1) or "", match.group(2)
        if indent:
            code = "\n".join(_unindented(code.split("\n"), len(indent)))
        code = code.rstrip()
        if code.strip():
            blocks.append(code)
    return blocks


def _unindented(lines: list[str], width: int) -> list[str]:
    """``lines`` without up to ``width`` characters of leading spaces and tabs each: the
    indentation of the fence they were in."""
    out = []
    for line in lines:
        blank = len(line) - len(line.lstrip(" \t"))
        out.append(line[min(blank, width) :])
    return out


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
        invented: where the reply starts to invent the output of its last cut block (the
            first non-blank line after the block is a bare or output-like fence, or an
            "Output:" label), or None; nothing after it is cut.
    """

    __slots__ = (
        "_after",
        "_indent",
        "_length",
        "_line",
        "_open",
        "_pieces",
        "_start",
        "blocks",
        "committed",
        "diverged",
        "invented",
    )

    def __init__(self) -> None:
        self._pieces: list[str] = []  # the reply so far, joined when asked for (`text`)
        self._length = 0  # its length
        self.blocks: list[str] = []
        self.committed = 0
        self.diverged = False
        self.invented: int | None = None
        self._line: list[str] = []  # the pieces of the line not yet complete
        self._start = 0  # where that line starts in the reply
        self._open: list[str] | None = None  # the open block's lines so far, if one is open
        self._indent = 0  # the indentation of its opening fence
        self._after = False  # only blank lines since the last closing fence

    @property
    def text(self) -> str:
        """The reply so far."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def feed(self, offset: int, text: str) -> list[str]:
        """Take the reply's text from ``offset`` on (a `rlm_graph.contracts.TextSink`'s
        arguments); the blocks this cuts, in order. Each piece is looked at once, however
        small the pieces: a reply streamed a token at a time costs its length, not its
        length times its tokens.

        Raises:
            PluginError: the provider called its sink with other types (its mistake, named).
        """
        if not (isinstance(offset, int) and isinstance(text, str)):
            raise PluginError(
                f"a streaming provider called its sink with ({type(offset).__name__}, "
                f"{type(text).__name__}); a TextSink takes (offset: int, text: str), the "
                "reply's text from that character on (rlm_graph.contracts.TextSink)"
            )
        if offset < self._length:  # a retried attempt's text differs from here on
            if offset < self.committed:
                self.diverged = True
                return []
            whole, committed = self.text, self.committed
            text = whole[committed:offset] + text  # looked at again from the last cut block
            self._pieces, self._length = [whole[:committed]], committed
            self._line, self._start, self._open = [], committed, None
            self.invented, self._after = None, committed > 0
        if self.diverged or self.invented is not None:
            return []
        self._pieces.append(text)
        self._length += len(text)
        if "\n" not in text:
            self._line.append(text)
            return []
        return self._cut(text)

    def settled(self, reply: str) -> tuple[str, str] | None:
        """The reply to keep instead of the whole ``reply``, and the note that ends it
        (None: keep ``reply``), the same whether it streamed or not.

        When the blocks cut so far are not its first blocks (a retried attempt said
        something else than the text they were cut from), the text up to the last cut
        block, then `DIVERGED_NOTE`: code that ran is never attributed to a reply that
        does not contain it. When it invents a block's output (`invented_output`), the
        text before that, then `INVENTED_NOTE`.
        """
        blocks = self.blocks
        if blocks and (self.diverged or find_code_blocks(reply)[: len(blocks)] != blocks):
            return self.text[: self.committed] + f"\n[rlm-graph: {DIVERGED_NOTE}]", DIVERGED_NOTE
        cut = invented_output(reply)
        if cut is None:
            return None
        return reply[:cut] + f"[rlm-graph: {INVENTED_NOTE}]", INVENTED_NOTE

    def _cut(self, text: str) -> list[str]:
        """The blocks the complete lines of ``text`` (just added) close."""
        cut: list[str] = []
        *lines, rest = text.split("\n")
        if self._line:
            lines[0] = "".join([*self._line, lines[0]])
        start = self._start
        for line in lines:
            end = start + len(line)  # where its "\n" is
            if self._open is None:
                if self._after and line.strip():
                    self._after = False
                    if _INVENTED.fullmatch(line):
                        self.invented = start
                        return cut
                if "```" in line and _OPENING.fullmatch(line):
                    bare = line.lstrip(" \t")  # the fence alone on its line: its indentation
                    self._open = []
                    alone = bare.startswith("```repl") and not bare[7:].strip(" \t\r")
                    self._indent = len(line) - len(bare) if alone else 0
            elif "```" in line and _CLOSING.fullmatch(line):
                body = _unindented(self._open, self._indent) if self._indent else self._open
                code = "\n".join(body).rstrip()
                self._open, self._after = None, True
                self.committed = end + 1
                if code.strip():
                    self.blocks.append(code)
                    cut.append(code)
            else:
                self._open.append(line)
            start = end + 1
        self._line = [rest] if rest else []
        self._start = start
        return cut
