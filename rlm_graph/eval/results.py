"""The rows of an evaluation (``results.jsonl``) and the budget shared by its calls.

One row per item and method::

    {"id": "q-1", "method": "rlm", "prediction": "12", "score": 0.75, "cost": 0.0121,
     "latency_s": 2.67, "input_tokens": 41230, "output_tokens": 812, "stop_reason": null,
     "error": null}

Invariants:
    - A row is written whole and flushed when its item is done; a run killed mid-write
      leaves at most one cut-off last line, which `ResultsLog.open` removes before
      appending, so the file stays valid JSON Lines.
    - An (id, method) with a row is done: a rerun does not ask it again (with
      ``retry_failed``, rows with an error are run again; the last row of a pair wins).
    - `SharedBudget` is safe to use from several threads: the executor's thread starts
      calls while the caller's thread charges the finished ones.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .._files import hold_alone, open_private, read_results, regular_or_missing, utf8_text
from ..batch import BatchError
from ..errors import ConfigError

__all__ = ["EvalRow", "ResultsLog", "SharedBudget"]


class EvalRow(BaseModel):
    """What became of one item under one method; one line of ``results.jsonl``.

    Attributes:
        id: the item's id.
        method: the method's name.
        prediction: the method's answer; ``None`` when it failed or did not run.
        score: in [0, 1] (0 without a prediction).
        cost: USD over every call, when known.
        latency_s: seconds over every call of the item.
        input_tokens, output_tokens: over every call, every depth.
        stop_reason: the limit that stopped a call, or why the item did not run
            (``does_not_fit``); else ``None``.
        error: why there is no prediction, else ``None``.
        asked: a hash of the item's question and context when it was asked
            (`rlm_graph.eval.items.asked_hash`); ``None`` in rows of older versions.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    id: str
    method: str
    prediction: str | None = None
    score: float = Field(0.0, ge=0.0, le=1.0)
    cost: float | None = Field(None, ge=0.0)
    latency_s: float = Field(0.0, ge=0.0)
    input_tokens: int = Field(0, ge=0)
    output_tokens: int = Field(0, ge=0)
    stop_reason: str | None = None
    error: BatchError | None = None
    asked: str | None = None

    @field_validator("cost", mode="before")
    @classmethod
    def _countable(cls, cost: object) -> object:
        """A cost past what a float holds (reported costs that overflowed: 1e308 + 1e308)
        is unknown, not infinite: a row stays JSON and its sums stay numbers."""
        return None if isinstance(cost, float) and math.isinf(cost) else cost

    @model_validator(mode="after")
    def _failed_scores_nothing(self) -> EvalRow:
        if self.score and (self.error is not None or self.prediction is None):
            raise ValueError("an item without a prediction (or with an error) scores 0")
        return self

    def to_line(self) -> str:
        return utf8_text(json.dumps(self.model_dump(mode="json"), ensure_ascii=False)) + "\n"


_FIELDS = frozenset(EvalRow.model_fields)
"""A row's fields (a key of another version's row is left out, not refused)."""

_ROW_KEYS = frozenset(("id", "method"))
"""What every row has (`ResultsLog._note` refuses a line without them)."""


