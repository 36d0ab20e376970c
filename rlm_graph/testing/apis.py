"""The fake servers of the OpenAI chat completions and Anthropic Messages APIs, on
`FakeServer` (real HTTP on 127.0.0.1; see `rlm_graph.testing.servers`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any

from .servers import FakeServer, Reply, Responder

__all__ = ["FakeAnthropicServer", "FakeOpenAIServer"]


def _tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


IMAGE_TOKENS = 85
"""What the fake servers count for each image part of a request."""


def _prompt_tokens(body: Any) -> int:
    messages = (body or {}).get("messages") or []
    text, images = str((body or {}).get("system", "")), 0
    for message in messages:
        content = message.get("content", "")
        if not isinstance(content, list):
            text += str(content)
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("image", "image_url"):
                images += 1
            elif isinstance(part, dict):
                text += str(part.get("text", ""))
    return _tokens(text) + IMAGE_TOKENS * images


class FakeOpenAIServer(FakeServer):
    """A fake OpenAI-compatible server: ``POST /v1/chat/completions``.

    Args:
        cost_per_call: when set, ``usage.cost`` (OpenRouter's reported cost, USD) is
            added to every answer.
        **kwargs: see `FakeServer`.

    Use ``server.base_url`` (``.../v1``) as the provider's ``base_url``.
    """

    paths = ("/v1/chat/completions",)

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        cost_per_call: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(responder, **kwargs)
        self.cost_per_call = cost_per_call

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def check_request(self, headers: Mapping[str, str], body: Any) -> Reply | None:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return Reply(
                401,
                "Incorrect API key provided. You can find your API key in your account settings.",
            )
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return Reply(400, "'messages' is a required property")
        if self.models is not None and body.get("model") not in self.models:
            return Reply(
                404,
                f"The model `{body.get('model')}` does not exist or you do not have access to it.",
            )
        return None

    def success_body(self, text: str, body: Any) -> dict[str, Any]:
        prompt, completion = _prompt_tokens(body), _tokens(text)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cost_per_call is not None:
            usage["cost"] = self.cost_per_call
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "model": (body or {}).get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {401: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}
        return {
            "error": {"message": message, "type": kind.get(status, "server_error"), "code": status}
        }


def _forced_tool(body: Any) -> str | None:
    """The tool a request forces (``tool_choice: {"type": "tool", "name": ...}``)."""
    choice = (body or {}).get("tool_choice") if isinstance(body, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "tool":
        return str(choice.get("name"))
    return None


class FakeAnthropicServer(FakeServer):
    """A fake Anthropic Messages server: ``POST /v1/messages``.

    Refuses what the real API refuses (400): no ``anthropic-version`` header, no
    ``max_tokens``, a ``system`` role inside ``messages``, or turns that do not alternate.
    A request that forces a tool (structured output) is answered with a ``tool_use``
    block whose ``input`` is the reply text read as JSON.

    Use ``server.base_url`` (no ``/v1``) as the provider's ``base_url``.
    """

    paths = ("/v1/messages",)

    def check_request(self, headers: Mapping[str, str], body: Any) -> Reply | None:
        if self.api_key is not None and headers.get("x-api-key") != self.api_key:
            return Reply(401, "invalid x-api-key")
        if "anthropic-version" not in headers:
            return Reply(400, "anthropic-version: header is required")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return Reply(400, "messages: Field required")
        if not isinstance(body.get("max_tokens"), int):
            return Reply(400, "max_tokens: Field required")
        roles = [m.get("role") for m in body["messages"]]
        if "system" in roles:
            return Reply(
                400, 'messages: Unexpected role "system". Use the top-level `system` parameter'
            )
        if any(a == b for a, b in itertools.pairwise(roles)) or roles[:1] != ["user"]:
            return Reply(400, 'messages: roles must alternate between "user" and "assistant"')
        if self.models is not None and body.get("model") not in self.models:
            return Reply(404, f"model: {body.get('model')}")
        return None

    def success_body(self, text: str, body: Any) -> dict[str, Any]:
        forced = _forced_tool(body)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if forced is not None:
            # As the real API does when a tool is forced: the reply (JSON text here) is
            # the tool call's input, and there is no text block.
            try:
                given: Any = json.loads(text)
            except ValueError:
                given = {"raw": text}
            content = [{"type": "tool_use", "id": "toolu_fake", "name": forced, "input": given}]
        return {
            "id": f"msg_fake_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": (body or {}).get("model", ""),
            "content": content,
            "stop_reason": "tool_use" if forced is not None else "end_turn",
            "usage": {"input_tokens": _prompt_tokens(body), "output_tokens": _tokens(text)},
        }

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            429: "rate_limit_error",
            529: "overloaded_error",
        }
        return {
            "type": "error",
            "error": {"type": kind.get(status, "api_error"), "message": message},
        }
