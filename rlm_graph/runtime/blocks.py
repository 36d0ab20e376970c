"""The ```` ```repl ```` blocks of one root turn, run in order as they are cut.

While a turn's reply streams in, each block starts as soon as its closing fence has
arrived (`rlm_graph.protocol.fences.BlockCutter`); once the reply is whole, the blocks it
has that were not cut yet (all of them, for a reply that did not stream) follow.

Invariants:
    - Blocks run one at a time, in the reply's order, each an ``after`` edge from the one
      before: the same nodes, edges, outputs and answer as if every block had waited for
      the whole reply. The blocks started early are the first blocks of the whole reply
      (a block is cut only once no later text can change it).
    - A block that sets the final answer is the last to run; blocks after it are skipped,
      as they are without streaming. The reply still streams to its end.
    - A reply that goes on to invent its block's output is stopped there (the sink says
      so) and kept up to that point, streamed or not (`BlockCutter.settled`).
    - The turn's reply is what the blocks were cut from: if a retried attempt's text
      differs from what a started block was cut from, the reply ends after the last
      started block, with a note (`BlockCutter.settled`).
    - If the turn fails for good, or is cut by a limit, the blocks in flight are cancelled
      with it; what blocks that ran did to the REPL stays (docs/rlm.md).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import trio

from ..contracts import Environment, ExecResult
from ..graph import NodeRecord, preview
from ..protocol.fences import BlockCutter
from ..protocol.replies import without_note
from ..protocol.state import CompletionState

__all__ = ["BlockRunner", "TurnBlocks", "salvage_answer"]

BlockRunner = Callable[[str, int, str], Awaitable[tuple[ExecResult, str]]]
"""``run(code, number, previous) -> (result, node id)``: one block as a ``repl_block``
node numbered ``number``, after the node ``previous``."""


class TurnBlocks:
    """The blocks of one turn: `feed` is the turn's `TextSink`, `run` runs the blocks
    (a task beside the turn), `finish` hands over the whole reply's blocks.

    Attributes:
        results: each block's result, in order.
        final: the answer a block set, if one did.
        last: the node the next node follows (the last block run, else the turn).
    """

    __slots__ = ("_cutter", "_receive", "_run_block", "_send", "final", "last", "results")

    def __init__(self, run_block: BlockRunner, turn_id: str) -> None:
        self._run_block = run_block
        self._cutter = BlockCutter()
        self._send, self._receive = trio.open_memory_channel[str](math.inf)
        self.results: list[ExecResult] = []
        self.final: str | None = None
        self.last = turn_id

    def feed(self, offset: int, text: str) -> bool:
        """The turn's `TextSink`: a block whose closing fence arrived is queued to run.
        True (stop the generation) once the reply invents its block's output, or a retried
        attempt's text differs from the blocks that ran (the rest would be thrown away)."""
        for code in self._cutter.feed(offset, text):
            try:
                self._send.send_nowait(code)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break  # the runner is gone (the turn is being cancelled)
        return self._cutter.invented is not None or self._cutter.diverged

    def body(self, text: Callable[[NodeRecord], Awaitable[str]]) -> Callable[..., Awaitable[str]]:
        """The turn node's body: ``text`` (the model call), then `settle`, inside the node,
        so that the journal keeps the reply the blocks ran from."""

        async def body(record: NodeRecord) -> str:
            return self.settle(record, await text(record))

        return body

    def settle(self, record: NodeRecord, reply: str) -> str:
        """The reply the turn keeps (`BlockCutter.settled`), noted on its record."""
        settled = self._cutter.settled(without_note(reply, record.note))
        if settled is None:
            return reply
        kept, record.note = settled
        record.output_preview = preview(kept)
        return kept

    def finish(self, codes: list[str]) -> None:
        """The whole reply's blocks (`find_code_blocks` of the settled reply): the ones
        not cut while it streamed are queued after the others; no more come."""
        for code in codes[len(self._cutter.blocks) :]:
            self._send.send_nowait(code)
        self._send.close()

    async def run(self) -> None:
        """Run the blocks as they come, in order, until `finish` (or a final answer)."""
        async with self._receive:
            async for code in self._receive:
                if self.final is not None:
                    continue  # after the answer nothing runs; the rest is drained
                result, self.last = await self._run_block(code, len(self.results) + 1, self.last)
                self.results.append(result)
                if result.final_answer is not None:
                    self.final = result.final_answer


async def salvage_answer(env: Environment, state: CompletionState) -> None:
    """Keep ``answer["content"]`` of a block that is being cut, for the partial answer."""
    with trio.move_on_after(1) as scope:
        scope.shield = True
        content = await env.answer_content()
        if content:
            state.answer_content = content
