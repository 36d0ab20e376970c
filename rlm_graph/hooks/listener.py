"""The pluggy observers as one listener of a run's events.

``rlm_node_started``/``rlm_node_finished`` get the node's live record and the run's
graph, as they always have; ``rlm_run_finished`` gets the result of a run that returned
one. A failing observer is logged by the emitter and the run goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..events import NodeFinished, NodeStarted, RunFinished

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["HookListener", "has_observers"]


def has_observers(hook: Any) -> bool:
    """Some plugin implements a ``rlm_node_*`` or ``rlm_run_*`` hook."""
    return any(
        getattr(hook, name).get_hookimpls()
        for name in ("rlm_node_started", "rlm_node_finished", "rlm_run_finished")
    )


class HookListener:
    """Calls the observer hooks of ``hook`` for the events of the run whose graph is ``graph``."""

    __slots__ = ("_graph", "_hook")

    def __init__(self, hook: Any, graph: Graph) -> None:
        self._hook = hook
        self._graph = graph

    def __call__(self, event: Any) -> None:
        if isinstance(event, NodeStarted) and event.node_id is not None:
            self._hook.rlm_node_started(record=self._graph[event.node_id], graph=self._graph)
        elif isinstance(event, NodeFinished) and event.node_id is not None:
            self._hook.rlm_node_finished(record=self._graph[event.node_id], graph=self._graph)
        elif isinstance(event, RunFinished) and event.result is not None:
            self._hook.rlm_run_finished(graph=self._graph, result=event.result)
