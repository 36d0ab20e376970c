"""Files that hold a run's content (prompts, documents, replies): readable by their owner
only.

Every file rlm-graph writes with run content (trace files, reports, graph exports,
batch and evaluation results; the journal opens its own the same way) is created with
mode 0600. A file that already exists keeps the mode its owner gave it: that is how a
user says otherwise (``touch out.jsonl && chmod 644 out.jsonl``, or a group-readable
folder's files made beforehand).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "PRIVATE",
    "UnreadableFile",
    "destination_problem",
    "has_surrogate",
    "hold_alone",
    "open_private",
    "read_once",
    "read_results",
    "regular_or_missing",
    "same_file",
    "utf8_text",
    "write_private",
]

PRIVATE = 0o600
_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_text(text: str) -> str:
    """``text`` with each lone surrogate (half a character, with no UTF-8 form: a reply's
    JSON ``\\ud83d``, bytes decoded with ``surrogateescape``) as U+FFFD, the replacement
    character, as a UTF-8 decoder gives it: what a results line is written as, rather
    than failing the write (and every rerun at the same row)."""
    return _SURROGATE.sub("\ufffd", text)


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (an id with one cannot be written as is)."""
    return _SURROGATE.search(text) is not None


def same_file(one: str | os.PathLike[str], other: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (a link, another spelling, a hard link); a path
    that does not exist yet names none."""
    try:
        return Path(one).resolve() == Path(other).resolve() or os.path.samefile(one, other)
    except OSError:
        return False


def open_private(path: str | os.PathLike[str], mode: str = "w") -> IO[str]:
    """``open(path, mode, encoding="utf-8")`` (``"w"`` or ``"a"``), a new file created 0600."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, PRIVATE), mode, encoding="utf-8")


def write_private(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` (created 0600) and return the path; a lone surrogate in
    it is written as U+FFFD (`utf8_text`).

    Whole or not at all: the text goes to a file beside it that then takes its name
    (and the mode and owner of the file that was there), so a write that fails (a full
    disk, a file-size limit, a kill) leaves that file as it was, never half a file. A
    path that is not a regular file (``/dev/stdout``, a FIFO), a file with other names
    (hard links), one whose owner cannot be kept, or one in a folder this user may not
    write, is written in place.
    """
    target = Path(path)
    real = Path(os.path.realpath(target))  # a link's file is replaced, not the link
    try:
        was: os.stat_result | None = real.stat()
    except OSError:
        was = None
    if _IN_PLACE.match(os.fspath(target)) or (
        was is not None and (not stat.S_ISREG(was.st_mode) or was.st_nlink > 1)
    ):  # /dev/stdout (a file it is redirected to), a device, a file with other names
        return _write_in_place(target, text)
    try:
        handle, temporary = tempfile.mkstemp(
            dir=real.parent, prefix=f".{real.name}.", suffix=".tmp"
        )
    except OSError:  # a folder it may not write, beside a file it may
        return _write_in_place(target, text)
    if was is not None and not _keeps(handle, was):  # its owner cannot be kept
        os.close(handle)
        os.unlink(temporary)
        return _write_in_place(target, text)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(utf8_text(text))
        os.replace(temporary, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return target


# Names of a stream, whatever file it is redirected to (a file under /dev/shm is a file).
_IN_PLACE = re.compile(r"/dev/(?:stdout|stderr|tty|fd/)|/proc/[^/]++/fd/")


def _keeps(handle: int, was: os.stat_result) -> bool:
    """Give the new file ``handle`` the mode and owner of the one it replaces; False when
    the owner cannot be given (another user's file, written by one who is not root)."""
    try:
        os.fchmod(handle, stat.S_IMODE(was.st_mode))
        if was.st_uid != os.geteuid() or was.st_gid != os.getegid():
            os.fchown(handle, was.st_uid, was.st_gid)
    except OSError:
        return False
    return True


def _write_in_place(path: Path, text: str) -> Path:
    with open_private(path) as handle:
        handle.write(utf8_text(text))
    return path


def destination_problem(path: str | os.PathLike[str], *, folder: bool = False) -> str | None:
    """What stops ``path`` from being written (a file, or with ``folder`` a folder whose
    missing parents are made), said before a run pays for what would go there; None
    when nothing does."""
    target = Path(path)
    if target.is_dir() != folder and target.exists():
        return f"{target} is {'not a folder' if folder else 'a folder'}; give a {'folder' if folder else 'file'}'s path"
    parent = target if folder else target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a folder, so {target} cannot be made"
    if not os.access(parent, os.W_OK | os.X_OK) and not (
        target.exists() and os.access(target, os.W_OK)
    ):
        return f"{parent} is not writable"
    return None


def regular_or_missing(path: Path, what: str) -> bool:
    """Whether ``path`` exists, refusing anything but a regular file (a FIFO would hang
    whoever opens it, a device never end): what is checked before a results file is
    opened.

    Raises:
        ValueError: it is not a regular file, or cannot be looked at.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ValueError(f"cannot read {what}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(
            f"{what} is not a regular file; results are appended to a file and read again "
            "on resume: give a file's path"
        )
    return True


class UnreadableFile(ValueError):
    """A file `read_once` refuses; the message names it, why, and what to give."""


def read_once(path: str | os.PathLike[str], *, wanted: str, stop: bytes = b"") -> bytes | None:
    """The bytes of ``path``, a regular file or a pipe, read once (so that a pipe works:
    ``<(zcat run.otlp.jsonl.gz)``, ``/dev/stdin``). A pipe is opened without waiting for
    a writer (a FIFO nobody writes to would hold the caller for ever), then read to its
    end; a device (``/dev/zero``, read for ever) or a folder is refused.

    Args:
        wanted: what to give instead, the end of the refusal (``give a trace file``).
        stop: a regular file beginning with these bytes is not read: None (a journal,
            which SQLite opens by its path).

    Raises:
        UnreadableFile: it cannot be read, is a folder or a device, or is a pipe nothing
            was written to (the message says which, and ``wanted``).
    """
    shown = os.fspath(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise UnreadableFile(f"{shown} is a folder; {wanted}")
        pipe = stat.S_ISFIFO(info.st_mode)
        if not (pipe or stat.S_ISREG(info.st_mode)):
            raise UnreadableFile(f"{shown} is neither a file nor a pipe; {wanted}")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if pipe else 0))
        if pipe:
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as handle:
            head = handle.read(len(stop))
            if stop and head == stop and not pipe:
                return None
            data = head + handle.read()
    except OSError as exc:
        raise UnreadableFile(f"cannot read {shown}: {exc.strerror or exc}") from None
    if pipe and not data:
        raise UnreadableFile(
            f"nothing was written to {shown}, a pipe (a FIFO with no writer yet is read as "
            "empty); start the program that writes it first, or give a file"
        )
    return data


def read_results(
    path: Path, what: str, starts: bytes, keys: frozenset[str]
) -> tuple[Iterator[tuple[int, bytes]], int, int]:
    """A results file's complete lines that are not blank, each with its number, where
    they end and its size, before appending to it (a missing file is empty): what a
    resumed run reads first. The lines are read one
    at a time as they are iterated, and only the end of the file is read to find them:
    the most held in memory is one line (`_WHOLE_TAIL` for a last line without a newline).

    Args:
        path: the file.
        what: how the user named it, for errors (``"--output 'r.jsonl'"``).
        starts: how a line of such a file starts (``b'{"id"'``): a last line cut off by
            a killed run is cut off again only if it starts so.
        keys: what every line of such a file has: a last line that is whole JSON (only
            its newline missing) is cut off only if it has them; any other is the last
            line of another kind of file.

    Raises:
        ValueError: it is not a regular file (a FIFO or a device would hang or never end),
            cannot be read, or ends with something else than a cut-off result line (it
            is not a results file: nothing of it may be cut). Iterating the lines raises
            it too, for a file that cannot be read.
    """
    if not regular_or_missing(path, what):
        return iter(()), 0, 0
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            end = _after_last_newline(handle, size)  # what follows was cut off by a kill
            handle.seek(end)
            tail = _tail(handle, starts, size - end)
    except OSError as exc:
        raise ValueError(f"cannot read {what}: {exc.strerror}") from None
    if tail and not (
        (tail.startswith(starts) or starts.startswith(tail)) and _cut_or_result(tail, keys)
    ):
        raise ValueError(
            f"{what} is not a results file (its last line is not a result); give a new "
            "path, or the results file of an earlier run to resume it"
        )
    return _lines_before(path, what, end), end, size


_WHOLE_TAIL = 64 * 2**20
"""The longest last line without a newline read whole to tell a result cut by a kill from
one whose newline alone is missing; a longer one is taken as cut (its item runs again)."""


def _tail(handle: IO[bytes], starts: bytes, length: int) -> bytes:
    """The stripped bytes after the last newline: its first bytes only when they do not
    start as a result's (a file of another kind is refused without reading it), a mark
    of a cut line when it is too long to read whole."""
    head = handle.read(min(length, 64))
    lead = head.strip()
    if len(lead) >= len(starts) and not lead.startswith(starts):
        return lead
    if length > _WHOLE_TAIL:
        return starts  # a result's start: cut by a kill
    return (head + handle.read()).strip()


def _after_last_newline(handle: IO[bytes], size: int) -> int:
    """Where the bytes after the last newline of the open file start (0: none)."""
    position = size
    while position > 0:
        step = min(position, 1 << 16)
        position -= step
        handle.seek(position)
        found = handle.read(step).rfind(b"\n")
        if found >= 0:
            return position + found + 1
    return 0


def _lines_before(path: Path, what: str, end: int) -> Iterator[tuple[int, bytes]]:
    """The lines of ``path`` in its first ``end`` bytes that are not blank, with their
    numbers, one at a time."""
    try:
        with open(path, "rb") as handle:
            left, number = end, 0
            while left > 0:  # never a byte past ``end``: the cut line may be huge
                line = handle.readline(left)
                if not line:
                    return
                left, number = left - len(line), number + 1
                if line.strip():
                    yield number, line
    except OSError as exc:
        raise ValueError(f"cannot read {what}: {exc.strerror}") from None


def _cut_or_result(tail: bytes, keys: frozenset[str]) -> bool:
    """Whether a last line with no newline may be cut: it is not whole JSON (a kill cut
    it), or it is a whole result whose newline the kill cut."""
    try:
        value = json.loads(tail)
    except (ValueError, RecursionError):
        return True
    return isinstance(value, dict) and keys <= value.keys()


def hold_alone(handle: IO[str], what: str) -> None:
    """Lock the open file ``handle`` for this process until it is closed (an advisory
    ``flock``): two runs appending to one results file would each run every item.

    Raises:
        ValueError: another process holds it.
    """
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ValueError(
            f"another run is writing {what}; wait for it to end, or give another path"
        ) from None
