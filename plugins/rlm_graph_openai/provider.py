"""OpenAI-compatible chat completions (``POST {base_url}/chat/completions``) over httpx.

One class serves every server that speaks this wire format; the backend names differ only
in their default base URL and where the key comes from:

    =========== ================================ ========================================
    backend     default base_url                 key
    =========== ================================ ========================================
    openai      https://api.openai.com/v1        OPENAI_API_KEY (base: OPENAI_BASE_URL)
    openrouter  https://openrouter.ai/api/v1     OPENROUTER_API_KEY (OPENROUTER_BASE_URL)
    vllm        http://localhost:8000/v1         ``api_key`` / ``api_key_env`` only
    ollama      http://localhost:11434/v1        ``api_key`` / ``api_key_env`` only
    =========== ================================ ========================================

A key from the environment goes only to the provider's official host, or to a base URL
that also came from the environment; an explicit ``base_url`` elsewhere gets a key only
through ``api_key`` or ``api_key_env`` (see `rlm_graph.http.resolve_key`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from rlm_graph.contracts import TextSink
from rlm_graph.http import (
    BadResponse,
    ChatRequest,
    ChatResponse,
    ConfigError,
    JSONProvider,
    KeyPolicy,
    Message,
    ProviderError,
    StreamParser,
    Usage,
    answer_head,
    content_text,
    event_error,
    event_object,
    reason_text,
    resolve_key,
    token_count,
)
from rlm_graph.tracing.scrub import without_url_passwords

__all__ = ["BACKENDS", "OpenAIProvider", "factory"]

logger = logging.getLogger("rlm_graph")


def _policy(
    name: str,
    base_url: str,
    key_env: str | None = None,
    url_env: str | None = None,
    hosts: tuple[str, ...] = (),
) -> KeyPolicy:
    return KeyPolicy(
        backend=name,
        default_base_url=base_url,
        key_env=key_env,
        base_url_env=url_env,
        official_hosts=frozenset(hosts),
        key_required=key_env is not None,
    )


BACKENDS: dict[str, KeyPolicy] = {
    "openai": _policy(
        "openai",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        ("api.openai.com",),
    ),
    "openrouter": _policy(
        "openrouter",
        "https://openrouter.ai/api/v1",
        "OPENROUTER_API_KEY",
        "OPENROUTER_BASE_URL",
        ("openrouter.ai",),
    ),
    "vllm": _policy("vllm", "http://localhost:8000/v1"),
    "ollama": _policy("ollama", "http://localhost:11434/v1"),
}


_MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")


def _max_tokens_field(backend: str, base_url: str, given: str | None) -> str:
    """The body field a call's output limit goes in: OpenAI's own API takes
    ``max_completion_tokens`` (its reasoning models refuse ``max_tokens`` with a 400);
    other servers speaking its format take ``max_tokens``."""
    if given is not None:
        if given not in _MAX_TOKENS_FIELDS:
            raise ConfigError(
                f"max_tokens_field must be one of {', '.join(_MAX_TOKENS_FIELDS)}, not {given!r}"
            )
        return given
    official = backend == "openai" and urlsplit(base_url).hostname == "api.openai.com"
    return "max_completion_tokens" if official else "max_tokens"


class OpenAIProvider(JSONProvider):
    """A client for one OpenAI-compatible server.

    Args:
        backend: which defaults to use (``openai``, ``openrouter``, ``vllm``, ``ollama``);
            also the provider's name in traces and records.
        model_name: the model asked for when a call names none (required).
        base_url: the API root, ending in ``/v1`` for most servers (default: the
            backend's).
        api_key: the key, sent to ``base_url`` whatever it is.
        api_key_env: the name of an environment variable holding the key, sent to
            ``base_url`` whatever it is. Without either, the backend's own variable is
            sent only to the official host (or a base URL from the environment).
        prompt_cache_key: send a completion's ``prompt_cache_key`` with its turns (OpenAI
            routes requests with one key to the same cache); default: for ``openai``
            only, since other servers may refuse a field they do not know. A string is
            the key itself, sent with every root turn (one cache for all completions,
            say one per tenant); ``extra_body={"prompt_cache_key": ...}`` is sent as
            given too.
        max_tokens_field: the body field a call's ``max_tokens`` goes in:
            ``max_completion_tokens`` for OpenAI's own host (its reasoning models refuse
            ``max_tokens``), ``max_tokens`` for any other server (the default).
        **kwargs: everything `JSONProvider` takes (``max_concurrent``, ``timeout``,
            ``max_attempts``, ``requests_per_minute``, ``extra_body``, ``stream``...).
    """

    path = "/chat/completions"

    def __init__(
        self,
        *,
        backend: str = "openai",
        model_name: str = "",
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        prompt_cache_key: bool | str | None = None,
        max_tokens_field: str | None = None,
        **kwargs: Any,
    ) -> None:
        policy = BACKENDS.get(backend)
        if policy is None:
            raise ConfigError(
                f"unknown OpenAI-compatible backend {backend!r}; use one of {sorted(BACKENDS)}"
            )
        self.name = backend
        resolved = resolve_key(policy, api_key=api_key, api_key_env=api_key_env, base_url=base_url)
        super().__init__(
            model_name=model_name,
            base_url=resolved.base_url,
            api_key=resolved.key,
            **kwargs,
        )
        self.key_rule = resolved.rule
        self.key_variables = resolved.variables
        if (
            not isinstance(prompt_cache_key, bool | str | None)
            or isinstance(prompt_cache_key, str)
            and prompt_cache_key.strip().lower() in ("", "true", "false", "yes", "no", "0", "1")
        ):
            raise ConfigError(
                f"{backend}: prompt_cache_key must be True, False or the key to send (text "
                f"that is not a yes or a no), not {prompt_cache_key!r}"
            )
        self.prompt_cache_key = (
            backend == "openai" if prompt_cache_key is None else prompt_cache_key
        )
        self.max_tokens_field = _max_tokens_field(backend, resolved.base_url, max_tokens_field)

    def _build_body(self, request: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": [{"role": m.role, "content": _content(m)} for m in request.messages],
        }
        sampling = {
            "temperature": request.temperature,
            "top_p": request.top_p,
            self.max_tokens_field: request.max_tokens,
            "seed": request.seed,
            "stop": list(request.stop) if request.stop else None,
        }
        body.update({k: v for k, v in sampling.items() if v is not None})
        if request.response_schema is not None:
            # Not "strict": strict mode refuses schemas without additionalProperties=false
            # on every object, which most pydantic models lack; the engine validates anyway.
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.response_schema.name,
                    "schema": request.response_schema.json_schema,
                },
            }
        if self._sends_cache_key(request):  # not over one the user gave, as given
            key = self.prompt_cache_key
            body["prompt_cache_key"] = key if isinstance(key, str) else request.cache_key
        body.update(request.extra)
        return body

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return await self._asked(request, functools.partial(super().complete, request))

    async def stream(self, request: ChatRequest, sink: TextSink) -> ChatResponse:
        send = functools.partial(super().stream, request, sink)
        if not (self.streams and self._stream_fields(request) is not None):
            return await send()  # answered whole: by complete(), which asks again itself
        return await self._asked(request, send)

    async def _asked(
        self, request: ChatRequest, send: Callable[[], Awaitable[ChatResponse]]
    ) -> ChatResponse:
        """``send()``, and once more without the cache key if the server refused it."""
        sent = self._sends_cache_key(request)
        try:
            return await send()
        except ProviderError as exc:
            if not (sent and self._cache_key_refused(exc)):
                raise
        return await send()

    def _sends_cache_key(self, request: ChatRequest) -> bool:
        """Whether this provider puts its own ``prompt_cache_key`` in ``request``'s body
        (not one the user put in ``extra_body`` or the call's ``extra``)."""
        return (
            request.cache_key is not None
            and bool(self.prompt_cache_key)
            and "prompt_cache_key" not in self.extra_body
            and "prompt_cache_key" not in request.extra
        )

    def _cache_key_refused(self, exc: ProviderError) -> bool:
        """Whether the server refused the ``prompt_cache_key`` field this provider sent
        (a 400 naming it, as a server that refuses fields it does not know answers):
        then it is sent no more by this provider, said once, and the call is asked again
        without it."""
        if exc.status_code != 400 or "prompt_cache_key" not in str(exc):
            return False
        if self.prompt_cache_key:  # calls refused together: said by the first
            self.prompt_cache_key = False
            logger.warning(
                "%s refused the prompt_cache_key field; its calls go without it from now "
                "on (backend_kwargs={'prompt_cache_key': False} says so from the start)",
                without_url_passwords(self.url),
            )
        return True

    def _stream_fields(self, request: ChatRequest) -> dict[str, Any] | None:
        if request.response_schema is not None:
            return None  # a typed call is read whole
        return {"stream": True, "stream_options": {"include_usage": True}}

    def _stream_parser(self, request: ChatRequest) -> StreamParser:
        return _ChunkStream(self.name, self.url, request)

    def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            said = self._quote(self._server_message(data) or answer_head())
            raise BadResponse(
                f"{self.name}: {self.url} answered without choices[0].message ({said}); "
                "check that base_url is an OpenAI-compatible API root",
                provider=self.name,
            ) from None
        if not isinstance(message, Mapping):
            raise BadResponse(
                f"{self.name}: {self.url} answered with choices[0].message of type "
                f"{type(message).__name__}, not an object; check that base_url is an "
                "OpenAI-compatible API root",
                provider=self.name,
            )
        content = content_text(message.get("content")) or ""
        reason = reason_text(choice.get("finish_reason"))
        refusal = message.get("refusal")
        if refusal and type(refusal) is str:  # the model's refusal: its only text
            content, reason = content or refusal, "refusal"
        return ChatResponse(
            content=content,
            model=str(data.get("model") or request.model),
            usage=_usage(data.get("usage")),
            cost=_cost(data.get("usage")),
            finish_reason=reason,
        )


_AT_WORK = (
    "reasoning_content", "reasoning", "reasoning_details", "thinking", "tool_calls",
    "function_call",
)  # fmt: skip
"""A delta's fields that show the model at work without text (vLLM's, DeepSeek's,
OpenRouter's and others' reasoning; tool calls): progress, not a keep-alive. A delta
whose ``content`` is a list of parts (Mistral's ``{"type": "thinking", ...}``) is one
too, text or not."""


class _ChunkStream:
    """One attempt's ``chat.completion.chunk`` events: ``choices[0].delta.content`` is
    the text, the last chunk before ``data: [DONE]`` carries the usage (asked for with
    ``stream_options.include_usage``; a server that sends none is estimated).

    ``progress`` counts the events that show the model at work: text, a delta of
    reasoning or of a tool call, the usage, a finish reason. An empty event, a chunk of
    no choices and no usage, an empty delta (or one of the role alone) are what gateways
    send to keep the connection alive: not progress (`rlm_graph.http.StreamParser`).
    ``whole`` once a finish reason has come with no text after it: the usage chunk and
    ``[DONE]`` that follow it are waited for a moment, not for ever."""

    __slots__ = (
        "_cost",
        "finished",
        "_finish",
        "_model",
        "_name",
        "_parts",
        "progress",
        "_refused",
        "_url",
        "_usage",
        "whole",
    )

    def __init__(self, name: str, url: str, request: ChatRequest) -> None:
        self._name, self._url = name, url
        self._parts: list[str] = []
        self._model = request.model
        self._usage: Usage = Usage()
        self._cost: float | None = None
        self._finish: str | None = None
        self._refused = False
        self.finished = False
        self.progress = 0
        self.whole = False

    def _bad(self, what: str) -> BadResponse:
        return BadResponse(f"{self._name}: {self._url} {what}", provider=self._name, retryable=True)

    def feed(self, event: str, data: str) -> str:
        if data == "[DONE]" or data.strip() == "[DONE]":
            # Whole even with no finish_reason: some compatible servers never send one
            # (an error reported before it is an error event, above).
            self.finished = True
            return ""
        if not data or data.isspace():  # an event with no data: nothing to read, no fault
            return ""
        chunk = event_object(data)
        if event == "error":  # `event: error` (a gateway) or `error:` (llama.cpp)
            raise event_error(self._name, self._url, (chunk or {}).get("error") or chunk or data)
        if chunk is None:
            raise self._bad(f"streamed an event that is not a JSON object ({data[:80]!r})")
        if chunk.get("error"):
            raise event_error(self._name, self._url, chunk["error"])
        usage = chunk.get("usage")
        if usage and type(usage) is dict:
            self._usage, self._cost = _usage(usage), _cost(usage)
            self.progress += 1
        model = chunk.get("model")
        if model:
            self._model = model if type(model) is str else str(model)
        choices = chunk.get("choices")
        if not choices or type(choices) is not list or type(choices[0]) is not dict:
            return ""
        return self._choice(choices[0])

    def _choice(self, choice: dict[str, Any]) -> str:
        """The text a chunk's first choice adds (its finish reason, reasoning and tool
        calls counted as progress)."""
        delta = choice.get("delta")
        text = self._delta_text(delta) if type(delta) is dict else ""
        if text:
            self._parts.append(text)
            self.whole = False  # a server that names a finish reason before the end
        if choice.get("finish_reason"):
            self._finish = reason_text(choice["finish_reason"])
            self.progress += 1
            self.whole = True
        return text

    def _delta_text(self, delta: dict[str, Any]) -> str:
        """A delta's text (its refusal's too); reasoning and tool calls counted as
        progress."""
        text = delta.get("content")
        if type(text) is not str:
            text = content_text(text)
        refusal = delta.get("refusal")
        if refusal and type(refusal) is str:  # a refusal streams as text of its own
            self._refused = True
            text = (text or "") + refusal
        if not text and (
            any(delta.get(field) for field in _AT_WORK) or type(delta.get("content")) is list
        ):
            self.progress += 1
        return text or ""

    def partial(self) -> ChatResponse:
        # The usage comes in the last chunk: a stopped reply's is estimated by the engine.
        text, model = "".join(self._parts), self._model
        return ChatResponse(content=text, model=model, finish_reason="engine_stop")

    def result(self) -> ChatResponse:
        if not self.finished and self._finish is None:
            raise self._bad("ended the stream before its last chunk (no finish_reason, no [DONE])")
        return ChatResponse(
            content="".join(self._parts),
            model=self._model,
            usage=self._usage,
            cost=self._cost,
            finish_reason="refusal" if self._refused else self._finish,
        )


def _content(message: Message) -> str | list[dict[str, Any]]:
    """A message's content: its text, or its parts with images as data-URI
    ``image_url`` parts (the chat completions format for images)."""
    if not message.parts:
        return message.content
    return [
        {"type": "text", "text": part}
        if isinstance(part, str)
        else {
            "type": "image_url",
            "image_url": {"url": f"data:{part.media_type};base64,{part.base64()}"},
        }
        for part in message.parts
    ]


def _usage(raw: Any) -> Usage:
    if not _is_mapping(raw):
        return Usage()
    prompt = raw.get("prompt_tokens_details") or {}
    completion = raw.get("completion_tokens_details") or {}
    if not _is_mapping(prompt):
        prompt = {}
    if not _is_mapping(completion):
        completion = {}
    return Usage(
        input_tokens=token_count(raw.get("prompt_tokens")),
        output_tokens=token_count(raw.get("completion_tokens")),
        cached_tokens=token_count(prompt.get("cached_tokens")),
        reasoning_tokens=token_count(completion.get("reasoning_tokens")),
    )


def _cost(raw: Any) -> float | None:
    """The USD cost the server reported (OpenRouter's ``usage.cost``), if any."""
    if not _is_mapping(raw):
        return None
    cost = raw.get("cost")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        try:
            value = float(cost)
        except OverflowError:  # an integer past a float's range: no cost at all
            return None
        # A negative, NaN or infinite cost is no price: the engine prices the call itself
        # (taken as it was, it would switch max_budget off).
        return value if 0 <= value < math.inf else None
    return None


def _is_mapping(value: Any) -> bool:
    """A JSON object (parsed JSON is a dict: the ABC check only for anything else)."""
    return type(value) is dict or isinstance(value, Mapping)


def factory(backend: str) -> Any:
    """The factory registered under ``backend``: ``factory(**backend_kwargs)``."""

    def make(**kwargs: Any) -> OpenAIProvider:
        if "backend" in kwargs:
            raise ConfigError(
                f"{backend}: 'backend' is not a backend_kwargs key; pick the backend by name"
            )
        return OpenAIProvider(backend=backend, **kwargs)

    make.__name__ = f"{backend}_provider"
    make.__qualname__ = make.__name__
    return make
