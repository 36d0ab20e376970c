"""The rows of a journal's chunks: a finished node as plain values, and back.

A row is a tuple of plain values (tuples, lists, dicts, str, int, float, bool, None):
the node's record fields (`_RECORD_FIELDS`, in order), kind, status, usage, request
hash, ``seq``, output preview (None when it is the value), ``after`` ids, parent,
value, and whether it counts as a node. `encode_nodes` makes them (pickled a chunk at a
time), `load_chunk` reads a chunk back refusing anything that is not plain values, and
`stored` checks a row's shape before it becomes a `StoredNode`.
"""

from __future__ import annotations

import io
import math
import operator
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..contracts import MAX_TOKEN_COUNT, Usage
from ..graph import Graph, NodeKind, NodeRecord, NodeStatus

__all__ = [
    "CHUNK_NODES",
    "COUNTED_KINDS",
    "DamagedRow",
    "StoredNode",
    "encode_nodes",
    "is_tool_call",
    "load_chunk",
    "pack",
    "restore",
    "retimed",
    "stored",
]

CHUNK_NODES = 512
"""Nodes a chunk holds at most (one SQLite row)."""

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
) -> list[tuple[int, bytes]]:
    """Chunks ``(first seq, pickled rows)`` of finished nodes: ``records[i]`` with its
    request hash ``requests[i]`` and ``values[i]``, numbered from ``seq + 1``.

    ``incoming`` maps a node id to its edges (source -> ``{"kind"}``: `Graph.incoming`);
    ``now`` stands in for a missing end time. Values are kept exactly as the node
    returned them (the journal is the user's own 0600 file, and a resumed run must get
    back what the first one got; traces, logs and reports are what is scrubbed). A
    journaled tool call (``<block>/tool-n``) and a node's second
    model call (``id#n``) are rows but are not counted as nodes. The output preview is
    None when it equals the value, which it does for every reply short enough to preview
    whole: no text twice.

    This runs once per node of a journaled run: fields are read in one C call and kept
    as they are (an enum by its ``_value_``, usage as its field dict), and each chunk is
    pickled as soon as it is full, so rows die young (the collector never walks them).
    """
    chunks = []
    rows: list[tuple[Any, ...]] = []
    # One loop, no call per node: a helper's call costs ~5k instructions a node here.
    for record, request, value in zip(records, requests, values, strict=True):
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
        usage = None if record.usage is None else record.usage.__dict__
        out = None if record.output_preview == value else record.output_preview
        counted = kind in COUNTED_KINDS and "#" not in node_id
        if counted and kind == "function" and is_tool_call(node_id):
            counted = False
        status = "ok" if status in _UNFINISHED else status
        rows.append((fields, kind, status, usage, request, seq, out, after, parent, value, counted))
        if len(rows) == CHUNK_NODES:
            chunks.append(pack(rows))
            rows = []
    if rows:
        chunks.append(pack(rows))
    return chunks


def pack(rows: list[tuple[Any, ...]]) -> tuple[int, bytes]:
    return rows[0][_SEQ], pickle.dumps(rows, protocol=5)


class _PlainValues(pickle.Unpickler):
    """Reads a chunk: plain values only. A pickle that names any class or function (the
    only way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"names {module}.{name}; a journal chunk holds plain values only"
        )


def load_chunk(data: bytes) -> list[tuple[Any, ...]]:
    """The rows of a chunk, each checked to have the shape `encode_nodes` writes.

    The check looks at each value once and never into a value where a plain one belongs,
    so it takes time in proportion to the chunk's bytes: a chunk built of shared nested
    references (small on disk, exponential when walked, hashed or printed) is refused,
    not followed.

    Raises:
        ValueError: the chunk is not a list of rows.
        DamagedRow: a row has the wrong shape (the message names its node when its id
            is a string).
        pickle.UnpicklingError: the pickle names a class or a function.
    """
    rows = _PlainValues(io.BytesIO(data)).load()
    if type(rows) is not list:
        raise ValueError(f"a chunk is a list of rows, not a {type(rows).__name__}")
    for index, row in enumerate(rows):
        problem = _shape_problem(row)
        if problem is not None:
            fields = row[_FIELDS] if type(row) is tuple and row else None
            node = (
                fields[0] if type(fields) is tuple and fields and type(fields[0]) is str else None
            )
            name = f"node {node!r}" if node is not None and len(node) < 300 else f"row {index}"
            raise DamagedRow(f"{name} ({problem})")
    return rows


class DamagedRow(ValueError):
    """A chunk's row that is not one `encode_nodes` writes (the message names it)."""


