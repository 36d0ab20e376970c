"""The direct path's decision and the one call's text (pure): does the question with the
whole context fit the root model's window, and how is it sent.

The context and the question are estimated at four characters a token, an image of a
context list at `IMAGE_TOKEN_ESTIMATE`, against ``share`` of the root model's window as
the model table states it; a model the table does not know has no stated window, so
the path is not taken for it. The decision is a `Fit`, whose ``reason`` names the numbers
it compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..contracts import Image, estimate_tokens

__all__ = ["IMAGE_TOKEN_ESTIMATE", "Fit", "OneAnswer", "direct_fit", "task_parts", "task_text"]


@dataclass(frozen=True, slots=True)
class Fit:
    """Whether the direct path is taken, and why (in numbers)."""

    taken: bool
    reason: str


IMAGE_TOKEN_ESTIMATE = 1_600
"""What the direct path counts for an image of the context (a large image's cost on
common APIs; the engine cannot see a model's image tokenizer)."""


def task_text(context: Any, root_prompt: str | None) -> str:
    """The question and the context as the one call's text."""
    text = context if isinstance(context, str) else json.dumps(context, default=str)
    return f"{root_prompt}\n\n{text}" if root_prompt else text


def task_parts(context: Any, root_prompt: str | None) -> list[str | Image]:
    """The question and the context as message parts: a context list that holds images
    sends them as images, each other item as text (a str as is, else JSON)."""
    if not (isinstance(context, list) and any(isinstance(item, Image) for item in context)):
        return [task_text(context, root_prompt)]
    parts: list[str | Image] = [root_prompt] if root_prompt else []
    for item in context:
        if isinstance(item, Image | str):
            parts.append(item)
        else:
            parts.append(json.dumps(item, default=str))
    return parts


def _estimate(parts: list[str | Image]) -> int:
    return sum(
        IMAGE_TOKEN_ESTIMATE if isinstance(part, Image) else estimate_tokens(part) for part in parts
    )


def direct_fit(
    context: Any, root_prompt: str | None, *, model: str, window: int | None, share: float
) -> Fit:
    """Whether the question and context fit ``share`` of ``model``'s ``window``."""
    if window is None:
        return Fit(False, f"the window of {model!r} is not in the model table (models=...)")
    tokens = _estimate(task_parts(context, root_prompt))
    limit = int(window * share)
    compared = f"~{tokens:,} tokens of question and context {{}} {share:.0%} ({limit:,}) of the {window:,}-token window of {model!r}"
    if tokens <= limit:
        return Fit(True, compared.format("fit in"))
    return Fit(False, compared.format("exceed"))


@dataclass(frozen=True, slots=True)
class OneAnswer:
    """What one call answered: the reply text, and with a schema the typed value (its
    JSON is then ``text``) or why the reply was refused."""

    text: str
    parsed: Any = None
    refused: str | None = None
    raw: str = ""  # the reply as the model wrote it (what the journal keeps)
