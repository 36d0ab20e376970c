"""The parts of a workflow node, pure: its handle (`NodeRef`), what it runs (`NodeSpec`),
and its arguments.

Arguments are any mix of node references, constants, keywords and nested lists,
tuples, dicts and sets, as ``dask.delayed`` takes them: `refs_in` finds the references
(the node's dependencies) when the node is added, `resolve` puts the dependencies'
results in their place when it runs. A structure without a reference is passed as it
is, never copied; one that holds a reference by run time that it did not hold when its
node was added fails the node (`NodeSpec.arguments`).

Invariants:
    - A spec is checked when its node is added (`Workflow.llm`, `Workflow.function`):
      request parameters against `ChatRequest`, options by type, references against the
      nodes already added; nothing about a node's shape fails at run time.
"""

from __future__ import annotations

import collections
import copy
import difflib
import functools
import inspect
import io
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from ..contracts import ChatRequest, Message
from ..errors import ConfigError, GraphError, config_error
from .nodes import NodeKind

__all__ = [
    "REQUEST_PARAMETERS",
    "FunctionLoop",
    "NodeRef",
    "NodeSpec",
    "check_options",
    "check_params",
    "is_async",
    "references",
    "refs_in",
    "resolve",
    "snapshot",
    "unpartial",
]

FunctionLoop = Literal["trio", "asyncio"]

REQUEST_PARAMETERS = ("extra", "max_tokens", "seed", "stop", "temperature", "top_p")
"""What ``wf.llm(..., **params)`` may set (`ChatRequest` fields); provider-specific
arguments go in ``extra={...}``."""

_MAX_NESTING = 100


@dataclass(frozen=True, slots=True)
class NodeRef:
    """A handle to a node of a workflow; pass it as an argument of another node (at any
    depth of a list, tuple, dict or set) or index a result with it.

    A handle `Workflow` made knows its workflow (``owner``), which refuses another
    workflow's handles: node ids repeat across workflows (``llm-1``), so one would
    silently stand for a node of the same name. ``NodeRef("id")`` made by hand names a
    node of whichever workflow it is given to.
    """

    id: str
    owner: int = field(default=0, compare=False, repr=False)

    def __str__(self) -> str:
        # Its repr, never the bare id: text such as "Improve " + str(handle) must not
        # read as a result (print, logging and error messages still show the handle).
        return repr(self)

    def __format__(self, format_spec: str) -> str:
        raise ConfigError(
            f"node handle {self!r} was put in an f-string (or format()), which would put "
            "its id where its result belongs: a node's result exists only once it ran. "
            "Pass the handle as an argument and build the text in a function: "
            f'wf.llm(lambda text: f"... {{text}}", handle); its id is {self.id!r} (handle.id)'
        )


