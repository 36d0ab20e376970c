"""A plain (POSIX, not TLS) socket's descriptor used directly by the lean transport, where
trio's ``SocketStream`` would cost a scheduler round trip or a system call for nothing:
a request written whole takes no trip through the run loop (`write_all`), the first read
of an answer waits first and then reads (`read_when_ready`), and a read just after a
paced tick takes what is there at once (`read_now`).

Invariants:
    - The descriptor is read from the socket before every use: it is -1 once the socket
      is closed (`trio.ClosedResourceError`), never a number reused since.
    - Errors are the ``OSError`` trio's stream would raise (its ``BrokenResourceError``
      and ``ClosedResourceError`` aside), and a write raises only before every byte was
      handed to the kernel, as ``send_all`` does.
"""

from __future__ import annotations

import os

import trio

__all__ = ["READ_SIZE", "descriptor", "plain", "read_now", "read_when_ready", "write_all"]

_POSIX = os.name == "posix"  # where a socket's descriptor reads and writes with os.read/write
READ_SIZE = 64 * 1024


def plain(stream: trio.abc.Stream) -> bool:
    """Whether ``stream`` is a plain socket whose descriptor `write_all` and
    `read_when_ready` may use directly (POSIX; not TLS)."""
    return _POSIX and type(stream) is trio.SocketStream


def descriptor(sock: trio.socket.SocketType) -> int:
    """The socket's descriptor; `trio.ClosedResourceError` once it is closed."""
    fd = sock.fileno()  # -1 once closed: never a number reused since
    if fd < 0:
        raise trio.ClosedResourceError("the connection was closed")
    return fd


async def write_all(sock: trio.socket.SocketType, data: bytes) -> None:
    """``send_all`` on a plain socket, without its scheduler round trip after a write the
    kernel took whole (a request almost always is): a cancellation point first, then
    writes, waiting only while the kernel's buffer is full. Raises OSError as
    ``send_all`` does, and only before every byte was handed to the kernel."""
    await trio.lowlevel.checkpoint_if_cancelled()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(descriptor(sock), view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


async def read_when_ready(sock: trio.socket.SocketType) -> bytes:
    """One read of a plain socket, once it is readable (``b""``: closed by the server)."""
    while True:
        descriptor(sock)  # closed already: an error, not a wait on a descriptor gone
        await trio.lowlevel.wait_readable(sock)
        try:
            return os.read(descriptor(sock), READ_SIZE)
        except BlockingIOError:  # woken with nothing to read after all: wait again
            continue


def read_now(sock: trio.socket.SocketType) -> bytes | None:
    """One read of a plain socket if it has bytes (or its end) ready, else None."""
    try:
        return os.read(descriptor(sock), READ_SIZE)
    except BlockingIOError:
        return None
