"""What ends an engine's guests when the engine is killed (``SIGKILL``, the OOM killer)
and cannot end them itself.

One watcher process per engine process, started with its first guest
(``python -I -S -c WATCHER``), in a session of its own, so that a signal to the engine's
process group or terminal does not reach it. The engine notes on a pipe each guest it
starts (``+ <launcher pid> <guest pid>``) and each it has killed (``- <launcher pid>``);
the watcher holds a pidfd of each guest and of its launcher. At the end of its input,
which comes when the engine is gone, however it ended, it sends ``SIGKILL`` to each guest
still noted, its launcher and the launcher's process group, then exits.

Invariants:
    - Nothing the model's code does inside its guest keeps it alive past its engine:
      not replacing ``os._exit``, not holding its own end of its input open, not clearing
      its parent-death signal. The watcher is out of the guest's reach, as the engine
      is: the engine's user, outside the guest's namespaces.
    - Only the engine holds the write end of the watcher's pipe (close-on-exec: a guest
      or any other program the engine starts does not inherit it; a child that forks the
      engine closes its copy and starts a watcher of its own when it starts a guest).
    - A pidfd names the process it was opened for, never a recycled pid; the process
      group is signalled only while its leader, the launcher, is still running (then
      the group's number is still its own).
    - No note waits: the pipe does not block the engine; a note the pipe has no room for
      (the watcher stopped) is logged and dropped.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading

__all__ = ["WATCHER", "close", "forget", "watch"]

logger = logging.getLogger("rlm_graph.subprocess")

WATCHER = """
import os, select, signal, sys
def pidfd(pid):
    try:
        return os.pidfd_open(pid) if pid else None
    except (OSError, AttributeError):
        return None
held = {}
for line in sys.stdin.buffer:
    parts = line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        continue
    launcher = int(parts[1])
    for fd in held.pop(launcher, ()):
        if fd is not None:
            os.close(fd)
    if parts[0] == b"+" and len(parts) == 3 and parts[2].isdigit():
        held[launcher] = (pidfd(launcher), pidfd(int(parts[2])))
for launcher, (leader, guest) in held.items():
    try:
        if leader is not None:
            running = select.poll()
            running.register(leader, select.POLLIN)
            if not running.poll(0):
                os.killpg(launcher, signal.SIGKILL)
    except (OSError, ValueError):
        pass
    for fd in (leader, guest):
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
"""
"""The watcher's program. A pidfd turns readable when its process has exited: until
then the launcher, a session leader, still owns its group's number (`poll`, not
`select`: a descriptor past 1,024)."""

_lock = threading.Lock()
_watcher: subprocess.Popen[bytes] | None = None
_notes: int | None = None  # the write end of the watcher's pipe
_unwatched: str | None = None  # why no watcher can run here (said once)


def watch(launcher: int, guest: int | None = None) -> None:
    """Note a guest the engine started (its launcher's pid, and the guest's own behind a
    launcher once known): the watcher kills it if the engine dies first."""
    _note(f"+ {launcher} {guest or 0}\n")


def forget(launcher: int) -> None:
    """Note that the engine has killed the guest of ``launcher`` (and reaped it)."""
    _note(f"- {launcher}\n")


def close(wait: float = 1.0) -> None:
    """At the engine's exit, once its guests are killed: end the watcher (its pipe
    closed, it has nothing left to kill) and reap it, waiting up to ``wait`` seconds."""
    with _lock:
        watcher = _watcher
        _stop()
    if watcher is not None:
        try:
            watcher.wait(wait)
        except subprocess.TimeoutExpired:
            pass


def _note(line: str) -> None:
    """Never raises: a guest's start must not fail on this bookkeeping."""
    with _lock:
        if line.startswith("-") and _watcher is None:
            return
        try:
            notes = _ensure_watcher()
            if notes is not None:
                os.write(notes, line.encode())
        except BlockingIOError:
            logger.warning("the guests' watcher is not reading its notes: %s dropped", line)
        except Exception:  # the watcher died: the next note starts another
            _stop()


def _cannot_watch() -> str | None:
    """Why a watcher cannot hold guests here (no pidfds: macOS, Linux before 5.3, a
    seccomp profile that refuses them), or None."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return "this platform has no pidfd_open"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:
        return f"pidfd_open is refused here ({exc.strerror})"
    return None


def _ensure_watcher() -> int | None:
    global _watcher, _notes, _unwatched
    if _watcher is not None and _watcher.poll() is None:
        return _notes
    _stop()
    if _unwatched is None and (_unwatched := _cannot_watch()) is not None:
        logger.warning(
            "no watcher for the subprocess guests: %s; a guest whose code keeps it from "
            "exiting outlives an engine killed by SIGKILL",
            _unwatched,
        )
    if _unwatched is not None:
        return None
    read_end, write_end = os.pipe()  # not inherited: no guest holds the write end
    try:
        _watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WATCHER],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(write_end)
        logger.warning("no watcher for the guests (%s): an engine killed leaves them", exc)
        return None
    finally:
        os.close(read_end)
    os.set_blocking(write_end, False)
    _notes = write_end
    return _notes


def _stop() -> None:
    """Let go of the watcher (dead, or inherited across a fork): its pipe closed, it
    kills what it still holds and exits."""
    global _watcher, _notes
    if _notes is not None:
        os.close(_notes)
    _watcher, _notes = None, None


def _after_fork() -> None:
    # The child's guests are its own; the parent's watcher must end with the parent.
    global _lock
    _lock = threading.Lock()
    _stop()


os.register_at_fork(after_in_child=_after_fork)
