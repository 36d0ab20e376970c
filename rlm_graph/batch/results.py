"""Batch results: one line per finished item, the results file that makes a batch
resumable, and the summary. Pure: no trio.

Invariants:
    - A result line is written whole and flushed as its item finishes; a run killed
      mid-write leaves at most one partial last line, which `ResultsFile.open` cuts off
      before appending, so the file stays valid JSON Lines.
    - An id with a line in the file is done: a rerun skips it (with ``retry_failed``,
      ids whose every line is a failure or a limit's partial answer are run again; the
      last line of an id wins),
      unless its lines were made for what the item asked then, not now (their ``asked``
      hash differs from the item's; a line with none, written before it was kept, counts).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict

from .._files import hold_alone, open_private, read_results, regular_or_missing, utf8_text
from .._json import dumps as finite_dumps
from ..errors import ConfigError

__all__ = [
    "BatchError",
    "BatchResult",
    "BatchSummary",
    "BatchTally",
    "ItemUsage",
    "ResultsFile",
    "glance",
]


class ItemUsage(BaseModel):
    """Model calls and tokens of one completion, every depth included. With a journal,
    the calls it replayed are among them, as they were recorded: ``replayed`` of them,
    ``tokens_saved`` and ``cost_saved`` not spent again."""

    model_config = ConfigDict(frozen=True)

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    models: dict[str, dict[str, Any]] = {}
    replayed: int = 0
    tokens_saved: int = 0
    cost_saved: float = 0.0


class BatchError(BaseModel):
    """Why an item has no answer: the exception's type and message."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str


