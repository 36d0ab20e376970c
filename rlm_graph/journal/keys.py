"""Hashes the journal keys on: a run's inputs, and one request.

Pure: no trio, no I/O. A hash is the hex SHA-256 of a canonical text, so the same inputs
give the same key in any process, on any machine, in any run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..contracts import ChatRequest

__all__ = ["canonical_json", "request_hash", "run_key", "value_hash"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces; values JSON cannot hold become their ``repr``."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr, ensure_ascii=False)


def _digest(*parts: str) -> str:
    sha = hashlib.sha256()
    for part in parts:
        # A separator that cannot appear in the parts' own encoding keeps "ab"+"c" apart
        # from "a"+"bc".
        sha.update(part.encode("utf-8", "surrogatepass"))
        sha.update(b"\x00")
    return sha.hexdigest()


_PARAMS = ("temperature", "top_p", "max_tokens", "seed", "stop")


def request_hash(request: ChatRequest) -> str:
    """The hash of what a model call asks: model, messages and parameters.

    ``node_id`` and ``depth`` are left out: they say where the call is, which the
    journal's node id already says.
    """
    parts = [request.model]
    for message in request.messages:
        parts.append(message.role)
        parts.append(message.content if isinstance(message.content, str) else canonical_json(message.content))
    params = [getattr(request, name) for name in _PARAMS]
    if any(value is not None for value in params) or request.extra:
        parts.append(canonical_json([*params, dict(request.extra)]))
    return _digest(*parts)


def value_hash(kind: str, *values: Any) -> str:
    """The hash of a non-model node's inputs (a child's prompt, a function's arguments)."""
    return _digest(kind, *(canonical_json(v) for v in values))


def run_key(kind: str, inputs: Mapping[str, Any], configuration: Sequence[Any]) -> str:
    """The key of a run: what it was asked (``inputs``) and how it was set up.

    Two runs with the same key are the same run; the journal resumes one with the other.
    """
    return _digest(kind, canonical_json(dict(inputs)), canonical_json(list(configuration)))
