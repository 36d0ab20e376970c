"""The generated tasks: the same items from the same seed, the lengths asked for, and gold
answers that the context really gives."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from rlm_graph.errors import ConfigError
from rlm_graph.eval import parse_lengths, score, task_items
from rlm_graph.eval.tasks.synth import LABELS


def test_lengths_are_powers_of_two_as_in_ruler_and_the_paper() -> None:
    assert parse_lengths("8k, 64k,1m") == (8192, 65536, 1_048_576)
    assert parse_lengths("5000") == (5000,)
    with pytest.raises(ConfigError, match="is not a length"):
        parse_lengths("8kb")


def test_sniah_hides_one_needle_at_the_length_asked_for() -> None:
    items = list(task_items("sniah", n=3, lengths=[8192, 65536], seed=11))
    assert [i.id for i in items] == [
        f"sniah-{size}-{n}" for size in ("8k", "64k") for n in range(3)
    ]
    for item in items:
        assert isinstance(item.context, str)
        tokens = len(item.context) / 4
        assert 0.97 * item.meta["tokens"] <= tokens <= item.meta["tokens"]
        assert item.context.count("special magic number") == 1
        assert f"is {item.answer}." in item.context and len(item.answer) == 7
        key = re.search(r"number for (\S+) mentioned", item.question)
        assert key is not None and item.context.count(key.group(1)) == 1
        assert score("exact", item.answer, item.answer) == 1.0
    assert items == list(task_items("sniah", n=3, lengths=[8192, 65536], seed=11))
    assert items[0].context != next(iter(task_items("sniah", n=1, lengths=[8192], seed=12))).context
    depths = [item.meta["depth"] for item in items]
    assert len(set(depths)) == len(depths)  # needles at different depths


def test_sniah_at_a_million_tokens_is_made_whole() -> None:
    (item,) = task_items("sniah", n=1, lengths=[1 << 20], seed=0)
    assert len(item.context) > 0.97 * 4 * (1 << 20) and item.context.count(item.answer) == 1


_CLASS = [  # the test's own reading of each question's class, from its wording
    ("abbreviation", r"stand for|full form|abbreviation for"),
    ("description and abstract concept", r"meaning of|Why does|How does|origin of the word"),
    ("entity", r"What animal|What metal|What kind of bird"),
    ("human being", r"^Who "),
    ("location", r"^Where is|In which country|What river"),
    ("numeric value", r"^How many|^When was|^How far|^How much"),
]


def _records(context: str) -> list[tuple[int, str]]:
    found = []
    for user, text in re.findall(r"User: (\d+) \|\| Instance: (.*)", context):
        (label,) = [name for name, pattern in _CLASS if re.search(pattern, text)]
        found.append((int(user), label))
    return found


def test_synth_oolong_gold_answers_are_what_the_records_say() -> None:
    items = list(task_items("synth-oolong", n=8, lengths=[8192], seed=5))
    kinds = Counter(item.meta["kind"] for item in items)
    assert set(kinds) <= {"count", "user count", "most common"} and len(kinds) >= 2
    for item in items:
        assert isinstance(item.context, str)
        records = _records(item.context)
        assert len(records) == item.meta["lines"]
        counts = Counter(label for _, label in records)
        if item.meta["kind"] == "most common":
            assert item.answer == counts.most_common(1)[0][0] and item.answer_type == "label"
            continue
        label = re.search(r"label '([^']+)'", item.question)
        assert label is not None and label.group(1) in LABELS
        user = re.search(r"from User (\d+)", item.question)
        wanted = [lab for u, lab in records if user is None or u == int(user.group(1))]
        assert item.answer == wanted.count(label.group(1)) and item.answer_type == "numeric"


def test_synth_oolong_pairs_gold_is_every_pair_of_users_with_the_label() -> None:
    for item in task_items("synth-oolong-pairs", n=4, lengths=[8192], seed=2):
        assert isinstance(item.context, str)
        rare = item.meta["label"]
        users = sorted({u for u, label in _records(item.context) if label == rare})
        assert item.answer == [[a, b] for i, a in enumerate(users) for b in users[i + 1 :]]
        assert len(users) == item.meta["users"] >= 3
        assert score("pairs", item.answer, str(item.answer)) == 1.0


def test_an_unknown_task_lists_the_tasks() -> None:
    with pytest.raises(ConfigError, match="the tasks are sniah, synth-oolong, synth-oolong-pairs"):
        task_items("ruler")
