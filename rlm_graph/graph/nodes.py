"""Node records: what a node of a run is and how it went.

A record is mutable state owned by the run that executes it: the executor moves it from
``pending`` to ``running`` to one of ``ok``, ``error``, ``cancelled`` or (a workflow node
whose dependency failed) ``skipped``, and fills in times,
usage and previews. Times are seconds on trio's clock (``start``/``end``, so tests under
``MockClock`` see simulated time) plus wall-clock epoch seconds (``wall_start``).
"""

from __future__ import annotations

import dataclasses
import enum
import reprlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, TypeAdapter
from pydantic.dataclasses import dataclass

from ..contracts import Usage

__all__ = ["NodeKind", "NodeRecord", "NodeStatus", "preview"]

PREVIEW_CHARS = 200


class NodeKind(str, enum.Enum):
    ROOT_TURN = "root_turn"
    REPL_BLOCK = "repl_block"
    LLM_CALL = "llm_call"
    RLM_CALL = "rlm_call"
    COMPACTION = "compaction"
    FUNCTION = "function"

    def __str__(self) -> str:
        return self.value


class NodeStatus(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    """A workflow node that did not run because a dependency failed (its ``error`` says
    which); it sent nothing."""

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        return self in (NodeStatus.OK, NodeStatus.ERROR, NodeStatus.CANCELLED, NodeStatus.SKIPPED)


class _Short(reprlib.Repr):
    def repr_instance(self, x: Any, level: int) -> str:
        text = repr(x)  # a repr that raises is the preview's to name (reprlib hides it)
        return text if len(text) <= self.maxother else text[: self.maxother] + "…"


def _short_repr() -> reprlib.Repr:
    short = _Short()
    for name in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
        setattr(short, name, PREVIEW_CHARS)  # more items than a preview shows
    short.maxarray = short.maxstring = short.maxlong = short.maxother = 10 * PREVIEW_CHARS
    short.maxlevel = 8
    return short


_SHORT = _short_repr()


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A short, single-purpose preview of a value for records and displays; a value
    whose ``repr`` raises is named by its type (a preview never fails its node)."""
    if isinstance(value, str):
        text = value
    else:
        try:  # bounded: a list of millions of rows is not written out to keep 200 characters
            text = _SHORT.repr(value)
        except Exception as exc:
            text = f"<{type(value).__name__} object; its repr raised {type(exc).__name__}>"
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


@dataclass(slots=True, config=ConfigDict(extra="forbid"))
class NodeRecord:
    """Everything recorded about one node.

    A pydantic dataclass with slots: validated when built with ``NodeRecord(...)`` (the
    engine builds its own with `fresh`, from values it typed itself), cheap to update
    while the node runs (a run updates every record several times, and holds one per
    node), and dumped or validated like a pydantic model (``model_dump``,
    ``model_validate``).

    Attributes:
        id: unique within the run and structural: the node's place, never its finishing
            order (``"turn-3"``, ``"turn-1/block-2/llm-1.17"``, or a user's own name;
            see docs/architecture.md).
        kind: what runs.
        depth: recursion depth of the completion the node belongs to (root: 0).
        completion: id of the completion the node belongs to: ``"root"``, or the id of the
            ``rlm_call`` node whose child completion it is.
        iteration: the root-turn number the node belongs to (1-based), where it has one.
        batch_index, batch_size: the node's slot in a batch, where it is one.
        reason: why the engine made this node, where that is a choice (the direct path's
            ``llm_call`` says what fitted in which window).
        submitted: when the node was ready to run; ``start`` is when it got its slot
            (a model call waits for its provider's limiter in between), so
            ``start - submitted`` is its queueing time and ``duration`` its service time.
        attempts: requests a model call took, retries included (1: answered at once).
        note: what was wrong with a reply that still counts as one (cut off by the token
            limit, no text); the model saw the same note after the reply.
        replayed: the node's result came from a journal (docs/durability.md): it made no
            request in this run, and its times are those of the run that recorded it.
        hedge: for a hedged sub-call (``hedge=``, docs/limits.md) that sent a duplicate:
            ``"won"`` when the duplicate answered first, ``"lost"`` when the first request
            did; the other was cancelled, and both are in ``usage`` and ``cost``.
        content_in, content_out: the node's whole input and output (a turn's new message
            and its reply, a block's code and what it printed, a sub-call's prompt and
            answer), kept only when the run records content (``record_content=True``:
            off by default, since documents are private); secrets redacted.
    """

    id: str
    kind: NodeKind
    depth: int = 0
    completion: str = "root"
    model: str | None = None
    response_model: str | None = None
    provider: str | None = None
    iteration: int | None = None
    batch_index: int | None = None
    batch_size: int | None = None
    status: NodeStatus = NodeStatus.PENDING
    submitted: float | None = None
    start: float | None = None
    end: float | None = None
    wall_start: float | None = None
    usage: Usage | None = None
    cost: float | None = None
    error: str | None = None
    error_type: str | None = None
    input_preview: str = ""
    output_preview: str = ""
    finish_reason: str | None = None
    attempts: int = 1
    note: str | None = None
    reason: str | None = None
    replayed: bool = False
    hedge: Literal["won", "lost"] | None = None
    content_in: str | None = None
    content_out: str | None = None

    model_fields: ClassVar[Mapping[str, object]]

    @property
    def duration(self) -> float:
        """Seconds from start to end; 0 for a node that has not both started and ended."""
        if self.start is None or self.end is None:
            return 0.0
        return max(0.0, self.end - self.start)

    def model_dump(
        self, *, mode: Literal["json", "python"] = "python", exclude_none: bool = False
    ) -> dict[str, Any]:
        """The record as a dict (``mode="json"``: JSON-ready values), as pydantic models do."""
        dumped: dict[str, Any] = _ADAPTER.dump_python(self, mode=mode, exclude_none=exclude_none)
        return dumped

    @classmethod
    def fresh(
        cls,
        id: str,
        kind: NodeKind,
        *,
        depth: int = 0,
        completion: str = "root",
        iteration: int | None = None,
        batch_index: int | None = None,
        batch_size: int | None = None,
        input_preview: str = "",
        reason: str | None = None,
    ) -> NodeRecord:
        """A new pending record from values the engine made itself, not validated.

        ``NodeRecord(...)`` validates every field (about 9 µs: a fifth of the engine's
        own work per sub-call went into it); the engine's nodes are built from values
        typed at their source, so they skip it. Records from outside (a journal, a trace
        file, a user's code) are built with ``NodeRecord(...)`` or `model_validate`.
        """
        record = object.__new__(cls)
        record.id, record.kind, record.depth, record.completion = id, kind, depth, completion
        record.model = record.response_model = record.provider = None
        record.iteration, record.batch_index, record.batch_size = iteration, batch_index, batch_size
        record.status = NodeStatus.PENDING
        record.submitted = record.start = record.end = record.wall_start = None
        record.usage = record.cost = record.error = record.error_type = None
        record.input_preview, record.output_preview = input_preview, ""
        record.finish_reason, record.attempts, record.note, record.reason = None, 1, None, reason
        record.replayed, record.hedge, record.content_in, record.content_out = (
            False,
            None,
            None,
            None,
        )
        return record

    @classmethod
    def model_validate(cls, data: Mapping[str, Any]) -> NodeRecord:
        """A record from a dict, validated (the inverse of ``model_dump``)."""
        record: NodeRecord = _ADAPTER.validate_python(data)
        return record

    # -- how a record changes (its few writers call these) --------------------------------

    def running(self, now: float, wall: float) -> None:
        """The node was submitted and started ``now`` (trio's clock), at ``wall``."""
        self.status = NodeStatus.RUNNING
        self.submitted = self.start = now
        self.wall_start = wall

    def began(self, now: float, wall: float) -> None:
        """The node got its slot (a provider's or a child limiter's): its service time
        starts ``now`` (trio's clock), at ``wall`` (epoch seconds)."""
        self.start = now
        self.wall_start = wall

    def fail(self, error_type: str, message: str) -> None:
        """Mark the node failed with ``message``, while it may still return data (a REPL
        block whose code raised; a reply refused by its schema)."""
        self.status = NodeStatus.ERROR
        self.error = message or error_type
        self.error_type = error_type

    def skip(self, upstream: str, message: str) -> None:
        """Mark the node skipped: it did not run because its dependency ``upstream``
        failed (``message`` says so)."""
        self.status = NodeStatus.SKIPPED
        self.error = message
        self.error_type = "UpstreamFailed"

    def answered(
        self,
        *,
        usage: Usage,
        cost: float | None,
        response_model: str | None,
        finish_reason: str | None,
        note: str | None,
        output: str,
    ) -> None:
        """What a model call's reply says of the node: usage, cost, the model that
        answered, why it stopped, what was wrong with it (``note``), its preview. The
        server names the model and the reason: each is bounded as a preview is."""
        self.usage = usage
        self.cost = cost
        self.response_model = None if response_model is None else preview(response_model)
        self.finish_reason = None if finish_reason is None else preview(finish_reason)
        if note is not None:
            self.note = note
        self.output_preview = preview(output)

    def adopt(self, was: NodeRecord) -> None:
        """Take what a journaled run recorded of this node (replay): model, usage, cost,
        attempts, notes and output; its times come back with `retime` when the run ends."""
        self.replayed = True
        self.model = was.model
        self.response_model = was.response_model
        self.provider = was.provider
        self.usage = was.usage
        self.cost = was.cost
        self.finish_reason = was.finish_reason
        self.attempts = was.attempts
        self.note = was.note
        self.output_preview = was.output_preview

    def retime(self, was: NodeRecord, offset: float) -> None:
        """Take ``was``'s times, moved onto the clock ``time.time() - offset`` (a
        replayed node keeps the times of the run that recorded it)."""
        if was.wall_start is None or was.start is None:
            return
        shift = (was.wall_start - was.start) - offset
        self.submitted = was.submitted + shift if was.submitted is not None else None
        self.start = was.start + shift
        self.end = was.end + shift if was.end is not None else None
        self.wall_start = was.wall_start

    def keep_content(self, given: str | None, made: str | None) -> None:
        """Keep the node's whole input (``given``) and output (``made``): for runs that
        record content (the report's trajectory)."""
        self.content_in = given
        self.content_out = made

    def redact(self, scrub: Callable[[str], str]) -> None:
        """Pass the previews, the content, the error and what the server named (the
        model that answered, why it stopped) through ``scrub`` (known secrets out)."""
        self.input_preview = scrub(self.input_preview)
        self.output_preview = scrub(self.output_preview)
        if self.response_model:
            self.response_model = scrub(self.response_model)
        if self.finish_reason:
            self.finish_reason = scrub(self.finish_reason)
        if self.error:
            self.error = scrub(self.error)
        if self.content_in:
            self.content_in = scrub(self.content_in)
        if self.content_out:
            self.content_out = scrub(self.content_out)


_ADAPTER: TypeAdapter[NodeRecord] = TypeAdapter(NodeRecord)
NodeRecord.model_fields = {field.name: field for field in dataclasses.fields(NodeRecord)}
_FRESH = NodeRecord.fresh("node", NodeKind.FUNCTION)
assert _FRESH == NodeRecord(id="node", kind=NodeKind.FUNCTION), (
    "NodeRecord.fresh must set every field to its default: a new field needs a line there"
)
