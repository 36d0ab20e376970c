"""A completion as a run's `Operation`: the RLM loop's answer, inside the run lifecycle.

`CompletionRun` hands the lifecycle (`rlm_graph.runtime.lifecycle`) what is particular to
a completion: its body (`RLMRunner.answer`), the answer its journal keeps, its result
(`RLMChatCompletion`, the reference's shape plus the graph), the partial result a
provider's failure carries, and the limit error ``on_limit="raise"`` raises.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar, Literal

from ..errors import LIMIT_ERRORS, LimitExceeded, ProviderError
from ..journal.seam import JournalTarget
from ..limits import Tally
from ..protocol.state import CompletionOutcome, CompletionState
from ..result import RLMChatCompletion, UsageSummary
from .context import Run
from .loop import RLMRunner
from .session import PersistentSession

__all__ = ["CompletionRun"]


@dataclass(eq=False)
class CompletionRun:
    """One completion of ``context`` (and ``root_prompt``) by ``runner``.

    Attributes:
        runner: the RLM loop of this run.
        context, root_prompt: what the completion answers.
        root_model: the main backend's model (the result names it).
        journal: where the completion is journaled, or None.
        direct_share: the direct path's share of the window, or None (off).
        session: the persistent session whose REPL the completion runs in, or None.
        started: when the completion was asked for (``time.perf_counter()``).
    """

    kind: ClassVar[Literal["completion", "workflow"]] = "completion"
    span_name: ClassVar[str] = "invoke_agent rlm"
    span_attributes: ClassVar[Mapping[str, Any]] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "rlm",
        "rlm.depth": 0,
    }

    runner: RLMRunner
    context: Any
    root_prompt: str | None
    _: KW_ONLY
    root_model: str
    journal: JournalTarget | None = None
    direct_share: float | None = None
    session: PersistentSession | None = None
    started: float = field(default_factory=time.perf_counter)
    state: CompletionState = field(default_factory=CompletionState, init=False)
    outcome: CompletionOutcome | None = field(default=None, init=False)

    async def body(self, run: Run) -> None:
        self.outcome = await self.runner.answer(
            self.context,
            self.root_prompt,
            self.state,
            Tally(),
            direct_share=self.direct_share,
            session=self.session,
        )

    @property
    def stop_reason(self) -> str | None:
        return self.outcome.stop_reason if self.outcome is not None else None

    def answer(self, cut: bool) -> str | None:
        if self.outcome is not None and not cut:
            return self.outcome.answer
        return self.state.partial()

    def result(self, run: Run, stop_reason: str | None, cut: bool) -> RLMChatCompletion:
        cut = cut or self.outcome is None
        response = self.state.partial() if cut or self.outcome is None else self.outcome.answer
        return self._result(run, response, stop_reason, cut)

    def failed(self, run: Run, failure: BaseException) -> None:
        """A provider's failure after some turns has spent tokens and may have most of an
        answer: it carries the partial answer and the usage so far (``.partial``,
        ``.result``)."""
        if isinstance(failure, ProviderError):
            failure.partial = self.state.partial()
            failure.result = self._result(run, failure.partial, "provider_error", True)

    def limit_error(self, result: RLMChatCompletion, reason: str) -> LimitExceeded:
        return LIMIT_ERRORS[reason](
            f"the run was stopped by {reason}; the partial answer is on .partial",
            partial=result.response,
            result=result,
        )

    def _result(
        self, run: Run, response: str, stop_reason: str | None, cut: bool
    ) -> RLMChatCompletion:
        graph, state = run.graph, self.state
        parsed = None if cut else state.parsed
        result = RLMChatCompletion(
            metadata={"direct_path": state.direct} if state.direct is not None else None,
            parsed=parsed,
            error=state.schema_error if parsed is None else None,
            root_model=self.root_model,
            prompt=self.context,
            response=response,
            usage_summary=UsageSummary.from_graph(graph),
            execution_time=time.perf_counter() - self.started,
            stop_reason=stop_reason,
            iterations=state.iterations,
            graph=graph,
        )
        result.leaked_threads = run.leaked_threads
        return result
