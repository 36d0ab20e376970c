"""A fake Echo API for tests, built on ``rlm_graph.testing.FakeServer``.

A fake for your own API overrides ``paths`` and three methods; the base class brings the
socket, the scripting (``responder``, ``replies``, `Reply` errors and dropped
connections) and the records (``requests``, ``peak_in_flight``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlm_graph.testing import FakeServer, Reply

__all__ = ["FakeEchoServer"]


class FakeEchoServer(FakeServer):
    """Answers ``POST /echo``; by default with the prompt itself (capitals when asked)."""

    paths = ("/echo",)

    def __init__(self, responder: Any = None, **kwargs: Any) -> None:
        super().__init__(responder or _echo, **kwargs)

    def check_request(self, headers: Mapping[str, str], body: Any) -> Reply | None:
        if self.api_key is not None and headers.get("x-echo-key") != self.api_key:
            return Reply(401, "bad X-Echo-Key")
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            return Reply(400, "prompt is required")
        return None

    def success_body(self, text: str, body: Any) -> dict[str, Any]:
        return {
            "text": text,
            "tokens_in": len(body["prompt"].split()),
            "tokens_out": len(text.split()),
            "done": "complete",
        }

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"detail": message}


def _echo(body: dict[str, Any]) -> str:
    prompt = str(body["prompt"])
    return prompt.upper() if body.get("shout") else prompt
