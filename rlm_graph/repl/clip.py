"""How much of a block's text the engine keeps: its printed output, and its error.

A block's result is kept by the engine in the block's node, its events, its trace and
its journal, and shown to the model. Model code chooses what it raises (a type named with
3 MB, a message of 9 MB) and, in a ``subprocess`` guest, may write a ``done`` of its own
to the engine's pipe; neither may grow the engine by what it holds.

Invariants:
    - An error text is at most `ERROR_CHARS` characters, the part before its first ``:``
      (the error's type, as the engine records it) at most `ERROR_TYPE_CHARS`, each
      saying how much of it was cut; clipping a clipped text again changes nothing (a
      guest's REPL clips, and the engine clips what it receives).
    - A result's ``stdout`` and ``stderr`` are at most the environment's ``output_cap``,
      and `NOTE_ROOM` for the notes a REPL adds past it.

Pure: imported by the guest program too.
"""

from __future__ import annotations

from ..contracts import ExecResult

__all__ = [
    "ERROR_CHARS",
    "ERROR_TYPE_CHARS",
    "NOTE_ROOM",
    "clip_error",
    "clip_text",
    "clipped_result",
]

ERROR_CHARS = 4_000
"""The most characters of a block's error text kept (its traceback is in its stderr)."""

ERROR_TYPE_CHARS = 200
"""The most characters kept of an error's type (the text before its first ``:``)."""

NOTE_ROOM = 1_000
"""Characters a REPL's own notes may add to a block's output past ``output_cap`` (how
much was not kept, why the answer was not sent)."""


def clip_text(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and how many more
    were not kept, in ``limit`` characters all told for a ``limit`` of 48 or more (so
    clipping again changes nothing)."""
    if len(text) <= limit:
        return text
    head = text[: max(limit - _NOTE_CHARS, 0)]
    return f"{head}... [{len(text) - len(head):,} more characters not kept]"


_NOTE_CHARS = 48  # room for the note `clip_text` adds, however many characters it counts


def clip_error(text: str) -> str:
    """An error text (``"Type: message"``) with its type within `ERROR_TYPE_CHARS` and
    the whole within `ERROR_CHARS`."""
    kind, colon, message = text.partition(":")
    if len(kind) <= ERROR_TYPE_CHARS and len(text) <= ERROR_CHARS:
        return text
    kind = clip_text(kind, ERROR_TYPE_CHARS)
    return kind + colon + clip_text(message, max(ERROR_CHARS - len(kind) - len(colon), 0))


def clipped_result(result: ExecResult, output_cap: int) -> ExecResult:
    """``result`` with its ``stdout``, ``stderr`` and ``error`` within their limits (as a
    guest's REPL keeps them: a forged result is cut to the same)."""
    room = output_cap + NOTE_ROOM
    update: dict[str, str] = {}
    for field in ("stdout", "stderr"):
        text: str = getattr(result, field)
        if len(text) > room:
            update[field] = clip_text(text, room)
    if result.error is not None and clip_error(result.error) is not result.error:
        update["error"] = clip_error(result.error)
    return result.model_copy(update=update) if update else result
