"""Short garbage-collector pauses while a batch runs: the heap that existed before it is
frozen (``gc.freeze``) for the batch's duration.

Python's full collection walks every tracked object. With the engine's imports that is
some 60,000 to 140,000 objects, 40-180 ms per pass on a small VM, during which no
completion of the batch moves; and a batch triggers one every hundred completions or so
(the objects of the completions in flight are promoted and count towards the next full
pass). Frozen objects are skipped by every collection, so a full pass walks only what
the batch itself made. Nothing changes for the program's objects: ``gc.unfreeze`` at the
end puts them back, and a cycle among them that became garbage meanwhile is collected
then.

Invariants:
    - Process-wide and counted: overlapping batches (threads, nested executors) freeze
      once, and the heap is unfrozen when the last of them ends.
    - A program that froze its heap itself (``gc.get_freeze_count() > 0`` when the first
      batch starts) is left alone: its freeze is never undone by a batch.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap"]

_lock = threading.Lock()
_holders = 0
_froze = False  # whether the running batches froze the heap (and so must unfreeze it)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the garbage collector's view of the heap for the ``with`` block (see the
    module's docstring); a no-op when the program froze it already."""
    global _holders, _froze
    with _lock:
        if _holders == 0 and gc.get_freeze_count() == 0:
            gc.freeze()
            _froze = True
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _froze:
                gc.unfreeze()
                _froze = False