class BatchResult(BaseModel):
    """What became of one item; one line of the results file.

    Attributes:
        id: the item's id.
        answer: the answer (or the partial answer a limit left); ``None`` on error.
        stop_reason: the limit that stopped the completion, else ``None``.
        usage: calls and tokens, every depth included.
        cost: USD, when the server reports it or the model has a price.
        started_at, finished_at: wall-clock (Unix) times of the last attempt.
        seconds: how long the last attempt took.
        attempts: 1, or more when a worker died and the item was run again.
        executor: which executor ran it.
        error: why there is no answer, else ``None``.
        asked: a hash of what the item asked (`BatchItem.asked`): a rerun asks again an
            item that asks something else now.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    answer: str | None = None
    stop_reason: str | None = None
    usage: ItemUsage = ItemUsage()
    cost: float | None = None
    started_at: float
    finished_at: float
    seconds: float
    attempts: int = 1
    executor: str = "local"
    error: BatchError | None = None
    asked: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_line(self) -> str:
        line = finite_dumps(self.model_dump(mode="json"), ensure_ascii=False)  # inf: null
        return utf8_text(line) + "\n"


def _percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile (no interpolation: one of the values)."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(share * len(ranked)) - 1)]


class BatchSummary(BaseModel):
    """Totals of the items a run finished (items skipped on resume are counted apart)."""

    model_config = ConfigDict(frozen=True)

    answered: int = 0
    failed: int = 0
    skipped: int = 0
    stopped_by_limit: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    tokens_saved: int = 0
    cost_saved: float = 0.0
    p50_seconds: float | None = None
    p95_seconds: float | None = None

    @classmethod
    def of(cls, results: Iterable[BatchResult], skipped: int = 0) -> BatchSummary:
        tally = BatchTally()
        for result in results:
            tally.add(result)
        return tally.summary(skipped)

    def text(self) -> str:
        """One human line: ``40 answered, 1 failed, ... p50 1.20 s, p95 2.31 s``."""
        parts = [f"{self.answered} answered", f"{self.failed} failed"]
        if self.skipped:
            parts.append(f"{self.skipped} already done")
        if self.stopped_by_limit:
            parts.append(f"{self.stopped_by_limit} stopped by a limit")
        parts.append(f"{self.input_tokens:,} input and {self.output_tokens:,} output tokens")
        if self.cost is not None:
            parts.append(f"${self.cost:.4f}")
        if self.tokens_saved:
            saved = f" (${self.cost_saved:.4f})" if self.cost_saved else ""
            parts.append(f"{self.tokens_saved:,} tokens{saved} of them replayed from the journal")
        if self.p50_seconds is not None and self.p95_seconds is not None:
            parts.append(f"p50 {self.p50_seconds:.2f} s, p95 {self.p95_seconds:.2f} s")
        return ", ".join(parts)


class BatchTally:
    """A `BatchSummary` kept as results come (`rlm-graph batch`'s): it holds totals and
    each result's seconds, never an answer, so a batch of any size sums in little memory.
    ``finished``: how many results it has counted."""

    def __init__(self) -> None:
        self.finished = 0
        self._answered = self._stopped = 0
        self._input = self._output = self._saved = 0
        self._cost: float | None = None
        self._cost_saved = 0.0
        self._seconds: list[float] = []

    def add(self, result: BatchResult) -> None:
        self.finished += 1
        self._answered += result.ok
        self._stopped += result.ok and result.stop_reason is not None
        usage = result.usage
        self._input += usage.input_tokens
        self._output += usage.output_tokens
        self._saved += usage.tokens_saved
        self._cost_saved += usage.cost_saved
        if result.cost is not None:
            self._cost = (self._cost or 0.0) + result.cost
        self._seconds.append(result.seconds)

    def summary(self, skipped: int = 0) -> BatchSummary:
        """The totals so far; ``skipped``: the items a rerun found done already."""
        return BatchSummary(
            answered=self._answered,
            failed=self.finished - self._answered,
            skipped=skipped,
            stopped_by_limit=self._stopped,
            input_tokens=self._input,
            output_tokens=self._output,
            cost=self._cost,
            tokens_saved=self._saved,
            cost_saved=self._cost_saved,
            p50_seconds=_percentile(self._seconds, 0.50),
            p95_seconds=_percentile(self._seconds, 0.95),
        )


_RESULT_KEYS = frozenset(("id", "answer", "started_at", "finished_at", "seconds"))
"""What every result line has (`BatchResult.to_line`)."""


def glance(path: Path) -> ResultsFile:
    """The results file ``path`` as read before it is opened for a run (nothing done when
    it cannot be read as one; `ResultsFile.open` is what decides): which items a rerun
    will skip, and so whose context files it will not read."""
    results = ResultsFile(path)
    try:
        lines, _, _ = read_results(path, str(path), b'{"id"', _RESULT_KEYS)
        results._note_all(lines)
    except (ValueError, ConfigError):
        return ResultsFile(path)
    return results


class ResultsFile:
    """The results file of a batch: what is done already, and appending as items finish.

    Args:
        path: the JSON Lines file (created if missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # What each id's last answered line, and its last line, asked (None: a line that
        # says not, written before it was kept).
        self._answered: dict[str, str | None] = {}
        self._last: dict[str, str | None] = {}
        self._handle: IO[str] | None = None

    def open(self) -> ResultsFile:
        """Read what is done and open for appending, cutting off a partial last line.

        Raises:
            ConfigError: the file cannot be read or written, or a complete line in it is
                not a result (it is not a results file: refuse to append to it).
        """
        what = f"--output {str(self.path)!r}"
        try:
            regular_or_missing(self.path, what)  # a FIFO is refused before it is opened
            handle = open_private(self.path, "a")
            hold_alone(handle, what)  # one run at a time; read under the lock
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except OSError as exc:
            raise ConfigError(f"cannot write {what}: {exc.strerror}") from None
        try:
            try:
                lines, end, size = read_results(self.path, what, b'{"id"', _RESULT_KEYS)
                self._note_all(lines)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if end < size:
                os.truncate(self.path, end)
        except BaseException:
            handle.close()
            raise
        self._handle = handle
        return self

    def _note_all(self, lines: Iterable[tuple[int, bytes]]) -> None:
        for number, line in lines:
            self._note(line, number)

    def _note(self, line: bytes, number: int) -> None:
        try:
            record = json.loads(line)
            item_id, error, asked = str(record["id"]), record.get("error"), record.get("asked")
            stopped = record.get("stop_reason") is not None  # a partial answer
            if not _RESULT_KEYS <= record.keys():  # an items file has ids too
                raise KeyError("not a result")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(
                f"{self.path}:{number} is not a batch result line; --output must be a "
                "results file of rlm-graph batch (or a new path)"
            ) from None
        self._last[item_id] = asked if isinstance(asked, str) else None
        if error is None and not stopped:
            self._answered[item_id] = self._last[item_id]

    def is_done(self, item_id: str, asked: str | None = None, retry_failed: bool = False) -> bool:
        """Whether a rerun skips ``item_id``: it has a line, or (``retry_failed``) an
        answered one; with ``asked`` (`BatchItem.asked`), only if that line (the last
        answer, or the last line) was made for what the item asks now."""
        for lines in (self._answered,) if retry_failed else (self._answered, self._last):
            if item_id in lines and (asked is None or lines[item_id] in (None, asked)):
                return True
        return False

    def done(self, retry_failed: bool = False, asked: Mapping[str, str] | None = None) -> set[str]:
        """The ids a rerun skips (`is_done`), ``asked`` giving each item's hash by id."""
        hashes = asked if asked is not None else {}
        return {i for i in self._last if self.is_done(i, hashes.get(i), retry_failed)}

    def append(self, result: BatchResult) -> None:
        """Write one result line and flush it (a killed run keeps every finished item)."""
        assert self._handle is not None, "open() the results file first"
        self._handle.write(result.to_line())
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                handle.close()
            except OSError:  # a line that could not be written (a full disk) was said already
                pass

    def __enter__(self) -> ResultsFile:
        return self if self._handle is not None else self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
