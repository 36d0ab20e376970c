"""What a journaled run replayed: `ReplaySummary`, on ``result.replay``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ReplaySummary"]


class ReplaySummary(BaseModel):
    """How a run over a journal went: what came from the journal and what went live.

    Counted nodes are model calls (root turns, sub-calls, compactions), child completions
    (``rlm_call``) and workflow functions; REPL blocks re-run and are not counted. Nodes
    of a child completion replayed as a whole count as replayed too, so ``replayed +
    live + diverged`` is the number of counted nodes in ``result.graph``.

    Attributes:
        run_key: the run's key in the journal (a hash of its inputs and configuration).
        attempt: 1 for a new run, 2 for its first resume, ...
        replayed: nodes answered from the journal, without a request.
        live: nodes with no record, run for real.
        diverged: nodes that had a record but ran live: the first whose request differs
            from its record (``diverged_at``), and every recorded node after it.
        diverged_at: the id of the first diverged node, if any.
        cost_saved: USD the replayed model calls cost when they were recorded.
        tokens_saved: their input + output tokens.
        tools_replayed: calls of journaled custom tools answered from the journal (not
            graph nodes, so not in the counts above).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_key: str
    attempt: int
    replayed: int = 0
    live: int = 0
    diverged: int = 0
    diverged_at: str | None = None
    cost_saved: float = 0.0
    tokens_saved: int = 0
    tools_replayed: int = 0

    @property
    def resumed(self) -> bool:
        """The journal held this run before (an unfinished or a finished attempt)."""
        return self.attempt > 1
