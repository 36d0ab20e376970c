"""``report.html``: an evaluation in one self-contained page. Pure.

Two figures, drawn here as inline SVG: the score per method with its 95% interval, and
the cost of every item per method (a strip of points over its quartile box, the median
and the 95th percentile marked; a log axis when costs span more than a factor of 20),
the RLM paper's Figure 3. Then the summary table and every row.

Nothing is fetched when the page opens (no script, style, font or image from elsewhere).
A small inline script counts what was drawn and sets ``data-methods``,
``data-cost-points`` and ``data-errors`` (script errors caught on the page) on
``<body>``: the test suite opens the page in a headless Chromium and reads them.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..report.page import html_document
from .stats import EvalSummary, MethodSummary, quantile

__all__ = ["render_eval_page"]

_WIDTH = 720
_LEFT = 170
_RIGHT = 30
_PALETTE = ("#2f6fb0", "#d9822b", "#3a9a5b", "#b03a5b", "#7a5bb0", "#8a8a3a", "#3a8a8a", "#6b6b6b")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _score_figure(summary: EvalSummary) -> str:
    plot = _WIDTH - _LEFT - _RIGHT
    row = 30
    height = row * len(summary.methods) + 40
    parts = [
        f'<svg id="scores" width="{_WIDTH}" height="{height}" viewBox="0 0 {_WIDTH} {height}" role="img" aria-label="score per method">'
    ]
    for tick in range(0, 101, 20):
        x = _LEFT + plot * tick / 100
        parts.append(f'<line x1="{x:.1f}" y1="10" x2="{x:.1f}" y2="{height - 25}" class="grid"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{height - 8}" class="tick" text-anchor="middle">{tick}%</text>'
        )
    for index, (name, method) in enumerate(summary.methods.items()):
        y = 14 + index * row
        color = _PALETTE[index % len(_PALETTE)]
        value = method.score or 0.0
        parts.append(f'<g class="method" data-method="{_e(name)}">')
        parts.append(f'<text x="{_LEFT - 8}" y="{y + 14}" text-anchor="end">{_e(name)}</text>')
        parts.append(
            f'<rect x="{_LEFT}" y="{y + 3}" width="{plot * value:.1f}" height="16" fill="{color}" opacity="0.85"><title>{_e(name)}: {100 * value:.1f}% over {method.n} items{f", {method.not_run} not run" if method.not_run else ""}</title></rect>'
        )
        if method.ci95 is not None:
            low, high = (_LEFT + plot * v for v in method.ci95)
            parts.append(
                f'<line x1="{low:.1f}" y1="{y + 11}" x2="{high:.1f}" y2="{y + 11}" class="ci"/>'
            )
            parts += [
                f'<line x1="{x:.1f}" y1="{y + 6}" x2="{x:.1f}" y2="{y + 16}" class="ci"/>'
                for x in (low, high)
            ]
        label = "n/a" if method.score is None else f"{100 * value:.1f}%"
        right = max(value, method.ci95[1] if method.ci95 is not None else value)
        parts.append(
            f'<text x="{_LEFT + plot * right + 6:.1f}" y="{y + 15}" class="value">{label}</text>'
        )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _axis(values: Sequence[float]) -> tuple[bool, float, float]:
    """(log scale?, low, high) for a cost axis over ``values``."""
    positive = [v for v in values if v > 0]
    if positive and len(positive) == len(values) and max(positive) / min(positive) > 20:
        return (
            True,
            10 ** math.floor(math.log10(min(positive))),
            10 ** math.ceil(math.log10(max(positive))),
        )
    high = max(values) if values and max(values) > 0 else 1.0
    return False, 0.0, high * 1.05


def _ticks(log: bool, low: float, high: float) -> list[float]:
    if log:
        return [10.0**p for p in range(round(math.log10(low)), round(math.log10(high)) + 1)]
    step = high / 5
    return [step * i for i in range(6)]


def _money(value: float) -> str:
    if value <= 0:
        return "$0"
    decimals = max(2, -math.floor(math.log10(value)))
    return f"${value:.{decimals}f}"


def _cost_figure(summary: EvalSummary) -> str:
    every = [c for m in summary.methods.values() for c in m.costs]
    log, low, high = _axis(every)
    plot = _WIDTH - _LEFT - _RIGHT

    def x_of(value: float) -> float:
        if log:
            return _LEFT + plot * (math.log10(max(value, low)) - math.log10(low)) / (
                math.log10(high) - math.log10(low)
            )
        return _LEFT + plot * (value - low) / ((high - low) or 1.0)

    row = 56
    height = row * len(summary.methods) + 40
    scale = "log" if log else "linear"
    parts = [
        f'<svg id="costs" width="{_WIDTH}" height="{height}" viewBox="0 0 {_WIDTH} {height}" data-scale="{scale}" role="img" aria-label="cost per item, per method">'
    ]
    for tick in _ticks(log, low, high):
        x = x_of(tick)
        parts.append(f'<line x1="{x:.1f}" y1="8" x2="{x:.1f}" y2="{height - 25}" class="grid"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{height - 8}" class="tick" text-anchor="middle">{_money(tick)}</text>'
        )
    for index, (name, method) in enumerate(summary.methods.items()):
        parts.append(
            _cost_row(name, method, 10 + index * row, _PALETTE[index % len(_PALETTE)], x_of)
        )
    parts.append("</svg>")
    return "".join(parts)


def _cost_row(name: str, method: MethodSummary, top: int, color: str, x_of: Any) -> str:
    middle = top + 22
    parts = [
        f'<g class="method-costs" data-method="{_e(name)}">',
        f'<text x="{_LEFT - 8}" y="{middle + 4}" text-anchor="end">{_e(name)}</text>',
    ]
    costs = list(method.costs)
    if not costs:
        parts.append(
            f'<text x="{_LEFT + 6}" y="{middle + 4}" class="tick">no known cost</text></g>'
        )
        return "".join(parts)
    q1, q2, q3, p95 = (quantile(costs, q) for q in (0.25, 0.5, 0.75, 0.95))
    assert q1 is not None and q2 is not None and q3 is not None and p95 is not None
    parts.append(
        f'<rect x="{x_of(q1):.1f}" y="{middle - 12}" width="{max(1.0, x_of(q3) - x_of(q1)):.1f}" height="24" class="box"/>'
    )
    parts.append(
        f'<line x1="{x_of(q2):.1f}" y1="{middle - 14}" x2="{x_of(q2):.1f}" y2="{middle + 14}" class="median"><title>median {_money(q2)}</title></line>'
    )
    parts.append(
        f'<line x1="{x_of(p95):.1f}" y1="{middle - 14}" x2="{x_of(p95):.1f}" y2="{middle + 14}" class="p95"><title>95th percentile {_money(p95)}</title></line>'
    )
    for i, cost in enumerate(costs):
        jitter = ((i * 7919) % 23 - 11) * 0.9
        parts.append(
            f'<circle cx="{x_of(cost):.1f}" cy="{middle + jitter:.1f}" r="2.6" fill="{color}" class="point"><title>{_money(cost)}</title></circle>'
        )
    parts.append("</g>")
    return "".join(parts)


def _summary_rows(summary: EvalSummary, descriptions: Mapping[str, str]) -> str:
    def usd(value: float | None) -> str:
        return "" if value is None else f"${value:.4f}"

    def sec(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    out = []
    for name, m in summary.methods.items():
        ci = f"{100 * m.ci95[0]:.1f} – {100 * m.ci95[1]:.1f}" if m.ci95 else ""
        score = "" if m.score is None else f"{100 * m.score:.1f}%"
        out.append(
            f'<tr data-method="{_e(name)}"><th title="{_e(descriptions.get(name, ""))}">{_e(name)}</th><td>{m.n}</td>'
            f"<td>{score}</td><td>{ci}</td><td>{usd(m.cost.mean)}</td><td>{usd(m.cost.median)}</td>"
            f"<td>{usd(m.cost.p95)}</td><td>{sec(m.latency_s.median)}</td><td>{sec(m.latency_s.p95)}</td>"
            f"<td>{m.errors}</td><td>{m.does_not_fit}</td><td>{m.not_run}</td></tr>"
        )
    return "".join(out)


def _item_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    out = []
    for row in sorted(rows, key=lambda r: (str(r["method"]), str(r["id"]))):
        error = row.get("error") or {}
        note = (
            f"{error.get('type', '')}: {error.get('message', '')}"
            if error
            else (row.get("stop_reason") or "")
        )
        cost = "" if row.get("cost") is None else f"${row['cost']:.4f}"
        prediction = str(row.get("prediction") or "")
        out.append(
            f"<tr><td>{_e(row['method'])}</td><td>{_e(row['id'])}</td><td>{float(row.get('score') or 0):.3f}</td>"
            f"<td>{cost}</td><td>{float(row.get('latency_s') or 0):.2f}</td>"
            f'<td class="text">{_e(prediction[:200])}</td><td class="text">{_e(note[:300])}</td></tr>'
        )
    return "".join(out)


def render_eval_page(
    summary: EvalSummary,
    rows: Sequence[Mapping[str, Any]],
    *,
    root_model: str,
    sub_model: str,
    descriptions: Mapping[str, str] | None = None,
) -> str:
    """The whole HTML document of an evaluation."""
    described = dict(descriptions or {})
    legend = "".join(f"<li><code>{_e(n)}</code>: {_e(t)}</li>" for n, t in described.items())
    data = {"summary": summary.public(), "models": {"root": root_model, "sub": sub_model}}
    filled = {
        "__TITLE__": _e(summary.title),
        "__MODELS__": f"root model <code>{_e(root_model)}</code>, sub-model <code>{_e(sub_model)}</code>, bootstrap seed {summary.seed}",
        "__SCORES__": _score_figure(summary),
        "__COSTS__": _cost_figure(summary),
        "__SUMMARY__": _summary_rows(summary, described),
        "__LEGEND__": legend,
        "__ROWS__": _item_rows(rows),
        "__COUNT__": str(len(rows)),
    }
    # One pass: a placeholder's text inside what fills another (a model's prediction
    # holding ``__COUNT__``) stays as written; chained replaces rewrote it.
    body = _PLACEHOLDER.sub(lambda found: filled[found[0]], _BODY)
    return html_document(
        title=summary.title,
        style=_STYLE,
        body=body,
        script=_SCRIPT,
        data=data,
        data_id="eval-data",
    )


_PLACEHOLDER = re.compile("__(?:TITLE|MODELS|SCORES|COSTS|SUMMARY|LEGEND|ROWS|COUNT)__")

_BODY = """<header><h1>__TITLE__</h1><p>__MODELS__</p></header>
<main>
<section><h2>Score per method <small>mean over items; whiskers: 95% bootstrap interval</small></h2>
__SCORES__</section>
<section><h2>Cost per item <small>one point per item; box: quartiles; dark line: median; red line: 95th percentile</small></h2>
__COSTS__</section>
<section><h2>Summary</h2>
<table id="summary"><thead><tr><th>method</th><th>n</th><th>score</th><th>95% CI</th><th>cost mean</th>
<th>cost median</th><th>cost p95</th><th>latency median (s)</th><th>latency p95 (s)</th><th>errors</th>
<th>did not fit</th><th>not run</th></tr></thead><tbody>__SUMMARY__</tbody></table>
<ul class="legend">__LEGEND__</ul></section>
<section><details><summary>Every row (__COUNT__)</summary>
<table id="rows"><thead><tr><th>method</th><th>id</th><th>score</th><th>cost</th><th>latency (s)</th>
<th>prediction</th><th>error or stop reason</th></tr></thead><tbody>__ROWS__</tbody></table></details></section>
</main>
"""

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 24px 40px; color: #222; }
h1 { font-size: 20px; margin: 18px 0 4px; } h2 { font-size: 16px; margin: 22px 0 6px; }
h2 small { font-weight: normal; color: #666; font-size: 12px; }
svg text { font-size: 12px; fill: #222; } svg .tick { fill: #666; font-size: 11px; }
svg .value { font-size: 11px; fill: #444; }
svg .grid { stroke: #e4e4e4; } svg .ci { stroke: #222; stroke-width: 1.4; }
svg .box { fill: #f0f0f0; stroke: #999; } svg .median { stroke: #222; stroke-width: 2; }
svg .p95 { stroke: #c0392b; stroke-width: 2; } svg .point { opacity: 0.75; }
table { border-collapse: collapse; margin: 6px 0; } th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th:first-child, td.text { text-align: left; } td.text { max-width: 420px; overflow-wrap: anywhere; white-space: normal; }
code { background: #f4f4f4; padding: 0 3px; } .legend { color: #555; }
"""

_SCRIPT = """
(function () {
  var errors = 0;
  window.addEventListener("error", function () {
    errors += 1; document.body.setAttribute("data-errors", String(errors));
  });
  var data = JSON.parse(document.getElementById("eval-data").textContent);
  var names = Object.keys(data.summary.methods);
  var bars = document.querySelectorAll("#scores g.method");
  var points = document.querySelectorAll("#costs circle.point");
  var expected = 0;
  names.forEach(function (name) {
    var row = document.querySelector('#summary tr[data-method="' + CSS.escape(name) + '"]');
    if (!row) { throw new Error("no summary row for " + name); }
  });
  document.querySelectorAll("#costs g.method-costs").forEach(function (g) {
    expected += g.querySelectorAll("circle.point").length;
  });
  document.body.setAttribute("data-methods", String(bars.length));
  document.body.setAttribute("data-cost-points", String(points.length));
  document.body.setAttribute("data-method-names", names.join(","));
  document.body.setAttribute("data-drawn", bars.length === names.length && expected === points.length ? "1" : "0");
})();
"""
