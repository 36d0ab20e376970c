"""A fake Echo API for tests, built on ``rlm_graph.testing.FakeServer``.

A fake for your own API overrides ``paths`` and three methods; the base class brings the
socket, the scripting (``responder``, ``replies``, `Reply` errors and dropped
connections) and the records (``requests``, ``peak_in_flight``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlm_graph.testing import FakeServer, Reply

__all__ = ["FakeEchoServer", "last_user_text"]


class FakeEchoServer(FakeServer):
    """Answers ``POST /echo``; by default with the last user message (capitals when
    asked). Use ``server.base_url`` as the provider's ``base_url``."""

    paths = ("/echo",)

    def __init__(self, responder: Any = None, **kwargs: Any) -> None:
        super().__init__(responder or _echo, **kwargs)

    def check_request(self, headers: Mapping[str, str], body: Any) -> Reply | None:
        if self.api_key is not None and headers.get("x-echo-key") != self.api_key:
            return Reply(401, "bad X-Echo-Key")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return Reply(400, "messages is required")
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                return Reply(400, "each message needs a role: user or assistant")
            if not isinstance(message.get("text"), str):
                return Reply(400, "each message needs a text")
        return None

    def success_body(self, text: str, body: Any) -> dict[str, Any]:
        words = [str(body.get("system") or ""), *(m["text"] for m in body["messages"])]
        return {
            "text": text,
            "tokens_in": sum(len(part.split()) for part in words),
            "tokens_out": len(text.split()),
            "done": "complete",
        }

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"detail": message}


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the request's last user message."""
    users = [m["text"] for m in body["messages"] if m["role"] == "user"]
    return str(users[-1]) if users else ""


def _echo(body: dict[str, Any]) -> str:
    prompt = last_user_text(body)
    return prompt.upper() if body.get("shout") else prompt
