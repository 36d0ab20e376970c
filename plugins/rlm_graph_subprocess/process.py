"""One guest process, seen from the engine: start it, talk to it, end it.

Invariants:
    - The guest's launcher (``unshare``/``setpriv``, or the guest itself without a
      prefix) leads its own process group (``start_new_session``), and every kill is a
      ``SIGKILL`` of the whole group and of the guest itself, through a pidfd (so a
      recycled pid is never hit): whatever the model's code spawned goes with it, and in
      a PID namespace the kernel ends what left the group when the guest (its PID 1) dies.
    - A message from the guest is at most ``max_message`` bytes: past it, before any more
      is buffered, `receive` raises `MessageTooLarge` (the engine's memory is bounded
      whatever the guest writes to the pipe). A line is weighed before it is parsed
      (`pipe_weight`: its bytes, and ``VALUE_BYTES`` per JSON value in it), and one
      heavier than ``max_message`` is not parsed either: `MessageTooLarge` (a line of
      ``[]`` is 40 times its bytes once parsed, and took seconds of the trio thread).
    - A guest outlives its engine by no more than a moment, however the engine ends:
      each is noted to the engine's watcher (`reaper`), which kills what is still
      noted when the engine is gone (``SIGKILL``, the OOM killer).
    - `GuestProcess.kill` and `GuestProcess.aclose` never leave a process behind and are
      bounded in time: ``aclose`` closes the guest's stdin (it exits at end of input),
      waits ``grace`` seconds, then kills.
    - Writes are serialised by a lock (several sub-call replies may be sent at once);
      ``bytes_sent`` counts every byte written to the guest's stdin.
    - A guest with an ``idle_cpu`` limit is watched (`watch`) from start to kill: CPU its
      process tree uses outside `GuestProcess.busy` spells is summed, and past the limit
      the watch kills it (``killed_idle``). The pidfd is only used under ``_state``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio
from pydantic import BaseModel, TypeAdapter

from rlm_graph import scratch
from rlm_graph.errors import EnvironmentCrashed
from rlm_graph.repl.crossing import pipe_line, pipe_weight

from . import reaper, watch
from .guest import GuestMessage, Init, Ready

__all__ = ["GUEST_PROGRAM", "GuestDied", "GuestProcess", "MessageTooLarge"]

GUEST_PROGRAM = str(Path(__file__).with_name("guest.py"))

_MESSAGES: TypeAdapter[Any] = TypeAdapter(GuestMessage)
_CHUNK = 1 << 16
LOAD_BYTES_PER_SECOND = 5e6  # of a data request the guest reads and loads, at worst
_EXIT_WAIT = 2.0


class GuestDied(Exception):
    """The guest's stdout closed: it exited, crashed or was killed."""


class MessageTooLarge(GuestDied):
    """The guest wrote more than ``max_message`` bytes without ending a message, or a
    message weighing more (``heavy``: its JSON values, weighed by `pipe_weight`)."""

    def __init__(self, limit: int, *, heavy: bool = False) -> None:
        what = "a message weighing" if heavy else "a message of"
        super().__init__(f"the guest wrote {what} more than {limit:,} bytes")
        self.limit = limit
        self.heavy = heavy


