"""JSON that every reader takes: a float that is not finite is written ``null``, and a
lone surrogate (half a character) U+FFFD.

Python's ``json`` writes ``Infinity`` and ``NaN``, which JSON has no word for: a strict
reader (a browser's ``JSON.parse``, ``jq``, Python's own with ``parse_constant`` set)
refuses the whole text. A cost a server reported as 1e308, added to another, is one.
So do strict readers (serde_json) refuse the escape of half a character, ``"\\ud800"``,
which a model's reply may hold.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ._files import has_surrogate, utf8_text

__all__ = ["dumps", "finite"]

# The escape of half a character: a high one not followed by a low one, a low one not
# after a high one (a pair, an astral character as ``ensure_ascii`` writes it, is whole).
_LONE_ESCAPE = re.compile(
    r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}"
)


def dumps(data: Any, **kwargs: Any) -> str:
    """``json.dumps(data, **kwargs)``, each float that is not finite as ``null`` and each
    lone surrogate as U+FFFD (the data is walked again only when it may hold one)."""
    try:
        text = json.dumps(data, allow_nan=False, **kwargs)
    except ValueError:  # rare: walk the data only then
        return json.dumps(finite(data), allow_nan=False, **kwargs)
    escaped = kwargs.get("ensure_ascii", True)
    if not (_LONE_ESCAPE.search(text) if escaped else has_surrogate(text)):
        return text
    return json.dumps(finite(data), allow_nan=False, **kwargs)


def finite(data: Any) -> Any:
    """``data`` with each float that is not finite as None and each text whole UTF-8
    (`rlm_graph._files.utf8_text`, keys too), in copies of its dicts and lists
    (iterative: columns of 20,000 nodes, no recursion limit)."""
    root = [data]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        value = parent[key]
        if isinstance(value, float) and not math.isfinite(value):
            parent[key] = None
        elif isinstance(value, str):
            parent[key] = utf8_text(value)
        elif isinstance(value, dict):
            value = {utf8_text(k) if isinstance(k, str) else k: v for k, v in value.items()}
            parent[key] = value
            stack.extend((value, k) for k in value)
        elif isinstance(value, list | tuple):
            parent[key] = value = list(value)
            stack.extend((value, i) for i in range(len(value)))
    return root[0]
