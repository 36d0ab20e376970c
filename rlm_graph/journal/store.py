"""The journal file: one SQLite database (WAL mode) of runs and their finished nodes.

Layout (``PRAGMA user_version`` = `SCHEMA_VERSION`):

    runs   one row per run key (numbered): kind, label, status, attempts, times, the
           first attempt's trace and span ids (a resumed run's span links to them), answer
    nodes  one row per finished node of a run, keyed ``(run number, id)`` with ``id`` the
           node's structural id: the request hash, the record's fields as columns
           (``requests`` is the record's ``attempts``: requests the call took), the
           node's edges, and ``value`` (a model's reply, a child's answer, a function's
           JSON result; NULL for a REPL block, which re-runs)

Invariants:
    - A node row is written once its node finished; rows are written in batches, each
      batch one transaction, so a crash loses at most the last unwritten batch, never
      half of one.
    - The store is synchronous and imports no trio: the runtime decides which thread
      calls it (`rlm_graph.runtime.replay`), one thread at a time per store.
    - The file is created readable by its owner only: it holds prompts and replies.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contracts import Usage
from ..errors import ConfigError
from ..graph import Graph, NodeKind, NodeRecord, NodeStatus

__all__ = [
    "EDGE_SEPARATOR",
    "NODE_COLUMNS", "SCHEMA_VERSION", "JournalStore", "RunRow", "StoredNode", "restore", "retimed",
]

SCHEMA_VERSION = 1

EDGE_SEPARATOR = "\x1f"
"""Joins a node's ``after`` ids in one column (the ASCII unit separator: no id has it)."""

NODE_COLUMNS = (
    "run", "id", "hash", "attempt", "seq", "kind", "depth", "completion", "model",
    "response_model", "provider", "iteration", "batch_index", "batch_size", "status",
    "submitted", "start", "end", "wall_start", "input_tokens", "output_tokens",
    "cached_tokens", "reasoning_tokens", "cost", "error", "error_type", "input_preview",
    "output_preview", "finish_reason", "requests", "note", "after", "parent", "value",
    "counted",
)

_SCHEMA = f"""
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
    answer TEXT
);
CREATE TABLE IF NOT EXISTS nodes (
    {", ".join(f'"{c}"' + {"run": " INTEGER NOT NULL", "id": " TEXT NOT NULL"}.get(c, "") for c in NODE_COLUMNS)},
    PRIMARY KEY (run, id)
) WITHOUT ROWID;
"""

_INSERT = (
    f"INSERT OR REPLACE INTO nodes ({', '.join(f'{chr(34)}{c}{chr(34)}' for c in NODE_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in NODE_COLUMNS)})"
)


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
    nodes: int = 0
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class StoredNode:
    """A journaled node: its request hash, its record, and its value."""

    id: str
    hash: str
    record: NodeRecord
    after: tuple[str, ...]
    parent: str | None
    value: str | None
    seq: int
    counted: bool


