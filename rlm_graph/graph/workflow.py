"""A user's own DAG of model calls and Python functions, built before it runs.

A `Workflow` is a plan: node specs (`rlm_graph.graph.spec.NodeSpec`) and the
dependencies their arguments name. The runtime's graph executor turns each spec into a
`NodeRecord` in a `Graph` and runs it with the engine's limiters, observers and tracing
(see ``Engine.run``); ``to_json``/``to_dot`` show the plan before it runs.

Arguments are any mix of `NodeRef`s, constants, keywords and nested lists, tuples, dicts
and sets (as ``dask.delayed`` takes them); a node receives them with each reference
replaced by that node's result. A model call's prompt is a string, or a function of its
arguments that returns one.

Failure semantics (docs/graph-executor.md, "Failures"):
    - a node whose dependency failed does not run: it is ``skipped``, its error names
      the dependency, and it sends nothing; so are the nodes after it;
    - unless it was added with ``receive_failures=True``: it then runs, and a failed
      dependency's value is its `rlm_graph.errors.NodeFailed`;
    - an error no other node can escape (a rejected key, an unknown model, a
      configuration error) stops the whole workflow at once.
"""

from __future__ import annotations

import inspect
import itertools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import ConfigError, GraphError
from .nodes import NodeKind
from .plan import plan_dot, plan_jsonable
from .spec import (
    FunctionLoop,
    NodeRef,
    NodeSpec,
    check_options,
    check_params,
    is_async,
    references,
    snapshot,
    unpartial,
)

__all__ = ["NodeRef", "NodeSpec", "Workflow"]

_OWNERS = itertools.count(1)
_SURROGATE = re.compile("[\ud800-\udfff]")


# A node handle's text (its repr: `NodeRef.__str__`) in a prompt: "..." % handle, say.
_HANDLE_TEXT = re.compile(r"NodeRef\(id='[^'\n]{0,200}'\)")


