"""The facade: `Engine` runs a user's workflows; `RLM` runs Recursive Language Model
completions on top of it.

An engine owns what every run shares: the plugin host, the configured providers (one
client each, reused by every run), the model table, and one set of limiters per trio loop
(a provider's capacity limiter is shared by every depth of every run in that loop).
The sync API (`Engine.run`, `RLM.completion`) calls ``trio.run`` and closes the providers'
connections when it returns; the async API (`Engine.arun`, `RLM.acompletion`) runs in the
caller's trio loop and leaves them open until `aclose`.
"""

from __future__ import annotations

import inspect
import logging
import os
import weakref
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import trio
from opentelemetry.trace import TracerProvider
from pydantic import ValidationError

from .concurrency.capacity import LoopLimiters, SharedLimiter
from .concurrency.limiter import InProcessLimiter
from .contracts import ModelInfo, Provider
from .doors.aio import call_from_asyncio, running_under_asyncio
from .doors.stream import AsyncEventStream, EventStream, open_event_stream
from .doors.sync import run_sync
from .errors import (
    ConfigError,
    PluginError,
    checked_flag,
    clipped,
    config_error,
    message_of,
)
from .events import DEFAULT_CAPACITY, Listener
from .graph import Graph, Workflow
from .hooks import PluginHost
from .hooks.providers import make_provider
from .journal.keys import provider_identity, workflow_key
from .journal.seam import JournalTarget
from .limits import Limits
from .result import WorkflowResult
from .routing import ProviderRouter
from .runtime.context import Run
from .runtime.lifecycle import run_lifecycle
from .runtime.session import CLOSE_SECONDS
from .runtime.workflow import WorkflowRun
from .tracing import (
    NodeTracer,
    Scrubber,
    flush_tracing,
    secret_values,
)

__all__ = ["Engine"]

T = TypeVar("T")


logger = logging.getLogger("rlm_graph")


def _other_kwargs(
    other_backends: Sequence[str] | None, other_backend_kwargs: Sequence[Mapping[str, Any]] | None
) -> list[tuple[str, Mapping[str, Any]]]:
    """``other_backends`` paired with their kwargs, checked: two lists of one length.

    Raises:
        ConfigError: either is not a list, or their lengths differ.
    """
    if isinstance(other_backends, str) or not isinstance(other_backends, Sequence | None):
        raise ConfigError(
            f"other_backends must be a list of backend names, e.g. [{other_backends!r}]"
        )
    others = list(other_backends or [])
    if other_backend_kwargs is not None and (
        isinstance(other_backend_kwargs, Mapping | str)
        or not isinstance(other_backend_kwargs, Sequence)
    ):
        raise ConfigError(
            "other_backend_kwargs must be a list with one kwargs dict per entry of "
            f"other_backends, e.g. [{{'model_name': ...}}], not {type(other_backend_kwargs).__name__}"
        )
    kwargs = [{} for _ in others] if other_backend_kwargs is None else list(other_backend_kwargs)
    if len(kwargs) != len(others):
        raise ConfigError(
            f"other_backends has {len(others)} entries but other_backend_kwargs has "
            f"{len(kwargs)}; give one kwargs dict per backend"
        )
    return list(zip(others, kwargs, strict=True))


def _model_list(models: Sequence[str] | None) -> list[str]:
    if models is None:
        return []
    if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
        raise ConfigError(
            f"allowed_models must be a list of model names, e.g. [{models!r}]"
            if isinstance(models, str)
            else "allowed_models must be a list of non-empty model names"
        )
    return list(models)


def _model_table(table: dict[str, ModelInfo], models: object) -> dict[str, ModelInfo]:
    """The plugins' model table with the ``models=`` entries over it."""
    if models is None:
        return table
    if not isinstance(models, Mapping):
        raise ConfigError(
            "models must be a dict of model name -> {'context_window': ..., "
            f"'input_usd_per_mtok': ..., 'output_usd_per_mtok': ...}}, not {type(models).__name__}"
        )
    for name, info in models.items():
        table[name] = _model_info(name, info, table.get(name))
    return table


