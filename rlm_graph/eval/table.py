"""``summary.md``: the summary as the RLM paper's Table 1 lays it out, then in detail. Pure.

Table 1 has a row per method and a column per task; a cell is the score in percent and,
in parentheses, the mean cost per item with its standard deviation. An asterisk marks a
method some of whose items did not fit the model's window (scored 0); a dagger one some
of whose items were not run (the evaluation stopped first: its score is over the others).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from .stats import EvalSummary, MethodSummary, mean

__all__ = ["cost_cell", "render_table"]

_NAMES = {
    "rlm": "RLM",
    "rlm-no-subcalls": "RLM (no sub-calls)",
    "base": "Base model",
    "summary": "Summary agent",
}


def _usd(value: float | None) -> str:
    if value is None:
        return "N/A"
    return f"${value:.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def _pct(value: float | None) -> str:
    return "N/A" if value is None else f"{100 * value:.2f}"


def _seconds(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.2f} s"


def cost_cell(method: MethodSummary) -> str:
    """``($0.43 ± $0.85)``: the mean cost per item and its standard deviation."""
    costs = list(method.costs)
    if not costs:
        return "(N/A)"
    spread = statistics.stdev(costs) if len(costs) > 1 else 0.0
    return f"({_usd(mean(costs))} ± {_usd(spread)})"


def _paper_cell(method: MethodSummary) -> str:
    mark = ("*" if method.does_not_fit else "") + ("†" if method.not_run else "")
    return f"{_pct(method.score)}{mark} {cost_cell(method)}"


def render_table(
    summary: EvalSummary,
    *,
    root_model: str,
    sub_model: str,
    descriptions: Mapping[str, str] | None = None,
) -> str:
    """The Markdown of ``summary.md``."""
    lines = [
        f"# {summary.title}",
        "",
        f"Root model `{root_model}`, sub-model `{sub_model}`. Scores in percent; in "
        "parentheses the mean cost per item ± its standard deviation (USD), as in the RLM "
        f"paper's Table 1. Intervals: 95% percentile bootstrap over items, seed {summary.seed}.",
        "",
        f"| Method | {summary.title} |",
        "| --- | --- |",
    ]
    for name, method in summary.methods.items():
        lines.append(f"| {_NAMES.get(name, name)} | {_paper_cell(method)} |")
    if any(m.does_not_fit for m in summary.methods.values()):
        lines += ["", "\\* some items did not fit the model's context window; they score 0."]
    not_run = [(name, m) for name, m in summary.methods.items() if m.not_run]
    if not_run:
        counts = "; ".join(
            f"{_NAMES.get(name, name)} over {m.n} of {m.n + m.not_run} items, {m.not_run} not run"
            for name, m in not_run
        )
        lines += [
            "",
            f"† scored over the items that ran ({counts}): the evaluation stopped before the "
            "others (its budget ran out); a rerun with a larger budget runs them.",
        ]
    lines += [
        "",
        "| method | n | score | 95% CI | cost mean | cost median | cost p95 | latency median | latency p95 | errors | did not fit | not run |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in summary.methods.items():
        ci = f"[{_pct(m.ci95[0])}, {_pct(m.ci95[1])}]" if m.ci95 else "N/A"
        lines.append(
            f"| {name} | {m.n} | {_pct(m.score)} | {ci} | {_usd(m.cost.mean)} | {_usd(m.cost.median)} "
            f"| {_usd(m.cost.p95)} | {_seconds(m.latency_s.median)} | {_seconds(m.latency_s.p95)} "
            f"| {m.errors} | {m.does_not_fit} | {m.not_run} |"
        )
    if descriptions:
        lines += ["", *(f"- `{name}`: {text}" for name, text in descriptions.items())]
    return "\n".join(lines) + "\n"