class Workflow:
    """Build a DAG of ``llm`` and ``function`` nodes.

    Example (map 40 chunks, reduce, then one final call)::

        wf = Workflow()
        maps = [wf.llm(f"Summarize: {chunk}") for chunk in chunks]
        notes = wf.function(lambda parts, sep: sep.join(parts), maps, "\\n", id="reduce")
        final = wf.llm(lambda text: f"Answer from these notes: {text}", notes, id="final")
        result = engine.run(wf)
        print(result[final])
    """

    def __init__(self) -> None:
        self._specs: dict[str, NodeSpec] = {}
        self._counter = 0
        self._owner = next(_OWNERS)  # this workflow's mark on the handles it makes

    @contextmanager
    def _adding(self, prefix: str, requested: str | None) -> Iterator[str]:
        """The id of the node being added; a node refused while it is being checked
        takes no ordinal (the ids of the nodes after it stay as they would be)."""
        counter = self._counter
        try:
            yield self._new_id(prefix, requested)
        except BaseException:
            self._counter = counter
            raise

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

    def _deps(
        self, node_id: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> dict[str, NodeRef]:
        """The references in a node's arguments, by id, each checked to be a node of
        this workflow added before it."""
        try:
            found = references([args, dict(kwargs)])
        except ConfigError as exc:
            raise ConfigError(f"node {node_id!r}: {exc}") from None
        for name, ref in found.items():
            if not self._mine(ref):
                raise GraphError(
                    f"node {node_id!r} refers to {name!r} of another Workflow; a node can "
                    "only use nodes of its own workflow: add that node to this one"
                )
            if name not in self._specs:
                raise GraphError(
                    f"node {node_id!r} depends on {name!r}, which this workflow does not have "
                    "(add a node before the nodes that use it)"
                )
        return found

    def llm(
        self,
        prompt: str | Callable[..., str],
        *args: Any,
        id: str | None = None,
        model: str | None = None,
        system: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        retries: int = 0,
        timeout: float | None = None,
        cache: bool = True,
        receive_failures: bool = False,
        **params: Any,
    ) -> NodeRef:
        """Add a model call.

        Args:
            prompt: the user message, or a function of the arguments that returns it.
            *args: the prompt function's positional arguments: node references,
                constants, nested lists/tuples/dicts/sets of them (with a string
                prompt, the nodes this call waits for).
            id: the node's id (default ``llm-N``).
            model: the model to call (default: the engine's default model); a model of
                another backend (``other_backends``) is sent to that backend.
            system: an optional system message.
            kwargs: the prompt function's keyword arguments (as ``args``).
            retries: attempts after the first when the call fails (a 401, 404 or
                configuration error stops the workflow instead).
            timeout: seconds each attempt may take.
            cache: whether a journaled run may replay this call (False: always asked).
            receive_failures: run even when a dependency failed (its value is then its
                `NodeFailed`).
            **params: request parameters: ``temperature``, ``top_p``, ``max_tokens``,
                ``seed``, ``stop``, and ``extra={...}`` for the provider's own.

        Raises:
            ConfigError: an unknown parameter, a bad value or option, a bad prompt.
            GraphError: a reference to a node this workflow does not have, a used id.
        """
        if not (isinstance(prompt, str) or callable(prompt)):
            raise ConfigError("llm() needs a prompt string or a function that returns one")
        with self._adding("llm", id) as node_id:
            self._specs[node_id] = self._llm_spec(
                node_id,
                prompt,
                args,
                model,
                system,
                kwargs,
                params,
                retries=retries,
                timeout=timeout,
                cache=cache,
                receive_failures=receive_failures,
            )
        return NodeRef(node_id, self._owner)

    def _llm_spec(
        self,
        node_id: str,
        prompt: str | Callable[..., str],
        args: tuple[Any, ...],
        model: object,
        system: object,
        keywords: object,
        params: Mapping[str, Any],
        **options: Any,
    ) -> NodeSpec:
        for name, value in (("model", model), ("system", system)):
            if value is not None and not (isinstance(value, str) and value):
                raise ConfigError(
                    f"node {node_id!r}: {name} must be a non-empty string or None, not "
                    f"{type(value).__name__} {value!r:.60}"
                )
        if keywords is not None and not isinstance(keywords, Mapping):
            raise ConfigError(
                f"node {node_id!r}: kwargs must be a dict of the prompt function's keyword "
                f"arguments, not {type(keywords).__name__}"
            )
        for text in (prompt, system, *args):
            handle = _HANDLE_TEXT.search(text) if isinstance(text, str) else None
            if handle is not None:
                raise ConfigError(
                    f"node {node_id!r}: its text holds the node handle {handle[0]} (made "
                    "with %, str() or +), which puts the handle where its result belongs "
                    "and does not wait for that node. Pass the handle as an argument and "
                    'build the text in a function: wf.llm(lambda text: f"... {text}", handle)'
                )
        if callable(prompt):
            if is_async(prompt):
                raise ConfigError(
                    f"node {node_id!r}: the prompt function is async; a prompt function is a "
                    "plain function that returns the prompt text (it runs on the "
                    "scheduler's thread when the node starts): do async work in a "
                    "wf.function node and pass its result"
                )
            _check_prompt_keywords(node_id, prompt, params)
        return self._spec(
            node_id,
            NodeKind.LLM_CALL,
            args,
            dict(keywords or {}),
            options,
            prompt=prompt,
            system=system,
            model=model,
            params=check_params(node_id, params),
        )

    def _spec(
        self,
        node_id: str,
        kind: NodeKind,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        **fields: Any,
    ) -> NodeSpec:
        """A node's spec: its options checked, its dependencies found in its arguments."""
        check_options(node_id, **options)
        found = self._deps(node_id, args, kwargs)
        return NodeSpec(
            id=node_id,
            kind=kind,
            deps=tuple(found),
            args=snapshot(args, found),
            kwargs=snapshot(kwargs, found),
            **fields,
            **options,
        )

    def function(
        self,
        fn: Callable[..., Any],
        *args: Any,
        id: str | None = None,
        retries: int = 0,
        timeout: float | None = None,
        cache: bool = True,
        receive_failures: bool = False,
        loop: FunctionLoop | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **keywords: Any,
    ) -> NodeRef:
        """Add a Python function of its arguments.

        A plain function runs in a worker thread (the scheduler never waits on it); an
        ``async`` function runs on the scheduler's trio loop, or with ``loop="asyncio"``
        on an asyncio loop of its own in a worker thread. Without ``loop``, an ``async``
        function whose code names ``asyncio`` (or ``aiohttp``) and not ``trio`` runs on
        asyncio's, any other on trio's.

        Args:
            fn: the function.
            *args, **keywords: its arguments: node references, constants, nested
                lists/tuples/dicts/sets of them.
            id: the node's id (default ``<function name>-N``).
            retries, timeout, cache, receive_failures: as for `llm`.
            loop: ``"trio"`` or ``"asyncio"``, for an ``async`` function (default: as
                its code says, above).
            kwargs: more keyword arguments of ``fn``, as a dict: the way to pass one
                named like an option of this method (``timeout``, ``cache``, ``id``...).

        Raises:
            ConfigError: not a callable, a bad option, a keyword given twice.
            GraphError: a reference to a node this workflow does not have, a used id.
        """
        if not callable(fn):
            node = f" for node {id!r}" if id is not None else ""
            raise ConfigError(
                f"wf.function(){node} needs a function to run first, not "
                f"{type(fn).__name__} {fn!r:.60}; pass the function itself, then its arguments"
            )
        prefix = getattr(fn, "__name__", "fn").strip("<>") or "fn"
        with self._adding(prefix, id) as node_id:
            keywords = _merged(node_id, kwargs, keywords)
            if loop is None:
                loop = "asyncio" if is_async(fn) and _written_for_asyncio(fn) else "trio"
            _check_loop(node_id, fn, loop)
            options = {
                "retries": retries,
                "timeout": timeout,
                "cache": cache,
                "receive_failures": receive_failures,
            }
            self._specs[node_id] = self._spec(
                node_id, NodeKind.FUNCTION, args, keywords, options, fn=fn, loop=loop
            )
        return NodeRef(node_id, self._owner)

    def to_jsonable(self) -> dict[str, Any]:
        """The plan as JSON data: every node (kind, dependencies, arguments, model,
        parameters, options) and every edge, before anything runs."""
        return plan_jsonable(self)

    def to_json(self, *, indent: int | None = None) -> str:
        """`to_jsonable` as JSON text (a lone surrogate, from a file name that is not
        UTF-8, written as its escape: the text can be written as UTF-8)."""
        text = json.dumps(self.to_jsonable(), indent=indent, ensure_ascii=False, allow_nan=False)
        return _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)

    def to_dot(self) -> str:
        """The plan as Graphviz DOT text (``dot -Tsvg``): a box per model call, a
        component per function, an edge per dependency."""
        return plan_dot(self)

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[NodeSpec]:
        return iter(self._specs.values())

    @property
    def owner(self) -> int:
        """The mark this workflow's handles carry (`NodeRef.owner`)."""
        return self._owner

    def __contains__(self, node: object) -> bool:
        if isinstance(node, NodeRef):
            return self._mine(node) and node.id in self._specs
        return node in self._specs

    def __getitem__(self, node_id: str | NodeRef) -> NodeSpec:
        if isinstance(node_id, NodeRef):
            if not self._mine(node_id):
                raise KeyError(f"{node_id.id!r} is a handle of another Workflow")
            node_id = node_id.id
        return self._specs[node_id]

    def _mine(self, ref: NodeRef) -> bool:
        """Whether ``ref`` may name a node here: made by this workflow, or by hand."""
        return not ref.owner or ref.owner == self._owner


