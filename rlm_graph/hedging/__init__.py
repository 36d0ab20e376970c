"""Hedged sub-calls (``hedge=``; docs/limits.md, "Hedged sub-calls"): the policy and a
tree's latencies and duplicates (`policy`, pure), and the race of a call and its
duplicate in the send stage (`race`, trio).
"""

from __future__ import annotations

from .policy import (
    HedgeBudget as HedgeBudget,
    HedgePolicy as HedgePolicy,
    LatencySample as LatencySample,
)

__all__ = ["HedgeBudget", "HedgePolicy", "LatencySample"]
