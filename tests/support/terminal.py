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
