"""The RLM loop: one completion compiled turn by turn into the graph.

    completion -> root_turn -> repl_block -> repl_block -> root_turn -> ...
                                   └─ llm_call / rlm_call (-> child completion ...)

Invariants:
    - Turns are serial, and the blocks of a turn run in order; each is a node with an
      ``after`` edge from the node before it. A child completion's turns also carry a
      ``spawn`` edge from its ``rlm_call`` node.
    - A completion ends when a block sets the answer (``answer["ready"]``, ``FINAL``,
      ``FINAL_VAR``), or, with ``accept_text_final``, when a reply ends in a text
      ``FINAL(...)``; after ``max_iterations`` turns the model is asked once for a final
      answer, and that is the answer (``stop_reason="max_iterations"``).
    - ``max_errors`` consecutive turns whose code failed stop the completion with its
      best partial answer. Tree-wide limits (tokens, budget, deadline) cancel the run's
      scope instead; `CompletionState` keeps what the root had, for the partial answer.
    - With a compaction strategy, a ``compaction`` node may run before a root turn (an
      ``after`` edge from the node before it; the turn follows it). It rewrites
      ``state.messages`` only: ``state.trajectory`` keeps every message of the
      completion, and is put in the REPL variable ``history`` at each compaction. The
      history's size is the last turn's reported usage (input + output tokens) plus the
      chars/4 estimate of what came after it, or the estimate alone where no usage is
      known; a model absent from the model table has `DEFAULT_CONTEXT_WINDOW` tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ..contracts import ChatResponse, Environment, ExecResult, Message
from ..errors import ProviderError, SchemaMismatch
from ..graph import NodeKind, NodeRecord, NodeStatus, preview
from ..journal import value_hash
from ..limits import Tally
from ..protocol import find_code_blocks, find_text_final
from ..protocol.prompts import (
    final_answer_prompt,
    first_user_message,
    format_repl_output,
    no_code_message,
    schema_rejected_note,
    system_prompt,
)
from ..protocol.schema import AnswerSchema
from .bridge import BridgeProxy, CompletionBridge, node_path
from .context import Run
from .direct import OneAnswer, direct_fit, one_call
from .providers import call_model, estimate_tokens
from .replay import JournaledTool, seed_code

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "CompletionOutcome",
    "CompletionState",
    "LoopSettings",
    "RLMRunner",
    "make_environment",
]

DEFAULT_CONTEXT_WINDOW = 128_000
"""The window assumed for a model the model table does not know (see docs/compaction.md)."""

ToolTable = Mapping[str, tuple[Any, "str | None"]]


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """What every completion of one RLM call needs, root and children alike."""

    environment: str
    environment_kwargs: Mapping[str, Any]
    tools: ToolTable
    sub_tools: ToolTable
    custom_system_prompt: str | None = None
    accept_text_final: bool = False
    output_chars: int = 20_000
    compaction: Any = None  # a CompactionStrategy, or None
    compaction_threshold_pct: float = 0.85
    root_params: Mapping[str, Any] | None = None  # request parameters of depth-0 turns
    sub_params: Mapping[str, Any] | None = None  # of sub-calls and children's turns
    schema: AnswerSchema | None = None  # the root's answer shape (completion(schema=...))


@dataclass(slots=True)
class CompletionState:
    """What one completion has so far; read after a cut for the partial answer."""

    messages: list[Message] = field(default_factory=list)
    last_reply: str = ""
    answer_content: str = ""
    iterations: int = 0
    consecutive_errors: int = 0
    trajectory: list[Message] = field(default_factory=list)
    counted_tokens: int | None = None  # reported by the last turn, for its messages
    counted_messages: int = 0
    parsed: Any = None  # the typed answer, when the root has a schema and it matched
    schema_error: str | None = None  # why the last answer was refused, if it was
    direct: str | None = None  # whether the direct path was taken, and why

    def partial(self) -> str:
        """The best partial answer: ``answer["content"]`` if set, else the last reply."""
        return self.answer_content or self.last_reply

    def add(self, message: Message) -> None:
        """Append to the history the model sees, and to the full trajectory."""
        self.messages.append(message)
        self.trajectory.append(message)

    def history_tokens(self) -> int:
        """The size of ``messages``: reported usage where known, the estimate after it."""
        if self.counted_tokens is None:
            return sum(estimate_tokens(m.content) for m in self.messages)
        later = self.messages[self.counted_messages :]
        return self.counted_tokens + sum(estimate_tokens(m.content) for m in later)


@dataclass(slots=True)
class CompletionOutcome:
    answer: str
    stop_reason: str | None
    state: CompletionState


@dataclass(slots=True)
class _Completion:
    """One completion's fixed facts."""

    depth: int
    completion: str  # "root" or the id of the rlm_call node
    parent: str | None  # the rlm_call node, for children
    model: str | None
    tally: Tally
    bridge: CompletionBridge
    env: Environment


