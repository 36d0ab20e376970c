"""The scheduler's side of ``llm_query`` and friends, for one completion.

Every environment turns a call of model code into one `SubcallRequest` and hands it to
`CompletionBridge.call` on the trio side (the local environment re-enters trio from its
worker thread; the subprocess environment serves its guest's pipe). That is the one
boundary: what a guest sent is checked there, once (`rlm_graph.protocol.subcalls`:
sizes, images, ``rlm_query`` text; the schema, `AnswerSchema.from_guest`; the model
name), and then becomes nodes of the graph:

    llm_query            -> one ``llm_call`` at depth + 1
    llm_query_batched    -> one ``llm_call`` per prompt, concurrent
    rlm_query            -> one ``rlm_call`` (a child completion), or a plain ``llm_call``
                            when the child would reach ``max_depth``
    rlm_query_batched    -> one of those per prompt, concurrent

Invariants:
    - Nodes issued by a block get a ``spawn`` edge from it, and an ``after`` edge from each
      call of the block that returned before they were issued (of a batch, its last).
    - A failed call is a string ``"[ERROR] <type>: <message>"`` in its slot, never an
      exception in the model's code; cancellation still propagates.
    - Batches run at most ``batch_max_concurrent`` slots at once; the provider limiter
      and the per-depth child limiter bound them further, tree-wide.
    - Model code names only configured models (``model=``): a backend's, or one of
      ``allowed_models``. Any other name, and a schema that is refused, fails every slot
      of the call (each a failed node, for the first `MAX_REFUSED_NODES` of a
      completion) before any request; a call over the size caps is refused whole,
      before any node.
    - A guest's schema is checked, and answers validated against it, in a worker thread
      that the run's deadline abandons: the loop never waits on a validator.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import trio

from ..concurrency.threads import off_the_loop
from ..contracts import Message, ResponseSchema, SubcallRequest
from ..errors import ConfigError, RLMGraphError, error_slot
from ..graph import NodeKind, NodeRecord, preview
from ..journal import value_hash
from ..journal.seam import Journaled, whole_answer
from ..journal.tools import JournaledTool
from ..limits import Tally
from ..protocol.prompts import schema_instructions
from ..protocol.schema import AnswerSchema
from ..protocol.subcalls import (
    MAX_REFUSED_NODES,
    Prompt,
    check_request,
    prompt_parts,
    refused_whole,
)
from .calls import ModelCall, call_model
from .context import Run
from .slots import run_slots

__all__ = ["BridgeProxy", "ChildRunner", "CompletionBridge", "node_path"]


def node_path(completion: str, name: str) -> str:
    """The structural id of node ``name`` of a completion: the root completion's nodes
    are ``turn-1``, ``turn-1/block-2``...; a child's are prefixed by its ``rlm_call`` id."""
    return name if completion == "root" else f"{completion}/{name}"


ChildRunner = Callable[[str, "str | None", NodeRecord, Tally], Awaitable[str]]
"""``runner(prompt, model, rlm_call_record, child_tally) -> answer``: a child, as that node."""


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a call sits in its block: the call's ordinal, and its slot in a batch."""

    ordinal: int
    index: int | None
    size: int | None


