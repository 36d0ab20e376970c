"""JSON that every reader takes: a float that is not finite is written ``null``.

Python's ``json`` writes ``Infinity`` and ``NaN``, which JSON has no word for: a strict
reader (a browser's ``JSON.parse``, ``jq``, Python's own with ``parse_constant`` set)
refuses the whole text. A cost a server reported as 1e308, added to another, is one.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def dumps(data: Any, **kwargs: Any) -> str:
    """``json.dumps(data, **kwargs)``, each float that is not finite as ``null`` (the
    data is walked again only when it holds one)."""
    try:
        return json.dumps(data, allow_nan=False, **kwargs)
    except ValueError:  # rare: walk the data only then
        return json.dumps(finite(data), allow_nan=False, **kwargs)


def finite(data: Any) -> Any:
    """``data`` with each float that is not finite as None, in copies of its dicts and
    lists (iterative: columns of 20,000 nodes, no recursion limit)."""
    root = [data]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        value = parent[key]
        if isinstance(value, float) and not math.isfinite(value):
            parent[key] = None
        elif isinstance(value, dict):
            parent[key] = value = dict(value)
            stack.extend((value, k) for k in value)
        elif isinstance(value, list | tuple):
            parent[key] = value = list(value)
            stack.extend((value, i) for i in range(len(value)))
    return root[0]
