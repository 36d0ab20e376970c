"""Per-thread capture of printed output, without swapping ``sys.stdout`` per block.

``sys.stdout`` and ``sys.stderr`` belong to the whole process. Concurrent REPLs that swap
them get each other's prints, and a lock around the swap serialises them (design trap 2).
Instead, a dispatcher stands in for ``sys.stdout``/``sys.stderr`` while blocks run: a
write goes to the buffer the *current thread* registered, or to the stream the dispatcher
wraps when the thread registered none. Each REPL block registers its buffers on its own
worker thread. ``sys.stdin`` gets the same treatment: a block reads an empty stream, so
model code that reads stdin gets end-of-file instead of waiting for a terminal.

Invariants:
    - The dispatchers are reference-counted by the blocks capturing at the moment: the
      first block to start installs them, the last to end removes them, so once no block
      runs (after the last completion of the process, say) ``sys.stdout``,
      ``sys.stderr`` and ``sys.stdin`` are the caller's own objects again. Installing
      and removing happen under a short lock, never around a block.
    - A stream the caller put in place while blocks ran is respected: the next block to
      start wraps it (so that its prints are still captured) and the end unwraps it
      again; a stream that is not one of ours is never replaced at the end. (A block
      already running when the caller swaps prints to the caller's new stream: nothing
      can intercept that swap.)
    - Every dispatcher routes by thread, so one that outlived its period (a caller kept
      it and put it back later) still sends a thread without a capture to the stream it
      wraps; the next block to start adopts it and the end removes it.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO, cast

__all__ = ["CappedBuffer", "capture_output"]

_local = threading.local()
_install_lock = threading.Lock()


class CappedBuffer(io.TextIOBase):
    """A text buffer that keeps at most ``cap`` characters and counts the rest.

    A block that prints 10 MB must not hold 10 MB per block in memory; the head is kept
    (the truncation shows the head and a tail of what was kept) and the overflow counted.
    """

    def __init__(self, cap: int) -> None:
        self._parts: list[str] = []
        self._size = 0
        self.cap = cap
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.cap - self._size
        if room >= len(text):
            self._parts.append(text)
            self._size += len(text)
        else:
            if room > 0:
                self._parts.append(text[:room])
                self._size += room
            self.dropped += len(text) - max(room, 0)
        return len(text)

    def getvalue(self) -> str:
        return "".join(self._parts)

    @property
    def written(self) -> int:
        """Characters written so far, kept or not."""
        return self._size + self.dropped


class _Dispatch(io.TextIOBase):
    """Stands in for ``sys.stdout``/``sys.stderr``; routes writes by thread."""

    def __init__(self, name: str, fallback: TextIO) -> None:
        self._name = name
        self.fallback = fallback

    def _target(self) -> TextIO:
        target: TextIO | None = getattr(_local, self._name, None)
        return target if target is not None else self.fallback

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return False if getattr(_local, self._name, None) is not None else self.fallback.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.fallback, "encoding", "utf-8") or "utf-8"

    def fileno(self) -> int:
        return self.fallback.fileno()

    def __getattr__(self, name: str) -> object:
        # What a text stream has and this class does not (``buffer``, ``reconfigure``...):
        # the real stream's for every thread but a capturing one, so that the caller's
        # code sees its own stream and a block cannot reach around its capture.
        if name.startswith("_"):  # not forwarded (and no recursion before __init__)
            raise AttributeError(name)
        return getattr(self._target(), name)


class _StdinDispatch:
    """Stands in for ``sys.stdin``: a REPL thread reads an empty stream (nobody is there
    to type), every other thread the real one."""

    def __init__(self, fallback: TextIO) -> None:
        self.fallback = fallback

    def __getattr__(self, name: str) -> object:
        empty = getattr(_local, "stdin", None)
        return getattr(empty if empty is not None else self.fallback, name)

    def __iter__(self) -> Iterator[str]:
        empty: TextIO | None = getattr(_local, "stdin", None)
        return iter(empty if empty is not None else self.fallback)


_capturing = 0  # blocks inside `capture_output` now, over all threads

# Every dispatcher ever put in place, kept for the life of the process (one per stream
# and real stream: a handful): `print()` on another thread may still be writing to one
# when the last block hands the streams back (CPython 3.11's print holds ``sys.stdout``
# without a reference of its own), and a freed one crashed the interpreter.
_made: dict[tuple[str, int], Any] = {}


def _dispatcher(name: str, fallback: Any) -> Any:
    key = (name, id(fallback))  # the dispatcher keeps its fallback alive: ids stay apart
    if key not in _made:
        _made[key] = _StdinDispatch(fallback) if name == "stdin" else _Dispatch(name, fallback)
    return _made[key]


def _install() -> None:
    """Count one more capturing block; put the dispatchers in place if they are not.

    A dispatcher already there (ours, from an earlier period) is adopted, not wrapped."""
    global _capturing
    with _install_lock:
        _capturing += 1
        if not isinstance(sys.stdout, _Dispatch):
            sys.stdout = _dispatcher("stdout", sys.stdout)
        if not isinstance(sys.stderr, _Dispatch):
            sys.stderr = _dispatcher("stderr", sys.stderr)
        if sys.stdin is not None and not isinstance(sys.stdin, _StdinDispatch):
            sys.stdin = cast(TextIO, _dispatcher("stdin", sys.stdin))


def _uninstall() -> None:
    """Count one capturing block less; the last one hands the streams back."""
    global _capturing
    with _install_lock:
        _capturing -= 1
        if _capturing:
            return
        # Only our own dispatchers are taken away: a stream the caller put in place
        # meanwhile stays where it is.
        while isinstance(sys.stdout, _Dispatch):
            sys.stdout = sys.stdout.fallback
        while isinstance(sys.stderr, _Dispatch):
            sys.stderr = sys.stderr.fallback
        while isinstance(sys.stdin, _StdinDispatch):
            sys.stdin = sys.stdin.fallback


@contextmanager
def capture_output(cap: int) -> Iterator[tuple[CappedBuffer, CappedBuffer]]:
    """Capture what the current thread prints, for the duration of the block.

    The first capture of the process to start installs the dispatchers, the last to end
    removes them (see the module's invariants)."""
    _install()
    out, err = CappedBuffer(cap), CappedBuffer(cap)
    saved = (
        getattr(_local, "stdout", None),
        getattr(_local, "stderr", None),
        getattr(_local, "stdin", None),
    )
    try:
        _local.stdout, _local.stderr, _local.stdin = out, err, io.StringIO("")
        yield out, err
    finally:
        _local.stdout, _local.stderr, _local.stdin = saved
        _uninstall()
