"""Events of a run and the fan-out that delivers them (see docs/observing.md).

Pure: no trio. The runtime's `Run` owns an `EventEmitter`; `RLM.stream`/`astream` put an
`EventBuffer` among its listeners.
"""

from __future__ import annotations

from . import models
from .buffer import DEFAULT_CAPACITY as DEFAULT_CAPACITY, EventBuffer as EventBuffer
from .emitter import WARN_AT as WARN_AT, EventEmitter as EventEmitter
from .models import *  # noqa: F403 - the events and `parse_event`, as models.__all__ lists them

__all__ = sorted(["DEFAULT_CAPACITY", "WARN_AT", "EventBuffer", "EventEmitter", *models.__all__])
