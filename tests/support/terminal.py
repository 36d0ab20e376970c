"""Commands a test starts and stops with signals, as a terminal would."""

from __future__ import annotations

import signal
from typing import Any


def as_from_a_terminal(then: Any = None) -> Any:
    """A ``preexec_fn``: the command starts with SIGINT, SIGTERM and SIGHUP as a terminal
    gives them (the suite itself may run as a background job or under ``nohup``, which
    its children would inherit), then ``then`` sets the test's own."""

    def reset() -> None:
        for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(stop, signal.SIG_DFL)
        if then is not None:
            then()

    return reset


def read_until_closed(controller: int) -> bytes:
    """Everything a pseudo-terminal's program wrote, until it closed its end; closes
    ``controller``."""
    import os

    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return b"".join(chunks)
