# mypy: disable-error-code="empty-body"
"""Hook specifications: what a plugin can contribute to, or observe in, the engine.

Families (see docs/plugins.md):
    - ``rlm_register_*`` return things to register (a dict name -> factory). Called once
      when an engine is built. Synchronous and cheap: do I/O in what they return.
    - ``rlm_node_*`` and ``rlm_run_*`` observe a run and return nothing. They are called on
      the scheduler's thread for every node, so they must be quick and must not block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ..contracts import EnvironmentFactory, ModelInfo, ProviderFactory
    from ..graph import Graph, NodeRecord

PROJECT = "rlm_graph"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = ["PROJECT", "HookSpecs", "hookimpl", "hookspec"]


class HookSpecs:
    @hookspec
    def rlm_register_providers(self) -> Mapping[str, ProviderFactory]:
        """Called when an engine is built, to collect provider factories by backend name.

        Returns:
            ``{"name": factory}`` where ``factory(**backend_kwargs)`` returns a `Provider`.
        """

    @hookspec
    def rlm_register_environments(self) -> Mapping[str, EnvironmentFactory]:
        """Called when an engine is built, to collect REPL environment factories by name.

        Returns:
            ``{"name": factory}`` where ``factory(bridge=..., tools=..., **kwargs)`` returns
            an `Environment`.
        """

    @hookspec
    def rlm_register_compaction_strategies(self) -> Mapping[str, Any]:
        """Called when an engine is built, to collect compaction strategies by name.

        Returns:
            ``{"name": factory}`` where ``factory(**kwargs)`` returns a
            `CompactionStrategy`.
        """

    @hookspec
    def rlm_register_models(self) -> Mapping[str, ModelInfo]:
        """Called when an engine is built, to collect context windows and prices by model.

        Returns:
            ``{"model-name": ModelInfo(...)}``; the user's ``models=`` entries win.
        """

    @hookspec
    def rlm_register_executors(self) -> Mapping[str, Any]:
        """Called when a batch starts, to collect batch executors by name.

        Returns:
            ``{"name": factory}`` where ``factory(**executor_kwargs)`` returns an
            `rlm_graph.batch.Executor` (``run(items, rlm_kwargs, concurrency=...)``
            yielding results as they finish).
        """

    @hookspec
    def rlm_register_eval_methods(self) -> Mapping[str, Any]:
        """Called when an evaluation starts (``rlm-graph eval``, `rlm_graph.eval.run_eval`),
        to collect the ways of answering an item by name.

        Returns:
            ``{"name": factory}`` where ``factory()`` returns an
            `rlm_graph.eval.EvalMethod`: the ``RLM(...)`` keywords of its completions
            and a solver that turns an item into calls and a prediction.
        """

    @hookspec
    def rlm_node_started(self, record: NodeRecord, graph: Graph) -> None:
        """Called when a node starts running (its record is ``running``)."""

    @hookspec
    def rlm_node_finished(self, record: NodeRecord, graph: Graph) -> None:
        """Called when a node has finished: ``ok``, ``error`` or ``cancelled``."""

    @hookspec
    def rlm_run_finished(self, graph: Graph, result: Any) -> None:
        """Called when a top-level run (a completion or a workflow) has finished.

        ``result`` is the ``RLMChatCompletion`` or ``WorkflowResult``.
        """