_SCALAR = (str, int, float, bool, type(None))
_NONE = type(None)
_TEXT, _COUNT, _NUMBER = (str,), (int,), (int, float, _NONE)
_FIELD_TYPES = dict(
    zip(
        _RECORD_FIELDS,
        (
            _TEXT,  # id
            _COUNT,  # depth
            _TEXT,  # completion
            (str, _NONE),  # model
            (str, _NONE),  # response_model
            (str, _NONE),  # provider
            (int, _NONE),  # iteration
            (int, _NONE),  # batch_index
            (int, _NONE),  # batch_size
            _NUMBER,  # submitted
            _NUMBER,  # start
            _NUMBER,  # end
            _NUMBER,  # wall_start
            _NUMBER,  # cost
            (str, _NONE),  # error
            (str, _NONE),  # error_type
            _TEXT,  # input_preview
            (str, _NONE),  # finish_reason
            _COUNT,  # attempts
            (str, _NONE),  # note
        ),
        strict=True,
    )
)
"""The types a row's record field may have (exactly: ``True`` is not a count)."""
_USAGE_TYPES = {
    "input_tokens": _COUNT,
    "output_tokens": _COUNT,
    "cached_tokens": _COUNT,
    "reasoning_tokens": _COUNT,
    "cache_write_tokens": _COUNT,
    "estimated": (bool,),
}
_TYPE_NAMES = {str: "text", int: "an int", float: "a number", bool: "a bool", _NONE: "None"}
_COST = _RECORD_FIELDS.index("cost")


def _shape_problem(row: object) -> str | None:
    """What is wrong with ``row``'s shape, or None (see `load_chunk`)."""
    if type(row) is not tuple or len(row) != 11:
        return "not a row of 11 values"
    fields = row[_FIELDS]
    if type(fields) is not tuple or len(fields) != len(_RECORD_FIELDS):
        return f"its record is not {len(_RECORD_FIELDS)} fields"
    if type(fields[0]) is not str or not all(type(v) in _SCALAR for v in fields):
        return "a record field that is not a plain value"
    for name, value in zip(_RECORD_FIELDS, fields, strict=True):
        if type(value) not in _FIELD_TYPES[name]:
            return _wrong_type(f"its {name}", value, _FIELD_TYPES[name])
    cost = fields[_COST]
    if cost is not None and not 0 <= cost < math.inf:  # NaN too: the engine writes none
        return "its cost is not a finite amount of 0 or more"
    if not all(type(row[i]) is str for i in (_KIND, _STATUS, _HASH)) or type(row[_SEQ]) is not int:
        return "its kind, status, hash or seq has the wrong type"
    if not all(type(row[i]) in (str, type(None)) for i in (_OUTPUT, _PARENT, _VALUE)):
        return "its preview, parent or value is not text"
    usage, after = row[_USAGE], row[_AFTER]
    if usage is not None and (
        type(usage) is not dict
        or not all(type(k) is str and type(v) in _SCALAR for k, v in usage.items())
    ):
        return "its usage is not a dict of plain values"
    for name, value in (usage or {}).items():
        if type(value) not in _USAGE_TYPES.get(name, ()):
            if name not in _USAGE_TYPES:
                return f"its usage has an unknown field {name[:40]!r}"
            return _wrong_type(f"its usage's {name}", value, _USAGE_TYPES[name])
        if type(value) is int and not 0 <= value <= MAX_TOKEN_COUNT:
            return f"its usage's {name} is out of range (0 to a trillion)"
    if after is not None and (type(after) is not list or not all(type(a) is str for a in after)):
        return "its edges are not a list of node ids"
    if type(row[_COUNTED]) is not bool:
        return "its counted flag is not a bool"
    return None


def _wrong_type(what: str, value: object, allowed: tuple[type, ...]) -> str:
    """``what`` is ``value``'s type where ``allowed`` types belong (the value itself is
    not shown: a row is only checked, never printed)."""
    kinds = [t for t in allowed if not (t is int and float in allowed)]  # a number
    wanted = " or ".join(_TYPE_NAMES[t] for t in kinds)
    return f"{what} is {_TYPE_NAMES.get(type(value), type(value).__name__)}, not {wanted}"


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


def stored(row: tuple[Any, ...]) -> StoredNode:
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
