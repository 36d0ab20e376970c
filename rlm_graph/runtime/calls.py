"""Model calls: the one path every call takes, in named stages.

Every model call of a run (root turn, sub-call, compaction, workflow node) is a
`ModelCall` made by its node's body, and goes through `call_model`:

    call_model -> _check_priced -> _reserve -> (rates) -> _request | _race -> _account

route the call and check it can be priced, wait until its estimate fits the run's token
and dollar limits, wait for the provider's rate buckets, then send it: `_request` holds
its place under the provider's concurrency limit (`ProviderSlot`: adaptive, see
`rlm_graph.concurrency`) through its attempts, streamed when the call asks for its text
as it is written and the provider can (the same reply, its text handed on as it
arrives); a hedged sub-call races a duplicate (`_race`, `rlm_graph.hedging`). Then price
the reply, note what was wrong with it, count it in the completion's tally and settle
the budget. Replay is not here: a model call's node is
journaled by `Run.execute`, keyed by `ModelCall.journaled`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import trio

from .._http.attempts import CallAttempts
from ..concurrency.limiter import attempt_hooks
from ..concurrency.tokens import take
from ..contracts import (
    ChatRequest,
    ChatResponse,
    Message,
    Provider,
    ResponseSchema,
    StreamingProvider,
    TextSink,
    Usage,
    estimate_tokens,
)
from ..errors import ConfigError, PluginError, asyncio_on_trio
from ..graph import NodeKind, NodeRecord, preview
from ..hedging import HedgeBudget
from ..hedging.race import Duplicate, race
from ..journal.keys import call_hash
from ..journal.seam import KEEP_TEXT, READ_TEXT, Journaled
from ..limits import Reservation, Tally, reserved_tokens
from ..protocol.replies import estimated_usage, reply_note, with_note
from ..routing import Route

if TYPE_CHECKING:
    from .context import Run

__all__ = [
    "DEFAULT_OUTPUT_ESTIMATE",
    "ModelCall",
    "call_model",
    "estimate_tokens",
    "estimated_usage",
    "reply_note",
]

T = TypeVar("T")

DEFAULT_OUTPUT_ESTIMATE = 1024
"""Output tokens reserved for a call that sets no ``max_tokens`` (and whose provider
names no ``default_max_tokens``)."""


class ModelCall:
    """One model call of a node: what it asks, of which model, counted in which tally.

    Where it goes and the request are worked out on first use, inside the node, so that
    a bad parameter fails the node (and its slot), not the code that made the call.

    Args:
        run: the run the call belongs to.
        node: the record of the node making the call (its depth routes a call naming
            no model; it gets the call's model, usage, cost and previews).
        messages: the conversation to send.
        model: the model asked for by name (None: the default for ``depth``).
        params: request parameters (``temperature``, ``max_tokens``...).
        tally: the calling completion's, which passes usage up to its parents.
        response_schema: structured output asked of the server.
        cache_key: the request's ``cache_key`` (a root turn's: its prefix is worth caching).
        stream: stream the reply where the provider can: its text goes to ``on_text`` and,
            when someone listens, to the run's events (``text_delta``).
        on_text: where a streamed reply's text goes (a `TextSink`).
    """

    __slots__ = (
        "_request",
        "cache_key",
        "messages",
        "model",
        "node",
        "on_text",
        "params",
        "response_schema",
        "route",
        "run",
        "stream",
        "tally",
    )

    def __init__(
        self,
        run: Run,
        node: NodeRecord,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        params: Mapping[str, Any] | None = None,
        tally: Tally | None = None,
        response_schema: ResponseSchema | None = None,
        cache_key: str | None = None,
        stream: bool = False,
        on_text: TextSink | None = None,
    ) -> None:
        self.run = run
        self.node = node
        self.messages = tuple(messages)
        self.model = model
        self.params = params
        self.tally = tally
        self.response_schema = response_schema
        self.cache_key = cache_key
        self.stream = stream
        self.on_text = on_text
        self.route: Route = run.router.route(model, node.depth)
        # Known before the node starts: its node_started event says them.
        node.model = self.route.model
        node.provider = self.route.provider.name
        if not node.input_preview and self.messages:
            node.input_preview = preview(self.messages[-1].content)
        self._request: ChatRequest | None = None
        if not params and response_schema is None:  # nothing in it can be refused: now
            self.request()

    def request(self) -> ChatRequest:
        """The request, as the provider gets it (built once; with parameters, on first
        use inside the node, so that a bad one fails the node)."""
        if self._request is not None:
            return self._request
        fields: dict[str, Any] = {
            "messages": self.messages,
            "model": self.route.model,
            "depth": self.node.depth,
            "node_id": self.node.id,
            "cache_key": self.cache_key,
        }
        if not self.params and self.response_schema is None:  # most calls: the least to validate
            self._request = ChatRequest(**fields)
        else:
            self._request = ChatRequest(
                **fields, response_schema=self.response_schema, **dict(self.params or {})
            )
        return self._request

    def journaled(
        self,
        keep: Callable[[T], str | None] | None = None,
        read: Callable[[str], T] | None = None,
    ) -> Journaled[T]:
        """How the node of this call is journaled: by the request's hash (model,
        messages, and parameters or schema where set). By default its result is the
        reply's text; ``keep``/``read`` convert a node's own result (a typed value) to
        that text and back. A replayed call still counts its usage in its tally (a
        child's totals stay whole) but charges nothing: it cost nothing now."""
        settled = None
        if self.params or self.response_schema is not None:
            settled = self.request()
        request = call_hash(self.route.model, self.messages, settled)
        if keep is None or read is None:  # the result is the reply's text
            return Journaled(request, KEEP_TEXT, READ_TEXT, self._replayed)
        return Journaled(request, keep, read, self._replayed)

    def _replayed(self, record: NodeRecord) -> None:
        if self.tally is not None:
            self.tally.add(record.usage or Usage(), record.cost)

    async def text(self, _node: NodeRecord) -> str:
        """`call_model`, the reply's text: the body of a node that is one call."""
        return (await call_model(self)).content


async def call_model(call: ModelCall) -> ChatResponse:
    """Make ``call`` as its node (inside `Run.execute`).

    Fills the record's model, provider, usage, cost, attempts and previews, adds the
    usage to the call's tally and charges the run's budget; a passed token or dollar
    limit stops the whole tree. A reply cut off by the token limit or without text comes
    back with a note appended (``[rlm-graph: ...]``, see `reply_note`), also kept on
    ``record.note``. A server that reports no usage is counted at about four characters
    per token, marked estimated.

    Raises:
        ConfigError: ``max_budget`` is set and the model has no price.
        ProviderError: the provider failed (after its retries).
    """
    run, record, route = call.run, call.node, call.route
    if run.limits.max_budget is not None:
        _check_priced(run, route)
    request = call._request if call._request is not None else call.request()
    reservation = await _reserve(run, route, request)
    duplicate = None
    capabilities = route.capabilities
    rate = run.limiters.rate(
        route.key, capabilities.requests_per_minute, capabilities.tokens_per_minute
    )
    estimate = 0
    try:
        if rate is not None:  # the provider's rate buckets
            estimate = sum(estimate_tokens(m.content) for m in request.messages)
            await rate.acquire(estimate)
        # The send stage: one request, or (a hedged sub-call) a request and a duplicate.
        hedges = run.hedges if record.kind is NodeKind.LLM_CALL and not call.stream else None
        if hedges is None:
            streams = call.stream and route.capabilities.streams
            sink = run.events.text_sink(record, call.on_text) if streams else None
            response = await _request(run, route, request, record, sink, True, None)
        else:
            pace = partial(rate.acquire, estimate) if rate is not None else None
            response, duplicate = await _race(run, route, request, record, hedges, pace)
    except BaseException:
        if reservation is not None:
            run.spend.release(reservation)
        raise
    usage = response.usage
    if usage.total_tokens == 0:
        usage = estimated_usage(request.messages, response.content)
    if rate is not None:
        rate.settle(estimate, usage.total_tokens)
    return _account(run, record, call, response, usage, reservation, duplicate)


def _check_priced(run: Run, route: Route) -> None:
    """Refuse a call ``max_budget`` could not see. The configuration check covers every
    configured model; this catches a name a workflow gave, before it costs money."""
    if not run.router.can_price(route):
        raise ConfigError(
            f"max_budget is set but model {route.model!r} has no price; add it to "
            f"models={{{route.model!r}: {{'input_usd_per_mtok': ..., 'output_usd_per_mtok': ...}}}}"
        )


async def _reserve(run: Run, route: Route, request: ChatRequest) -> Reservation | None:
    """Wait until the call's estimate fits the run's token and dollar limits; hold it.

    The estimate: the prompt at four characters per token, a token more for each
    character outside ASCII (`reserved_tokens`; corrected by what the servers counted
    so far), plus the request's ``max_tokens`` (else the provider's
    ``default_max_tokens``, else `DEFAULT_OUTPUT_ESTIMATE`) of output, priced from the
    table (else per token at what the run's reported costs have come to; before the
    first, unknown: the call then goes only alone).
    """
    if not run.budget.limited:
        return None
    return await run.spend.reserve(*_estimate(run, route, request))


def _estimate(run: Run, route: Route, request: ChatRequest) -> tuple[int, float | None, str, int]:
    """A call's tokens, dollars, model and prompt estimate (`BudgetGate.estimate`)."""
    output = request.max_tokens or route.capabilities.default_max_tokens or DEFAULT_OUTPUT_ESTIMATE
    prompt = sum(reserved_tokens(m.content) for m in request.messages)
    price = partial(run.router.price, route.model)
    tokens, cost = run.spend.estimate(route.model, prompt, int(output), price)
    return tokens, cost, route.model, prompt


async def _race(
    run: Run, route: Route, request: ChatRequest, record: NodeRecord, hedges: HedgeBudget, pace: Any
) -> tuple[ChatResponse, Duplicate | None]:
    """A hedged sub-call's request raced against a duplicate (`rlm_graph.hedging.race`),
    which takes the provider's rate buckets as any request does (``pace``, if any)."""

    async def send(first: bool, on_slot: Callable[[], bool]) -> ChatResponse:
        if not first and pace is not None:
            await pace()
        return await _request(run, route, request, record, None, first, on_slot)

    reserve_now = partial(_reserve_now, run, route, request) if run.budget.limited else None
    return await race(hedges, route.model, record, send, reserve_now, run.spend.release)


def _reserve_now(run: Run, route: Route, request: ChatRequest) -> Reservation | None:
    """A duplicate's reservation, if its estimate fits the budget now."""
    return run.spend.try_reserve(*_estimate(run, route, request))


async def _request(
    run: Run,
    route: Route,
    request: ChatRequest,
    record: NodeRecord,
    sink: TextSink | None,
    first: bool,
    on_slot: Callable[[], bool] | None,
) -> ChatResponse:
    """One request through the provider's limiters, with its retries; the first of a
    node sets its service start, a duplicate adds its attempts to the node's."""
    provider, capabilities = route.provider, route.capabilities
    ceiling = provider.max_concurrent
    initial = capabilities.initial_concurrency
    slot = run.limiters.slot(route.key, initial, ceiling, route.model, run.events.concurrency)
    limiter = run.limiters.provider(route.key, ceiling)
    await take(limiter)
    try:
        async with slot:
            began = trio.current_time()
            if first:  # queueing for the slot was not service
                record.start = began
                record.wall_start = time.time()
            if on_slot is not None and not on_slot():
                await trio.sleep_forever()  # a duplicate too late: its cancellation is on the way
            attempts = CallAttempts(run.retries, provider.name, attempt_hooks(slot))
            try:
                # The node's span is current: the request carries its traceparent.
                with attempts, run.tracer.activate(record.id):
                    if sink is None:
                        pending = provider.complete(request)
                    else:  # capabilities.streams: a StreamingProvider
                        pending = cast(StreamingProvider, provider).stream(request, sink)
                    try:
                        response = await pending
                    except (TypeError, RuntimeError) as exc:
                        if not inspect.isawaitable(pending):
                            raise _broken(provider, pending, "not an awaitable", sink) from None
                        if not asyncio_on_trio(exc):
                            raise
                        raise _broken(provider, exc, "asyncio's error", sink) from exc
                    except BaseException as exc:  # asyncio's CancelledError, say: the slot's
                        if isinstance(exc, _PASSES):
                            raise
                        raise _broken(provider, exc, "raised, not an Exception") from exc
                    if not isinstance(response, ChatResponse):
                        raise _broken(provider, response, "not a ChatResponse")
            finally:
                # The node starts at 1; a hedged call's two requests may end in either order.
                record.attempts += attempts.attempts - (1 if first else 0)
    finally:
        limiter.release()
    return response


# What a provider's call may raise that is not its slot's failure: trio's cancellation,
# the user's Ctrl-C, a closing coroutine's GeneratorExit, a nursery's group (SystemExit is).
_PASSES = (
    Exception,
    trio.Cancelled,
    KeyboardInterrupt,
    GeneratorExit,
    BaseExceptionGroup,
)


def _broken(provider: Provider, got: object, what: str, sink: object = None) -> PluginError:
    """A provider's answer that is not what the contract says, named as the plugin's
    mistake (not a TypeError or AttributeError from deep inside the engine)."""
    method = "complete" if sink is None else "stream"
    if what == "not an awaitable":
        fix = f"define {method}() with async def"
    elif what == "asyncio's error":
        what = f"asyncio's error ({str(got).split('. ')[0]})"
        fix = (
            f"{method}() runs on trio's loop, not asyncio's: use a client that runs under "
            "trio (httpx does), or a blocking one in trio.to_thread.run_sync (asyncio "
            "code in that thread needs a loop of its own: asyncio.run)"
        )
    elif isinstance(got, BaseException):
        fix = "raise a ProviderError (rlm_graph.errors) for a call that failed"
    else:
        fix = "return rlm_graph.contracts.ChatResponse"
    return PluginError(
        f"provider {provider.name!r} answered with {type(got).__name__}, {what}; {fix}"
    )


def _account(
    run: Run,
    record: NodeRecord,
    call: ModelCall,
    response: ChatResponse,
    usage: Usage,
    reservation: Reservation | None,
    duplicate: Duplicate | None = None,
) -> ChatResponse:
    """Price the reply, note what is wrong with it, count it in the tally, settle the
    budget (a passed limit stops the tree); the reply as the caller gets it.

    A hedged call's duplicate is counted too: a request cancelled mid-flight is billed
    by most providers as if it had run, so it counts as the winner's usage and cost
    again (marked estimated), settled against its own reservation."""
    cost = _cost(run, call.route, response, usage)
    note = reply_note(response)
    if note is not None:
        response = response.model_copy(update={"content": with_note(response.content, note)})
    exceeded = _charge(run, reservation, usage, cost)
    if duplicate is not None and duplicate.billed:
        extra = usage.model_copy(update={"estimated": True})
        exceeded = _charge(run, duplicate.reservation, extra, cost) or exceeded
        duplicate.reservation = None
        usage, cost = usage + extra, None if cost is None else 2 * cost
    elif duplicate is not None and duplicate.reservation is not None:
        run.spend.release(duplicate.reservation)  # the loser failed: nothing billed
    record.answered(
        usage=usage,
        cost=cost,
        response_model=response.model or None,
        finish_reason=response.finish_reason,
        note=note,
        output=response.content,
    )
    if call.tally is not None:
        call.tally.add(usage, cost)
    if exceeded is not None:
        run.stop(exceeded)
    return response


def _cost(run: Run, route: Route, response: ChatResponse, usage: Usage) -> float | None:
    """A call's cost: the server's figure where its provider says it reports costs, else
    the larger of the server's and the table's price (a server that says its reply cost
    $0 does not switch ``max_budget`` off; one that bills more than the table is counted
    at what it bills), else whichever there is."""
    reported = response.cost
    if reported is not None and route.capabilities.reports_cost:
        return reported
    table = run.router.price(route.model, usage)
    if reported is None or table is None:
        return table if reported is None else reported
    return max(reported, table)


def _charge(
    run: Run, reservation: Reservation | None, usage: Usage, cost: float | None
) -> str | None:
    """Charge one request to the run's budget (settling its reservation); the limit now
    passed, if any."""
    if reservation is not None:
        return run.spend.settle(reservation, usage, cost)
    return run.budget.charge(usage, cost)