class ResultsLog:
    """``results.jsonl``: what is done already, and appending rows as items finish.

    Args:
        path: the JSON Lines file (created if missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rows: dict[tuple[str, str], dict[str, Any]] = {}
        self._handle: IO[str] | None = None
        self._size = 0

    def read(self) -> int:
        """Read the rows there are (a missing file has none), changing nothing.

        Returns:
            Where the complete lines end (a cut-off last line starts there).

        Raises:
            ConfigError: the file cannot be read, or a complete line of it is not a
                result row (then it is not an evaluation's results).
        """
        self._rows.clear()
        try:
            lines, end, self._size = read_results(
                self.path, repr(str(self.path)), b'{"id"', _ROW_KEYS
            )
            for number, line in lines:
                self._note(line, number)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return end

    def open(self) -> ResultsLog:
        """Read the rows there are and open for appending, cutting off a partial last line.

        Raises:
            ConfigError: as `read`, or the file cannot be written (nothing is appended to
                a file that is not an evaluation's results).
        """
        try:
            regular_or_missing(self.path, repr(str(self.path)))  # a FIFO: before it is opened
            handle = open_private(self.path, "a")
            hold_alone(handle, repr(str(self.path)))  # one run at a time
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except OSError as exc:
            raise ConfigError(f"cannot write {str(self.path)!r}: {exc.strerror}") from None
        try:
            end = self.read()  # under the lock: what no other run is writing now
            if end < self._size:
                os.truncate(self.path, end)
        except BaseException:
            handle.close()
            raise
        self._handle = handle
        return self

    def _note(self, line: bytes, number: int) -> None:
        try:
            record = json.loads(line)
            key = (str(record["id"]), str(record["method"]))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{self.path}:{number} is not a row of rlm-graph eval; --out must be an "
                "evaluation's folder (or a new one)"
            ) from None
        try:  # what the summary adds up and the page shows: checked, as the run wrote it
            row = EvalRow.model_validate({k: v for k, v in record.items() if k in _FIELDS})
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"]) or "the row"
            raise ConfigError(
                f"{self.path}:{number}: {where}: {problem['msg'].removeprefix('Value error, ')}; "
                "an evaluation writes "
                "no such row: correct the line, or delete it to ask that item again"
            ) from None
        self._rows[key] = row.model_dump(mode="json")

    def done(
        self, method: str, *, retry_failed: bool = False, asked: Mapping[str, str] | None = None
    ) -> set[str]:
        """Ids with a row for ``method`` (with ``retry_failed``: a row without an error;
        with ``asked``, the items' `asked_hash` by id: a row made for what they ask now)."""
        return {
            item_id
            for (item_id, name), row in self._rows.items()
            if name == method
            and not (retry_failed and row.get("error") is not None)
            and (asked is None or _current(row, asked))
        }

    def rows(self, asked: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """The last row of every (id, method), in the order they were first written
        (with ``asked``: of the items given, made for what they ask now)."""
        if asked is None:
            return list(self._rows.values())
        return [row for row in self._rows.values() if _current(row, asked)]

    def append(self, row: EvalRow) -> None:
        """Write one row and flush it (a killed run keeps every finished item)."""
        assert self._handle is not None, "open() the results first"
        self._handle.write(row.to_line())
        self._handle.flush()
        self._rows[(row.id, row.method)] = row.model_dump(mode="json")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> ResultsLog:
        return self if self._handle is not None else self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _current(row: Mapping[str, Any], asked: Mapping[str, str]) -> bool:
    """Whether ``row`` is of an item in ``asked``, made for what it asks now (a row of an
    older version, without the hash, is taken as it is)."""
    now = asked.get(str(row["id"]))
    return now is not None and row.get("asked") in (None, now)


class SharedBudget:
    """A dollar budget over every call of an evaluation.

    The rule: a call starts only while the cost of the finished calls is below the
    budget, and it runs with ``max_budget`` set to what remains of the budget when it
    starts (or the per-completion limit, if lower), so the engine stops it there. So the
    evaluation spends at most the budget plus what the calls already running when it ran
    out go on to spend: with ``concurrency`` calls at once, at most ``concurrency - 1``
    of them, each within what remained when it started (docs/eval.md).

    Args:
        limit: USD for the whole evaluation (``None``: no budget).
        per_call: the per-completion ``max_budget`` of the evaluation's keywords, if any.
    """

    def __init__(self, limit: float | None, per_call: float | None = None) -> None:
        if limit is not None and (isinstance(limit, bool) or not limit > 0):
            raise ConfigError(f"--max-budget must be a positive number of USD, not {limit!r}")
        self.limit = limit
        self.per_call = per_call
        self._finished = 0.0  # the cost of finished calls, from their results
        self._live = 0.0  # the cost of every node so far, from `listener` (this process)
        self._lock = threading.Lock()

    @property
    def spent(self) -> float:
        """What the calls have cost so far: the finished calls' results, or, where the
        calls run in this process, every node's cost as it finishes (whichever is more)."""
        with self._lock:
            return max(self._finished, self._live)

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit

    def listener(self) -> _LiveCost:
        """An event listener (``RLM(listeners=[...])``) counting each node's cost as it
        finishes, so that a call in flight counts before its result comes back."""
        return _LiveCost(self)

    def call_cap(self) -> tuple[float | None, bool]:
        """The ``max_budget`` for a call starting now, and whether it is the evaluation's
        remainder (rather than the per-completion limit)."""
        spent = self.spent
        with self._lock:
            if self.limit is None:
                return self.per_call, False
            remaining = max(0.0, self.limit - spent)
            if self.per_call is not None and self.per_call <= remaining:
                return self.per_call, False
            return remaining, True

    def charge(self, cost: float | None) -> None:
        """Count a finished call's cost (from its result)."""
        if cost:
            with self._lock:
                self._finished += cost

    def charge_live(self, cost: float) -> None:
        """Count one node's cost as it finishes (see `listener`)."""
        with self._lock:
            self._live += cost


class _LiveCost:
    """The budget's event listener. A copy sent to another process (a Ray worker) counts
    nothing there: that executor's calls count when their results come back."""

    def __init__(self, budget: SharedBudget | None) -> None:
        self.budget = budget

    def __call__(self, event: Any) -> None:
        if (
            self.budget is not None
            and getattr(event, "type", None) == "node_finished"
            and event.cost
        ):
            self.budget.charge_live(float(event.cost))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_LiveCost, (None,))
