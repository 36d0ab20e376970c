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
    - Linear in the reply: a reply is the model's, untrusted, so no pattern here
      backtracks over it more than once, and `score` reads its first `MAX_REPLY_CHARS`
      characters only.
    - Lenient in reading the prediction (markdown, a leading ``Answer:``), strict in
      comparing: a wrong value never scores above what its formula gives.
"""

from __future__ import annotations

import ast
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "MAX_REPLY_CHARS",
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
# A number keeps its sign and decimal point (``3.5`` is not ``35``, ``-5`` not ``5``)
# and loses its thousands commas (``1,204`` is ``1204``); elsewhere punctuation goes.
_NUMBER_WORD = re.compile(r"(?<![\w.-])-?\d+(?:,\d{3})*(?:\.\d+)?(?!\d)")
# A dash between two digits is a range (``3-5``, ``3–5``): a space, not punctuation
# to drop (``35``). A minus sign (U+2212) is a sign, as ``-``.
_RANGE_DASH = re.compile(r"(?<=\d)[-\u2010-\u2015](?=\d)")
_MINUS = "\u2212"
_COMPARISONS = ("more common", "less common", "same frequency")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# Each group stops at the first comma or bracket, so each character is scanned by at
# most one ``(`` start: linear. (Stripping inside the pattern, ``\s*([^,()]+?)\s*``,
# backtracked cubically: ``"(" + 4000 spaces`` took half a minute.)
_WRITTEN_PAIR = re.compile(r"\(([^,()]*),([^,()]*)\)")

MAX_REPLY_CHARS = 1_000_000
"""`score` reads a reply's first million characters: a reply is the model's, and every
scorer is linear in what it reads, so this bounds the time scoring takes."""


def normalize(text: Any) -> str:
    """Lower case, accents folded, punctuation (but a number's sign and decimal point),
    articles and extra spaces removed.

    A dash between two numbers is a range, read as a space (``3-5`` is ``3 5``; it was
    ``35``), and a minus sign (U+2212) is a sign (``−5`` is ``-5``; it was not a number).
    """
    folded = unicodedata.normalize("NFKD", str(text))
    folded = _signed("".join(c for c in folded if not unicodedata.combining(c)).lower())
    pieces, last = [], 0
    for number in _NUMBER_WORD.finditer(folded):
        pieces += [_unpunctuated(folded[last : number.start()]), number[0].replace(",", "")]
        last = number.end()
    pieces.append(_unpunctuated(folded[last:]))
    return " ".join(_ARTICLES.sub(" ", "".join(pieces)).split())


def _signed(text: str) -> str:
    """``text`` with its minus signs read as ``-`` and its ranges' dashes as spaces."""
    return _RANGE_DASH.sub(" ", text.replace(_MINUS, "-"))


def _unpunctuated(text: str) -> str:
    """``text`` without punctuation, Unicode's too (curly quotes, dashes, ``¿``)."""
    return "".join(c for c in text if not unicodedata.category(c).startswith("P"))


def exact_match(prediction: str | None, gold: Any) -> float:
    """1.0 when the prediction equals the gold answer after `normalize`, else 0.0.

    A gold answer of articles and punctuation alone (``The``, ``—``) normalises to
    nothing, and used to match no reply: it is compared as stripped, lower-cased text.
    """
    if prediction is None:
        return 0.0
    return 1.0 if _same(prediction, gold) else 0.0


def _same(text: str, gold: Any) -> bool:
    wanted = normalize(gold)
    if wanted:
        return normalize(text) == wanted
    bare = str(gold).strip().lower()
    return bool(bare) and text.strip().lower() == bare


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
    """`exact_match` on `answer_part` (a gold answer that normalises to nothing compared
    as stripped, lower-cased text); else the first comparison phrase (``more
    common``, ``less common``, ``same frequency``) the answer part names matches a gold
    answer whose first is the same. (Any phrase of the reply used to match: a reply
    hedging with all three scored 1 against every comparison.)"""
    if prediction is None:
        return 0.0
    part = answer_part(prediction)
    if _same(part, gold):
        return 1.0
    said = _first_comparison(normalize(part))
    return 1.0 if said is not None and said == _first_comparison(normalize(gold)) else 0.0


def _first_comparison(text: str) -> str | None:
    """The comparison phrase that comes first in ``text``, else ``None``."""
    found = [(text.find(phrase), phrase) for phrase in _COMPARISONS if phrase in text]
    return min(found)[1] if found else None


def number_in(prediction: str) -> float | None:
    """The last number of the answer part (``1,204`` reads as 1204, ``−5`` as -5, ``3-5``
    as 3 then 5), else ``None``."""
    found = _NUMBER.findall(_signed(answer_part(prediction).replace(",", "")))
    if not found:
        found = _NUMBER.findall(_signed(prediction.replace(",", "")))
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


def _lists(text: str) -> Iterator[Any]:
    """The values of the outermost ``[...]`` spans of ``text``, in order, each read as
    JSON or else as a Python literal (``FINAL(pairs)`` hands over ``str()`` of a list of
    tuples of strings). Linear: the spans do not overlap, and each is read once."""
    depth, start = 0, -1
    for index, char in enumerate(text):
        if char == "[":
            if depth == 0:
                start = index
            depth += 1
        elif char == "]" and depth:
            depth -= 1
            if depth == 0:
                span = text[start : index + 1]
                try:
                    yield json.loads(span)
                    continue
                except (ValueError, RecursionError):  # not JSON, or nested past the stack
                    pass
                try:
                    yield ast.literal_eval(span)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    pass


def _is_pairs(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(p, list | tuple) and len(p) == 2 for p in value
    )


def parse_pairs(prediction: str) -> set[tuple[str, str]]:
    """The set of unordered pairs in a reply: the first list of two-element lists (the
    asked-for form, as JSON or as Python prints it) found anywhere in it, else every
    ``(a, b)`` written out (quotes around the names removed)."""
    for value in _lists(prediction):
        if _is_pairs(value):
            return {_pair(a, b) for a, b in value}
    pairs = set()
    for a, b in _WRITTEN_PAIR.findall(prediction):
        left, right = _name(a), _name(b)
        if left and right:
            pairs.add(_pair(left, right))
    return pairs


def _name(text: str) -> str:
    """A name of a written-out pair: spaces, then quotes around it, removed."""
    return text.strip().strip("'\"").strip()


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
    # The keyword in any case, the letter a capital. Possessive runs of spaces (``\s*+``):
    # two runs side by side (``is\s*:?\s*``) backtracked quadratically over the spaces.
    for pattern in (
        r"(?i:correct answer is)\s*+\(([A-Z])\)",
        r"(?i:correct answer is)\s*+([A-Z])\b",
        r"(?i:answer)(?:\s++(?i:is)\s*+:?|\s*+:)\s*+\(?([A-Z])\)?(?![A-Za-z])",
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
    """The score in [0, 1] of ``prediction`` for an item of ``answer_type``, from the
    reply's first `MAX_REPLY_CHARS` characters (an answer past them is not read).

    Raises:
        ValueError: an unknown answer type.
    """
    try:
        scorer = _SCORERS[answer_type]
    except KeyError:
        raise ValueError(
            f"unknown answer_type {answer_type!r}; one of {', '.join(_SCORERS)}"
        ) from None
    if prediction is not None:
        prediction = prediction[:MAX_REPLY_CHARS]
    value = float(scorer(prediction, gold))
    return min(1.0, max(0.0, value))
