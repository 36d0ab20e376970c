"""Finding ```` ```repl ```` blocks in a model's reply."""

from __future__ import annotations

import re

__all__ = ["find_code_blocks"]

# An opening fence whose info string is exactly `repl`, at the start of a line, up to the
# next closing fence at the start of a line (or the end of the reply: a model cut off by
# its token limit still gets its code run).
_BLOCK = re.compile(
    r"^[ \t]*```repl[ \t]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.DOTALL | re.MULTILINE
)


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
