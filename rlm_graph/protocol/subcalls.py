"""What the engine takes from model code's sub-calls (pure): the caps, and the checks
`rlm_graph.runtime.bridge.CompletionBridge.call` makes once per `SubcallRequest`.

Model code, and the documents it reads, are untrusted: a guest process may write any
bytes to its pipe, and the local REPL's code any values. Everything that crosses is
checked here before the engine builds a node, a request or a validator from it:

    the call          ``rlm_query`` prompts are text; at most `MAX_PROMPTS` prompts
    each prompt       at most `MAX_PROMPT_CHARS` characters of text; images decoded from
                      base64, their type read from their bytes, their size capped
                      (`rlm_graph.contracts.MAX_IMAGE_BYTES`)
    the schema        data only: `rlm_graph.protocol.schema.AnswerSchema.from_guest`
    the model name    at most `MAX_MODEL_CHARS` characters; configured ones only (the
                      router's ``check_allowed``)

A call over the caps is refused whole, before any node is made (what the guest sent is
all the engine holds of it); a call with a bad schema or model name fails each of its
slots, each a node with the reason (until a completion has `MAX_REFUSED_NODES` of them:
a call that would take it past is refused whole); a bad part of one prompt fails that slot only.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from ..contracts import MAX_IMAGE_BYTES, Image, SubcallRequest
from ..errors import ConfigError, error_slot

__all__ = [
    "MAX_MODEL_CHARS",
    "MAX_PROMPTS",
    "MAX_PROMPT_CHARS",
    "MAX_REFUSED_NODES",
    "Prompt",
    "check_request",
    "prompt_parts",
    "refused_whole",
]

MAX_PROMPTS = 10_000
"""Prompts of one ``*_batched`` call (each is a node of the graph)."""

MAX_PROMPT_CHARS = 16 * 1024 * 1024
"""Characters of text in one prompt (16 Mi: far above any model's window)."""

MAX_REFUSED_NODES = 1_000
"""Slots of a completion refused for their model name or schema that get a node each;
past it such calls are refused whole (the same ``[ERROR]`` slots, no node): a guest
looping on a refused call costs the engine nothing that grows."""

MAX_MODEL_CHARS = 256
"""Characters of a model name that model code passes (``model=``)."""

Prompt = str | Sequence[Any]
"""What ``llm_query`` takes: text, or a list of parts (str, `Image`, or an image as the
REPL sends it, ``{"media_type", "data": <base64>}``)."""


def check_request(request: SubcallRequest) -> None:
    """Refuse a call over the caps, or an ``rlm_query`` prompt that is not text.

    Raises:
        ConfigError: naming the cap and what to do instead.
    """
    name = request.fn
    if not request.prompts and not request.batched:
        raise ConfigError(f"{name}() needs a prompt")
    if request.model is not None and str.__len__(request.model) > MAX_MODEL_CHARS:
        raise ConfigError(
            f"{name}(..., model=...) names a model of {len(request.model):,} characters; "
            f"a model name has at most {MAX_MODEL_CHARS}: pass one of the allowed names"
        )
    if len(request.prompts) > MAX_PROMPTS:
        raise ConfigError(
            f"{name}() got {len(request.prompts):,} prompts; at most {MAX_PROMPTS:,} go in "
            "one call: split the list and make several calls"
        )
    for index, prompt in enumerate(request.prompts):
        where = f"{name}(): prompt {index}" if request.batched else f"{name}()"
        if name.startswith("rlm") and not isinstance(prompt, str):
            raise ConfigError(f"{where} is a {type(prompt).__name__}; rlm_query takes text")
        texts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]
        if sum(str.__len__(text) for text in texts) > MAX_PROMPT_CHARS:  # not a subclass's
            raise ConfigError(
                f"{where} holds more than {MAX_PROMPT_CHARS:,} characters; no model reads "
                "that much: send a part of it, or summarise it first"
            )


def refused_whole(request: SubcallRequest, exc: ConfigError) -> Any:
    """What a call refused whole returns: one ``[ERROR]`` string in each of its slots."""
    error = error_slot(exc)
    return [error] * len(request.prompts) if request.batched else error


def prompt_parts(prompt: Prompt) -> list[str | Image]:
    """A sub-call's prompt as message parts. Images from the REPL are checked again here
    (type by signature, size): the REPL may be a hostile guest process.

    Raises:
        ValueError: a part that is neither text nor a readable image.
    """
    if isinstance(prompt, str):
        return [prompt]
    parts: list[str | Image] = []
    for index, part in enumerate(prompt):
        if isinstance(part, str | Image):
            parts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("data"), str):
            if len(part["data"]) // 4 * 3 > MAX_IMAGE_BYTES:  # refused before it is decoded
                raise ValueError(
                    f"prompt part {index}: the image is over {MAX_IMAGE_BYTES // 2**20} MiB"
                )
            try:
                data = base64.b64decode(part["data"], validate=True)
            except binascii.Error:
                raise ValueError(f"prompt part {index}: the image data is not base64") from None
            parts.append(Image.from_bytes(data))
        else:
            raise ValueError(
                f"prompt part {index} is a {type(part).__name__}, not text or an image"
            )
    return parts