_CACHE_RATES = ("cached_input_usd_per_mtok", "cache_write_usd_per_mtok")
"""A `ModelInfo`'s rates that go with its input rate."""


def _model_info(name: str, info: object, known: ModelInfo | None) -> ModelInfo:
    """A ``models=`` entry; a dict updates what the plugins know of that model (so giving a
    ``context_window`` keeps its prices). A dict naming the input price drops the
    plugin's cached-input and cache-write rates it does not name: they were set against
    the plugin's input rate (unset, those tokens are priced at the new input rate)."""
    if isinstance(info, ModelInfo):
        return info
    if not isinstance(info, Mapping):
        raise ConfigError(
            f"models[{name!r}] must be a dict like {{'context_window': 8192}} or a ModelInfo"
        )
    try:
        base = known.model_dump(exclude_unset=True) if known is not None else {}
        if "input_usd_per_mtok" in info:
            base = {key: value for key, value in base.items() if key not in _CACHE_RATES}
        return ModelInfo(**{**base, **info})
    except ValidationError as exc:
        raise config_error(f"models[{name!r}]", exc) from None
    except TypeError as exc:
        raise ConfigError(f"models[{name!r}]: {exc}") from None


class Engine:
    """Providers, plugins, limits and tracing, shared by every run.

    Args:
        backend: the main provider's registered name (``"openai"``, ``"scripted"``...), or
            a provider object (then without ``backend_kwargs``).
        backend_kwargs: keywords for that provider (``model_name``, ``base_url``...).
        other_backends: more providers; the first serves sub-calls at depth >= 1, and
            each serves requests for its own model name.
        other_backend_kwargs: one dict per entry of ``other_backends``.
        plugins: plugin objects or modules to register besides installed entry points.
        observers: objects implementing ``rlm_node_*``/``rlm_run_*`` hooks.
        listeners: callables given every event of every run (see docs/observing.md);
            quick and non-blocking, like observers.
        models: context windows and prices by model name, over the plugins' table. A
            dated id (``gpt-5-mini-2025-08-07``) or a ``vendor/model`` id without an entry
            of its own is priced as its base model.
        allowed_models: more model names model code may ask for by name
            (``llm_query(p, model=...)``), served by the main backend; the backends' own
            models are always allowed.
        tracer_provider: the OpenTelemetry tracer provider for spans (default:
            OpenTelemetry's global one, as the application set it, with its sampler,
            resource and exporters; tracing costs nothing while none is set). Build one
            with `rlm_graph.tracing.configure_tracing` or ``tracer_provider_from_env()``.
        trace_content: put prompt, code and output text (truncated) on spans.
        record_content: keep every node's whole input and output on its record
            (``content_in``/``content_out``: the report's trajectory). Off by default:
            documents are private.
        entry_points: load installed plugins of entry-point group ``rlm_graph``.
        limiter: where providers' concurrency gates and rate buckets live, shared with
            every engine given the same object (default: this engine's own, in-process);
            batch executors supply one (see docs/batch.md).
        **limits: any field of `Limits` (``max_timeout``, ``max_tokens``...).

    Raises:
        ConfigError: an unknown keyword or limit, a bad value.
        PluginError: an unknown backend name (the message lists the registered ones).
            ``max_budget`` with a model that has no price (see `check_prices`) is a
            ``ConfigError`` too.
    """

    def __init__(
        self,
        backend: str | Provider = "scripted",
        backend_kwargs: Mapping[str, Any] | None = None,
        *,
        other_backends: Sequence[str] | None = None,
        other_backend_kwargs: Sequence[Mapping[str, Any]] | None = None,
        plugins: Iterable[object] = (),
        observers: Iterable[object] = (),
        models: Mapping[str, ModelInfo | Mapping[str, Any]] | None = None,
        allowed_models: Sequence[str] | None = None,
        tracer_provider: TracerProvider | None = None,
        trace_content: bool = False,
        record_content: bool = False,
        entry_points: bool = True,
        listeners: Iterable[Listener] = (),
        limiter: SharedLimiter | None = None,
        **limits: Any,
    ) -> None:
        given = [*_plugin_list("plugins", plugins), *_plugin_list("observers", observers)]
        self.host = PluginHost(given, entry_points=entry_points)
        self.listeners: list[Listener] = _checked_listeners(listeners)
        self.limits = self._limits(limits)
        # Default None: OpenTelemetry's global provider, the application's (a library
        # does not build its own from OTEL_* variables; the CLI and configure_tracing do).
        self.tracer_provider = tracer_provider
        self.trace_content = checked_flag("trace_content", trace_content)
        self.record_content = checked_flag("record_content", record_content)
        other_kwargs = _other_kwargs(other_backends, other_backend_kwargs)
        main = make_provider(self.host, backend, backend_kwargs)
        labels = [backend if isinstance(backend, str) else main.name]
        providers = [(f"{labels[0]}/0", main)]
        for index, (name, kwargs) in enumerate(other_kwargs, start=1):
            other = make_provider(self.host, name, kwargs)
            labels.append(name if isinstance(name, str) else other.name)
            providers.append((f"{labels[-1]}/{index}", other))
        table = _model_table(self.host.models, models)
        self.router = ProviderRouter(providers, table, _model_list(allowed_models), labels=labels)
        self.check_prices(self.limits)
        self._secrets = [
            value
            for kwargs in [backend_kwargs, *(kwargs for _, kwargs in other_kwargs)]
            for value in secret_values(kwargs, environ={})
        ]
        # Known secrets (keys given here, and secret-named environment variables) are
        # redacted from every record; the check is one regex, cheap enough per node.
        scrubber = Scrubber(self._secrets)
        self._redact = scrubber.scrub_literals if scrubber.has_literals else None
        self._loops: weakref.WeakKeyDictionary[trio.lowlevel.TrioToken, LoopLimiters] = (
            weakref.WeakKeyDictionary()
        )
        # Provider limits across loops: parallel sync calls from threads share them too.
        self.limiter: SharedLimiter = limiter if limiter is not None else InProcessLimiter()

    @staticmethod
    def _limits(values: Mapping[str, Any]) -> Limits:
        unknown = sorted(set(values) - set(Limits.model_fields))
        if unknown:
            raise ConfigError(
                f"unknown keyword(s) {', '.join(map(repr, unknown))}; limits are "
                f"{', '.join(sorted(Limits.model_fields))}"
            )
        return Limits.from_kwargs(**values)

    @property
    def provider(self) -> Provider:
        """The main backend's provider."""
        return self.router.providers[0][1]

    @property
    def providers(self) -> list[Provider]:
        return [provider for _, provider in self.router.providers]

    def redact(self, text: str) -> str:
        """``text`` less the secrets this engine knows (its providers' keys, secret-named
        environment variables, runs of 8+ of their characters), each ``[REDACTED]``: what
        it does to every record. For a caller that shows a run's raw text (the model's
        streamed reply a listener gets, which is not redacted)."""
        return self._redact(text) if self._redact is not None else text

    def limiters(self) -> LoopLimiters:
        """This engine's limiters for the current trio loop (created on first use)."""
        token = trio.lowlevel.current_trio_token()
        found = self._loops.get(token)
        if found is None:
            found = self._loops[token] = LoopLimiters(self.limiter)
        return found

    def new_run(self, limits: Limits | None = None, listeners: Iterable[Listener] = ()) -> Run:
        """A fresh run sharing this engine's providers and limiters (call inside trio).

        ``listeners`` get this run's events, after the engine's own listeners."""
        listeners = _checked_listeners(listeners)
        graph = Graph()
        tracer = NodeTracer(
            self.tracer_provider,
            capture_content=self.trace_content,
            providers=self.providers,
            secrets=self._secrets,
            graph=graph,
        )
        return Run(
            limits=limits or self.limits,
            host=self.host,
            router=self.router,
            limiters=self.limiters(),
            tracer=tracer,
            graph=graph,
            redact=self._redact,
            listeners=[*self.listeners, *listeners],
            record_content=self.record_content,
        )

    async def flush_spans(self) -> None:
        """Export the spans of finished runs (bounded wait, off the trio thread)."""
        if self.tracer_provider is not None:
            # A short bound: with the collector down, a completion must not wait on it;
            # spans not sent yet stay queued for the batch processor's next export.
            await trio.to_thread.run_sync(flush_tracing, self.tracer_provider, 1_000)

    def limits_with(self, overrides: Mapping[str, Any]) -> Limits:
        if not isinstance(overrides, Mapping):
            raise ConfigError(
                f"limits must be a dict such as {{'max_iterations': 5}}, not {type(overrides).__name__}"
            )
        if not overrides:
            return self.limits
        limits = self._limits({**self.limits.model_dump(), **overrides})
        self.check_prices(limits)
        return limits

    def check_prices(self, limits: Limits) -> None:
        """Refuse ``max_budget`` when a model calls could use has no price.

        A call with no price and no server-reported cost would count $0 and the budget
        could not stop anything. Every model of the backends and of ``allowed_models``
        needs a price in the model table (directly, or as a dated or ``vendor/`` id of a
        priced model), or a provider that reports costs (``reports_cost = True``).

        Raises:
            ConfigError: naming each unpriced model and how to price it.
        """
        if limits.max_budget is None:
            return
        missing = self.router.unpriced()
        if not missing:
            return
        names = ", ".join(f"{model!r} (backend {provider!r})" for model, provider in missing)
        example = missing[0][0]
        raise ConfigError(
            f"max_budget=${limits.max_budget:g} cannot be kept: no price is known for {names}, "
            "so its calls would count $0. Price it with models={"
            f"{example!r}: {{'input_usd_per_mtok': ..., 'output_usd_per_mtok': ...}}}} (USD per "
            "million tokens; 0 for a free local model) or a plugin's rlm_register_models hook "
            "(docs/plugins.md), or limit tokens instead: max_tokens (rlm-graph: --max-tokens)"
        )

    # -- workflows ----------------------------------------------------------------------

    async def arun(
        self, workflow: Workflow, *, journal: str | os.PathLike[str] | None = None, **limits: Any
    ) -> WorkflowResult:
        """Run a `Workflow` in the caller's trio loop (under asyncio: on rlm-graph's trio
        thread, cancelled with the awaiting task).

        Args:
            workflow: the DAG to run.
            journal: an SQLite file recording finished nodes (model calls, and function
                results JSON can hold); the same workflow over it resumes (see
                docs/durability.md).
            **limits: overrides of this engine's limits for this run.

        Returns:
            A `WorkflowResult`; index it with a node for its value.

        Raises:
            LimitExceeded: a limit stopped the run and ``on_limit="raise"``.
        """
        if running_under_asyncio():
            return await call_from_asyncio(self._arun, workflow, limits, (), journal)
        return await self._arun(workflow, limits, (), journal)

    async def _arun(
        self,
        workflow: Workflow,
        limits: Mapping[str, Any],
        listeners: Iterable[Listener],
        journal: str | os.PathLike[str] | None = None,
    ) -> WorkflowResult:
        if not isinstance(workflow, Workflow):
            raise ConfigError(
                f"run() takes a rlm_graph.Workflow, got {type(workflow).__name__}; "
                "for a completion use RLM(...).completion()"
            )
        run = self.new_run(self.limits_with(limits), listeners)
        target = None
        if journal is not None:
            providers = [provider_identity(key, p) for key, p in self.router.providers]
            target = JournalTarget(
                journal,
                workflow_key(workflow, providers),
                "workflow",
                f"workflow of {len(workflow)} nodes",
            )
        return await run_lifecycle(run, WorkflowRun(workflow, target), flush=self.flush_spans)

    def stream(
        self,
        workflow: Workflow,
        *,
        journal: str | os.PathLike[str] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        **limits: Any,
    ) -> EventStream[WorkflowResult]:
        """Run a `Workflow` in the background and iterate over its events (sync code).

        ``for event in engine.stream(wf): ...``; the last event is ``run_finished``
        (``event.result`` is the `WorkflowResult`, also on ``stream.result``). Closing the
        stream (leaving a ``with`` block, or ``break`` then ``stream.close()``) cancels a
        run still going. Memory holds at most ``capacity`` events; the rest wait on disk.
        ``journal`` and ``limits`` are those of `arun`: a streamed run resumes and
        replays like any other.
        """
        return EventStream(
            lambda listener: self._closing(self._arun(workflow, limits, [listener], journal)),
            capacity=capacity,
            sync_name="Engine.stream",
            async_name="engine.astream",
        )

    def astream(
        self,
        workflow: Workflow,
        *,
        journal: str | os.PathLike[str] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        **limits: Any,
    ) -> AbstractAsyncContextManager[AsyncEventStream[WorkflowResult]]:
        """`stream` for trio code: ``async with engine.astream(wf) as events:``."""
        return open_event_stream(
            lambda listener: self._arun(workflow, limits, [listener], journal), capacity=capacity
        )

    def run(
        self, workflow: Workflow, *, journal: str | os.PathLike[str] | None = None, **limits: Any
    ) -> WorkflowResult:
        """Run a `Workflow` from sync code (starts and ends its own trio loop); the
        arguments are those of `arun`."""

        async def run_and_close() -> WorkflowResult:
            return await self._closing(self._arun(workflow, limits, (), journal))

        return run_sync(run_and_close, sync_name="Engine.run", async_name="engine.arun")

    async def _closing(self, run: Awaitable[T]) -> T:
        """Await ``run``, then close the providers' connections (the sync doors' end: the
        trio loop they were opened in ends with it)."""
        try:
            return await run
        finally:
            with trio.CancelScope(shield=True):
                await self.aclose()

    async def aclose(self) -> None:
        """Close every provider's connections (they reopen on the next call), each within
        `CLOSE_SECONDS`: a provider whose ``aclose`` raises or hangs is logged and left,
        and the others are closed all the same (a run's result is never lost to it)."""
        if running_under_asyncio():
            return await call_from_asyncio(self.aclose)
        for label, provider in self.router.providers:
            with trio.move_on_after(CLOSE_SECONDS) as waited:
                try:
                    closing = provider.aclose()
                    if inspect.isawaitable(closing):  # a plain def aclose has already run
                        await closing
                except (Exception, SystemExit) as exc:
                    said = f"{type(exc).__name__}: {clipped(message_of(exc), 300)}"
                    logger.warning(
                        "provider %s failed to close (%s); its connections are left to "
                        "the garbage collector",
                        label,
                        self._redact(said) if self._redact is not None else said,
                    )
            if waited.cancelled_caught:
                logger.warning(
                    "provider %s did not close within %s s; its connections are left to "
                    "the garbage collector",
                    label,
                    CLOSE_SECONDS,
                )

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _plugin_list(name: str, given: object) -> list[object]:
    """``plugins=`` or ``observers=`` as a list, or a `PluginError` saying what to pass."""
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise PluginError(
            f"{name} must be a list of plugin objects or modules, not "
            f"{type(given).__name__}; pass {name}=[MyPlugin()]"
        )
    return list(given)


def _checked_listeners(listeners: Iterable[Listener]) -> list[Listener]:
    """``listeners`` as a list, each a plain callable. An ``async def`` one (or an object
    whose ``__call__`` is) would get a coroutine made per event and never awaited: the
    listener saw nothing, and said nothing."""
    checked = list(listeners)
    for listener in checked:
        if not callable(listener):
            raise ConfigError(
                f"a listener is a callable taking an event, not {type(listener).__name__}"
            )
        if any(
            inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
            for f in (listener, type(listener).__call__)
        ):
            name = getattr(listener, "__qualname__", None) or type(listener).__qualname__
            raise ConfigError(
                f"listener {name} is async: a listener is called on the scheduler's thread "
                "and must be a plain function; use astream() for async consumers"
            )
    return checked
