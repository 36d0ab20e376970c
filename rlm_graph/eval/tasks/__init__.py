"""The tasks ``rlm-graph eval --task NAME`` generates from a seed. Pure.

| task | what | scoring | default length |
| --- | --- | --- | --- |
| ``sniah`` | one needle in a haystack (RULER's ``niah_single`` shape) | ``exact`` | 8k |
| ``synth-oolong`` | counts and the most common label over labelled records (OOLONG's shape) | ``numeric``, ``label`` | 131k |
| ``synth-oolong-pairs`` | pairs of users that both have a label (OOLONG-Pairs' shape) | ``pairs`` (F1) | 32k |

Invariants:
    - An item depends only on (task, index, length, seed): the same command makes the
      same items on every machine, so a rerun resumes instead of starting over.
    - Items are made one at a time as they are iterated; `TaskItems` can be iterated
      again (each method of an evaluation walks the items once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ...errors import ConfigError
from ..items import EvalItem
from .sniah import sniah_items
from .synth import oolong_items, pairs_items
from .text import CHARS_PER_TOKEN, length_label, parse_lengths

__all__ = [
    "CHARS_PER_TOKEN",
    "TASKS",
    "Task",
    "TaskItems",
    "length_label",
    "parse_lengths",
    "task_items",
]


@dataclass(frozen=True, slots=True)
class Task:
    """A generated task: its name, what it is, its default lengths, its generator."""

    name: str
    description: str
    lengths: tuple[int, ...]
    make: Callable[[int, Sequence[int], int], Iterator[EvalItem]]


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            "sniah",
            "a single needle in a haystack (RULER-style), exact match",
            (8192,),
            sniah_items,
        ),
        Task(
            "synth-oolong",
            "counts over labelled records in OOLONG's shape, 0.75**error",
            (131_072,),
            oolong_items,
        ),
        Task(
            "synth-oolong-pairs",
            "pairs of users with a label in OOLONG-Pairs' shape, F1",
            (32_768,),
            pairs_items,
        ),
    )
}


class TaskItems:
    """The items of one task: ``n`` per length, remade each time they are iterated.

    Args:
        name: a name of `TASKS`.
        n: items per length.
        lengths: lengths in tokens (default: the task's).
        seed: the generator's seed.

    Raises:
        ConfigError: an unknown task (the message lists them) or a bad ``n``.
    """

    def __init__(
        self, name: str, n: int = 10, lengths: Sequence[int] | None = None, seed: int = 0
    ) -> None:
        if name not in TASKS:
            raise ConfigError(
                f"unknown task {name!r}; the tasks are {', '.join(TASKS)} (or --data FILE.jsonl)"
            )
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"--n must be a positive number of items per length, not {n!r}")
        self.task = TASKS[name]
        self.n = n
        self.lengths = tuple(lengths) if lengths else self.task.lengths
        self.seed = seed

    def __iter__(self) -> Iterator[EvalItem]:
        return self.task.make(self.n, self.lengths, self.seed)

    def __len__(self) -> int:
        return self.n * len(self.lengths)

    @property
    def title(self) -> str:
        return f"{self.task.name} ({', '.join(length_label(t) for t in self.lengths)}; seed {self.seed})"


def task_items(
    name: str, n: int = 10, lengths: Sequence[int] | None = None, seed: int = 0
) -> TaskItems:
    """The items of task ``name`` (see `TaskItems`)."""
    return TaskItems(name, n, lengths, seed)
