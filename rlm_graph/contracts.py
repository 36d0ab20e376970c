"""The seam between the engine and its plugins: protocols and the data that crosses them.

Invariants:
    - Everything that crosses a plugin boundary is a frozen pydantic model
      (``extra="forbid"``), so a plugin cannot mutate the engine's records by accident
      and a typo in a field name fails loudly.
    - Providers are async (they do I/O); hook implementations that *return* providers
      are sync and cheap.
    - Nothing here imports trio, httpx or opentelemetry.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    field_validator,
    model_serializer,
)

from .errors import PluginError
from .images import (
    MAX_IMAGE_BYTES,
    Image,
    image_json_default,
    image_json_hook,
    image_media_type,
)

__all__ = [
    "MAX_IMAGE_BYTES",
    "MAX_TOKEN_COUNT",
    "ChatRequest",
    "ChatResponse",
    "CompactionContext",
    "CompactionStrategy",
    "Environment",
    "EnvironmentFactory",
    "ExecResult",
    "Image",
    "Message",
    "ModelInfo",
    "Provider",
    "ProviderCapabilities",
    "ProviderFactory",
    "SubcallFunction",
    "SubcallRequest",
    "WirePrompt",
    "RateGate",
    "SharedLimiter",
    "ResponseSchema",
    "StreamingProvider",
    "SubcallBridge",
    "TextSink",
    "Usage",
    "compacted_history",
    "strategy_name",
    "estimate_tokens",
    "lacking",
    "image_json_default",
    "image_json_hook",
    "image_media_type",
    "messages_from_json",
    "messages_json",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")

Role = Literal["system", "user", "assistant"]


def lacking(made: object, methods: tuple[str, ...]) -> str | None:
    """The first of ``methods`` that ``made`` does not have as a callable, if any: what a
    plugin's factory made, checked against its contract before it is used."""
    return next((m for m in methods if not callable(getattr(made, m, None))), None)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four characters per token (documented in
    docs/limits.md); used for rate buckets and compaction where no usage is known yet."""
    return max(1, (len(text) + 3) // 4)


class Message(BaseModel):
    """One chat message.

    ``parts``, when set, is the message in order, text and images; ``content`` is then its
    text with a placeholder per image (`Message.of_parts` builds both), which is what
    previews, estimates and traces use. Providers that take images send ``parts``.
    """

    model_config = _FROZEN

    role: Role
    content: str
    parts: tuple[str | Image, ...] = ()

    @classmethod
    def of_parts(cls, role: Role, parts: Sequence[str | Image]) -> Message:
        """A message of text and images (plain text when there is no image)."""
        if all(isinstance(part, str) for part in parts):
            return cls(role=role, content="\n\n".join(map(str, parts)))
        content = "\n\n".join(str(part) for part in parts)
        return cls(role=role, content=content, parts=tuple(parts))

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A text message dumps as {"role", "content"}, as before images existed (REPL
        # histories and the subprocess wire rely on that shape).
        dumped: dict[str, Any] = handler(self)
        if not self.parts:
            dumped.pop("parts", None)
        return dumped

    @property
    def images(self) -> list[Image]:
        return [part for part in self.parts if isinstance(part, Image)]


MAX_TOKEN_COUNT = 10**12
"""The largest token count a usage field is read as (a trillion: no call's); a journal's
row past it is damaged."""


class Usage(BaseModel):
    """Token usage of one call, or a sum of calls.

    ``input_tokens`` counts every input token, those read from the server's prompt cache
    (``cached_tokens``) and those written to it (``cache_write_tokens``, Anthropic's cache
    creation) included. ``estimated`` is True when the server reported no usage and the
    engine counted about four characters per token instead (for a sum: when any part was).
    """

    model_config = _FROZEN

    # At least 0: a negative count (a server's bogus number passed on) would make the
    # run's totals shrink and ``max_tokens`` never be reached.
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            estimated=self.estimated or other.estimated,
        )


class ResponseSchema(BaseModel):
    """The JSON shape a call's answer must have (``llm_query(prompt, schema=...)``).

    A provider with a structured-output mode sends it (OpenAI-compatible servers:
    ``response_format`` of type ``json_schema``; Anthropic: a forced tool whose input is
    the answer) and returns the JSON as the response's ``content``; a provider without one
    may ignore it. The engine validates the answer either way, and has already asked for
    JSON in the prompt.
    """

    model_config = _FROZEN

    name: str = "answer"
    json_schema: dict[str, Any]


class ChatRequest(BaseModel):
    """What the engine asks a provider for.

    ``extra`` carries provider-specific arguments through untouched (for example
    ``{"reasoning_effort": "low"}``); ``depth`` and ``node_id`` tell a provider where in the
    recursion tree the call comes from (the scripted provider uses them in rules);
    ``response_schema``, when set, is the JSON shape the answer must have. ``cache_key``
    is set on a call whose prefix the next call repeats (the turns of one completion):
    a provider with prompt caching marks that prefix as worth caching (Anthropic's
    ``cache_control``) or sends the key (OpenAI's ``prompt_cache_key``).
    """

    model_config = _FROZEN

    messages: tuple[Message, ...]
    model: str
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    max_tokens: StrictInt | None = Field(default=None, gt=0)  # True is no token count
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = Field(default_factory=dict)
    response_schema: ResponseSchema | None = None
    depth: int = 0
    node_id: str = ""
    cache_key: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        """``stop="END"`` is one stop sequence, as the APIs take it."""
        return (value,) if isinstance(value, str) else value

    @property
    def prompt(self) -> str:
        """The last user message: what a one-shot sub-call asked."""
        for message in reversed(self.messages):
            if message.role == "user":
                return message.content
        return ""

    @property
    def system(self) -> str:
        return "\n\n".join(m.content for m in self.messages if m.role == "system")


class ChatResponse(BaseModel):
    """What a provider answers.

    ``cost`` is the USD cost the server reported, or ``None`` to let the engine price the
    call from its price table (a finite number, at least 0: a negative or NaN cost would
    switch ``max_budget`` off, so a provider that reads one from its server gives None).
    """

    model_config = _FROZEN

    content: str
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    cost: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    finish_reason: str | None = None


class ModelInfo(BaseModel):
    """What the engine knows of a model: its window and its price.

    Prices are USD per million tokens. Input read from the prompt cache is priced at
    ``cached_input_usd_per_mtok`` and input written to it (Anthropic) at
    ``cache_write_usd_per_mtok``; either one unset prices those tokens as plain input.
    Plugins contribute entries through the ``rlm_register_models`` hook; users extend or
    override them with ``models=`` on the engine.
    """

    model_config = _FROZEN

    context_window: int | None = Field(default=None, gt=0)
    input_usd_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    output_usd_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_write_usd_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    def price(self, usage: Usage) -> float | None:
        """What ``usage`` is billed, in USD (None: the model has no price)."""
        if self.input_usd_per_mtok is None and self.output_usd_per_mtok is None:
            return None
        plain_rate = self.input_usd_per_mtok or 0.0
        read = min(usage.cached_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - read)
        read_rate = self.cached_input_usd_per_mtok
        write_rate = self.cache_write_usd_per_mtok
        return (
            (usage.input_tokens - read - written) * plain_rate
            + read * (plain_rate if read_rate is None else read_rate)
            + written * (plain_rate if write_rate is None else write_rate)
            + usage.output_tokens * (self.output_usd_per_mtok or 0.0)
        ) / 1_000_000


@runtime_checkable
class Provider(Protocol):
    """An async client for one model API, created once per engine and shared by every run.

    Attributes:
        name: the provider's name in traces (``gen_ai.provider.name``), e.g. ``"openai"``.
        model: the default model name when a request names none.
        max_concurrent: how many requests may be in flight at once; the engine builds the
            provider's shared ``trio.CapacityLimiter`` from it.

    A provider may also have any attribute of `ProviderCapabilities` (rate limits, a
    default output size, whether it reports costs, its server); each one it lacks takes
    the default given there. The engine reads them once, when it is configured.
    """

    name: str
    model: str
    max_concurrent: int

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Send one request and return the answer; raise a ``ProviderError`` on failure."""
        ...

    async def aclose(self) -> None:
        """Release connections. Called once, when the engine closes."""
        ...


TextSink = Callable[[int, str], "bool | None"]
"""``sink(offset, text)``: the text of a reply from ``offset`` on, as it streams in.
``offset`` is the length of what the sink was given so far, except after a retried
attempt whose text differs from what was given: everything from ``offset`` on is then
replaced by ``text``. True back means the rest is not wanted: the provider may stop the
generation (and reply with what it has). Called on the provider's task; quick; no raise."""


@runtime_checkable
class StreamingProvider(Provider, Protocol):
    """A `Provider` that can stream (it declares ``streams = True``, see
    `ProviderCapabilities`)."""

    async def stream(self, request: ChatRequest, sink: TextSink) -> ChatResponse:
        """Like ``complete``, handing the reply's text to ``sink`` as it arrives; returns
        the same `ChatResponse` ``complete`` would (usage, cost, finish reason), whose
        ``content`` is the text the sink was given. Retries are the provider's, as for
        ``complete``: a retried attempt's text goes to the sink as `TextSink` says."""
        ...


ProviderFactory = Callable[..., Provider]
"""``factory(**backend_kwargs) -> Provider``; raise ``ConfigError`` for bad keywords."""


@dataclass(frozen=True, slots=True)
class ProviderCapabilities:
    """What a provider may say about itself beyond the `Provider` protocol, with defaults.

    A provider declares one by having an attribute of that name (`rlm_graph.http`'s
    `JSONProvider` has them all); the engine reads them once per provider, with
    `ProviderCapabilities.of`, and nowhere else.

    Attributes:
        requests_per_minute: the engine keeps this provider's requests under this rate.
        tokens_per_minute: and its tokens (estimated before, settled after each call).
        default_max_tokens: the output tokens a call asks for when it sets no
            ``max_tokens``; what the budget reserves for such a call (else 1,024).
        reports_cost: the provider puts the cost on each `ChatResponse` (``cost``), so
            its models need no price in the model table for ``max_budget``.
        server_address, server_port: the server, for spans (``server.address``/
            ``server.port``); derived from ``base_url`` when not given.
        base_url: the API's root URL.
        streams: the provider has ``stream(request, sink)`` (`StreamingProvider`) and
            streaming is on; the engine streams root turns through it.
        initial_concurrency: where the provider's adaptive concurrency limit starts; it
            then moves between 1 and ``max_concurrent`` (docs/limits.md). None: a fixed
            limit of ``max_concurrent``.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    default_max_tokens: int | None = None
    reports_cost: bool = False
    server_address: str | None = None
    server_port: int | None = None
    base_url: str | None = None
    streams: bool = False
    initial_concurrency: int | None = None

    @classmethod
    def of(cls, provider: object) -> ProviderCapabilities:
        """The capabilities ``provider`` declares (a missing or ``None`` attribute takes
        the default)."""
        found = {}
        for name in cls.__dataclass_fields__:
            value = getattr(provider, name, None)
            if value is not None:
                found[name] = value
        return cls(**found)


class ExecResult(BaseModel):
    """The outcome of one REPL block, as the model will see it next turn.

    ``final_answer`` is set when the block finished the task (``answer["ready"] = True``,
    ``FINAL(...)`` or ``FINAL_VAR(...)``), as text; ``final_json`` is that value as JSON
    when it was not a str (what a typed completion validates); ``answer_content`` is ``answer["content"]`` as
    the block left it, the best partial answer if the run is stopped. ``error`` is the exception text when the block
    raised; the traceback is already in ``stderr``.
    """

    model_config = _FROZEN

    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    final_answer: str | None = None
    final_json: str | None = None
    answer_content: str = ""
    timed_out: bool = False
    restarted: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


SubcallFunction = Literal["llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched"]
"""The four doors model code has to other models."""

WirePrompt = str | list[Any]
"""A prompt as it crosses to the engine: a str, or a list of parts, each a str or an
image as ``{"media_type": ..., "data": <base64>}`` (JSON, so it crosses a pipe too)."""


class SubcallRequest(BaseModel):
    """One call of model code into the engine: ``llm_query`` and friends, as every
    environment hands it over (the local REPL from its worker thread, a subprocess guest
    over its pipe) to `SubcallBridge.call`, the one place the engine checks what a guest
    sends.

    Attributes:
        fn: which of the four functions.
        prompts: the prompts, one for ``llm_query``/``rlm_query``; an ``rlm_query``
            prompt is text.
        model: the model asked for by name (None: the default for the depth).
        json_schema: with ``llm_query(..., schema=...)``, the answer's JSON Schema.
    """

    model_config = _FROZEN

    fn: SubcallFunction
    prompts: tuple[WirePrompt, ...]
    model: str | None = None
    json_schema: dict[str, Any] | None = None

    @property
    def batched(self) -> bool:
        return self.fn.endswith("_batched")


class SubcallBridge(Protocol):
    """What REPL code reaches through ``llm_query`` and friends: the scheduler's side.

    An environment calls it on the trio side (the local environment re-enters trio from
    its worker thread; the subprocess environment serves its guest's pipe). It returns
    data and never raises for a failed call: a failure is an ``"[ERROR] ..."`` string in
    its slot. With ``json_schema``, an answer is the validated JSON value instead of text
    (a mismatch is an ``"[ERROR] SchemaMismatch: ..."`` string); the REPL side turns it
    back into the user's type.
    """

    async def call(self, request: SubcallRequest) -> Any:
        """The answer of ``request``: one value, or a list in input order for the
        batched functions. Everything a guest supplies (sizes, images, model names,
        schemas) is checked here; a refusal is each slot's ``"[ERROR] ..."``."""
        ...

    async def call_tool(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Run a custom tool that lives in the engine's process (subprocess guests use it)."""
        ...


@runtime_checkable
class Environment(Protocol):
    """A REPL that runs model-written code blocks, one at a time, with state kept between.

    Lifecycle: ``start()`` once, then ``add_context``/``execute``/``add_history`` any number
    of times, then ``aclose()`` (always, also after cancellation).
    """

    async def start(self) -> None: ...

    async def add_context(self, value: Any, index: int) -> None:
        """Make ``value`` visible as ``context_{index}`` (and ``context`` when index is 0)."""
        ...

    async def add_history(self, messages: Sequence[Message], index: int) -> None:
        """Store a finished completion's messages as ``history_{index}``."""
        ...

    async def set_variable(self, name: str, value: Any) -> None: ...

    async def execute(self, code: str) -> ExecResult:
        """Run one block. Code errors are data in the result; only a broken environment
        raises (``EnvironmentCrashed``)."""
        ...

    async def reset_answer(self) -> None:
        """Clear ``answer`` before a new completion in a persistent session."""
        ...

    async def answer_content(self) -> str:
        """The current ``answer["content"]`` (``""`` if unknown): read when a block is cut
        by a limit, for the partial answer. Must answer quickly, even mid-block."""
        ...

    async def aclose(self) -> None: ...


EnvironmentFactory = Callable[..., Environment]
"""``factory(bridge=SubcallBridge, tools=dict, **environment_kwargs) -> Environment``."""


class CompactionContext(Protocol):
    """What a compaction strategy may use: the root model and its window."""

    model: str
    context_window: int

    async def complete(self, messages: Sequence[Message]) -> ChatResponse:
        """Call the root model; the call is recorded on the compaction node."""
        ...


@runtime_checkable
class CompactionStrategy(Protocol):
    """Rewrites a root history that grew too long for the root model's window."""

    name: str

    def should_compact(
        self, messages: Sequence[Message], *, tokens: int, context_window: int, threshold_pct: float
    ) -> bool: ...

    async def compact(
        self, messages: Sequence[Message], ctx: CompactionContext
    ) -> list[Message]: ...


class RateGate(Protocol):
    """A provider's request and token buckets, as `call_model` uses them."""

    async def acquire(self, tokens: int = 0) -> None:
        """Wait until one request of about ``tokens`` tokens may go out, then take it."""

    def settle(self, estimated: int, actual: int) -> None:
        """Correct the token bucket once the real usage of a request is known."""


class SharedLimiter(Protocol):
    """Provider limits that hold for every run that shares this object, whatever its loop.

    An engine holds one (``Engine(limiter=...)``; default `InProcessLimiter`). Every
    model call passes the provider's gate (at most ``capacity`` requests in flight under
    one ``key``) and its rate buckets. A batch executor supplies one shared by all its
    completions: in-process for ``local``, a Ray actor for ``ray``.
    """

    def gate(self, key: str, capacity: int) -> AbstractAsyncContextManager[object]:
        """The concurrency gate of provider ``key``: hold it for the request's duration."""

    def rate(self, key: str, rpm: float | None, tpm: float | None) -> RateGate | None:
        """The rate buckets of provider ``key`` (called only when ``rpm`` or ``tpm`` is set)."""


def messages_json(messages: Sequence[Message]) -> str:
    """A conversation as JSON, images and all (what the journal keeps of a compaction);
    `messages_from_json` reads it back."""
    return json.dumps(
        [m.model_dump() for m in messages], ensure_ascii=False, default=image_json_default
    )


def messages_from_json(text: str) -> list[Message]:
    return [Message.model_validate(m) for m in json.loads(text, object_hook=image_json_hook)]


def strategy_name(strategy: Any) -> str:
    """A compaction strategy's name, as errors about it say it: its ``name``, else its
    class's."""
    return getattr(strategy, "name", None) or type(strategy).__name__


def compacted_history(strategy: Any, got: object) -> list[Message]:
    """A strategy's new history, or a `PluginError` naming the strategy and the fault (not
    an error from deep inside the next turn)."""
    name = strategy_name(strategy)
    if isinstance(got, str | bytes | Mapping) or not isinstance(got, Iterable):
        problem = f"returned {type(got).__name__}, not a list of rlm_graph.contracts.Message"
    else:
        rewritten = list(got)
        wrong = next((m for m in rewritten if not isinstance(m, Message)), None)
        if wrong is not None:
            problem = (
                f"returned a list holding {type(wrong).__name__}; every item must be a Message"
            )
        elif not any(m.role == "user" for m in rewritten):
            problem = "returned a history with no user message; keep at least the task"
        elif rewritten[-1].role != "user":  # the next turn would answer the model itself
            problem = (
                f"returned a history ending with {rewritten[-1].role!r}; end it with a "
                "user message, which the next turn answers"
            )
        else:
            return rewritten
    raise PluginError(f"compaction strategy {name!r}: compact() {problem} (docs/compaction.md)")
