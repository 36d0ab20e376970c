"""``sniah``: a single needle in a haystack, in the shape of RULER's ``niah_single``. Pure.

Each item is a haystack of unrelated prose of the length asked for, with one sentence
hidden at a random depth: ``The special magic number for <key> is <7 digits>.`` The
question asks for that number, to be answered with the number alone; scoring is exact
match (`rlm_graph.eval.scoring.exact_match`).

What it is not: RULER's own haystacks (Paul Graham essays, or repeated "The grass is
green" lines), its tokenizer's lengths (here four characters a token), or its metric
(RULER counts a reply that contains the value; exact match wants the value alone).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from ..items import EvalItem
from .text import CHARS_PER_TOKEN, filler, length_label

__all__ = ["sniah_item", "sniah_items"]

_KEY_FIRST = (
    "amber",
    "cobalt",
    "crimson",
    "ivory",
    "jade",
    "ochre",
    "saffron",
    "scarlet",
    "teal",
    "violet",
    "indigo",
    "maroon",
    "olive",
    "silver",
    "copper",
    "golden",
)
_KEY_SECOND = (
    "falcon",
    "otter",
    "heron",
    "lynx",
    "badger",
    "marten",
    "ibis",
    "gecko",
    "bison",
    "walrus",
    "condor",
    "jackal",
    "puffin",
    "tapir",
    "okapi",
    "dingo",
)


def sniah_item(index: int, tokens: int, seed: int) -> EvalItem:
    """Item ``index`` of the ``tokens``-long haystacks of ``seed`` (always the same one)."""
    rng = random.Random(f"sniah/{seed}/{tokens}/{index}")
    key = f"{rng.choice(_KEY_FIRST)}-{rng.choice(_KEY_SECOND)}-{rng.randrange(100, 1000)}"
    value = str(rng.randrange(1_000_000, 10_000_000))
    needle = f"The special magic number for {key} is {value}."
    question = (
        f"What is the special magic number for {key} mentioned in the context? "
        "Answer with the number only."
    )
    haystack = filler(rng, tokens * CHARS_PER_TOKEN - len(needle) - 2)
    depth = rng.random()
    cut = haystack.find(". ", int(len(haystack) * depth))
    at = cut + 2 if cut >= 0 else len(haystack)
    context = f"{haystack[:at]}{needle} {haystack[at:]}"
    return EvalItem(
        id=f"sniah-{length_label(tokens)}-{index}",
        question=question,
        answer=value,
        answer_type="exact",
        context=context,
        meta={"task": "sniah", "tokens": tokens, "depth": round(at / max(1, len(context)), 4)},
    )


def sniah_items(n: int, lengths: Sequence[int], seed: int) -> Iterator[EvalItem]:
    """``n`` items per length, made one at a time."""
    for tokens in lengths:
        for index in range(n):
            yield sniah_item(index, tokens, seed)
