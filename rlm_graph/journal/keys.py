"""Hashes the journal keys on: a run's inputs, and one request.

Pure: no trio, no I/O. A hash is the first 128 bits (32 hex digits) of the SHA-256 of a
canonical text, so the same inputs
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
    # One encode and one hash call: this runs once per model call of a journaled run.
    # The separator cannot appear in the parts' encoding, so "ab"+"c" stays apart from
    # "a"+"bc". 128 bits of SHA-256 name a request well past any journal's size.
    text = "\x00".join(parts)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


_PARAMS = ("temperature", "top_p", "max_tokens", "seed", "stop")


def request_hash(request: ChatRequest) -> str:
    """The hash of what a model call asks: model, messages and parameters.

    ``node_id`` and ``depth`` are left out: they say where the call is, which the
    journal's node id already says.
    """
    parts = [request.model]
    for message in request.messages:
        content = message.content
        parts.append(message.role)
        parts.append(content if isinstance(content, str) else canonical_json(content))
    if (
        request.temperature is not None or request.top_p is not None or request.max_tokens is not None
        or request.seed is not None or request.stop is not None or request.extra
    ):
        params = [getattr(request, name) for name in _PARAMS]
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
