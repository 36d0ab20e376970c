"""The RLM loop: one completion compiled turn by turn into the graph.

    completion -> root_turn -> repl_block -> repl_block -> root_turn -> ...
                                   └─ llm_call / rlm_call (-> child completion ...)

Invariants:
    - Turns are serial, and the blocks of a turn run in order; each is a node with an
      ``after`` edge from the node before it. A child completion's turns also carry a
      ``spawn`` edge from its ``rlm_call`` node. A turn's reply streams where the
      provider can, and each block starts once its closing fence has arrived, while the
      rest is still being written (`rlm_graph.runtime.blocks`): same nodes, edges,
      outputs and answer as when every block waits for the whole reply.
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

from dataclasses import dataclass
from typing import Any

import trio

from ..concurrency.threads import off_the_loop
from ..contracts import (
    Environment,
    ExecResult,
    Message,
)
from ..doors.sync import reraise, single_or_group
from ..errors import ProviderError, SchemaMismatch
from ..graph import NodeKind, NodeRecord, preview
from ..hooks.checks import exec_result
from ..hooks.compaction import asks_to_compact
from ..journal import value_hash
from ..journal.keys import text_hash
from ..journal.seam import INCOMPLETE_CHILD, Journaled
from ..journal.tools import seed_code, tools_key
from ..limits import Tally
from ..protocol import find_code_blocks, find_text_final
from ..protocol.prompts import (
    final_answer_prompt,
    format_repl_output,
    no_code_message,
    opening_messages,
    schema_rejected_note,
)
from ..protocol.replies import without_note
from ..protocol.schema import AnswerSchema
from ..protocol.state import CompletionOutcome, CompletionState, LoopSettings, ToolTable
from .blocks import TurnBlocks, salvage_answer
from .bridge import BridgeProxy, CompletionBridge, node_path
from .calls import ModelCall
from .compaction import DEFAULT_CONTEXT_WINDOW, CompactionNode
from .context import Run
from .direct import OneAnswer, direct_fit, one_call
from .session import PersistentSession, environment_scope

__all__ = ["DEFAULT_CONTEXT_WINDOW", "RLMRunner"]


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
    cache_key: str | None = None  # the same for every turn: their prefix is one


class RLMRunner:
    """Runs the root completion of one call, and every child it spawns, in ``run``."""

    def __init__(self, run: Run, settings: LoopSettings, env_factory: Any) -> None:
        self.run = run
        self.settings = settings
        self.env_factory = env_factory

    # -- entry points -------------------------------------------------------------------

    async def answer(
        self,
        context: Any,
        root_prompt: str | None,
        state: CompletionState,
        tally: Tally,
        *,
        direct_share: float | None = None,
        session: PersistentSession | None = None,
    ) -> CompletionOutcome:
        """The top-level completion, by the first rule that applies: ``max_depth=0`` is
        one plain call (`plain`); with ``direct_share``, the direct path when it is
        taken (`direct`); else the RLM loop, in the persistent ``session``'s REPL or in
        a fresh one (`root`)."""
        if self.run.limits.max_depth == 0:
            return await self.plain(context, root_prompt, state, tally)
        if direct_share is not None:
            answered = await self.direct(context, root_prompt, state, tally, direct_share)
            if answered is not None:
                return answered
        if session is None:
            return await self.root(context, root_prompt, state, tally)
        env, index = await session.begin(context)
        try:
            return await self.root(
                context, root_prompt, state, tally, env=env, proxy=session.proxy, index=index
            )
        finally:  # stopped by a limit or an error too: its context and history stay
            with trio.CancelScope(shield=True):
                await session.end(self.run, state)

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
    ) -> CompletionOutcome:
        """The top-level completion; a persistent session passes its ``env`` and ``proxy``
        (and ``index``: the completion's number in the session, its ``context_N``)."""
        bridge = self._bridge(0, "root", tally, self.settings.tools)
        if env is None:
            async with self._environment(bridge, self.settings.tools, 0, context) as fresh:
                return await self._complete(
                    _Completion(0, "root", None, None, tally, bridge, fresh),
                    context,
                    root_prompt,
                    state,
                )
        assert proxy is not None
        proxy.target = bridge
        try:
            return await self._complete(
                _Completion(0, "root", None, None, tally, bridge, env),
                context,
                root_prompt,
                state,
                index=index,
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
        self,
        context: Any,
        root_prompt: str | None,
        state: CompletionState,
        tally: Tally,
        share: float,
    ) -> CompletionOutcome | None:
        """The direct path: one call when question and context fit ``share`` of the root
        model's window (see `direct_fit`); None when not taken, or when its answer did
        not match the schema (the RLM loop then answers). ``state.direct`` says why."""
        model = self.run.router.route(None, 0).model
        info = self.run.router.info(model)
        fit = direct_fit(
            context,
            root_prompt,
            model=model,
            share=share,
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
        self,
        context: Any,
        root_prompt: str | None,
        state: CompletionState,
        tally: Tally,
        node_id: str,
        note: str | None,
    ) -> OneAnswer:
        answer = await one_call(
            self.run,
            context,
            root_prompt,
            state.messages,
            tally,
            node_id=node_id,
            params=self.settings.root_params,
            schema=self.settings.schema,
            note=note,
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
            return f"{INCOMPLETE_CHILD} {outcome.answer}"
        return outcome.answer

    # -- set-up -------------------------------------------------------------------------

    def _bridge(
        self, depth: int, completion: str, tally: Tally, tools: ToolTable
    ) -> CompletionBridge:
        return CompletionBridge(
            self.run,
            depth=depth,
            completion=completion,
            tally=tally,
            run_child=self.child,
            tools={name: value for name, (value, _) in tools.items() if callable(value)},
            params=self.settings.sub_params,
            child_key=tools_key(self.settings.sub_tools) if self.run.journal is not None else "",
        )

    def _environment(
        self, bridge: CompletionBridge, tools: ToolTable, depth: int, context: Any
    ) -> Any:
        return environment_scope(self.env_factory, self.settings, bridge, tools, depth, context)

    # -- the loop -----------------------------------------------------------------------

    async def _complete(
        self,
        c: _Completion,
        context: Any,
        root_prompt: str | None,
        state: CompletionState,
        *,
        index: int = 0,
    ) -> CompletionOutcome:
        limits = self.run.limits
        self._open(c, context, root_prompt, state, index)
        c.cache_key = "rlm-" + text_hash("cache_key", *(m.content for m in state.messages))[:20]
        previous: str | None = None
        for iteration in range(1, limits.max_iterations + 1):
            state.iterations = iteration
            previous = await self._compact(c, state, iteration, previous)
            final, previous = await self._turn_and_blocks(c, state, iteration, previous)
            if final is not None:
                return CompletionOutcome(final, None, state)
            if limits.max_errors is not None and state.consecutive_errors >= limits.max_errors:
                return CompletionOutcome(state.partial(), "max_errors", state)
        return await self._last_turn(c, state, previous)

    def _open(
        self,
        c: _Completion,
        context: Any,
        root_prompt: str | None,
        state: CompletionState,
        index: int,
    ) -> None:
        """The conversation's start: the system prompt and the first user message (a
        persistent session's completion ``index`` also names its earlier histories)."""
        schema, settings = self._schema(c), self.settings
        state.messages = []
        for message in opening_messages(
            context,
            root_prompt,
            settings=settings,
            tools=settings.tools if c.depth == 0 else settings.sub_tools,
            can_recurse=c.bridge.can_recurse,
            index=index,
            max_iterations=self.run.limits.max_iterations,
            schema=schema.describe() if schema is not None else None,
        ):
            state.add(message)

    async def _last_turn(
        self, c: _Completion, state: CompletionState, previous: str | None
    ) -> CompletionOutcome:
        """After ``max_iterations`` turns: the model is asked once for its final answer,
        and that is the answer (``stop_reason="max_iterations"``)."""
        last = self.run.limits.max_iterations + 1
        schema = self._schema(c)
        previous = await self._compact(c, state, last, previous)
        state.add(
            Message(role="user", content=final_answer_prompt(last - 1, typed=schema is not None))
        )
        reply, _ = await self._turn(c, state, last, previous)
        found = find_text_final(reply) if self.settings.accept_text_final else None
        if found is not None:  # FINAL(...) written as text: its value, as in any turn
            turn_id = node_path(c.completion, f"turn-{last}")
            final, _ = await self._text_final(c, state, last, found, turn_id, turn_id, [])
            if final is not None:
                return CompletionOutcome(final, "max_iterations", state)
        if schema is not None:
            try:
                parsed = await off_the_loop(schema.parse_text, reply)
                return CompletionOutcome(state.accept(schema, parsed), "max_iterations", state)
            except SchemaMismatch as exc:
                state.schema_error = f"SchemaMismatch: {exc}"
        return CompletionOutcome(reply, "max_iterations", state)

    def _schema(self, c: _Completion) -> AnswerSchema | None:
        """The answer schema of completion ``c``: the root's only (children answer text)."""
        return self.settings.schema if c.depth == 0 else None

    async def _check_final(
        self, c: _Completion, state: CompletionState, result: ExecResult
    ) -> ExecResult:
        """The block's answer checked: a schema mismatch is its error, ``answer`` reset."""
        schema, result = self._schema(c), exec_result(c.env, result)  # a plugin's slip named
        if schema is None or result.final_answer is None:
            return result
        try:
            parsed = await off_the_loop(schema.parse_text, result.final_json or result.final_answer)
            text = state.accept(schema, parsed)
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
        return NodeRecord.fresh(
            id=node_path(c.completion, name),
            kind=kind,
            depth=c.depth,
            completion=c.completion,
            iteration=iteration,
            input_preview=preview_,
        )

    async def _turn(
        self,
        c: _Completion,
        state: CompletionState,
        iteration: int,
        previous: str | None,
        blocks: TurnBlocks | None = None,
    ) -> tuple[str, str]:
        """One root turn; with ``blocks``, its reply streams into them as it is written.
        The reply, and its text for the blocks (without the note on a cut-off reply)."""
        record = self._record(c, NodeKind.ROOT_TURN, f"turn-{iteration}", iteration)
        params = self.settings.root_params if c.depth == 0 else self.settings.sub_params
        call = ModelCall(
            self.run,
            record,
            list(state.messages),
            model=c.model,
            params=params,
            tally=c.tally,
            cache_key=c.cache_key,
            stream=True,
            on_text=blocks.feed if blocks is not None else None,
        )

        async def keeping(rec: NodeRecord) -> str:
            reply = await call.text(rec)
            rec.keep_content(state.messages[-1].content, reply)  # what is new, and its reply
            return reply

        text = keeping if self.run.record_content else call.text
        reply = await self.run.execute(
            record,
            text if blocks is None else blocks.body(text),
            after=[previous] if previous else [],
            parent=c.parent,
            journal=call.journaled,
        )
        state.last_reply = reply
        state.add(Message(role="assistant", content=reply))
        if record.usage is not None and record.usage.total_tokens:  # hidden reasoning is
            state.counted_tokens = record.usage.total_tokens - record.usage.reasoning_tokens
            state.counted_messages = len(state.messages)  # never sent again
        return reply, without_note(reply, record.note)

    async def _compact(
        self, c: _Completion, state: CompletionState, iteration: int, previous: str | None
    ) -> str | None:
        """Run the compaction strategy as a ``compaction`` node if it asks to; returns the
        node the next turn follows."""
        strategy = self.settings.compaction
        if strategy is None:
            return previous
        model = self.run.router.route(c.model, c.depth).model
        info = self.run.router.info(model)
        window = info.context_window if info and info.context_window else DEFAULT_CONTEXT_WINDOW
        tokens = state.history_tokens()
        messages = list(state.messages)
        if not asks_to_compact(
            strategy,
            messages,
            tokens=tokens,
            context_window=window,
            threshold_pct=self.settings.compaction_threshold_pct,
        ):
            return previous
        record = self._record(
            c,
            NodeKind.COMPACTION,
            f"compaction-{iteration}",
            iteration,
            f"{len(messages)} messages, ~{tokens:,} of {window:,} tokens",
        )

        params = self.settings.root_params if c.depth == 0 else self.settings.sub_params
        node = CompactionNode(
            self.run, strategy, messages, model, window, c.model, c.tally, params, c.cache_key
        )
        try:
            state.messages = await self.run.execute(
                record,
                node.body,
                after=[previous] if previous else [],
                parent=c.parent,
                journal=node.journaled,
            )
        except ProviderError:  # recorded on the node; the turn goes on uncompacted
            return record.id
        tools = self.settings.tools if c.depth == 0 else self.settings.sub_tools
        if "history" not in tools:  # a user's tool of that name wins
            await c.env.set_variable("history", [m.model_dump() for m in state.trajectory])
        state.counted_tokens = None
        return record.id

    async def _turn_and_blocks(
        self, c: _Completion, state: CompletionState, iteration: int, previous: str | None
    ) -> tuple[str | None, str]:
        """A turn and its blocks: the blocks run beside the turn, each as soon as it is
        cut from the reply (`TurnBlocks`); then what the model is shown next."""
        turn_id = node_path(c.completion, f"turn-{iteration}")

        async def run_block(code: str, number: int, after: str) -> tuple[ExecResult, str]:
            result, ran = await self._block(c, state, iteration, code, after, turn_id, number)
            kept = result.final_answer or result.answer_content  # a limit's cut keeps it
            state.answer_content = kept or state.answer_content
            return result, ran

        blocks = TurnBlocks(run_block, turn_id)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(blocks.run)
                reply, written = await self._turn(c, state, iteration, previous, blocks)
                codes = find_code_blocks(written)
                blocks.finish(codes)
        except BaseExceptionGroup as group:  # the turn's or a block's error, as itself
            error = single_or_group(group)
            if blocks.final is not None and isinstance(error, Exception):
                return blocks.final, blocks.last  # a block gave FINAL: the answer stands
            reraise(error)
        return await self._after_blocks(c, state, iteration, reply, codes, blocks)

    async def _after_blocks(
        self,
        c: _Completion,
        state: CompletionState,
        iteration: int,
        reply: str,
        codes: list[str],
        blocks: TurnBlocks,
    ) -> tuple[str | None, str]:
        limits = self.run.limits
        text_final = find_text_final(reply) if self.settings.accept_text_final else None
        if not codes and text_final is None:
            state.add(
                Message(role="user", content=no_code_message(iteration, limits.max_iterations))
            )
            return None, blocks.last
        turn_id = node_path(c.completion, f"turn-{iteration}")
        results, final, previous = blocks.results, blocks.final, blocks.last
        if final is None and text_final is not None:
            final, previous = await self._text_final(
                c, state, iteration, text_final, previous, turn_id, results
            )
        failed = any(not r.ok for r in results)
        state.consecutive_errors = state.consecutive_errors + 1 if failed else 0
        if results:
            limit, most = self.settings.output_chars, limits.max_iterations
            shown = format_repl_output(results, limit=limit, turn=iteration, max_iterations=most)
            state.add(Message(role="user", content=shown))
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
            if self.run.record_content:
                rec.keep_content(code, result.stdout + result.stderr)
            if not result.ok:
                rec.fail(
                    (result.error or "Timeout").split(":", 1)[0],
                    result.error or "the block timed out",
                )
            return result

        try:
            result = await self.run.execute(
                record,
                body,
                after=[previous],
                span_parent=turn_id,
                # Recorded, never replayed: a block runs again to rebuild the REPL's state.
                # Hashed only when the run has a journal.
                journal=lambda: Journaled(value_hash("repl_block", code), read=None),
            )
        except BaseException:  # cut by a limit or a cancel (possibly inside a group)
            await salvage_answer(c.env, state)
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
        results: list[ExecResult],  # what it says is shown with them (a refusal: failed)
    ) -> tuple[str | None, str]:
        if found.kind == "FINAL":
            schema = self._schema(c)
            if schema is None:
                return found.value, previous
            try:
                parsed = await off_the_loop(schema.parse_text, found.value)
                return state.accept(schema, parsed), previous
            except SchemaMismatch as exc:
                state.schema_error = f"SchemaMismatch: {exc}"
                refused = schema_rejected_note(str(exc))
                results.append(ExecResult(stderr=refused, error=state.schema_error))
                return None, previous
        code, number = f"FINAL_VAR({found.value!r})", len(results) + 1
        result, previous = await self._block(c, state, iteration, code, previous, turn_id, number)
        results.append(result)
        return result.final_answer, previous
