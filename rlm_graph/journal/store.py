"""The journal file: one SQLite database (WAL mode) of runs and their finished nodes.

Layout (``PRAGMA user_version`` = `SCHEMA_VERSION`):

    runs    one row per run key (numbered): kind, label, status, attempts, times, the
            first attempt's trace and span ids (a resumed run's span links to them), answer
    chunks  finished nodes of a run, written together: ``(run, first, attempt, nodes)``
            with ``first`` the ``seq`` of its first node and ``nodes`` a pickle of plain
            values only (tuples, lists, dicts, str, int, float, bool, None): one row per
            node, see `encode_nodes`. It is read back by `_load_chunk`, which refuses
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

import io
import operator
import os
import pickle
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contracts import Usage
from ..errors import ConfigError
from ..graph import Graph, NodeKind, NodeRecord, NodeStatus

__all__ = [
    "CHUNK_NODES",
    "COUNTED_KINDS",
    "SCHEMA_VERSION",
    "JournalStore",
    "RunRow",
    "StoredNode",
    "encode_nodes",
    "is_tool_call",
    "restore",
    "retimed",
]

SCHEMA_VERSION = 2

CHUNK_NODES = 512
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
    answer TEXT
);
CREATE TABLE IF NOT EXISTS chunks (
    run INTEGER NOT NULL,
    first INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    nodes BLOB NOT NULL,
    PRIMARY KEY (run, first)
);
"""

_RECORD_FIELDS = (
    "id",
    "depth",
    "completion",
    "model",
    "response_model",
    "provider",
    "iteration",
    "batch_index",
    "batch_size",
    "submitted",
    "start",
    "end",
    "wall_start",
    "cost",
    "error",
    "error_type",
    "input_preview",
    "finish_reason",
    "attempts",
    "note",
)
"""The `NodeRecord` fields a row keeps as they are, in this order (its first item)."""

_record_fields = operator.attrgetter(*_RECORD_FIELDS)  # one C call for all of them
_END = _RECORD_FIELDS.index("end")

# A row: (record fields, kind, status, usage fields or None, request hash, seq,
#         output preview or None when it is the value, after ids or None, parent, value,
#         counted)
_FIELDS, _KIND, _STATUS, _USAGE, _HASH, _SEQ, _OUTPUT, _AFTER, _PARENT, _VALUE, _COUNTED = range(11)

COUNTED_KINDS = frozenset(
    {
        NodeKind.ROOT_TURN,
        NodeKind.LLM_CALL,
        NodeKind.RLM_CALL,
        NodeKind.COMPACTION,
        NodeKind.FUNCTION,
    }
)
"""Kinds whose nodes count as a run's nodes (and costs): in `JournalStore.runs` and in a
replay's counts. A str enum: a kind's text (``"llm_call"``) is found in it too."""

_UNFINISHED = frozenset({"pending", "running"})


def is_tool_call(node_id: str) -> bool:
    """A journaled tool call's row (``<block>/tool-n``): journaled, but not a graph node."""
    return node_id.rpartition("/")[2].startswith("tool-")


