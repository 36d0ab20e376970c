"""What ``rlm-graph mcp`` may read: files inside its ``--read-path`` roots, nothing else.

A tool call names the paths, and whoever writes the agent's prompt may be hostile: it can
ask for ``/etc/shadow``, for ``../../`` out of a root, or for a symlink inside a root that
points out of it.

Invariants:
    - A path is resolved (every symlink and ``..``, `os.path.realpath`) before it is
      checked, and it is inside a root when its resolved form is the root's resolved form
      or below it, compared by whole components (``/data-2`` is not inside ``/data``). A
      relative path is taken from the first folder among the roots, never from the server's working folder.
    - ``/proc``, ``/sys`` and ``/dev`` are never read, whatever the roots (even ``/``):
      ``/proc/self/environ`` would hand the server's API keys to the model.
    - A file is opened without following a link (``O_NOFOLLOW``, non-blocking), must be a
      regular file (no FIFO, device or socket, which could block or never end), and the
      file the descriptor holds (``/proc/self/fd``, where ``/proc`` is mounted) is checked
      again against the roots, so a link swapped in between the check and the open is
      refused as well.
    - A named path that is outside every root, missing or not a file or folder fails the
      whole call with one message naming it, before anything is read. A file met while
      walking a named folder that is a link out of the roots, binary or unreadable is
      skipped and listed (a repository may hold such links innocently); folders of
      version control, caches and virtual environments are not walked.
    - Reading stops at ``max_bytes`` in total and ``max_files`` files: past either the
      call fails and says which flag raises it. Nothing is cut silently. A walk looks at
      no more than ``ENTRIES_PER_FILE * max_files`` files and folders, the skipped ones
      included, so a folder of countless binary files fails the call the same way.
    - A read given a ``stop`` event checks it before each entry it looks at, and ends
      (`ReadStopped`) soon after it is set: the thread of a cancelled call does not go
      on walking after the call is gone.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError, RLMGraphError

if TYPE_CHECKING:
    import threading

__all__ = [
    "ENTRIES_PER_FILE",
    "NEVER_READ",
    "SKIPPED_FOLDERS",
    "Documents",
    "ReadRoots",
    "ReadStopped",
]

SKIPPED_FOLDERS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        "node_modules",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
    }
)
"""Folders a walk does not enter (named explicitly, their files are still read)."""

NEVER_READ = ("/proc", "/sys", "/dev")
"""Pseudo-filesystems refused inside any root: their files are the live state of the
machine and of this process (its environment, its memory), not documents."""

ENTRIES_PER_FILE = 10
"""How many files and folders a walk may look at per file it may read (``max_files``):
the binary, unreadable and linked ones it skips cost a look each."""

_BINARY_PROBE = 8192  # bytes looked at for a NUL: the sign of a binary file
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass
class Documents:
    """What a call read.

    Attributes:
        files: the text of each file read, by its resolved path, in the order read.
        skipped: ``"path: why"`` for each file of a walked folder that was not read.
        size: the bytes read.
        looked_at: the files and folders of walked folders looked at, skipped or not.
    """

    files: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    size: int = 0
    looked_at: int = 0


class ReadStopped(RLMGraphError):
    """A read whose ``stop`` event was set (its call was cancelled): what it had read is
    dropped."""


class ReadRoots:
    """The folders (or files) a server may read, resolved once when it starts.

    Args:
        roots: the ``--read-path`` values.
        max_bytes: the most bytes one call may read in total.
        max_files: the most files one call may read.

    Raises:
        ConfigError: no root, or a root that does not exist.
    """

    def __init__(self, roots: Sequence[str], *, max_bytes: int, max_files: int) -> None:
        if not roots:
            raise ConfigError(
                "give at least one --read-path: the server reads nothing outside them"
            )
        resolved = []
        for root in roots:
            path = os.path.realpath(os.path.expanduser(root))
            if not os.path.exists(path):
                raise ConfigError(f"--read-path {root!r} does not exist")
            resolved.append(path)
        self.roots = list(dict.fromkeys(resolved))
        # Relative paths are taken from here, never from the server's working folder.
        self.base = next(
            (r for r in self.roots if os.path.isdir(r)), os.path.dirname(self.roots[0])
        )
        if max_bytes < 1 or max_files < 1:
            raise ConfigError("--max-read-bytes and --max-read-files must be at least 1")
        self.max_bytes = max_bytes
        self.max_files = max_files

    def contains(self, resolved: str) -> bool:
        """Whether a resolved path is one of the roots or below one (and not in one of the
        `NEVER_READ` folders)."""
        if any(_below(resolved, never) for never in NEVER_READ):
            return False
        return any(_below(resolved, root) for root in self.roots)

    def resolve(self, path: str) -> str:
        """The resolved form of a path a caller named, checked against the roots.

        Raises:
            ConfigError: the path is outside every root, or does not exist.
        """
        if not isinstance(path, str) or not path or "\0" in path:
            raise ConfigError(f"not a path: {path!r}")
        resolved = os.path.realpath(os.path.join(self.base, path))
        if any(_below(resolved, never) for never in NEVER_READ):
            raise ConfigError(
                f"refused {path!r}: {', '.join(NEVER_READ)} are never read (they hold the "
                "live state of the machine and of this server, its keys among it)"
            )
        if not self.contains(resolved):
            raise ConfigError(
                f"refused {path!r}: it is outside the folders this server may read "
                f"({', '.join(self.roots)}); name a file or folder inside them"
            )
        if not os.path.exists(resolved):
            raise ConfigError(f"{path!r} does not exist (inside the read roots)")
        return resolved

    def read(
        self,
        paths: Sequence[str],
        room: int | None = None,
        stop: threading.Event | None = None,
    ) -> Documents:
        """Read the files and folders ``paths`` name (see the module's invariants), at
        most ``room`` bytes (default ``max_bytes``). Called in a worker thread by the MCP
        tool, which sets ``stop`` when its call is cancelled.

        Raises:
            ConfigError: a named path that is refused or missing, a named file that
                cannot be read, or more than ``max_bytes``/``max_files`` in all (or a walk
                past its ``ENTRIES_PER_FILE * max_files`` entries).
            ReadStopped: ``stop`` was set before the read was done.
        """
        if not paths:
            raise ConfigError("paths is empty: name at least one file or folder")
        named = [(path, self.resolve(path)) for path in paths]  # every check before any read
        docs = Documents()
        spent = 0 if room is None else self.max_bytes - room  # the question's, say
        docs.size = spent
        for path, resolved in named:
            if os.path.isdir(resolved):
                try:
                    for found in self._walk(resolved, docs, path, stop):
                        self._read_file(found, docs, named=False)
                except RecursionError:  # os.walk recurses, one frame per level
                    raise ConfigError(
                        f"{path!r} nests folders too deep to walk; name a folder further down"
                    ) from None
            else:
                _check(stop)
                self._read_file(resolved, docs, named=True, given=path)
        docs.size -= spent
        return docs

    def _walk(
        self, folder: str, docs: Documents, given: str, stop: threading.Event | None
    ) -> Iterator[str]:
        def unreadable(error: OSError) -> None:
            docs.skipped.append(f"{shown(str(error.filename))}: {error.strerror or error}")

        for parent, dirs, files in os.walk(folder, onerror=unreadable, followlinks=False):
            for d in dirs:  # a linked folder is not walked into (its target may be anywhere)
                self._look(docs, given, stop)
                path = os.path.join(parent, d)
                if os.path.islink(path):
                    out = not self.contains(os.path.realpath(path))
                    why = "a link out of the read roots" if out else "a linked folder, not followed"
                    docs.skipped.append(f"{shown(path)}: {why}")
            dirs[:] = sorted(
                d
                for d in dirs
                if d not in SKIPPED_FOLDERS
                and not os.path.islink(os.path.join(parent, d))
                and self.contains(os.path.join(parent, d))
            )
            for name in sorted(files):
                self._look(docs, given, stop)
                path = os.path.join(parent, name)
                resolved = os.path.realpath(path)
                if not self.contains(resolved):
                    docs.skipped.append(f"{shown(path)}: a link out of the read roots")
                elif shown(resolved) not in docs.files:
                    yield resolved

    def _look(self, docs: Documents, given: str, stop: threading.Event | None) -> None:
        """Count one entry of a walk, first checking that the read should go on."""
        _check(stop)
        docs.looked_at += 1
        most = ENTRIES_PER_FILE * self.max_files
        if docs.looked_at > most:
            raise ConfigError(
                f"{given!r} holds more than {most:,} files and folders (the binary and "
                f"skipped ones count too, {ENTRIES_PER_FILE} per file of --max-read-files); "
                "name a folder further down, or start the server with a larger "
                "--max-read-files"
            )

    def _read_file(self, path: str, docs: Documents, *, named: bool, given: str = "") -> None:
        key = shown(path)  # a name that is not UTF-8 is kept, its odd bytes escaped
        if key in docs.files:
            return
        try:
            data = self._read_bytes(path, self.max_bytes - docs.size)
        except OSError as exc:
            if named:
                raise ConfigError(f"cannot read {given or key}: {exc.strerror or exc}") from None
            docs.skipped.append(f"{key}: {exc.strerror or exc}")
            return
        if data is None:  # its first bytes say binary: not read further
            if named:
                raise ConfigError(f"{given or key} is a binary file, not text")
            docs.skipped.append(f"{key}: binary")
            return
        if len(docs.files) >= self.max_files:  # counted once known text: skipped files are not
            raise ConfigError(
                f"more than {self.max_files:,} files; name fewer, or start the server with a "
                "larger --max-read-files"
            )
        docs.size += len(data)
        docs.files[key] = data.decode("utf-8", errors="replace")

    def _read_bytes(self, path: str, room: int) -> bytes | None:
        """The file's bytes, or None for a binary one (known from its first bytes, before
        the rest is read or counted against ``room``)."""
        fd = os.open(path, _OPEN_FLAGS)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(0, "not a regular file")
            held = f"/proc/self/fd/{fd}"
            if os.path.exists(held) and not self.contains(os.path.realpath(held)):
                raise OSError(0, "it moved out of the read roots while being opened")
            head = os.read(fd, _BINARY_PROBE)
            if b"\0" in head:
                return None
            if info.st_size > room or len(head) > room:
                raise ConfigError(self._too_large())
            chunks, size = [head], len(head)
            while chunk := os.read(fd, min(1 << 20, room + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > room:  # it grew since fstat
                    raise ConfigError(self._too_large())
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _too_large(self) -> str:
        return (
            f"the files come to more than {self.max_bytes:,} bytes; name fewer, or start the "
            "server with a larger --max-read-bytes"
        )


def shown(path: str) -> str:
    """``path`` as text that can always be encoded: a name whose bytes are not UTF-8
    (kept by Python as lone surrogates) gets them as ``\\xNN`` escapes, so it can go
    into a JSON answer and be printed by the model's code."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _check(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise ReadStopped("the read was stopped: its call was cancelled")


def _below(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it, by whole components."""
    return path == folder or os.path.commonpath([path, folder]) == folder
