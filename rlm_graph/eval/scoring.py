"""Scoring a prediction against a gold answer, as the benchmarks' papers define it. Pure.

Every score is in [0, 1]; a missing prediction (an error, a context that does not fit)
scores 0. One function per answer type, and `score` to dispatch:

| type | score | from |
| --- | --- | --- |
| ``exact`` | 1 if the prediction equals the gold answer after `normalize` | SQuAD-style exact match; S-NIAH, BrowseComp-Plus answers |
| ``label`` | as ``exact``, on the answer part of the prediction (`answer_part`); the three comparison phrases match as OOLONG's harness matches them | OOLONG (``LABEL``, ``USER``, ``COMPARISON``...) |
| ``numeric`` | ``0.75 ** abs(y - y_hat)``, ``y_hat`` the last number of the answer part | OOLONG (``NUMERIC``) |
| ``pairs`` | F1 of the predicted set of unordered pairs (a JSON list of pairs) against the gold set | OOLONG-Pairs (the RLM paper) |
| ``choice`` | 1 if the chosen letter is the gold one | LongBench-v2 (CodeQA) |

Invariants:
    - Pure: no I/O, no clock, no randomness; the same inputs always give the same score.
    - Lenient in reading the prediction (markdown, a leading ``Answer:``), strict in
      comparing: a wrong value never scores above what its formula gives.
"""

from __future__ import annotations

import json
import math
import re
import string
import unicodedata
from collections.abc import Iterable
from typing import Any

__all__ = [
    "answer_part",
    "choice_accuracy",
    "choice_letter",
    "exact_match",
    "label_match",
    "normalize",
    "number_in",
    "numeric_score",
    "pairs_f1",
    "parse_pairs",
    "score",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_COMPARISONS = ("more common", "less common", "same frequency")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def normalize(text: Any) -> str:
    """Lower case, accents folded, punctuation, articles and extra spaces removed."""
    folded = unicodedata.normalize("NFKD", str(text))
    folded = "".join(c for c in folded if not unicodedata.combining(c)).lower()
    folded = folded.translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", folded).split())


def exact_match(prediction: str | None, gold: Any) -> float:
    """1.0 when the prediction equals the gold answer after `normalize`, else 0.0."""
    if prediction is None:
        return 0.0
    return 1.0 if normalize(prediction) == normalize(gold) and normalize(gold) else 0.0


def answer_part(prediction: str) -> str:
    """The answer in a reply, as OOLONG's harness reads it: the text after the last
    colon (``Label: location`` -> ``location``), first line, markdown and brackets
    removed; a reply with no colon is taken whole."""
    text = prediction.strip()
    if ":" in text:
        text = text.rsplit(":", 1)[1]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return text.strip().strip("*_`'\"[]{}() ").rstrip(".").strip()


def label_match(prediction: str | None, gold: Any) -> float:
    """`exact_match` on `answer_part`; a comparison phrase (``more common``, ``less
    common``, ``same frequency``) matches a gold answer that contains it."""
    if prediction is None:
        return 0.0
    part = normalize(answer_part(prediction))
    wanted = normalize(gold)
    if part and part == wanted:
        return 1.0
    for phrase in _COMPARISONS:
        if phrase in part and phrase in wanted:
            return 1.0
    return 0.0


def number_in(prediction: str) -> float | None:
    """The last number of the answer part (``1,204`` reads as 1204), else ``None``."""
    found = _NUMBER.findall(answer_part(prediction).replace(",", ""))
    if not found:
        found = _NUMBER.findall(prediction.replace(",", ""))
    return float(found[-1]) if found else None


def numeric_score(prediction: str | None, gold: Any) -> float:
    """OOLONG's partial credit: ``0.75 ** abs(gold - predicted)``; 0.0 with no number."""
    if prediction is None:
        return 0.0
    value = number_in(prediction)
    if value is None:
        return 0.0
    distance = abs(float(str(gold).replace(",", "")) - value)
    return 0.75**distance if math.isfinite(distance) else 0.0


def _pair(a: Any, b: Any) -> tuple[str, str]:
    left, right = sorted((str(a).strip(), str(b).strip()))
    return left, right


def parse_pairs(prediction: str) -> set[tuple[str, str]]:
    """The set of unordered pairs in a reply: a JSON list of two-element lists (the
    asked-for form) found anywhere in it, else every ``(a, b)`` written out."""
    start, end = prediction.find("["), prediction.rfind("]")
    if 0 <= start < end:
        try:
            value = json.loads(prediction[start : end + 1])
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            value = None
        if isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
            return {_pair(a, b) for a, b in value}
    return {
        _pair(a, b) for a, b in re.findall(r"\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)", prediction)
    }


def pairs_f1(prediction: str | None, gold: Iterable[Iterable[Any]]) -> float:
    """F1 of the predicted pairs against the gold pairs (each pair unordered).

    Both empty: 1.0. One of them empty: 0.0.
    """
    if prediction is None:
        return 0.0
    truth = {_pair(*pair) for pair in gold}
    predicted = parse_pairs(prediction)
    if not truth and not predicted:
        return 1.0
    hits = len(truth & predicted)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(truth)
    return 2 * precision * recall / (precision + recall)


def choice_letter(prediction: str) -> str | None:
    """The letter a reply chooses: LongBench-v2's ``The correct answer is (B)`` first,
    then ``answer: B`` / ``answer is B``, then a reply that is just ``B`` or ``(B)``."""
    text = prediction.replace("*", "")
    for pattern in (  # the keyword in any case, the letter a capital
        r"(?i:correct answer is)\s*\(([A-Z])\)",
        r"(?i:correct answer is)\s*([A-Z])\b",
        r"(?i:answer)(?: (?i:is)|:)\s*\(?([A-Z])\)?(?![A-Za-z])",
    ):
        found = re.search(pattern, text)
        if found:
            return found.group(1)
    bare = re.fullmatch(r"\s*\(?([A-Za-z])\)?[.)]?\s*", text)
    return bare.group(1).upper() if bare else None


def choice_accuracy(prediction: str | None, gold: Any) -> float:
    """1.0 when the reply chooses the gold letter, else 0.0."""
    if prediction is None:
        return 0.0
    return 1.0 if choice_letter(prediction) == str(gold).strip().upper() else 0.0


_SCORERS = {
    "exact": exact_match,
    "label": label_match,
    "numeric": numeric_score,
    "pairs": pairs_f1,
    "choice": choice_accuracy,
}


def score(answer_type: str, gold: Any, prediction: str | None) -> float:
    """The score in [0, 1] of ``prediction`` for an item of ``answer_type``.

    Raises:
        ValueError: an unknown answer type.
    """
    try:
        scorer = _SCORERS[answer_type]
    except KeyError:
        raise ValueError(
            f"unknown answer_type {answer_type!r}; one of {', '.join(_SCORERS)}"
        ) from None
    value = float(scorer(prediction, gold))
    return min(1.0, max(0.0, value))