@dataclass(slots=True)
class NodeSpec:
    """One node of a workflow, as it was added.

    Attributes:
        id, kind: the node's id and kind (``llm_call`` or ``function``).
        deps: the ids of the nodes its arguments refer to, in order of first mention.
        args, kwargs: its arguments as given (node references inside).
        fn: a function node's function.
        prompt, system, model, params: a model node's prompt (text, or a function of the
            arguments), system text, model and request parameters.
        retries: attempts after the first when the node fails (not for errors that stop
            the workflow).
        timeout: seconds each attempt may take (None: no limit but the run's).
        cache: whether a journaled run may replay the node (False: it always runs).
        receive_failures: run even when a dependency failed; a failed dependency's value
            is then its `rlm_graph.errors.NodeFailed`.
        loop: an ``async`` function's event loop: ``"trio"`` (the scheduler's) or
            ``"asyncio"`` (a loop of its own in a worker thread).
    """

    id: str
    kind: NodeKind
    deps: tuple[str, ...]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    fn: Callable[..., Any] | None = None
    prompt: str | Callable[..., str] | None = None
    system: str | None = None
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    retries: int = 0
    timeout: float | None = None
    cache: bool = True
    receive_failures: bool = False
    loop: FunctionLoop = "trio"

    def arguments(self, lookup: Callable[[str], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The node's arguments with each reference replaced by ``lookup(id)``. A
        container passed without a reference is not copied: one that gained a reference
        after the node was added fails the node (it never waited for that node); looked
        for in the first `_LATE_LOOK` items only when the node has no dependency (its
        arguments are then passed as they are, unwalked: data, not handles)."""

        def dependency(ref_id: str) -> Any:
            if ref_id not in self.deps:
                raise self._late(ref_id)
            return lookup(ref_id)

        if not self.deps:
            late = _late_reference((self.args, self.kwargs))
            if late is not None:
                raise self._late(late)
            return self.args, self.kwargs
        return resolve(self.args, dependency), resolve(self.kwargs, dependency)

    def _late(self, ref_id: str) -> GraphError:
        return GraphError(
            f"node {self.id!r} got a reference to {ref_id!r} in an argument after it was "
            f"added (a list or dict changed afterwards), so it never waited for {ref_id!r}: "
            "add the node that gathers references after the nodes it gathers, with them "
            "in its arguments then"
        )

    def messages(self, prompt: object) -> list[Message]:
        """A model node's messages: its system text, then ``prompt``: its prompt text, or
        what its prompt function returned for the node's arguments (the runtime calls it
        in a worker thread: `rlm_graph.doors.functions.prompt_messages`).

        Raises:
            TypeError: the prompt function returned something other than a string.
        """
        if not isinstance(prompt, str):
            if inspect.iscoroutine(prompt):
                prompt.close()  # it will never be awaited: no warning that it was not
            raise TypeError(
                f"the prompt function of node {self.id!r} returned {type(prompt).__name__}; "
                "it must return a string"
            )
        messages = [Message(role="user", content=prompt)]
        if self.system:
            messages.insert(0, Message(role="system", content=self.system))
        return messages


_LATE_LOOK = 10_000
"""Items of a node's arguments looked at for a reference put in after it was added,
when it has no dependency (a constant of millions of items is not walked at each run)."""


def _late_reference(value: Any) -> str | None:
    """The id of a `NodeRef` in the first `_LATE_LOOK` items of ``value`` (each container
    once, `_MAX_NESTING` levels deep at most), else None. Never raises: what it cannot
    look at is passed on as it is."""
    stack, seen, left = [(value, 0)], set(), _LATE_LOOK
    while stack and left > 0:
        item, depth = stack.pop()
        left -= 1
        if isinstance(item, NodeRef):
            return item.id
        if depth >= _MAX_NESTING or id(item) in seen:
            continue
        if isinstance(item, Mapping):
            seen.add(id(item))
            stack.extend((v, depth + 1) for v in itertools.islice(item.values(), left))
        elif isinstance(item, list | tuple | set | frozenset):
            seen.add(id(item))
            stack.extend((v, depth + 1) for v in itertools.islice(item, left))
    return None


def refs_in(value: Any) -> list[str]:
    """The ids of the node references in ``value``, in order of first mention."""
    return list(references(value))


def references(value: Any) -> dict[str, NodeRef]:
    """The node references in ``value``, by id, in order of first mention (the first
    reference of each id).

    Raises:
        ConfigError: an iterator (a generator's references cannot be seen without
            consuming it), a reference used as a dict key, nesting past 100 levels.
    """
    found: dict[str, NodeRef] = {}
    _collect(value, found, 0)
    return found


def _collect(value: Any, found: dict[str, NodeRef], depth: int) -> None:
    if depth > _MAX_NESTING:
        raise ConfigError(
            f"node arguments nest lists, tuples, dicts or sets deeper than {_MAX_NESTING} "
            "levels (or a container holds itself), past where node references are looked "
            "for; pass data that deep as one string (json.dumps) or an object of your own "
            "class, which are not searched"
        )
    if isinstance(value, NodeRef):
        found.setdefault(value.id, value)
        return
    items: Any
    if isinstance(value, Mapping):
        if any(isinstance(key, NodeRef) for key in value):
            raise ConfigError(
                "a node reference cannot be a dict key (its result may not be hashable); "
                "pass it as a value, or as a pair in a list"
            )
        items = value.values()
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    elif isinstance(value, Iterator) and not isinstance(value, io.IOBase):  # a file is a value
        raise ConfigError(
            f"a node argument is an iterator ({type(value).__name__}): what it holds cannot "
            "be seen before the node runs, nor read again by a retry; pass a list "
            "(list(...)) instead"
        )
    else:
        _refuse_hidden(value, depth)
        return
    for item in items:
        _collect(item, found, depth + 1)


_HIDING = (collections.deque, collections.UserList)
"""Sequences a node's arguments are not rebuilt from (lists, tuples, dicts and sets are)."""


def _refuse_hidden(value: Any, depth: int) -> None:
    """Refuse a reference inside a ``deque`` or a ``UserList``, where the node would
    receive the handle, not its result. Other objects (a dataclass, a model, an ORM row)
    are passed as they are and not read: reading them could be slow, have side effects or
    never end (objects that point back at each other).

    Raises:
        ConfigError: naming the reference, where it is, and what to pass instead.
    """
    if not isinstance(value, _HIDING):
        return
    inner: dict[str, NodeRef] = {}
    try:
        _collect(list(value), inner, depth + 1)
    except ConfigError:  # too deep, an iterator: what it holds is its business
        return
    if inner:
        _hidden(next(iter(inner)), f"a {type(value).__name__}", type(value).__name__)


def _hidden(ref_id: str, where: str, kind: str) -> None:
    raise ConfigError(
        f"node reference {ref_id!r} inside {where} would reach the node as the handle, "
        "not its result: only lists, tuples, dicts and sets are rebuilt with results. "
        f"Pass the reference in a list, a tuple or as an argument, and build the {kind} "
        "in the function"
    )


def snapshot(value: Any, found: Mapping[str, NodeRef]) -> Any:
    """``value`` with every container that holds a reference copied (its references
    the same): the node's dependencies are read when it is added, so a list changed
    afterwards must not change what the node receives."""
    if not found:
        return value
    return resolve(value, found.__getitem__)


def resolve(value: Any, lookup: Callable[[str], Any]) -> Any:
    """``value`` with every `NodeRef` replaced by ``lookup(ref.id)``; containers holding
    no reference come back as they are (the same object)."""
    found, changed = _resolve(value, lookup)
    return found if changed else value


def _resolve(value: Any, lookup: Callable[[str], Any]) -> tuple[Any, bool]:
    if isinstance(value, NodeRef):
        return lookup(value.id), True
    if isinstance(value, Mapping):
        pairs = [(key, _resolve(item, lookup)) for key, item in value.items()]
        if not any(changed for _, (_, changed) in pairs):
            return value, False
        return _mapping_like(value, {key: item for key, (item, _) in pairs}), True
    if isinstance(value, list | tuple | set | frozenset):
        items = [_resolve(item, lookup) for item in value]
        if not any(changed for _, changed in items):
            return value, False
        values = [item for item, _ in items]
        if isinstance(value, tuple) and hasattr(value, "_make"):  # a namedtuple
            return value._make(values), True
        if isinstance(value, set | frozenset):
            _hashable(value, values)
        return _sequence_like(value, values), True
    return value, False


def _sequence_like(value: Any, values: list[Any]) -> Any:
    """``values`` in a container of ``value``'s class: a subclass keeps its class and its
    attributes (made as `copy.copy` makes it, without calling its ``__init__``); the plain
    container where that cannot be done."""
    plain: type = (
        tuple if isinstance(value, tuple) else list if isinstance(value, list)
        else frozenset if isinstance(value, frozenset) else set
    )  # fmt: skip
    if type(value) is plain:
        return plain(values)
    try:
        if isinstance(value, tuple | frozenset):  # immutable: made with its items
            kind: Any = type(value)
            like = kind.__new__(kind, values)
            like.__dict__.update(getattr(value, "__dict__", {}))
        else:
            like = copy.copy(value)
            like.clear()
            like.extend(values) if isinstance(like, list) else like.update(values)
    except Exception:
        return plain(values)
    return like


def _mapping_like(value: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """``items`` in a mapping of ``value``'s class where it is a dict's (a ``defaultdict``
    keeps its default, an ``OrderedDict`` its type); a plain dict otherwise, or where
    the class cannot be copied."""
    if type(value) is dict or not isinstance(value, dict):
        return items
    try:
        like = copy.copy(value)
        like.clear()
        like.update(items)
    except Exception:
        return items
    return like


def _hashable(value: set[Any] | frozenset[Any], values: list[Any]) -> None:
    """Check that a set of ``value``'s kind can hold ``values``.

    Raises:
        TypeError: a value a set cannot hold (a dependency returned a list, say).
    """
    for item in values:
        try:
            hash(item)
        except TypeError:
            raise TypeError(
                f"a {type(value).__name__} among the node's arguments cannot hold a "
                f"{type(item).__name__} that a dependency returned (a set holds hashable "
                "values only); pass the references in a list or a tuple instead"
            ) from None


def check_params(node_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A model node's request parameters, checked now rather than at its call.

    Raises:
        ConfigError: an unknown parameter (with the closest known name), or a value the
            request refuses (one line per problem).
    """
    for name in params:
        if name not in REQUEST_PARAMETERS:
            close = difflib.get_close_matches(name, REQUEST_PARAMETERS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"node {node_id!r}: unknown request parameter {name!r}{hint}; the parameters "
                f"are {', '.join(REQUEST_PARAMETERS)}, and a provider's own ones go in "
                "extra={...}"
            )
    try:
        ChatRequest(messages=(), model="-", **params)
    except ValidationError as exc:
        raise config_error(f"node {node_id!r}", exc) from None
    return dict(params)


def check_options(
    node_id: str, *, retries: object, timeout: object, cache: object, receive_failures: object
) -> None:
    """The per-node options' types and ranges.

    Raises:
        ConfigError: naming the option and what it takes.
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"node {node_id!r}: retries must be a whole number >= 0, not {retries!r}")
    if timeout is not None and not _seconds(timeout):
        raise ConfigError(
            f"node {node_id!r}: timeout must be a positive number of seconds (finite), not "
            f"{timeout!r:.60}"
        )
    for name, value in (("cache", cache), ("receive_failures", receive_failures)):
        if not isinstance(value, bool):
            raise ConfigError(f"node {node_id!r}: {name} must be True or False, not {value!r}")


def unpartial(fn: Any) -> Any:
    """The callable a ``functools.partial`` (of a partial...) calls in the end."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _seconds(value: object) -> bool:
    """Whether ``value`` is a positive, finite number of seconds (an int too large for
    a float is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:
        return False


def is_async(fn: Callable[..., Any] | None) -> bool:
    """Whether calling ``fn`` makes a coroutine (an ``async def``, or an object whose
    ``__call__`` is one, or a partial of either)."""
    fn = unpartial(fn)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not callable()
    )
