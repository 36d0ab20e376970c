"""Schemas that model code sends (``llm_query(p, schema={...})``): data, checked in
bounded time, never an instruction to fetch.

A guest's schema reaches the engine, which has the network and runs the scheduler; a
schema is a program for a validator, so it is checked like untrusted input (pure):

    up front (`check_guest_schema`)
        a dict of JSON data, at most `MAX_SCHEMA_BYTES` as JSON and `MAX_SCHEMA_DEPTH`
        levels deep; every ``$ref`` (``$dynamicRef``, ``$recursiveRef``) points into
        the schema itself (``#...``); ``$schema`` names a dialect jsonschema knows;
        every ``pattern`` at most `MAX_PATTERN_CHARS` and one RE2 takes (no
        backreferences or lookaround); no ``patternProperties`` (jsonschema matches its
        keys with Python's backtracking ``re``, which a pattern like ``(a+)+$`` stalls
        for minutes; OpenAI's structured outputs do not take it either)
    while validating (`json_validator`, bounded; `fuel`)
        ``pattern`` matched by RE2 (linear time); at most `FUEL` keyword evaluations per
        value, so a schema built to explode (nested ``anyOf`` over shared ``$defs``)
        ends as a mismatch; no reference is ever retrieved (an offline registry)

A refusal is a `ConfigError` (the slot's ``[ERROR]``); a schema that costs too much to
check is a `rlm_graph.errors.SchemaMismatch` of that answer. Either way the run goes on.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import ConfigError

__all__ = [
    "FUEL",
    "MAX_PATTERN_CHARS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "OutOfFuel",
    "check_guest_schema",
    "fuel",
    "json_validator",
]

MAX_SCHEMA_BYTES = 64 * 1024
"""The most a guest's schema may weigh, as JSON."""

MAX_SCHEMA_DEPTH = 32
"""The deepest a guest's schema may nest (objects and lists)."""

MAX_PATTERN_CHARS = 1_000
"""The longest ``pattern`` a guest's schema may hold."""

FUEL = 50_000
"""Keyword evaluations one validation may make (a few tens of milliseconds)."""

_REFS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
# Keys under these keywords are names (of properties, definitions), not keywords.
_NAMES = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
_DIALECTS = frozenset(
    {
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "http://json-schema.org/draft-07/schema#",
        "http://json-schema.org/draft-07/schema",
        "http://json-schema.org/draft-06/schema#",
        "http://json-schema.org/draft-04/schema#",
    }
)


class OutOfFuel(Exception):
    """A validation passed `FUEL` keyword evaluations."""


def check_guest_schema(schema: object) -> None:
    """Refuse what a guest's schema may not be (see the module's docstring).

    Raises:
        ConfigError: the first thing refused, with what to send instead.
    """
    if not isinstance(schema, Mapping):
        raise ConfigError(f"schema must be a JSON Schema dict, not {type(schema).__name__}")
    stack: list[tuple[Any, int, bool]] = [(schema, 1, True)]
    while stack:  # a loop, not recursion: a deep schema must not exhaust the engine's stack
        value, depth, keywords = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ConfigError(f"schema nests deeper than {MAX_SCHEMA_DEPTH} levels; flatten it")
        if isinstance(value, Mapping):
            for key, item in value.items():
                if keywords:
                    _check_keyword(key, item)
                stack.append((item, depth + 1, not keywords or key not in _NAMES))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, keywords) for item in value)
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"schema must hold JSON data only ({exc})") from None
    if size > MAX_SCHEMA_BYTES:
        raise ConfigError(
            f"schema is {size:,} bytes of JSON; at most {MAX_SCHEMA_BYTES:,}: describe the "
            "answer more briefly"
        )


def _check_keyword(key: object, value: object) -> None:
    if key in _REFS and isinstance(value, str) and not value.startswith("#"):
        raise ConfigError(
            f"schema: {key} {value!r} points outside the schema; references must point "
            "into it (#/$defs/...), and nothing is ever fetched"
        )
    if key == "$schema" and value not in _DIALECTS:
        raise ConfigError(f"schema: $schema {value!r} is not a JSON Schema dialect rlm-graph knows")
    if key == "patternProperties":
        raise ConfigError(
            "schema: patternProperties is not taken from model code (its keys would be "
            "matched by a backtracking regex engine); use properties, or additionalProperties"
        )
    if key == "pattern" and isinstance(value, str):
        if len(value) > MAX_PATTERN_CHARS:
            raise ConfigError(f"schema: a pattern is longer than {MAX_PATTERN_CHARS} characters")
        try:
            _compiled(value)
        except Exception as exc:  # re2.error: a feature RE2 lacks, or a bad pattern
            raise ConfigError(
                f"schema: pattern {value[:60]!r} is not one RE2 takes ({exc}); backreferences "
                "and lookaround are not supported, since matching must take linear time"
            ) from None


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    import re2

    options = re2.Options()
    options.log_errors = False  # a refused pattern is an error to return, not to log
    return re2.compile(pattern, options=options)


_state = threading.local()


@contextmanager
def fuel(validator: Any) -> Iterator[None]:
    """Give one validation by ``validator`` its `FUEL` (a no-op for a validator that
    `bounded_validator` did not make)."""
    if not getattr(type(validator), "_rlm_bounded", False):
        yield
        return
    before = getattr(_state, "left", None)
    _state.left = FUEL
    try:
        yield
    finally:
        _state.left = before


def _spend() -> None:
    left = getattr(_state, "left", None)
    if left is None:
        return
    if left <= 0:
        raise OutOfFuel(
            f"checking the answer against this schema took more than {FUEL:,} steps; "
            "the schema is too costly to check: simplify it"
        )
    _state.left = left - 1


def _fueled(keyword: Any) -> Any:
    def spending(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _spend()
        return keyword(validator, value, instance, schema)

    return spending


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    _spend()
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def json_validator(schema: dict[str, Any], *, bounded: bool = False) -> Any:
    """A ``jsonschema`` validator of ``schema`` (the dialect it names, Draft 2020-12 by
    default) that never fetches: a ``$ref`` that is not in the schema itself is a
    mismatch, not a request to some server. ``bounded``: also RE2 patterns and `FUEL`
    (for a schema `check_guest_schema` accepted).

    Raises:
        ConfigError: ``schema`` is not a valid JSON Schema of its dialect.
    """
    import jsonschema
    import referencing

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(map(str, exc.absolute_path)) or "the top level"
        raise ConfigError(
            f"schema is not a valid JSON Schema: {exc.message} (at {where})"
        ) from None
    if bounded:
        keywords = {name: _fueled(fn) for name, fn in cls.VALIDATORS.items()}
        keywords["pattern"] = _pattern
        cls = jsonschema.validators.extend(cls, keywords)
        cls._rlm_bounded = True
    # referencing's stubs leave out the attrs field it takes at run time
    return cls(schema, registry=referencing.Registry(retrieve=_never_fetch))  # type: ignore[call-arg]


def _never_fetch(uri: str) -> Any:
    raise LookupError(f"{uri} is not in the schema (references are never fetched)")
