"""The reference library's ``tool_prompts`` and ``tool_code``: the user's own prompt
sections and set-up code for every REPL of a run.

``tool_code`` is the user's (trusted) code, not the model's: it runs in each REPL the run
makes (the root's and every child RLM's, in the environment's sandbox) once, after the
context is loaded and before the first turn, and defines what the model's code may then
use. It makes no node of its own. A ``tool_code`` that raises stops the completion with
a `ConfigError` carrying its error: a model told of tools that are not there would only
waste turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..contracts import Environment
from ..errors import ConfigError

__all__ = ["check_tool_code", "check_tool_prompts", "run_tool_code"]


def check_tool_prompts(value: Any) -> tuple[str, ...]:
    """``tool_prompts`` as the sections to append: a str is one section, a list of str
    many; blank ones are dropped.

    Raises:
        ConfigError: neither a str nor a list of them.
    """
    if value is None:
        return ()
    items: Sequence[Any] = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(
            "tool_prompts must be a str or a list of str (sections appended to the system "
            f"prompt), not {_what(value)}"
        )
    return tuple(section.strip() for section in items if section.strip())


def check_tool_code(value: Any) -> str | None:
    """``tool_code`` if it is Python source that compiles, else a `ConfigError`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"tool_code must be a str of Python source, not {_what(value)}")
    if not value.strip():
        return None
    try:
        compile(value, "<tool_code>", "exec")
    except SyntaxError as exc:
        raise ConfigError(
            f"tool_code is not valid Python: {exc.msg} (line {exc.lineno} of tool_code)"
        ) from None
    except ValueError as exc:  # a NUL character
        raise ConfigError(f"tool_code is not valid Python: {exc}") from None
    return value


async def run_tool_code(env: Environment, code: str | None) -> None:
    """Run ``tool_code`` in a REPL that has its context and has not yet run a turn.

    Raises:
        ConfigError: the code raised, or ran past the environment's time limit; the
            message carries its error and the end of its output.
    """
    if code is None:
        return
    result = await env.execute(code)
    if result.ok:
        return
    detail = result.error or "it ran past the environment's time limit"
    tail = result.stderr.strip()[-1500:]
    raise ConfigError(
        f"tool_code failed in the REPL before the first turn: {detail}"
        + (f"\n{tail}" if tail else "")
        + "\nFix tool_code (it runs in every REPL of the run, child RLMs' included)."
    )


def _what(value: Any) -> str:
    if isinstance(value, list | tuple):
        kinds = sorted({type(item).__name__ for item in value if not isinstance(item, str)})
        return f"a {type(value).__name__} holding {', '.join(kinds)}"
    return type(value).__name__
