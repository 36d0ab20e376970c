"""Evaluations end to end, in Python, against a fake OpenAI server over real HTTP: scores
as the formulas give them, resume, failures, the budget, the methods and their plugins."""

from __future__ import annotations

import json
import math
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import hookimpl
from rlm_graph.errors import ConfigError, PluginError
from rlm_graph.eval import Call, EvalItem, MethodSetup, NotRun, item_call, run_eval
from rlm_graph.testing import FakeOpenAIServer
from tests.support.eval import CONSTANT_SCORES, KEY, EvalServer, items, rlm_kwargs

METHODS = ["rlm", "rlm-no-subcalls", "base", "summary"]


def _rows(out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {(row["id"], row["method"]): row for row in rows}


def test_an_oracle_scores_one_under_every_method(tmp_path: Path) -> None:
    with EvalServer() as server:
        outcome = run_eval(
            items(), rlm_kwargs(server), methods=METHODS, out=tmp_path, concurrency=3
        )
    assert outcome.written == 6 * 4 and outcome.errors == 0 and outcome.unfinished == 0
    for name in METHODS:
        summary = outcome.summary.methods[name]
        assert (summary.n, summary.score, summary.ci95) == (6, 1.0, (1.0, 1.0))
    rows = _rows(tmp_path)
    assert len(rows) == 24 and all(row["score"] == 1.0 for row in rows.values())
    assert set(rows["n1", "rlm"]) == {
        "id",
        "method",
        "prediction",
        "score",
        "cost",
        "latency_s",
        "input_tokens",
        "output_tokens",
        "stop_reason",
        "error",
        "asked",
    }
    assert rows["n1", "base"]["cost"] > 0 and rows["n1", "base"]["input_tokens"] > 0


def test_a_constant_answer_scores_what_the_formulas_give_and_the_interval_brackets_it(
    tmp_path: Path,
) -> None:
    with EvalServer(constant=True) as server:
        outcome = run_eval(
            items(), rlm_kwargs(server), methods=["rlm", "base"], out=tmp_path, seed=5
        )
    rows = _rows(tmp_path)
    for (item_id, _), row in rows.items():
        assert math.isclose(row["score"], CONSTANT_SCORES[item_id]), (item_id, row)
    expected = sum(CONSTANT_SCORES.values()) / len(CONSTANT_SCORES)
    for name in ("rlm", "base"):
        summary = outcome.summary.methods[name]
        assert summary.score is not None and math.isclose(summary.score, expected)
        assert summary.ci95 is not None and summary.ci95[0] < summary.score < summary.ci95[1]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["methods"]["base"]["ci95"] == list(outcome.summary.methods["base"].ci95 or ())
    assert set(on_disk["methods"]["base"]["cost"]) == {"mean", "median", "p95"}
    assert set(on_disk["methods"]["base"]["latency_s"]) == {"median", "p95"}


def test_a_rerun_asks_nothing_twice_and_gives_the_same_summary(tmp_path: Path) -> None:
    with EvalServer(constant=True) as server:
        first = run_eval(
            items(), rlm_kwargs(server), methods=["rlm", "base", "summary"], out=tmp_path, seed=2
        )
        asked = len(server.requests)
        second = run_eval(
            items(), rlm_kwargs(server), methods=["rlm", "base", "summary"], out=tmp_path, seed=2
        )
        assert len(server.requests) == asked  # not one request more
    assert asked > 0 and second.written == 0
    assert second.summary == first.summary
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 18


def test_a_run_cut_short_resumes_where_it_stopped(tmp_path: Path) -> None:
    with EvalServer() as server:
        run_eval(items()[:2], rlm_kwargs(server), methods=["base"], out=tmp_path)
        first = len(server.requests)
        outcome = run_eval(items(), rlm_kwargs(server), methods=["base"], out=tmp_path)
    assert first == 2 and len(server.requests) == 6  # only the four items not done yet
    assert outcome.written == 4 and outcome.summary.methods["base"].n == 6


def test_a_failing_provider_is_recorded_for_its_items_and_the_others_finish(tmp_path: Path) -> None:
    with EvalServer() as server:
        outcome = run_eval(
            items(fail=("n2", "c1")), rlm_kwargs(server), methods=["rlm", "summary"], out=tmp_path
        )
    rows = _rows(tmp_path)
    assert outcome.errors == 4 and len(rows) == 12
    for key, row in rows.items():
        if key[0] in ("n2", "c1"):
            assert row["prediction"] is None and row["score"] == 0.0
            assert (
                row["error"]["type"].startswith("Provider") and KEY not in row["error"]["message"]
            )
        else:
            assert row["error"] is None and row["score"] == 1.0
    assert outcome.summary.methods["rlm"].errors == 2
    assert math.isclose(outcome.summary.methods["rlm"].score or 0, 4 / 6)
    # A rerun leaves failures alone; retry_failed asks them again (and they fail again).
    with EvalServer() as server:
        run_eval(items(fail=("n2", "c1")), rlm_kwargs(server), methods=["rlm"], out=tmp_path)
        assert server.requests == []
        run_eval(
            items(fail=("n2", "c1")),
            rlm_kwargs(server),
            methods=["rlm"],
            out=tmp_path,
            retry_failed=True,
        )
        assert sorted(server.asked) == ["c1", "n2"]


def test_the_budget_holds_across_the_evaluation_and_a_larger_one_finishes_it(
    tmp_path: Path,
) -> None:
    with EvalServer(cost_per_call=0.01, turns=2) as server:  # $0.02 an item: two root turns
        kwargs = rlm_kwargs(server)
        cut = run_eval(
            items(), kwargs, methods=["rlm"], out=tmp_path, concurrency=1, max_budget=0.025
        )
        # n1 starts at $0 and costs $0.02; n2 starts at $0.02 with $0.005 left, and its
        # first turn ($0.01) passes that: the engine stops it. Nothing starts after.
        assert len(server.requests) == 3 and math.isclose(cut.spent, 0.03)
        assert cut.written == 1 and cut.unfinished == 5
        assert list(_rows(tmp_path)) == [("n1", "rlm")]  # n2, cut by the budget, is not written
        done = run_eval(
            items(), kwargs, methods=["rlm"], out=tmp_path, concurrency=1, max_budget=1.0
        )
    # n2's first turn replays from the journal: one request for it, two for each of the rest.
    assert len(server.requests) == 3 + 1 + 4 * 2
    assert done.unfinished == 0 and done.summary.methods["rlm"].n == 6
    assert all(row["score"] == 1.0 for row in _rows(tmp_path).values())


def test_a_single_call_that_passes_the_budget_keeps_its_answer(tmp_path: Path) -> None:
    with EvalServer(cost_per_call=0.01) as server:
        cut = run_eval(
            items(),
            rlm_kwargs(server),
            methods=["base"],
            out=tmp_path,
            concurrency=1,
            max_budget=0.035,
        )
        # Calls start while less than $0.035 is spent: at $0, $0.01, $0.02 and $0.03. The
        # last passes the budget by one call, the bound with one call at a time.
        assert len(server.requests) == 4 and math.isclose(cut.spent, 0.04)
    assert cut.written == 4 and cut.unfinished == 2


def test_max_budget_needs_a_price_for_every_model(tmp_path: Path) -> None:
    with EvalServer() as server:
        kwargs = rlm_kwargs(server)
        kwargs["backend_kwargs"] = {**kwargs["backend_kwargs"], "model_name": "no-such-price"}
        with pytest.raises(ConfigError, match="no price is known for 'no-such-price'"):
            run_eval(items(), kwargs, methods=["base"], out=tmp_path, max_budget=1.0)
        assert server.requests == []


def test_an_unknown_method_fails_before_any_request_naming_the_registered_ones(
    tmp_path: Path,
) -> None:
    with EvalServer() as server:
        with pytest.raises(
            PluginError,
            match="unknown eval method 'rlm-v2'; registered: base, rlm, rlm-no-subcalls, summary",
        ):
            run_eval(items(), rlm_kwargs(server), methods=["rlm", "rlm-v2"], out=tmp_path)
        assert server.requests == []
    assert not (tmp_path / "results.jsonl").exists()


def test_base_says_does_not_fit_only_when_the_window_is_known_and_exceeded(tmp_path: Path) -> None:
    long = items(context="x" * 8000)
    with EvalServer() as server:
        small = run_eval(
            long,
            rlm_kwargs(server, models={"gpt-5-mini": {"context_window": 1000}}),
            methods=["base"],
            out=tmp_path / "small",
        )
        assert server.requests == []
        unknown = rlm_kwargs(server)
        unknown["backend_kwargs"] = {**unknown["backend_kwargs"], "model_name": "some-local-model"}
        run_eval(long, unknown, methods=["base"], out=tmp_path / "unknown")
        assert len(server.requests) == 6
    row = _rows(tmp_path / "small")["n1", "base"]
    assert (row["stop_reason"], row["prediction"], row["score"], row["error"]) == (
        "does_not_fit",
        None,
        0.0,
        None,
    )
    assert small.summary.methods["base"].does_not_fit == 6
    assert "Base model | 0.00* (N/A)" in (tmp_path / "small" / "summary.md").read_text()


def test_rlm_no_subcalls_runs_a_repl_without_llm_query(tmp_path: Path) -> None:
    probe = "answer['content'] = str(sorted(n for n in ('llm_query', 'rlm_query') if n in globals()))\nanswer['ready'] = True"
    with EvalServer(root_code=probe) as server:
        run_eval(items()[:1], rlm_kwargs(server), methods=["rlm", "rlm-no-subcalls"], out=tmp_path)
        systems = [
            m["content"]
            for body in server.bodies
            for m in body["messages"]
            if m["role"] == "system"
        ]
    rows = _rows(tmp_path)
    assert rows["n1", "rlm"]["prediction"] == "['llm_query', 'rlm_query']"
    assert rows["n1", "rlm-no-subcalls"]["prediction"] == "[]"
    assert any("no `llm_query`" in s for s in systems) and any(
        "`llm_query(prompt" in s for s in systems
    )


def test_the_summary_agent_reads_chunk_by_chunk_with_the_sub_model_and_answers_with_the_root(
    tmp_path: Path,
) -> None:
    with EvalServer() as server:
        kwargs = rlm_kwargs(server, models={"gpt-5-nano": {"context_window": 4096}})
        kwargs["other_backends"] = ["openai"]
        kwargs["other_backend_kwargs"] = [{**kwargs["backend_kwargs"], "model_name": "gpt-5-nano"}]
        one = [{**items()[0], "context": "\n".join(f"line {i} of the record" for i in range(2000))}]
        run_eval(one, kwargs, methods=["summary"], out=tmp_path)
        bodies = server.bodies
    steps = [b for b in bodies if b["model"] == "gpt-5-nano"]
    finals = [b for b in bodies if b["model"] == "gpt-5-mini"]
    assert len(steps) >= 3 and len(finals) == 1
    assert "Your notes so far:\n(none yet)" in steps[0]["messages"][-1]["content"]
    assert "Your notes so far:\nnotes on [item:n1]" in steps[1]["messages"][-1]["content"]
    assert f"part 1 of {len(steps)}" in steps[0]["messages"][-1]["content"]
    assert finals[0]["messages"][-1]["content"].endswith("notes on [item:n1]")
    assert _rows(tmp_path)["n1", "summary"]["score"] == 1.0


class TwoTries:
    """A method of a plugin: asks twice, keeps the second answer; skips items marked 'skip'."""

    name = "two-tries"
    description = "asks, then asks again with its first answer"

    def rlm_kwargs(self, setup: MethodSetup) -> dict[str, dict[str, Any]]:
        return {"root": setup.root_kwargs(max_depth=0)}

    def solve(self, item: EvalItem, setup: MethodSetup) -> Generator[Call, str, str | NotRun]:
        if "skip" in item.meta:
            return NotRun(stop_reason="skipped", note="marked skip")
        first = yield item_call(item)
        return (yield item_call(item, f"{item.question} You said {first!r} before; answer again."))

    def estimate(self, item: EvalItem, tokens: int, setup: MethodSetup) -> float | None:
        return 0.0


class TwoTriesPlugin:
    @hookimpl
    def rlm_register_eval_methods(self) -> dict[str, Any]:
        return {"two-tries": TwoTries}


def test_a_method_registered_in_code_is_run_like_the_first_party_ones(tmp_path: Path) -> None:
    data = items()[:3]
    data[2] = {**data[2], "meta": {"skip": True}}
    with EvalServer() as server:
        outcome = run_eval(
            data,
            rlm_kwargs(server),
            methods=["two-tries"],
            out=tmp_path,
            plugins=[TwoTriesPlugin()],
        )
        assert len(server.requests) == 4 and "answer again" in json.dumps(server.bodies[-1])
    rows = _rows(tmp_path)
    assert (
        rows["n1", "two-tries"]["score"] == 1.0
        and rows["n3", "two-tries"]["stop_reason"] == "skipped"
    )
    assert outcome.summary.methods["two-tries"].n == 3


def test_a_bad_keyword_of_a_method_fails_at_configuration(tmp_path: Path) -> None:
    with EvalServer() as server:
        with pytest.raises(
            ConfigError, match="method 'rlm' \\(root\\): RLM\\(\\) got unknown keyword"
        ):
            run_eval(items(), rlm_kwargs(server, max_iteratons=3), methods=["rlm"], out=tmp_path)


@pytest.mark.ray
def test_the_ray_executor_runs_an_evaluation_and_a_rerun_asks_nothing(
    ray_cluster: Any, tmp_path: Path
) -> None:
    with EvalServer(constant=True, cost_per_call=0.01) as server:
        kwargs = rlm_kwargs(server)
        outcome = run_eval(
            items(),
            kwargs,
            methods=["rlm", "summary"],
            out=tmp_path,
            executor="ray",
            concurrency=4,
            max_budget=1.0,
        )
        asked = len(server.requests)
        again = run_eval(
            items(),
            kwargs,
            methods=["rlm", "summary"],
            out=tmp_path,
            executor="ray",
            concurrency=4,
            max_budget=1.0,
        )
        assert len(server.requests) == asked == 6 + 12  # one root turn; one note and one answer
    assert again.written == 0 and outcome.written == 12 and math.isclose(outcome.spent, 0.18)
    for (item_id, _), row in _rows(tmp_path).items():
        assert math.isclose(row["score"], CONSTANT_SCORES[item_id])


def test_a_rerun_with_other_models_into_the_same_out_is_refused(tmp_path: Path) -> None:
    with EvalServer(constant=True) as server:
        run_eval(items(), rlm_kwargs(server), methods=["base"], out=tmp_path)
        other = rlm_kwargs(server)
        other["backend_kwargs"] = {**other["backend_kwargs"], "model_name": "another-model"}
        with pytest.raises(
            ConfigError, match="holds the results of root model .*this run asks 'another-model'"
        ):
            run_eval(items(), other, methods=["base"], out=tmp_path)
        again = run_eval(items(), rlm_kwargs(server), methods=["base"], out=tmp_path)
    assert again.written == 0  # the same models resume, as before
    assert json.loads((tmp_path / "summary.json").read_text())["models"]["root"] != "another-model"


def test_a_reply_with_half_a_character_is_kept_and_a_rerun_asks_nothing(tmp_path: Path) -> None:
    """A reply cut inside an emoji (a lone surrogate from its JSON ``\\ud83d``) failed the
    write of its row with a traceback, and every rerun replayed it and failed again."""
    lines = [
        {"id": f"q{i}", "question": "Q", "answer": "7", "answer_type": "exact", "context": "x"}
        for i in range(2)
    ]
    with FakeOpenAIServer(lambda body: "7 \ud83d") as server:
        first = run_eval(lines, rlm_kwargs(server), methods=["base"], out=tmp_path)
        second = run_eval(lines, rlm_kwargs(server), methods=["base"], out=tmp_path)
        asked = len(server.requests)
    assert (first.written, second.written, asked) == (2, 0, 2)
    rows = _rows(tmp_path)
    assert rows["q0", "base"]["prediction"] == "7 \ufffd"


def test_an_item_that_asks_something_else_now_is_asked_again_and_a_corrected_answer_rescored(
    tmp_path: Path,
) -> None:
    """A rerun reused a row of the same id made for another item (a task made with
    another --seed, an edited file): no request, and the old answer scored against the
    new gold. Now the changed item is asked again, and a corrected gold answer rescores
    the kept prediction without asking."""
    with EvalServer() as server:
        first = run_eval(items(), rlm_kwargs(server), methods=["base"], out=tmp_path)
        asked = len(server.requests)
        changed = [dict(item) for item in items()]
        changed[0]["question"] += " (reworded)"
        changed[4]["answer"] = "another gold answer"  # e1, an exact answer
        second = run_eval(changed, rlm_kwargs(server), methods=["base"], out=tmp_path)
        assert len(server.requests) == asked + 1  # the reworded item only
    assert first.summary.methods["base"].score == 1.0
    assert second.written == 1 and second.summary.methods["base"].n == 6
    assert math.isclose(second.summary.methods["base"].score, 5 / 6)  # e1 rescored: 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows].count(changed[0]["id"]) == 2  # the old row is kept, unused


def test_a_run_cut_before_its_summary_still_refuses_other_models(tmp_path: Path) -> None:
    """``summary.json`` is written when a run ends: a run cut short (Ctrl-C) left rows
    and no summary, and a rerun with another model counted them as its own."""
    with EvalServer(constant=True) as server:
        run_eval(items()[:2], rlm_kwargs(server), methods=["base"], out=tmp_path)
        (tmp_path / "summary.json").unlink()  # as a run cut short leaves its folder
        other = rlm_kwargs(server)
        other["backend_kwargs"] = {**other["backend_kwargs"], "model_name": "another-model"}
        with pytest.raises(ConfigError, match="holds the results of root model"):
            run_eval(items(), other, methods=["base"], out=tmp_path)


def test_costs_past_the_largest_float_keep_the_files_json_and_a_rerun_asks_nothing(
    tmp_path: Path,
) -> None:
    # A server reports usage.cost=1e308 per call: each is finite, two of them are not.
    with EvalServer(cost_per_call=1e308, turns=2) as server:
        first = run_eval(items(), rlm_kwargs(server), methods=["rlm", "base"], out=tmp_path)
        asked = len(server.requests)
        again = run_eval(items(), rlm_kwargs(server), methods=["rlm", "base"], out=tmp_path)
        assert len(server.requests) == asked and again.written == 0

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda word: pytest.fail(f"{word} in JSON"))

    rows = [strict(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {row["cost"] for row in rows if row["method"] == "rlm"} == {None}  # two calls
    assert {row["cost"] for row in rows if row["method"] == "base"} == {1e308}
    summary = strict((tmp_path / "summary.json").read_text())
    assert summary["methods"]["base"]["cost"]["mean"] == pytest.approx(1e308)
    assert first.summary == again.summary


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"cost": float("nan")}, "cost: Input should be a finite number"),
        ({"cost": "0.1 USD"}, "cost: Input should be a valid number"),
        ({"error": "boom"}, "error: Input should be a valid dictionary"),
        ({"score": 1.0, "prediction": None}, "the row: an item without a prediction (or with"),
        ({"score": 7.0}, "score: Input should be less than or equal to 1"),
    ],
)
def test_a_row_no_evaluation_writes_is_refused_naming_its_line_and_the_fix(
    tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    with EvalServer() as server:
        run_eval(items()[:2], rlm_kwargs(server), methods=["base"], out=tmp_path)
        results = tmp_path / "results.jsonl"
        first, second = results.read_text().splitlines()
        results.write_text(f"{first}\n{json.dumps({**json.loads(second), **change})}\n")
        asked = len(server.requests)
        with pytest.raises(ConfigError) as refused:
            run_eval(items(), rlm_kwargs(server), methods=["base"], out=tmp_path)
        assert len(server.requests) == asked
    assert f"results.jsonl:2: {said}" in str(refused.value)
    assert "correct the line, or delete it to ask that item again" in str(refused.value)