@dataclass(eq=False)
class CompletionBridge:
    """Sub-calls of one completion at ``depth``, issued by its current block.

    Attributes:
        run: the run the calls belong to.
        depth, completion: the completion's depth and its id (``"root"`` at the top).
        tally: the completion's tokens and cost.
        run_child: runs an ``rlm_query``'s child completion.
        tools: the custom tools the guest calls by name.
        params: request parameters of every sub-call.
        child_key: what else a child's journal key holds (its tools' code and data).
        block: the block now running (None between blocks).
    """

    run: Run
    _: KW_ONLY
    depth: int
    completion: str
    tally: Tally
    run_child: ChildRunner
    tools: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] | None = None
    child_key: str = ""
    block: str | None = field(default=None, init=False)
    _finished: list[tuple[int, NodeRecord]] = field(default_factory=list, init=False)
    _calls: int = field(default=0, init=False)
    _refusals: int = field(default=0, init=False)  # slots refused for their model or schema

    def begin_block(self, block_id: str) -> None:
        self.block, self._finished, self._calls = block_id, [], 0

    def next_ordinal(self) -> int:
        """The next call's ordinal within the current block (a batch takes one; so does
        a journaled tool's call, `rlm_graph.runtime.replay.JournaledTool`)."""
        self._calls += 1
        return self._calls

    def _take_finished(self) -> list[str]:
        """The calls returned since the last was issued; of a batch, the last to return
        (one edge from each slot made a batch after a batch B x B edges)."""
        calls: dict[int, list[NodeRecord]] = {}
        for ordinal, record in self._finished:
            calls.setdefault(ordinal, []).append(record)
        self._finished, journal = [], self.run.journal
        held = (journal.holding_back(c) if journal else c[-1:] for c in calls.values())
        return [record.id for records in held for record in records]

    @property
    def can_recurse(self) -> bool:
        return self.depth + 1 < self.run.limits.max_depth

    # -- the one door ------------------------------------------------------------------

    async def call(self, request: SubcallRequest) -> Any:
        """The answer of one ``llm_query``/``llm_query_batched``/``rlm_query``/
        ``rlm_query_batched`` call of model code (see the module's docstring): one value,
        or a list in input order; every failure is an ``"[ERROR] ..."`` slot."""
        try:
            check_request(request)
        except ConfigError as exc:  # refused whole: the guest's data is all it costs
            return refused_whole(request, exc)
        refusal: ConfigError | None = None
        shape = None
        try:
            self.run.router.check_allowed(request.model, request.fn)
            if request.json_schema is not None and request.fn.startswith("llm"):
                shape = await off_the_loop(AnswerSchema.from_guest, request.json_schema)
        except ConfigError as exc:
            refusal, self._refusals = exc, self._refusals + len(request.prompts)
            if self._refusals > MAX_REFUSED_NODES:  # a guest looping on it: no more nodes
                return refused_whole(request, exc)
        slot = self._slot(request, shape, refusal)
        if request.batched:
            return await self._batch(slot, request.prompts, request.model)
        return await self._one(slot, request.prompts[0], request.model, self._take_finished())

    async def call_tool(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Run a custom tool of the engine's process (for guests in other processes)."""
        try:
            tool = self.tools[name]
        except KeyError:
            raise RLMGraphError(f"no custom tool {name!r}") from None
        if isinstance(tool, JournaledTool):
            call = functools.partial(tool.call, self, tuple(args), dict(kwargs))
        elif inspect.iscoroutinefunction(tool):
            return await tool(*args, **kwargs)
        else:  # a slow synchronous tool must not stall the scheduler
            call = functools.partial(tool, *args, **kwargs)
        # Nor outlive the run: the block's timeout and the run's deadline give it up.
        return await trio.to_thread.run_sync(call, abandon_on_cancel=True)

    # -- plumbing -----------------------------------------------------------------------

    Slot = Callable[[Any, "str | None", list[str], "_Place"], Awaitable[Any]]

    def _slot(
        self, request: SubcallRequest, shape: AnswerSchema | None, refusal: ConfigError | None
    ) -> Slot:
        """What runs one slot of ``request``: a model call (typed by ``shape``), a child,
        or, for a refused call, a node that fails with the reason."""
        kind = NodeKind.LLM_CALL if request.fn.startswith("llm") else NodeKind.RLM_CALL
        if refusal is not None:
            return functools.partial(self._refused, refusal, kind)
        if kind == NodeKind.RLM_CALL:
            return self._rlm
        return self._llm if shape is None else functools.partial(self._llm, shape=shape)

    async def _refused(
        self,
        refusal: ConfigError,
        kind: NodeKind,
        prompt: Any,
        model: str | None,
        after: list[str],
        place: _Place,
    ) -> Any:
        async def body(rec: NodeRecord) -> Any:
            raise refusal

        record = self._record(kind, preview(prompt), place)
        try:
            return await self.run.execute(record, body, after=after, parent=self.block)
        finally:
            self._finished.append((place.ordinal, record))

    async def _one(self, slot: Slot, prompt: Any, model: str | None, after: list[str]) -> Any:
        try:
            return await slot(prompt, model, after, _Place(self.next_ordinal(), None, None))
        except Exception as exc:  # the model sees the failure as data
            return error_slot(exc)

    async def _batch(self, slot: Slot, prompts: Sequence[Any], model: str | None) -> list[Any]:
        after = self._take_finished()
        size = len(prompts)
        ordinal = self.next_ordinal()

        async def one(index: int, prompt: Any) -> Any:
            return await slot(prompt, model, after, _Place(ordinal, index, size))

        return await run_slots(
            list(prompts), one, limit=self.run.limits.batch_max_concurrent, name="batch"
        )

    def _record(self, kind: NodeKind, prompt: str, place: _Place) -> NodeRecord:
        prefix = "llm" if kind == NodeKind.LLM_CALL else "rlm"
        name = f"{prefix}-{place.ordinal}"
        if place.index is not None:
            name += f".{place.index}"
        return NodeRecord.fresh(
            id=f"{self.block}/{name}" if self.block else node_path(self.completion, name),
            kind=kind,
            depth=self.depth + 1,
            completion=self.completion,
            batch_index=place.index,
            batch_size=place.size,
            input_preview=preview(prompt),
        )

    async def _llm(
        self,
        prompt: Prompt,
        model: str | None,
        after: list[str],
        place: _Place,
        shape: AnswerSchema | None = None,
    ) -> Any:
        parts = prompt_parts(prompt)
        message = Message.of_parts("user", parts)
        record = self._record(NodeKind.LLM_CALL, message.content, place)
        wanted = None
        if shape is not None:  # the model is told the shape; the server asked for it
            parts.append(schema_instructions(shape.describe(), repl=False))
            message = Message.of_parts("user", parts)
            wanted = ResponseSchema(name=shape.name, json_schema=shape.json_schema)
        call = ModelCall(
            self.run,
            record,
            [message],
            model=model,
            params=self.params,
            tally=self.tally,
            response_schema=wanted,
        )

        async def body(rec: NodeRecord) -> Any:
            text = (await call_model(call)).content
            if self.run.record_content:
                rec.keep_content(message.content, text)
            if shape is None:
                return text
            return await off_the_loop(shape.parse_text, text)  # a mismatch fails the node

        def typed() -> Journaled[Any]:
            assert shape is not None
            return call.journaled(keep=shape.dump_json, read=shape.parse_text)

        try:
            return await self.run.execute(
                record,
                body,
                after=after,
                parent=self.block,
                journal=call.journaled if shape is None else typed,
            )
        finally:
            self._finished.append((place.ordinal, record))

    async def _rlm(self, prompt: str, model: str | None, after: list[str], place: _Place) -> str:
        if not self.can_recurse:
            return str(await self._llm(prompt, model, after, place))
        record = self._record(NodeKind.RLM_CALL, prompt, place)
        record.model = self.run.router.route(model, record.depth).model
        child_tally = Tally(parent=self.tally)

        async def body(rec: NodeRecord) -> str:
            async with self.run.subcalls(rec.depth):
                rec.began(trio.current_time(), time.time())  # queueing for a slot is not running
                try:
                    answer = await self.run_child(prompt, model, rec, child_tally)
                finally:
                    rec.usage = child_tally.usage
                    rec.cost = child_tally.cost
            rec.output_preview = preview(answer)
            if self.run.record_content:
                rec.keep_content(prompt, answer)
            return answer

        def replayed(rec: NodeRecord) -> None:
            """The whole child, from the journal: its nodes back in the graph, its usage
            in its parent's tally."""
            assert self.run.journal is not None
            self.run.journal.restore_child(rec)
            if rec.usage is not None:
                child_tally.add(rec.usage, rec.cost)

        def journaled() -> Journaled[str]:
            key = value_hash("rlm_call", prompt, model, self.params, self.child_key)
            return Journaled(key, keep=whole_answer, replayed=replayed)

        try:
            return await self.run.execute(
                record, body, after=after, parent=self.block, journal=journaled
            )
        finally:
            self._finished.append((place.ordinal, record))


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

    async def call(self, request: SubcallRequest) -> Any:
        return await self._bridge().call(request)

    async def call_tool(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return await self._bridge().call_tool(name, args, kwargs)
