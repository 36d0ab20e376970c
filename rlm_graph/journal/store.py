"""The journal file: one SQLite database (WAL mode) of runs and their finished nodes.

Layout (``PRAGMA user_version`` = `SCHEMA_VERSION`):

    runs    one row per run key (numbered): kind, label, status, attempts, times, the
            first attempt's trace and span ids (a resumed run's span links to them), answer,
            stop_reason (the limit that stopped its last attempt, as ``<attempt>:<limit>``:
            stale once another attempt began, by any version; a column added in place to a
            journal made before it, which older versions read and write unchanged)
    chunks  finished nodes of a run, written together: ``(run, first, attempt, nodes)``
            with ``first`` the ``seq`` of its first node and ``nodes`` a pickle of plain
            values only (tuples, lists, dicts, str, int, float, bool, None): one row per
            node, see `rlm_graph.journal.rows`. It is read back by `load_chunk`, which refuses
            anything naming a class or a function, so a crafted file cannot run code.

Each node row holds the node's structural id, the hash of its request, its record's
fields, its edges and ``value`` (a model's reply, a child's answer, a function's JSON
result; None for a REPL block, which re-runs).

Why chunks and not one table row per node: an INSERT costs Python's sqlite3 about 15,000
instructions a row and 800 a column, more than the engine's own work for a zero-latency
model call; a pickle of a batch of rows costs a fraction of that (docs/benchmarks.md,
"Journal overhead"). JSON would cost three times the pickle (every float's shortest
repr, a string object for every token).

Invariants:
    - A node is written once it finished; nodes are written in batches, each batch one
      transaction, so a crash loses at most the last unwritten batch, never half of one.
    - A node journaled again (a REPL block re-run on resume, a node that went live after
      a divergence) counts by its latest row (highest ``seq``) for replay and for `runs`.
    - The store is synchronous and imports no trio: the runtime decides which thread
      calls it (`rlm_graph.runtime.replay`), one thread at a time per store.
    - The file is created readable by its owner only: it holds prompts and replies.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._files import utf8_text
from ..errors import ConfigError
from ..graph import Graph
from .rows import (
    _COUNTED,
    _FIELDS,
    _RECORD_FIELDS,
    CHUNK_NODES,
    COUNTED_KINDS,
    DamagedRow,
    StoredNode,
    encode_nodes,
    is_tool_call,
    load_chunk,
    pack,
    restore,
    retimed,
    stored,
)

__all__ = [
    "CHUNK_NODES",
    "COUNTED_KINDS",
    "SCHEMA_VERSION",
    "JournalStore",
    "check_journal",
    "RunRow",
    "StoredNode",
    "encode_nodes",
    "is_tool_call",
    "restore",
    "retimed",
]

SCHEMA_VERSION = 2

"""Nodes per chunk row at most (a write of more makes several rows, one transaction)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    number INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    trace_id TEXT,
    span_id TEXT,
    answer TEXT,
    stop_reason TEXT
);
CREATE TABLE IF NOT EXISTS chunks (
    run INTEGER NOT NULL,
    first INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    nodes BLOB NOT NULL,
    PRIMARY KEY (run, first)
);
"""


def _block(node_id: str) -> str:
    """The block of a journaled tool call's row (``<block>/tool-n``)."""
    return node_id.rpartition("/")[0]


_RUN_COLUMNS = (
    "number", "key", "kind", "label", "status", "attempts", "created", "updated", "trace_id",
    "span_id", "answer", "stop_reason",
)  # fmt: skip


