"""Removing scratch folders without making a completion wait for it.

Removing even an empty folder costs milliseconds on some filesystems (2-3 ms measured on
ext4 mounted with ``discard``), and every completion of the ``local`` environment has a
folder of its own: waiting for the removal, even off the trio thread, made it part of
every completion's latency. So a closing environment hands its folder to one reaper
thread and returns at once.

Invariants:
    - A folder handed over is removed: by the reaper, or, for whatever is still pending
      when the interpreter exits, by an ``atexit`` handler (the reaper is a daemon
      thread so that it never holds the process open).
    - The reaper exists only while there is work: it ends after `_IDLE` seconds without
      any, and the next folder starts a new one.
"""

from __future__ import annotations

import atexit
import shutil
import threading

__all__ = ["remove_later", "wait_removed"]

_IDLE = 1.0  # seconds the reaper waits for more work before it ends

_lock = threading.Condition()
_queue: list[str] = []
_pending: set[str] = set()  # handed over and not yet removed (queued or being removed)
_reaper: threading.Thread | None = None


def remove_later(path: str) -> None:
    """Remove the folder ``path`` and everything in it, soon, on another thread."""
    global _reaper
    with _lock:
        _queue.append(path)
        _pending.add(path)
        if _reaper is None:
            _reaper = threading.Thread(target=_reap, name="rlm-graph-scratch-reaper", daemon=True)
            _reaper.start()
        else:
            _lock.notify_all()


def wait_removed(timeout: float | None = None) -> bool:
    """Wait until every folder handed over so far is gone; False on ``timeout``."""
    with _lock:
        return _lock.wait_for(lambda: not _pending, timeout)


def _reap() -> None:
    global _reaper
    while True:
        with _lock:
            if not _queue and not _lock.wait_for(lambda: bool(_queue), _IDLE):
                _reaper = None
                return
            path = _queue.pop()
        shutil.rmtree(path, ignore_errors=True)
        with _lock:
            _pending.discard(path)
            _lock.notify_all()


@atexit.register
def _remove_pending() -> None:
    with _lock:
        left = list(_pending)
    for path in left:  # the reaper may be on one of them too: removing twice is harmless
        shutil.rmtree(path, ignore_errors=True)