def _written_for_asyncio(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s code (its nested functions too) names asyncio's libraries and
    not trio: ``await asyncio.sleep(0)`` on trio's loop fails."""
    fn = unpartial(fn)
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object's async __call__
    code = getattr(inspect.unwrap(fn), "__code__", None) or getattr(call, "__code__", None)
    names: set[str] = set()
    todo = [code] if code is not None else []
    while todo:
        current = todo.pop()
        names.update(current.co_names)
        todo += [c for c in current.co_consts if inspect.iscode(c)]
    return bool(names & {"asyncio", "aiohttp"}) and "trio" not in names


def _merged(node_id: str, given: object, keywords: dict[str, Any]) -> dict[str, Any]:
    """A function node's keyword arguments: ``kwargs={...}`` and the keywords given
    directly, none twice."""
    if given is None:
        return keywords
    if not isinstance(given, Mapping):
        raise ConfigError(
            f"node {node_id!r}: kwargs must be a dict of the function's keyword arguments, "
            f"not {type(given).__name__}"
        )
    twice = sorted(set(given) & set(keywords))
    if twice:
        raise ConfigError(f"node {node_id!r}: keyword {twice[0]!r} given twice (in kwargs= too)")
    return {**given, **keywords}


def _check_prompt_keywords(
    node_id: str, prompt: Callable[..., str], params: Mapping[str, Any]
) -> None:
    """A keyword meant for the prompt function, given as a request parameter."""
    try:
        names = set(inspect.signature(prompt).parameters)
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return
    for name, value in params.items():
        if name in names or isinstance(value, NodeRef):
            raise ConfigError(
                f"node {node_id!r}: {name!r} is not a request parameter; pass the prompt "
                f"function's keywords as kwargs={{{name!r}: ...}}"
            )


def _check_loop(node_id: str, fn: Callable[..., Any], loop: object) -> None:
    if loop not in ("trio", "asyncio"):
        raise ConfigError(f"node {node_id!r}: loop must be 'trio' or 'asyncio', not {loop!r}")
    if loop == "asyncio" and not is_async(fn):
        raise ConfigError(
            f"node {node_id!r}: loop='asyncio' is for an async function; a plain "
            "function already runs in a worker thread"
        )
