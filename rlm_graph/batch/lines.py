"""Files of items, one JSON object a line (pure): the one reader batches and evaluations
share.

A file is checked whole before anything runs (`scan_ids`): every bad line is reported
(up to ten), each with its number and what to fix, and the contexts are not kept in
memory. `read_lines` then yields the items one at a time; `coerce` checks items given in
code. What an item is (`Parse`) and what else a line must satisfy (``check``) are the
caller's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .._files import has_surrogate
from ..errors import ConfigError

__all__ = ["MAX_DEPTH", "Parse", "coerce", "item_id", "jsonl_lines", "read_lines", "scan_ids"]


class _Item(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=_Item)

Parse = Callable[[Any, str, "Path | None"], T]


def item_id(raw: Mapping[str, Any], where: str) -> str:
    """A line's ``id`` as text: a non-empty string or an integer, which a results file
    can hold (so that a rerun finds it there).

    Raises:
        ConfigError: another type, an empty string, or text with a lone surrogate.
    """
    value = raw.get("id")
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise ConfigError(f"{where}: 'id' must be a non-empty string or an integer")
    if isinstance(value, str) and has_surrogate(value):
        raise ConfigError(
            f"{where}: 'id' {value!r} holds half a character (a lone surrogate, as the "
            "JSON escape \\ud83d alone), which no results file can hold; fix the id"
        )
    return str(value)


"""``parse(raw, where, base)``: the item of a decoded line (``where``: ``"file:line"`` for
messages; ``base``: the file's folder, for relative paths; None for items from code).
Raises `ConfigError` naming ``where``."""

_SHOWN = 10  # bad lines a scan reports in full

MAX_DEPTH = 200
"""Arrays and objects an item may nest, one in another. Python's JSON reader gives up
near its recursion limit, a limit on the depth of the stack it runs on: the whole-file
check (the main thread) and the run (a batch's own thread, deeper) would judge a line
near it differently, and the run would stop at a line the check let pass. A fixed depth
well under it gives one verdict in both."""

# A string (to its end, or to the line's end when it never closes: one pass, with no
# start tried again, however its escapes fall) or a bracket.
_TOKEN = re.compile(r'"(?:[^"\\]+|\\.)*"?|[\[\]{}]', re.DOTALL)


def _too_deep(line: str) -> bool:
    """Whether ``line`` nests arrays and objects past `MAX_DEPTH` (brackets inside its
    strings aside); cheap when it has fewer brackets than that, as most lines do."""
    if line.count("[") + line.count("{") <= MAX_DEPTH:
        return False
    depth = 0
    for token in _TOKEN.finditer(line):
        char = line[token.start()]
        if char != '"':
            depth += 1 if char in "[{" else -1
            if depth > MAX_DEPTH:
                return True
    return False


def jsonl_lines(path: Path, what: str) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, decoded object or None, error) for every non-blank line.

    Raises:
        ConfigError: the file cannot be read (``what`` names it: ``"--input"``).
    """
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a BOM some editors write
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, None, f"not UTF-8 text (byte {exc.start + 1} of the line)"
                continue
            if _too_deep(line):
                yield number, None, f"nested more than {MAX_DEPTH} arrays and objects deep"
                continue
            try:
                yield number, json.loads(line), None
            except ValueError as exc:
                yield number, None, f"not JSON ({exc})"
            except RecursionError:
                yield number, None, "not JSON this reader takes (nested past Python's stack)"


def scan_ids(
    path: Path,
    parse: Parse[T],
    *,
    what: str,
    title: str,
    check: Callable[[T, str], None] | None = None,
) -> list[str]:
    """Check every line of ``path``; return the ids in order.

    Raises:
        ConfigError: every bad line (up to ten), each with its number and the fix, under
            ``title`` (``"bad input"``); an id used twice is a bad line.
    """
    ids: list[str] = []
    seen: dict[str, int] = {}
    problems: list[str] = []
    for number, raw, error in jsonl_lines(path, what):
        where = f"{path}:{number}"
        try:
            if error is not None:
                raise ConfigError(f"{where}: {error}")
            item = parse(raw, where, path.parent)
            if check is not None:
                check(item, where)
            if item.id in seen:
                raise ConfigError(f"{where}: id {item.id!r} already used on line {seen[item.id]}")
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        seen[item.id] = number
        ids.append(item.id)
    if problems:
        more = f"\n... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise ConfigError(f"{title}:\n" + "\n".join(problems[:_SHOWN]) + more)
    return ids


def read_lines(
    path: Path, parse: Parse[T], *, what: str, only: Iterable[str] | None = None
) -> Iterator[T]:
    """The items of ``path``, one at a time (check the file first with `scan_ids`);
    with ``only``, the lines of other ids are skipped before they are parsed."""
    keep = None if only is None else set(only)
    for number, raw, error in jsonl_lines(path, what):
        if error is not None:
            raise ConfigError(f"{path}:{number}: {error}")
        if keep is not None and isinstance(raw, Mapping) and str(raw.get("id")) not in keep:
            continue
        yield parse(raw, f"{path}:{number}", path.parent)


def coerce(items: Iterable[Any], parse: Parse[T], kind: type[T]) -> Iterator[T]:
    """Items given in code (``kind`` or dicts shaped as lines), checked one by one.

    Raises:
        ConfigError: a bad item, or an id given twice.
    """
    seen: set[str] = set()
    for index, raw in enumerate(items):
        item = raw if isinstance(raw, kind) else parse(raw, f"item {index}", None)
        if item.id in seen:
            raise ConfigError(f"item {index}: id {item.id!r} is given twice; ids must be unique")
        seen.add(item.id)
        yield item
