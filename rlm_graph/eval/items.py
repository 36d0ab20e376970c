"""Evaluation items: one question over one context with its gold answer. Pure.

An item is one JSON object a line (``items.jsonl``)::

    {"id": "q-1", "question": "How many ...?", "answer": 12, "answer_type": "numeric",
     "context": "...the text..."}

- ``id``: a string or an integer, unique in the file;
- ``question``: what the method is asked (the completion's ``root_prompt``), with any
  instruction on the answer's form (the converters and tasks write it);
- ``answer``: the gold answer: a string (``exact``, ``label``, ``choice``), a number
  (``numeric``), or a list of two-element lists (``pairs``);
- ``answer_type``: how the prediction is scored (`rlm_graph.eval.scoring`);
- exactly one of ``context`` (a string, a list of documents, or a dict) and
  ``context_path`` (a ``.txt`` file of UTF-8 text, or a ``.json`` file holding the
  context value; relative to the items file's folder, and never out of it);
- ``meta``: anything else worth keeping (the source's own columns, the task's length...).

Invariants:
    - A file is checked whole before anything runs (`scan_items`): every bad line is
      reported with its number, and no item runs until the file is clean.
    - Contexts in files are read when an item is used, never all at once.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..batch.lines import coerce, item_id, read_lines, scan_ids
from ..errors import ConfigError, config_error

__all__ = [
    "ANSWER_TYPES",
    "AnswerType",
    "EvalItem",
    "asked_hash",
    "coerce_items",
    "context_tokens",
    "read_items",
    "sample_items",
    "scan_items",
]

AnswerType = Literal["exact", "numeric", "label", "pairs", "choice"]
ANSWER_TYPES: tuple[str, ...] = ("exact", "numeric", "label", "pairs", "choice")
_FIELDS = ("id", "question", "answer", "answer_type", "context", "context_path", "meta")


class EvalItem(BaseModel):
    """One question of an evaluation.

    Attributes:
        id: unique in the evaluation; every result row carries it.
        question: the question, as the method receives it.
        answer: the gold answer (see the module docstring for its shape per type).
        answer_type: ``exact``, ``numeric``, ``label``, ``pairs`` or ``choice``.
        context: the context, inline; or
        context_path: a ``.txt`` or ``.json`` file holding it (absolute once parsed).
        meta: free-form facts about the item (its source's columns, its length...).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    question: str
    answer: Any
    answer_type: AnswerType
    context: str | list[Any] | dict[str, Any] | None = None
    context_path: str | None = None
    meta: dict[str, Any] = {}

    def load_context(self) -> str | list[Any] | dict[str, Any]:
        """The context: inline, or read from ``context_path``.

        Raises:
            ConfigError: the file cannot be read, or a ``.json`` file is not JSON.
        """
        if self.context_path is None:
            return self.context if self.context is not None else ""
        path = Path(self.context_path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise ConfigError(
                f"item {self.id!r}: cannot read context_path {str(path)!r}: {reason}"
            ) from None
        if path.suffix.lower() != ".json":
            return text
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:
            why = str(exc) if isinstance(exc, ValueError) else "nested past Python's stack"
            raise ConfigError(
                f"item {self.id!r}: context_path {str(path)!r} is not JSON ({why})"
            ) from None
        if not isinstance(value, str | list | dict):
            raise ConfigError(
                f"item {self.id!r}: {str(path)!r} must hold a string, a list or an object"
            )
        return value

    @property
    def text_file(self) -> str | None:
        """``context_path`` when it is plain text (a completion can read it itself)."""
        if self.context_path is not None and Path(self.context_path).suffix.lower() != ".json":
            return self.context_path
        return None


def context_tokens(context: Any, question: str = "") -> int:
    """Tokens of a question and its context at the engine's estimate (four characters a
    token; a list or dict counted as its JSON, as a one-call answer sends it)."""
    text = context if isinstance(context, str) else json.dumps(context, default=str)
    return (len(text) + len(question) + 3) // 4


def asked_hash(question: str, context: Any) -> str:
    """A short hash of what an item asks (its question over its context): a result row
    keeps it, so that a row made for another item of the same id (another ``--seed`` of
    a task, an edited items file) is asked again rather than counted."""
    text = json.dumps([question, context], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _check_answer(answer: Any, answer_type: str) -> str | None:
    """Why ``answer`` cannot be a gold answer of ``answer_type``, else ``None``."""
    if answer_type == "numeric":
        if isinstance(answer, bool):
            return "a numeric answer must be a number"
        try:
            value = float(str(answer).replace(",", ""))
        except ValueError:
            return f"a numeric answer must be a number, not {answer!r}"
        return None if math.isfinite(value) else f"a numeric answer must be finite, not {answer!r}"
    if answer_type == "pairs":
        if not isinstance(answer, list) or not all(
            isinstance(p, list | tuple) and len(p) == 2 for p in answer
        ):
            return "a pairs answer must be a list of two-element lists, e.g. [[1, 2], [3, 4]]"
        return None
    if (
        not isinstance(answer, str | int | float)
        or isinstance(answer, bool)
        or str(answer).strip() == ""
    ):
        return f"an {answer_type} answer must be a non-empty string"
    if answer_type == "choice" and not (
        len(str(answer).strip()) == 1 and str(answer).strip().isalpha()
    ):
        return f"a choice answer is one letter (A, B, C...), not {answer!r}"
    return None


def _parse(raw: Mapping[str, Any], where: str, base: Path | None) -> EvalItem:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: an item is a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; an item has "
            f"{', '.join(_FIELDS)} (put anything else under 'meta')"
        )
    identifier = item_id(raw, where)
    if not isinstance(raw.get("question"), str) or not raw["question"].strip():
        raise ConfigError(f"{where}: 'question' (a non-empty string) is missing")
    answer_type = raw.get("answer_type")
    if answer_type not in ANSWER_TYPES:
        raise ConfigError(
            f"{where}: 'answer_type' must be one of {', '.join(ANSWER_TYPES)}, not {answer_type!r}"
        )
    if "answer" not in raw:
        raise ConfigError(f"{where}: 'answer' (the gold answer) is missing")
    problem = _check_answer(raw["answer"], answer_type)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    if ("context" in raw) == ("context_path" in raw):
        raise ConfigError(f"{where}: give exactly one of 'context' and 'context_path'")
    context_path = raw.get("context_path")
    if context_path is not None:
        if not isinstance(context_path, str) or not context_path:
            raise ConfigError(f"{where}: 'context_path' must be a path (a string)")
        context_path = _inside(Path(context_path), base, where)
    try:
        return EvalItem(
            id=identifier,
            question=raw["question"],
            answer=raw["answer"],
            answer_type=answer_type,
            context=raw.get("context"),
            context_path=context_path,
            meta=raw.get("meta") or {},
        )
    except ValidationError as exc:
        raise config_error(where, exc) from None


def _inside(path: Path, base: Path | None, where: str) -> str:
    """``path`` of an items file in ``base`` as an absolute path, refused when it leads
    out of ``base`` (``..``, an absolute path, a link): a downloaded items file must not
    send ``/proc/self/environ`` or ``~/.ssh`` to a model. Items given in code (``base``
    None) name any file."""
    if base is None:
        return str(path)
    folder = base.resolve()
    full = (folder / path).resolve()
    if not full.is_relative_to(folder):
        raise ConfigError(
            f"{where}: context_path {str(path)!r} leads out of the items file's folder "
            f"{str(folder)!r}; an items file names only files in its own folder or below "
            "(put the context file there, or the context inline)"
        )
    return str(full)


def _context_path_exists(item: EvalItem, where: str) -> None:
    if item.context_path is not None and not Path(item.context_path).is_file():
        raise ConfigError(f"{where}: context_path {item.context_path!r} is not a file")


def scan_items(path: Path) -> list[str]:
    """Check every line of an items file; return the ids in order.

    Raises:
        ConfigError: every bad line (up to ten), each with its number and the fix; a
            file with no item.
    """
    ids = scan_ids(
        path, _parse, what="the items file", title="bad items", check=_context_path_exists
    )
    if not ids:
        raise ConfigError(f"the items file {str(path)!r} holds no item")
    return ids


def read_items(path: Path, only: Iterable[str] | None = None) -> Iterator[EvalItem]:
    """The items of a file, one at a time (check it first with `scan_items`).

    Args:
        path: the JSONL file.
        only: ids to keep (the others are skipped without being parsed further).
    """
    return read_lines(path, _parse, what="the items file", only=only)


def coerce_items(items: Iterable[EvalItem | Mapping[str, Any]]) -> Iterator[EvalItem]:
    """Items given in code (`EvalItem` or dicts shaped as lines), checked one by one.

    Raises:
        ConfigError: a bad item, or an id given twice.
    """
    return coerce(items, _parse, EvalItem)


def sample_items(ids: list[str], n: int | None, seed: int) -> list[str]:
    """``n`` of ``ids`` drawn with ``seed`` (all of them when ``n`` is None or larger), in
    their original order: the same ``n`` and ``seed`` always pick the same items."""
    if n is None or n >= len(ids):
        return list(ids)
    if n < 1:
        raise ConfigError(f"--n must be at least 1, not {n}")
    chosen = set(random.Random(seed).sample(range(len(ids)), n))
    return [item_id for index, item_id in enumerate(ids) if index in chosen]
