"""OOLONG's published rows (``oolongbench/oolong-synth`` on Hugging Face) as items. Pure.

A row has ``id``, ``context_len``, ``dataset`` (``trec_coarse``, ``agnews``...),
``context_window_text``, ``context_window_id``, ``question``, ``answer``,
``answer_type`` (``ANSWER_TYPE.NUMERIC``, ``.LABEL``, ``.COMPARISON``, ``.USER``,
``.DATE``, ``.MONTH_YEAR``), ``input_subset``, ``task`` and ``task_group``. Its
``answer`` is a Python list literal as text (``"['abbreviation']"``, ``"[12]"``,
``"[datetime.date(2023, 1, 5)]"``), whose first element is the gold answer, as in
OOLONG's own harness (``synth_process_response`` in ``src/eval/eval_helpers.py``).

Scoring as that harness scores: ``NUMERIC`` -> ``numeric`` (0.75 ** error), every other
type -> ``label`` (exact match of the answer part; the comparison phrases match as
there). One difference: a ``DATE`` answer compares as text in the form ``Mar 05, 2023``
(the records' own form), where the harness parses dates with dateutil.
"""

from __future__ import annotations

import ast
import datetime
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ...errors import ConfigError
from .source import require_columns

__all__ = ["COLUMNS", "oolong_rows"]

COLUMNS = ("id", "question", "answer", "answer_type", "context_window_text")
_DATE = re.compile(r"datetime\.date\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)")


def _gold(answer: Any, where: str) -> Any:
    text = str(answer).strip()
    date = _DATE.search(text)
    if date:
        year, month, day = (int(g) for g in date.groups())
        try:
            return datetime.date(year, month, day).strftime("%b %d, %Y")
        except (ValueError, OverflowError) as exc:
            raise ConfigError(f"{where}: answer {text[:60]!r} is no date ({exc})") from None
    if not text.startswith("["):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError, MemoryError):  # nested past the stack
        raise ConfigError(
            f"{where}: answer {text[:60]!r} is not the list literal OOLONG writes"
        ) from None
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{where}: answer {text[:60]!r} is an empty list")
    return value[0]


def oolong_rows(rows: Iterable[Mapping[str, Any]], *, source: str) -> Iterator[dict[str, Any]]:
    """Items (as JSON objects) from OOLONG rows."""
    for index, row in enumerate(rows):
        where = f"{source} row {index}"
        require_columns(row, COLUMNS, where, "OOLONG (oolongbench/oolong-synth)")
        kind = str(row["answer_type"]).rsplit(".", 1)[-1].upper()
        gold = _gold(row["answer"], where)
        numeric = kind == "NUMERIC"
        if numeric:
            try:
                gold = int(str(gold).strip())
            except ValueError:
                raise ConfigError(f"{where}: a NUMERIC answer {gold!r} is not a number") from None
        meta = {
            k: v for k, v in row.items() if k not in ("context_window_text", "question", "answer")
        }
        yield {
            "id": str(row["id"]),
            "question": str(row["question"]),
            "answer": gold if numeric else str(gold),
            "answer_type": "numeric" if numeric else "label",
            "context": str(row["context_window_text"]),
            "meta": {"source": "oolong", **meta},
        }
