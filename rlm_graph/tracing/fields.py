"""A trace file's values as `rlm_graph.tracing.reader` takes them: counts, amounts and
times checked, and the `TraceFileError` that names the span and the field of one that
is not what it should be (see the reader's invariants).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from ..errors import RLMGraphError

__all__ = [
    "TraceFileError",
    "bad_field",
    "checked",
    "jaeger_times",
    "listed",
    "one_line",
    "shown",
    "span_named",
    "time_ns",
    "whole",
]

# Attributes that are counts, and amounts, as the graph and `trace show` read them.
_COUNTS = frozenset(
    {
        "rlm.depth",
        "rlm.iteration",
        "rlm.batch.index",
        "rlm.batch.size",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    }
)
_AMOUNTS = frozenset({"rlm.cost_usd", "rlm.queue_seconds"})
# A count past int64 is written as its digits (at most 4,300: int()'s own limit), an
# infinite or NaN amount in a Jaeger file as text (strict JSON has no Infinity).
_DIGITS = re.compile(r"-?[0-9]{1,4300}")
_NOT_FINITE = frozenset({"inf", "-inf", "nan"})
_TIME_LIMIT_NS = 2**64  # OTLP's times are fixed64 nanoseconds since the epoch


class TraceFileError(RLMGraphError, ValueError):
    """A file that is not a trace rlm-graph can read."""


def jaeger_times(span: Mapping[str, Any]) -> tuple[int, int]:
    """A Jaeger span's start and duration in microseconds (a negative duration as 0, as
    an OTLP span ending before it starts)."""
    start = time_ns(span, "startTime", span["startTime"], 1000) // 1000
    duration = whole(span.get("duration", 0))
    if duration is None or (start + max(duration, 0)) * 1000 >= _TIME_LIMIT_NS:
        raise bad_field(
            span,
            "duration",
            span.get("duration"),
            "a whole number of microseconds ending before the year 2554",
        )
    return start, max(duration, 0)


def shown(value: Any) -> str:
    """A value of the file, for a message: short, in repr's quotes and escapes."""
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def time_ns(span: Mapping[str, Any], key: str, value: Any, ns_per_unit: int) -> int:
    """``value``, a time of ``span`` in units of ``ns_per_unit`` nanoseconds, in ns.

    Raises:
        TraceFileError: not a whole number, or outside OTLP's range (naming the field).
    """
    number = whole(value)
    if number is None or not 0 <= number * ns_per_unit < _TIME_LIMIT_NS:
        unit = "nanoseconds" if ns_per_unit == 1 else "microseconds"
        raise bad_field(
            span, key, value, f"a time: a whole number of {unit} since 1970, below the year 2554"
        )
    return number * ns_per_unit


def whole(value: Any) -> int | None:
    """``value`` as an int (from an int, a text of digits or a whole float), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def checked(attributes: dict[str, Any], span: Mapping[str, Any]) -> dict[str, Any]:
    """``attributes`` with each count a whole number and each amount a finite number
    (a NaN or infinite one is unknown, so left out).

    Raises:
        TraceFileError: a count or an amount that is no number (naming span and field).
    """
    for key in _COUNTS.intersection(attributes):
        value = attributes[key]
        if isinstance(value, float) and value.is_integer():
            value = attributes[key] = int(value)
        elif isinstance(value, str) and _DIGITS.fullmatch(value):  # past int64: its digits
            value = attributes[key] = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_field(span, key, value, "a whole number")
    for key in _AMOUNTS.intersection(attributes):
        value = attributes[key]
        if isinstance(value, str) and value in _NOT_FINITE:  # how a Jaeger file writes one
            del attributes[key]
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_field(span, key, value, "a number")
        if not _finite(value):
            del attributes[key]
    return attributes


def _finite(value: float) -> bool:
    """Whether ``value`` is a finite float, or an int a float holds (not 400 digits)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def bad_field(span: Mapping[str, Any], key: str, value: Any, what: str) -> TraceFileError:
    ident = span.get("spanId") or span.get("spanID")
    name = span.get("name") or span.get("operationName")
    return TraceFileError(f"{span_named(ident, name)}: {key} is {shown(value)}, not {what}")


def span_named(ident: Any, name: Any) -> str:
    """A span, for a message: its id and its name, each cut short (a file's name may
    be a megabyte, its base64 id decode to any length)."""
    return f"span {str(ident)[:40]} ({shown(name)})"


def listed(keys: Iterable[str], most: int = 5) -> str:
    """The first ``most`` of ``keys`` (each cut short), for a message, and how many more
    (a file of 20,000 traces listed each: a line of 680 KB)."""
    keys = list(keys)
    said = ", ".join(key if len(key) <= 60 else key[:59] + "…" for key in keys[:most])
    return said + (f" and {len(keys) - most} more" if len(keys) > most else "")


def one_line(exc: Exception) -> str:
    """``exc``'s message in one short line: of a pydantic refusal (a paragraph per
    field), the first field's, with the value cut short."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "a value"
        return f"{field} is {shown(first.get('input'))}: {first['msg']}"
    text = str(exc).strip().split("\n", 1)[0]
    return text if len(text) <= 200 else text[:199] + "…"
