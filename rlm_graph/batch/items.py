"""Batch items: what one line of a batch's input says, checked before anything runs.

An item is one completion: an ``id`` (unique in the batch), a ``query`` and its context,
either inline (``context``: a string, list or dict) or in a file (``context_file``, read
when the item starts, relative to the input file's folder). Any other key is a per-item
override of a completion limit (`ITEM_LIMITS`). Pure: no trio.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from ..errors import ConfigError, config_error
from ..limits import Limits
from .lines import coerce, item_id, read_lines, scan_ids

__all__ = ["ITEM_LIMITS", "BatchItem", "coerce_items", "read_items", "scan_items"]

# Limits one completion may set for itself; the others (provider concurrency, child
# completions in flight) belong to the whole batch.
ITEM_LIMITS = (
    "batch_max_concurrent",
    "max_budget",
    "max_depth",
    "max_errors",
    "max_iterations",
    "max_timeout",
    "max_tokens",
)
_FIELDS = ("id", "query", "context", "context_file")


class BatchItem(BaseModel):
    """One completion of a batch.

    Attributes:
        id: the item's id, unique in the batch; results carry it.
        query: the question (the completion's ``root_prompt``).
        context: the context, inline; or
        context_file: a file whose text is the context (from an input line: the path as
            written there, joined to the input file's folder when relative).
        limits: per-item overrides of completion limits (``{"max_iterations": 5}``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    query: str
    context: str | list[Any] | dict[str, Any] | None = None
    context_file: str | None = None
    limits: dict[str, Any] = {}

    def load_context(self) -> str | list[Any] | dict[str, Any]:
        """The context: inline, or read from ``context_file`` (UTF-8 text).

        Raises:
            ConfigError: the file cannot be read.
        """
        if self.context_file is None:
            return self.context if self.context is not None else ""
        try:
            return Path(self.context_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise ConfigError(
                f"item {self.id!r}: cannot read context_file {self.context_file!r}: {reason}"
            ) from None

    _asked: str | None = PrivateAttr(default=None)  # kept by `loaded`, which drops the path
    # The context file's path as its input line wrote it: what the item asks, wherever
    # the input file is read from (the folder it is joined to depends on the caller's).
    _file_as_written: str | None = PrivateAttr(default=None)

    def asked(self) -> str:
        """A short hash of what this item asks (its question, its context or its
        context file's path as the input line writes it, its limits): a result line keeps
        it, so that a rerun asks again an item edited since its line was written, and
        only that (``--input items.jsonl`` and ``--input /data/items.jsonl`` are one
        file's items). What JSON cannot hold (a context given in code) is hashed as its
        ``repr``."""
        if self._asked is None:
            path = self._file_as_written or self.context_file
            where = {"context_file": path} if path else self.context
            if not path and isinstance(where, dict) and set(where) == {"context_file"}:
                where = ["context", where]  # not the hash of a file item naming that path
            asks = [self.query, where, self.limits]
            try:
                text = json.dumps(asks, sort_keys=True, ensure_ascii=False, default=repr)
            except (ValueError, RecursionError):  # a context given in code that holds itself
                text = repr(asks)
            data = text.encode("utf-8", "surrogatepass")
            self._asked = hashlib.blake2b(data, digest_size=8).hexdigest()
        return self._asked

    def loaded(self) -> BatchItem:
        """This item with its context read in (for executors that ship items elsewhere)."""
        if self.context_file is None:
            return self
        asked = self.asked()  # what it asks is its path's, as where the file is not read
        loaded = self.model_copy(update={"context": self.load_context(), "context_file": None})
        loaded._asked = asked
        return loaded


def _parse(raw: Mapping[str, Any], where: str, base: Path | None) -> BatchItem:
    """An item from a decoded input line (or a dict given in code)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: an item is a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_FIELDS) - set(ITEM_LIMITS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; an item has id, query, "
            f"context or context_file, and may override {', '.join(ITEM_LIMITS)}"
        )
    identifier = item_id(raw, where)
    if "query" not in raw:
        raise ConfigError(f"{where}: 'query' (the question, a string) is missing")
    if not isinstance(raw["query"], str):
        raise ConfigError(
            f"{where}: 'query' must be the question as a string, not {type(raw['query']).__name__}"
        )
    if ("context" in raw) == ("context_file" in raw):
        raise ConfigError(f"{where}: give exactly one of 'context' and 'context_file'")
    if "context" in raw and not isinstance(raw["context"], str | list | dict):
        raise ConfigError(
            f"{where}: 'context' must be a string, a list or an object, not "
            f"{'null' if raw['context'] is None else type(raw['context']).__name__}"
        )
    context_file = raw.get("context_file")
    if context_file is not None:
        if not isinstance(context_file, str) or not context_file:
            raise ConfigError(f"{where}: 'context_file' must be a path (a string)")
        path = Path(context_file)
        context_file = str(path if path.is_absolute() or base is None else base / path)
    limits = {k: raw[k] for k in ITEM_LIMITS if k in raw}
    if limits:
        try:
            Limits.from_kwargs(**limits)  # a bad value is reported here, with its line
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    try:
        item = BatchItem(
            id=identifier,
            query=raw["query"],
            context=raw.get("context"),
            context_file=context_file,
            limits=limits,
        )
    except ValidationError as exc:
        raise config_error(where, exc) from None
    item._file_as_written = raw.get("context_file")
    return item


def _context_file_exists(item: BatchItem, where: str) -> None:
    if item.context_file is not None and not Path(item.context_file).is_file():
        raise ConfigError(f"{where}: context_file {item.context_file!r} is not a file")


def scan_items(
    path: Path,
    check: Callable[[BatchItem, str], None] | None = None,
    done: Callable[[BatchItem], bool] | None = None,
) -> list[str]:
    """Check every line of a JSONL input file; return the ids in order.

    Reads the file once without keeping contexts in memory, so a bad line is reported
    before any completion runs, whatever the file's size.

    Args:
        path: the file.
        check: more to check of each item (``check(item, "file:line")`` raises
            `ConfigError`), such as `item_limits_check`'s.
        done: whether a rerun skips an item: then its ``context_file`` need not be there
            any more.

    Raises:
        ConfigError: every bad line (up to ten), with its number and the fix.
    """

    def checked(item: BatchItem, where: str) -> None:
        if done is None or not done(item):
            _context_file_exists(item, where)
        if check is not None:
            check(item, where)

    return scan_ids(path, _parse, what="--input", title="bad input", check=checked)


def read_items(path: Path) -> Iterator[BatchItem]:
    """The items of a JSONL input file, one at a time (check it first with `scan_items`)."""
    return read_lines(path, _parse, what="--input")


def coerce_items(items: Iterable[BatchItem | Mapping[str, Any]]) -> Iterator[BatchItem]:
    """Items given in code (`BatchItem` or dicts shaped as input lines), checked one by one.

    Raises:
        ConfigError: a bad item, or an id given twice.
    """
    return coerce(items, _parse, BatchItem)
