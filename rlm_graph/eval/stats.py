"""The summary of an evaluation: score with a bootstrap interval, cost and latency. Pure.

Per method, over its rows (one per item that ran):

- ``score``: the mean score of every item with a row, those that failed or did not fit
  counting 0; items the evaluation stopped before (its budget ran out) have no row and
  are counted apart, in ``not_run``;
- ``ci95``: the 2.5th and 97.5th percentiles of the mean over `BOOTSTRAP_RESAMPLES`
  resamples of the items with replacement (a percentile bootstrap over items);
- ``cost``: mean, median and 95th percentile in USD over the items that ran and whose
  cost is known (a context that did not fit ran nothing and costs nothing: left out);
- ``latency_s``: median and 95th percentile of seconds per item, over the items that ran.

Percentiles interpolate linearly between the two nearest ranks (numpy's default).

Invariants:
    - Deterministic: rows are taken in id order and the resampling is seeded, so the same
      rows and seed give the same summary, whatever order the items finished in.
    - Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "CostStats",
    "EvalSummary",
    "LatencyStats",
    "MethodSummary",
    "bootstrap_ci",
    "mean",
    "quantile",
    "summarize",
]

BOOTSTRAP_RESAMPLES = 2000

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def mean(values: Sequence[float]) -> float | None:
    """The mean of ``values``, else None; finite for finite values however large (costs a
    server reported near the largest float would overflow their sum)."""
    if not values:
        return None
    total = sum(values)
    return total / len(values) if math.isfinite(total) else sum(v / len(values) for v in values)


def quantile(values: Sequence[float], share: float) -> float | None:
    """The ``share`` quantile of ``values`` (linear between the nearest ranks), else None."""
    if not values:
        return None
    ranked = sorted(values)
    position = (len(ranked) - 1) * share
    low = math.floor(position)
    high = min(low + 1, len(ranked) - 1)
    return ranked[low] + (ranked[high] - ranked[low]) * (position - low)


def bootstrap_ci(
    scores: Sequence[float], *, seed: int, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of the mean of ``scores``, seeded.

    Returns:
        ``(low, high)``, or ``None`` for no scores.
    """
    if not scores:
        return None
    rng = random.Random(seed)
    n = len(scores)
    means = sorted(sum(rng.choices(scores, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    low, high = quantile(means, tail), quantile(means, 1 - tail)
    assert low is not None and high is not None
    return low, high


class CostStats(BaseModel):
    """USD per item."""

    model_config = _FROZEN

    mean: float | None = None
    median: float | None = None
    p95: float | None = None


class LatencyStats(BaseModel):
    """Seconds per item."""

    model_config = _FROZEN

    median: float | None = None
    p95: float | None = None


class MethodSummary(BaseModel):
    """One method over the items of an evaluation (a row of Table 1).

    Attributes:
        n: items with a row.
        score: mean score in [0, 1].
        ci95: the bootstrap interval of ``score``.
        cost: USD per item (items that ran, with a known cost).
        latency_s: seconds per item (items that ran).
        errors: items whose run failed (they score 0).
        does_not_fit: items the method did not run because the context exceeds the
            model's window (they score 0).
        not_run: items of the evaluation without a row: it stopped before them (its
            budget ran out). ``score`` is over the ``n`` others; a rerun runs them.
        costs: every known cost, in id order (the report draws their distribution).
    """

    model_config = _FROZEN

    n: int
    score: float | None
    ci95: tuple[float, float] | None
    cost: CostStats
    latency_s: LatencyStats
    errors: int = 0
    does_not_fit: int = 0
    not_run: int = 0
    costs: tuple[float, ...] = ()

    def public(self) -> dict[str, Any]:
        """The summary.json entry (``costs`` left out: results.jsonl has them)."""
        return self.model_dump(mode="json", exclude={"costs"})


class EvalSummary(BaseModel):
    """Every method of one evaluation, in the order they were asked for."""

    model_config = _FROZEN

    title: str
    seed: int
    methods: dict[str, MethodSummary]

    def public(self) -> dict[str, Any]:
        """The content of summary.json."""
        return {
            "title": self.title,
            "seed": self.seed,
            "methods": {name: m.public() for name, m in self.methods.items()},
        }


def _one(rows: Sequence[Mapping[str, Any]], seed: int, items: int | None) -> MethodSummary:
    ordered = sorted(rows, key=lambda r: str(r["id"]))
    scores = [float(r.get("score") or 0.0) for r in ordered]
    ran = [r for r in ordered if r.get("stop_reason") != "does_not_fit"]
    costs = [float(r["cost"]) for r in ran if r.get("cost") is not None]
    latencies = [float(r["latency_s"]) for r in ran if r.get("latency_s") is not None]
    ci = bootstrap_ci(scores, seed=seed)
    return MethodSummary(
        n=len(ordered),
        score=sum(scores) / len(scores) if scores else None,
        ci95=ci,
        cost=CostStats(
            mean=mean(costs),
            median=statistics.median(costs) if costs else None,
            p95=quantile(costs, 0.95),
        ),
        latency_s=LatencyStats(
            median=statistics.median(latencies) if latencies else None,
            p95=quantile(latencies, 0.95),
        ),
        errors=sum(1 for r in ordered if r.get("error") is not None),
        does_not_fit=len(ordered) - len(ran),
        not_run=max(0, items - len(ordered)) if items is not None else 0,
        costs=tuple(costs),
    )


def summarize(
    rows: Iterable[Mapping[str, Any]],
    *,
    methods: Sequence[str],
    seed: int,
    title: str,
    items: int | None = None,
) -> EvalSummary:
    """The summary of result rows (``id``, ``method``, ``score``, ``cost``,
    ``latency_s``, ``stop_reason``, ``error``), for ``methods`` in that order.

    A method with no row yet is summarised with ``n = 0`` and nulls. With ``items``, the
    evaluation's number of items, a method's items without a row are its ``not_run``
    (a budget-cut evaluation averaged the rows it had and did not say how many it lacked).
    """
    by_method: dict[str, list[Mapping[str, Any]]] = {name: [] for name in methods}
    for row in rows:
        if row.get("method") in by_method:
            by_method[str(row["method"])].append(row)
    return EvalSummary(
        title=title,
        seed=seed,
        methods={name: _one(found, seed, items) for name, found in by_method.items()},
    )
