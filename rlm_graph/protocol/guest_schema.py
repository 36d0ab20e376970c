"""Schemas that model code sends (``llm_query(p, schema={...})``): data, checked in
bounded time, never an instruction to fetch.

A guest's schema reaches the engine, which has the network and runs the scheduler; a
schema is a program for a validator, so it is checked like untrusted input (pure):

    up front (`check_guest_schema`), in this order, each step bounded by the one before
        size      a dict of JSON data, at most `MAX_SCHEMA_BYTES` as JSON and
                  `MAX_SCHEMA_DEPTH` levels deep; the walk that measures it stops at the
                  first byte over, so a schema of megabytes costs what 64 KiB does
        keywords  a walk through the schema's subschemas only, by a list of the keywords
                  it knows (`_SUBSCHEMA`, `_SUBSCHEMA_LISTS`, `_SUBSCHEMA_MAPS`,
                  ``items``, ``dependencies``, `_DATA`): a keyword it does not know whose
                  value is an object or a list is refused (a subschema could hide there,
                  to be reached by a ``$ref``); no ``patternProperties`` (jsonschema
                  matches its keys with Python's backtracking ``re``, which a pattern like
                  ``(a+)+$`` stalls for minutes; OpenAI's structured outputs do not take
                  it either); no ``unevaluatedItems`` or ``unevaluatedProperties``
                  (jsonschema checks them by walking every reference again, outside
                  any keyword, where no fuel is spent: a few lines of ``$ref`` and
                  ``$dynamicRef`` double the walk at each level); ``$schema`` names a
                  dialect jsonschema knows; ``$id`` only
                  at the top (a nested one would move what ``#/...`` means)
        refs      every ``$ref`` (``$dynamicRef``, ``$recursiveRef``) points into the
                  schema itself (``#...``), and a JSON pointer among them leads through
                  subschemas to a subschema, never into data (``default``, ``enum``...)
        patterns  every ``pattern`` at most `MAX_PATTERN_CHARS`, one RE2 takes (no
                  backreferences or lookaround), all of them together at most
                  `MAX_PATTERN_PROGRAM` RE2 instructions
    while validating (`json_validator`, bounded; `fuel`)
        at most `FUEL` steps per value, so a schema built to explode (nested ``anyOf``
        over shared ``$defs``) ends as a mismatch; a step is a keyword evaluation, one
        member of a keyword's list or object, one value of a ``uniqueItems`` array
        (compared in linear time, not pairwise), or `PATTERN_UNITS` characters times RE2
        instructions of a ``pattern`` (matched by RE2, in linear time); no reference is
        ever retrieved (an offline registry)

Every step costs a bounded amount of time, so a validation ends by itself within
`FUEL` of them; the engine still runs it off its event loop (a worker thread it gives
up at the run's deadline).

A refusal is a `ConfigError` (the slot's ``[ERROR]``); a schema that costs too much to
check is a `rlm_graph.errors.SchemaMismatch` of that answer. Either way the run goes on.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

from ..errors import ConfigError

__all__ = [
    "FUEL",
    "MAX_PATTERN_CHARS",
    "MAX_PATTERN_PROGRAM",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "PATTERN_UNITS",
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

MAX_PATTERN_PROGRAM = 50_000
"""RE2 instructions the patterns of one guest's schema may compile to, together."""

FUEL = 500_000
"""Steps one validation may take (each about a microsecond, whatever the schema)."""

PATTERN_UNITS = 256
"""Characters times RE2 instructions one step of fuel pays for, matching a pattern."""

_REFS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
_IDS = frozenset({"$id", "id"})
# What the walk knows of each keyword of every dialect from draft 4 to 2020-12: where
# subschemas are. The rest of the keywords it knows hold data (`_DATA`).
_SUBSCHEMA = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
# Checking these walks the schema's references outside any keyword (jsonschema's
# ``find_evaluated_*``), where no step is paid for: a schema of a few lines whose
# ``$ref`` and ``$dynamicRef`` both lead on doubles the walk at every level.
_UNEVALUATED = {
    "unevaluatedItems": "items (or additionalItems)",
    "unevaluatedProperties": "additionalProperties",
}
_SUBSCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
# ``items``: a subschema, or a list of them (before 2020-12); ``dependencies``: names to
# a subschema or a list of names.
_DATA = frozenset(
    {
        *_REFS,
        *_IDS,
        "$schema",
        "$anchor",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "$comment",
        "$vocabulary",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "maxContains",
        "minContains",
        "maxProperties",
        "minProperties",
        "required",
        "dependentRequired",
        "format",
        "contentEncoding",
        "contentMediaType",
        "discriminator",  # OpenAPI's, which pydantic writes; jsonschema ignores it
        "nullable",
    }
)
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
    """A validation passed `FUEL` steps."""