class RLMRunner:
    """Runs the root completion of one call, and every child it spawns, in ``run``."""

    def __init__(self, run: Run, settings: LoopSettings, env_factory: Any) -> None:
        self.run = run
        self.settings = settings
        self.env_factory = env_factory

    # -- entry points -------------------------------------------------------------------

    async def root(
        self,
        context: Any,
        root_prompt: str | None,
        state: CompletionState,
        tally: Tally,
        *,
        env: Environment | None = None,
        proxy: BridgeProxy | None = None,
        index: int = 0,
        histories: int = 0,
    ) -> CompletionOutcome:
        """The top-level completion; a persistent session passes its ``env`` and ``proxy``."""
        bridge = self._bridge(0, "root", tally, self.settings.tools)
        if env is None:
            async with self._environment(bridge, self.settings.tools, 0, context) as fresh:
                return await self._complete(
                    _Completion(0, "root", None, None, tally, bridge, fresh),
                    context, root_prompt, state, index=0, histories=0,
                )
        assert proxy is not None
        proxy.target = bridge
        try:
            return await self._complete(
                _Completion(0, "root", None, None, tally, bridge, env),
                context, root_prompt, state, index=index, histories=histories,
            )
        finally:
            proxy.target = None

    async def plain(
        self, context: Any, root_prompt: str | None, state: CompletionState, tally: Tally
    ) -> CompletionOutcome:
        """``max_depth=0``: no REPL at all, one call of the root model (as the reference)."""
        answer = await self._one_call(context, root_prompt, state, tally, "llm-1", None)
        return CompletionOutcome(answer.text, None, state)

    async def direct(
        self, context: Any, root_prompt: str | None, state: CompletionState, tally: Tally,
        share: float,
    ) -> CompletionOutcome | None:
        """The direct path: one call when question and context fit ``share`` of the root
        model's window (see `direct_fit`); None when not taken, or when its answer did
        not match the schema (the RLM loop then answers). ``state.direct`` says why."""
        model = self.run.router.route(None, 0)[2]
        info = self.run.router.info(model)
        fit = direct_fit(
            context, root_prompt, model=model, share=share,
            window=info.context_window if info is not None else None,
        )
        state.direct = ("taken: " if fit.taken else "not taken: ") + fit.reason
        if not fit.taken:
            return None
        answer = await self._one_call(context, root_prompt, state, tally, "direct", fit.reason)
        if answer.refused is not None:
            state.direct = f"taken, then handed to the RLM loop: {answer.refused}"
            state.messages = []
            return None
        return CompletionOutcome(answer.text, None, state)

    async def _one_call(
        self, context: Any, root_prompt: str | None, state: CompletionState, tally: Tally,
        node_id: str, note: str | None,
    ) -> OneAnswer:
        answer = await one_call(
            self.run, context, root_prompt, state.messages, tally, node_id=node_id,
            params=self.settings.root_params, schema=self.settings.schema, note=note,
        )
        state.trajectory.append(state.messages[-1])
        state.last_reply = answer.text
        state.parsed, state.schema_error = answer.parsed, answer.refused
        return answer

    async def child(self, prompt: str, model: str | None, record: NodeRecord, tally: Tally) -> str:
        """A child completion, run as the ``rlm_call`` node ``record`` (a `ChildRunner`)."""
        tools = self.settings.sub_tools
        bridge = self._bridge(record.depth, record.id, tally, tools)
        async with self._environment(bridge, tools, record.depth, prompt) as env:
            done = _Completion(record.depth, record.id, record.id, model, tally, bridge, env)
            outcome = await self._complete(done, prompt, None, CompletionState())
        if outcome.stop_reason == "max_errors":
            return f"[INCOMPLETE: the child stopped after repeated code errors] {outcome.answer}"
        return outcome.answer

    # -- set-up -------------------------------------------------------------------------

    def _bridge(self, depth: int, completion: str, tally: Tally, tools: ToolTable) -> CompletionBridge:
        return CompletionBridge(
            self.run,
            depth=depth,
            completion=completion,
            tally=tally,
            run_child=self.child,
            tools={name: value for name, (value, _) in tools.items() if callable(value)},
            params=self.settings.sub_params,
        )

    def _environment(self, bridge: CompletionBridge, tools: ToolTable, depth: int, context: Any) -> Any:
        return _EnvironmentScope(self.env_factory, bridge, tools, depth, context, self.settings)

    # -- the loop -----------------------------------------------------------------------

    async def _complete(
        self,
        c: _Completion,
        context: Any,
        root_prompt: str | None,
        state: CompletionState,
        *,
        index: int = 0,
        histories: int = 0,
    ) -> CompletionOutcome:
        limits = self.run.limits
        tools = self.settings.tools if c.depth == 0 else self.settings.sub_tools
        schema = self._schema(c)
        state.messages = []
        for message in (
            Message(
                role="system",
                content=system_prompt(
                    custom=self.settings.custom_system_prompt,
                    tools=tools,
                    can_recurse=c.bridge.can_recurse,
                    output_chars=self.settings.output_chars,
                ),
            ),
            Message(
                role="user",
                content=first_user_message(
                    context, root_prompt, index=index, histories=histories,
                    max_iterations=limits.max_iterations,
                    schema=schema.describe() if schema is not None else None,
                ),
            ),
        ):
            state.add(message)
        previous: str | None = None
        for iteration in range(1, limits.max_iterations + 1):
            state.iterations = iteration
            previous = await self._compact(c, state, iteration, previous)
            reply, previous = await self._turn(c, state, iteration, previous)
            final, previous = await self._run_blocks(c, state, iteration, reply, previous)
            if final is not None:
                return CompletionOutcome(final, None, state)
            if limits.max_errors is not None and state.consecutive_errors >= limits.max_errors:
                return CompletionOutcome(state.partial(), "max_errors", state)
        previous = await self._compact(c, state, limits.max_iterations + 1, previous)
        state.add(
            Message(
                role="user",
                content=final_answer_prompt(limits.max_iterations, typed=schema is not None),
            )
        )
        reply, _ = await self._turn(c, state, limits.max_iterations + 1, previous)
        if schema is not None:
            try:
                return CompletionOutcome(self._accept(schema, state, reply), "max_iterations", state)
            except SchemaMismatch as exc:
                state.schema_error = f"SchemaMismatch: {exc}"
        return CompletionOutcome(reply, "max_iterations", state)

    def _schema(self, c: _Completion) -> AnswerSchema | None:
        """The answer schema of completion ``c``: the root's only (children answer text)."""
        return self.settings.schema if c.depth == 0 else None

    @staticmethod
    def _accept(schema: AnswerSchema, state: CompletionState, text: str) -> str:
        """Validate a typed answer; keep the value on ``state`` and return its JSON.

        Raises:
            SchemaMismatch: the answer does not match.
        """
        state.parsed = schema.parse_text(text)
        state.schema_error = None
        return schema.dump_json(state.parsed)

    async def _check_final(
        self, c: _Completion, state: CompletionState, result: ExecResult
    ) -> ExecResult:
        """A block's final answer, checked against the schema: a mismatch is the block's
        error (shown to the model next turn), and ``answer`` is reset in the REPL."""
        schema = self._schema(c)
        if schema is None or result.final_answer is None:
            return result
        try:
            text = self._accept(schema, state, result.final_json or result.final_answer)
        except SchemaMismatch as exc:
            state.schema_error = f"SchemaMismatch: {exc}"
            await c.env.reset_answer()
            return result.model_copy(
                update={
                    "final_answer": None,
                    "final_json": None,
                    "error": state.schema_error,
                    "stderr": result.stderr + schema_rejected_note(str(exc)),
                }
            )
        return result.model_copy(update={"final_answer": text})

    def _record(
        self, c: _Completion, kind: NodeKind, name: str, iteration: int, preview_: str = ""
    ) -> NodeRecord:
        """A new node of completion ``c`` (not yet in the graph: `Run.execute` adds it).

        Its id is structural (see docs/architecture.md): the completion's path, then
        ``name`` (``turn-3``, ``turn-3/block-2``, ``compaction-3``), so the same work has
        the same id in a re-run, whatever finished first.
        """
        return NodeRecord(
            id=node_path(c.completion, name),
            kind=kind,
            depth=c.depth,
            completion=c.completion,
            iteration=iteration,
            input_preview=preview_,
        )

    async def _turn(
        self, c: _Completion, state: CompletionState, iteration: int, previous: str | None
    ) -> tuple[str, str]:
        record = self._record(c, NodeKind.ROOT_TURN, f"turn-{iteration}", iteration)
        messages = list(state.messages)

        async def body(rec: NodeRecord) -> str:
            params = self.settings.root_params if c.depth == 0 else self.settings.sub_params
            response = await call_model(
                self.run, rec, messages, model=c.model, params=params, tally=c.tally
            )
            return response.content

        reply = await self.run.execute(
            record, body, after=[previous] if previous else [], parent=c.parent
        )
        state.last_reply = reply
        state.add(Message(role="assistant", content=reply))
        if record.usage is not None and record.usage.total_tokens:
            state.counted_tokens = record.usage.total_tokens
            state.counted_messages = len(state.messages)
        return reply, record.id

    async def _compact(
        self, c: _Completion, state: CompletionState, iteration: int, previous: str | None
    ) -> str | None:
        """Run the compaction strategy as a ``compaction`` node if it asks to; returns the
        node the next turn follows."""
        strategy = self.settings.compaction
        if strategy is None:
            return previous
        model = self.run.router.route(c.model, c.depth)[2]
        info = self.run.router.info(model)
        window = info.context_window if info and info.context_window else DEFAULT_CONTEXT_WINDOW
        tokens = state.history_tokens()
        messages = list(state.messages)
        if not strategy.should_compact(
            messages, tokens=tokens, context_window=window,
            threshold_pct=self.settings.compaction_threshold_pct,
        ):
            return previous
        record = self._record(
            c, NodeKind.COMPACTION, f"compaction-{iteration}", iteration,
            f"{len(messages)} messages, ~{tokens:,} of {window:,} tokens",
        )

        async def body(rec: NodeRecord) -> list[Message]:
            call = _CompactionCall(self.run, rec, c, model, window)
            rewritten = list(await strategy.compact(messages, call))
            rec.output_preview = f"{len(messages)} -> {len(rewritten)} messages"
            tools = self.settings.tools if c.depth == 0 else self.settings.sub_tools
            if "history" not in tools:  # a user's tool of that name wins
                await c.env.set_variable("history", [m.model_dump() for m in state.trajectory])
            return rewritten

        try:
            state.messages = await self.run.execute(
                record, body, after=[previous] if previous else [], parent=c.parent
            )
        except ProviderError:  # recorded on the node; the turn goes on uncompacted
            return record.id
        state.counted_tokens = None
        return record.id

    async def _run_blocks(
        self, c: _Completion, state: CompletionState, iteration: int, reply: str, previous: str
    ) -> tuple[str | None, str]:
        limits = self.run.limits
        codes = find_code_blocks(reply)
        text_final = find_text_final(reply) if self.settings.accept_text_final else None
        if not codes and text_final is None:
            state.add(Message(role="user", content=no_code_message(iteration, limits.max_iterations)))
            return None, previous
        turn_id = previous
        results: list[ExecResult] = []
        final: str | None = None
        for number, code in enumerate(codes, start=1):
            result, previous = await self._block(
                c, state, iteration, code, previous, turn_id, number
            )
            results.append(result)
            state.answer_content = result.answer_content or state.answer_content
            if result.final_answer is not None:
                final = result.final_answer
                break
        if final is None and text_final is not None:
            final, previous = await self._text_final(
                c, state, iteration, text_final, previous, turn_id, len(results) + 1
            )
        failed = any(not r.ok for r in results)
        state.consecutive_errors = state.consecutive_errors + 1 if failed else 0
        if results:
            state.add(
                Message(
                    role="user",
                    content=format_repl_output(
                        results, limit=self.settings.output_chars, turn=iteration,
                        max_iterations=limits.max_iterations,
                    ),
                )
            )
        return final, previous

    async def _block(
        self,
        c: _Completion,
        state: CompletionState,
        iteration: int,
        code: str,
        previous: str,
        turn_id: str,
        number: int,
    ) -> tuple[ExecResult, str]:
        record = self._record(
            c, NodeKind.REPL_BLOCK, f"turn-{iteration}/block-{number}", iteration, preview(code)
        )

        journal = self.run.journal

        async def body(rec: NodeRecord) -> ExecResult:
            c.bridge.begin_block(rec.id)
            if journal is not None:
                # Replayed blocks re-run: the same seed makes `random` draw the same.
                await c.env.execute(seed_code(journal.key, rec.id))
            result = await self._check_final(c, state, await c.env.execute(code))
            rec.output_preview = preview(result.stdout or result.stderr)
            if not result.ok:
                rec.status = NodeStatus.ERROR
                rec.error = result.error or "the block timed out"
                rec.error_type = (result.error or "Timeout").split(":", 1)[0]
            if journal is not None:
                journal.record(rec, value_hash("repl_block", code), None)
            return result

        try:
            result = await self.run.execute(record, body, after=[previous], span_parent=turn_id)
        except BaseException:  # cut by a limit or a cancel (possibly inside a group)
            await _salvage_answer(c.env, state)
            raise
        return result, record.id

    async def _text_final(
        self,
        c: _Completion,
        state: CompletionState,
        iteration: int,
        found: Any,
        previous: str,
        turn_id: str,
        number: int,
    ) -> tuple[str | None, str]:
        if found.kind == "FINAL":
            schema = self._schema(c)
            if schema is None:
                return found.value, previous
            try:
                return self._accept(schema, state, found.value), previous
            except SchemaMismatch as exc:
                state.schema_error = f"SchemaMismatch: {exc}"
                state.add(Message(role="user", content=schema_rejected_note(str(exc))))
                return None, previous
        result, previous = await self._block(
            c, state, iteration, f"FINAL_VAR({found.value!r})", previous, turn_id, number
        )
        return result.final_answer, previous


