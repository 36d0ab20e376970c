"""The public toolkit for HTTP provider plugins.

A provider for a new JSON API subclasses `JSONProvider` and implements three methods;
everything else (one pooled client per trio loop, retries with backoff and
``Retry-After``, timeouts, error messages that say what to do, keys kept out of logs) is
inherited::

    from rlm_graph.http import BadResponse, ChatRequest, ChatResponse, JSONProvider, Usage

    class EchoProvider(JSONProvider):
        name = "echo"
        path = "/v1/echo"

        def _build_body(self, request: ChatRequest) -> dict[str, object]:
            return {"model": request.model or self.model, "text": request.messages[-1].content}

        def _parse(self, data: object, request: ChatRequest) -> ChatResponse:
            ...

See docs/writing-a-provider.md. This module is the stable surface: plugins (ours under
``plugins/`` and third parties') import from here, from `rlm_graph.contracts`,
`rlm_graph.errors`, `rlm_graph.hooks` and `rlm_graph.testing`, never from
``rlm_graph.runtime`` (private; tests/test_structure.py enforces it for ours).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ._http.answers import answer_head as answer_head
from ._http.attempts import (
    note_rate_headers as note_rate_headers,
    note_retry as note_retry,
    wait_before_retry as wait_before_retry,
)
from ._http.bodies import MAX_JSON_CONTAINERS, TooManyContainers, too_many_containers
from ._http.keys import (
    KeyPolicy as KeyPolicy,
    ResolvedKey as ResolvedKey,
    resolve_key as resolve_key,
)
from ._http.provider import (
    JSONProvider as JSONProvider,
    RetryPolicy as RetryPolicy,
    Secret as Secret,
    parse_duration as parse_duration,
    parse_retry_after as parse_retry_after,
    retry_delay_from_headers as retry_delay_from_headers,
)
from ._http.streaming import StreamParser as StreamParser
from .contracts import (
    MAX_TOKEN_COUNT as MAX_TOKEN_COUNT,
    ChatRequest as ChatRequest,
    ChatResponse as ChatResponse,
    Message as Message,
    ModelInfo as ModelInfo,
    Usage as Usage,
    estimate_tokens as estimate_tokens,
)
from .errors import (
    BadResponse as BadResponse,
    ConfigError as ConfigError,
    ContextLengthExceeded as ContextLengthExceeded,
    ProviderAuthError as ProviderAuthError,
    ProviderError as ProviderError,
    ProviderNotFound as ProviderNotFound,
    ProviderTimeout as ProviderTimeout,
    RateLimited as RateLimited,
    is_context_length_error as is_context_length_error,
)

__all__ = [
    "answer_head",
    "BadResponse",
    "ChatRequest",
    "ChatResponse",
    "ConfigError",
    "ContextLengthExceeded",
    "JSONProvider",
    "KeyPolicy",
    "Message",
    "ModelInfo",
    "ProviderAuthError",
    "ProviderError",
    "ProviderNotFound",
    "ProviderTimeout",
    "RateLimited",
    "ResolvedKey",
    "RetryPolicy",
    "Secret",
    "StreamParser",
    "Usage",
    "content_text",
    "estimate_tokens",
    "event_error",
    "event_object",
    "is_context_length_error",
    "note_rate_headers",
    "note_retry",
    "parse_duration",
    "parse_retry_after",
    "reason_text",
    "resolve_key",
    "retry_delay_from_headers",
    "token_count",
    "wait_before_retry",
]


_DECODE = json.JSONDecoder().raw_decode


def event_object(data: str) -> dict[str, Any] | None:
    """A streamed event's ``data`` as the JSON object an API's events are, else None.

    For a `StreamParser`'s ``feed``, called once per token of a streamed reply: it is
    ``json.loads`` less the work a ``feed`` does not need (about a third of its CPU on
    an event of a few hundred bytes).

    Args:
        data: the event's ``data`` field.

    Returns:
        The object; None when ``data`` is not JSON, or is JSON but not an object.

    Raises:
        Exception: the engine's own (``feed`` lets it go by), when ``data`` holds more
            JSON objects and arrays than the engine parses in one document (a million; a
            reply's are tens): the call fails with a `BadResponse`, not retried.
    """
    if count := too_many_containers(data):
        raise TooManyContainers(
            f"an event of JSON with {count:,} braces and brackets, past the "
            f"{MAX_JSON_CONTAINERS:,} objects and arrays the engine parses"
        )
    if data[:1].isspace():  # raw_decode takes no leading space; json.loads does
        data = data.lstrip()
    try:
        value, end = _DECODE(data)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        return None
    if end != len(data) and not data[end:].isspace():
        return None
    return value if type(value) is dict else None


def event_error(provider: str, url: str, error: object) -> ProviderError:
    """The error of a stream's error event, for a `StreamParser`'s ``feed`` to raise.

    Args:
        provider: the provider's name.
        url: the URL the stream came from.
        error: what the event says of the failure: its ``error`` object, the event's own
            object (a gateway's ``event: error``), or its text.

    Returns:
        `ContextLengthExceeded` when the text says the request passed the model's window
        (not retried); else a retried `BadResponse` (the attempt failed mid-stream).
    """
    said = error.get("message") or error if isinstance(error, dict) else error
    text = str(said)[:4096]
    if is_context_length_error(text):
        return ContextLengthExceeded(
            f"{provider}: {url} failed mid-stream: {text[:300]}. The request does not fit "
            "the model's context window: turn on compaction, ask for fewer output tokens, "
            "or give the server a larger window",
            provider=provider,
            server_message=text[:300],
        )
    return BadResponse(
        f"{provider}: {url} failed mid-stream: {text[:300]}", provider=provider, retryable=True
    )


def token_count(value: object) -> int:
    """A usage field read as a token count, whatever the server put there.

    Servers put ``null``, floats, numeric strings and, now and then, text (``"n/a"``) in
    usage fields; a count the engine cannot read is unknown, which it treats as 0 rather
    than failing an answer that is otherwise fine.

    Args:
        value: the field's JSON value.

    Returns:
        The count (ints, whole floats, numeric strings), else 0; a count past
        `MAX_TOKEN_COUNT`, which no call has, is unknown too (priced, it would overflow).
    """
    if type(value) is int:  # what servers send: one check
        return value if 0 < value <= MAX_TOKEN_COUNT else 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return token_count(int(value))
    if isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
        return token_count(int(value))
    if isinstance(value, str):
        try:
            return token_count(float(value.strip()))
        except ValueError:
            return 0
    return 0


def reason_text(value: object) -> str | None:
    """A reply's finish (stop) reason as text, whatever the server put there.

    Servers send a string or ``null``, and now and then something else (a number, a
    list); the engine reads only the strings that mean a reply was cut off (``"length"``,
    ``"max_tokens"``), so anything else is kept as its text rather than failing a reply
    that is otherwise fine (as `token_count` does for usage).

    Args:
        value: the field's JSON value.

    Returns:
        None for a missing or empty value, else the value as a string.
    """
    if not value:
        return None
    return value if isinstance(value, str) else str(value)


def content_text(content: object) -> str | None:
    """A message's ``content`` as text.

    OpenAI-compatible servers send a string, ``null``, or (some gateways, reasoning
    models) a list of parts: ``[{"type": "text", "text": "..."}, ...]``. Text parts are
    joined in order; other parts (images, tool calls, reasoning) are left out.

    Args:
        content: the ``content`` field as parsed from JSON.

    Returns:
        The text, or ``None`` when there is no content at all.
    """
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") in ("text", "output_text"):
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
                elif isinstance(text, Mapping) and isinstance(text.get("value"), str):
                    texts.append(text["value"])
        return "".join(texts)
    return str(content)
