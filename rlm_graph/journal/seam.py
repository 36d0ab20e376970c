"""How a node and a run say they are journaled (pure): `Journaled`, given to
`Run.execute`, and `JournalTarget`, given to the run's lifecycle. The scheduler's side
of the seam is `rlm_graph.runtime.replay.Replayer`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from ..graph import NodeRecord

__all__ = [
    "INCOMPLETE_CHILD",
    "KEEP_TEXT",
    "READ_TEXT",
    "JournalTarget",
    "Journaled",
    "whole_answer",
]

T = TypeVar("T")


def KEEP_TEXT(value: Any) -> str | None:  # noqa: N802 - a constant, compared by identity
    """`Journaled.keep` of a node whose result is text: the text itself."""
    return value if isinstance(value, str) else None


def READ_TEXT(text: str) -> Any:  # noqa: N802 - a constant, compared by identity
    """`Journaled.read` of a node whose result is text: the text itself."""
    return text


INCOMPLETE_CHILD = "[INCOMPLETE: the child stopped after repeated code errors]"
"""How a child completion's answer starts when ``max_errors`` stopped it."""


def whole_answer(answer: Any) -> str | None:
    """`Journaled.keep` of a child completion: its answer, unless ``max_errors`` cut it
    (not in the run's key, so that a resume with a larger one runs the child again
    instead of replaying the cut answer)."""
    if not isinstance(answer, str) or answer.startswith(INCOMPLETE_CHILD):
        return None
    return answer


class Journaled(NamedTuple, Generic[T]):
    """How a node is kept in the run's journal (given to `Run.execute` as ``journal=``).

    Attributes:
        request: the hash of what the node asks (`rlm_graph.journal.value_hash`,
            `rlm_graph.journal.keys.call_hash`): a record replays only under the same one.
        keep: the node's result as the text replay will return (None: it cannot be kept
            faithfully, so the node is not recorded and runs again on resume).
        read: the stored text back as the node's result; None for a node that is
            recorded but never replayed (a REPL block runs again, to rebuild its state).
        replayed: called with the record after a replay adopted the stored one (a
            model call counts its usage in its completion's tally; a child puts its
            nodes back in the graph).
    """

    request: str
    keep: Callable[[T], str | None] = KEEP_TEXT
    read: Callable[[str], T] | None = READ_TEXT
    replayed: Callable[[NodeRecord], None] | None = None


@dataclass(frozen=True, slots=True)
class JournalTarget:
    """Where a run is journaled: the file, the run's key (its inputs and configuration,
    `rlm_graph.journal.run_key`), its kind (``"rlm"``, ``"workflow"``) and a label."""

    path: str | os.PathLike[str]
    key: str
    kind: str
    label: str
