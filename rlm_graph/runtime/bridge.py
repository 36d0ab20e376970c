"""The scheduler's side of ``llm_query`` and friends, for one completion.

An environment calls these async methods on the trio side (the local environment
re-enters trio from its worker thread; the subprocess environment from its pipe reader).
Each call becomes nodes of the graph:

    llm_query            -> one ``llm_call`` at depth + 1
    llm_query_batched    -> one ``llm_call`` per prompt, concurrent
    rlm_query            -> one ``rlm_call`` (a child completion), or a plain ``llm_call``
                            when the child would reach ``max_depth``
    rlm_query_batched    -> one of those per prompt, concurrent

Invariants:
    - Nodes issued by a block get a ``spawn`` edge from that block; a call issued after
      another call of the same block returned gets an ``after`` edge from it.
    - A failed call is a string ``"[ERROR] <type>: <message>"`` in its slot, never an
      exception in the model's code; cancellation still propagates.
    - Batches run at most ``batch_max_concurrent`` slots at once; the provider limiter
      and the per-depth child limiter bound them further, tree-wide.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import functools
import inspect

import trio

from ..contracts import Message
from ..errors import RLMGraphError, error_slot
from ..graph import NodeKind, NodeRecord, preview
from ..limits import Tally
from .batch import run_batch
from .context import Run
from .providers import call_model

__all__ = ["BridgeProxy", "ChildRunner", "CompletionBridge"]

ChildRunner = Callable[[str, "str | None", NodeRecord, Tally], Awaitable[str]]
"""``runner(prompt, model, rlm_call_record, child_tally) -> answer``: runs a child
completion as the given node."""


class CompletionBridge:
    """Sub-calls of one completion at ``depth``, issued by its current block."""

    def __init__(
        self,
        run: Run,
        *,
        depth: int,
        completion: str,
        tally: Tally,
        run_child: ChildRunner,
        tools: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.run = run
        self.params = params
        self.depth = depth
        self.completion = completion
        self.tally = tally
        self.run_child = run_child
        self.tools = dict(tools or {})
        self.block: str | None = None
        self._finished: list[str] = []

    def begin_block(self, block_id: str) -> None:
        self.block = block_id
        self._finished = []

    def _take_finished(self) -> list[str]:
        after, self._finished = self._finished, []
        return after

    @property
    def can_recurse(self) -> bool:
        return self.depth + 1 < self.run.limits.max_depth

    # -- the four functions -------------------------------------------------------------

    async def llm_query(self, prompt: str, model: str | None = None) -> str:
        return await self._one(self._llm, prompt, model, self._take_finished())

    async def llm_query_batched(self, prompts: Sequence[str], model: str | None = None) -> list[str]:
        return await self._batch(self._llm, prompts, model)

    async def rlm_query(self, prompt: str, model: str | None = None) -> str:
        return await self._one(self._rlm, prompt, model, self._take_finished())

    async def rlm_query_batched(self, prompts: Sequence[str], model: str | None = None) -> list[str]:
        return await self._batch(self._rlm, prompts, model)

    async def call_tool(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Run a custom tool of the engine's process (for guests in other processes)."""
        try:
            tool = self.tools[name]
        except KeyError:
            raise RLMGraphError(f"no custom tool {name!r}") from None
        if inspect.iscoroutinefunction(tool):
            return await tool(*args, **kwargs)
        # A slow synchronous tool must not stall the scheduler.
        return await trio.to_thread.run_sync(functools.partial(tool, *args, **kwargs))

    # -- plumbing -----------------------------------------------------------------------

    Slot = Callable[[str, "str | None", list[str], "int | None", "int | None"], Awaitable[str]]

    async def _one(self, slot: Slot, prompt: str, model: str | None, after: list[str]) -> str:
        try:
            return await slot(prompt, model, after, None, None)
        except Exception as exc:  # the model sees the failure as data
            return error_slot(exc)

    async def _batch(self, slot: Slot, prompts: Sequence[str], model: str | None) -> list[str]:
        after = self._take_finished()
        size = len(prompts)

        async def one(index: int, prompt: str) -> str:
            return await slot(prompt, model, after, index, size)

        return await run_batch(
            list(prompts), one, limit=self.run.limits.batch_max_concurrent, name="batch"
        )

    def _record(self, kind: NodeKind, prompt: str, index: int | None, size: int | None) -> NodeRecord:
        prefix = "llm" if kind == NodeKind.LLM_CALL else "rlm"
        return NodeRecord(
            id=self.run.new_id(prefix),
            kind=kind,
            depth=self.depth + 1,
            completion=self.completion,
            batch_index=index,
            batch_size=size,
            input_preview=preview(prompt),
        )

    async def _llm(
        self, prompt: str, model: str | None, after: list[str], index: int | None, size: int | None
    ) -> str:
        record = self._record(NodeKind.LLM_CALL, prompt, index, size)
        messages = [Message(role="user", content=prompt)]

        async def body(rec: NodeRecord) -> str:
            response = await call_model(
                self.run, rec, messages, model=model, params=self.params, tally=self.tally
            )
            return response.content

        try:
            return await self.run.execute(record, body, after=after, parent=self.block)
        finally:
            self._finished.append(record.id)

    async def _rlm(
        self, prompt: str, model: str | None, after: list[str], index: int | None, size: int | None
    ) -> str:
        if not self.can_recurse:
            return await self._llm(prompt, model, after, index, size)
        record = self._record(NodeKind.RLM_CALL, prompt, index, size)
        child_tally = Tally(parent=self.tally)

        async def body(rec: NodeRecord) -> str:
            async with self.run.limiters.subcalls(rec.depth):
                rec.start = trio.current_time()  # queueing for a slot is not running
                try:
                    answer = await self.run_child(prompt, model, rec, child_tally)
                finally:
                    rec.usage = child_tally.usage
                    rec.cost = child_tally.cost
            rec.output_preview = preview(answer)
            return answer

        try:
            return await self.run.execute(record, body, after=after, parent=self.block)
        finally:
            self._finished.append(record.id)


class BridgeProxy:
    """A bridge whose target changes per completion: a persistent environment outlives
    the completion (and the trio loop) it was made in, so it holds this proxy and the
    engine points it at the current completion's bridge."""

    def __init__(self, target: CompletionBridge | None = None) -> None:
        self.target = target

    def _bridge(self) -> CompletionBridge:
        if self.target is None:
            raise RLMGraphError("this REPL is not attached to a running completion")
        return self.target

    async def llm_query(self, prompt: str, model: str | None = None) -> str:
        return await self._bridge().llm_query(prompt, model)

    async def llm_query_batched(self, prompts: Sequence[str], model: str | None = None) -> list[str]:
        return await self._bridge().llm_query_batched(prompts, model)

    async def rlm_query(self, prompt: str, model: str | None = None) -> str:
        return await self._bridge().rlm_query(prompt, model)

    async def rlm_query_batched(self, prompts: Sequence[str], model: str | None = None) -> list[str]:
        return await self._bridge().rlm_query_batched(prompts, model)

    async def call_tool(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return await self._bridge().call_tool(name, args, kwargs)
