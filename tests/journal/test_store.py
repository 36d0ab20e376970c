"""The journal file itself: several workers may open a new one at the same moment."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.journal.store import JournalStore


def test_workers_opening_one_new_journal_at_once_all_succeed(tmp_path: Path) -> None:
    # A batch's workers each open the batch's journal as their first completion starts:
    # creating the schema must be one step, never half-seen by a neighbour.
    for round_ in range(20):
        path = tmp_path / f"shared-{round_}.sqlite"
        start = threading.Barrier(8)
        outcomes: list[str] = []

        def open_it(
            start: threading.Barrier = start, path: Path = path, outcomes: list[str] = outcomes
        ) -> None:
            start.wait()
            try:
                JournalStore(path).begin("key", "rlm", "label")
            except Exception as exc:  # reported below
                outcomes.append(f"{type(exc).__name__}: {exc}")
            else:
                outcomes.append("ok")

        workers = [threading.Thread(target=open_it) for _ in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert outcomes == ["ok"] * 8


def _journal_a_run(path: Path, reply: str) -> str:
    """Journal one finished run whose sub-call answered ``reply``; its run key."""
    from rlm_graph import RLM
    from rlm_graph.contracts import ChatRequest
    from tests.support.scripts import is_root_turn, repl, turn_number

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return reply
        if turn_number(request) == 1:
            return repl("said = llm_query('say it')")
        return repl("FINAL_VAR('said')")

    result = RLM("scripted", {"respond": respond}, journal=str(path)).completion(
        "ctx", root_prompt="q"
    )
    assert result.response == reply
    assert result.replay is not None
    return result.replay.run_key


def test_replies_any_text_survive_the_file_exactly(tmp_path: Path) -> None:
    # A lone surrogate (a server may send "\ud800" in JSON), a NUL, and a reply longer
    # than a preview (stored once as the value, its preview kept apart).
    for reply in ("half \ud800 a pair", "nul \x00 byte", "long " + "x" * 5000):
        path = tmp_path / f"{len(reply)}.sqlite"
        key = _journal_a_run(path, reply)
        store = JournalStore(path)
        nodes = store.load(key)
        store.close()
        (sub,) = [n for n in nodes.values() if n.record.kind.value == "llm_call"]
        assert sub.value == reply
        assert sub.record.output_preview == (reply if len(reply) <= 200 else reply[:199] + "…")


def test_a_crafted_chunk_is_refused_without_running_anything(tmp_path: Path) -> None:
    import pickle
    import sqlite3

    import pytest

    from rlm_graph.errors import ConfigError

    path = tmp_path / "run.sqlite"
    key = _journal_a_run(path, "fine")
    witness = tmp_path / "ran"

    class Payload:  # what an attacker would plant: a pickle that calls a function
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (open, (str(witness), "w"))

    db = sqlite3.connect(path)
    db.execute("UPDATE chunks SET nodes=?", (pickle.dumps([Payload()]),))
    db.commit()
    db.close()
    store = JournalStore(path)
    with pytest.raises(ConfigError, match="damaged node chunk.*names io.open.*start a new journal"):
        store.load(key)
    with pytest.raises(ConfigError, match="damaged node chunk"):
        store.runs()  # `rlm-graph journal ls` says the same
    store.close()
    assert not witness.exists()

    db = sqlite3.connect(path)
    db.execute("UPDATE chunks SET nodes=?", (b"not a pickle",))
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match="damaged node chunk"):
        JournalStore(path).load(key)


def test_a_node_journaled_in_two_attempts_counts_once(tmp_path: Path) -> None:
    from rlm_graph.graph import NodeKind, NodeRecord, NodeStatus
    from rlm_graph.journal.store import encode_nodes

    path = tmp_path / "run.sqlite"
    store = JournalStore(path)
    number, _ = store.begin("key", "rlm", "label")

    def call(cost: float, answer: str, seq: int) -> list[tuple[int, bytes]]:
        record = NodeRecord(
            id="turn-1",
            kind=NodeKind.ROOT_TURN,
            status=NodeStatus.OK,
            cost=cost,
            start=1.0,
            end=2.0,
        )
        return encode_nodes(seq, [record], ["hash"], [answer], {}, 3.0)

    store.write(number, 1, call(0.5, "first", 0))
    store.write(number, 2, call(0.25, "second", 1))  # went live again in attempt 2
    (run,) = store.runs()
    assert (run.nodes, run.cost) == (1, 0.25)
    assert store.load("key")["turn-1"].value == "second"
    store.close()


def test_a_chunk_of_plain_values_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    import pickle
    import sqlite3

    import pytest

    from rlm_graph.errors import ConfigError

    path = tmp_path / "run.sqlite"
    key = _journal_a_run(path, "fine")
    db = sqlite3.connect(path)
    (data,) = db.execute("SELECT nodes FROM chunks LIMIT 1").fetchone()
    rows = pickle.loads(data)
    rows[0] = (*rows[0][:9], 12345, *rows[0][10:])  # a reply that is a number
    db.execute("UPDATE chunks SET nodes=?", (pickle.dumps(rows),))
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match="damaged row for node 'turn-1'.*start a new journal"):
        JournalStore(path).load(key)


def _damage_first_row(path: Path, change: Any) -> None:
    """Rewrite the journal's first row as ``change(row)`` returns it."""
    import pickle
    import sqlite3

    db = sqlite3.connect(path)
    (first, data) = db.execute("SELECT first, nodes FROM chunks ORDER BY first LIMIT 1").fetchone()
    rows = pickle.loads(data)
    rows[0] = change(rows[0])
    db.execute("UPDATE chunks SET nodes=? WHERE first=?", (pickle.dumps(rows), first))
    db.commit()
    db.close()


