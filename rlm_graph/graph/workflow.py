"""A user's own DAG of model calls and Python functions, built before it runs.

A `Workflow` is a plan: node specs and their dependencies. The runtime's graph executor
turns each spec into a `NodeRecord` in a `Graph` and runs it with the engine's limiters,
observers and tracing (see ``Engine.run``).

Dependency values flow along edges: a node receives its dependencies' results as
positional arguments, in the order they were given. A model call's prompt is a string,
or a function of its dependencies' results that returns one.

Failure semantics (the same as a batch slot in an RLM):
    - a failed ``llm`` node's result is the string ``"[ERROR] <type>: <message>"``, and
      nodes that depend on it still run and see that string;
    - a failed ``function`` node has no result, so nodes that depend on it do not run and
      are recorded as failed with ``error_type="UpstreamFailed"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, GraphError
from .nodes import NodeKind

__all__ = ["NodeRef", "NodeSpec", "Workflow"]


@dataclass(frozen=True, slots=True)
class NodeRef:
    """A handle to a node of a workflow; pass it as a dependency or index a result with it."""

    id: str

    def __str__(self) -> str:
        return self.id


@dataclass(slots=True)
class NodeSpec:
    id: str
    kind: NodeKind
    deps: tuple[str, ...]
    fn: Callable[..., Any] | None = None
    prompt: str | Callable[..., str] | None = None
    system: str | None = None
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


Dep = NodeRef | str


class Workflow:
    """Build a DAG of ``llm`` and ``function`` nodes.

    Example (map 40 chunks, reduce, then one final call)::

        wf = Workflow()
        maps = [wf.llm(f"Summarize: {chunk}") for chunk in chunks]
        notes = wf.function(lambda *parts: "\\n".join(parts), *maps, id="reduce")
        final = wf.llm(lambda text: f"Answer from these notes: {text}", notes, id="final")
        result = engine.run(wf)
        print(result[final])
    """

    def __init__(self) -> None:
        self._specs: dict[str, NodeSpec] = {}
        self._counter = 0

    def _new_id(self, prefix: str, requested: str | None) -> str:
        if requested is not None:
            if not requested or not isinstance(requested, str):
                raise ConfigError("a node id must be a non-empty string")
            if requested in self._specs:
                raise GraphError(f"node id {requested!r} is already used in this workflow")
            return requested
        while True:
            self._counter += 1
            candidate = f"{prefix}-{self._counter}"
            if candidate not in self._specs:
                return candidate

    def _deps(self, deps: tuple[Dep, ...], node_id: str) -> tuple[str, ...]:
        names = []
        for dep in deps:
            name = dep.id if isinstance(dep, NodeRef) else dep
            if not isinstance(name, str):
                raise ConfigError(
                    f"node {node_id!r}: dependencies must be NodeRefs returned by "
                    f"llm()/function() (or their ids), got {type(dep).__name__}"
                )
            if name not in self._specs:
                raise GraphError(
                    f"node {node_id!r} depends on {name!r}, which this workflow does not have"
                )
            names.append(name)
        return tuple(names)

    def llm(
        self,
        prompt: str | Callable[..., str],
        *deps: Dep,
        id: str | None = None,
        model: str | None = None,
        system: str | None = None,
        **params: Any,
    ) -> NodeRef:
        """Add a model call.

        Args:
            prompt: the user message, or a function of the dependencies' results
                that returns it.
            *deps: nodes whose results this call needs.
            id: the node's id (default ``llm-N``).
            model: the model to call (default: the engine's default model).
            system: an optional system message.
            **params: request parameters (``temperature``, ``max_tokens``...).
        """
        if not (isinstance(prompt, str) or callable(prompt)):
            raise ConfigError("llm() needs a prompt string or a function that returns one")
        node_id = self._new_id("llm", id)
        spec = NodeSpec(
            id=node_id,
            kind=NodeKind.LLM_CALL,
            deps=self._deps(deps, node_id),
            prompt=prompt,
            system=system,
            model=model,
            params=params,
        )
        self._specs[node_id] = spec
        return NodeRef(node_id)

    def function(self, fn: Callable[..., Any], *deps: Dep, id: str | None = None) -> NodeRef:
        """Add a Python function of its dependencies' results.

        A plain function runs on the scheduler's thread and must be quick; an ``async``
        function is awaited (use ``trio.to_thread.run_sync`` inside it for heavy work).
        """
        if not callable(fn):
            raise ConfigError("function() needs a callable")
        node_id = self._new_id(getattr(fn, "__name__", "fn").strip("<>") or "fn", id)
        self._specs[node_id] = NodeSpec(
            id=node_id, kind=NodeKind.FUNCTION, deps=self._deps(deps, node_id), fn=fn
        )
        return NodeRef(node_id)

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[NodeSpec]:
        return iter(self._specs.values())

    def __getitem__(self, node_id: str) -> NodeSpec:
        return self._specs[node_id]
