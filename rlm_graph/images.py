"""Images in model calls and contexts: `Image`, its checks, and its JSON form. Pure.

Part of the plugin seam (`rlm_graph.contracts` re-exports every name): an image crosses
from the REPL (perhaps a hostile guest) to the engine and on to a provider, so its type
is read from its bytes' signature and its size is bounded before anything trusts it.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MAX_IMAGE_BYTES",
    "Image",
    "image_json_default",
    "image_json_hook",
    "image_media_type",
]

_IMAGE_TYPES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)

MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""The largest image a call may carry (OpenAI's limit; Anthropic's is 5 MB)."""


def image_media_type(data: bytes) -> str | None:
    """The media type of PNG, JPEG, GIF or WebP bytes, from their signature; else None."""
    for magic, media_type in _IMAGE_TYPES:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


class Image(BaseModel):
    """An image in a sub-call (``llm_query([text, image])``) or in a context list.

    Its ``str()`` and ``repr()`` are a placeholder (``<image 12 KB png>``), so previews,
    records, traces and REPL output never carry its bytes. In JSON, ``data`` is base64.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    media_type: str
    data: bytes = Field(repr=False)

    @classmethod
    def from_bytes(cls, data: bytes) -> Image:
        """An image from PNG, JPEG, GIF or WebP bytes.

        Raises:
            ValueError: the bytes are none of those, or larger than `MAX_IMAGE_BYTES`.
        """
        media_type = image_media_type(bytes(data[:16]))
        if media_type is None:
            raise ValueError("the bytes are not a PNG, JPEG, GIF or WebP image")
        if len(data) > MAX_IMAGE_BYTES:
            raise ValueError(
                f"the image is {len(data):,} bytes; the most a call may carry is "
                f"{MAX_IMAGE_BYTES // 2**20} MiB ({MAX_IMAGE_BYTES:,} bytes)"
            )
        return cls(media_type=media_type, data=bytes(data))

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> Image:
        """An image read from a file (PNG, JPEG, GIF or WebP, by its bytes)."""
        with open(path, "rb") as handle:
            data = handle.read(MAX_IMAGE_BYTES + 1)
        try:
            return cls.from_bytes(data)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}: {exc}") from None

    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def __str__(self) -> str:
        size = len(self.data)
        amount = f"{size / 1024:.0f} KB" if size >= 1024 else f"{size} bytes"
        return f"<image {amount} {self.media_type.rsplit('/', 1)[-1]}>"

    def __repr__(self) -> str:
        return str(self)


_IMAGE_KEY = "$rlm_image"


def image_json_default(value: Any) -> Any:
    """``json.dump``'s ``default`` for values holding images: an `Image` becomes
    ``{"$rlm_image": {"media_type", "data": <base64>}}`` (`image_json_hook` reverses it)."""
    if isinstance(value, Image):
        return {_IMAGE_KEY: {"media_type": value.media_type, "data": value.base64()}}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def image_json_hook(obj: dict[str, Any]) -> Any:
    """``json.load``'s ``object_hook`` that turns `image_json_default`'s dicts back into
    images (checked: a dict that is not a readable image stays a dict)."""
    found = obj.get(_IMAGE_KEY) if len(obj) == 1 else None
    if isinstance(found, dict) and isinstance(found.get("data"), str):
        try:
            return Image.from_bytes(base64.b64decode(found["data"], validate=True))
        except ValueError:
            return obj
    return obj
