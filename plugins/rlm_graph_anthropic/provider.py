"""Anthropic Messages (``POST {base_url}/v1/messages``) over httpx.

Wire differences from OpenAI that this module absorbs:
    - the key goes in ``x-api-key`` and every request names an ``anthropic-version``;
    - system messages are not messages: they are joined into the top-level ``system``;
    - the conversation must alternate user/assistant, so consecutive messages of one role
      are merged;
    - ``max_tokens`` is required (default here: ``default_max_tokens``, 4096);
    - ``stop`` is ``stop_sequences``; there is no ``seed`` (a request's seed is dropped);
    - input tokens are reported in three parts (plain, cache read, cache write); the
      engine's ``input_tokens`` is their sum and ``cached_tokens`` the cache reads;
    - prompt caching is asked for, not automatic: a request with a ``cache_key`` (a
      root turn) marks the system prompt and its last message with ``cache_control``,
      so that the next turn, which repeats that prefix, reads it from the cache;
    - a streamed answer is the event stream (``message_start`` ... ``content_block_delta``
      ... ``message_delta`` ... ``message_stop``); usage is ``message_start``'s, updated
      by ``message_delta``'s;
    - structured output is tool use: a request with a ``response_schema`` offers one
      tool whose input schema is the answer's, forces it (``tool_choice``), and the
      tool call's ``input`` is the answer, as JSON text. A tool's input must be an object,
      so any other shape (a list, a number) is wrapped as ``{"value": ...}`` and unwrapped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlm_graph.errors import checked_flag
from rlm_graph.http import (
    BadResponse,
    ChatRequest,
    ChatResponse,
    ConfigError,
    JSONProvider,
    KeyPolicy,
    Message,
    StreamParser,
    Usage,
    answer_head,
    estimate_tokens,
    event_error,
    event_object,
    reason_text,
    resolve_key,
    token_count,
)

__all__ = ["DEFAULT_BASE_URL", "AnthropicProvider"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
KEYS = KeyPolicy(
    backend="anthropic",
    default_base_url=DEFAULT_BASE_URL,
    key_env="ANTHROPIC_API_KEY",
    base_url_env="ANTHROPIC_BASE_URL",
    official_hosts=frozenset({"api.anthropic.com"}),
    key_required=True,
)


class AnthropicProvider(JSONProvider):
    """A client for the Anthropic Messages API.

    Args:
        model_name: the model asked for when a call names none (required).
        base_url: the API root without ``/v1`` (default ``https://api.anthropic.com``).
        api_key: the key, sent to ``base_url`` whatever it is.
        api_key_env: the name of an environment variable holding the key, sent to
            ``base_url`` whatever it is. Without either, ``ANTHROPIC_API_KEY`` is sent only
            to ``api.anthropic.com`` (or to ``$ANTHROPIC_BASE_URL``), and is required there.
        anthropic_version: the ``anthropic-version`` header.
        default_max_tokens: ``max_tokens`` for requests that set none.
        prompt_caching: mark a root turn's prefix with ``cache_control`` (cache writes
            cost 1.25x input, reads 0.1x; see docs/providers.md).
        **kwargs: everything `JSONProvider` takes (``max_concurrent``, ``timeout``,
            ``max_attempts``, ``requests_per_minute``, ``extra_body``, ``stream``...).
    """

    name = "anthropic"
    path = "/v1/messages"

    def __init__(
        self,
        *,
        model_name: str = "",
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        anthropic_version: str = API_VERSION,
        default_max_tokens: int = 4096,
        prompt_caching: bool = True,
        **kwargs: Any,
    ) -> None:
        resolved = resolve_key(KEYS, api_key=api_key, api_key_env=api_key_env, base_url=base_url)
        if default_max_tokens < 1:
            raise ConfigError("anthropic: default_max_tokens must be at least 1")
        self.anthropic_version = anthropic_version
        self.default_max_tokens = default_max_tokens
        self.prompt_caching = checked_flag("anthropic: prompt_caching", prompt_caching)
        super().__init__(
            model_name=model_name, base_url=resolved.base_url, api_key=resolved.key, **kwargs
        )
        self.key_rule = resolved.rule
        self.key_variables = resolved.variables

    def _auth_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": self.anthropic_version}
        if self._api_key:
            headers["x-api-key"] = self._api_key.reveal()
        return headers

    def _build_body(self, request: ChatRequest) -> dict[str, Any]:
        cached = request.cache_key is not None and self.prompt_caching
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": request.max_tokens or self.default_max_tokens,
            "messages": _alternating(request.messages, cached),
        }
        if request.system:
            body["system"] = [_marked(request.system)] if cached else request.system
        sampling = {
            "temperature": request.temperature,
            "top_p": request.top_p,
            "stop_sequences": list(request.stop) if request.stop else None,
        }
        body.update({k: v for k, v in sampling.items() if v is not None})
        if request.response_schema is not None:
            name = request.response_schema.name
            body["tools"] = [
                {
                    "name": name,
                    "description": "Give your answer as this tool's input.",
                    "input_schema": _tool_input_schema(request.response_schema.json_schema),
                }
            ]
            body["tool_choice"] = {"type": "tool", "name": name}
        body.update(request.extra)
        return body

    def _stream_fields(self, request: ChatRequest) -> dict[str, Any] | None:
        if request.response_schema is not None:
            return None  # a typed call is a tool call, read whole
        return {"stream": True}

    def _stream_parser(self, request: ChatRequest) -> StreamParser:
        return _MessageStream(self.url, request)

    def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
        blocks = data.get("content") if isinstance(data, Mapping) else None
        if not isinstance(blocks, list):
            said = self._quote(self._server_message(data) or answer_head())
            raise BadResponse(
                f"anthropic: {self.url} answered without a content list ({said}); check "
                "that base_url is the Anthropic API root (without /v1)",
                provider=self.name,
            )
        text = "".join(
            str(b.get("text", ""))
            for b in blocks
            if isinstance(b, Mapping) and b.get("type") == "text"
        )
        if request.response_schema is not None:
            text = _tool_answer(blocks, request.response_schema.json_schema) or text
        return ChatResponse(
            content=text,
            model=str(data.get("model") or request.model),
            usage=_usage(data.get("usage")),
            finish_reason=reason_text(data.get("stop_reason")),
        )


def _wrapped(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") != "object"


def _tool_input_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The answer's schema as a tool input schema (an object; see the module)."""
    if not _wrapped(schema):
        return schema
    inner = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    outer: dict[str, Any] = {
        "type": "object",
        "properties": {"value": inner},
        "required": ["value"],
    }
    for key in ("$defs", "definitions"):  # references stay valid from the new root
        if key in schema:
            outer[key] = schema[key]
    return outer