def check_guest_schema(schema: object) -> dict[str, Any]:
    """Refuse what a guest's schema may not be (see the module's docstring); return it
    as plain JSON data (a copy), the one to validate with.

    Raises:
        ConfigError: the first thing refused, with what to send instead.
    """
    if not isinstance(schema, Mapping):
        raise ConfigError(f"schema must be a JSON Schema dict, not {type(schema).__name__}")
    _measure(schema)
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"schema must hold JSON data only ({exc})") from None
    if len(text) > MAX_SCHEMA_BYTES:
        raise _too_big(f"{len(text):,} bytes")
    data: dict[str, Any] = json.loads(text)
    patterns = _check_keywords(data)
    _check_patterns(patterns)
    return data


# -- size -----------------------------------------------------------------------------


def _measure(schema: Mapping[str, Any]) -> None:
    """Refuse a schema deeper than `MAX_SCHEMA_DEPTH` or, by a count that never exceeds
    its JSON's length, bigger than `MAX_SCHEMA_BYTES`: stopping at the first byte over,
    so that the work is bounded by the cap, not by what the guest sent."""
    left = MAX_SCHEMA_BYTES
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:  # a loop, not recursion: a deep schema must not exhaust the engine's stack
        value, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ConfigError(f"schema nests deeper than {MAX_SCHEMA_DEPTH} levels; flatten it")
        left -= _weight(value)
        if left < 0:
            raise _too_big(f"over {MAX_SCHEMA_BYTES:,} bytes")
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ConfigError(f"schema must hold JSON data only (a key {key!r})")
                left -= len(key)
                stack.append((item, depth + 1))
            if left < 0:
                raise _too_big(f"over {MAX_SCHEMA_BYTES:,} bytes")
        elif isinstance(value, list | tuple):
            stack.extend((item, depth + 1) for item in value)
        elif not isinstance(value, str | int | float | None):
            raise ConfigError(f"schema must hold JSON data only (a {type(value).__name__})")


