"""Work the engine hands to a worker thread and gives up at the run's deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

__all__ = ["off_the_loop"]


async def off_the_loop(check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)`` in a worker thread: a guest's schema checked, or an answer that
    model code gave checked against a schema. The loop runs on meanwhile, and a
    cancellation (the run's deadline, a block's timeout) gives the thread up at once;
    against a guest's schema the check ends by itself, within its fuel
    (`rlm_graph.protocol.guest_schema`), and against a user's, in the time it takes."""
    return await trio.to_thread.run_sync(check, value, abandon_on_cancel=True)
