"""How custom tools cross to a guest process.

A tool is one of three things, decided once when the environment is made:
    - a callable: it stays in the engine's process; the guest gets a proxy of the same
      name that calls it through the pipe (arguments and result must be JSON-able);
    - a string of Python source that defines the tool's own name at top level
      (``"def double(x): return 2 * x"`` for the tool ``double``): it is run in the guest,
      and the name is bound to what it defines;
    - anything else: data, sent as JSON (so a tuple arrives as a list).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlm_graph.errors import ConfigError, clipped, message_of
from rlm_graph.protocol.schema import nests_deeper
from rlm_graph.tracing.scrub import Scrubber

from .guest import Reply

__all__ = ["GuestTools", "defines_name", "error_reply", "require_json", "split_tools"]


@dataclass(frozen=True, slots=True)
class GuestTools:
    data: dict[str, Any] = field(default_factory=dict)
    code: dict[str, str] = field(default_factory=dict)
    proxies: dict[str, str | None] = field(default_factory=dict)


def defines_name(source: str, name: str) -> bool:
    """Whether ``source`` parses as Python that binds ``name`` at top level."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def split_tools(tools: Mapping[str, tuple[Any, str | None]]) -> GuestTools:
    """Sort ``{name: (value, description)}`` into proxies, code and data.

    Raises:
        ConfigError: a value that is none of the three.
    """
    found = GuestTools()
    for name, (value, description) in tools.items():
        if callable(value):
            found.proxies[name] = description
        elif isinstance(value, str) and defines_name(value, name):
            found.code[name] = value
        else:
            try:
                json.dumps(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    f"subprocess environment: custom tool {name!r} is a "
                    f"{type(value).__name__}, which cannot cross to the guest ({exc}); give "
                    "a function (it runs in the engine's process), Python source that "
                    f"defines {name!r}, or JSON-able data"
                ) from None
            found.data[name] = value
    return found


GUEST_READ_DEPTH = 190
"""The deepest a value crossing to the guest may nest: its reader takes about 200 levels,
the message around the value a few (a typed answer stops at 100, `MAX_ANSWER_DEPTH`)."""


def require_json(what: str, value: Any) -> None:
    """Refuse (`ConfigError`, naming ``what``) a value that cannot cross to the guest:
    not JSON, or nested deeper than the guest's reader takes."""
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(
            f"subprocess environment: {what} cannot cross to the guest as JSON ({exc}); "
            "use str, numbers, lists and dicts"
        ) from None
    if nests_deeper(value, GUEST_READ_DEPTH):
        raise ConfigError(
            f"subprocess environment: {what} nests lists or dicts more than "
            f"{GUEST_READ_DEPTH} levels deep, more than the guest reads; flatten it"
        )


def error_reply(call_id: int, exc: BaseException) -> Reply:
    """The reply of a call that failed: its error as the model reads it, without a
    secret the engine knows of (a custom tool runs in the engine's process, with its
    keys: an HTTP client's error quotes the URL it fetched, token and all)."""
    said = clipped(message_of(exc), 4_000)
    return Reply(id=call_id, error=Scrubber().scrub(f"{type(exc).__name__}: {said}"))
