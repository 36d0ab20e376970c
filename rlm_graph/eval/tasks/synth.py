"""``synth-oolong`` and ``synth-oolong-pairs``: tasks in the shape of OOLONG's
``trec_coarse`` split and of the RLM paper's OOLONG-Pairs, generated from a seed. Pure.

The context is a list of records, one a line, as OOLONG writes them::

    Date: Mar 02, 2023 || User: 48213 || Instance: Where is the Lighthouse of Varn ?

Each instance is a question of one of TREC's six coarse classes (abbreviation,
description and abstract concept, entity, human being, location, numeric value); the
class is never written, so a method must classify every line to aggregate.

- ``synth-oolong``: how many instances have a label (overall, or for one user), or
  which label is the most common: ``numeric`` (0.75 ** error) or ``label`` scoring.
- ``synth-oolong-pairs``: every pair of users who both have an instance of a given
  label, as a JSON list of pairs: ``pairs`` scoring (F1).

What they are not: OOLONG. Its instances are real TREC questions, some hard to
classify, with a label distribution fixed per window; these come from templates whose
class a model (or a regular expression) reads off easily. They test aggregation at scale
and the harness, not classification. For the published numbers, convert OOLONG's own
files (``rlm-graph eval convert --from oolong``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence

from ..items import EvalItem
from .text import CHARS_PER_TOKEN, length_label

__all__ = ["LABELS", "oolong_item", "oolong_items", "pairs_item", "pairs_items"]

LABELS = (
    "abbreviation",
    "description and abstract concept",
    "entity",
    "human being",
    "location",
    "numeric value",
)

_THINGS = (
    "telescope",
    "compass",
    "printing press",
    "bicycle",
    "thermometer",
    "steam engine",
    "microscope",
    "typewriter",
    "sewing machine",
    "barometer",
    "lighthouse lamp",
    "zipper",
)
_PLACES = (
    "Varn",
    "Ostrela",
    "Kembridge",
    "Port Alder",
    "Mirelle",
    "Tolvik",
    "Sandor Bay",
    "Quennel",
    "Brisk Hollow",
    "Altamar",
    "Fenwick",
    "Lake Orrin",
)
_ANIMALS = ("heron", "otter", "lynx", "marten", "ibis", "tapir", "puffin", "gecko")
_CONCEPTS = ("inflation", "irony", "entropy", "democracy", "photosynthesis", "gravity", "nostalgia")
_ACRONYMS = ("NASA", "UNESCO", "RADAR", "LASER", "SCUBA", "OPEC", "AWOL", "NATO", "FIFA", "CPU")

_TEMPLATES: dict[str, tuple[str, ...]] = {
    "abbreviation": (
        "What does {acronym} stand for ?",
        "What is the full form of {acronym} ?",
        "What is the abbreviation for the {thing} society ?",
    ),
    "description and abstract concept": (
        "What is the meaning of {concept} ?",
        "Why does a {thing} need oiling ?",
        "How does a {thing} work ?",
        "What is the origin of the word {concept} ?",
    ),
    "entity": (
        "What animal is drawn on the flag of {place} ?",
        "What metal is a {thing} made of ?",
        "What kind of bird is the {animal} of {place} ?",
    ),
    "human being": (
        "Who invented the {thing} ?",
        "Who founded the city of {place} ?",
        "Who was the first mayor of {place} ?",
    ),
    "location": (
        "Where is {place} ?",
        "In which country is the {animal} museum of {place} ?",
        "What river runs through {place} ?",
    ),
    "numeric value": (
        "How many people live in {place} ?",
        "When was the {thing} invented ?",
        "How far is {place} from {place2} ?",
        "How much does a {thing} weigh ?",
    ),
}

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_LABEL_LIST = ", ".join(f"'{label}'" for label in LABELS)
_HEADER = (
    "The following lines contain {count} general-knowledge questions, one per line. Each "
    "line has a User ID, which is not necessarily unique, and each question can be "
    f"classified as one of these labels: {_LABEL_LIST}.\n\n"
)


def _instance(rng: random.Random, label: str) -> str:
    template = rng.choice(_TEMPLATES[label])
    place, place2 = rng.sample(_PLACES, 2)
    return template.format(
        acronym=rng.choice(_ACRONYMS),
        thing=rng.choice(_THINGS),
        concept=rng.choice(_CONCEPTS),
        place=place,
        place2=place2,
        animal=rng.choice(_ANIMALS),
    )


def _line(rng: random.Random, user: int, label: str) -> str:
    date = f"{rng.choice(_MONTHS)} {rng.randrange(1, 29):02d}, {rng.randrange(2021, 2025)}"
    return f"Date: {date} || User: {user} || Instance: {_instance(rng, label)}"


def _records(
    rng: random.Random, tokens: int, users: list[int], weights: list[float], labels: Sequence[str]
) -> list[tuple[int, str, str]]:
    """(user, label, line) records filling about ``tokens`` tokens."""
    budget = tokens * CHARS_PER_TOKEN - len(_HEADER) - 40
    records: list[tuple[int, str, str]] = []
    used = 0
    while True:
        user = rng.choice(users)
        label = rng.choices(labels, weights=weights)[0]
        line = _line(rng, user, label)
        if used + len(line) + 1 > budget and records:
            return records
        records.append((user, label, line))
        used += len(line) + 1


def _context(records: list[tuple[int, str, str]]) -> str:
    return _HEADER.format(count=len(records)) + "\n".join(line for _, _, line in records)


def oolong_item(index: int, tokens: int, seed: int) -> EvalItem:
    """Item ``index`` of ``synth-oolong`` at ``tokens`` tokens (always the same one)."""
    rng = random.Random(f"synth-oolong/{seed}/{tokens}/{index}")
    users = rng.sample(range(10_000, 100_000), max(8, tokens // 2048))
    while True:
        weights = [rng.uniform(0.2, 1.0) for _ in LABELS]
        records = _records(rng, tokens, users, weights, LABELS)
        counts = Counter(label for _, label, _ in records)
        top = counts.most_common(2)
        if len(top) < 2 or top[0][1] != top[1][1]:  # a most common label exists
            break
    kind = rng.choices(("count", "user count", "most common"), weights=(2, 1, 1))[0]
    label = rng.choice(LABELS)
    if kind == "count":
        question = (
            f"In the above data, how many data points should be classified as label '{label}'?"
        )
        answer: object = counts[label]
    elif kind == "user count":
        user = rng.choice(sorted({u for u, _, _ in records}))
        question = (
            f"In the above data, how many data points from User {user} should be classified "
            f"as label '{label}'?"
        )
        answer = sum(1 for u, lab, _ in records if u == user and lab == label)
    else:
        question = "In the above data, which of the labels is the most common?"
        answer = top[0][0]
    form = "Answer: <number>" if kind != "most common" else "Label: <label>"
    return EvalItem(
        id=f"synth-oolong-{length_label(tokens)}-{index}",
        question=f"{question} Give your final answer in the form '{form}'.",
        answer=answer,
        answer_type="numeric" if kind != "most common" else "label",
        context=_context(records),
        meta={"task": "synth-oolong", "tokens": tokens, "kind": kind, "lines": len(records)},
    )


def pairs_item(index: int, tokens: int, seed: int) -> EvalItem:
    """Item ``index`` of ``synth-oolong-pairs`` at ``tokens`` tokens (always the same one)."""
    rng = random.Random(f"synth-oolong-pairs/{seed}/{tokens}/{index}")
    rare = rng.choice(LABELS)
    common = [label for label in LABELS if label != rare]
    users = rng.sample(range(10_000, 100_000), max(12, min(64, tokens // 1024)))
    chosen = sorted(rng.sample(users, rng.randrange(3, 8)))
    weights = [rng.uniform(0.2, 1.0) for _ in common]
    records = _records(rng, tokens, users, weights, common)
    # Each chosen user gets the rare label on one or two of their lines (added if none).
    for user in chosen:
        mine = [i for i, (u, _, _) in enumerate(records) if u == user]
        if not mine:
            records.append((user, rare, _line(rng, user, rare)))
            continue
        for i in rng.sample(mine, min(len(mine), rng.randrange(1, 3))):
            records[i] = (user, rare, _line(rng, user, rare))
    rng.shuffle(records)
    pairs = [[a, b] for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    question = (
        "In the above data, list every pair of user IDs where both users have at least one "
        f"instance that should be classified as label '{rare}'. Give each pair once, the "
        "smaller ID first, and answer with a JSON list of pairs only, e.g. [[10001, 10002], "
        "[10001, 10003]]."
    )
    return EvalItem(
        id=f"synth-oolong-pairs-{length_label(tokens)}-{index}",
        question=question,
        answer=pairs,
        answer_type="pairs",
        context=_context(records),
        meta={"task": "synth-oolong-pairs", "tokens": tokens, "label": rare, "users": len(chosen)},
    )


def oolong_items(n: int, lengths: Sequence[int], seed: int) -> Iterator[EvalItem]:
    """``n`` items of ``synth-oolong`` per length, made one at a time."""
    for tokens in lengths:
        for index in range(n):
            yield oolong_item(index, tokens, seed)


def pairs_items(n: int, lengths: Sequence[int], seed: int) -> Iterator[EvalItem]:
    """``n`` items of ``synth-oolong-pairs`` per length, made one at a time."""
    for tokens in lengths:
        for index in range(n):
            yield pairs_item(index, tokens, seed)
