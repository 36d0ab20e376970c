"""A provider that answers from a script, deterministically, with simulated latency.

Three ways to say what it answers (checked in this order):
    - ``rules``: ``[(pattern, response), ...]``: the first regex that matches the request's
      last user message (or, with ``match="all"``, the whole conversation) picks the
      response;
    - ``responses``: a list consumed in order, one per call;
    - ``respond``: a function of the request (sync or async).
A response is a string, a `ChatResponse`, an exception instance (raised: a failing
call), or a function of the request (and, for rules, the match) returning one of those.

Latency is ``trio.sleep``, so trio's ``MockClock`` makes a test of a slow run instant.
With ``stream_chunk`` set it can also stream (`ScriptedProvider.stream`): the reply's text
in pieces of that many characters, ``stream_delay`` seconds apart, after the latency.
The provider records every request, the number in flight, and the peak.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from rlm_graph.contracts import ChatRequest, ChatResponse, TextSink, Usage
from rlm_graph.errors import ConfigError, ProviderError

__all__ = ["Rule", "ScriptExhausted", "ScriptedProvider"]

Reply = str | ChatResponse | BaseException | Callable[..., Any]
Rule = tuple[str | re.Pattern[str], Reply]


class ScriptExhausted(ProviderError):
    """Every scripted response has been used and nothing else matches."""


@functools.lru_cache(maxsize=256)
def _arity(fn: Callable[..., Any]) -> int:
    return len(inspect.signature(fn).parameters)


def _tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


class ScriptedProvider:
    """A deterministic `Provider`.

    Args:
        model_name: the model name it answers as (default ``"scripted"``).
        responses: answers consumed one per call, in order.
        rules: ``(regex, reply)`` pairs; the first match wins.
        respond: ``respond(request) -> reply`` for anything rules and responses leave.
        latency: seconds per call (a number or a function of the request), slept with
            ``trio.sleep``.
        max_concurrent: the provider's concurrency limit (the engine's shared limiter).
        match: ``"last"`` (the last user message, default) or ``"all"`` (every message).
        cost_per_call: a server-reported cost to attach to every answer, in USD.
        requests_per_minute, tokens_per_minute: rate limits the engine applies.
        stream_chunk: stream replies (root turns) in pieces of this many characters
            (0: do not stream).
        stream_delay: seconds between two pieces of a streamed reply.
    """

    name = "scripted"

    def __init__(
        self,
        *,
        model_name: str = "scripted",
        responses: Sequence[Reply] | None = None,
        rules: Sequence[Rule] | None = None,
        respond: Callable[[ChatRequest], Any] | None = None,
        latency: float | Callable[[ChatRequest], float] = 0.0,
        max_concurrent: int = 16,
        match: str = "last",
        cost_per_call: float | None = None,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        stream_chunk: int = 0,
        stream_delay: float = 0.0,
    ) -> None:
        if match not in ("last", "all"):
            raise ConfigError(f"scripted: match must be 'last' or 'all', not {match!r}")
        _check_number("max_concurrent", max_concurrent, whole=True, least=1)
        if not callable(latency):
            _check_number("latency", latency)
        _check_number("stream_chunk", stream_chunk, whole=True)
        _check_number("stream_delay", stream_delay)
        if cost_per_call is not None:
            _check_number("cost_per_call", cost_per_call)
        self.model = model_name
        self.max_concurrent = max_concurrent
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self._responses = list(responses or [])
        self._rules = self._compile(rules)
        self._respond = respond
        self._latency = latency
        self._match = match
        self._cost = cost_per_call
        # A cost on every answer: max_budget needs no price table for this provider.
        self.reports_cost = cost_per_call is not None
        self.streams = stream_chunk > 0
        self._chunk = stream_chunk
        self._delay = stream_delay
        self.requests: list[ChatRequest] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.closed = False

    @staticmethod
    def _compile(rules: Sequence[Rule] | None) -> list[tuple[re.Pattern[str], Reply]]:
        if rules is None:
            return []
        if isinstance(rules, str | bytes) or not isinstance(rules, Sequence):
            raise ConfigError(
                "scripted: rules must be a list of (pattern, reply) pairs, "
                f"not {type(rules).__name__}"
            )
        compiled = []
        for index, rule in enumerate(rules):
            if not isinstance(rule, tuple | list) or len(rule) != 2:
                raise ConfigError(f"scripted: rule {index} must be a (pattern, reply) pair")
            pattern, reply = rule
            try:
                compiled.append(
                    (re.compile(pattern) if isinstance(pattern, str) else pattern, reply)
                )
            except re.error as exc:
                raise ConfigError(
                    f"scripted: rule {index} has a bad regex {pattern!r}: {exc}"
                ) from None
        return compiled

    def __repr__(self) -> str:
        return f"ScriptedProvider(model_name={self.model!r}, calls={len(self.requests)})"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            latency = self._latency(request) if callable(self._latency) else self._latency
            if latency:
                await trio.sleep(latency)
            reply = await self._reply(request)
        finally:
            self.in_flight -= 1
        return self._as_response(reply, request)

    async def stream(self, request: ChatRequest, sink: TextSink) -> ChatResponse:
        """`complete`, the reply's text handed to ``sink`` in ``stream_chunk`` pieces (up
        to the piece after which the sink asks to stop)."""
        response = await self.complete(request)
        text, step = response.content, max(1, self._chunk)
        self.in_flight += 1  # still in flight while the reply streams
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            for start in range(0, len(text), step):
                if sink(start, text[start : start + step]):  # the engine wants no more
                    stopped = text[: start + step]
                    return response.model_copy(
                        update={
                            "content": stopped,
                            "usage": self._as_response(stopped, request).usage,
                            "finish_reason": "engine_stop",
                        }
                    )
                if self._delay and start + step < len(text):
                    await trio.sleep(self._delay)
        finally:
            self.in_flight -= 1
        return response

    async def _reply(self, request: ChatRequest) -> Any:
        text = (
            request.prompt
            if self._match == "last"
            else "\n".join(m.content for m in request.messages)
        )
        for pattern, reply in self._rules:
            found = pattern.search(text)
            if found:
                return await self._resolve(reply, request, found)
        if self._responses:
            return await self._resolve(self._responses.pop(0), request, None)
        if self._respond is not None:
            return await self._resolve(self._respond, request, None)
        raise ScriptExhausted(
            f"scripted provider {self.model!r} has no response left for call "
            f"{len(self.requests)} (prompt starts {text[:60]!r}); add responses, rules or respond",
            provider=self.name,
        )

    async def _resolve(self, reply: Any, request: ChatRequest, found: re.Match[str] | None) -> Any:
        if callable(reply) and not isinstance(reply, BaseException):
            reply = reply(request, found) if _arity(reply) >= 2 else reply(request)
            if isinstance(reply, Awaitable):
                reply = await reply
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _as_response(self, reply: Any, request: ChatRequest) -> ChatResponse:
        if isinstance(reply, ChatResponse):
            return reply
        if not isinstance(reply, str):
            raise ProviderError(
                f"scripted reply must be a string or ChatResponse, got {type(reply).__name__}",
                provider=self.name,
            )
        usage = Usage(
            input_tokens=sum(_tokens(m.content) for m in request.messages),
            output_tokens=_tokens(reply),
        )
        return ChatResponse(
            content=reply,
            model=request.model,
            usage=usage,
            cost=self._cost,
            finish_reason="stop",
        )

    async def aclose(self) -> None:
        self.closed = True


def _check_number(name: str, value: object, *, whole: bool = False, least: int = 0) -> None:
    """A keyword that must be a finite number (a whole one with ``whole``) >= ``least``
    (from JSON on the command line it may be any shape).

    Raises:
        ConfigError: naming the keyword and what it must be.
    """
    kinds = int if whole else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or not least <= value < math.inf:
        what = "a whole number" if whole else "a number"
        raise ConfigError(f"scripted: {name} must be {what} >= {least}, not {value!r:.40}")
