"""The engine's watch over idle guests: CPU used while no request or block runs.

A block may leave a thread (or a process) running when it returns; in a persistent
session the guest then burns CPU for as long as the session lives, beyond every
``cpu_seconds``. One daemon thread of the engine samples the CPU time of every idle
guest (its whole process tree, `tree_cpu_seconds`) and kills the guest whose idle CPU,
summed over its life, passes its limit. A thread, not a trio task: a persistent session
outlives the trio loop of each completion, and between completions there is none.

Invariants:
    - Only idle time counts: a guest marked busy (`GuestProcess.busy`) is not charged,
      and the sample after a busy spell starts afresh.
    - The watch kills with ``SIGKILL`` (through the guest's pidfd, and its launcher's
      process group) under the guest's lock, so it never races `GuestProcess.kill` for
      the pidfd; the guest is marked (``killed_idle``) and its environment tells the model
      on its next block.
    - The thread exists only while some guest is watched.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol

__all__ = ["Watched", "tree_cpu_seconds", "unwatch", "watch"]

POLL = 0.25  # seconds between samples

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Watched(Protocol):
    """What the watch needs of a guest (`process.GuestProcess`)."""

    def idle_sample(self) -> bool:
        """Charge the CPU used since the last sample if idle; True when the guest was
        killed for it (and should be watched no more)."""
        ...


_lock = threading.Lock()
_guests: set[Watched] = set()
_thread: threading.Thread | None = None


def watch(guest: Watched) -> None:
    """Watch ``guest`` until `unwatch` (or until it is killed for idle CPU)."""
    global _thread
    with _lock:
        _guests.add(guest)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="rlm-graph-guest-watch", daemon=True)
            _thread.start()


def unwatch(guest: Watched) -> None:
    with _lock:
        _guests.discard(guest)


def _run() -> None:
    global _thread
    waker = threading.Event()
    while True:
        with _lock:
            if not _guests:
                _thread = None
                return
            guests = list(_guests)
        for guest in guests:
            if guest.idle_sample():
                unwatch(guest)
        waker.wait(POLL)


def tree_cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of ``pid`` and of every live process below it, plus
    what its reaped children used (``None`` if ``pid`` is gone). In a PID namespace
    whose first process is ``pid``, orphans are reparented to it: the sum covers every
    process of the namespace."""
    total = 0.0
    todo = [pid]
    seen: set[int] = set()
    first = True
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        used = _stat_cpu(current)
        if used is None:
            if first:
                return None
            continue
        first = False
        total += used
        todo.extend(_children(current))
    return total


def _stat_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid`` and of the children it reaped (each reaped child's own
    reaped children included: the kernel adds them up the tree)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3): utime, stime, cutime, cstime are fields 14-17.
    return sum(int(field) for field in fields[11:15]) / _TICKS


def _children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (a thread's ``children`` file lists only the
    ones it forked)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
        except (OSError, ValueError):
            continue
    return found
