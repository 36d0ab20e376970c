"""The messages rlm-graph sends the root model, in its own words.

The protocol (names, fences, the ``answer`` dict) matches the reference library so that
models and prompts written for it work; the text is rlm-graph's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..contracts import ExecResult, Image, Message
from .truncate import truncate_output

if TYPE_CHECKING:
    from .state import LoopSettings

__all__ = [
    "opening_messages",
    "SYSTEM_PROMPT",
    "context_summary",
    "final_answer_prompt",
    "first_user_message",
    "format_repl_output",
    "no_code_message",
    "schema_instructions",
    "schema_rejected_note",
    "system_prompt",
    "tools_section",
]

SYSTEM_PROMPT = """\
You are a Recursive Language Model. You answer a question about a context that may be far \
too long to read at once. The context is not in this conversation: it is the variable \
`context` in a persistent Python REPL, and you work on it by writing code.

Write code in fenced blocks that start with ```repl and end with ```. Every block of a reply \
runs, in order, in the same namespace; variables persist between turns. After each reply \
you see what your code printed (only printed output and the value of a final bare \
expression are shown; output longer than {output_chars} characters is cut, so print \
summaries and slices, not whole documents).

In the REPL you have:
- `context`: the data ({context_hint}).
- `llm_query(prompt, model=None) -> str`: ask a sub-model one question. It sees only the \
prompt you give it, and it can read a large chunk (hundreds of thousands of characters). \
With `schema=` (a pydantic model, a type such as `list[str]`, or a JSON Schema dict) it \
returns a value of that shape instead of text. The prompt may also be a list of text and \
images (image bytes, a pathlib.Path, or an image from `context`) for a model that sees.
- `llm_query_batched(prompts, model=None) -> list[str]`: ask many independent questions \
at once; they run concurrently and the answers come back in the order of the prompts. A \
failed question gives a string starting with "[ERROR]" in its place.
- `rlm_query(prompt, model=None) -> str` and `rlm_query_batched(prompts, model=None)`: \
hand a sub-task to a child Recursive Language Model with its own REPL, for work that \
needs several steps; {recursion_note}
- `SHOW_VARS()`: the variables you have created, with their types.
- `answer`: a dict. Put your final answer in `answer["content"]`, then set \
`answer["ready"] = True` to finish. `FINAL(value)` and `FINAL_VAR("variable_name")` \
do the same in one call.
{tools}
How to work:
1. Look before you answer: print the type, the length and a few slices of `context`.
2. Split the work: chunk the context, and send the chunks to `llm_query_batched` \
(prefer a few large chunks to many tiny ones); sub-models are fast in parallel.
3. Combine the answers in code, check what you have (print it), and ask follow-up \
questions where the answers disagree or are missing.
4. Finish only when your answer is supported by what you printed; do not set \
`answer["ready"]` in the same block that first looks at the data.
"""

_RECURSION_ON = "each child is slower than `llm_query`, so use it only when a sub-task needs code."
_RECURSION_OFF = "in this run they fall back to a plain `llm_query` (recursion depth is used up)."


def tools_section(tools: Mapping[str, tuple[Any, str | None]]) -> str:
    """A bullet per custom tool: ``- `name`: description``."""
    if not tools:
        return ""
    lines = ["", "Custom tools and data in the REPL:"]
    for name, (value, description) in tools.items():
        if description:
            text = description
        elif callable(value):
            text = "a custom function"
        else:
            text = f"a {type(value).__name__} value"
        lines.append(f"- `{name}`: {text}")
    return "\n".join(lines) + "\n"


def system_prompt(
    *,
    custom: str | None = None,
    tools: Mapping[str, tuple[Any, str | None]] | None = None,
    can_recurse: bool = True,
    output_chars: int = 20_000,
    context_hint: str = "a str, list or dict",
    sections: Sequence[str] = (),
) -> str:
    """The root model's system prompt.

    A ``custom`` prompt replaces the built-in one; a ``{custom_tools_section}`` in it is
    replaced by the tools list (the reference library's placeholder). A prompt written
    for the reference, which formats it with ``str.format`` (its braces doubled: ``{{``),
    is formatted the same way; any other is taken as it is. ``sections`` (the RLM's
    ``tool_prompts``) follow it, each after a blank line, as they are.
    """
    prompt = _base_prompt(
        custom, tools_section(tools or {}), can_recurse, output_chars, context_hint
    )
    return "\n\n".join([prompt.rstrip(), *sections]) if sections else prompt


def _base_prompt(
    custom: str | None, section: str, can_recurse: bool, output_chars: int, context_hint: str
) -> str:
    if custom is not None:
        if "{{" in custom or "}}" in custom:
            try:
                return custom.format(custom_tools_section=section)
            except (KeyError, IndexError, ValueError, AttributeError, TypeError):
                pass  # single braces of its own: not a format string
        return custom.replace("{custom_tools_section}", section)
    return (
        SYSTEM_PROMPT.replace("{output_chars}", f"{output_chars:,}")
        .replace("{context_hint}", context_hint)
        .replace("{recursion_note}", _RECURSION_ON if can_recurse else _RECURSION_OFF)
        .replace("{tools}", section)
    )


def context_summary(context: Any) -> str:
    """A one-line description of a context value: its type and size."""
    if isinstance(context, str):
        return f"a str of {len(context):,} characters"
    if isinstance(context, list):
        sizes, about = _sizes(context)
        shown = ", ".join(f"{s:,}" for s in sizes[:20]) + (", ..." if len(sizes) > 20 else "")
        images = sum(1 for item in context if isinstance(item, Image))
        note = (
            f"; {images:,} of them images: pass one to llm_query([text, image])" if images else ""
        )
        return (
            f"a list of {len(context):,} items (sizes in characters: {shown}; "
            f"{about}{sum(sizes):,} in all{note})"
        )
    if isinstance(context, dict):
        sizes, about = _sizes(context.values())
        keys = ", ".join(f"{k!r}: {n:,}" for k, n in zip(list(context)[:20], sizes, strict=False))
        more = ", ..." if len(context) > 20 else ""
        return (
            f"a dict with {len(context):,} keys (characters of each value: {keys}{more}; "
            f"{about}{sum(sizes):,} in all)"
        )
    return f"a {type(context).__name__}"


_MEASURED = 200
"""Items of a context whose size is their JSON's, measured; the rest such items are
counted at their mean (the total then says "about"): the first message is made on the
engine's loop, and a million small dicts took seconds to encode."""


def _sizes(items: Iterable[Any]) -> tuple[list[int], str]:
    """The sizes of a context's items in characters (`_cheap_size`, `_json_size`), and
    ``"about "`` when some were counted at the mean of those measured."""
    sizes: list[int | None] = []
    measured = 0
    for item in items:
        size = _cheap_size(item)
        if size is None and measured < _MEASURED:
            size, measured = _json_size(item), measured + 1
        sizes.append(size)
    if all(size is not None for size in sizes):
        return sizes, ""  # type: ignore[return-value]
    known = [size for size in sizes if size is not None]
    mean = sum(known) // len(known) if known else 1
    return [mean if size is None else size for size in sizes], "about "


def _cheap_size(item: Any) -> int | None:
    """A text's length, a chat message's content's; an image counts 1 (noted apart);
    None for what only its JSON can size."""
    if isinstance(item, str):
        return len(item)
    if isinstance(item, dict) and isinstance(item.get("content"), str):
        return len(item["content"])
    if isinstance(item, Image):
        return 1
    return None


def _json_size(item: Any) -> int:
    try:
        return len(json.dumps(item, ensure_ascii=False, default=str))
    except Exception:  # a cycle, a key JSON has no word for, a __str__ that raises
        return 1


def first_user_message(
    context: Any,
    root_prompt: str | None,
    *,
    index: int = 0,
    histories: int = 0,
    max_iterations: int,
    schema: str | None = None,
) -> str:
    """The task: what the context is, the question, the answer's shape (``schema``: a
    JSON Schema as text) and the turn budget."""
    name = "context" if index == 0 else f"context_{index}"
    lines = [f"Your context (`{name}`) is {context_summary(context)}."]
    if index > 0:
        lines.append(
            f"This is a persistent session: earlier contexts are `context_0` .. "
            f"`context_{index - 1}` and earlier conversations `history_0` .. "
            f"`history_{histories - 1}`."
            if histories
            else f"Earlier contexts are `context_0` .. `context_{index - 1}`."
        )
    if root_prompt:
        lines.append(f"Question: {root_prompt}")
    else:
        lines.append("There is no separate question: the task is stated in the context itself.")
    if schema is not None:
        lines.append(schema_instructions(schema))
    lines.append(
        f"You have {max_iterations} turns. Start by looking at the context in a ```repl block."
    )
    return "\n".join(lines)


def format_repl_output(
    results: Sequence[ExecResult], *, limit: int, turn: int, max_iterations: int
) -> str:
    """The user message after a turn: each block's output, cut to ``limit`` characters."""
    parts = []
    for index, result in enumerate(results, start=1):
        header = "REPL output:" if len(results) == 1 else f"REPL output (block {index}):"
        body = "\n".join(p for p in (result.stdout.rstrip("\n"), result.stderr.rstrip("\n")) if p)
        if result.timed_out:
            body += "\n[the block timed out and was stopped" + (
                "; the REPL was restarted and its variables are lost]" if result.restarted else "]"
            )
        parts.append(f"{header}\n{truncate_output(body, limit) if body else '(no output)'}")
    left = max_iterations - turn
    parts.append(f"[turn {turn} of {max_iterations} done; {left} left]")
    return "\n\n".join(parts)


def no_code_message(turn: int, max_iterations: int) -> str:
    return (
        "Your reply had no ```repl block, so nothing ran. Work in the REPL, and finish by "
        f'setting answer["content"] and answer["ready"] = True. [turn {turn} of {max_iterations}]'
    )


def final_answer_prompt(max_iterations: int, *, typed: bool = False) -> str:
    if typed:
        return (
            f"You have used all {max_iterations} turns. Reply now with your best final answer "
            "as a JSON value matching the answer schema you were given, and nothing else. "
            "Do not write code."
        )
    return (
        f"You have used all {max_iterations} turns. Reply now with your best final answer to "
        "the question, as plain text, based on what you have found. Do not write code."
    )


def schema_instructions(schema: str, *, repl: bool = True) -> str:
    """What a typed completion tells the model about its answer's shape (``repl=False``:
    a one-call answer, without a REPL)."""
    if not repl:
        return (
            "Answer with a JSON value matching this JSON Schema, and nothing else:\n"
            f"```json\n{schema}\n```"
        )
    return (
        "Answer format: your final answer must be a JSON value matching this JSON Schema:\n"
        f"```json\n{schema}\n```\n"
        'Put the value itself in answer["content"] (a dict, a list, a number... or its JSON '
        'text) and set answer["ready"] = True, or call FINAL(value). An answer that does not '
        "match is refused, and you are told what is wrong."
    )


def schema_rejected_note(problem: str) -> str:
    """Appended to a block's output when its answer did not match the schema."""
    return (
        f"SchemaMismatch: your answer was not accepted: {problem}\n"
        '[answer was reset; fix the value and finish again with answer["content"] and '
        'answer["ready"] = True, or FINAL(value)]\n'
    )


def opening_messages(
    context: Any,
    root_prompt: str | None,
    *,
    settings: LoopSettings,
    tools: Mapping[str, tuple[Any, str | None]],
    can_recurse: bool,
    index: int,
    max_iterations: int,
    schema: str | None,
) -> list[Message]:
    """A completion's first two messages: the system prompt (`system_prompt`, as
    ``settings`` say) and the task (`first_user_message`; a persistent session's
    completion ``index`` also names its earlier histories)."""
    system = system_prompt(
        custom=settings.custom_system_prompt,
        tools=tools,
        can_recurse=can_recurse,
        output_chars=settings.output_chars,
        sections=settings.tool_prompts,
    )
    task = first_user_message(
        context,
        root_prompt,
        index=index,
        histories=index,
        max_iterations=max_iterations,
        schema=schema,
    )
    return [Message(role="system", content=system), Message(role="user", content=task)]
