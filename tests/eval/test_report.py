"""``report.html``: one file that fetches nothing, drawn in a real headless Chromium with
every method's score and cost distribution, and no console error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlm_graph.eval import run_eval
from rlm_graph.eval.page import render_eval_page
from rlm_graph.eval.stats import summarize
from tests.support.chromium import needs_chromium, open_in_chromium
from tests.support.eval import EvalServer, items, rlm_kwargs


def _row(item: str, prediction: str) -> dict[str, object]:
    return {
        "id": item,
        "method": "base",
        "score": 1.0,
        "cost": 0.01,
        "latency_s": 1.0,
        "stop_reason": None,
        "error": None,
        "prediction": prediction,
    }


def test_the_page_fetches_nothing_and_cannot_be_broken_out_of() -> None:
    rows = [_row("<x>", "</script><script>alert(1)</script>")]
    summary = summarize(rows, methods=["base"], seed=0, title="<b>t</b>")
    page = render_eval_page(summary, rows, root_model="m", sub_model="m")
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", page)
    assert "<b>t</b>" not in page and "&lt;b&gt;t&lt;/b&gt;" in page
    assert page.count("<script") == 2 and "alert(1)" in page  # escaped, in the rows table
    data = re.search(r'<script type="application/json" id="eval-data">(.*?)</script>', page, re.S)
    assert data is not None and json.loads(data.group(1))["summary"]["title"] == "<b>t</b>"


@needs_chromium
@pytest.mark.browser
def test_the_report_draws_every_method_in_chromium_without_a_console_error(tmp_path: Path) -> None:
    methods = ["rlm", "rlm-no-subcalls", "base", "summary"]
    with EvalServer(constant=True, cost_per_call=None) as server:
        run_eval(items(fail=("c1",)), rlm_kwargs(server), methods=methods, out=tmp_path / "run")
    page = tmp_path / "run" / "report.html"
    body, console = open_in_chromium(page, tmp_path)
    assert console == [] and body["data-errors"] == "0"
    assert body["data-drawn"] == "1"
    assert body["data-methods"] == "4" and body["data-method-names"] == ",".join(methods)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    costs = sum(
        1
        for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()
        if json.loads(line)["cost"] is not None
    )
    assert int(body["data-cost-points"]) == costs > 0
    assert all(summary["methods"][name]["n"] == 6 for name in methods)


def test_a_prediction_holding_a_placeholders_text_is_shown_as_written() -> None:
    """The page was filled by chained replaces: a prediction (or a title) holding a later
    placeholder's text, ``__COUNT__``, had it replaced by the page's own content."""
    rows = [
        {
            **_row("<x>", "</script>"),
            "id": "q-1",
            "score": 0.0,
            "prediction": "__COUNT__ and __ROWS__",
        }
    ]
    summary = summarize(rows, methods=["base"], seed=0, title="t __MODELS__")
    page = render_eval_page(summary, rows, root_model="m", sub_model="m")
    assert '<td class="text">__COUNT__ and __ROWS__</td>' in page
    assert "<h1>t __MODELS__</h1>" in page
    assert "Every row (1)" in page
