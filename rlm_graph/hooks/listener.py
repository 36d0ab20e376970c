"""The pluggy observers as one listener of a run's events.

``rlm_node_started``/``rlm_node_finished`` get the node's live record and the run's
graph, as they always have; ``rlm_run_finished`` gets the result of a run that returned
one. Each observer is called on its own: one that raises is logged, by name, and the
others and the run go on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..events import NodeFinished, NodeStarted, RunFinished

if TYPE_CHECKING:
    import pluggy

    from ..graph import Graph

__all__ = ["HookListener", "has_observers"]

logger = logging.getLogger("rlm_graph")

_HOOKS = ("rlm_node_started", "rlm_node_finished", "rlm_run_finished")


def has_observers(hook: Any) -> bool:
    """Some plugin implements a ``rlm_node_*`` or ``rlm_run_*`` hook."""
    return any(getattr(hook, name).get_hookimpls() for name in _HOOKS)


class HookListener:
    """Calls the observer hooks of ``pm`` for the events of the run whose graph is
    ``graph``, one observer at a time (through pluggy, so its wrappers apply)."""

    __slots__ = ("_callers", "_graph")

    def __init__(self, pm: pluggy.PluginManager, graph: Graph) -> None:
        self._graph = graph
        self._callers: dict[str, list[tuple[str, Any]]] = {}
        for name in _HOOKS:
            plugins = [impl.plugin for impl in getattr(pm.hook, name).get_hookimpls()]
            self._callers[name] = [
                (
                    getattr(plugin, "__name__", None) or type(plugin).__qualname__,
                    pm.subset_hook_caller(name, [p for p in plugins if p is not plugin]),
                )
                for plugin in dict.fromkeys(plugins)
            ]

    def __call__(self, event: Any) -> None:
        if isinstance(event, NodeStarted) and event.node_id is not None:
            self._call("rlm_node_started", event, record=self._graph[event.node_id])
        elif isinstance(event, NodeFinished) and event.node_id is not None:
            self._call("rlm_node_finished", event, record=self._graph[event.node_id])
        elif isinstance(event, RunFinished) and event.result is not None:
            self._call("rlm_run_finished", event, result=event.result)

    def _call(self, hook: str, event: Any, **arguments: Any) -> None:
        for observer, caller in self._callers[hook]:
            try:
                caller(graph=self._graph, **arguments)
            except (
                Exception,
                SystemExit,
            ):  # an observer's bug fails neither the run nor the others
                logger.exception(
                    "the rlm-graph observer %s failed in %s on node %s (event %s)",
                    observer,
                    hook,
                    event.node_id or "-",
                    event.seq,
                )
