"""Short and rare garbage-collector passes while a batch runs: the heap that existed
before it is frozen (``gc.freeze``) for the batch's duration, and the youngest
generation is collected after `YOUNG_THRESHOLD` new objects rather than Python's 700.

Python's full collection walks every tracked object. With the engine's imports that is
some 60,000 to 140,000 objects, 40-180 ms per pass on a small VM, during which no
completion of the batch moves; and a batch triggers one every hundred completions or so
(the objects of the completions in flight are promoted and count towards the next full
pass). Frozen objects are skipped by every collection, so a full pass walks only what
the batch itself made. Nothing changes for the program's objects: ``gc.unfreeze`` at the
end puts them back, and a cycle among them that became garbage meanwhile is collected
then.

A completion leaves no reference cycle (its objects go by reference counting as it
ends), so the young passes find next to nothing to free: they walk the objects of the
completions in flight, every 700 allocations, about 6% of a batch completion's
instructions (docs/benchmarks.md). At `YOUNG_THRESHOLD` they come 28 times less often,
each about a millisecond at most.

Invariants:
    - Process-wide and counted: overlapping batches (threads, nested executors) freeze
      once, and the heap is unfrozen when the last of them ends.
    - A program that froze its heap itself (``gc.get_freeze_count() > 0`` when the first
      batch starts) is left alone: its freeze is never undone by a batch.
    - The thresholds are only ever raised, and put back when the last batch ends unless
      the program changed them meanwhile; a program whose young threshold is 0 (no
      automatic collection) or already `YOUNG_THRESHOLD` or more keeps its own.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["YOUNG_THRESHOLD", "frozen_heap"]

YOUNG_THRESHOLD = 20_000
"""New container objects (allocations less deallocations) between two collections of
the youngest generation while a batch runs (Python's default: 700)."""

_lock = threading.Lock()
_holders = 0
_froze = False  # whether the running batches froze the heap (and so must unfreeze it)
_thresholds: tuple[int, int, int] | None = None  # the program's, while ours are set


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the garbage collector's view of the heap, and raise its young threshold,
    for the ``with`` block (see the module's docstring); each a no-op when the program
    set its own already."""
    global _holders, _froze, _thresholds
    with _lock:
        if _holders == 0:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                _froze = True
            young, middle, old = gc.get_threshold()
            if 0 < young < YOUNG_THRESHOLD:
                _thresholds = (young, middle, old)
                gc.set_threshold(YOUNG_THRESHOLD, middle, old)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                if _froze:
                    gc.unfreeze()
                    _froze = False
                if _thresholds is not None:
                    if gc.get_threshold() == (YOUNG_THRESHOLD, *_thresholds[1:]):
                        gc.set_threshold(*_thresholds)
                    _thresholds = None
