"""A provider's concurrency limit: the adaptive arithmetic (`adaptive`, pure), the
in-process limiter that holds it across an engine's loops and threads (`limiter`), and
the limits of one trio loop with the run's budget gate (`capacity`).

See docs/limits.md, "Adaptive concurrency".
"""

from __future__ import annotations

from .adaptive import (
    DEFAULT_CEILING as DEFAULT_CEILING,
    DEFAULT_INITIAL as DEFAULT_INITIAL,
    AdaptiveLimit as AdaptiveLimit,
    LatencyTrend as LatencyTrend,
    Ticket as Ticket,
)

__all__ = ["DEFAULT_CEILING", "DEFAULT_INITIAL", "AdaptiveLimit", "LatencyTrend", "Ticket"]
