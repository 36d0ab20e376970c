"""Typed answers: the shape a user asked for (``schema=``), as a JSON Schema and a validator.

`AnswerSchema` wraps what a user may pass as ``schema=``: a pydantic model, a dataclass, a
plain type (``int``, ``list[str]``, ``dict[str, float]``, anything pydantic's
``TypeAdapter`` takes), or a JSON Schema dict. It gives:

    json_schema         what the model is told, and what a provider's structured-output
                        mode is sent
    validate(value)     the typed value of a JSON-like value, or `SchemaMismatch`
    parse_text(text)    the same for a model's text reply (JSON, possibly in a fence)
    dump_json(value)    the typed value as JSON text (``result.response``)

Invariants:
    - A Python type is validated by pydantic (its own validators run) and gives instances
      of that type; a JSON Schema dict is validated by ``jsonschema`` (the dialect the
      schema names, Draft 2020-12 by default) and its values stay plain JSON data.
    - A `SchemaMismatch` message lists at most `MAX_PROBLEMS` problems, each with the
      path of the offending field: it is shown to a model that must fix its answer.
    - ``jsonschema`` is imported only when a dict schema is validated, so the subprocess
      guest, which only turns classes into JSON Schemas, never loads it.
    - Pure: no trio, httpx or opentelemetry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.errors import PydanticUndefinedAnnotation, PydanticUserError

from ..errors import ConfigError, SchemaMismatch, clipped

__all__ = ["MAX_ANSWER_DEPTH", "MAX_PROBLEMS", "AnswerSchema", "nests_deeper", "to_jsonable"]

MAX_PROBLEMS = 8

MAX_ANSWER_DEPTH = 100
"""The deepest a typed answer may nest lists and objects: the REPL's reader takes about
200 levels (a reply nested deeper ended the guest, and its variables), the engine's
writer 255 (deeper ended the run)."""

_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_FENCED = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```\Z", re.DOTALL)


class AnswerSchema:
    """The shape of an answer: a JSON Schema, and a validator that gives typed values.

    Build one with `AnswerSchema.of` (which also checks a JSON Schema dict against its
    meta-schema); ``AnswerSchema(source, check=False)`` skips that check, for the REPL
    side, which only needs the JSON Schema of a class.

    Attributes:
        source: what the user passed.
        json_schema: the JSON Schema (a dict).
        name: a short identifier for providers that name schemas (``[A-Za-z0-9_-]``).
        typed: whether values come back as instances of a Python type (else JSON data).
    """

    __slots__ = ("_adapter", "_validator", "json_schema", "name", "source", "typed")

    def __init__(self, source: Any, *, check: bool = True) -> None:
        self.source = source
        self._adapter: TypeAdapter[Any] | None = None
        self._validator: Any = None
        if isinstance(source, Mapping):
            self.json_schema = _json_copy(source)
            self.typed = False
            if check:
                self._validator = _dict_validator(self.json_schema)
            title = self.json_schema.get("title")
            self.name = _identifier(title if isinstance(title, str) else "") or "answer"
        else:
            self._adapter, self.json_schema = _adapter_of(source)
            self.typed = True
            self.name = _identifier(getattr(source, "__name__", "") or "") or "answer"

    @classmethod
    def from_guest(cls, schema: object) -> AnswerSchema:
        """A JSON Schema that model code sent (``llm_query(p, schema=...)``): data, never
        an instruction to fetch, and checked in bounded time (see `rlm_graph.protocol.guest_schema`).

        Raises:
            ConfigError: what about the schema was refused, and what to send instead.
        """
        from .guest_schema import check_guest_schema, json_validator

        try:
            shape = cls(check_guest_schema(schema), check=False)
            shape._validator = json_validator(shape.json_schema, bounded=True)
        except ConfigError as exc:  # it may quote the guest's schema: every slot carries it
            raise ConfigError(clipped(str(exc))) from None
        return shape

    @classmethod
    def of(cls, schema: Any) -> AnswerSchema:
        """An `AnswerSchema` for ``schema=`` as a user gives it (or one already built).

        Raises:
            ConfigError: not a type pydantic can describe, nor a valid JSON Schema dict.
        """
        if isinstance(schema, AnswerSchema):
            return schema
        return cls(schema)

    def __repr__(self) -> str:
        return f"AnswerSchema({self.name!r})"

    # -- checking values ----------------------------------------------------------------

    def validate(self, value: Any) -> Any:
        """The typed value of ``value`` (JSON data, or an instance of the type).

        Raises:
            SchemaMismatch: the value does not match; the message says where and how.
        """
        if self._adapter is not None:
            try:
                return self._adapter.validate_python(value)
            except ValidationError as exc:
                raise SchemaMismatch(_pydantic_problems(exc)) from None
        if self._validator is None:
            self._validator = _dict_validator(self.json_schema)
        errors = sorted(_errors(self._validator, value), key=lambda e: list(e.absolute_path))
        if errors:
            raise SchemaMismatch(_jsonschema_problems(errors))
        return value

    def parse_text(self, text: str) -> Any:
        """The typed value of a text answer: JSON (a fenced ```json block is unwrapped),
        or, for a schema that takes strings, the text itself.

        Raises:
            SchemaMismatch: neither reading matches.
        """
        from .guest_schema import fuel

        with fuel(self._validator):  # a guest's schema: one budget for both readings
            return self._parse_text(text)

    def _parse_text(self, text: str) -> Any:
        body = text.strip()
        fenced = _FENCED.match(body)
        if fenced:
            body = fenced.group(1).strip()
        mismatch: SchemaMismatch | None = None
        try:
            data = json.loads(body)
        except ValueError as exc:
            not_json = (
                f"{exc.msg} at line {exc.lineno} column {exc.colno}"
                if isinstance(exc, json.JSONDecodeError)
                else str(exc)
            )
        except RecursionError:  # the model's JSON nests deeper than Python's stack
            not_json = "it nests too deeply to read"
        else:
            try:
                if nests_deeper(data, MAX_ANSWER_DEPTH):
                    raise SchemaMismatch(
                        f"the answer nests lists or objects more than {MAX_ANSWER_DEPTH} "
                        "levels deep; no schema's answer needs that: flatten it"
                    )
                return self.validate(data)
            except SchemaMismatch as exc:
                mismatch = exc
        try:
            return self.validate(text)  # a schema that takes strings takes the text as is
        except SchemaMismatch:
            pass
        if mismatch is not None:
            raise mismatch
        raise SchemaMismatch(
            f"the answer is not JSON ({not_json}); give the value itself as JSON matching "
            "the schema, with nothing around it"
        )

    def dump_json(self, value: Any) -> str:
        """``value`` (as `validate` returned it) as JSON text."""
        if self._adapter is not None:
            return self._adapter.dump_json(value).decode()
        return json.dumps(value, ensure_ascii=False)

    def describe(self) -> str:
        """The JSON Schema as compact text, for a prompt."""
        return json.dumps(self.json_schema, ensure_ascii=False, separators=(",", ":"))


def to_jsonable(value: Any) -> Any:
    """``json.dumps``'s ``default``: pydantic models, dataclasses, sets and tuples as JSON
    data (what a model's code may put in ``answer["content"]``)."""
    import dataclasses

    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# -- building -------------------------------------------------------------------------


def _identifier(text: str) -> str:
    return _NAME.sub("_", text).strip("_")[:64]


def _json_copy(schema: Mapping[str, Any]) -> dict[str, Any]:
    try:
        copied: dict[str, Any] = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"a JSON Schema dict must hold JSON data only ({exc})") from None
    except RecursionError:
        raise ConfigError(
            "the JSON Schema dict nests deeper than Python's stack; a schema may nest a few "
            "dozen levels at most (a sub-call's, 32): flatten it"
        ) from None
    return copied


def _adapter_of(source: Any) -> tuple[TypeAdapter[Any], dict[str, Any]]:
    if source is None or isinstance(source, str | bytes | int | float | bool | list | tuple):
        raise ConfigError(
            f"schema={source!r} is a value, not a shape; pass a pydantic model, a "
            "dataclass, a type such as list[str], or a JSON Schema dict"
        )
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(source)
        json_schema = adapter.json_schema()
    except (PydanticUserError, PydanticUndefinedAnnotation, TypeError, NameError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"schema={source!r} is not a shape pydantic can describe ({first}); pass a "
            "pydantic model, a dataclass, a type such as list[str], or a JSON Schema dict"
        ) from None
    return adapter, json_schema


def _dict_validator(schema: dict[str, Any]) -> Any:
    from .guest_schema import json_validator

    return json_validator(schema)


def _errors(validator: Any, value: Any) -> list[Any]:
    """Every error of ``value``; a reference that goes nowhere, a schema that refers to
    itself without end, or one too costly to check is a mismatch saying so."""
    import referencing.exceptions

    from .guest_schema import OutOfFuel, fuel

    try:
        with fuel(validator):
            return list(validator.iter_errors(value))
    except referencing.exceptions.Unresolvable as exc:
        raise SchemaMismatch(
            f"the schema refers to {exc.ref!r}, which is not in it: references must "
            "point into the schema itself (#/$defs/...)"
        ) from None
    except RecursionError:
        raise SchemaMismatch("the schema refers to itself without end") from None
    except OutOfFuel as exc:
        raise SchemaMismatch(str(exc)) from None


# -- reporting ------------------------------------------------------------------------


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _pydantic_problems(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    lines = []
    for error in errors[:MAX_PROBLEMS]:
        where = ".".join(str(part) for part in error["loc"]) or "the answer"
        lines.append(f"{where}: {error['msg']} (got {_shown(error.get('input'))})")
    return _summary(lines, len(errors))


def _jsonschema_problems(errors: list[Any]) -> str:
    lines = []
    for error in errors[:MAX_PROBLEMS]:
        where = ".".join(str(part) for part in error.absolute_path) or "the answer"
        lines.append(f"{where}: {error.message}")
    return _summary(lines, len(errors))


def _summary(lines: list[str], total: int) -> str:
    more = f"; and {total - len(lines)} more" if total > len(lines) else ""
    count = "1 problem" if total == 1 else f"{total} problems"
    return f"the answer does not match the schema ({count}): " + "; ".join(lines) + more


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (JSON data) nests lists or objects more than ``limit`` levels
    deep; one pass over its containers, no recursion."""
    stack = [(value, 1)] if isinstance(value, list | dict) else []
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        items = container.values() if isinstance(container, dict) else container
        stack.extend((item, depth + 1) for item in items if isinstance(item, list | dict))
    return False