def _weight(value: Any) -> int:
    """At most the length of ``value`` as JSON (its members not counted)."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, Mapping):
        return 2 + 4 * len(value)  # braces; quotes and ": " per key
    if isinstance(value, list | tuple):
        return 2 + len(value)  # brackets; at least one character per item
    if isinstance(value, bool) or value is None:
        return 4
    if isinstance(value, int):
        return 1 + value.bit_length() // 4  # never converted: a huge int is slow to print
    return 3


def _too_big(size: str) -> ConfigError:
    return ConfigError(
        f"schema is {size} of JSON; at most {MAX_SCHEMA_BYTES:,}: describe the answer more briefly"
    )


# -- keywords and references ----------------------------------------------------------


def _check_keywords(root: dict[str, Any]) -> list[str]:
    """Walk the subschemas of ``root`` (see the module's docstring); return its patterns."""
    patterns: list[str] = []
    stack: list[tuple[Any, bool]] = [(root, True)]
    while stack:
        schema, top = stack.pop()
        if not isinstance(schema, dict):
            continue  # true/false, or a wrong type the meta-schema check refuses
        for key, value in schema.items():
            stack.extend((sub, False) for sub in _subschemas(key, value))
            if key in _REFS:
                _check_ref(key, value, root)
            elif key in _IDS and isinstance(value, str) and not top:
                raise ConfigError(
                    f"schema: {key} is taken at the top of the schema only; name a part "
                    "under $defs instead"
                )
            elif key == "$schema" and value not in _DIALECTS:
                raise ConfigError(
                    f"schema: $schema {value!r} is not a JSON Schema dialect rlm-graph knows"
                )
            elif key == "pattern" and isinstance(value, str):
                patterns.append(value)
    return patterns


def _subschemas(key: str, value: Any) -> list[Any]:
    """The subschemas the keyword ``key`` holds in ``value``.

    Raises:
        ConfigError: ``patternProperties``, ``unevaluated*``, or a keyword the walk does
            not know holding an object or a list.
    """
    if key in _UNEVALUATED:
        raise ConfigError(
            f"schema: {key} is not taken from model code (checking it walks every $ref "
            "and $dynamicRef of the schema again, unbounded); use "
            f"{_UNEVALUATED[key]} instead"
        )
    if key in _SUBSCHEMA:
        return [value]
    if key in _SUBSCHEMA_LISTS:
        return list(value) if isinstance(value, list) else []
    if key in _SUBSCHEMA_MAPS:
        return list(value.values()) if isinstance(value, dict) else []
    if key == "items":
        return list(value) if isinstance(value, list) else [value]
    if key == "dependencies":
        return (
            [v for v in value.values() if not isinstance(v, list)]
            if isinstance(value, dict)
            else []
        )
    if key == "patternProperties":
        raise ConfigError(
            "schema: patternProperties is not taken from model code (its keys would be "
            "matched by a backtracking regex engine); use properties, or additionalProperties"
        )
    if key not in _DATA and isinstance(value, dict | list):
        raise ConfigError(
            f"schema: {key!r} is not a JSON Schema keyword rlm-graph knows, and holds "
            f"{'an object' if isinstance(value, dict) else 'a list'}; leave it out (a "
            "keyword it does not know may hold only a plain value)"
        )
    return []


def _check_ref(key: str, ref: Any, root: dict[str, Any]) -> None:
    if not isinstance(ref, str):
        return  # the meta-schema check refuses it
    if not ref.startswith("#"):
        raise ConfigError(
            f"schema: {key} {ref!r} points outside the schema; references must point "
            "into it (#/$defs/...), and nothing is ever fetched"
        )
    if ref.startswith("#/"):
        _check_pointer(key, ref, root)


def _check_pointer(key: str, ref: str, root: dict[str, Any]) -> None:
    """A JSON pointer of ``ref`` must lead through subschemas to a subschema, never into
    data (where anything could hide from the walk). Read as ``referencing`` reads it."""
    node: Any = root
    role = "schema"  # what ``node`` is: a subschema, or a list or map of them
    for segment in unquote(ref[2:]).split("/"):
        if isinstance(node, list):
            try:
                node = node[int(segment)]
            except ValueError:
                raise ConfigError(f"schema: {key} {ref!r} points nowhere in the schema") from None
            except IndexError:
                return  # nowhere: the validation says so
            role = "schema"
            continue
        if not isinstance(node, dict):
            return
        name = segment.replace("~1", "/").replace("~0", "~")
        if name not in node:
            return
        node, role = node[name], _role(role, name, node[name])
        if role == "data":
            raise ConfigError(
                f"schema: {key} {ref!r} points into {name!r}, which holds data, not a "
                "schema; point at a schema (#/$defs/...)"
            )
    if role != "schema":
        raise ConfigError(
            f"schema: {key} {ref!r} points at a list or map of schemas, not at a schema"
        )


def _role(role: str, name: str, value: Any) -> str:
    """What the member ``name`` (holding ``value``) of a ``role`` node is."""
    if role in ("map", "list"):
        return "schema"
    if role == "dependencies":
        return "data" if isinstance(value, list) else "schema"
    if name in _SUBSCHEMA:
        return "schema"
    if name in _SUBSCHEMA_LISTS or (name == "items" and isinstance(value, list)):
        return "list"
    if name == "items":
        return "schema"
    if name in _SUBSCHEMA_MAPS:
        return "map"
    if name == "dependencies":
        return "dependencies"
    return "data"


def _check_patterns(patterns: list[str]) -> None:
    program = 0
    for pattern in patterns:
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ConfigError(f"schema: a pattern is longer than {MAX_PATTERN_CHARS} characters")
        try:
            program += _compiled(pattern).programsize
        except Exception as exc:  # re2.error: a feature RE2 lacks, or a bad pattern
            raise ConfigError(
                f"schema: pattern {pattern[:60]!r} is not one RE2 takes ({exc}); backreferences "
                "and lookaround are not supported, since matching must take linear time"
            ) from None
        if program > MAX_PATTERN_PROGRAM:
            raise ConfigError(
                f"schema: its patterns compile to more than {MAX_PATTERN_PROGRAM:,} RE2 "
                "instructions together; use fewer or simpler patterns"
            )


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> Any:
    import re2

    options = re2.Options()
    options.log_errors = False  # a refused pattern is an error to return, not to log
    options.never_capture = True  # a yes or no is all a schema asks; groups cost time
    return re2.compile(pattern, options=options)


# -- fuel -----------------------------------------------------------------------------

_state = threading.local()


@contextmanager
def fuel(validator: Any) -> Iterator[None]:
    """Give one validation by ``validator`` its `FUEL` (a no-op for a validator that
    `json_validator` did not make ``bounded``). Nested, the inner one shares the outer
    one's fuel (two readings of one answer are one validation)."""
    if not getattr(type(validator), "_rlm_bounded", False) or _left() is not None:
        yield
        return
    _state.left = FUEL
    try:
        yield
    finally:
        _state.left = None


def _left() -> int | None:
    left: int | None = getattr(_state, "left", None)
    return left


def _spend(steps: int = 1) -> None:
    left = _left()
    if left is None:
        return
    if left < steps:
        raise OutOfFuel(
            f"checking the answer against this schema took more than {FUEL:,} steps; "
            "the schema is too costly to check: simplify it"
        )
    _state.left = left - steps


# What validating costs, in steps of about a microsecond: a keyword evaluation, a
# descent into a subschema (for each member of allOf, anyOf..., and for each member of
# the value that items, additionalProperties... go through), a member of a list or map
# of names or values walked whole on every evaluation (enum, required, properties...),
# resolving a reference, making an error.
_KEYWORD_STEPS = 4
_DESCENT_STEPS = 8
_REFERENCE_STEPS = 100
_ERROR_STEPS = 50
_MESSAGE_CHARS = 32  # characters of an error's message made per step (repr: ~80 per us)
_THROUGH_THE_VALUE = frozenset(
    {
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "unevaluatedItems",
        "additionalProperties",
        "propertyNames",
        "unevaluatedProperties",
    }
)


def _cost(name: str, value: Any, instance: Any) -> int:
    steps = _KEYWORD_STEPS
    if isinstance(value, list | dict):
        steps += len(value) * (_DESCENT_STEPS if name in _SUBSCHEMA_LISTS else 1)
    if name in _THROUGH_THE_VALUE and isinstance(instance, list | dict):
        steps += len(instance) * _DESCENT_STEPS
    if name in _REFS:
        steps += _REFERENCE_STEPS
    return steps


def _fueled(name: str, keyword: Any) -> Any:
    def spending(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        _spend(_cost(name, value, instance))
        for error in keyword(validator, value, instance, schema) or ():
            # A keyword's message quotes the value whole (``repr``): 3,000 branches of
            # anyOf, each failing on an answer of 500 KB, were a minute off the books.
            _spend(_ERROR_STEPS + len(error.message) // _MESSAGE_CHARS)
            yield error

    return spending


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "string"):
        _spend(_KEYWORD_STEPS)
        return
    compiled = _compiled(pattern)
    # RE2 takes time in proportion to the text's length times the pattern's program
    # (when its DFA runs out of memory): paid for before it runs.
    _spend(_KEYWORD_STEPS + len(instance) * max(compiled.programsize, 16) // PATTERN_UNITS)
    if not compiled.search(instance):
        yield ValidationError(f"{_clipped(instance)} does not match {pattern!r}")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """``uniqueItems`` in linear time (jsonschema compares unhashable items pairwise)."""
    from jsonschema import ValidationError

    _spend(_KEYWORD_STEPS)
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Hashable] = set()
    try:
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield ValidationError(f"{_clipped(instance)} has non-unique elements")
                return
            seen.add(key)
    except RecursionError:
        raise OutOfFuel(
            "the answer nests too deeply to check uniqueItems; the schema is too costly "
            "to check: simplify it"
        ) from None


def _canonical(value: Any) -> Hashable:
    """A hashable stand-in for a JSON value, equal where jsonschema's ``equal`` says so
    (``1`` and ``1.0`` alike; ``true`` and ``1`` not); a step per value."""
    _spend()
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    return ("string", value)


def _clipped(instance: Any) -> str:
    """``instance`` as a mismatch names it: briefly, whatever its size."""
    if isinstance(instance, str | list | dict) and len(instance) > 60:
        return f"a {type(instance).__name__} of length {len(instance):,}"
    text = repr(instance)
    return text if len(text) <= 80 else text[:77] + "..."


def json_validator(schema: dict[str, Any], *, bounded: bool = False) -> Any:
    """A ``jsonschema`` validator of ``schema`` (the dialect it names, Draft 2020-12 by
    default) that never fetches: a ``$ref`` that is not in the schema itself is a
    mismatch, not a request to some server; ``uniqueItems`` in linear time. ``bounded``:
    also RE2 patterns and `FUEL` (for a schema `check_guest_schema` accepted).

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
    # ``uniqueItems`` in linear time for every schema (a user's own checks the answer
    # model code gives, which may hold thousands of objects: pairwise, seconds each).
    keywords: dict[str, Any] = {"uniqueItems": _unique_items}
    if bounded:
        keywords = {name: _fueled(name, fn) for name, fn in cls.VALIDATORS.items()}
        keywords["pattern"] = _pattern
        keywords["uniqueItems"] = _unique_items
    cls = jsonschema.validators.extend(cls, keywords)
    cls._rlm_bounded = bounded
    # referencing's stubs leave out the attrs field it takes at run time
    return cls(schema, registry=referencing.Registry(retrieve=_never_fetch))  # type: ignore[call-arg]


def _never_fetch(uri: str) -> Any:
    raise LookupError(f"{uri} is not in the schema (references are never fetched)")
