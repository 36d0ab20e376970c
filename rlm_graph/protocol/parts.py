"""A sub-call's prompt as the parts of a message: text and images. Pure."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from ..contracts import Image

__all__ = ["Prompt", "prompt_parts"]

Prompt = str | Sequence[Any]
"""What ``llm_query`` takes: text, or a list of parts (str, `Image`, or an image as the
REPL sends it, ``{"media_type", "data": <base64>}``)."""


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
