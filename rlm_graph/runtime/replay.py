"""A run's journal on the scheduler's side: replay recorded nodes, record finished ones.

`Replayer` is attached to a `Run` as ``run.journal`` (None without a journal). The
executors ask it before doing work (`Replayer.lookup`: a recorded node whose request hash
matches is answered from the journal) and hand it what they finished
(`Replayer.record`). Writes are batched: a system task wakes when rows are waiting,
lets more gather for `FLUSH_DELAY` seconds (or until `FLUSH_ROWS` are waiting), and
writes them in one transaction from a worker thread, so the scheduler never waits on
the disk.

Invariants:
    - A row is taken for writing only after its node finished: `record` is called from
      a node's body with no checkpoint before the body returns, and the writer runs in
      another task, so by the time it reads the record ``Run.execute`` has finished it.
    - Once a node diverged (its request differs from its record), nothing more is
      replayed in this run: what follows a changed request cannot be trusted.
    - `close` writes whatever is left, even when the run was cancelled.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..contracts import ChatRequest, Message
from ..errors import ConfigError
from ..graph import NodeKind, NodeRecord, NodeStatus
from ..journal import JournalStore, ReplaySummary, RunRow, StoredNode, value_hash
from ..journal.keys import call_hash
from ..journal.store import COUNTED_KINDS, encode_nodes, is_tool_call, restore

if TYPE_CHECKING:
    from .context import Run

__all__ = ["FLUSH_DELAY", "FLUSH_ROWS", "JournaledTool", "Replayer", "open_journal", "seed_code"]

logger = logging.getLogger("rlm_graph")

FLUSH_DELAY = 0.05
"""Seconds the writer lets rows gather before a write (at most this much is lost to a crash)."""

FLUSH_ROWS = 512
"""Rows that start a write at once."""

_COMPACTION = NodeKind.COMPACTION

COUNTED = COUNTED_KINDS


def _put_back_times(record: NodeRecord, was: NodeRecord, offset: float) -> None:
    """Give a replayed ``record`` the recorded times, moved onto this run's clock (see
    `rlm_graph.journal.store.retimed`; without a copy: this runs once per replayed node)."""
    if was.wall_start is None or was.start is None:
        return
    shift = (was.wall_start - was.start) - offset
    record.submitted = was.submitted + shift if was.submitted is not None else None
    record.start = was.start + shift
    record.end = was.end + shift if was.end is not None else None
    record.wall_start = was.wall_start


class JournaledTool:
    """A custom tool given as ``{"tool": fn, "journal": True}``: in a journaled run each
    call's result (JSON only) is recorded, keyed ``<block>/tool-<ordinal>`` and by a hash
    of the arguments, and replayed on resume instead of calling ``fn`` again.

    Called outside a journaled run it is just ``fn``.
    """

    def __init__(self, fn: Any, name: str) -> None:
        self.fn = fn
        self.name = name
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def bind(self, bridge: Any) -> Any:
        """The tool as one completion's REPL calls it (``bridge``: its bridge, or the
        proxy of a persistent session)."""

        @functools.wraps(self.fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(getattr(bridge, "target", None) or bridge, args, kwargs)

        return call

    def call(self, bridge: Any, args: Any, kwargs: Any) -> Any:
        """Call the tool for code of ``bridge``'s current block (any thread)."""
        journal: Replayer | None = getattr(getattr(bridge, "run", None), "journal", None)
        if journal is None or bridge.block is None:
            return self.fn(*args, **kwargs)
        node_id = f"{bridge.block}/tool-{bridge._ordinal()}"
        request = value_hash("tool", self.name, list(args), dict(kwargs))
        stored = journal.nodes.get(node_id)
        if stored is not None and journal.diverged_at is None and stored.hash == request and stored.value is not None:
            journal.tools_replayed += 1
            return json.loads(stored.value)
        if stored is not None and journal.diverged_at is None:
            journal.diverged_at = node_id
        value = self.fn(*args, **kwargs)
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            return value  # JSON cannot hold it: the tool runs again on resume
        record = NodeRecord(
            id=node_id, kind=NodeKind.FUNCTION, depth=bridge.depth, completion=bridge.completion,
            status=NodeStatus.OK, wall_start=time.time(), input_preview=f"{self.name}(...)",
        )
        journal._tool_rows.append((record, request, text))
        return value