class _Lines:
    """Line-delimited messages over a trio receive stream, each at most ``limit`` bytes."""

    def __init__(self, stream: trio.abc.ReceiveStream, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0

    async def receive(self) -> bytes:
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if self._scanned > self._limit:
                raise MessageTooLarge(self._limit)
            chunk = await self._stream.receive_some(_CHUNK)
            if not chunk:
                raise GuestDied("the guest closed its output")
            self._buffer += chunk


class GuestProcess:
    """A running guest.

    Use `GuestProcess.start`; then `send`/`receive`, and `aclose` (or `kill`) once.
    """

    def __init__(
        self, process: trio.Process, log: StderrTail, max_message: int = 16 * 1024 * 1024
    ) -> None:
        self.process = process
        self.log = log
        self.pid = process.pid
        self.guest_pid: int | None = None
        self._pidfd: int | None = None
        self.bytes_sent = 0
        self.unread = 0  # bytes of messages to the guest still waiting to be written
        self.left_unread = False  # killed for leaving more than MAX_UNREAD_BYTES of them
        self.max_message = max_message
        self._lines = _Lines(process.stdout, max_message)  # type: ignore[arg-type]
        self._send_lock = trio.Lock()
        self.idle_cpu: float | None = None
        self.idle_used = 0.0
        self.killed_idle = False
        self._state = threading.Lock()  # the pidfd, and the idle accounting
        self._busy = 0
        self._last: float | None = None

    @classmethod
    async def start(
        cls,
        *,
        prefix: Sequence[str],
        rlimits: dict[str, Any],
        env: dict[str, str],
        cwd: str,
        init: Init,
        start_timeout: float,
        forks: bool = False,
        max_message: int = 16 * 1024 * 1024,
        idle_cpu: float | None = None,
    ) -> GuestProcess:
        """Spawn the guest and wait until it has built its session; with ``idle_cpu``,
        watch it between requests from then on (see `watch`). ``forks``: the ``prefix``
        forks the guest as its child (`isolation.Isolation.forks`); else it execs the
        guest in its place, and the process spawned is the guest.

        Raises:
            EnvironmentCrashed: the guest did not start (the message quotes its log).
        """
        if _EXITING:
            raise EnvironmentCrashed("the engine's process is exiting: no new guest starts")
        command = [*prefix, sys.executable, "-P", GUEST_PROGRAM, json.dumps(rlimits)]
        process, log = await _spawn(command, cwd, env)
        reaper.watch(process.pid)
        guest = cls(process, log, max_message)
        try:
            with trio.fail_after(start_timeout):
                await guest.send(init)
                ready = await guest.receive()
        except (GuestDied, trio.BrokenResourceError, trio.TooSlowError) as exc:
            with trio.CancelScope(shield=True):
                await guest.kill()
            raise EnvironmentCrashed(
                f"the subprocess REPL did not start ({type(exc).__name__}); its log says: "
                f"{guest.log_tail() or '(nothing)'}. Check memory_limit_mb and that "
                f"{sys.executable} can import rlm_graph and pydantic"
            ) from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await guest.kill()
            raise
        if not isinstance(ready, Ready):
            with trio.CancelScope(shield=True):
                await guest.kill()
            raise EnvironmentCrashed(f"the subprocess REPL failed to start: {ready!r}")
        guest._find_guest(forked=forks)
        _LIVE.add(guest)
        if idle_cpu is not None and guest.guest_pid is not None:
            guest.idle_cpu = idle_cpu
            watch.watch(guest)
        return guest

    def _find_guest(self, forked: bool) -> None:
        """Learn the guest interpreter's own pid (the launcher's child behind a launcher
        that forks, else the launcher's own: ``setpriv`` execs the guest in its place),
        and note it to the engine's watcher."""
        pid: int | None = self.pid
        if forked:
            children = _children_of(self.pid)
            pid = children[0] if children else None
        if pid is not None:
            try:
                self._pidfd = os.pidfd_open(pid)
            except (OSError, AttributeError):  # an old kernel, or not Linux
                self._pidfd = None
            self.guest_pid = pid
        reaper.watch(self.pid, self.guest_pid)

    # -- talking ------------------------------------------------------------------------

    async def send(self, message: BaseModel, deadline: trio.CancelScope | None = None) -> None:
        """Send ``message`` (a ``deadline`` for its answer is put off by a second for each
        `LOAD_BYTES_PER_SECOND` of it: a large context takes its time to load); a guest
        that leaves more than `MAX_UNREAD_BYTES` of the engine's messages unread (its code
        stopped its own reader, and kept calling) is killed, so that waiting replies cannot
        fill the engine's memory.

        Raises:
            trio.BrokenResourceError: the guest is gone, or was killed for that.
        """
        line = pipe_line(message)
        if deadline is not None:
            deadline.deadline += len(line) / LOAD_BYTES_PER_SECOND
        if self.unread and self.unread + len(line) > MAX_UNREAD_BYTES:
            self.left_unread = True
            with self._state:
                self._signal_kill(self._pidfd)  # its reader sees the end: a dead guest
            raise trio.BrokenResourceError("the guest left the engine's messages unread")
        self.unread += len(line)
        try:
            async with self._send_lock:
                await self.process.stdin.send_all(line)  # type: ignore[union-attr]
        finally:
            self.unread -= len(line)
        self.bytes_sent += len(line)

    async def receive(self) -> Any:
        """The next message of the guest (a `GuestMessage` model).

        Raises:
            GuestDied: the guest's output ended.
        """
        message, _ = await self.receive_weighed()
        return message

    async def receive_weighed(self) -> tuple[Any, int]:
        """The next message of the guest, and its weight (`pipe_weight`: about what
        holding it costs the engine), weighed before it is parsed.

        Raises:
            GuestDied: the guest's output ended.
            MessageTooLarge: the line weighs more than ``max_message`` (a guest's own
                calls are refused in the guest before that: this line was forged).
        """
        line = await self._lines.receive()
        weight = pipe_weight(line, self.max_message)
        if weight > self.max_message:
            raise MessageTooLarge(self.max_message, heavy=True)
        return _MESSAGES.validate_json(line), weight

    # -- ending -------------------------------------------------------------------------

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    async def exit_code(self, wait: float = 1.0) -> int | None:
        """The guest's exit code, waiting up to ``wait`` seconds for it."""
        with trio.move_on_after(wait):
            await self.process.wait()
        return self.process.returncode

    @contextmanager
    @trio.lowlevel.enable_ki_protection  # a Ctrl-C must not land while _state is held
    def busy(self) -> Iterator[None]:
        """A spell in which the guest works for the engine (a request, a block): its CPU
        is not charged to ``idle_cpu``."""
        with self._state:
            self._busy += 1
        try:
            yield
        finally:
            with self._state:
                self._busy -= 1
                self._last = None

    def idle_sample(self) -> bool:
        """Called by `watch` every few tenths of a second: charge idle CPU; past
        ``idle_cpu`` kill the guest and return True."""
        with self._state:
            if self._pidfd is None or self.guest_pid is None:
                return True  # killed already
            if self._busy:
                self._last = None
                return False
            used = watch.tree_cpu_seconds(self.guest_pid)
            if used is None:
                return True
            if self._last is not None:
                self.idle_used += max(0.0, used - self._last)
            self._last = used
            if self.idle_cpu is None or self.idle_used <= self.idle_cpu:
                return False
            self.killed_idle = True
            self._signal_kill(self._pidfd)
            return True

    def _signal_kill(self, pidfd: int | None) -> None:
        if pidfd is not None:
            # The guest may have left the group (setsid); the pidfd cannot hit a recycled pid.
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:  # already gone
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone, group and all
            pass

    @trio.lowlevel.enable_ki_protection
    async def kill(self) -> None:
        """``SIGKILL`` the guest and its launcher's process group, and reap them."""
        watch.unwatch(self)
        _LIVE.discard(self)
        with self._state:
            pidfd, self._pidfd = self._pidfd, None
            self._signal_kill(pidfd)
        with trio.CancelScope(shield=True):
            await self.process.wait()
            if pidfd is not None:
                # Behind a launcher the guest is a grandchild: wait until it has exited
                # too (a pidfd turns readable then), so that nothing outlives `kill`.
                with trio.move_on_after(_EXIT_WAIT):
                    await trio.lowlevel.wait_readable(pidfd)
                os.close(pidfd)
            reaper.forget(self.pid)
            await self._close_pipes()

    def cpu_seconds(self) -> float | None:
        """CPU seconds the guest has used, every process it started included (``None``
        when unknown)."""
        return watch.tree_cpu_seconds(self.guest_pid) if self.guest_pid is not None else None

    async def aclose(self, grace: float = 1.0) -> None:
        """Let the guest exit at end of input; kill it after ``grace`` seconds."""
        with trio.CancelScope(shield=True):
            if self.process.stdin is not None:
                await self.process.stdin.aclose()
            with trio.move_on_after(grace):
                await self.process.wait()
            await self.kill()

    async def _close_pipes(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                await stream.aclose()

    def log_tail(self, limit: int = 2000) -> str:
        """The end of what the guest wrote to stderr."""
        return self.log.tail(limit)


async def _spawn(
    command: list[str], cwd: str, env: dict[str, str]
) -> tuple[trio.Process, StderrTail]:
    """Start ``command`` leading its own session, its stderr kept in a tail of its own
    (a crash report quotes this guest only)."""
    log = StderrTail()
    with log:
        process = await trio.lowlevel.open_process(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.write_end,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    return process, log


class StderrTail:
    """A guest's stderr, of which the last `KEEP` bytes are kept in memory (gigabytes
    written there fill nothing on the engine's disk): a pipe drained by a thread of its
    own (it outlives trio loops, as a persistent session's guest does), which ends when
    every process holding the pipe has. Spawn the guest inside ``with tail:``."""

    KEEP = 64 * 1024

    def __init__(self) -> None:
        read_end, self.write_end = os.pipe()
        self._kept = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._drain, args=(read_end,), name="rlm-graph-guest-stderr", daemon=True
        )

    def __enter__(self) -> StderrTail:
        return self

    def __exit__(self, *exc: object) -> None:
        """The guest has its copy of the write end (or failed to start): drain."""
        os.close(self.write_end)
        self._reader.start()

    def _drain(self, fd: int) -> None:
        try:
            while chunk := os.read(fd, 65536):
                with self._lock:
                    self._kept += chunk
                    del self._kept[: max(0, len(self._kept) - self.KEEP)]
        except OSError:
            pass
        finally:
            os.close(fd)

    def tail(self, limit: int) -> str:
        if self._reader.is_alive():  # what a dead guest wrote last may still be in the pipe
            self._reader.join(0.05)
        with self._lock:
            return bytes(self._kept[-limit:]).decode(errors="replace").strip()


_LIVE: set[GuestProcess] = set()  # started and not yet killed
# A forked child's are its parent's: its exit must not kill them (nor its watcher).
os.register_at_fork(after_in_child=_LIVE.clear)
_EXITING = False  # the interpreter is exiting: no guest starts any more


def _kill_live_guests() -> None:
    """At interpreter exit (a session never closed, a stream abandoned): kill every
    guest still running, before its folder is removed (`rlm_graph.scratch.on_exit`),
    then end the guests' watcher."""
    global _EXITING
    _EXITING = True
    for guest in list(_LIVE):
        with guest._state:
            pidfd, guest._pidfd = guest._pidfd, None
            guest._signal_kill(pidfd)
        if pidfd is not None:
            os.close(pidfd)
    reaper.close()


scratch.on_exit(_kill_live_guests)


def _children_of(pid: int) -> list[int]:
    """The child processes of ``pid``, from ``/proc`` (a scan where the kernel lacks
    the ``children`` file)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        pass
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:  # the stat file's field 4, the parent's pid
            found.append(int(entry))
    return found


MAX_UNREAD_BYTES = 32 * 1024 * 1024
"""Bytes of the engine's messages (replies to its calls) a guest may leave waiting for
it to read; a single message larger than that goes when nothing else waits."""

MAX_PENDING_PROMPTS = 1_024
"""Prompts of a guest's sub-calls in flight at once (a batched call counts each of its
prompts; a tool call counts one). Past it the engine reads nothing more from the guest
until some finish: the pipe stays full and the guest's next write waits."""

MAX_PENDING_BYTES = 32 * 1024 * 1024
"""Weight of the lines of a guest's calls in flight at once (about what the engine holds
of them, their prompts, their arguments: each line's bytes and ``VALUE_BYTES`` per JSON
value in it, `pipe_weight`). Past it, as past `MAX_PENDING_PROMPTS`, the engine reads
nothing more from the guest until some finish."""


class Room:
    """A guest's calls in flight, weighed by their prompts and by the weight of their
    lines: `take` waits until a call fits both `MAX_PENDING_PROMPTS` and
    `MAX_PENDING_BYTES` (a call larger than the room goes when no other is in flight, so
    it can never wait for good), `give` frees it."""

    def __init__(self, prompts: int = MAX_PENDING_PROMPTS, size: int = MAX_PENDING_BYTES) -> None:
        self.prompts = prompts
        self.size = size
        self.calls = 0
        self.prompts_used = 0
        self.bytes_used = 0
        self._changed = trio.Event()

    def _fits(self, prompts: int, size: int) -> bool:
        return not self.calls or (
            self.prompts_used + prompts <= self.prompts and self.bytes_used + size <= self.size
        )

    async def take(self, prompts: int, size: int) -> None:
        while not self._fits(prompts, size):
            self._changed = trio.Event()
            await self._changed.wait()
        self.calls += 1
        self.prompts_used += prompts
        self.bytes_used += size

    def give(self, prompts: int, size: int) -> None:
        self.calls -= 1
        self.prompts_used -= prompts
        self.bytes_used -= size
        self._changed.set()
