"""The fake servers of the OpenAI chat completions and Anthropic Messages APIs, on
`FakeServer` (real HTTP on 127.0.0.1; see `rlm_graph.testing.servers`).

With ``prompt_cache=True`` each keeps a prompt cache the way its API does: the OpenAI
fake caches every prefix it sees (at message boundaries, automatically) and reports a
request's longest cached prefix as ``prompt_tokens_details.cached_tokens``; the
Anthropic fake caches only prefixes that end at a ``cache_control`` mark (the system
prompt, or a message), reports the longest one a request repeats as
``cache_read_input_tokens`` and what its marks add as ``cache_creation_input_tokens``.
Prefixes shorter than ``cache_min_tokens`` are not cached.
"""

from __future__ import annotations

import hashlib
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


def _message_text(message: Any) -> tuple[str, int]:
    """A message's text and its count of images (its cache marks left out)."""
    content = message.get("content", "") if isinstance(message, dict) else ""
    if not isinstance(content, list):
        return str(content), 0
    text, images = "", 0
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("image", "image_url"):
            images += 1
        elif isinstance(part, dict):
            text += str(part.get("text", ""))
    return text, images


def _system_text(body: Any) -> str:
    system = (body or {}).get("system", "")
    if isinstance(system, list):
        return "".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return str(system)


def _prefixes(body: Any) -> list[tuple[str, int, bool]]:
    """Each prefix of a request at a boundary (the system prompt, then each message):
    its key, its tokens, and whether it ends at a ``cache_control`` mark."""
    model = str((body or {}).get("model", ""))
    system = (body or {}).get("system")
    text = _system_text(body)
    digest = hashlib.sha256(f"{model}\x00{text}".encode())
    found = []
    if text:
        marked = isinstance(system, list) and any(
            isinstance(b, dict) and "cache_control" in b for b in system
        )
        found.append((digest.hexdigest(), _tokens(text), marked))
    images = 0
    for message in (body or {}).get("messages") or []:
        part, count = _message_text(message)
        text, images = text + part, images + count
        digest.update(f"\x00{message.get('role')}\x00{part}\x00{count}".encode())
        content = message.get("content")
        marked = isinstance(content, list) and any(
            isinstance(b, dict) and "cache_control" in b for b in content
        )
        found.append((digest.hexdigest(), _tokens(text) + IMAGE_TOKENS * images, marked))
    return found


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

    def cache_counts(self, body: Any) -> tuple[int, int]:
        """Automatic caching: the longest prefix seen before is read; every prefix long
        enough is kept."""
        read = 0
        for key, tokens, _ in _prefixes(body):
            if key in self._prefixes:
                read = tokens
            elif tokens >= self.cache_min_tokens:
                self._prefixes.add(key)
        return read, 0

    def _usage(self, text: str, body: Any) -> dict[str, Any]:
        prompt, completion = _prompt_tokens(body), _tokens(text)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.prompt_cache:
            usage["prompt_tokens_details"] = {"cached_tokens": self.counted[0]}
        if self.cost_per_call is not None:
            usage["cost"] = self.cost_per_call
        return usage

    def _chunk(self, body: Any, delta: Any, finish: str | None = None) -> str:
        chunk = {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion.chunk",
            "model": (body or {}).get("model", ""),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(chunk)}\n\n"

    def stream_events(self, text: str, body: Any) -> tuple[list[str], list[str]]:
        tail = [self._chunk(body, {}, "stop")]
        options = (body or {}).get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            usage: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk"}
            usage.update(choices=[], usage=self._usage(text, body))
            tail.append(f"data: {json.dumps(usage)}\n\n")
        tail.append("data: [DONE]\n\n")
        return [self._chunk(body, {"role": "assistant", "content": ""})], tail

    def token_event(self, token: str, body: Any) -> str:
        return self._chunk(body, {"content": token})

    def error_event(self, message: str) -> str:
        error = {"error": {"message": message, "type": "server_error", "code": None}}
        return f"data: {json.dumps(error)}\n\n"

    def success_body(self, text: str, body: Any) -> dict[str, Any]:
        usage = self._usage(text, body)
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
            "usage": {**self._input_usage(body), "output_tokens": _tokens(text)},
        }

    def cache_counts(self, body: Any) -> tuple[int, int]:
        """Explicit caching: the longest marked prefix seen before, up to the request's
        last mark, is read; the rest up to that mark is written."""
        prefixes = _prefixes(body)
        marks = [i for i, (_, _, marked) in enumerate(prefixes) if marked]
        if not marks:
            return 0, 0
        read = max((p[1] for p in prefixes[: marks[-1] + 1] if p[0] in self._prefixes), default=0)
        written = 0
        for i in marks:
            key, tokens, _ = prefixes[i]
            if key not in self._prefixes and tokens >= self.cache_min_tokens:
                self._prefixes.add(key)
                written = tokens - read
        return read, max(0, written)

    def _input_usage(self, body: Any) -> dict[str, int]:
        read, written = self.counted
        usage = {"input_tokens": _prompt_tokens(body) - read - written}
        if self.prompt_cache:
            usage.update(cache_read_input_tokens=read, cache_creation_input_tokens=written)
        return usage

    @staticmethod
    def _event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    def stream_events(self, text: str, body: Any) -> tuple[list[str], list[str]]:
        start = {
            "id": f"msg_fake_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": (body or {}).get("model", ""),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**self._input_usage(body), "output_tokens": 1},
        }
        head = [
            self._event("message_start", message=start),
            self._event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            self._event("ping"),
        ]
        tail = [
            self._event("content_block_stop", index=0),
            self._event(
                "message_delta",
                delta={"stop_reason": "end_turn", "stop_sequence": None},
                usage={"output_tokens": _tokens(text)},
            ),
            self._event("message_stop"),
        ]
        return head, tail

    def token_event(self, token: str, body: Any) -> str:
        return self._event(
            "content_block_delta", index=0, delta={"type": "text_delta", "text": token}
        )

    def error_event(self, message: str) -> str:
        return self._event("error", error={"type": "overloaded_error", "message": message})

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
