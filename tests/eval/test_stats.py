"""The summary: the seeded bootstrap, percentiles, what each statistic counts."""

from __future__ import annotations

import math

from rlm_graph.eval.stats import bootstrap_ci, quantile, summarize


def _row(
    item: str, method: str, score: float, cost: float | None = 0.1, **extra: object
) -> dict[str, object]:
    return {
        "id": item,
        "method": method,
        "score": score,
        "cost": cost,
        "latency_s": 1.0,
        "stop_reason": None,
        "error": None,
        **extra,
    }


def test_quantiles_interpolate_between_the_nearest_ranks() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert math.isclose(quantile([float(v) for v in range(1, 21)], 0.95) or 0, 19.05)
    assert quantile([], 0.5) is None


def test_the_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    scores = [1.0, 0.0, 1.0, 1.0, 0.5625, 0.0, 1.0, 0.4]
    first = bootstrap_ci(scores, seed=7)
    assert first == bootstrap_ci(scores, seed=7)
    assert first != bootstrap_ci(scores, seed=8)
    assert first is not None
    mean = sum(scores) / len(scores)
    assert first[0] < mean < first[1]
    assert bootstrap_ci([1.0] * 5, seed=0) == (1.0, 1.0)


def test_the_summary_does_not_depend_on_the_order_rows_arrived_in() -> None:
    rows = [_row(f"q{i}", "rlm", (i % 3) / 2) for i in range(12)]
    one = summarize(rows, methods=["rlm"], seed=3, title="t")
    two = summarize(list(reversed(rows)), methods=["rlm"], seed=3, title="t")
    assert one == two


def test_failures_count_zero_and_contexts_that_did_not_fit_cost_nothing() -> None:
    rows = [
        _row("a", "base", 1.0, cost=0.2),
        _row("b", "base", 0.0, cost=0.4, error={"type": "ProviderError", "message": "refused"}),
        _row("c", "base", 0.0, cost=None, stop_reason="does_not_fit"),
        _row("a", "rlm", 1.0, cost=0.1),
    ]
    summary = summarize(rows, methods=["base", "rlm", "summary"], seed=0, title="t")
    base = summary.methods["base"]
    assert (base.n, base.errors, base.does_not_fit) == (3, 1, 1)
    assert math.isclose(base.score or 0, 1 / 3)
    assert base.costs == (0.2, 0.4) and math.isclose(base.cost.mean or 0, 0.3)
    assert summary.methods["summary"].n == 0 and summary.methods["summary"].score is None
    assert list(summary.public()["methods"]["base"]) == [
        "n",
        "score",
        "ci95",
        "cost",
        "latency_s",
        "errors",
        "does_not_fit",
        "not_run",
    ]