def seed_code(key: str, block_id: str) -> str:
    """Code that seeds the REPL's `random` for one block of a journaled run: the same
    block of the same run draws the same numbers in every attempt."""
    seed = int(value_hash("seed", key, block_id)[:16], 16)
    return f"__import__('random').seed({seed})"


class Replayer:
    """The journal of one run (one run key) in one attempt."""

    def __init__(
        self, run: Run, store: JournalStore, key: str, number: int, before: RunRow | None
    ) -> None:
        self.run = run
        self.store = store
        self.key = key
        self.number = number
        self.attempt = before.attempts + 1 if before is not None else 1
        self.link = (before.trace_id, before.span_id) if before and before.trace_id and before.span_id else None
        self.nodes: dict[str, StoredNode] = store.load(key) if before is not None else {}
        self._seq = max((n.seq for n in self.nodes.values()), default=0)
        # What finished and waits for the writer, as three parallel lists (no tuple per
        # node for the collector to walk while thousands wait).
        self._records: list[NodeRecord] = []
        self._requests: list[str] = []
        self._values: list[str | None] = []
        # Journaled tools run on REPL threads: list.append is their only write here.
        self._tool_rows: list[tuple[NodeRecord, str, str | None]] = []
        self._wake = trio.Event()
        self._replayed: list[tuple[NodeRecord, StoredNode]] = []
        self._calls: dict[str, int] = {}
        self._stop = trio.CancelScope()
        self._stopped = trio.Event()
        self._failed: BaseException | None = None
        self.replayed = self.live = self.diverged = 0
        self.diverged_at: str | None = None
        self.cost_saved = 0.0
        self.tokens_saved = 0
        self.tools_replayed = 0

    # -- replay -------------------------------------------------------------------------

    def call_id(self, record: NodeRecord) -> str:
        """The journal id of a model call on ``record``: the node's id, and ``#n`` for
        the n-th call (n >= 2) of a node that makes several (a compaction)."""
        if record.kind != NodeKind.COMPACTION:
            return record.id
        n = self._calls[record.id] = self._calls.get(record.id, 0) + 1
        return record.id if n == 1 else f"{record.id}#{n}"

    def model_call(
        self, record: NodeRecord, model: str, messages: Sequence[Message], settings: ChatRequest | None
    ) -> tuple[str, str, StoredNode | None]:
        """A model call on ``record`` about to ask ``model`` with ``messages`` (and the
        parameters or schema of ``settings``, see `rlm_graph.journal.keys.call_hash`):
        its journal id (see `call_id`), its request hash, and its journaled result if it
        has one that matches (see `lookup`; None: the call goes live)."""
        node_id = record.id if record.kind is not _COMPACTION else self.call_id(record)
        key = call_hash(model, messages, settings)
        if not self.nodes:  # a first attempt: nothing to look up
            self.live += record.kind in COUNTED and node_id == record.id
            return node_id, key, None
        return node_id, key, self.lookup(record, key, node_id)

    def lookup(self, record: NodeRecord, request: str, node_id: str | None = None) -> StoredNode | None:
        """The journaled result of ``record`` if its request hash matches, else None
        (the node then runs live and is counted live or diverged).

        A replayed node's record takes the recorded usage, cost, model and previews, and
        is marked ``replayed``; its recorded times are put back when the run closes.
        """
        stored = self.nodes.get(node_id or record.id)
        counted = record.kind in COUNTED and (node_id is None or node_id == record.id)
        if stored is None:
            self.live += counted
            return None
        if self.diverged_at is not None or stored.hash != request:
            if self.diverged_at is None:
                self.diverged_at = record.id
                logger.warning(
                    "journal: the request of node %s differs from its record; "
                    "the run goes live from here",
                    record.id,
                )
            self.diverged += counted
            return None
        self._adopt(record, stored)
        self.replayed += counted
        return stored

    def _adopt(self, record: NodeRecord, stored: StoredNode) -> None:
        was = stored.record
        record.replayed = True
        record.model = was.model
        record.response_model = was.response_model
        record.provider = was.provider
        record.usage = was.usage
        record.cost = was.cost
        record.finish_reason = was.finish_reason
        record.attempts = was.attempts
        record.note = was.note
        record.output_preview = was.output_preview
        self._replayed.append((record, stored))
        if record.kind != NodeKind.RLM_CALL:  # a child's cost is counted on its nodes
            self.cost_saved += was.cost or 0.0
            self.tokens_saved += was.usage.total_tokens if was.usage is not None else 0

    def restore_child(self, record: NodeRecord) -> list[NodeRecord]:
        """Put the journaled nodes of the child completion of ``record`` (a replayed
        ``rlm_call``) into the run's graph, as replayed nodes; returns them."""
        prefix = record.id + "/"
        inside = sorted((n for n in self.nodes.values() if n.id.startswith(prefix)), key=lambda n: n.seq)
        inside = [n for n in inside if n.id not in self.run.graph and "#" not in n.id and not is_tool_call(n.id)]
        added = restore(self.run.graph, inside, offset=time.time() - trio.current_time())
        for node in added:
            if node.kind in COUNTED:
                self.replayed += 1
                if node.kind != NodeKind.RLM_CALL:
                    self.cost_saved += node.cost or 0.0
                    self.tokens_saved += node.usage.total_tokens if node.usage is not None else 0
        return added

    # -- recording ----------------------------------------------------------------------

    def record(self, record: NodeRecord, request: str, value: str | None, node_id: str | None = None) -> None:
        """Journal ``record`` (finishing now) with its request hash and ``value`` (what
        replay returns: a reply, an answer, a function's JSON; None for a REPL block)."""
        if node_id is not None and node_id != record.id:
            # A second call of one node: its own row, on a copy that keeps the id.
            copy = NodeRecord.model_validate(record.model_dump())
            copy.id = node_id
            record = copy
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
        chunks = encode_nodes(
            self._seq, records, requests, values, self.run.graph.incoming, trio.current_time(), self.run._redact
        )
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
                    await trio.to_thread.run_sync(self.store.write, self.number, self.attempt, chunks)
        except Exception as exc:  # a full disk must not fail the user's run
            self._failed = exc
            logger.error("journal %s: writing failed (%s); the run goes on unjournaled", self.store.path, exc)
        finally:
            self._stopped.set()

    # -- the run's ends -----------------------------------------------------------------

    def link_span(self, span: Any) -> None:
        """Remember the run span of a first attempt (later attempts link to it)."""
        context = span.get_span_context() if span is not None else None
        if context is not None and context.is_valid:
            self.store.set_trace(self.key, format(context.trace_id, "032x"), format(context.span_id, "016x"))

    def summary(self) -> ReplaySummary:
        return ReplaySummary(
            run_key=self.key, attempt=self.attempt, replayed=self.replayed, live=self.live,
            diverged=self.diverged, diverged_at=self.diverged_at,
            cost_saved=self.cost_saved, tokens_saved=self.tokens_saved,
            tools_replayed=self.tools_replayed,
        )

    async def close(self, status: str, answer: str | None) -> ReplaySummary:
        """Write what is left, put replayed nodes' recorded times back, end the attempt.

        ``status``: ``"finished"``, ``"stopped"`` (a limit cut it) or ``"failed"``.
        """
        with trio.CancelScope(shield=True):
            self._stop.cancel()
            await self._stopped.wait()
            offset = time.time() - trio.current_time()
            for record, stored in self._replayed:
                _put_back_times(record, stored.record, offset)
            try:
                if self._failed is None:
                    self.store.write(self.number, self.attempt, self._chunks())
                keep = None
                if self.diverged_at is not None and status == "finished":
                    keep = [r.id for r in self.run.graph.records()]
                self.store.finish(self.key, status, answer, keep)
            except Exception as exc:  # the run itself is done: its answer stands
                self._failed = self._failed or exc
                logger.error("journal %s: writing failed (%s); the run's answer is not journaled", self.store.path, exc)
            finally:
                self.store.close()
        return self.summary()


async def open_journal(run: Run, path: str | os.PathLike[str], key: str, kind: str, label: str) -> Replayer:
    """Open the journal at ``path`` for run ``key`` and attach it to ``run``.

    Raises:
        ConfigError: the file is not a journal, or cannot be opened.
    """
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"journal must be a file path such as 'run.sqlite', not {type(path).__name__}")
    store = JournalStore(path, threads=True)
    try:
        number, before = store.begin(key, kind, label)
        replayer = Replayer(run, store, key, number, before)
    except BaseException:
        store.close()
        raise
    trio.lowlevel.spawn_system_task(replayer._writer, name="rlm_graph.journal.writer")
    run.journal = replayer
    return replayer