def _tool_answer(blocks: list[Any], schema: Mapping[str, Any]) -> str | None:
    """The forced tool call's input as JSON text, unwrapped; None if there is none."""
    for block in blocks:
        if isinstance(block, Mapping) and block.get("type") == "tool_use":
            value = block.get("input")
            if _wrapped(schema) and isinstance(value, Mapping) and "value" in value:
                value = value["value"]
            return json.dumps(value, ensure_ascii=False)
    return None


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _content(message: Message) -> str | list[dict[str, Any]]:
    """A message's content: its text, or its parts with images as base64 ``image``
    blocks (the Messages format for images)."""
    if not message.parts:
        return message.content
    return [
        {"type": "text", "text": part}
        if isinstance(part, str)
        else {
            "type": "image",
            "source": {"type": "base64", "media_type": part.media_type, "data": part.base64()},
        }
        for part in message.parts
    ]


_EPHEMERAL = {"type": "ephemeral"}


def _marked(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": _EPHEMERAL}


def _alternating(messages: tuple[Message, ...], cached: bool = False) -> list[dict[str, Any]]:
    """User/assistant turns, same-role neighbours merged, starting with a user turn;
    ``cached``: the last turn's last block carries ``cache_control``."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        content = _content(message)
        if turns and turns[-1]["role"] == message.role:
            before = turns[-1]["content"]
            if isinstance(before, str) and isinstance(content, str):
                turns[-1]["content"] = before + "\n\n" + content
            else:
                turns[-1]["content"] = _blocks(before) + _blocks(content)
        else:
            turns.append({"role": message.role, "content": content})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": "(continue)"})
    if cached:
        blocks = _blocks(turns[-1]["content"])
        turns[-1]["content"] = [*blocks[:-1], {**blocks[-1], "cache_control": _EPHEMERAL}]
    return turns


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, Mapping):
        return Usage()
    cache_read = token_count(raw.get("cache_read_input_tokens"))
    cache_write = token_count(raw.get("cache_creation_input_tokens"))
    return Usage(
        input_tokens=token_count(raw.get("input_tokens")) + cache_read + cache_write,
        output_tokens=token_count(raw.get("output_tokens")),
        cached_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


_MESSAGE_EVENTS = frozenset(
    (
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    )
)
"""The events of a streamed message (`_MessageStream`'s progress); not ``ping``."""


class _MessageStream:
    """One attempt's Messages events. Text comes in ``content_block_delta`` events of type
    ``text_delta``; ``message_delta`` brings the stop reason and the final output count;
    ``message_stop`` ends the stream, and the reply is ``whole`` from ``message_delta``'s
    stop reason (which brings the last of it), so a server that sends no
    ``message_stop`` after it is not waited for; an ``error`` event (``overloaded_error``
    mid-stream) fails the attempt. ``progress`` counts the events of the message (its
    start, blocks, deltas, stop reason and end); ``ping``, the API's keep-alive, and any
    event of a kind it does not know are not progress (`rlm_graph.http.StreamParser`)."""

    __slots__ = ("finished", "_model", "_parts", "progress", "_stop", "_url", "_usage", "whole")

    def __init__(self, url: str, request: ChatRequest) -> None:
        self._url = url
        self._parts: list[str] = []
        self._model = request.model
        self._usage: dict[str, Any] = {}
        self._stop: str | None = None
        self.finished = False
        self.progress = 0
        self.whole = False

    def _bad(self, what: str) -> BadResponse:
        return BadResponse(f"anthropic: {self._url} {what}", provider="anthropic", retryable=True)

    def _count(self, usage: Mapping[str, Any]) -> None:
        """Take the counts a usage object gives; a ``null`` one (the API types them
        optional) leaves the count an earlier event gave."""
        self._usage.update((key, value) for key, value in usage.items() if value is not None)

    def feed(self, event: str, data: str) -> str:
        if not data or data.isspace():  # an event with no data: nothing to read, no fault
            return ""
        message = event_object(data)
        if event == "error":  # `event: error` (whatever its data), or llama.cpp's `error:`
            raise event_error(
                "anthropic", self._url, (message or {}).get("error") or message or data
            )
        if message is None:
            raise self._bad(f"streamed an event that is not a JSON object ({data[:80]!r})")
        kind = message.get("type", event)
        if type(kind) is str and kind in _MESSAGE_EVENTS:
            self.progress += 1
        if kind == "content_block_delta":
            delta = message.get("delta")
            if type(delta) is dict and delta.get("type") == "text_delta":
                text = str(delta.get("text", ""))
                self._parts.append(text)
                self.whole = self.whole and not text
                return text
        elif kind == "message_start" and isinstance(message.get("message"), Mapping):
            start = message["message"]
            self._model = str(start.get("model") or self._model)
            if isinstance(start.get("usage"), Mapping):
                self._count(start["usage"])
        elif kind == "message_delta":
            delta = message.get("delta")
            if isinstance(delta, Mapping) and delta.get("stop_reason"):
                self._stop = reason_text(delta["stop_reason"])
                self.whole = True
            if isinstance(message.get("usage"), Mapping):
                self._count(message["usage"])
        elif kind == "message_stop":
            self.finished = True
        elif kind == "error":
            raise event_error("anthropic", self._url, message.get("error") or message)
        return ""

    def partial(self) -> ChatResponse:
        """A stopped reply: message_start's input usage, the output estimated."""
        text = "".join(self._parts)
        usage = _usage(self._usage).model_copy(
            update={"output_tokens": estimate_tokens(text), "estimated": True}
        )
        return ChatResponse(
            content=text, model=self._model, usage=usage, finish_reason="engine_stop"
        )

    def result(self) -> ChatResponse:
        if not (self.finished or self.whole):
            raise self._bad("ended the stream before message_stop (and its stop reason)")
        return ChatResponse(
            content="".join(self._parts),
            model=self._model,
            usage=_usage(self._usage),
            finish_reason=self._stop,
        )
