"""Events of a run and the fan-out that delivers them (see docs/observing.md).

Pure: no trio. The runtime's `Run` owns an `EventEmitter`; `RLM.stream`/`astream` put an
`EventBuffer` among its listeners.
"""

from __future__ import annotations

from .buffer import DEFAULT_CAPACITY, EventBuffer
from .emitter import WARN_AT, EventEmitter
from .models import (
    Event,
    EventBase,
    LimitWarning,
    Listener,
    NodeFinished,
    NodeStarted,
    RunFinished,
    RunStarted,
    TextDelta,
    parse_event,
)

__all__ = [
    "DEFAULT_CAPACITY",
    "WARN_AT",
    "Event",
    "EventBase",
    "EventBuffer",
    "EventEmitter",
    "LimitWarning",
    "Listener",
    "NodeFinished",
    "NodeStarted",
    "RunFinished",
    "RunStarted",
    "TextDelta",
    "parse_event",
]
