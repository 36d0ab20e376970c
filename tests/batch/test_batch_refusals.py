"""What `rlm-graph batch` refuses before anything runs (exit 2, --output untouched), and
what it refuses to write to, over the fake OpenAI server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rlm_graph.cli import main
from tests.support.batch import KEY, BatchServer, items, local_cli_args, read_lines, write_items


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def test_a_journal_that_cannot_be_made_is_refused_before_any_item_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_items(tmp_path / "in.jsonl", items(3))
    out = tmp_path / "out.jsonl"
    with BatchServer() as server:
        bad = local_cli_args(server, tmp_path, "--journal", str(tmp_path / "no" / "j.sqlite"))
        assert main(bad) == 2
        assert server.requests == []
        assert "the folder" in capsys.readouterr().err
        assert not out.exists()  # no failed rows that a rerun would count as done
        good = local_cli_args(server, tmp_path, "--journal", str(tmp_path / "j.sqlite"))
        assert main(good) == 0
    err = capsys.readouterr().err
    assert "already in" not in err and "3 answered" in err
    assert sorted(line["id"] for line in read_lines(out)) == ["item-0", "item-1", "item-2"]


@pytest.mark.parametrize("same_as", ["--output", "--input"])
def test_a_journal_that_is_the_output_or_the_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], same_as: str
) -> None:
    write_items(tmp_path / "in.jsonl", items(2))
    path = tmp_path / ("out.jsonl" if same_as == "--output" else "in.jsonl")
    before = path.read_bytes() if path.exists() else None
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path, "--journal", str(path))) == 2
        assert server.requests == []
    assert f"--journal must not be the {same_as} file" in capsys.readouterr().err
    assert (path.read_bytes() if path.exists() else None) == before  # not made SQLite


def test_a_journal_that_is_another_database_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_items(tmp_path / "in.jsonl", items(2))
    other = tmp_path / "app.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    db.close()
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path, "--journal", str(other))) == 2
        assert server.requests == []
    assert "not an rlm-graph journal" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
    with sqlite3.connect(other) as db:  # the other application's file, as it was
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["notes"]
    db.close()


@pytest.mark.parametrize("depth", [300, 985])
def test_an_item_nested_too_deep_is_refused_with_its_line_before_any_item_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    lines = [json.dumps(item) for item in items(4)]
    lines[2] = '{"id": "deep", "query": "q", "context": {"k": %s}}' % ("[" * depth + "]" * depth)
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path)) == 2
        assert server.requests == []
    err = capsys.readouterr().err
    assert "in.jsonl:3: nested more than 200 arrays and objects deep" in err
    assert not (tmp_path / "out.jsonl").exists()  # the same verdict at each reading


@pytest.mark.processes
def test_a_line_cut_inside_a_string_of_escapes_is_refused_without_reading_it_again_and_again(
    tmp_path: Path,
) -> None:
    """A line cut inside a string full of escaped quotes (a JSON document held as text)
    was read again from each escaped quote: 16 s of CPU for 76 KB, hours for a megabyte.
    Run in a process of its own: a regression fails by the timeout, not by a hung suite."""
    document = json.dumps([json.dumps({"a": [1, {"b": 'x"y'}]})] * 30_000)
    line = json.dumps({"id": "cut", "query": "q", "context": document})
    lines = [json.dumps(item) for item in items(2)] + [line[: len(line) // 2]]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    with BatchServer() as server:
        done = subprocess.run(
            [sys.executable, "-m", "rlm_graph.cli", *local_cli_args(server, tmp_path)],
            env={**os.environ, "OPENAI_API_KEY": KEY},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert server.requests == []
    assert done.returncode == 2
    assert "in.jsonl:3: not JSON" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_an_items_budget_on_a_model_with_no_price_is_refused_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = items(3)
    batch[1]["max_budget"] = 0.5
    write_items(tmp_path / "in.jsonl", batch)
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path)) == 2
        assert server.requests == []
        err = capsys.readouterr().err
        assert "in.jsonl:2: max_budget=$0.5 cannot be kept: no price is known" in err
        assert "--price INPUT OUTPUT" in err
        assert not (tmp_path / "out.jsonl").exists()
        assert main(local_cli_args(server, tmp_path, "--price", "1", "2")) == 0  # priced: kept
    assert len(read_lines(tmp_path / "out.jsonl")) == 3


def test_the_price_hint_follows_the_line_that_needs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = items(2)
    batch[0]["max_budget"] = 0.5
    batch[1]["max_iterations"] = 0
    write_items(tmp_path / "in.jsonl", batch)
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path)) == 2
    lines = capsys.readouterr().err.splitlines()
    first = next(line for line in lines if "in.jsonl:1:" in line)
    second = next(line for line in lines if "in.jsonl:2:" in line)
    assert first.endswith("[on the command line: --price INPUT OUTPUT (USD per million tokens)]")
    assert "--price" not in second


def test_an_output_of_a_dash_is_refused_not_made_a_file_named_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--output -`` ran the batch into a file literally named ``-`` (exit 0), while
    ``--input -`` was refused."""
    write_items(tmp_path / "in.jsonl", items(2))
    monkeypatch.chdir(tmp_path)
    with BatchServer() as server:
        args = local_cli_args(server, tmp_path)
        args[args.index("--output") + 1] = "-"
        assert main(args) == 2
        assert server.requests == []
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--output '-' would be a file named '-', not stdout" in line
    assert not (tmp_path / "-").exists()
