"""What crosses a guest's pipe to the engine: each message as one line of UTF-8 JSON
(`pipe_line`, both ways), within the engine's cap, weighed by its bytes and by the values
it holds (`pipe_weight`); from the guest's side, a custom tool's arguments as JSON data
and a tool's error raised as its type.

Imported by the ``subprocess`` guest (which may read ``rlm_graph/`` and nothing of the
plugin's folder).
"""

from __future__ import annotations

import builtins
import json
import re
from typing import Any

from pydantic import BaseModel

from .._files import utf8_text

__all__ = [
    "VALUE_BYTES",
    "MessageTooLarge",
    "json_arguments",
    "pipe_line",
    "pipe_weight",
    "raised_as",
]

VALUE_BYTES = 32
"""What each JSON value of a line weighs on top of the line's bytes: about what the
Python object parsed from it costs beyond them (``[],`` is 3 bytes on the line and 64 in
memory, ``0,`` 2 and 8 to 36)."""

# A string (its escapes taken out first), or a character that brings the next value.
_VALUES = re.compile(rb'"[^"]*"|[\[{,:]')


def pipe_line(message: BaseModel) -> bytes:
    """``message`` as its line on a guest's pipe: JSON, UTF-8, one line.

    Text holding a lone surrogate (not a character: a reply's JSON ``\\ud800``, bytes
    decoded with ``errors="surrogateescape"``, ``chr(0xDC80)``) has no UTF-8, and the
    reader on the other side takes none in JSON either; each one crosses as U+FFFD,
    the replacement character, as a UTF-8 decoder would give it, rather than ending
    the run (or the guest and its variables).
    """
    try:
        return message.model_dump_json().encode() + b"\n"
    except ValueError:  # pydantic's serialization error, from the UnicodeEncodeError
        text = json.dumps(message.model_dump(mode="json"), ensure_ascii=False)
        return utf8_text(text).encode() + b"\n"


def pipe_weight(line: bytes, cap: int) -> int:
    """What holding ``line`` parsed costs, about: its bytes, and `VALUE_BYTES` for each
    JSON value in it (each string, and each value a ``[``, ``{``, ``,`` or ``:`` outside
    a string brings: a value that is no string follows one of them, or starts the line).

    Counting stops once the weight is over ``cap`` (the answer is then over ``cap``, by
    how much unsaid), so the work is at most ``cap / VALUE_BYTES`` steps, whatever the
    line holds, and no object is made per value: the engine weighs a guest's line
    this way before it parses it (a line of ``[]`` is 40 times its bytes once parsed).
    """
    weight = len(line)
    if weight > cap:
        return weight
    # Escaped backslashes, then escaped quotes, out: every '"' left opens or ends a string.
    plain = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    for _ in _VALUES.finditer(plain):
        weight += VALUE_BYTES
        if weight > cap:
            break
    return weight


class MessageTooLarge(ValueError):
    """What the guest would send the engine is over its ``max_message_mb``."""

    def __init__(self, size: int, cap: int) -> None:
        self.size, self.cap = size, cap
        super().__init__(
            f"this is over the {cap / 2**20:g} MB a message to the engine may hold "
            f"(max_message_mb): it weighs at least {size / 2**20:.1f} MB as sent, its JSON "
            "bytes (a control character takes 6, an image a third more than its bytes) and "
            f"{VALUE_BYTES} for each value in it (a list of a million numbers weighs 33 MB); "
            "send it in smaller pieces, or raise max_message_mb"
        )


def json_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a tool call whose arguments are not JSON data: a set, bytes or NaN would
    reach the tool changed (a list, a str, None)."""
    try:
        json.dumps([args, kwargs], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name}(): its arguments cross to the engine as JSON (the subprocess "
            f"environment), and these are not JSON data ({exc}); pass lists, dicts, "
            "str, numbers, booleans or None"
        ) from None


def raised_as(error: str) -> Exception:
    """A tool's ``"Type: message"`` from the engine as the code would meet it in the local
    environment: a builtin exception type as itself, any other as a RuntimeError."""
    kind, _, message = error.partition(": ")
    found = getattr(builtins, kind, None)
    if isinstance(found, type) and issubclass(found, Exception) and found is not Exception:
        try:
            return found(message)
        except Exception:  # noqa: BLE001 - a builtin that takes other arguments
            pass
    return RuntimeError(error)
