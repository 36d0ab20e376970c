"""Scratch folders of REPL environments: named after their owner, removed before a
completion returns, and never left behind for long.

A folder holds what a run was given (its contexts) and what its code wrote. Every
environment plugin (the first-party ``local`` and ``subprocess`` ones, and a stranger's)
makes its folders here and removes them here, so that:

Invariants:
    - A folder is named ``rlm-graph-<pid>-<kind>-<random>`` in the system's temporary
      folder, ``<pid>`` the engine process that made it (`make_folder`).
    - `remove` takes a folder away at once, also where a guest took its own rights away
      from parts of it; the environment calls it (off the trio thread for a non-empty
      folder) before its ``aclose`` returns, so a completion's folder is gone by the
      time ``completion()`` returns.
    - A folder still present when the interpreter exits normally (a session never
      closed, a stream abandoned) is removed by an ``atexit`` handler, after the
      handlers registered with `on_exit` (the ``subprocess`` plugin kills its guests
      there first).
    - A folder whose owner process is gone (killed by ``SIGKILL``, a crashed Ray worker)
      is *stale*: the first `make_folder` of every process removes up to 16 stale
      folders of its user (`sweep_stale`: one listing of the temporary folder). A
      zombie (exited, not yet reaped by its parent), or a process still tearing itself
      down, is gone. Engines that share a
      temporary folder are assumed to share a PID namespace, as on one machine.
    - An environment done with an *empty* folder may `give_back` it instead: the next
      `take_folder` of the same kind in this process reuses it (a batch of completions
      makes and removes no folder per completion). Only a folder that holds nothing, is
      still this user's and still mode 0700 is kept; a process forked from this one
      never reuses its parent's; kept folders are live (removed at exit) and at most
      `POOL_SIZE` per kind.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "POOL_SIZE",
    "clear_kept",
    "give_back",
    "make_folder",
    "on_exit",
    "remove",
    "sweep_stale",
    "take_folder",
]

_NAME = re.compile(r"rlm-graph-(\d+)-[a-z0-9_-]+$")  # mkdtemp's random part has "_" too

_lock = threading.Lock()
_live: set[str] = set()
_exit_hooks: list[Callable[[], None]] = []
_swept = False
_SWEEP_LIMIT = 16  # stale folders one start removes, at most (the next start goes on)
_pool: dict[str, list[str]] = {}  # kind -> empty folders given back, for reuse
_pool_pid = os.getpid()  # whose pool it is (a forked child starts with none)

POOL_SIZE = 32
"""Empty folders of one kind a process keeps for reuse (`give_back`), at most."""


def make_folder(kind: str) -> str:
    """A new folder ``rlm-graph-<this pid>-<kind>-...`` (mode 0700), known to be live
    until `remove`. The first call of a process also starts a sweep of stale folders."""
    global _swept
    path = tempfile.mkdtemp(prefix=f"rlm-graph-{os.getpid()}-{kind}-")
    with _lock:
        _live.add(path)
        sweep, _swept = not _swept, True
    if sweep:
        sweep_stale(limit=_SWEEP_LIMIT)
    return path


def take_folder(kind: str) -> str:
    """An empty folder of ``kind`` given back earlier in this process, else a new one
    (`make_folder`)."""
    global _pool, _pool_pid
    with _lock:
        if _pool_pid != os.getpid():  # forked: the parent's folders are the parent's
            _pool, _pool_pid = {}, os.getpid()
        kept = _pool.get(kind)
        if kept:
            return kept.pop()
    return make_folder(kind)


def give_back(kind: str, path: str) -> bool:
    """Keep ``path`` for the next `take_folder` of ``kind`` if it is empty, this user's
    and mode 0700; False (nothing done) otherwise: then `remove` it. A cheap call (a
    ``stat`` and a directory read, no change on disk) for the trio thread."""
    try:
        info = os.stat(path, follow_symlinks=False)
        if (
            not stat.S_ISDIR(info.st_mode)
            or stat.S_IMODE(info.st_mode) != 0o700
            or info.st_uid != os.geteuid()
        ):
            return False
        with os.scandir(path) as entries:
            if next(entries, None) is not None:
                return False
    except OSError:
        return False
    with _lock:
        if _pool_pid == os.getpid():
            kept = _pool.setdefault(kind, [])
            if len(kept) < POOL_SIZE:
                kept.append(path)
                return True
    return remove_if_empty(path)


def clear_kept() -> None:
    """Remove the empty folders kept for reuse (`give_back`) now: call it before this
    process is stopped from outside, where its ``atexit`` handlers will not run."""
    with _lock:
        kept = [path for paths in _pool.values() for path in paths]
        _pool.clear()
    for path in kept:
        if not remove_if_empty(path):
            remove(path)


def remove(path: str) -> None:
    """Remove the folder ``path`` and everything in it, now (a blocking call: run it off
    the trio thread unless the folder is empty)."""
    _remove_tree(path)
    with _lock:
        _live.discard(path)


def remove_if_empty(path: str) -> bool:
    """Remove ``path`` if it is an empty folder (one cheap system call); False if it
    holds anything (then `remove` it off the trio thread)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    with _lock:
        _live.discard(path)
    return True


