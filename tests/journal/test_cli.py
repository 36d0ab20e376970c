"""``rlm-graph run --journal``, ``journal ls`` and ``trace export`` of a journal run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlm_graph.cli import main
from rlm_graph.testing import FakeOpenAIServer, last_user_message
from tests.support.report_page import run_page_script

KEY = "sk-test-journal-cli"


def respond(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    if any(m.get("role") == "system" for m in messages):
        return '```repl\nFINAL(llm_query("sub") + " over " + str(len(context)))\n```'
    return "ANSWER:" + last_user_message(body)


def test_run_twice_over_a_journal_then_list_and_export_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    context = tmp_path / "context.txt"
    context.write_text("x" * 99, encoding="utf-8")
    journal = tmp_path / "run.sqlite"
    with FakeOpenAIServer(respond, api_key=KEY) as server:
        args = [
            "run",
            "--context",
            str(context),
            "--query",
            "what?",
            "--model",
            "gpt-test",
            "--base-url",
            server.base_url,
            "--api-key-env",
            "OPENAI_API_KEY",
            "--journal",
            str(journal),
        ]
        assert main(args) == 0
        asked = len(server.requests)
        assert main(args) == 0
        assert len(server.requests) == asked == 2  # the second run replayed both calls
    out = capsys.readouterr().out
    assert out.splitlines() == ["ANSWER:sub over 99", "ANSWER:sub over 99"]

    assert main(["journal", "ls", str(journal)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["KEY", "KIND", "STATUS", "TRIES", "NODES", "COST"]
    assert table[1].split()[1:5] == ["rlm", "finished", "2", "2"] and table[1].endswith("what?")
    assert main(["journal", "ls", str(journal), "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["status"], row["attempts"], row["nodes"], row["label"]) == (
        "finished",
        2,
        2,
        "what?",
    )

    assert main(["trace", "export", str(journal), "--run", row["key"][:8]]) == 0
    dot = capsys.readouterr().out
    assert '"turn-1" -> "turn-1/block-1";' in dot
    assert '"turn-1/block-1" -> "turn-1/block-1/llm-1" [style=dashed];' in dot
    assert KEY not in journal.read_bytes().decode("utf-8", "replace")

    page = tmp_path / "run.html"
    assert main(["report", str(journal), "-o", str(page)]) == 0
    assert "turn-1/block-1/llm-1" in page.read_text(encoding="utf-8")


def test_bad_journal_arguments_exit_2_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["journal", "ls", str(tmp_path / "missing.sqlite")]) == 2
    assert "no journal at" in capsys.readouterr().err
    empty = tmp_path / "empty.sqlite"
    from rlm_graph.journal import JournalStore

    JournalStore(empty).close()
    assert main(["journal", "ls", str(empty)]) == 0
    assert "no runs yet" in capsys.readouterr().out
    assert main(["trace", "export", str(empty), "--run", "abc"]) == 2
    assert "no run whose key starts with 'abc'" in capsys.readouterr().err


def test_reading_a_journal_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """journal ls and trace export open the file read-only: an empty file or another
    SQLite database is refused and left as it was (ls once wrote a schema into it)."""
    import sqlite3

    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    before = other.read_bytes()
    assert main(["journal", "ls", str(empty)]) == 2
    assert main(["trace", "export", str(other)]) == 2
    assert empty.read_bytes() == b"" and other.read_bytes() == before
    err = capsys.readouterr().err
    assert "is not an rlm-graph journal" in err and "Traceback" not in err


@contextlib.contextmanager
def _unwritable(path: Path) -> Iterator[None]:
    """``path`` (a file or a folder) made one this user may read but not write: by its
    mode, or for root (who writes whatever the mode) by the immutable attribute."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode:
        pytest.skip("root writes any file, and this machine cannot set the immutable attribute")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def _journaled(journal: Path) -> list[str]:
    from rlm_graph import RLM

    RLM(
        "scripted", {"respond": lambda request: "```repl\nFINAL('done')\n```"}, journal=str(journal)
    ).completion("ctx")
    return [p.name for p in journal.parent.iterdir()]


