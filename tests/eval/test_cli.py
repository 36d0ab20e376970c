"""``rlm-graph eval`` on the command line, against a fake OpenAI server over real HTTP."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.cli import main
from rlm_graph.testing import FakeOpenAIServer
from tests.support.eval import KEY, MODEL, EvalServer, items


def _args(server: FakeOpenAIServer, out: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--model",
        MODEL,
        "--base-url",
        server.base_url,
        "--api-key-env",
        "OPENAI_API_KEY",
        "--environment",
        "local",
        "--out",
        str(out),
        *extra,
    ]


def _data(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def test_a_data_file_gives_the_four_outputs_and_the_same_command_again_asks_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, out = _data(tmp_path, items()), tmp_path / "run"
    with EvalServer(constant=True) as server:
        assert (
            main(_args(server, out, "--data", str(data), "--method", "rlm,base", "--seed", "3"))
            == 0
        )
        asked = len(server.requests)
        first = capsys.readouterr()
        summary = json.loads((out / "summary.json").read_text())
        assert (
            main(_args(server, out, "--data", str(data), "--method", "rlm,base", "--seed", "3"))
            == 0
        )
        assert len(server.requests) == asked > 0
    again = capsys.readouterr()
    assert json.loads((out / "summary.json").read_text()) == summary
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("journal")) == [
        "models.json",
        "report.html",
        "results.jsonl",
        "summary.json",
        "summary.md",
    ]
    assert set(summary["methods"]) == {"rlm", "base"}
    assert set(summary["methods"]["rlm"]) >= {"n", "score", "ci95", "cost", "latency_s"}
    assert (
        "| RLM | 37.98 ($" in first.out and "| Base model | 37.98 ($" in first.out
    )  # the table on stdout
    assert "estimated cost $" in first.err and first.err.count("/12] ") == 12
    assert "12 already in" in again.err and "wrote 0 rows" in again.err


def test_a_task_is_generated_and_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    find = "import re\nanswer['content'] = re.search(r'magic number for \\S+ is (\\d+)', context).group(1)\nanswer['ready'] = True"

    def needle(body: dict[str, Any]) -> str:
        if any(m["role"] == "system" for m in body["messages"]):
            return f"```repl\n{find}\n```"
        found = re.search(r"magic number for \S+ is (\d+)", json.dumps(body))
        return found.group(1) if found else "?"

    with FakeOpenAIServer(needle) as server:
        code = main(
            _args(
                server,
                tmp_path / "sniah",
                "--task",
                "sniah",
                "--lengths",
                "1k,2k",
                "--n",
                "2",
                "--method",
                "rlm,base",
                "--quiet",
            )
        )
    assert code == 0
    summary = json.loads((tmp_path / "sniah" / "summary.json").read_text())
    assert summary["methods"]["rlm"]["n"] == 4 and summary["methods"]["rlm"]["score"] == 1.0
    assert summary["methods"]["base"]["score"] == 1.0
    assert "sniah (1k, 2k; seed 0)" in summary["title"]
    assert "/4] " not in capsys.readouterr().err  # --quiet


def test_an_estimate_runs_nothing_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EvalServer() as server:
        code = main(
            _args(
                server,
                tmp_path / "est",
                "--task",
                "sniah",
                "--lengths",
                "64k",
                "--n",
                "3",
                "--method",
                "rlm,base,summary",
                "--estimate",
                "--max-budget",
                "2",
            )
        )
        assert server.requests == []
    assert code == 0 and not (tmp_path / "est").exists()
    err = capsys.readouterr().err
    assert "3 items (" in err and "x 3 methods; 9 to run" in err
    assert re.search(
        r"estimated cost \$\d+\.\d\d \(rlm \$\d+\.\d\d, base \$\d+\.\d\d, summary \$\d+\.\d\d\)",
        err,
    )
    assert "--max-budget $2.00 holds across the whole evaluation" in err


def test_an_estimate_with_an_unpriced_model_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def estimate(*models: str) -> str:
        args = _args(server, tmp_path / "est", "--task", "sniah", "--lengths", "8k", "--n", "2")
        args[args.index(MODEL)] = models[0]
        extra = ["--sub-model", models[1]] if len(models) > 1 else []
        assert main([*args, *extra, "--method", "rlm,base,summary", "--estimate"]) == 0
        return capsys.readouterr().err

    with EvalServer() as server:
        unpriced = estimate("my-local-model")
        mixed = estimate(MODEL, "my-local-model")  # base reads with the priced root model
        assert server.requests == []
    assert unpriced.count("no price in the table") == 1
    assert "estimated cost unknown: a model has no price in the table" in unpriced
    assert "(rlm, base, summary unknown)" in unpriced
    assert mixed.count("no price in the table") == 1
    assert re.search(r"\(rlm, summary unknown; base \$\d+\.\d\d\)", mixed)


def test_exit_codes_say_what_happened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _data(tmp_path, items(fail=("n1",)))
    with EvalServer(cost_per_call=0.01) as server:
        assert main(_args(server, tmp_path / "a", "--data", str(data), "--method", "base")) == 1
        assert "FAILED Provider" in capsys.readouterr().err
        # The same command again asks nothing, and still says the evaluation has a failed row.
        before = len(server.requests)
        assert main(_args(server, tmp_path / "a", "--data", str(data), "--method", "base")) == 1
        assert len(server.requests) == before
        assert (
            main(
                _args(
                    server,
                    tmp_path / "b",
                    "--data",
                    str(data),
                    "--method",
                    "base",
                    "--concurrency",
                    "1",
                    "--max-budget",
                    "0.025",
                )
            )
            == 3
        )
        assert "rerun with a larger --max-budget" in capsys.readouterr().err
        asked = len(server.requests)
        assert main(_args(server, tmp_path / "c", "--data", str(data), "--method", "rlm,best")) == 2
        assert "unknown eval method 'best'; registered: base, rlm" in capsys.readouterr().err
        assert main(["eval", "--model", MODEL, "--data", str(data), "--method", "base"]) == 2
        assert "--out DIR is missing" in capsys.readouterr().err
        assert main(_args(server, tmp_path / "d", "--data", str(data), "--task", "sniah")) == 2
        assert "give one of --task NAME and --data FILE.jsonl" in capsys.readouterr().err
        assert len(server.requests) == asked  # none of the refused commands asked anything
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "results.jsonl").write_text('{"id": "q-1", "answer": "from a batch"}\n')
    assert main(_args(server, tmp_path / "e", "--data", str(data), "--method", "base")) == 2
    assert "is not a row of rlm-graph eval" in capsys.readouterr().err
    batch_line = '{"id": "q-1", "answer": "from a batch"}'  # whole, with no newline
    (tmp_path / "e" / "results.jsonl").write_text(batch_line)
    assert main(_args(server, tmp_path / "e", "--data", str(data), "--method", "base")) == 2
    assert "is not a results file" in capsys.readouterr().err
    assert (tmp_path / "e" / "results.jsonl").read_text() == batch_line  # neither cut nor added to


def test_a_budget_over_an_unpriced_model_names_the_command_lines_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EvalServer() as server:
        args = _args(server, tmp_path / "out", "--task", "sniah", "--lengths", "8k", "--n", "1")
        args[args.index(MODEL)] = "my-local-model"
        assert main([*args, "--max-budget", "1"]) == 2
        assert server.requests == []
    err = capsys.readouterr().err
    assert "no price is known for 'my-local-model'" in err and "--price INPUT OUTPUT" in err


def test_a_bad_concurrency_or_executor_is_refused_before_out_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """They were refused by the first batch, after ``--out`` had been made and
    ``results.jsonl`` and ``models.json`` written in it."""
    data = _data(tmp_path, items())
    with EvalServer() as server:
        for extra, error in (
            (["--concurrency", "0"], "concurrency must be a positive integer, not 0"),
            (["--executor", "nope"], "unknown executor 'nope'; registered: local"),
        ):
            out = tmp_path / extra[1]
            assert main(_args(server, out, "--data", str(data), *extra)) == 2
            assert error in capsys.readouterr().err
            assert not out.exists()
        assert server.requests == []


def test_items_from_a_pipe_are_refused_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--data`` is read more than once (checked whole, then run): a pipe was read whole
    by the check and then said to hold no item (``-`` was looked for as a file)."""
    fifo = tmp_path / "items.fifo"
    os.mkfifo(fifo)  # opening it for reading would block: it is refused unopened
    with EvalServer() as server:
        for data in ("-", str(fifo)):
            assert main(_args(server, tmp_path / "out", "--data", data)) == 2
            err = capsys.readouterr().err
            assert f"--data {data!r} is not a regular file" in err
            assert "save them to a file first (... > items.jsonl)" in err
        assert server.requests == []
    assert not (tmp_path / "out").exists()


