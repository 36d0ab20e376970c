"""Files that hold a run's content (prompts, documents, replies): readable by their owner
only.

Every file rlm-graph writes with run content (trace files, reports, graph exports,
batch and evaluation results; the journal opens its own the same way) is created with
mode 0600. A file that already exists keeps the mode its owner gave it: that is how a
user says otherwise (``touch out.jsonl && chmod 644 out.jsonl``, or a group-readable
folder's files made beforehand).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

__all__ = ["PRIVATE", "open_private", "write_private"]

PRIVATE = 0o600


def open_private(path: str | os.PathLike[str], mode: str = "w") -> IO[str]:
    """``open(path, mode, encoding="utf-8")`` (``"w"`` or ``"a"``), a new file created 0600."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, PRIVATE), mode, encoding="utf-8")


def write_private(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` (a new file created 0600) and return the path."""
    with open_private(path) as handle:
        handle.write(text)
    return Path(path)