class JournalStore:
    """One journal file.

    Args:
        path: the SQLite file; created (mode 0600) when missing.
        threads: allow the connection to be used from another thread than the one that
            made it (the runtime writes from a worker thread, one at a time).

    Raises:
        ConfigError: the file cannot be opened, or is not a journal.
    """

    def __init__(self, path: str | os.PathLike[str], *, threads: bool = False) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"journal {str(self.path)!r} is a folder; give a file path such as run.sqlite")
        fresh = not self.path.exists()
        if fresh:
            try:
                # Prompts and replies live here: owner-only from the first byte.
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError as exc:
                raise ConfigError(f"cannot create journal {str(self.path)!r}: {exc.strerror}") from None
        try:
            self._db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=not threads
            )
            self._use_wal()
            # NORMAL in WAL mode: a commit survives a process crash (SIGKILL); only a
            # power loss may lose the last transactions, never corrupt the file.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._ensure_schema()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"cannot open journal {str(self.path)!r}: {exc}") from None

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

    def _ensure_schema(self) -> None:
        """Check the file's format and create the tables, as one exclusive step: workers
        of a batch open a new journal at the same moment, and none may see another's
        half-made schema (tables without the format number)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise ConfigError(
                        f"{str(self.path)!r} is an SQLite database but not an rlm-graph journal; "
                        "give a new file name"
                    )
                # One statement at a time: executescript() would commit this transaction.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise ConfigError(
                    f"journal {str(self.path)!r} has format {version}; this rlm-graph reads "
                    f"format {SCHEMA_VERSION}: start a new journal file"
                )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- runs ---------------------------------------------------------------------------

    def begin(self, key: str, kind: str, label: str) -> tuple[int, RunRow | None]:
        """Start an attempt of run ``key``: its number in this file, and the run as it
        was (None: a new run)."""
        now = time.time()
        with self._transaction():
            before = self._run(key)
            if before is None:
                cursor = self._db.execute(
                    "INSERT INTO runs (key, kind, label, status, attempts, created, updated) "
                    "VALUES (?, ?, ?, 'running', 1, ?, ?)",
                    (key, kind, label, now, now),
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

    def finish(self, key: str, status: str, answer: str | None, keep: Iterable[str] | None = None) -> None:
        """End an attempt with ``status``; ``keep``: the only node ids still valid (a run
        that went live after a divergence drops the records of the path it left)."""
        with self._transaction():
            self._db.execute(
                "UPDATE runs SET status=?, updated=?, answer=? WHERE key=?",
                (status, time.time(), answer, key),
            )
            if keep is not None:
                valid = set(keep)
                number = self._number(key)
                stale = [
                    (number, node)
                    for (node,) in self._db.execute("SELECT id FROM nodes WHERE run=?", (number,))
                    if node not in valid
                ]
                self._db.executemany("DELETE FROM nodes WHERE run=? AND id=?", stale)

    def runs(self) -> list[RunRow]:
        """Every run, newest first, with its node count and the cost of its model calls."""
        rows = self._db.execute(
            "SELECT r.number, r.key, r.kind, r.label, r.status, r.attempts, r.created, "
            "r.updated, r.trace_id, r.span_id, r.answer, count(n.id), coalesce(sum(n.cost), 0) "
            "FROM runs r LEFT JOIN nodes n ON n.run = r.number AND n.counted = 1 "
            "GROUP BY r.number ORDER BY r.updated DESC, r.number DESC"
        ).fetchall()
        return [RunRow(*row) for row in rows]

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
        row = self._db.execute(
            "SELECT number, key, kind, label, status, attempts, created, updated, trace_id, "
            "span_id, answer FROM runs WHERE key=?",
            (key,),
        ).fetchone()
        return RunRow(*row) if row else None

    def _number(self, key: str) -> int:
        found = self._run(key)
        if found is None:
            raise ConfigError(f"journal {str(self.path)!r} has no run {key!r}")
        return found.number

    # -- nodes --------------------------------------------------------------------------

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Write node rows (in `NODE_COLUMNS` order) in one transaction."""
        if not rows:
            return
        with self._transaction():
            self._db.executemany(_INSERT, rows)

    def load(self, key: str) -> dict[str, StoredNode]:
        """Every journaled node of run ``key``, by node id."""
        cursor = self._db.execute(
            f"SELECT {', '.join(f'{chr(34)}{c}{chr(34)}' for c in NODE_COLUMNS)} FROM nodes WHERE run=?",
            (self._number(key),),
        )
        found = {}
        for row in cursor:
            node = _stored(dict(zip(NODE_COLUMNS, row, strict=True)))
            found[node.id] = node
        return found

    def graph(self, key: str) -> Graph:
        """The graph of run ``key`` as journaled (for ``trace export`` of a crashed run)."""
        graph = Graph()
        nodes = [n for n in self.load(key).values() if not n.id.rpartition("/")[2].startswith("tool-")]
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
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _stored(row: dict[str, Any]) -> StoredNode:
    usage = None
    if row["input_tokens"] is not None:
        usage = Usage(
            input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
            cached_tokens=row["cached_tokens"], reasoning_tokens=row["reasoning_tokens"],
        )
    record = NodeRecord(
        id=row["id"], kind=NodeKind(row["kind"]), depth=row["depth"],
        completion=row["completion"], model=row["model"],
        response_model=row["response_model"], provider=row["provider"],
        iteration=row["iteration"], batch_index=row["batch_index"],
        batch_size=row["batch_size"], status=NodeStatus(row["status"]),
        submitted=row["submitted"], start=row["start"], end=row["end"],
        wall_start=row["wall_start"], usage=usage, cost=row["cost"], error=row["error"],
        error_type=row["error_type"], input_preview=row["input_preview"] or "",
        output_preview=row["output_preview"] or "", finish_reason=row["finish_reason"],
        attempts=row["requests"] if row["requests"] is not None else 1, note=row["note"],
    )
    return StoredNode(
        id=row["id"], hash=row["hash"], record=record,
        after=tuple(row["after"].split(EDGE_SEPARATOR)) if row["after"] else (),
        parent=row["parent"], value=row["value"], seq=row["seq"], counted=bool(row["counted"]),
    )


def restore(graph: Graph, nodes: Sequence[StoredNode], *, offset: float = 0.0) -> list[NodeRecord]:
    """Add journaled nodes to ``graph`` as replayed records, with the edges whose ends
    are there, and return them.

    Times keep their durations and are moved onto a clock that reads ``time.time() -
    offset`` (the current run's trio clock; ``offset=0``: epoch seconds), each node by
    its own wall-clock start, since attempts of a run ran on different clocks.
    """
    added = []
    pending = list(nodes)
    while pending:
        waiting_ids = {n.id for n in pending}
        later = []
        for node in pending:
            if any(d in waiting_ids for d in (*node.after, node.parent) if d and d not in graph):
                later.append(node)
                continue
            added.append(_add_replayed(graph, node, offset))
        if len(later) == len(pending):  # dependencies that never come: add them bare
            added.extend(_add_replayed(graph, node, offset, bare=True) for node in later)
            break
        pending = later
    return added


def _add_replayed(graph: Graph, node: StoredNode, offset: float, *, bare: bool = False) -> NodeRecord:
    record = retimed(node.record, offset)
    record.replayed = True
    after = [] if bare else [d for d in node.after if d in graph]
    parent = node.parent if not bare and node.parent in graph else None
    return graph.add(record, after=after, parent=parent)


def retimed(record: NodeRecord, offset: float) -> NodeRecord:
    """A copy of ``record`` on the clock ``time.time() - offset`` (see `restore`)."""
    copy = NodeRecord.model_validate(record.model_dump())
    if record.wall_start is None or record.start is None:
        return copy
    shift = (record.wall_start - record.start) - offset
    for name in ("submitted", "start", "end"):
        value = getattr(copy, name)
        if value is not None:
            setattr(copy, name, value + shift)
    return copy