def encode_nodes(
    seq: int,
    records: Sequence[NodeRecord],
    requests: Sequence[str],
    values: Sequence[str | None],
    incoming: Mapping[str, Mapping[str, Mapping[str, Any]]],
    now: float,
    redact: Callable[[str], str] | None = None,
) -> list[tuple[int, bytes]]:
    """Chunks ``(first seq, pickled rows)`` of finished nodes: ``records[i]`` with its
    request hash ``requests[i]`` and ``values[i]``, numbered from ``seq + 1``.

    ``incoming`` maps a node id to its edges (source -> ``{"kind"}``: `Graph.incoming`);
    ``now`` stands in for a missing end time; ``redact`` scrubs known
    secrets out of values. A journaled tool call (``<block>/tool-n``) and a node's second
    model call (``id#n``) are rows but are not counted as nodes. The output preview is
    None when it equals the value, which it does for every reply short enough to preview
    whole: no text twice.

    This runs once per node of a journaled run: fields are read in one C call and kept
    as they are (an enum by its ``_value_``, usage as its field dict), and each chunk is
    pickled as soon as it is full, so rows die young (the collector never walks them).
    """
    chunks = []
    rows: list[tuple[Any, ...]] = []
    for record, request, value in zip(records, requests, values, strict=True):
        if redact is not None and value:
            value = redact(value)  # a model that echoed a key does not put it on disk
        seq += 1
        node_id = record.id
        after = parent = None
        sources = incoming.get(node_id)
        if sources:
            for source, data in sources.items():
                if data.get("kind") == "spawn":
                    parent = source
                elif after is None:
                    after = [source]
                else:
                    after.append(source)
        fields = _record_fields(record)
        if record.end is None:
            fields = (*fields[:_END], now, *fields[_END + 1 :])
        kind = record.kind._value_
        status = record.status._value_
        if status in _UNFINISHED:
            status = "ok"
        usage = record.usage
        out = record.output_preview
        rows.append(
            (
                fields,
                kind,
                status,
                None if usage is None else usage.__dict__,
                request,
                seq,
                None if out == value else out,
                after,
                parent,
                value,
                kind in COUNTED_KINDS
                and "#" not in node_id
                and (kind != "function" or not is_tool_call(node_id)),
            )
        )
        if len(rows) == CHUNK_NODES:
            chunks.append(_pack(rows))
            rows = []
    if rows:
        chunks.append(_pack(rows))
    return chunks


def _pack(rows: list[tuple[Any, ...]]) -> tuple[int, bytes]:
    return rows[0][_SEQ], pickle.dumps(rows, protocol=5)


