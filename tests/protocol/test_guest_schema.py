"""The up-front check of a schema that model code sends (pure): a walk that knows where
subschemas are, and refuses every place one could hide from it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel

from rlm_graph.errors import ConfigError, SchemaMismatch
from rlm_graph.protocol.guest_schema import MAX_SCHEMA_BYTES, check_guest_schema
from rlm_graph.protocol.schema import AnswerSchema

DRAFT_7 = "http://json-schema.org/draft-07/schema#"
STALLING = {"patternProperties": {"^(a+)+$": {}}}
"""A subschema Python's backtracking ``re`` stalls on, for any key like ``aaa...a!``."""


def _under(keywords: str, schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` nested under each of ``keywords`` (a list of one under ``prefixItems``)."""
    for keyword in reversed(keywords.split()):
        schema = {keyword: [schema] if keyword == "prefixItems" else schema}
    return schema


HIDDEN: dict[str, tuple[dict[str, Any], str]] = {
    "under dependencies, a property's schema": (
        {"$schema": DRAFT_7, "dependencies": {"properties": {"properties": STALLING}}},
        "'^(a+)+$' is not a JSON Schema keyword rlm-graph knows",
    ),
    "under dependencies, at once": (
        {"$schema": DRAFT_7, "dependencies": {"properties": STALLING}},
        "patternProperties is not taken",
    ),
    "in an unknown keyword a $ref reaches": (
        {"$ref": "#/x-hidden/properties/p", "x-hidden": {"properties": {"p": STALLING}}},
        "'x-hidden'",  # not a keyword it knows, and data the $ref may not point into
    ),
    "in a map of schemas a $ref takes for one": (
        {"properties": {"patternProperties": {"^(a+)+$": {}}}, "$ref": "#/properties"},
        "points at a list or map of schemas, not at a schema",
    ),
    "in data a $ref reaches": (
        {"$ref": "#/enum/0/properties/p", "enum": [{"properties": {"p": STALLING}}]},
        "points into 'enum', which holds data",
    ),
    "in data a $ref reaches, escaped": (
        {"$ref": "#/%64efault", "default": STALLING},
        "points into 'default', which holds data",
    ),
    "behind a nested $id that moves what # means": (
        {
            "$defs": {"a": {"$id": "urn:a", "$ref": "#/x", "x": 1}},
            "$ref": "#/$defs/a",
        },
        "$id is taken at the top of the schema only",
    ),
    "under additionalItems, contains, if/then/else, not, prefixItems": (
        _under("additionalItems contains if then else not prefixItems", STALLING),
        "patternProperties is not taken",
    ),
    "in an items array": ({"items": [{}, {"items": [STALLING]}]}, "patternProperties is not"),
}


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_a_subschema_cannot_hide_from_the_check(case: str) -> None:
    schema, told = HIDDEN[case]
    with pytest.raises(ConfigError, match="^schema") as refused:
        AnswerSchema.from_guest(schema)
    assert told in str(refused.value)


@pytest.mark.parametrize("keyword", ["unevaluatedItems", "unevaluatedProperties"])
def test_unevaluated_keywords_are_refused_from_model_code(keyword: str) -> None:
    """jsonschema checks ``unevaluated*`` by walking the schema's references again,
    outside any keyword, where no fuel is spent: a kilobyte of ``$ref`` and
    ``$dynamicRef`` that both lead on doubled the walk at every level (40 levels: years
    on the engine's CPU, past the run's end). Refused up front, naming what to use; a
    user's own schema may still use them."""
    levels = 40
    defs: dict[str, Any] = {
        f"d{i}": {"$ref": f"#/$defs/d{i + 1}", "$dynamicRef": f"#/$defs/d{i + 1}"}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {}
    schema = {keyword: False, "$ref": "#/$defs/d0", "$defs": defs}
    with pytest.raises(ConfigError, match=f"^schema: {keyword} is not taken from model code"):
        AnswerSchema.from_guest(schema)
    nested = {"type": "object", "properties": {"p": {keyword: False}}}
    with pytest.raises(ConfigError, match="use (items|additionalProperties)"):
        AnswerSchema.from_guest(nested)
    assert AnswerSchema.of({keyword: False}).json_schema == {keyword: False}


def test_names_and_data_are_not_keywords() -> None:
    # A property, a definition or a dependency named like a keyword is only a name; data
    # may hold anything (it is never walked as a schema, nor reachable by a $ref).
    schema = {
        "type": "object",
        "properties": {"patternProperties": {"type": "integer"}, "x-extra": {}},
        "$defs": {"properties": {"type": "string"}},
        "default": {"patternProperties": {"^(a+)+$": {}}},
        "examples": [[1, 2], {"any": ["thing"]}],
        "x-note": "a keyword it does not know, with a plain value",
        "$ref": "#/$defs/properties",
    }
    shape = AnswerSchema.from_guest(schema)
    with pytest.raises(SchemaMismatch):
        shape.validate({"patternProperties": 1})  # not a string, as the $ref requires


def test_what_pydantic_writes_passes() -> None:
    from typing import Annotated, Literal

    from pydantic import Field, TypeAdapter

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int = Field(9, ge=0)

    class Dog(BaseModel):
        kind: Literal["dog"]
        tags: set[str] = set()
        name: str = Field("rex", pattern="^[a-z]+$")

    class Pets(BaseModel):
        pets: list[Annotated[Cat | Dog, Field(discriminator="kind")]]
        names: dict[str, int]
        best: tuple[str, int] | None = None

    schema = Pets.model_json_schema()
    assert "discriminator" in str(schema)  # OpenAPI's keyword, which pydantic writes
    shape = AnswerSchema.from_guest(schema)
    assert shape.validate({"pets": [{"kind": "cat"}], "names": {}})
    AnswerSchema.from_guest(TypeAdapter(list[Cat | Dog] | int | None).json_schema())


@pytest.mark.slow
def test_a_huge_schema_is_refused_at_the_cap_without_walking_the_rest() -> None:
    # Some 12 MB of JSON (what a guest may write on one line): refused after reading
    # about the first 64 KiB of it, in the time that takes.
    huge = {"$defs": {f"d{i}": {"type": "string", "pattern": f"x{i}"} for i in range(400_000)}}
    took = time.process_time()
    with pytest.raises(ConfigError, match=f"over {MAX_SCHEMA_BYTES:,} bytes"):
        check_guest_schema(huge)
    took = time.process_time() - took
    small = {"$defs": dict(list(huge["$defs"].items())[:2_000])}
    took_small = time.process_time()
    with pytest.raises(ConfigError, match="bytes"):
        check_guest_schema(small)
    took_small = time.process_time() - took_small
    # Not a wall-clock threshold: the huge one costs what a schema just over the cap does.
    assert took < 20 * max(took_small, 0.001)


@pytest.mark.slow
def test_a_deep_or_wide_schema_is_refused_without_recursion() -> None:
    deep: dict[str, Any] = {}
    for _ in range(100_000):
        deep = {"not": deep}
    with pytest.raises(ConfigError, match="deeper than 32 levels"):
        check_guest_schema(deep)
    with pytest.raises(ConfigError, match="bytes"):
        check_guest_schema({"enum": list(range(10_000_000))})
    with pytest.raises(ConfigError, match="bytes"):
        check_guest_schema({"const": 10**1_000_000})


def test_patterns_together_are_capped() -> None:
    costly = "(?:.{0,99}a){10}.{0,99}b"
    AnswerSchema.from_guest({"type": "string", "pattern": costly})
    many = {"anyOf": [{"type": "string", "pattern": costly + "x" * i} for i in range(8)]}
    with pytest.raises(ConfigError, match="RE2 instructions together"):
        AnswerSchema.from_guest(many)
