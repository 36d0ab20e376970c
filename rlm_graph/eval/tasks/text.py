"""Filler text and lengths for the generated tasks. Pure.

Invariants:
    - Nothing here depends on the clock or on global random state: every function takes
      its `random.Random` (or a seed), so a task's items are the same on every machine.
    - The filler never holds the words the needles and questions are made of (``magic``,
      ``number for``, the key vocabulary), so a needle is the only sentence that answers.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

from ...errors import ConfigError

__all__ = ["CHARS_PER_TOKEN", "filler", "length_label", "parse_lengths", "sentence_pool"]

CHARS_PER_TOKEN = 4
"""Lengths are in tokens at the engine's estimate: four characters a token."""

_ADJECTIVES = (
    "quiet",
    "broad",
    "narrow",
    "early",
    "late",
    "heavy",
    "light",
    "distant",
    "nearby",
    "old",
    "young",
    "bright",
    "dull",
    "warm",
    "cold",
    "gentle",
    "rough",
    "smooth",
    "tall",
    "short",
    "busy",
    "empty",
    "crowded",
    "plain",
    "curious",
    "careful",
    "simple",
    "steady",
    "sudden",
    "wooden",
    "stone",
    "paper",
    "northern",
    "southern",
    "eastern",
    "western",
    "open",
    "hidden",
)
_NOUNS = (
    "river",
    "valley",
    "market",
    "village",
    "harbor",
    "bridge",
    "garden",
    "library",
    "station",
    "orchard",
    "kitchen",
    "meadow",
    "workshop",
    "school",
    "museum",
    "forest",
    "tower",
    "field",
    "road",
    "window",
    "letter",
    "teacher",
    "farmer",
    "painter",
    "sailor",
    "baker",
    "student",
    "traveler",
    "neighbor",
    "clerk",
    "musician",
    "cart",
    "lantern",
    "basket",
    "notebook",
    "coat",
)
_VERBS = (
    "crossed",
    "visited",
    "repaired",
    "painted",
    "described",
    "followed",
    "passed",
    "watched",
    "cleaned",
    "opened",
    "carried",
    "measured",
    "noticed",
    "admired",
    "built",
    "left",
    "found",
    "studied",
    "sketched",
    "remembered",
    "ignored",
    "weighed",
    "moved",
    "sorted",
    "counted",
)
_ENDINGS = (
    "before the rain came",
    "after a long morning",
    "without a word",
    "in the afternoon",
    "as the bells rang",
    "while the others rested",
    "for the second time",
    "at the end of summer",
    "on the way home",
    "during the fair",
    "under a grey sky",
    "with great care",
    "once again",
)


def _sentence(rng: random.Random) -> str:
    subject = (
        f"{rng.choice(('The', 'A', 'One', 'Every'))} {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    )
    middle = f"{rng.choice(_VERBS)} the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    return f"{subject} {middle} {rng.choice(_ENDINGS)}."


@lru_cache(maxsize=1)
def sentence_pool() -> tuple[str, ...]:
    """4,096 distinct filler sentences, the same in every process."""
    rng = random.Random("rlm-graph-eval-filler")
    pool: dict[str, None] = {}
    while len(pool) < 4096:
        pool[_sentence(rng)] = None
    return tuple(pool)


def filler(rng: random.Random, chars: int) -> str:
    """About ``chars`` characters (never more) of unrelated prose, in paragraphs."""
    if chars <= 0:
        return ""
    pool = sentence_pool()
    average = sum(map(len, pool[:256])) / 256 + 1
    sentences = rng.choices(pool, k=int(chars / average) + 8)
    paragraphs = [" ".join(sentences[i : i + 6]) for i in range(0, len(sentences), 6)]
    text = "\n\n".join(paragraphs)
    if len(text) > chars:
        cut = text.rfind(".", 0, chars)
        text = text[: cut + 1] if cut > 0 else text[:chars]
    return text


_LENGTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"8k,64k,1m"`` as tokens: ``k`` is 1,024 and ``m`` 1,048,576 (RULER's and the RLM
    paper's powers of two: 8k is 8,192 tokens, 1m is 2**20).

    Raises:
        ConfigError: an entry that is not a positive length.
    """
    lengths = []
    for part in text.split(","):
        found = _LENGTH.match(part)
        if not found:
            raise ConfigError(
                f"--lengths: {part.strip()!r} is not a length; write e.g. 8k,64k,1m or 5000"
            )
        value = float(found.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[found.group(2).lower()]
        if value < 256:
            raise ConfigError(f"--lengths: {part.strip()!r} is too short; at least 256 tokens")
        lengths.append(int(value))
    return tuple(lengths)


def length_label(tokens: int) -> str:
    """``8192`` -> ``"8k"``, ``1048576`` -> ``"1m"``; other numbers as they are."""
    if tokens % (1024 * 1024) == 0:
        return f"{tokens // (1024 * 1024)}m"
    if tokens % 1024 == 0:
        return f"{tokens // 1024}k"
    return str(tokens)
