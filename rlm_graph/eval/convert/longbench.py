"""LongBench-v2's published rows (``THUDM/LongBench-v2``'s ``data.json``) as items. Pure.

A row has ``_id``, ``domain``, ``sub_domain``, ``difficulty``, ``length``,
``question``, ``choice_A`` .. ``choice_D``, ``answer`` (a letter) and ``context``. The
RLM paper's CodeQA is the domain "Code Repository Understanding"; that is what is kept
unless every domain is asked for.

The question is LongBench-v2's zero-shot template without the document (the document
is the context): the question, the four choices, and "Format your response as follows:
"The correct answer is (insert answer here)"". Scoring: ``choice`` (the letter read as
LongBench-v2's ``extract_answer`` reads it, `rlm_graph.eval.scoring.choice_letter`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ...errors import ConfigError
from .source import require_columns

__all__ = ["CODEQA_DOMAIN", "COLUMNS", "longbench_rows"]

CODEQA_DOMAIN = "Code Repository Understanding"
COLUMNS = (
    "_id",
    "domain",
    "question",
    "choice_A",
    "choice_B",
    "choice_C",
    "choice_D",
    "answer",
    "context",
)


def _question(row: Mapping[str, Any]) -> str:
    choices = "\n".join(f"({letter}) {row[f'choice_{letter}']}" for letter in "ABCD")
    return (
        f"What is the correct answer to this question: {row['question']}\nChoices:\n{choices}\n\n"
        'Format your response as follows: "The correct answer is (insert answer here)".'
    )


def longbench_rows(
    rows: Iterable[Mapping[str, Any]], *, source: str, all_domains: bool = False
) -> Iterator[dict[str, Any]]:
    """Items (as JSON objects) from LongBench-v2 rows: CodeQA's, or every domain's."""
    for index, row in enumerate(rows):
        where = f"{source} row {index}"
        require_columns(row, COLUMNS, where, "LongBench-v2")
        if not all_domains and row["domain"] != CODEQA_DOMAIN:
            continue
        answer = str(row["answer"]).strip().upper()
        if answer not in ("A", "B", "C", "D"):
            raise ConfigError(f"{where}: answer {row['answer']!r} is not one of A, B, C, D")
        yield {
            "id": str(row["_id"]),
            "question": _question(row),
            "answer": answer,
            "answer_type": "choice",
            "context": str(row["context"]),
            "meta": {
                "source": "longbench-v2",
                **{k: row[k] for k in ("domain", "sub_domain", "difficulty", "length") if k in row},
            },
        }
