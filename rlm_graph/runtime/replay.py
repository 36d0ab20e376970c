"""A run's journal on the scheduler's side: replay recorded nodes, record finished ones.

`Replayer` is attached to a `Run` as ``run.journal`` (None without a journal). It is a
seam of `Run.execute`: a node that says how it is journaled (a `Journaled`: its request
hash, how its result is kept as text and read back) is answered by `Replayer.replay`
from the journal when a record with the same request hash is there, and
otherwise runs its body and records what it returned. Every node kind is journaled this
way; the executors only say how their nodes are keyed and encoded.

Writes are batched: a system task wakes when rows are waiting, lets more gather for
`FLUSH_DELAY` seconds (or until `FLUSH_ROWS` are waiting), and writes them in one
transaction from a worker thread, so the scheduler never waits on the disk.

Invariants:
    - A row is taken for writing only after its node finished: `Replayer.keep` records
      with no checkpoint between the body's return and `Run.execute` finishing the
      record, and the writer runs in another task, so by the time it reads the record
      ``Run.execute`` has finished it.
    - Once a node diverged (its request differs from its record), nothing more is
      replayed in this run: what follows a changed request cannot be trusted.
    - A node whose body raised is not recorded: it runs again on resume.
    - `close` writes whatever is left, even when the run was cancelled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, TypeVar

import trio

from ..errors import ConfigError
from ..graph import Graph, NodeRecord
from ..journal import JournalStore, ReplaySummary, RunRow
from ..journal.lookup import JournalLookup
from ..journal.seam import JournalTarget
from ..journal.store import encode_nodes

__all__ = ["FLUSH_DELAY", "FLUSH_ROWS", "Replayer", "open_journal"]

logger = logging.getLogger("rlm_graph")

FLUSH_DELAY = 0.05
"""Seconds the writer lets rows gather before a write (at most this much is lost to a crash)."""

FLUSH_ROWS = 512
"""Rows that start a write at once."""

T = TypeVar("T")


class Replayer(JournalLookup):
    """The journal of one run (one run key) in one attempt: `JournalLookup` (what it
    answers) and the writer.

    Args:
        graph: the run's graph (edges of recorded nodes; a replayed child's nodes go in).
        store, key, number, before: the open journal file, the run's key, its number in
            the file and its earlier attempt's row (None for a first attempt).
    """

    def __init__(
        self,
        graph: Graph,
        store: JournalStore,
        key: str,
        number: int,
        before: RunRow | None,
    ) -> None:
        nodes = store.load(key) if before is not None else {}
        super().__init__(graph, key, nodes, before, lambda: time.time() - trio.current_time())
        self.store = store
        self.number = number
        self.link = (
            (before.trace_id, before.span_id)
            if before and before.trace_id and before.span_id
            else None
        )
        self._seq = max((n.seq for n in self.nodes.values()), default=0)
        # What finished and waits for the writer, as three parallel lists (no tuple per
        # node for the collector to walk while thousands wait).
        self._records: list[NodeRecord] = []
        self._requests: list[str] = []
        self._values: list[str | None] = []
        # Journaled tools run on REPL threads: list.append is their only write here.
        self._tool_rows: list[tuple[NodeRecord, str, str | None]] = []
        self._wake = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.CancelScope()
        self._stopped = trio.Event()
        self._failed: BaseException | None = None

    # -- journaled tools (REPL threads) -------------------------------------------------

    def record_tool(self, record: NodeRecord, request: str, text: str) -> None:
        """Record one journaled tool call (from a REPL thread) and wake the writer: on
        disk within the flush delay, as a node is, not at the next node's."""
        self._tool_rows.append((record, request, text))
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(lambda: self._wake.set())

    # -- recording ----------------------------------------------------------------------

    def record(self, record: NodeRecord, request: str, value: str | None) -> None:
        """Journal ``record`` (finishing now) with its request hash and ``value`` (what
        replay returns: a reply, an answer, a function's JSON; None for a REPL block)."""
        records = self._records
        records.append(record)
        self._requests.append(request)
        self._values.append(value)
        if len(records) == 1:  # the first since the writer took the last: wake it
            self._wake.set()

    def _chunks(self) -> list[tuple[int, bytes]]:
        """Encode what waits (and the journaled tools' rows) into chunks to write."""
        records, requests, values = self._records, self._requests, self._values
        self._records, self._requests, self._values = [], [], []
        tools = len(self._tool_rows)
        if tools:
            for record, request, value in self._tool_rows[:tools]:
                records.append(record)
                requests.append(request)
                values.append(value)
            del self._tool_rows[:tools]
        incoming, now = self.graph.incoming, trio.current_time()
        chunks = encode_nodes(self._seq, records, requests, values, incoming, now)
        self._seq += len(records)
        return chunks

    async def _writer(self) -> None:
        try:
            with self._stop:
                while True:
                    await self._wake.wait()
                    if len(self._records) < FLUSH_ROWS:
                        await trio.sleep(FLUSH_DELAY)
                    self._wake = trio.Event()
                    chunks = self._chunks()
                    await trio.to_thread.run_sync(
                        self.store.write, self.number, self.attempt, chunks
                    )
        except Exception as exc:  # a full disk must not fail the user's run
            self._failed = exc
            logger.error(
                "journal %s: writing failed (%s); the run goes on unjournaled", self.store.path, exc
            )
        finally:
            self._stopped.set()

    # -- the run's ends -----------------------------------------------------------------

    def link_span(self, span: Any) -> None:
        """Remember the run span of a first attempt (later attempts link to it)."""
        context = span.get_span_context() if span is not None else None
        if context is not None and context.is_valid:
            self.store.set_trace(
                self.key, format(context.trace_id, "032x"), format(context.span_id, "016x")
            )

    async def close(
        self, status: str, answer: str | None, stop_reason: str | None = None
    ) -> ReplaySummary:
        """Write what is left, put replayed nodes' recorded times back, end the attempt.

        ``status``: ``"finished"``, ``"stopped"`` (a limit cut it: ``stop_reason``) or
        ``"failed"``.
        """
        with trio.CancelScope(shield=True):
            self._stop.cancel()
            await self._stopped.wait()
            offset = time.time() - trio.current_time()
            for record, stored in self._replayed:
                record.retime(stored.record, offset)
            try:
                if self._failed is None:
                    self.store.write(self.number, self.attempt, self._chunks())
                keep = None
                if self.diverged_at is not None and status == "finished":
                    keep = [r.id for r in self.graph.records()]
                self.store.finish(self.key, status, answer, keep, stop_reason)
            except Exception as exc:  # the run itself is done: its answer stands
                self._failed = self._failed or exc
                logger.error(
                    "journal %s: writing failed (%s); the run's answer is not journaled",
                    self.store.path,
                    exc,
                )
            finally:
                self.store.close()
        return self.summary()


async def open_journal(graph: Graph, target: JournalTarget) -> Replayer:
    """Open the journal ``target`` names for a run whose graph is ``graph``.

    Raises:
        ConfigError: the file is not a journal, or cannot be opened.
    """
    if not isinstance(target.path, str | os.PathLike):
        raise ConfigError(
            f"journal must be a file path such as 'run.sqlite', not {type(target.path).__name__}"
        )
    store = JournalStore(target.path, threads=True)
    try:
        number, before = store.begin(target.key, target.kind, target.label)
        replayer = Replayer(graph, store, target.key, number, before)
    except BaseException:
        store.close()
        raise
    trio.lowlevel.spawn_system_task(replayer._writer, name="rlm_graph.journal.writer")
    return replayer
