"""The events of a run: what listeners, `RLM.stream` and the CLI progress see. Pure.

Every event carries ``seq`` (1, 2, 3... per run, no gap: each listener sees every event
of its run, in order), ``run_id``, ``time`` (epoch seconds), ``elapsed`` (seconds since
the run started, on the run's clock: trio's, so tests under ``MockClock`` see simulated
time) and, for node events, ``node_id``, ``parent_id``, ``kind`` and ``depth``.

Lifecycle, per run:
    run_started, then for each node that runs node_started ... node_finished (a node's
    start comes before its finish; a spawned node starts after its parent started and
    finishes before it), limit_warning at most once per limit, run_finished last. A root
    turn whose reply streams has text_delta events between its start and its finish.
    concurrency_limit when a provider's adaptive limit moves by an eighth either way, to
    the run whose call moved it (other runs sharing the limit are not told).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, computed_field, model_validator

from ..contracts import Usage
from ..graph import NodeKind, NodeStatus

__all__ = [
    "ConcurrencyLimit",
    "Event",
    "EventBase",
    "LimitWarning",
    "Listener",
    "NodeFinished",
    "NodeStarted",
    "RunFinished",
    "RunStarted",
    "TextDelta",
    "parse_event",
]


class EventBase(BaseModel):
    """Fields every event has.

    Attributes:
        seq: the event's number in its run, from 1, rising by one.
        run_id: the run's id (random, one per top-level run).
        time: epoch seconds when the event was emitted.
        elapsed: seconds since the run started (the run's clock).
        node_id, parent_id, kind, depth: the node an event is about (``None`` and 0
            for run events). ``parent_id`` is the node this one runs inside: the REPL
            block that issued a sub-call, the ``rlm_call`` whose child completion a turn
            belongs to, the turn a block belongs to; ``None`` for a root turn and for a
            workflow's nodes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int
    run_id: str
    time: float
    elapsed: float
    node_id: str | None = None
    parent_id: str | None = None
    kind: NodeKind | None = None
    depth: int = 0


class RunStarted(EventBase):
    """A top-level run started: a completion (``rlm.completion``) or a workflow."""

    type: Literal["run_started"] = "run_started"
    operation: Literal["completion", "workflow"]
    max_timeout: float | None = None
    max_tokens: int | None = None
    max_budget: float | None = None


class NodeStarted(EventBase):
    """A node started running."""

    type: Literal["node_started"] = "node_started"
    completion: str = "root"
    iteration: int | None = None
    model: str | None = None
    batch_index: int | None = None
    input_preview: str = ""


class NodeFinished(EventBase):
    """A node finished: ``ok``, ``error`` or ``cancelled``.

    Attributes:
        duration: seconds of service (from getting its slot to its end).
        usage, cost: the node's own model usage, where it called a model.
        preview: the start of its output (secrets redacted).
        error, error_type: what went wrong, for a failed node.
        hedge: ``"won"``/``"lost"`` for a hedged sub-call that sent a duplicate (the
            duplicate answered first, or the first request did); None otherwise.
    """

    type: Literal["node_finished"] = "node_finished"
    completion: str = "root"
    iteration: int | None = None
    status: NodeStatus
    duration: float
    model: str | None = None
    usage: Usage | None = None
    cost: float | None = None
    preview: str = ""
    error: str | None = None
    error_type: str | None = None
    hedge: Literal["won", "lost"] | None = None


class TextDelta(EventBase):
    """Text of a root turn's reply, as it streams in (between the turn's ``node_started``
    and its ``node_finished``; only for a provider that streams).

    Attributes:
        offset: where ``text`` goes in the reply: the length of the text sent so far,
            except after a retried attempt whose text differs from what was sent: the
            reply from ``offset`` on is then ``text`` (what came after it is void).
        text: the new text.
    """

    type: Literal["text_delta"] = "text_delta"
    completion: str = "root"
    iteration: int | None = None
    offset: int
    text: str


class LimitWarning(EventBase):
    """80% of a run-wide limit is used: ``max_timeout``, ``max_tokens`` or ``max_budget``."""

    type: Literal["limit_warning"] = "limit_warning"
    limit: Literal["max_timeout", "max_tokens", "max_budget"]
    used: float
    maximum: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fraction(self) -> float:
        """``used / maximum``: in the event's JSON too."""
        return self.used / self.maximum if self.maximum else 1.0

    @model_validator(mode="before")
    @classmethod
    def _without_fraction(cls, data: Any) -> Any:
        """The JSON's ``fraction`` is computed, not read (`parse_event` round trips)."""
        if isinstance(data, dict) and "fraction" in data:
            return {key: value for key, value in data.items() if key != "fraction"}
        return data


class ConcurrencyLimit(EventBase):
    """A provider's adaptive concurrency limit moved (docs/limits.md).

    Attributes:
        provider: the provider's key (its name, and its server when it has one).
        limit: requests it may have in flight now.
        in_flight: requests in flight when it moved.
        refused: the provider's refusals (429, 503, 529) seen so far by this engine.
    """

    type: Literal["concurrency_limit"] = "concurrency_limit"
    provider: str
    limit: int
    in_flight: int
    refused: int


class RunFinished(EventBase):
    """The run ended; always the last event of a run.

    Attributes:
        stop_reason: the limit that stopped the run, if one did.
        error: ``"Type: message"`` when the run raised instead of returning.
        nodes: nodes in the run's graph.
        usage, cost: totals over the whole run.
        result: the ``RLMChatCompletion`` or ``WorkflowResult``; when the run raised,
            the partial result the error carries (a `ProviderError`'s), else ``None``.
            Not part of the event's JSON.
    """

    type: Literal["run_finished"] = "run_finished"
    stop_reason: str | None = None
    error: str | None = None
    nodes: int = 0
    usage: Usage = Field(default_factory=Usage)
    cost: float = 0.0
    result: Any = Field(default=None, exclude=True, repr=False)


Event: TypeAlias = Annotated[
    RunStarted
    | NodeStarted
    | TextDelta
    | NodeFinished
    | LimitWarning
    | ConcurrencyLimit
    | RunFinished,
    Field(discriminator="type"),
]
"""Any event; ``event.type`` tells which."""

Listener: TypeAlias = Callable[[Any], None]
"""A listener: called with every event of a run, in ``seq`` order, on the scheduler's
thread. It must be quick and must not block (buffer slow work: see `EventBuffer`); an
exception it raises is logged and the run goes on."""

_EVENT: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(data: str | bytes) -> Event:
    """An event from its JSON (``event.model_dump_json()``)."""
    event: Event = _EVENT.validate_json(data)
    return event