def _cost_as_text(row: tuple[Any, ...]) -> tuple[Any, ...]:
    from rlm_graph.journal.rows import _RECORD_FIELDS

    fields = list(row[0])
    fields[_RECORD_FIELDS.index("cost")] = "1.0"
    return (tuple(fields), *row[1:])


def _tokens_as_text(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*row[:3], {**(row[3] or {}), "input_tokens": "5"}, *row[4:])


def _cost_of(value: float) -> Any:
    def change(row: tuple[Any, ...]) -> tuple[Any, ...]:
        from rlm_graph.journal.rows import _RECORD_FIELDS

        fields = list(row[0])
        fields[_RECORD_FIELDS.index("cost")] = value
        return (tuple(fields), *row[1:])

    return change


def _tokens_of(value: int) -> Any:
    def change(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return (*row[:3], {**(row[3] or {}), "input_tokens": value}, *row[4:])

    return change


@pytest.mark.parametrize(
    ("change", "told"),
    [
        (_cost_as_text, "its cost is text, not a number or None"),
        (_tokens_as_text, "its usage's input_tokens is text, not an int"),
        # Values the engine never writes: a replay summed them into cost_saved (NaN) and
        # tokens_saved (10^400); a negative count was pydantic's paragraph.
        (_cost_of(float("nan")), "its cost is not a finite amount of 0 or more"),
        (_cost_of(-1.0), "its cost is not a finite amount of 0 or more"),
        (_tokens_of(10**400), "its usage's input_tokens is out of range (0 to a trillion)"),
        (_tokens_of(-5), "its usage's input_tokens is out of range (0 to a trillion)"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_the_node_on_resume_and_in_ls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, told: str
) -> None:
    from rlm_graph import RLM
    from rlm_graph.cli import main
    from rlm_graph.errors import ConfigError
    from tests.support.scripts import repl

    path = tmp_path / "run.sqlite"
    _journal_a_run(path, "fine")
    _damage_first_row(path, change)
    damaged = f"damaged row for node 'turn-1' ({told}); start a new journal file"
    resumed = RLM("scripted", {"respond": lambda r: repl("FINAL('x')")}, journal=str(path))
    with pytest.raises(ConfigError, match=re.escape(damaged)):
        resumed.completion("ctx", root_prompt="q")  # the same run: it resumes
    assert main(["journal", "ls", str(path)]) == 2  # before: sum()'s raw TypeError
    err = capsys.readouterr().err
    assert damaged in err and "Traceback" not in err


def test_a_journal_of_another_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    import sqlite3

    import pytest

    from rlm_graph.errors import ConfigError

    path = tmp_path / "old.sqlite"
    JournalStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=1")  # the first format: one table row per node
    db.close()
    with pytest.raises(
        ConfigError, match="has format 1; this rlm-graph reads format 2: start a new journal file"
    ):
        JournalStore(path)


@pytest.mark.processes
@pytest.mark.parametrize("where", ["id", "usage"])
def test_a_chunk_of_shared_nested_references_is_refused_in_bounded_time(
    tmp_path: Path, where: str
) -> None:
    """A few hundred bytes on disk, 2**60 steps to walk, hash or print: the loader
    refuses it at the first value that is not plain, and never follows it (run in a
    process of its own, so that a regression fails by the timeout, not by a hang)."""
    import pickle
    import sqlite3
    import subprocess
    import sys

    path = tmp_path / "run.sqlite"
    key = _journal_a_run(path, "fine")
    db = sqlite3.connect(path)
    (data,) = db.execute("SELECT nodes FROM chunks LIMIT 1").fetchone()
    rows = pickle.loads(data)
    bomb: tuple[object, ...] = ()
    for _ in range(60):
        bomb = (bomb, bomb)
    # The first node (the root turn) in the first chunk, its id or its usage: the
    # journal flushes a chunk by time too, so on a loaded machine the first may hold it
    # alone.
    first = rows[0]
    if where == "id":
        rows[0] = ((bomb, *first[0][1:]), *first[1:])
    else:
        rows[0] = (*first[:3], {"input_tokens": [bomb, bomb]}, *first[4:])
    crafted = pickle.dumps(rows)
    assert len(crafted) < len(data) + 2_000
    db.execute("UPDATE chunks SET nodes=?", (crafted,))
    db.commit()
    db.close()
    script = (
        "import sys\n"
        "from rlm_graph.errors import ConfigError\n"
        "from rlm_graph.journal import JournalStore\n"
        "store = JournalStore(sys.argv[1])\n"
        "for step in (lambda: store.load(sys.argv[2]), store.runs):\n"
        "    try:\n"
        "        step()\n"
        "    except ConfigError as exc:\n"
        "        print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), key],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("refused:") for line in lines), lines
    said = {
        "id": "damaged row for row 0 (a record field that is not a plain value)",
        "usage": "damaged row for node 'turn-1' (its usage is not a dict of plain values)",
    }
    assert said[where] in lines[0]


def test_a_write_sqlite_rolled_back_itself_says_its_own_error(tmp_path: Path) -> None:
    """On a full disk SQLite rolls the transaction back by itself: the ROLLBACK after it
    raised "cannot rollback - no transaction is active", which the run's warning then
    named instead of "database or disk is full"."""
    import sqlite3

    store = JournalStore(tmp_path / "run.sqlite")
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        with store._transaction():
            store._db.execute("ROLLBACK")  # what SQLite does itself on SQLITE_FULL
            raise sqlite3.OperationalError("database or disk is full")
    store.close()