class _CompactionCall:
    """The `CompactionContext` a strategy gets: root-model calls on the compaction node."""

    def __init__(self, run: Run, record: NodeRecord, c: _Completion, model: str, window: int) -> None:
        self.run = run
        self.record = record
        self.completion = c
        self.model = model
        self.context_window = window

    async def complete(self, messages: Sequence[Message]) -> ChatResponse:
        before, cost = self.record.usage, self.record.cost
        response = await call_model(
            self.run, self.record, messages, model=self.completion.model,
            tally=self.completion.tally,
        )
        if before is not None and self.record.usage is not None:  # a second call adds up
            self.record.usage = before + self.record.usage
            if cost is not None:
                self.record.cost = cost + (self.record.cost or 0.0)
        return response


async def _salvage_answer(env: Environment, state: CompletionState) -> None:
    """Keep ``answer["content"]`` of a block that is being cut, for the partial answer."""
    with trio.move_on_after(1) as scope:
        scope.shield = True
        content = await env.answer_content()
        if content:
            state.answer_content = content


def make_environment(
    factory: Any, settings: LoopSettings, bridge: Any, tools: ToolTable, depth: int
) -> Environment:
    """An environment for one completion (or a persistent session), not yet started."""
    bound = {
        name: (value.bind(bridge), text) if isinstance(value, JournaledTool) else (value, text)
        for name, (value, text) in tools.items()
    }
    env: Environment = factory(
        bridge=bridge, tools=bound, depth=depth, **dict(settings.environment_kwargs)
    )
    return env


class _EnvironmentScope:
    """``async with``: make, start, load and always close a completion's environment."""

    def __init__(
        self, factory: Any, bridge: CompletionBridge, tools: ToolTable, depth: int,
        context: Any, settings: LoopSettings,
    ) -> None:
        self.factory = factory
        self.bridge = bridge
        self.tools = tools
        self.depth = depth
        self.context = context
        self.settings = settings
        self.env: Environment | None = None

    async def __aenter__(self) -> Environment:
        self.env = make_environment(
            self.factory, self.settings, self.bridge, self.tools, self.depth
        )
        try:
            await self.env.start()
            await self.env.add_context(self.context, 0)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.env.aclose()
            raise
        return self.env

    async def __aexit__(self, *exc: object) -> None:
        if self.env is not None:
            with trio.CancelScope(shield=True):
                await self.env.aclose()
            self.bridge.run.leaked_threads += getattr(self.env, "leaked_threads", 0)
