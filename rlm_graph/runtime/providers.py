"""Model calls: which provider serves a model, and the one path every call takes.

Every model call of a run (root turn, sub-call, compaction, workflow node) goes through
`call_model`: route to a provider, wait for the provider's rate buckets, take a slot of
the provider's shared capacity limiter, call, price, and charge the tree-wide budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..contracts import (
    ChatRequest,
    ChatResponse,
    Message,
    ModelInfo,
    Provider,
    ResponseSchema,
    Usage,
    estimate_tokens,
)
from ..errors import ConfigError
from ..graph import NodeRecord, preview
from ..limits import Reservation, Tally, resolve_model_info
from .attempts import CallAttempts

if TYPE_CHECKING:
    from .context import Run

__all__ = ["ProviderRouter", "call_model", "estimate_tokens", "estimated_usage", "reply_note"]

# finish_reason values that mean "cut off by the output-token limit" (OpenAI, Anthropic).
_CUT_OFF = frozenset({"length", "max_tokens"})


def reply_note(response: ChatResponse) -> str | None:
    """What the model (and the node) should be told about a reply that is not whole.

    A reply cut off by the output-token limit, or one with no text at all (OpenAI's
    ``content: null``), is still a reply; passing it on as if it were complete (or as a
    silent ``""``) hides the problem from the model's code and from the user.
    """
    reason = response.finish_reason
    if reason in _CUT_OFF:
        return (
            f"the reply was cut off by the output-token limit (finish_reason={reason}); "
            "ask for less, or raise max_tokens"
        )
    if not response.content:
        return f"the model returned no text (finish_reason={reason or 'none'})"
    return None


def estimated_usage(messages: Sequence[Message], reply: str) -> Usage:
    """The usage of a call whose server reported none (or only zeros): `estimate_tokens`
    of what was sent and of the reply, marked ``estimated`` so the user can tell."""
    return Usage(
        input_tokens=sum(estimate_tokens(m.content) for m in messages),
        output_tokens=estimate_tokens(reply),
        estimated=True,
    )


async def _send(
    run: Run, key: str, provider: Provider, request: ChatRequest, record: NodeRecord
) -> tuple[ChatResponse, Usage]:
    """Wait for the provider's rate buckets and a slot, call it; the response and its
    usage (estimated when the server reported none)."""
    rate = run.limiters.rate(
        key,
        getattr(provider, "requests_per_minute", None),
        getattr(provider, "tokens_per_minute", None),
    )
    estimate = 0
    if rate is not None:
        estimate = sum(estimate_tokens(m.content) for m in request.messages)
        await rate.acquire(estimate)
    async with (
        run.limiters.provider(key, provider.max_concurrent),
        run.limiters.gate(key, provider.max_concurrent),
    ):
        record.start = trio.current_time()
        record.wall_start = time.time()
        attempts = CallAttempts(run.retries, provider.name)
        try:
            # The node's span is current: the request carries its traceparent.
            with attempts, run.tracer.activate(record.id):
                response = await provider.complete(request)
        finally:
            record.attempts = attempts.attempts
    usage = response.usage
    if usage.total_tokens == 0:
        usage = estimated_usage(request.messages, response.content)
    if rate is not None:
        rate.settle(estimate, usage.total_tokens)
    return response, usage


DEFAULT_OUTPUT_ESTIMATE = 1024
"""Output tokens reserved for a call that sets no ``max_tokens`` (and whose provider
names no ``default_max_tokens``)."""


async def _reserve(
    run: Run, provider: Provider, model: str, messages: Sequence[Message], request: ChatRequest
) -> Reservation | None:
    """Wait until the call's estimate fits the run's token and dollar limits; hold it.

    The estimate: the prompt at four characters per token, plus the request's
    ``max_tokens`` (else the provider's ``default_max_tokens``, else
    `DEFAULT_OUTPUT_ESTIMATE`) of output, priced from the table (else at the largest
    cost a call of this run has had).
    """
    if not run.budget.limited:
        return None
    output = request.max_tokens or getattr(provider, "default_max_tokens", None) or DEFAULT_OUTPUT_ESTIMATE
    guess = Usage(
        input_tokens=sum(estimate_tokens(m.content) for m in messages), output_tokens=int(output)
    )
    cost = run.router.price(model, guess)
    return await run.spend.reserve(guess.total_tokens, run.spend.largest_cost if cost is None else cost)


class ProviderRouter:
    """Maps a request's model (or its depth) to a configured provider.

    Rules, in order:
        1. A model named in the call (``llm_query(p, model="m")``) goes to the provider
           configured with that model name.
        2. Otherwise the root (depth 0) uses the main backend, and sub-calls (depth >= 1)
           use the first of ``other_backends`` when there is one, as in the reference.
        3. A named model no backend was configured with goes to the main backend under
           that name (OpenAI-compatible servers serve many models). Model code may name
           only ``allowed`` models (`check_allowed`): the backends' and ``allowed_models``.

    Prices come from the model table, a dated id (``gpt-5-mini-2025-08-07``) or a
    ``vendor/model`` id priced as its base model (`rlm_graph.limits.resolve_model_info`).
    """

    def __init__(
        self,
        providers: Sequence[tuple[str, Provider]],
        models: Mapping[str, ModelInfo] | None = None,
        allowed_models: Sequence[str] = (),
    ) -> None:
        if not providers:
            raise ConfigError("at least one backend is needed")
        self.providers = list(providers)
        self.models = dict(models or {})
        self._by_model: dict[str, tuple[str, Provider]] = {}
        for key, provider in reversed(self.providers):
            self._by_model[provider.model] = (key, provider)
        self.allowed: tuple[str, ...] = tuple(
            dict.fromkeys([p.model for _, p in self.providers] + list(allowed_models))
        )
        self._allowed = frozenset(self.allowed)
        self._info: dict[str, ModelInfo | None] = {}

    def route(self, model: str | None, depth: int) -> tuple[str, Provider, str]:
        """(limiter key, provider, model name) for a call."""
        if model:
            found = self._by_model.get(model)
            if found is not None:
                return found[0], found[1], model
            key, provider = self.providers[0]
            return key, provider, model
        key, provider = self.providers[1] if depth >= 1 and len(self.providers) > 1 else self.providers[0]
        return key, provider, provider.model

    def check_allowed(self, model: str | None, caller: str = "llm_query") -> None:
        """Refuse a model name that no backend and no ``allowed_models`` entry names.

        Raises:
            ConfigError: naming the model, the allowed ones and the keyword to add it.
        """
        if model is None or model in self._allowed:
            return
        raise ConfigError(
            f"{caller}(..., model={model!r}): that model is not configured; allowed: "
            f"{', '.join(map(repr, self.allowed))}. To allow it, add it to "
            "allowed_models=[...] (or configure a backend with it)"
        )

    def info(self, model: str) -> ModelInfo | None:
        """What the model table knows of ``model`` (dated and vendor/ ids resolved)."""
        try:
            return self._info[model]
        except KeyError:
            found = self._info[model] = resolve_model_info(self.models, model)
            return found

    def price(self, model: str, usage: Usage) -> float | None:
        info = self.info(model)
        return info.price(usage) if info is not None else None

    def can_price(self, model: str, provider: Provider) -> bool:
        """Calls of ``model`` through ``provider`` get a cost: the table prices the model,
        or the provider reports costs itself (``reports_cost = True``)."""
        info = self.info(model)
        priced = info is not None and (
            info.input_usd_per_mtok is not None or info.output_usd_per_mtok is not None
        )
        return priced or bool(getattr(provider, "reports_cost", False))

    def unpriced(self) -> list[tuple[str, str]]:
        """(model, provider name) of every allowed model whose calls would cost nothing."""
        missing = []
        for model in self.allowed:
            _, provider, _ = self.route(model, 0)
            if not self.can_price(model, provider):
                missing.append((model, provider.name))
        return missing

    async def aclose(self) -> None:
        for _, provider in self.providers:
            await provider.aclose()


async def call_model(
    run: Run,
    record: NodeRecord,
    messages: Sequence[Message],
    *,
    model: str | None = None,
    params: Mapping[str, Any] | None = None,
    tally: Tally | None = None,
    response_schema: ResponseSchema | None = None,
) -> ChatResponse:
    """Make one model call as the node ``record`` (call inside `Run.execute`).

    Fills the record's model, provider, usage, cost, attempts and previews, adds the
    usage to ``tally`` (the calling completion's, which passes it up to its parents) and
    charges the run's budget; a passed token or dollar limit stops the whole tree. A
    reply cut off by the token limit or without text comes back with a note appended
    (``[rlm-graph: ...]``, see `reply_note`), also kept on ``record.note``. A server that
    reports no usage is counted at about four characters per token, marked estimated.
    """
    key, provider, model_name = run.router.route(model, record.depth)
    record.model = model_name
    record.provider = provider.name
    if run.limits.max_budget is not None and not run.router.can_price(model_name, provider):
        # The configuration check covers every configured model; this catches a name a
        # workflow gave, before it costs money the budget cannot see.
        raise ConfigError(
            f"max_budget is set but model {model_name!r} has no price; add it to "
            f"models={{{model_name!r}: {{'input_usd_per_mtok': ..., 'output_usd_per_mtok': ...}}}}"
        )
    if not record.input_preview and messages:
        record.input_preview = preview(messages[-1].content)
    request = ChatRequest(
        messages=tuple(messages),
        model=model_name,
        depth=record.depth,
        node_id=record.id,
        response_schema=response_schema,
        **dict(params or {}),
    )
    journal = run.journal
    if journal is not None:
        settled = request if params or response_schema is not None else None
        call_id, request_key, stored = journal.model_call(record, model_name, messages, settled)
        if stored is not None:
            return _replayed(run, record, stored.value or "", tally)
    reservation = await _reserve(run, provider, model_name, messages, request)
    try:
        response, usage = await _send(run, key, provider, request, record)
    except BaseException:
        if reservation is not None:
            run.spend.release(reservation)
        raise
    cost = response.cost if response.cost is not None else run.router.price(model_name, usage)
    record.usage = usage
    record.response_model = response.model or None
    record.cost = cost
    record.finish_reason = response.finish_reason
    note = reply_note(response)
    if note is not None:
        record.note = note
        text = f"{response.content}\n[rlm-graph: {note}]" if response.content else f"[rlm-graph: {note}]"
        response = response.model_copy(update={"content": text})
    record.output_preview = preview(response.content)
    if tally is not None:
        tally.add(usage, cost)
    if reservation is not None:
        exceeded = run.spend.settle(reservation, usage, cost)
    else:
        exceeded = run.budget.charge(usage, cost)
    if exceeded is not None:
        run.stop(exceeded)
    if journal is not None:
        journal.record(record, request_key, response.content, call_id)
    return response


def _replayed(run: Run, record: NodeRecord, content: str, tally: Tally | None) -> ChatResponse:
    """The journaled reply of a model call, as the provider gave it then; it costs
    nothing now, so the tree's budget is not charged (its tally still counts it, so a
    child's totals stay whole)."""
    usage = record.usage or Usage()
    if tally is not None:
        tally.add(usage, record.cost)
    return ChatResponse(
        content=content, model=record.response_model or "", usage=usage,
        cost=record.cost, finish_reason=record.finish_reason,
    )
