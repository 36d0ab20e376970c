"""Hedged sub-calls: the policy and the arithmetic of when a duplicate may go. Pure: no
trio.

A call that has run past the chosen quantile of this run's latencies for its model gets
one duplicate; the first answer wins and the other request is cancelled (Dean and
Barroso, "The Tail at Scale", CACM 2013: with a 95th-percentile hedge, a few percent
more requests cut the 99.9th percentile several times over). The send stage races the
two (`race`); this module says when a duplicate may go:

- only once ``min_samples`` calls of that model have answered in this run, and once
  ``quantile`` of its calls (answered and in flight) are known to have been faster (see
  `HedgeBudget`; a call that started earlier waits for it, then for the rest of its
  delay, counted from its own start);
- only while the duplicates sent stay within ``max_extra`` of the calls made (a run
  never sends more than ``1 + max_extra`` times the requests it would without hedging);
- the duplicate passes the same limiters and budget as any request.

One `HedgeBudget` serves a whole recursion tree, so ``max_extra`` holds for the tree.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError

__all__ = ["HedgeBudget", "HedgePolicy", "LatencySample"]

_KEEP = 4096  # latencies kept per model: the quantile of the recent past, in bounded memory


class HedgePolicy(BaseModel):
    """When a sub-call gets a duplicate (``RLM(hedge=...)``, ``--hedge``).

    Attributes:
        quantile: a call still unanswered past this quantile of its model's latencies
            in this run gets one duplicate (0.9: the slowest tenth).
        max_extra: duplicates at most this share of the calls made (0.1: 10%).
        min_samples: answers of the model before any duplicate (no quantile before); at
            most 4,096, the latencies a run keeps per model.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    quantile: float = Field(0.9, gt=0, lt=1)
    max_extra: float = Field(0.1, gt=0, le=1)
    min_samples: int = Field(8, ge=1, le=_KEEP)

    @classmethod
    def of(cls, value: bool | Mapping[str, Any] | HedgePolicy | None) -> HedgePolicy | None:
        """The policy ``hedge=`` asks for: None (off) for False/None, the defaults for
        True, else the keys of a dict.

        Raises:
            ConfigError: a value of the wrong type, an unknown key or one out of range.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls.model_validate({})
        if isinstance(value, HedgePolicy):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"hedge must be True, False or a dict like {{'quantile': 0.9, 'max_extra': "
                f"0.1, 'min_samples': 8}}, not {type(value).__name__}"
            )
        try:
            return cls.model_validate(dict(value))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'hedge'}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(
                f"bad hedge setting: {problems}; the keys are quantile (0 < q < 1), "
                "max_extra (0 < share <= 1) and min_samples (1 to 4096)"
            ) from None


class LatencySample:
    """One model's answered latencies in a run, kept in order for quantiles."""

    __slots__ = ("_order", "_sorted")

    def __init__(self) -> None:
        self._sorted: list[float] = []
        self._order: deque[float] = deque()

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, seconds: float) -> None:
        bisect.insort(self._sorted, seconds)
        self._order.append(seconds)
        if len(self._order) > _KEEP:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (nearest rank) of the latencies kept."""
        n = len(self._sorted)
        return self._sorted[min(n - 1, max(0, math.ceil(q * n) - 1))]

    def kth(self, k: int) -> float:
        """The ``k``-th smallest latency kept (1-based)."""
        return self._sorted[max(0, min(k, len(self._sorted)) - 1)]


class HedgeBudget:
    """A recursion tree's hedging: its latencies per model, its calls in flight, its
    duplicates.

    The delay of a call of a model is the ``quantile`` of that model's latencies, where
    the calls still in flight count too: one in flight is known only to take longer than
    it has so far. So a call is past the quantile once at least ``quantile`` of all the
    model's calls (answered and in flight) are *known* to have been faster: ``k =
    ceil(quantile * (answered + in flight))`` answered faster than it. The delay is the
    k-th smallest answered latency, and unknown (None) while fewer than ``k`` (or fewer
    than ``min_samples``) have answered. Without the calls in flight, the quantile of the
    first answers of a batch would be the quantile of its fastest calls, and half the
    batch would look slow.

    Not thread-safe: one tree runs in one trio loop.
    """

    __slots__ = ("_flying", "_latencies", "_waiting", "calls", "extra", "policy", "won")

    def __init__(self, policy: HedgePolicy) -> None:
        self.policy = policy
        self.calls = 0  # requests the tree would have sent without hedging
        self.extra = 0  # duplicates sent
        self.won = 0  # duplicates whose answer came first
        self._latencies: dict[str, LatencySample] = {}
        self._flying: dict[str, int] = {}  # calls in flight per model (not their duplicates)
        self._waiting: dict[str, list[Callable[[], None]]] = {}

    def delay(self, model: str) -> float | None:
        """Seconds after which a call of ``model`` still unanswered is past the quantile
        (see the class); None while that is not known yet."""
        sample = self._latencies.get(model)
        if sample is None or len(sample) < self.policy.min_samples:
            return None
        population = len(sample) + self._flying.get(model, 0)
        k = math.ceil(self.policy.quantile * population)
        if len(sample) < k:
            return None
        return sample.kth(k)

    def called(self) -> None:
        """Count one call (its first request)."""
        self.calls += 1

    def began(self, model: str) -> None:
        """A call of ``model`` is in flight (its first request got its slot)."""
        self._flying[model] = self._flying.get(model, 0) + 1

    def ended(self, model: str) -> None:
        """A call of ``model`` is over (answered, failed or cancelled)."""
        self._flying[model] -= 1
        self._tell(model)

    def may_send(self) -> bool:
        """Whether one more duplicate stays within ``max_extra`` of the calls made."""
        return self.extra + 1 <= self.policy.max_extra * self.calls

    def sent(self) -> None:
        """Count one duplicate sent."""
        self.extra += 1

    def answered(self, model: str, seconds: float) -> None:
        """Record the latency of one answered request of ``model``."""
        sample = self._latencies.get(model)
        if sample is None:
            sample = self._latencies[model] = LatencySample()
        sample.add(seconds)
        self._tell(model)

    def when_known(self, model: str, wake: Callable[[], None]) -> None:
        """Call ``wake`` once ``model``'s delay is known (a batch's calls start before any
        has answered; they may still be hedged once enough have)."""
        self._waiting.setdefault(model, []).append(wake)

    def _tell(self, model: str) -> None:
        if model in self._waiting and self.delay(model) is not None:
            for wake in self._waiting.pop(model):
                wake()

    def statistics(self) -> dict[str, int]:
        return {"calls": self.calls, "extra": self.extra, "won": self.won}
