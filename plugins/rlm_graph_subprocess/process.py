"""One guest process, seen from the engine: start it, talk to it, end it.

Invariants:
    - The guest is the leader of its own process group (``start_new_session``), and
      every kill is a ``SIGKILL`` of the whole group: whatever the model's code spawned
      goes with it.
    - `GuestProcess.kill` and `GuestProcess.aclose` never leave a process behind and are
      bounded in time: ``aclose`` closes the guest's stdin (it exits at end of input),
      waits ``grace`` seconds, then kills.
    - Writes are serialised by a lock (several sub-call replies may be sent at once);
      ``bytes_sent`` counts every byte written to the guest's stdin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from pydantic import BaseModel, TypeAdapter

from rlm_graph.errors import EnvironmentCrashed

from .guest import GuestMessage, Init, Ready

__all__ = ["GUEST_PROGRAM", "GuestDied", "GuestProcess"]

GUEST_PROGRAM = str(Path(__file__).with_name("guest.py"))

_MESSAGES: TypeAdapter[Any] = TypeAdapter(GuestMessage)
_CHUNK = 1 << 16


class GuestDied(Exception):
    """The guest's stdout closed: it exited, crashed or was killed."""


class _Lines:
    """Line-delimited messages over a trio receive stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
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
            chunk = await self._stream.receive_some(_CHUNK)
            if not chunk:
                raise GuestDied("the guest closed its output")
            self._buffer += chunk


class GuestProcess:
    """A running guest.

    Use `GuestProcess.start`; then `send`/`receive`, and `aclose` (or `kill`) once.
    """

    def __init__(self, process: trio.Process, log_path: str) -> None:
        self.process = process
        self.log_path = log_path
        self.pid = process.pid
        self.bytes_sent = 0
        self._lines = _Lines(process.stdout)  # type: ignore[arg-type]
        self._send_lock = trio.Lock()

    @classmethod
    async def start(
        cls,
        *,
        prefix: Sequence[str],
        rlimits: dict[str, Any],
        env: dict[str, str],
        cwd: str,
        log_path: str,
        init: Init,
        start_timeout: float,
    ) -> GuestProcess:
        """Spawn the guest and wait until it has built its session.

        Raises:
            EnvironmentCrashed: the guest did not start (the message quotes its log).
        """
        command = [*prefix, sys.executable, "-P", GUEST_PROGRAM, json.dumps(rlimits)]
        # A fresh log per guest, so a crash report quotes this guest only.
        with open(log_path, "wb") as log:  # noqa: ASYNC230 - creating an empty file
            process = await trio.lowlevel.open_process(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        guest = cls(process, log_path)
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
        return guest

    # -- talking ------------------------------------------------------------------------

    async def send(self, message: BaseModel) -> None:
        line = message.model_dump_json().encode() + b"\n"
        async with self._send_lock:
            await self.process.stdin.send_all(line)  # type: ignore[union-attr]
        self.bytes_sent += len(line)

    async def receive(self) -> Any:
        """The next message of the guest (a `GuestMessage` model).

        Raises:
            GuestDied: the guest's output ended.
        """
        return _MESSAGES.validate_json(await self._lines.receive())

    # -- ending -------------------------------------------------------------------------

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    async def exit_code(self, wait: float = 1.0) -> int | None:
        """The guest's exit code, waiting up to ``wait`` seconds for it."""
        with trio.move_on_after(wait):
            await self.process.wait()
        return self.process.returncode

    async def kill(self) -> None:
        """``SIGKILL`` the guest's process group and reap the guest."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone, group and all
            pass
        with trio.CancelScope(shield=True):
            await self.process.wait()
            await self._close_pipes()

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
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - limit))
                return handle.read().decode(errors="replace").strip()
        except OSError:
            return ""
