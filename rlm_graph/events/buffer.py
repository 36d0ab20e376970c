"""`EventBuffer`: a FIFO of events between a run and one slow consumer.

The overflow rule (docs/observing.md): the run never waits for a consumer (no
back-pressure on the scheduler) and no event is ever dropped. Up to ``capacity`` events
wait in memory; past that, new events are spilled to an anonymous temporary file as JSON
lines, and read back in order once the consumer has caught up with memory. So memory
holds at most ``capacity`` events whatever the consumer's pace; the disk holds the rest
for as long as the consumer lags. ``run_finished`` (which carries the result, not JSON)
is kept apart and always comes out last.

Thread-safe: the sync stream's producer (the run, on its trio thread) and consumer (the
caller's thread) meet here, hence a `threading.Condition`, held only for list and file
operations, never while a consumer waits for an event.
"""

from __future__ import annotations

import tempfile
import threading
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from ..errors import ConfigError
from .models import RunFinished, parse_event

__all__ = ["DEFAULT_CAPACITY", "EMPTY", "END", "EventBuffer"]

DEFAULT_CAPACITY = 1024
"""Events a stream keeps in memory before it spills to disk."""

EMPTY: Any = object()
"""`EventBuffer.get_nowait`: nothing yet, the run goes on."""
END: Any = object()
"""`EventBuffer.get_nowait` and `get`: the run is over and every event was read."""


class EventBuffer:
    """A listener that queues every event for a consumer, memory-bounded, lossless.

    Args:
        capacity: events held in memory before spilling to disk (at least 1; else a
            `ConfigError`).
        wakeup: called (on the producer's thread) after each event is queued and at
            `close`; the async stream uses it to wake its consumer.

    Attributes:
        peak_in_memory: the most events ever held in memory at once (<= ``capacity``).
        spilled: events that went through the spill file.
        received, delivered: events queued and handed out.
    """

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, *, wakeup: Callable[[], None] | None = None
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(
                "capacity (the events a stream holds in memory; the rest wait on disk) must "
                f"be a whole number, at least 1, not {type(capacity).__name__} {capacity!r:.40}"
            )
        self.capacity = capacity
        self.wakeup = wakeup
        self._memory: deque[Any] = deque()
        self._final: RunFinished | None = None
        self._closed = False
        self._file: IO[bytes] | None = None
        self._unread = 0  # spilled events not yet read back
        self._read_at = 0
        self._cond = threading.Condition(threading.Lock())
        self.peak_in_memory = 0
        self.spilled = 0
        self.received = 0
        self.delivered = 0

    # -- producer side ------------------------------------------------------------------

    def __call__(self, event: Any) -> None:
        self.put(event)

    def put(self, event: Any) -> None:
        """Queue one event; never blocks on the consumer."""
        with self._cond:
            self.received += 1
            if isinstance(event, RunFinished):
                self._final = event
            elif self._unread or len(self._memory) >= self.capacity:
                self._spill(event)
            else:
                self._memory.append(event)
                self.peak_in_memory = max(self.peak_in_memory, len(self._memory))
            self._cond.notify_all()
        if self.wakeup is not None:
            self.wakeup()

    def close(self) -> None:
        """No more events will come (the run is over, or failed before its last event)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self.wakeup is not None:
            self.wakeup()

    def _spill(self, event: Any) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="rlm-graph-events-")
        self._file.seek(0, 2)
        self._file.write(event.model_dump_json().encode("utf-8") + b"\n")
        self._unread += 1
        self.spilled += 1

    # -- consumer side ------------------------------------------------------------------

    def get_nowait(self) -> Any:
        """The next event, `EMPTY` if none is ready yet, or `END` after the last."""
        with self._cond:
            return self._take()

    def get(self, timeout: float | None = None) -> Any:
        """The next event, waiting for it; `END` after the last; `EMPTY` on timeout."""
        with self._cond:
            item = self._take()
            while item is EMPTY:
                if not self._cond.wait(timeout):
                    return EMPTY
                item = self._take()
            return item

    def _take(self) -> Any:
        if not self._memory and self._unread:
            self._refill()
        if self._memory:
            self.delivered += 1
            return self._memory.popleft()
        if self._final is not None:
            final, self._final = self._final, None
            self.delivered += 1
            return final
        if not self._closed:
            return EMPTY
        if self._file is not None:  # every event read: the spill file is done with
            self._file.close()
            self._file = None
        return END

    def _refill(self) -> None:
        """Read up to ``capacity`` spilled events back into memory, in order."""
        assert self._file is not None
        self._file.seek(self._read_at)
        while self._unread and len(self._memory) < self.capacity:
            self._memory.append(parse_event(self._file.readline()))
            self._unread -= 1
        self._read_at = self._file.tell()
        if not self._unread:  # caught up: start the file afresh
            self._file.seek(0)
            self._file.truncate()
            self._read_at = 0

    def discard(self) -> None:
        """Drop what is queued and the spill file (the consumer has gone)."""
        with self._cond:
            self._memory.clear()
            self._unread = 0
            if self._file is not None:
                self._file.close()
                self._file = None
