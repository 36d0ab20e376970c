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
    - Below the folder, `remove` reaches nothing by a path: each folder in it is opened
      from the descriptor of the one above, never through a link, and emptied through
      its own descriptor. A guest's process still running (no PID namespace ended it)
      that swaps a folder for a link as it is emptied makes the removal leave things
      behind (logged), never reach what the link names.
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
import errno
import logging
import os
import re
import resource
import stat
import tempfile
import threading
from collections.abc import Callable

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

logger = logging.getLogger("rlm_graph")

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


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW  # (os.open adds O_CLOEXEC)
_PATH_ONLY = getattr(os, "O_PATH", 0)  # Linux; elsewhere a folder closed to us stays
_LISTINGS = 3  # of one folder, at most: something may still be adding to it
_MAX_DEPTH = 256  # folders below the removed one, at most: what is deeper is left, logged
_RELISTINGS = 1_000  # listings again, of all the folders of one removal together, at most


class _Folder:
    """A folder being emptied: its descriptor, its name in the folder above, and whether
    something in it had to be left (then it is left too, never listed again)."""

    __slots__ = ("fd", "left", "listings", "name", "names", "parent")

    def __init__(self, parent: int, name: str, fd: int) -> None:
        self.parent, self.name, self.fd = parent, name, fd
        self.names = _names(fd)
        self.listings = 1
        self.left = False


def _depth_cap() -> int:
    """How deep a removal goes (it holds a descriptor a level): `_MAX_DEPTH`, or an
    eighth of the open files this process may have, so that a guest's tree thousands of
    levels deep never takes the descriptors the rest of the engine needs."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return _MAX_DEPTH
    return _MAX_DEPTH if soft == resource.RLIM_INFINITY else max(8, min(_MAX_DEPTH, soft // 8))


def _remove_tree(path: str) -> None:
    """Remove the folder ``path`` and everything in it, also where a guest took its own
    rights away from parts of it; what cannot be removed is left, and logged.

    Below ``path`` nothing is reached by a path string: each folder is opened relative to
    the descriptor of the folder above it, without following a link, and emptied and
    removed through those descriptors. A process of the guest that outlived it and
    renames a folder and puts a link to another folder in its place (while its contents
    are removed) can only make the removal leave things behind: the folder linked to is
    never reached, never opened up, never emptied.
    """
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        _remove_entry(parent_fd, name)
        os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    except OSError:
        pass
    finally:
        os.close(parent_fd)
    logger.warning("%s could not be removed whole: some of what it holds is left", path)


def _remove_entry(parent_fd: int, name: str) -> None:
    """Remove ``name`` of the folder ``parent_fd``: a file, a link, or a folder and what
    it holds, folder by folder (no recursion, whatever its depth)."""
    top = _open_folder(parent_fd, name)
    if top is None:
        _unlink(parent_fd, name)
        return
    stack: list[_Folder] = []
    _push(stack, parent_fd, name, top)
    cap, relistings = _depth_cap(), [_RELISTINGS]
    try:
        while stack:
            folder = stack[-1]
            if folder.names:
                child = folder.names.pop()
                fd = _open_folder(folder.fd, child) if len(stack) < cap else None
                if fd is not None:
                    _push(stack, folder.fd, child, fd)
                elif not _unlink(folder.fd, child):
                    folder.left = True  # a file it may not remove, or a folder too deep
            elif _removed_or_left(folder, relistings):
                os.close(stack.pop().fd)
                if folder.left and stack:
                    stack[-1].left = True
    finally:
        for folder in stack:
            os.close(folder.fd)


def _push(stack: list[_Folder], parent_fd: int, name: str, fd: int) -> None:
    """Start emptying the opened folder ``fd`` (closed again if it cannot be listed)."""
    try:
        stack.append(_Folder(parent_fd, name, fd))
    except BaseException:
        os.close(fd)
        raise


def _removed_or_left(folder: _Folder, relistings: list[int]) -> bool:
    """Remove the emptied ``folder``: True if it is gone or must be left (``left`` then
    says so when what is left is in it), False if it was filled again since it was
    listed: then it is listed again, at most `_LISTINGS` times and `_RELISTINGS` in all,
    and never one with something left in it (each level would list its whole subtree
    again, three times the level below: 3^depth in all)."""
    try:
        os.rmdir(folder.name, dir_fd=folder.parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        refilled = exc.errno in (errno.ENOTEMPTY, errno.EEXIST)
        if refilled and not folder.left and folder.listings < _LISTINGS and relistings[0] > 0:
            folder.names = _names(folder.fd)
            folder.listings += 1
            relistings[0] -= 1
            return False
        folder.left = folder.left or refilled  # not a folder swapped for another thing
    return True


def _open_folder(parent_fd: int, name: str) -> int | None:
    """A descriptor of the folder ``name`` in ``parent_fd``, opened without following a
    link, and writable by this user if it is this user's; ``None`` if it is not a folder
    (a file, a link, gone). A folder its writer closed (mode 000) is opened up first,
    through a descriptor of its own (``O_PATH``), never by a path."""
    fd: int | None
    try:
        fd = os.open(name, _FOLDER, dir_fd=parent_fd)
    except PermissionError:
        fd = _opened_up(parent_fd, name)
    except OSError:  # not a folder (ENOTDIR, ELOOP for a link), or gone
        return None
    if fd is None:
        return None
    try:
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)  # to remove what it holds (a guest made it 0500)
    except OSError:
        pass
    return fd


def _opened_up(parent_fd: int, name: str) -> int | None:
    """The folder ``name`` of ``parent_fd``, which this user may not read, made 0700 and
    opened (``None`` where that cannot be done: not Linux, another user's folder)."""
    if not _PATH_ONLY:
        return None
    try:
        held = os.open(name, _PATH_ONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError:
        return None
    try:
        # /proc/self/fd/<n> names the folder held, whatever happens to its name since
        os.chmod(f"/proc/self/fd/{held}", 0o700)
        return os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    finally:
        os.close(held)


def _names(fd: int) -> list[str]:
    try:
        with os.scandir(fd) as entries:
            return [entry.name for entry in entries]
    except OSError:
        return []


def _unlink(parent_fd: int, name: str) -> bool:
    """Remove the file or link ``name`` of ``parent_fd``, if it can be; False if it is
    left (a folder too deep or swapped in since, a folder closed again, a file the user
    may not remove)."""
    try:
        os.unlink(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


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
