"""`RLM`: the drop-in Recursive Language Model facade.

Same constructor keywords and ``completion(prompt, root_prompt=None)`` as the reference
library, so switching is an import change; plus ``await acompletion(...)`` for trio code,
and the finished graph on every result.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio
from opentelemetry.trace import TracerProvider

from .concurrency.capacity import SharedLimiter
from .contracts import ModelInfo
from .doors.aio import call_from_asyncio, run_on_trio_thread, running_under_asyncio
from .doors.stream import AsyncEventStream, EventStream, open_event_stream
from .doors.sync import run_sync
from .engine import Engine
from .errors import ConfigError, checked_flag
from .events import DEFAULT_CAPACITY, Listener
from .graph import preview
from .journal import run_key
from .journal.code import stable_value
from .journal.keys import provider_identity
from .journal.seam import JournalTarget
from .protocol.schema import AnswerSchema
from .protocol.state import LoopSettings
from .protocol.tool_code import check_tool_code, check_tool_prompts
from .protocol.truncate import DEFAULT_OUTPUT_CHARS
from .result import ModelUsageSummary, RLMChatCompletion, UsageSummary
from .rlm_options import (
    Callbacks,
    check_direct,
    check_environment_kwargs,
    check_loop_options,
    compaction_strategy,
    normalise_tools,
    sampling_params,
)
from .runtime.completion import CompletionRun
from .runtime.context import Run
from .runtime.lifecycle import run_lifecycle
from .runtime.loop import RLMRunner
from .runtime.session import PersistentSession

__all__ = ["ModelUsageSummary", "RLM", "RLMChatCompletion", "UsageSummary"]

_CALLBACKS = (
    "on_subcall_start",
    "on_subcall_complete",
    "on_iteration_start",
    "on_iteration_complete",
)


class RLM:
    """A Recursive Language Model engine.

    Args:
        backend: the root model's provider (``"openai"``, ``"anthropic"``, ``"vllm"``,
            ``"openrouter"``, ``"ollama"``, ``"scripted"``, or a plugin's).
        backend_kwargs: the provider's keywords, e.g. ``{"model_name": ..., "base_url": ...}``.
        environment: the REPL (``"local"``, ``"subprocess"``, or a plugin's). The default,
            ``"local"``, runs the model's code in this process: fast, but that code can
            reach every object of the engine, your API keys included, and nothing stops
            it for good. Choose ``"subprocess"`` whenever the model or the documents it
            reads are not yours to trust (it is the CLI's default); docs/environments.md
            says what each one stops.
        environment_kwargs: the environment's keywords (e.g. ``{"timeout": 5}``).
        max_depth: completions nest up to this depth; ``rlm_query`` from a completion at
            depth ``max_depth - 1`` is a plain model call (default 1: no children, as in
            the reference). ``max_depth=0`` skips the REPL: one plain call of the root
            model with the question and the context.
        max_iterations, max_timeout, max_tokens, max_budget, max_errors: limits for the
            whole tree (see docs/limits.md).
        on_limit: ``"return"`` the partial answer with ``stop_reason`` set, or ``"raise"``
            a `LimitExceeded` carrying it.
        hedge: hedged sub-calls (off by default): ``True``, or a dict of ``quantile``
            (0.9), ``max_extra`` (0.1) and ``min_samples`` (8). A sub-call still
            unanswered past that quantile of its model's latencies in this run gets one
            duplicate; the first answer wins, the other is cancelled, both are counted
            (docs/limits.md, "Hedged sub-calls").
        persistent: keep the REPL across ``completion()`` calls (``context_N``,
            ``history_N``).
        custom_tools, custom_sub_tools: functions or data for the root's REPL and for
            children's (``{name: value}`` or ``{name: {"tool": value, "description": ...}}``);
            children get ``custom_tools`` when ``custom_sub_tools`` is None.
        other_backends, other_backend_kwargs: more providers; the first serves sub-calls.
        max_concurrent_subcalls: child completions in flight per depth (default 4).
        batch_max_concurrent: slots of one batch in flight (default 16).
        compaction, compaction_threshold_pct, compaction_kwargs: history compaction: True
            for ``"summarize"``, a registered strategy name (built with
            ``compaction_kwargs``), or a `CompactionStrategy` object.
        custom_system_prompt: replaces the built-in system prompt.
        tool_prompts: a str or a list of str: sections appended to every system prompt
            of the run (the root's and children's), e.g. to describe ``tool_code``'s
            functions.
        tool_code: Python source run in every REPL of the run (the root's and each
            child RLM's) after the context is loaded and before the first turn: your
            set-up code, defining functions and data for the model's code. Invalid
            Python is a `ConfigError` here; code that raises stops the completion with a
            `ConfigError` carrying its error.
        accept_text_final: also accept ``FINAL(...)`` written as text outside code.
        direct_if_fits: answer with one plain call of the root model (no REPL) when the
            question and context fit ``direct_share`` of its window (from the model
            table); off by default (see docs/rlm.md for when it helps).
        direct_share: the share of the root model's window the direct path may use
            (default 0.5).
        output_chars: REPL output kept per turn (default 20,000 characters).
        verbose: print a line per finished node to stderr.
        on_subcall_start, on_subcall_complete: called when a child completion starts
            (depth, model, prompt preview) and ends (depth, model, seconds, error).
        on_iteration_start, on_iteration_complete: called when a root turn starts
            (depth, iteration) and ends (depth, iteration, seconds), at every depth.
        sampling_args, sub_sampling_args: request parameters (``temperature``,
            ``top_p``, ``max_tokens``/``max_completion_tokens``, ``seed``, ``stop``; other
            keys pass through to the provider) for the root's turns, and for sub-calls and
            children's turns (default: ``sampling_args``).
        depth: accepted for compatibility; must be 0.
        allowed_models: more model names the model's code may name in
            ``llm_query(p, model=...)`` / ``rlm_query``; other names fail that slot with
            an ``[ERROR]`` naming the allowed ones. The backends' models are always allowed.
        plugins, observers, listeners, models, tracer_provider, trace_content,
            record_content, limiter: as for `Engine` (``record_content=True`` puts each
            turn's reply, each block's code and output, each sub-call's prompt and answer
            in the report: docs/observing.md).
        journal: an SQLite file recording every finished node; a completion with the
            same inputs and configuration over it resumes (replays what was recorded,
            goes live from the first node with no record). See docs/durability.md.

    Raises:
        ConfigError: an unknown keyword, a bad limit, a reserved tool name, ``max_budget``
            with a model that has no price (the message says how to price it).
        PluginError: an unknown backend, environment or compaction strategy.
    """

    def __init__(
        self,
        backend: str | Any = "openai",
        backend_kwargs: Mapping[str, Any] | None = None,
        environment: str = "local",
        environment_kwargs: Mapping[str, Any] | None = None,
        *,
        max_depth: int = 1,
        max_iterations: int = 30,
        max_timeout: float | None = None,
        max_tokens: int | None = None,
        max_budget: float | None = None,
        max_errors: int | None = None,
        on_limit: str = "return",
        hedge: bool | Mapping[str, Any] | None = None,
        persistent: bool = False,
        custom_tools: Mapping[str, Any] | None = None,
        custom_sub_tools: Mapping[str, Any] | None = None,
        other_backends: Sequence[str] | None = None,
        other_backend_kwargs: Sequence[Mapping[str, Any]] | None = None,
        max_concurrent_subcalls: int = 4,
        batch_max_concurrent: int = 16,
        compaction: bool | str | Any = False,
        compaction_threshold_pct: float = 0.85,
        compaction_kwargs: Mapping[str, Any] | None = None,
        custom_system_prompt: str | None = None,
        tool_prompts: str | Sequence[str] | None = None,
        tool_code: str | None = None,
        accept_text_final: bool = False,
        direct_if_fits: bool = False,
        direct_share: float = 0.5,
        output_chars: int = DEFAULT_OUTPUT_CHARS,
        verbose: bool = False,
        on_subcall_start: Callable[..., Any] | None = None,
        on_subcall_complete: Callable[..., Any] | None = None,
        on_iteration_start: Callable[..., Any] | None = None,
        on_iteration_complete: Callable[..., Any] | None = None,
        sampling_args: Mapping[str, Any] | None = None,
        sub_sampling_args: Mapping[str, Any] | None = None,
        depth: int = 0,
        plugins: Iterable[object] = (),
        observers: Iterable[object] = (),
        listeners: Iterable[Listener] = (),
        models: Mapping[str, ModelInfo | Mapping[str, Any]] | None = None,
        allowed_models: Sequence[str] | None = None,
        tracer_provider: TracerProvider | None = None,
        trace_content: bool = False,
        record_content: bool = False,
        limiter: SharedLimiter | None = None,
        logger: None = None,
        journal: str | os.PathLike[str] | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise ConfigError(
                f"RLM() got unknown keyword(s) {', '.join(map(repr, sorted(unknown)))}; "
                "see help(rlm_graph.RLM) for the keywords it takes"
            )
        if depth != 0:
            raise ConfigError(
                "depth= is the reference library's internal counter for child RLMs; "
                "rlm-graph tracks depth itself: leave it at 0 and set max_depth"
            )
        if logger is not None:
            raise ConfigError(
                "logger= is not supported: every result carries its graph "
                "(result.graph, exportable to JSON) and runs can be traced (docs/tracing.md)"
            )
        hooks = (on_subcall_start, on_subcall_complete, on_iteration_start, on_iteration_complete)
        check_loop_options(
            custom_system_prompt=custom_system_prompt,
            compaction=compaction,
            compaction_threshold_pct=compaction_threshold_pct,
            compaction_kwargs=compaction_kwargs,
            output_chars=output_chars,
            callbacks=dict(zip(_CALLBACKS, hooks, strict=True)),
        )
        for name, value in (
            ("persistent", persistent),
            ("accept_text_final", accept_text_final),
            ("verbose", verbose),
        ):
            checked_flag(name, value)
        check_direct(direct_if_fits, direct_share, persistent)
        callbacks = []
        if verbose or any(hooks):
            callbacks.append(Callbacks(*hooks, verbose=verbose))
        self.engine = Engine(
            backend,
            backend_kwargs,
            other_backends=other_backends,
            other_backend_kwargs=other_backend_kwargs,
            plugins=plugins,
            observers=[*observers, *callbacks],
            listeners=listeners,
            models=models,
            allowed_models=allowed_models,
            tracer_provider=tracer_provider,
            trace_content=trace_content,
            record_content=record_content,
            limiter=limiter,
            max_depth=max_depth,
            max_iterations=max_iterations,
            max_timeout=max_timeout,
            max_tokens=max_tokens,
            max_budget=max_budget,
            max_errors=max_errors,
            max_concurrent_subcalls=max_concurrent_subcalls,
            batch_max_concurrent=batch_max_concurrent,
            on_limit=on_limit,
            hedge=hedge,
        )
        self.backend = backend
        self.environment = environment
        self.env_factory = self.engine.host.lookup("environments", environment)
        check_environment_kwargs(self.env_factory, environment, environment_kwargs)
        tools = normalise_tools(custom_tools, "custom_tools")
        sub_tools = (
            tools
            if custom_sub_tools is None
            else normalise_tools(custom_sub_tools, "custom_sub_tools")
        )
        strategy = compaction_strategy(self.engine.host, compaction, compaction_kwargs)
        self._compaction_knobs = _strategy_knobs(strategy)  # its settings, as it was made
        self.settings = LoopSettings(
            environment=environment,
            environment_kwargs=dict(environment_kwargs or {}),
            tools=tools,
            sub_tools=sub_tools,
            custom_system_prompt=custom_system_prompt,
            tool_prompts=check_tool_prompts(tool_prompts),
            tool_code=check_tool_code(tool_code),
            accept_text_final=accept_text_final,
            output_chars=output_chars,
            compaction=strategy,
            compaction_threshold_pct=compaction_threshold_pct,
            root_params=sampling_params(sampling_args, "sampling_args"),
            sub_params=sampling_params(
                sub_sampling_args if sub_sampling_args is not None else sampling_args,
                "sub_sampling_args",
            ),
        )
        self.persistent = persistent
        if journal is not None and not isinstance(journal, str | os.PathLike):
            raise ConfigError(
                f"journal must be a file path such as 'run.sqlite', not {type(journal).__name__}"
            )
        self.journal = journal
        self.direct_share = direct_share if direct_if_fits else None
        # A persistent session is one conversation: one completion at a time.
        self._session = PersistentSession(self.env_factory, self.settings) if persistent else None

    @property
    def limits(self) -> Any:
        return self.engine.limits

    # -- running ------------------------------------------------------------------------

    def completion(
        self,
        prompt: Any,
        root_prompt: str | None = None,
        *,
        schema: Any = None,
        limits: Mapping[str, Any] | None = None,
        journal_key: str | None = None,
    ) -> RLMChatCompletion:
        """Answer ``root_prompt`` over the context ``prompt`` (str, list or dict).

        Runs its own trio loop; from trio code use `acompletion`.

        Args:
            prompt: the context, put in the REPL as ``context``.
            root_prompt: the question (None: the task is stated in the context).
            schema: the answer's shape (a pydantic model, a dataclass, a type such as
                ``list[str]``, or a JSON Schema dict): the root model is told it, its
                answer is validated (a mismatch goes back to it as the block's error),
                ``result.parsed`` is the typed value and ``result.response`` its JSON.
            limits: this RLM's limits overridden for this completion only
                (``{"max_iterations": 5, "max_budget": 0.5}``).
            journal_key: with ``journal=``, what tells this completion apart from others
                with the same inputs, which would replay its record (a sample's number
                when asking the same question several times; ``rlm-graph batch`` passes
                each item's id).

        Raises:
            ConfigError: a context, question or schema that cannot work.
            LimitExceeded: a limit stopped the run and ``on_limit="raise"``.
            ProviderError: the root model could not be called.
        """
        return run_sync(
            self._sync_completion,
            prompt,
            root_prompt,
            schema,
            (),
            limits,
            journal_key,
            sync_name="RLM.completion",
            async_name="rlm.acompletion",
        )

    def stream(
        self,
        prompt: Any,
        root_prompt: str | None = None,
        *,
        schema: Any = None,
        limits: Mapping[str, Any] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        journal_key: str | None = None,
    ) -> EventStream[RLMChatCompletion]:
        """Run a completion in the background and iterate over its events (sync code).

        ``for event in rlm.stream(context, root_prompt=q): ...``. Events come while the
        run goes on; the last is ``run_finished``, whose ``result`` is the
        `RLMChatCompletion` (also on ``stream.result`` afterwards). If the run raises,
        iteration raises the same error after ``run_finished``. Closing the stream early
        (the end of a ``with`` block, or ``stream.close()``) cancels the run. The run never
        waits for the consumer: at most ``capacity`` events wait in memory, the rest on
        disk (see docs/observing.md). ``schema``, ``limits`` and ``journal_key`` as for
        `completion`.
        """
        return EventStream(
            lambda listener: self._sync_completion(
                prompt, root_prompt, schema, (listener,), limits, journal_key
            ),
            capacity=capacity,
            sync_name="RLM.stream",
            async_name="rlm.astream",
        )

    def astream(
        self,
        prompt: Any,
        root_prompt: str | None = None,
        *,
        schema: Any = None,
        limits: Mapping[str, Any] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        journal_key: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncEventStream[RLMChatCompletion]]:
        """`stream` for trio code: ``async with rlm.astream(ctx) as events: async for e in events``.

        The run is a task of the block: leaving it early cancels the run.
        """
        return open_event_stream(
            lambda listener: self._acompletion(
                prompt, root_prompt, schema, (listener,), limits, journal_key
            ),
            capacity=capacity,
        )

    async def _sync_completion(
        self,
        prompt: Any,
        root_prompt: str | None,
        schema: Any,
        listeners: Iterable[Listener] = (),
        limits: Mapping[str, Any] | None = None,
        journal_key: str | None = None,
    ) -> RLMChatCompletion:
        try:
            return await self._acompletion(
                prompt, root_prompt, schema, listeners, limits, journal_key
            )
        finally:
            with trio.CancelScope(shield=True):
                await self.engine.aclose()

    async def acompletion(
        self,
        prompt: Any,
        root_prompt: str | None = None,
        *,
        schema: Any = None,
        limits: Mapping[str, Any] | None = None,
        journal_key: str | None = None,
    ) -> RLMChatCompletion:
        """`completion` for async callers.

        Under trio it runs in the caller's loop. Under asyncio it runs on rlm-graph's trio
        thread (see `rlm_graph.doors.aio`); cancelling the awaiting task cancels the run.
        ``limits`` overrides this RLM's limits for this completion only
        (``{"max_iterations": 5}``; a batch item's own limits come this way).
        """
        if running_under_asyncio():
            return await call_from_asyncio(
                self._acompletion, prompt, root_prompt, schema, (), limits, journal_key
            )
        return await self._acompletion(prompt, root_prompt, schema, (), limits, journal_key)

    async def _acompletion(
        self,
        prompt: Any,
        root_prompt: str | None,
        schema: Any,
        listeners: Iterable[Listener],
        limits: Mapping[str, Any] | None = None,
        journal_key: str | None = None,
    ) -> RLMChatCompletion:
        """One completion; a persistent session refuses a second one running at once.

        Raises:
            ConfigError: ``persistent=True`` and this RLM is already running a completion
                (in another thread or task): a session's turns must come one at a time.
        """
        args = (prompt, root_prompt, schema, listeners, limits, journal_key)
        if self._session is None:
            return await self._complete(*args)
        with self._session.claim():
            return await self._complete(*args)

    async def _complete(
        self,
        prompt: Any,
        root_prompt: str | None,
        schema: Any,
        listeners: Iterable[Listener],
        limits: Mapping[str, Any] | None = None,
        journal_key: str | None = None,
    ) -> RLMChatCompletion:
        if not isinstance(prompt, str | list | dict):
            raise ConfigError(
                f"the context (prompt) must be a str, list or dict, not {type(prompt).__name__}"
            )
        if root_prompt is not None and not isinstance(root_prompt, str):
            raise ConfigError(f"root_prompt must be a str, not {type(root_prompt).__name__}")
        if journal_key is not None and not isinstance(journal_key, str):
            raise ConfigError(f"journal_key must be a str, not {type(journal_key).__name__}")
        settings = self.settings
        if schema is not None:
            settings = dataclasses.replace(settings, schema=AnswerSchema.of(schema))
        started = time.perf_counter()
        overrides = {} if limits is None else limits
        run = self.engine.new_run(self.engine.limits_with(overrides), listeners=listeners)
        journal = None
        if self.journal is not None:
            number = self._session.completions if self._session is not None else 0
            inputs = {"context": prompt, "root_prompt": root_prompt, "completion": number}
            if journal_key is not None:  # absent otherwise: older journals' keys hold
                inputs["journal_key"] = journal_key
            journal = _completion_journal(
                self.journal, run, settings, self.environment, inputs, self._compaction_knobs
            )
        operation = CompletionRun(
            RLMRunner(run, settings, self.env_factory),
            prompt,
            root_prompt,
            root_model=self.engine.provider.model,
            journal=journal,
            direct_share=self.direct_share,
            session=self._session,
            started=started,
        )
        return await run_lifecycle(run, operation, flush=self.engine.flush_spans)

    # -- closing ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the persistent REPL (if any) and the providers' connections."""
        if running_under_asyncio():
            return await call_from_asyncio(self.aclose)
        if self._session is not None:
            await self._session.aclose()
        await self.engine.aclose()

    def close(self) -> None:
        run_sync(self.aclose, sync_name="RLM.close", async_name="rlm.aclose")
        run_on_trio_thread(self.engine.aclose)  # the connections asyncio callers opened

    def __enter__(self) -> RLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_TIME_CUTS = frozenset({"timeout", "cpu_seconds", "start_timeout", "close_grace"})


def _strategy_knobs(strategy: object) -> dict[str, Any]:
    """A compaction strategy's settings for the run key: the plain values (numbers,
    strings, booleans) it holds, when the `RLM` is made, under the names its constructor
    takes (``target_pct``, or ``_target_pct`` for one kept private). Not what it counts as
    it works (a shared strategy's compactions), nor what differs in every process."""
    plain = (str, int, float, bool, type(None))
    held = getattr(strategy, "__dict__", None) or {}
    try:
        taken = set(inspect.signature(type(strategy)).parameters)
    except (TypeError, ValueError):  # no signature to read
        return {}
    return {
        k: v for k, v in sorted(held.items()) if k.lstrip("_") in taken and isinstance(v, plain)
    }


def _completion_journal(
    path: Any,
    run: Run,
    settings: LoopSettings,
    environment: str,
    inputs: dict[str, Any],
    knobs: dict[str, Any],
) -> JournalTarget:
    """Where a completion is journaled: its run key is its ``inputs`` (context, question,
    its place in a persistent session, its ``journal_key``) and its configuration
    (``knobs``: the compaction strategy's settings, `_strategy_knobs`)."""
    configuration = [
        [provider_identity(key, provider) for key, provider in run.router.providers],
        run.limits.max_depth,
        run.limits.max_iterations,
        environment,
        settings.custom_system_prompt,
        settings.root_params,
        settings.sub_params,
        sorted(settings.tools),  # by name: a tool's code or data is in what it changes
        sorted(settings.sub_tools),
        settings.accept_text_final,
        settings.output_chars,
        type(settings.compaction).__name__,
        settings.compaction_threshold_pct,
        repr(getattr(settings, "schema", None)),
    ]
    if settings.tool_prompts or settings.tool_code is not None:  # older journals' keys hold
        configuration += [list(settings.tool_prompts), settings.tool_code]
    # What the model's code may do (read_paths, env, network...): a child answered where
    # it could not read a file is not an answer where it can. Time limits only cut.
    shaping = {k: v for k, v in settings.environment_kwargs.items() if k not in _TIME_CUTS}
    if shaping:  # older journals' keys hold
        configuration.append(["environment_kwargs", stable_value(shaping)])
    if knobs:  # TruncateStrategy(target_pct=0.1) is another history (older keys hold)
        configuration.append(["compaction", knobs])
    question = inputs["root_prompt"]
    label = preview(question if question is not None else inputs["context"], 80)
    if run.redact is not None:  # `journal ls` shows it: no known key in it
        label = run.redact(label)
    return JournalTarget(path, run_key("rlm", inputs, configuration), "rlm", label)