def on_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit before the live folders are removed."""
    with _lock:
        _exit_hooks.append(hook)


def sweep_stale(folder: str | None = None, limit: int | None = None) -> list[str]:
    """Remove the folders in ``folder`` (default: the system's temporary folder) that
    this user's engines made and whose owner process is gone; returns their paths.

    One listing of the folder, one ``kill(pid, 0)`` (and a read of its ``/proc`` state)
    per candidate: bounded work.
    """
    root = folder or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.geteuid():
                continue
        except OSError:
            continue
        if not _alive(int(match.group(1))):
            _remove_tree(entry.path)
            removed.append(entry.path)
            if limit is not None and len(removed) >= limit:
                break
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: alive, unless a zombie
        pass
    return not _exited(pid)


_PF_EXITING = 0x4  # the kernel's flag of a process on its way out (include/linux/sched.h)


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited though ``kill(pid, 0)`` still succeeds: a zombie its
    parent has not reaped yet, or a process still tearing itself down (a Ray worker
    just killed, whose death its driver learns before the kernel is done with it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        state, flags = fields[0], int(fields[6])
    except (OSError, IndexError, ValueError):  # no /proc (not Linux): kill's word stands
        return False
    return state in (b"Z", b"X") or bool(flags & _PF_EXITING)


def _remove_tree(path: str) -> None:
    """``rmtree``, also where a guest took its own rights away from a folder in it."""

    def retry(function: Any, name: str, _: Any) -> None:
        for folder in (os.path.dirname(name), name):
            _open_up(folder)
        try:
            if os.path.isdir(name) and not os.path.islink(name):
                shutil.rmtree(name, ignore_errors=True)
            else:
                function(name)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=retry)


def _open_up(folder: str) -> None:
    """Give this user back the rights to ``folder``, if it is a folder: never through a
    link (a guest's link to any file of the engine's user would have it made 0700).

    Opened as a path only (``O_PATH``: no right on the folder needed, as mode 000 leaves
    none), without following a link, then changed through that descriptor."""
    path_only = getattr(os, "O_PATH", 0)  # Linux; elsewhere a folder it may read
    flags = (path_only or os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW
    try:
        fd = os.open(folder, flags)
    except OSError:  # gone (or, without O_PATH, a link or a folder it may not read)
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):  # a link, or a file
            pass
        elif path_only:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        else:
            os.fchmod(fd, 0o700)
    except OSError:
        pass
    finally:
        os.close(fd)


def _after_fork() -> None:
    # A forked child's exit must not remove its parent's folders (a session's REPL).
    global _lock
    _lock = threading.Lock()
    _live.clear()


os.register_at_fork(after_in_child=_after_fork)


@atexit.register
def _remove_live() -> None:
    with _lock:
        hooks = list(_exit_hooks)
    for hook in hooks:
        hook()
    with _lock:
        left = list(_live)
    for path in left:
        remove(path)