def test_a_budget_cut_evaluation_says_how_many_items_were_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The score of an evaluation the budget cut is over the items that ran; it was shown
    as if over every item, with no word of those not run."""
    data, out = _data(tmp_path, items()), tmp_path / "cut"
    with EvalServer(cost_per_call=0.01) as server:
        args = _args(server, out, "--data", str(data), "--method", "base", "--concurrency", "1")
        assert main([*args, "--max-budget", "0.035"]) == 3
        cut = capsys.readouterr()
        assert main([*args, "--max-budget", "1"]) == 0
        done = capsys.readouterr()
    # Calls start at $0, $0.01, $0.02 and $0.03: four of the six items ran.
    assert "base: 100.0% [" in cut.err and "] over 4 of 6 items, 2 not run" in cut.err
    assert "| Base model | 100.00† ($0.01 ± $0.00) |" in cut.out
    assert "† scored over the items that ran (Base model over 4 of 6 items, 2 not run)" in cut.out
    assert re.search(r"\| base \| 4 \| 100\.00 \|.*\| 0 \| 0 \| 2 \|", cut.out)
    assert json.loads((out / "summary.json").read_text())["methods"]["base"]["not_run"] == 0
    assert "over 6 items" in done.err and "not run" not in done.err and "†" not in done.out