def test_a_journal_this_user_cannot_write_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite opened it read-only without a word, and the run died in its first write
    with sqlite3's traceback (exit 1)."""
    journal = tmp_path / "run.sqlite"
    _journaled(journal)
    context = tmp_path / "context.txt"
    context.write_text("ctx")
    args = ["run", "--context", str(context), "--query", "q", "--backend", "scripted"]
    with _unwritable(journal):
        assert main([*args, "--model", "m", "--journal", str(journal)]) == 2
    err = capsys.readouterr().err
    assert "cannot write journal" in err and "this user may not write it" in err
    assert "Traceback" not in err


def test_a_journal_in_a_folder_this_user_cannot_write_can_be_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "kept"
    folder.mkdir()
    journal = folder / "run.sqlite"
    assert _journaled(journal) == ["run.sqlite"]  # the run ended: no log beside
    with _unwritable(folder):
        assert main(["journal", "ls", str(journal), "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["status"] == "finished" and sorted(p.name for p in folder.iterdir()) == [
        "run.sqlite"
    ]


HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mred\x1b[0m\rFAKE-PROMPT$ "


def _asked(journal: Path, question: str) -> Path:
    from rlm_graph import RLM

    RLM(
        "scripted", {"respond": lambda request: "```repl\nFINAL('done')\n```"}, journal=str(journal)
    ).completion("ctx", root_prompt=question)
    return journal


def test_journal_ls_prints_the_question_without_control_sequences_on_a_terminal(
    tmp_path: Path,
) -> None:
    """The question is untrusted text (a caller's, a document's): it retitled the
    terminal and cleared it."""
    from tests.cli.test_command import _run_on_a_terminal

    journal = _asked(tmp_path / "run.sqlite", HOSTILE)
    status, shown = _run_on_a_terminal(["journal", "ls", str(journal)])
    assert status == 0
    assert b"\x1b" not in shown and b"\x07" not in shown
    assert shown.decode().splitlines()[1].rstrip().endswith("red FAKE-PROMPT$")
    from tests.cli.test_command import rlm_graph

    piped = rlm_graph("journal", "ls", "--json", str(journal))
    assert json.loads(piped.stdout)["label"].startswith("\x1b]0;PWNED")  # JSON: as it was


def test_a_question_holding_a_newline_cannot_forge_a_row(tmp_path: Path) -> None:
    from tests.cli.test_command import rlm_graph

    forged = "harmless\n000000000000  rlm  finished  1  9  $0.0000  2026-01-01 00:00  forged"
    journal = _asked(tmp_path / "run.sqlite", forged + "\ttab")
    done = rlm_graph("journal", "ls", str(journal))
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()  # one run, one row
    assert "harmless 000000000000  rlm  finished" in row
    assert _asked(tmp_path / "tab.sqlite", "a\tb\r\nc").read_bytes()
    done = rlm_graph("journal", "ls", str(tmp_path / "tab.sqlite"))
    assert done.stdout.splitlines()[1].endswith("a b c")


def _malformed(journal: Path) -> Path:
    """``journal`` with its chunks table's root page garbled, as a bad disk leaves it."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(journal)) as db:
        page = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name='chunks'").fetchone()[0]
    data = bytearray(journal.read_bytes())
    data[(root - 1) * page + 8 : (root - 1) * page + 200] = b"\xff" * 192
    damaged = journal.with_name("damaged.sqlite")
    damaged.write_bytes(bytes(data))
    return damaged


def _changed_by_hand(folder: Path, name: str, *statements: str) -> Path:
    import sqlite3

    path = folder / name
    with contextlib.closing(sqlite3.connect(path)) as db:
        for statement in (*statements, "PRAGMA user_version=2"):
            db.execute(statement)
        db.commit()
    return path


RUNS = (
    "CREATE TABLE runs (number INTEGER PRIMARY KEY, key, kind, label, status, attempts, "
    "created, updated, trace_id, span_id, answer)"
)


def test_a_damaged_journal_is_one_line_naming_it_for_every_command(tmp_path: Path) -> None:
    """Each was a traceback of sqlite3 (or a TypeError) and exit 1."""
    from tests.cli.test_command import rlm_graph

    journal = tmp_path / "run.sqlite"
    batch = "```repl\nparts = llm_query_batched(['q%d' % i for i in range(60)])\nFINAL('x')\n```"
    from rlm_graph import RLM

    RLM(
        "scripted",
        {"respond": lambda r: batch if r.depth == 0 else "answer " * 100},
        journal=str(journal),
    ).completion("ctx", root_prompt="q")
    cases = {
        _malformed(journal): "malformed",
        _changed_by_hand(tmp_path, "no-runs.sqlite", "CREATE TABLE t (x)"): "no such table: runs",
        _changed_by_hand(
            tmp_path, "null.sqlite", RUNS, "CREATE TABLE chunks (run, first, attempt, nodes)",
            "INSERT INTO runs VALUES (1, NULL, 'rlm', NULL, NULL, 1, 0, 0, NULL, NULL, NULL)",
        ): "damaged run row (its key is NULL)",
        _changed_by_hand(
            tmp_path, "blob.sqlite", RUNS, "CREATE TABLE chunks (run, first, attempt, nodes)",
            "INSERT INTO runs VALUES (1, 'k', 'rlm', x'ff00', 'finished', 1, 0, 0, NULL, NULL, NULL)",
        ): "damaged run row (its label is bytes)",
    }  # fmt: skip
    for path, says in cases.items():
        for command in (
            ["journal", "ls", str(path)],
            ["report", str(path), "-o", str(tmp_path / "r.html")],
            ["trace", "export", str(path)],
        ):
            done = rlm_graph(*command)
            assert done.returncode == 2, (command, done.stderr)
            (line,) = done.stderr.strip().splitlines()
            assert str(path) in line and says in line, line
            assert "new journal file" in line or "give a new file name" in line, line


def test_reading_a_journal_of_another_format_says_to_start_a_new_one(tmp_path: Path) -> None:
    import sqlite3

    from tests.cli.test_command import rlm_graph

    journal = _asked(tmp_path / "old.sqlite", "q")
    with contextlib.closing(sqlite3.connect(journal)) as db:
        db.execute("PRAGMA user_version=1")
        db.commit()
    for command in (
        ["journal", "ls", str(journal)],
        ["report", str(journal), "-o", str(tmp_path / "r.html")],
    ):
        done = rlm_graph(*command)
        assert done.returncode == 2
        assert (
            "has format 1; this rlm-graph reads format 2: start a new journal file" in done.stderr
        )


@pytest.mark.parametrize(
    ("status", "says"),
    [
        ("stopped", "stopped by max_iterations"),
        ("failed", "failed (an error or Ctrl-C ended it"),
        ("running", "did not finish (it crashed, was killed, or is still running"),
    ],
)
def test_a_report_from_a_journal_says_how_the_run_ended(
    status: str, says: str, tmp_path: Path
) -> None:
    """The journal's run was stopped, failed or never finished; its report showed a clean
    run ("No failed node.", no stop)."""
    from tests.cli.test_command import rlm_graph

    context = tmp_path / "ctx.txt"
    context.write_text("ctx")
    journal = tmp_path / "run.sqlite"
    loop = "```repl\nprint(llm_query('a'))\n```"
    replies = {"stopped": [loop, "x"] * 5, "failed": [loop, "x", loop], "running": []}[status]
    run = ["run", "--backend", "scripted", "--model", "scripted", "--context", str(context)]
    run += ["--query", "q", "--journal", str(journal), "--max-iterations", "2", "-q"]
    rlm_graph(*run, "--backend-kwargs", json.dumps({"responses": replies or [loop, "x"]}))
    if status == "running":  # as a run killed midway leaves it
        import sqlite3

        with contextlib.closing(sqlite3.connect(journal)) as db:
            db.execute("UPDATE runs SET status='running'")
            db.commit()
    ls = rlm_graph("journal", "ls", "--json", str(journal))
    row = json.loads(ls.stdout)
    assert row["status"] == status
    assert row["stop_reason"] == ("max_iterations" if status == "stopped" else None)
    page = tmp_path / "r.html"
    assert rlm_graph("report", str(journal), "-o", str(page)).returncode == 0
    import re

    found = re.search(r'id="run-data">(.*?)</script>', page.read_text(), re.S)
    assert found is not None
    data = json.loads(found.group(1))
    if status == "stopped":  # the journal keeps which limit: said as a live run's report
        assert data["stop_reason"] == "max_iterations" and data["ended"] is None
    else:
        assert data["ended"].startswith(says)
    if shutil.which("node") is not None:  # what the page shows
        shown = run_page_script(page)
        assert f", {says}" in shown["summary"] and "No failed node." not in shown["problems"]
        assert "The run " in shown["problems"][0] and says in shown["problems"][0]


def test_journal_ls_says_which_limit_stopped_a_run_and_an_older_journal_gets_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal kept a stopped run's status, not which limit stopped it. It keeps it now
    (``stopped:max_iterations``); a journal made before that has no such column: it is
    read as it is (the reason unknown), and a run that writes to it adds the column."""
    import sqlite3

    from rlm_graph import RLM

    journal = tmp_path / "old.sqlite"
    _asked(journal, "first")
    with contextlib.closing(sqlite3.connect(journal)) as db:  # as an older version made it
        db.execute("ALTER TABLE runs DROP COLUMN stop_reason")
        db.commit()
    assert main(["journal", "ls", str(journal), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stop_reason"] is None
    loop = "```repl\nprint(llm_query('a'))\n```"
    rlm = RLM("scripted", {"responses": [loop, "x"] * 5}, journal=str(journal), max_iterations=2)
    assert rlm.completion("ctx", root_prompt="second").stop_reason == "max_iterations"
    assert main(["journal", "ls", str(journal)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[1:3] == ["rlm", "stopped:max_iterations"] and table[1].endswith(
        "second"
    )
    assert table[2].split()[1:3] == ["rlm", "finished"] and table[2].endswith("first")


def test_a_stop_reason_is_not_told_of_a_later_attempt(tmp_path: Path) -> None:
    """A resumed attempt that was killed (``running``), or a later one an older version
    finished, still showed the first attempt's limit: the report called the run
    "stopped by max_iterations"."""
    import sqlite3

    from rlm_graph import RLM
    from rlm_graph.cli.report import load_run
    from rlm_graph.journal import JournalStore

    journal = tmp_path / "run.sqlite"
    loop = "```repl\nprint(llm_query('a'))\n```"
    rlm = RLM("scripted", {"responses": [loop, "x"] * 5}, journal=str(journal), max_iterations=2)
    assert rlm.completion("ctx", root_prompt="q").stop_reason == "max_iterations"
    assert load_run(journal).stop_reason == "max_iterations"
    with contextlib.closing(sqlite3.connect(journal)) as db:  # a resumed attempt, killed
        db.execute("UPDATE runs SET status='running', attempts=attempts+1")
        db.commit()
    (run,) = JournalStore(journal, read_only=True).runs()
    assert (run.status, run.stop_reason) == ("running", None)
    loaded = load_run(journal)
    assert loaded.stop_reason is None and (loaded.ended or "").startswith("did not finish")
    with contextlib.closing(sqlite3.connect(journal)) as db:  # an older version's stop
        db.execute("UPDATE runs SET status='stopped'")
        db.commit()
    assert (load_run(journal).ended or "").startswith("stopped by a limit")


def test_a_run_row_with_a_time_no_calendar_holds_is_listed_with_a_question_mark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row edited by hand (updated = 1e300) made `journal ls` raise an OverflowError."""
    path = _changed_by_hand(
        tmp_path, "when.sqlite", RUNS, "CREATE TABLE chunks (run, first, attempt, nodes)",
        "INSERT INTO runs VALUES (1, 'k', 'rlm', 'q', 'finished', 1, 0, 1e300, NULL, NULL, NULL)",
    )  # fmt: skip
    assert main(["journal", "ls", str(path)]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "finished" in line]
    assert "?" in row and "q" in row


def test_journal_ls_json_is_json_whatever_numbers_a_damaged_file_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run row holding an infinite time printed ``Infinity``, which no JSON reader
    takes (Python's own takes it only by default)."""
    import sqlite3

    from rlm_graph import RLM

    journal = tmp_path / "run.sqlite"
    answer = "```repl\nFINAL('x')\n```"
    RLM("scripted", {"respond": lambda r: answer}, journal=str(journal)).completion("ctx")
    with contextlib.closing(sqlite3.connect(journal)) as db, db:
        db.execute("UPDATE runs SET created = 9e999, updated = 9e999")
    assert main(["journal", "ls", "--json", str(journal)]) == 0

    def refuse(word: str) -> None:
        raise ValueError(f"not JSON: {word}")

    (row,) = [
        json.loads(line, parse_constant=refuse) for line in capsys.readouterr().out.splitlines()
    ]
    assert row["created"] is None and row["updated"] is None and row["label"] == "ctx"


def test_trace_export_takes_a_journals_run_by_trace_id_as_report_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--trace-id KEY`` on a journal (as ``report`` takes it) was ignored: the newest
    run was exported, even for a key no run has; ``--run`` on a trace file likewise."""
    journal = _asked(tmp_path / "j.sqlite", "first question")
    _asked(journal, "second question")
    capsys.readouterr()
    assert main(["journal", "ls", str(journal), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first = next(r for r in rows if r["label"] == "first question")
    assert main(["trace", "export", str(journal), "--run", first["key"][:8]]) == 0
    by_run = capsys.readouterr().out
    assert main(["trace", "export", str(journal), "--trace-id", first["key"][:8]]) == 0
    assert capsys.readouterr().out == by_run
    assert main(["trace", "export", str(journal), "--trace-id", "zzzzzz"]) == 2
    assert "no run whose key starts with 'zzzzzz'" in capsys.readouterr().err
    graph = tmp_path / "graph.json"
    assert main(["demo", "-q", "--latency", "0", "--size", "20000", "--out", str(graph)]) == 0
    capsys.readouterr()
    assert main(["trace", "export", str(graph), "--run", "abc"]) == 2
    assert "--run picks a run of a journal" in capsys.readouterr().err


def test_writers_opening_an_older_journal_at_once_add_the_record_once(tmp_path: Path) -> None:
    """Batch workers open one journal together: on a journal an older version made, each
    would add the stop_reason column; one does, inside the same exclusive step that
    checks the format, and every writer then records and reads it."""
    import sqlite3
    import threading

    from rlm_graph.journal import JournalStore

    journal = _asked(tmp_path / "old.sqlite", "first")
    with contextlib.closing(sqlite3.connect(journal)) as db:  # as an older version made it
        db.execute("ALTER TABLE runs DROP COLUMN stop_reason")
        db.commit()
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(n: int) -> None:
        try:
            start.wait()
            store = JournalStore(journal, threads=True)
            try:
                store.begin(f"key-{n}", "rlm", f"question {n}")
                store.finish(f"key-{n}", "stopped", None, stop_reason="max_budget")
            finally:
                store.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    with contextlib.closing(sqlite3.connect(journal)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
    assert columns.count("stop_reason") == 1
    runs = {run.key: run for run in JournalStore(journal, read_only=True).runs()}
    assert all(runs[f"key-{n}"].stop_reason == "max_budget" for n in range(6))
    assert runs[next(k for k in runs if not k.startswith("key-"))].stop_reason is None