# What each column of a runs row must hold (a file changed by hand or damaged may hold
# anything, NULL included): the type, or types, Python gets it as.
_RUN_TYPES: tuple[tuple[type, ...], ...] = (
    (int,), (str,), (str,), (str,), (str,), (int,), (int, float), (int, float),
    (str, type(None)), (str, type(None)), (str, type(None)), (str, type(None)),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run of a journal, as ``rlm-graph journal ls`` shows it."""

    number: int
    key: str
    kind: str
    label: str
    status: str
    attempts: int
    created: float
    updated: float
    trace_id: str | None
    span_id: str | None
    answer: str | None
    stop_reason: str | None  # what stopped the last attempt, when the run is "stopped"
    nodes: int = 0
    cost: float = 0.0


def _stop_reason(run: RunRow) -> str | None:
    """The limit that stopped the run's last attempt, from the column's
    ``<attempt>:<limit>``: None unless the run is ``stopped`` by that attempt (another
    attempt began since, of this version or another)."""
    attempt, _, reason = (run.stop_reason or "").partition(":")
    stopped = run.status == "stopped" and attempt == str(run.attempts)
    return reason or None if stopped else None


class JournalStore:
    """One journal file.

    Args:
        path: the SQLite file; created (mode 0600) when missing.
        threads: allow the connection to be used from another thread than the one that
            made it (the runtime writes from a worker thread, one at a time).

    Raises:
        ConfigError: the file cannot be opened, or is not a journal.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, threads: bool = False, read_only: bool = False
    ) -> None:
        if not os.fspath(path):
            raise ConfigError("journal is an empty path; give a file path such as run.sqlite")
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(
                f"journal {str(self.path)!r} is a folder; give a file path such as run.sqlite"
            )
        if self.path.exists() and not self.path.is_file():  # SQLite would write beside it
            raise ConfigError(
                f"journal {str(self.path)!r} is not a regular file (a device, a pipe); give "
                "a file path such as run.sqlite"
            )
        if read_only:
            self._open_to_read()
            return
        fresh = not self.path.exists()
        if fresh:
            try:
                # Prompts and replies live here: owner-only from the first byte.
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError as exc:
                raise ConfigError(
                    f"cannot create journal {str(self.path)!r}: {exc.strerror}"
                ) from None
        elif not os.access(self.path, os.W_OK):  # SQLite would open it read-only, silently
            raise ConfigError(
                f"cannot write journal {str(self.path)!r}: this user may not write it (a "
                "run's journal is written as it goes); check its mode, or give another path"
            )
        try:
            self._db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=not threads
            )
            # Another application's database is refused before the switch to WAL, which
            # would change that file for good.
            self._check_format()
            self._use_wal()
            # NORMAL in WAL mode: a commit survives a process crash (SIGKILL); only a
            # power loss may lose the last transactions, never corrupt the file.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._ensure_schema()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"cannot open journal {str(self.path)!r}: {_fix(exc)}") from None

    def _open_to_read(self) -> None:
        """Open for reading only (``journal ls``, ``trace export``, ``report``): a
        journal this user may read but not write, and nothing written to any file."""
        if not self.path.is_file():
            raise ConfigError(f"no journal at {str(self.path)!r}")
        uri = self.path.resolve().as_uri()
        try:
            try:
                self._db = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None)
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.OperationalError:
                # A folder this user cannot write: SQLite cannot make the shared-memory
                # file a WAL journal is read with. With no write-ahead log left beside it
                # (every run ended), the file itself is the whole journal.
                if Path(f"{self.path}-wal").exists():
                    raise
                self._db = sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise ConfigError(
                f"cannot read journal {str(self.path)!r}: {_fix(exc, True)}"
            ) from None
        if not version:
            raise ConfigError(
                f"{str(self.path)!r} is not an rlm-graph journal (it has no journal format); "
                "give the path of a journal (--journal, RLM(journal=...))"
            )
        if version != SCHEMA_VERSION:
            raise ConfigError(
                f"journal {str(self.path)!r} has format {version}; this rlm-graph reads "
                f"format {SCHEMA_VERSION}: start a new journal file"
            )
        missing = self._missing_columns()  # read-only: not added, read as NULL
        self._columns = ", ".join("NULL" if c in missing else c for c in _RUN_COLUMNS)

    def _missing_columns(self) -> set[str]:
        """The columns of `_RUN_COLUMNS` the runs table lacks (a journal made by an older
        version: ``stop_reason``)."""
        with self._reading():
            have = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        return set(_RUN_COLUMNS) - have if have else set()

    def _use_wal(self) -> None:
        """Switch a new file to WAL. SQLite answers "locked" at once, without waiting on
        its busy timeout, while another connection makes the same switch: wait and retry
        (bounded), since workers of a batch open a new journal together."""
        for attempt in range(300):
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 299:
                    raise
                time.sleep(0.05)

    def _check_format(self) -> int:
        """The file's format number (0: an empty file), or a `ConfigError` for a file of
        another format: a journal of another version, or an SQLite database with tables
        and no journal's format number. One statement, so one view of a file that other
        workers may be making a journal of."""
        version, tables = self._db.execute(
            "SELECT user_version, (SELECT count(*) FROM sqlite_master) FROM pragma_user_version"
        ).fetchone()
        if version == 0 and tables:
            raise ConfigError(
                f"{str(self.path)!r} is an SQLite database but not an rlm-graph journal; "
                "give a new file name"
            )
        if version not in (0, SCHEMA_VERSION):
            raise ConfigError(
                f"journal {str(self.path)!r} has format {version}; this rlm-graph reads "
                f"format {SCHEMA_VERSION}: start a new journal file"
            )
        return int(version)

    def _ensure_schema(self) -> None:
        """Check the file's format and create the tables, as one exclusive step: workers
        of a batch open a new journal at the same moment, and none may see another's
        half-made schema (tables without the format number)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if self._check_format() == 0:
                # One statement at a time: executescript() would commit this transaction.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif "stop_reason" in self._missing_columns():  # an older version's: added
                db.execute("ALTER TABLE runs ADD COLUMN stop_reason TEXT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self._columns = ", ".join(_RUN_COLUMNS)

    # -- runs ---------------------------------------------------------------------------

    def begin(self, key: str, kind: str, label: str) -> tuple[int, RunRow | None]:
        """Start an attempt of run ``key``: its number in this file, and the run as it
        was (None: a new run)."""
        now = time.time()
        try:
            return self._begin(key, kind, label, now)
        except sqlite3.DatabaseError as exc:  # a file that changed under the open one
            raise ConfigError(f"cannot write journal {str(self.path)!r}: {_fix(exc)}") from None

    def _begin(self, key: str, kind: str, label: str, now: float) -> tuple[int, RunRow | None]:
        with self._transaction():
            before = self._run(key)
            if before is None:
                cursor = self._db.execute(
                    "INSERT INTO runs (key, kind, label, status, attempts, created, updated) "
                    "VALUES (?, ?, ?, 'running', 1, ?, ?)",
                    (key, kind, utf8_text(label), now, now),
                )
                number = cursor.lastrowid
                assert number is not None
                return number, None
            self._db.execute(
                "UPDATE runs SET status='running', attempts=attempts+1, updated=? WHERE key=?",
                (now, key),
            )
        return before.number, before

    def set_trace(self, key: str, trace_id: str, span_id: str) -> None:
        """Remember the first attempt's run span, for later attempts to link to."""
        self._db.execute(
            "UPDATE runs SET trace_id=?, span_id=? WHERE key=? AND trace_id IS NULL",
            (trace_id, span_id, key),
        )

    def finish(
        self,
        key: str,
        status: str,
        answer: str | None,
        keep: Iterable[str] | None = None,
        stop_reason: str | None = None,
    ) -> None:
        """End an attempt with ``status`` (and the limit that stopped it); ``keep``: the
        only node ids still valid (a run that went live after a divergence drops the
        records of the path it left)."""
        text = None if answer is None else utf8_text(answer)
        with self._transaction():
            self._db.execute(
                "UPDATE runs SET status=?, updated=?, answer=?, "
                "stop_reason=CASE WHEN ? IS NULL THEN NULL ELSE attempts || ':' || ? END "
                "WHERE key=?",
                (status, time.time(), text, stop_reason, stop_reason, key),
            )
            if keep is not None:
                # Rare (a finished run that diverged): rewrite the run's chunks with the
                # latest row of each node still valid.
                valid = set(keep)
                number = self._number(key)
                kept = [  # a journaled tool's row stays with its block
                    (a, row)
                    for node_id, (a, row) in self._latest(number).items()
                    if node_id in valid or (is_tool_call(node_id) and _block(node_id) in valid)
                ]
                self._db.execute("DELETE FROM chunks WHERE run=?", (number,))
                for attempt in sorted({a for a, _ in kept}):
                    rows = [row for a, row in kept if a == attempt]
                    packed = [
                        pack(rows[at : at + CHUNK_NODES]) for at in range(0, len(rows), CHUNK_NODES)
                    ]
                    self._db.executemany(
                        "INSERT INTO chunks VALUES (?, ?, ?, ?)",
                        [(number, first, attempt, data) for first, data in packed],
                    )

    def runs(self) -> list[RunRow]:
        """Every run, newest first, with its node count and the cost of its model calls.

        Raises:
            ConfigError: the file cannot be read as a journal (damaged, or changed by hand).
        """
        with self._reading():
            rows = self._db.execute(
                f"SELECT {self._columns} FROM runs ORDER BY updated DESC, number DESC"
            ).fetchall()
        found = []
        cost_at = _RECORD_FIELDS.index("cost")
        for row in rows:
            run = self._run_row(row)
            counted = [r for _, r in self._latest(run.number).values() if r[_COUNTED]]
            cost = sum(r[_FIELDS][cost_at] or 0.0 for r in counted)
            found.append(replace(run, nodes=len(counted), cost=cost))
        return found

    def find(self, prefix: str) -> RunRow:
        """The one run whose key starts with ``prefix`` (``""``: the newest).

        Raises:
            ConfigError: no run, or several, match.
        """
        runs = self.runs()
        matches = [r for r in runs if r.key.startswith(prefix)] if prefix else runs[:1]
        if not matches:
            raise ConfigError(
                f"journal {str(self.path)!r} has no run "
                + (f"whose key starts with {prefix!r}" if prefix else "yet")
                + "; `rlm-graph journal ls` lists them"
            )
        if len(matches) > 1:
            raise ConfigError(f"several runs start with {prefix!r}; give more of the key")
        return matches[0]

    def _run(self, key: str) -> RunRow | None:
        with self._reading():
            row = self._db.execute(
                f"SELECT {self._columns} FROM runs WHERE key=?", (key,)
            ).fetchone()
        return self._run_row(row) if row else None

    def _run_row(self, row: tuple[Any, ...]) -> RunRow:
        """A runs row as a `RunRow`, each column checked (a NULL, a blob where text goes).

        Raises:
            ConfigError: a column holds what the engine never writes there.
        """
        for column, value, types in zip(_RUN_COLUMNS, row, _RUN_TYPES, strict=True):
            if type(value) not in types:
                raise ConfigError(
                    f"journal {str(self.path)!r} has a damaged run row (its {column} is "
                    f"{'NULL' if value is None else type(value).__name__}); start a new journal file"
                )
        run = RunRow(**dict(zip(_RUN_COLUMNS, row, strict=True)))
        return replace(run, stop_reason=_stop_reason(run))

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """SQLite's errors while reading (a damaged page, a table missing from a file
        changed by hand) as one `ConfigError` naming the file and what to do."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"cannot read journal {str(self.path)!r}: {_fix(exc)}") from None

    def _number(self, key: str) -> int:
        found = self._run(key)
        if found is None:
            raise ConfigError(f"journal {str(self.path)!r} has no run {key!r}")
        return found.number

    # -- nodes --------------------------------------------------------------------------

    def write(self, number: int, attempt: int, chunks: Sequence[tuple[int, bytes]]) -> None:
        """Write chunks (from `encode_nodes`) of run ``number`` in one transaction."""
        if not chunks:
            return
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)",
                [(number, first, attempt, data) for first, data in chunks],
            )

    def _latest(self, number: int) -> dict[str, tuple[int, tuple[Any, ...]]]:
        """The latest row of each node of run ``number``, with its attempt, by id, in
        ``seq`` order.

        Raises:
            ConfigError: a chunk cannot be read (the file was changed by hand or damaged).
        """
        latest: dict[str, tuple[int, tuple[Any, ...]]] = {}
        with self._reading():  # a damaged page fails when the cursor reaches it
            cursor = self._db.execute(
                "SELECT attempt, nodes FROM chunks WHERE run=? ORDER BY first", (number,)
            )
            for attempt, data in cursor:
                for row in self._chunk_rows(data):
                    node_id = row[_FIELDS][0]
                    latest.pop(node_id, None)  # re-inserted: the dict's order stays seq order
                    latest[node_id] = (attempt, row)
        return latest

    def _chunk_rows(self, data: Any) -> list[tuple[Any, ...]]:
        """A chunk's rows, read as plain values only (`load_chunk`).

        Raises:
            ConfigError: it is not a chunk the engine wrote.
        """
        try:
            return load_chunk(data)
        except DamagedRow as exc:
            raise ConfigError(
                f"journal {str(self.path)!r} has a damaged row for {exc}; start a new journal file"
            ) from None
        except Exception as exc:
            raise ConfigError(
                f"journal {str(self.path)!r} has a damaged node chunk ({exc}); start a new journal file"
            ) from None

    def load(self, key: str) -> dict[str, StoredNode]:
        """Every journaled node of run ``key`` (its latest row), by node id.

        Raises:
            ConfigError: no such run, or a chunk cannot be read.
        """
        found = {}
        for node_id, (_, row) in self._latest(self._number(key)).items():
            try:
                found[node_id] = stored(row)
            except Exception as exc:  # a row that is not one: a changed or damaged file
                raise ConfigError(
                    f"journal {str(self.path)!r} has a damaged row for node {node_id!r} ({exc}); "
                    "start a new journal file"
                ) from None
        return found

    def graph(self, key: str) -> Graph:
        """The graph of run ``key`` as journaled (for ``trace export`` of a crashed run)."""
        graph = Graph()
        nodes = [n for n in self.load(key).values() if not is_tool_call(n.id)]
        restore(graph, sorted(nodes, key=lambda n: n.seq))
        return graph

    def close(self) -> None:
        self._db.close()

    def _transaction(self) -> Any:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        # A full disk has rolled back already: its error stands, not "no transaction".
        self.db.execute("COMMIT" if kind is None else "ROLLBACK" if self.db.in_transaction else ";")


def check_journal(path: str | os.PathLike[str]) -> None:
    """Refuse a journal path a run could not use, before the run starts: a batch checks it
    once, rather than have every completion fail on it (each a failed row that a rerun
    then counts as done). A file already there is opened as a run opens it (a journal of
    this format, or an empty file, that this user may write); a missing one is not made,
    only its folder looked at.

    Raises:
        ConfigError: what is wrong, and what to do.
    """
    target = Path(path)
    if not os.fspath(path) or target.exists():
        JournalStore(path).close()
        return
    if not target.parent.is_dir():
        raise ConfigError(
            f"cannot create journal {str(target)!r}: the folder {str(target.parent)!r} does "
            "not exist; make it first, or give another path"
        )
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"cannot create journal {str(target)!r}: the folder {str(target.parent)!r} is "
            "not writable; give another path"
        )


def _fix(exc: sqlite3.DatabaseError, reading: bool = False) -> str:
    """SQLite's reason, with what to do about it."""
    said = str(exc)
    if "malformed" in said or "not a database" in said:
        return f"{said}: the file is damaged or not a journal; give a new file name"
    if "no such table" in said or "no such column" in said:
        return f"{said}: the file is damaged or not a journal; start a new journal file"
    if reading and "unable to open" in said:
        return (
            f"{said}: this user cannot write its folder, and its write-ahead log (a run on "
            "it is going on, or was killed) is read through a file made there; copy the "
            "journal and its -wal file to a folder you may write, or read it once a run on "
            "it has ended"
        )
    if "readonly" in said or "unable to open" in said:
        return (
            f"{said}: this user cannot write it or its folder (a run's journal is written "
            "as it goes); check their modes, or give another path"
        )
    return said
