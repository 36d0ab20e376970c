"""A run's journal as it is read: which nodes it answers, and what that saved. Pure.

`JournalLookup` is the half of the scheduler's journal (`rlm_graph.runtime.replay.Replayer`)
that decides: a node whose request hash matches its record is answered from the journal
and adopts the record; the first that differs ends replay for the run (what follows a
changed request cannot be trusted); every counted node is counted replayed, live or
diverged. The scheduler's half writes (`record`) and closes.
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ..graph import Graph, NodeKind, NodeRecord
from .seam import KEEP_TEXT, READ_TEXT, Journaled
from .store import COUNTED_KINDS, RunRow, StoredNode, is_tool_call, restore
from .summary import ReplaySummary
from .tools import MISSING, NOT_JOURNALED

__all__ = ["JournalLookup"]

_NO_MATCH = StoredNode("", "", NodeRecord(id="", kind=NodeKind.LLM_CALL), (), None, None, 0, False)
"""What a batch slot is looked up as when no journaled slot of its batch is left that
asked its request (it goes live, a divergence)."""

_AFTER_ALL = chr(0x10FFFF)  # after every character a node id can hold: a prefix's range ends here

logger = logging.getLogger("rlm_graph")

T = TypeVar("T")


class JournalLookup:
    """What the journal holds for one run (one run key), and what replay did with it.

    Args:
        graph: the run's graph (a replayed child's nodes go in).
        key: the run's key.
        nodes: the recorded nodes of its earlier attempt (empty for a first attempt).
        before: that attempt's row, or None.
        clock_offset: wall-clock seconds minus the run's clock (for restored times).
    """

    def __init__(
        self,
        graph: Graph,
        key: str,
        nodes: dict[str, StoredNode],
        before: RunRow | None,
        clock_offset: Callable[[], float],
    ) -> None:
        self.graph = graph
        self.key = key
        self.nodes = nodes
        self.attempt = before.attempts + 1 if before is not None else 1
        self._clock_offset = clock_offset
        self._replayed: list[tuple[NodeRecord, StoredNode]] = []
        self.replayed = self.live = self.diverged = 0
        self.diverged_at: str | None = None
        self.cost_saved = 0.0
        self.tokens_saved = 0
        self.tools_replayed = 0
        self._ids: list[str] | None = None
        self._used_slots: set[str] = set()  # journaled batch slots that answered a slot

    def record(self, record: NodeRecord, request: str, value: str | None) -> None:
        """Journal ``record`` with its request hash and ``value`` (the writer's half)."""
        raise NotImplementedError

    def replay(self, record: NodeRecord, journaled: Journaled[T]) -> T:
        """The journaled result of ``record`` when the journal holds this request (the
        record adopts what was recorded), else `NOT_JOURNALED`: then `Run.execute` runs
        the body and hands its result to `keep`. This runs once per node of a journaled
        run: the common case (a first attempt) calls nothing it does not need."""
        request, _, read, replayed = journaled
        if read is None:  # recorded, never replayed
            return NOT_JOURNALED  # type: ignore[no-any-return]
        if not self.nodes:  # a first attempt: nothing to look up
            self.live += record.kind in COUNTED_KINDS
            return NOT_JOURNALED  # type: ignore[no-any-return]
        stored = self.lookup(record, request)
        if stored is None:
            return NOT_JOURNALED  # type: ignore[no-any-return]
        value = stored.value or ""
        result = value if read is READ_TEXT else read(value)
        if replayed is not None:
            replayed(record)
        return result  # type: ignore[return-value]

    def keep(self, record: NodeRecord, journaled: Journaled[T], result: T) -> None:
        """Record what the body of ``record`` returned, as ``journaled`` says to keep it
        (a result it cannot keep faithfully is not recorded: it runs again on resume)."""
        request, keep, read, _ = journaled
        if read is None:
            self.record(record, request, None)
            return
        text: str | None
        if keep is KEEP_TEXT:
            text = result if isinstance(result, str) else None
        else:
            text = keep(result)
        if text is not None:
            self.record(record, request, text)

    def lookup(self, record: NodeRecord, request: str) -> StoredNode | None:
        """The journaled result of ``record`` if its request hash matches, else None
        (the node then runs live and is counted live or diverged).

        A replayed node's record takes the recorded usage, cost, model and previews, and
        is marked ``replayed``; its recorded times are put back when the run closes.
        """
        counted = record.kind in COUNTED_KINDS
        stored = self.nodes.get(record.id) if self.nodes else None
        if stored is None:
            self.live += counted
            return None
        moved = None
        if self.diverged_at is None and record.batch_size is not None:
            found = self._slot(record, request)  # None: no journaled slot left asked it
            moved = found if found is not None and found.id != record.id else None
            stored = found if found is not None else _NO_MATCH
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
        was = stored.record
        record.adopt(was)
        self._replayed.append((record, stored))
        if moved is not None:  # kept under this slot's id now: the journal is this order's
            self.record(record, request, moved.value)
        self.replayed += counted
        if record.kind != NodeKind.RLM_CALL:  # a child's cost is counted on its nodes
            self._saved(was)
        return stored

    def _slot(self, record: NodeRecord, request: str) -> StoredNode | None:
        """The journaled slot of ``record``'s batch that asked ``request`` and answers
        no other slot yet: its own, else a sibling's. A batch built from a set comes in
        another order in another process (str hashes are salted per process): its slots
        are the same requests, each replayed, not a divergence. A child RLM's slot is
        only its own (its nodes are journaled under its id)."""
        used = self._used_slots
        own = self.nodes[record.id]
        if own.hash == request and record.id not in used:
            used.add(record.id)
            return own
        if record.kind != NodeKind.LLM_CALL or record.batch_index is None:
            return None
        stem = record.id[: -len(str(record.batch_index))]
        for index in range(record.batch_size or 0):
            sibling = self.nodes.get(f"{stem}{index}")
            if sibling is not None and sibling.hash == request and sibling.id not in used:
                used.add(sibling.id)
                return sibling
        return None

    def _saved(self, was: NodeRecord) -> None:
        self.cost_saved += was.cost or 0.0
        self.tokens_saved += was.usage.total_tokens if was.usage is not None else 0

    def restore_child(self, record: NodeRecord) -> list[NodeRecord]:
        """Put the journaled nodes of the child completion of ``record`` (a replayed
        ``rlm_call``) into the run's graph, as replayed nodes; returns them."""
        prefix = record.id + "/"
        ids = self._sorted_ids()
        first = bisect.bisect_left(ids, prefix)
        end = bisect.bisect_left(ids, prefix + _AFTER_ALL, first)
        inside = sorted((self.nodes[i] for i in ids[first:end]), key=lambda n: n.seq)
        inside = [
            n
            for n in inside
            if n.id not in self.graph and "#" not in n.id and not is_tool_call(n.id)
        ]
        added = restore(self.graph, inside, offset=self._clock_offset())
        for node in added:
            if node.kind in COUNTED_KINDS:
                self.replayed += 1
                if node.kind != NodeKind.RLM_CALL:
                    self._saved(node)
        return added

    def holding_back(self, calls: list[NodeRecord]) -> list[NodeRecord]:
        """Of the slots of one batch, in the order they returned, the one the next call
        of their block comes after: the last to return. Replayed slots return in no
        order of their own: theirs is the journaled one (the latest recorded end), so a
        resumed run has the edges of the run it resumes; of a batch partly replayed, all
        (two runs' clocks cannot say which came last)."""
        ends = [
            self.nodes[c.id].record.end if c.id in self.nodes and c.replayed else None
            for c in calls
        ]
        if all(end is None for end in ends):
            return calls[-1:]
        if any(end is None for end in ends):
            return calls
        return [max(zip(ends, range(len(calls)), calls, strict=True))[2]]

    def _sorted_ids(self) -> list[str]:
        """The journaled node ids in order, made once: a child's nodes are the range that
        starts with its id (a replay of thousands of children looks each up in it, not
        in every node)."""
        if self._ids is None:
            self._ids = sorted(self.nodes)
        return self._ids

    def tool_result(self, node_id: str, request: str) -> Any:
        """The journaled result of the tool call ``node_id`` if its arguments match (a
        JSON value), else `MISSING` (the tool runs; a changed call is a divergence)."""
        stored = self.nodes.get(node_id)
        if stored is None or self.diverged_at is not None:
            return MISSING
        if stored.hash != request or stored.value is None:
            self.diverged_at = node_id
            logger.warning(
                "journal: the arguments of tool call %s differ from its record; "
                "the run goes live from here",
                node_id,
            )
            return MISSING
        self.tools_replayed += 1
        return json.loads(stored.value)

    def summary(self) -> ReplaySummary:
        return ReplaySummary(
            run_key=self.key,
            attempt=self.attempt,
            replayed=self.replayed,
            live=self.live,
            diverged=self.diverged,
            diverged_at=self.diverged_at,
            cost_saved=self.cost_saved,
            tokens_saved=self.tokens_saved,
            tools_replayed=self.tools_replayed,
        )