class _PlainValues(pickle.Unpickler):
    """Reads a chunk: plain values only. A pickle that names any class or function (the
    only way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"names {module}.{name}; a journal chunk holds plain values only"
        )


def _storable(text: str) -> str:
    """``text`` as SQLite can store it: a lone surrogate (untrusted text can carry one)
    has no UTF-8 form and becomes U+FFFD. For what the runs table shows (a question, an
    answer); nodes keep theirs exactly, in their chunks."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _load_chunk(data: bytes) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = _PlainValues(io.BytesIO(data)).load()
    return rows


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
            raise ConfigError(
                f"journal {str(self.path)!r} is a folder; give a file path such as run.sqlite"
            )
        fresh = not self.path.exists()
        if fresh:
            try:
                # Prompts and replies live here: owner-only from the first byte.
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError as exc:
                raise ConfigError(
                    f"cannot create journal {str(self.path)!r}: {exc.strerror}"
                ) from None
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
                    (key, kind, _storable(label), now, now),
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
        self, key: str, status: str, answer: str | None, keep: Iterable[str] | None = None
    ) -> None:
        """End an attempt with ``status``; ``keep``: the only node ids still valid (a run
        that went live after a divergence drops the records of the path it left)."""
        with self._transaction():
            self._db.execute(
                "UPDATE runs SET status=?, updated=?, answer=? WHERE key=?",
                (status, time.time(), None if answer is None else _storable(answer), key),
            )
            if keep is not None:
                # Rare (a finished run that diverged): rewrite the run's chunks with the
                # latest row of each node still valid.
                valid = set(keep)
                number = self._number(key)
                kept = [
                    (a, row)
                    for node_id, (a, row) in self._latest(number).items()
                    if node_id in valid
                ]
                self._db.execute("DELETE FROM chunks WHERE run=?", (number,))
                for attempt in sorted({a for a, _ in kept}):
                    rows = [row for a, row in kept if a == attempt]
                    packed = [
                        _pack(rows[at : at + CHUNK_NODES])
                        for at in range(0, len(rows), CHUNK_NODES)
                    ]
                    self._db.executemany(
                        "INSERT INTO chunks VALUES (?, ?, ?, ?)",
                        [(number, first, attempt, data) for first, data in packed],
                    )

    def runs(self) -> list[RunRow]:
        """Every run, newest first, with its node count and the cost of its model calls."""
        rows = self._db.execute(
            "SELECT number, key, kind, label, status, attempts, created, updated, trace_id, "
            "span_id, answer FROM runs ORDER BY updated DESC, number DESC"
        ).fetchall()
        found = []
        cost_at = _RECORD_FIELDS.index("cost")
        for (
            number,
            key,
            kind,
            label,
            status,
            attempts,
            created,
            updated,
            trace_id,
            span_id,
            answer,
        ) in rows:
            counted = [r for _, r in self._latest(number).values() if r[_COUNTED]]
            found.append(
                RunRow(
                    number,
                    key,
                    kind,
                    label,
                    status,
                    attempts,
                    created,
                    updated,
                    trace_id,
                    span_id,
                    answer,
                    nodes=len(counted),
                    cost=sum(r[_FIELDS][cost_at] or 0.0 for r in counted),
                )
            )
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
        cursor = self._db.execute(
            "SELECT attempt, nodes FROM chunks WHERE run=? ORDER BY first", (number,)
        )
        for attempt, data in cursor:
            try:
                rows = _load_chunk(data)
            except Exception as exc:
                raise ConfigError(
                    f"journal {str(self.path)!r} has a damaged node chunk ({exc}); start a new journal file"
                ) from None
            for row in rows:
                node_id = row[_FIELDS][0]
                latest.pop(node_id, None)  # re-inserted: the dict's order stays seq order
                latest[node_id] = (attempt, row)
        return latest

    def load(self, key: str) -> dict[str, StoredNode]:
        """Every journaled node of run ``key`` (its latest row), by node id.

        Raises:
            ConfigError: no such run, or a chunk cannot be read.
        """
        found = {}
        for node_id, (_, row) in self._latest(self._number(key)).items():
            try:
                found[node_id] = _stored(row)
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
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _stored(row: tuple[Any, ...]) -> StoredNode:
    """A row as a `StoredNode`, validated (a row is data from a file).

    Raises:
        ValueError: the row is not one `encode_nodes` writes.
    """
    fields = dict(zip(_RECORD_FIELDS, row[_FIELDS], strict=True))
    value, output, after, parent = row[_VALUE], row[_OUTPUT], row[_AFTER], row[_PARENT]
    if not (
        isinstance(row[_HASH], str)
        and isinstance(row[_SEQ], int)
        and all(isinstance(v, str | None) for v in (value, output, parent))
        and (after is None or (isinstance(after, list) and all(isinstance(a, str) for a in after)))
    ):
        raise ValueError("a row whose hash, seq, value, preview or edges have the wrong type")
    record = NodeRecord(
        **fields,
        kind=NodeKind(row[_KIND]),
        status=NodeStatus(row[_STATUS]),
        usage=None if row[_USAGE] is None else Usage(**row[_USAGE]),
        output_preview=(value or "") if output is None else output,
    )
    return StoredNode(
        id=record.id,
        hash=row[_HASH],
        record=record,
        after=tuple(after or ()),
        parent=parent,
        value=value,
        seq=row[_SEQ],
        counted=bool(row[_COUNTED]),
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


def _add_replayed(
    graph: Graph, node: StoredNode, offset: float, *, bare: bool = False
) -> NodeRecord:
    record = retimed(node.record, offset)
    record.replayed = True
    after = [] if bare else [d for d in node.after if d in graph]
    parent = node.parent if not bare and node.parent in graph else None
    return graph.add(record, after=after, parent=parent)


def retimed(record: NodeRecord, offset: float) -> NodeRecord:
    """A copy of ``record`` on the clock ``time.time() - offset`` (see `restore`)."""
    copy = NodeRecord.model_validate(record.model_dump())
    copy.retime(record, offset)
    return copy
