"""What a Python function is, as the journal keys it: its code and what it reads (pure).

A workflow's function node is replayed only under the same key, so the key covers what
decides its result besides its arguments: `function_fingerprint` is the function's
qualified name, its source (``inspect.getsource``; without a source file, its code
object: bytecode, constants, names), the values of its closure's cells and of the
module globals its code names, and, the same way, the functions those name (a helper
whose body changed changes the key of every function that calls it).

Invariants:
    - Deterministic across processes: the same code over the same values gives the same
      key in a rerun. Values enter through `stable_value`, which never uses an ``id()``,
      a memory address or a hash order: sets and dicts are sorted; an object whose
      ``repr`` shows an address (``<Foo object at 0x...>``) counts by its type and its
      own state (its ``__dict__`` and ``__slots__`` values, through `stable_value`), so
      ``C(", ").join`` and ``C(" | ").join`` differ; one with no state to read (a C
      object: a lock, a socket) counts by its type alone. So does one whose ``repr``
      raises: a key never fails its node.
    - Cheap: containers count up to `MAX_ITEMS` items each (past that, their length and
      the first items), nesting up to `MAX_DEPTH` levels, functions named by functions up
      to `MAX_HOPS` hops, objects inside objects while under `MAX_STATE_DEPTH` levels of
      nesting; a module counts by its name; a class of the user's own code by its code
      (methods and class attributes, down its bases), any other by its qualified name.
      What lies beyond these bounds is not seen: a change there is not a divergence.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import os
import re
import sys
import textwrap
import threading
import types
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_HOPS",
    "MAX_ITEMS",
    "MAX_STATE_DEPTH",
    "code_fingerprint",
    "function_fingerprint",
    "stable_value",
]

MAX_ITEMS = 10_000
MAX_DEPTH = 20
MAX_HOPS = 8
MAX_STATE_DEPTH = 8  # an object's state is a dict a level down: four objects deep

# "<Foo object at 0x7f...>", "<function f at 0x...>": an address changes every run.
_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


def _name(value: Any) -> str:
    return (
        f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}"
    )


def stable_value(value: Any, depth: int = 0, hops: int = 0) -> Any:
    """``value`` as JSON data that is the same in every process for the same value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return repr(value)  # nan, inf and -0.0 kept apart, as JSON cannot
    if depth >= MAX_DEPTH:
        return ["deep", _name(type(value))]
    if isinstance(value, bytes | bytearray):
        return ["bytes", hashlib.blake2b(bytes(value), digest_size=16).hexdigest()]
    if isinstance(value, dict):
        # Sorted: equal dicts are equal in any order (one built from a set is built in
        # its hash order, which differs between processes).
        # A copy first, in one step: a function node's thread may be filling the dict.
        items = list(itertools.islice(value.items(), MAX_ITEMS))
        pairs = [
            (repr(stable_value(k, depth + 1)), stable_value(v, depth + 1, hops)) for k, v in items
        ]
        pairs.sort(key=lambda pair: pair[0])
        return ["dict", len(value), [list(pair) for pair in pairs]]
    if isinstance(value, list | tuple):
        items = list(value[:MAX_ITEMS])
        return [type(value).__name__, len(value), [stable_value(v, depth + 1, hops) for v in items]]
    if isinstance(value, set | frozenset):
        shown = sorted(repr(stable_value(v, depth + 1, hops)) for v in list(value))
        return ["set", len(value), shown[:MAX_ITEMS]]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, type):
        if hops >= MAX_HOPS or not _users(value):
            return ["type", _name(value)]
        return ["type", _name(value), _class_parts(value, depth, hops + 1)]
    if isinstance(value, types.FunctionType | functools.partial | types.MethodType):
        if hops >= MAX_HOPS:
            return ["function", _name(value)]
        return ["function", function_fingerprint(value, hops + 1)]
    if isinstance(value, types.BuiltinMethodType) and _bound_to(value) is not None:
        # ", ".join: a C method of a value, which its repr shows by address only
        return ["builtin", _name(value), stable_value(_bound_to(value), depth + 1, hops)]
    kind = _name(type(value))
    fields = _fields(value)
    if fields is not None:  # its repr would show a set field in its hash order
        return ["object", kind, stable_value(fields, depth + 1, hops)]
    try:
        text = repr(value)
    except Exception:  # a repr that needs what it lacks here (an ORM row's session)
        text = ""  # counts by its type and state, as one whose repr shows an address
    if not text or _ADDRESS.search(text):
        state = _state(value) if depth < MAX_STATE_DEPTH else None
        if not state:
            return ["object", kind]
        return ["object", kind, stable_value(state, depth + 1, hops)]
    return ["repr", kind, text]


def _fields(value: Any) -> dict[str, Any] | None:
    """A dataclass's or a pydantic model's fields, or a namespace's attributes, by name;
    None for other objects."""
    if isinstance(value, types.SimpleNamespace):
        return dict(vars(value))
    names = getattr(type(value), "__dataclass_fields__", None) or getattr(
        type(value), "model_fields", None
    )
    if not isinstance(names, dict):
        return None
    return {name: getattr(value, name, None) for name in names}


_LIBRARIES = tuple(
    {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
)


def _users(cls: type) -> bool:
    """Whether ``cls`` is the user's own code (not the standard library's, not an
    installed package's, not built in): only such a class is keyed by its code."""
    module = sys.modules.get(cls.__module__)
    where: str | None = next(
        (
            member.__code__.co_filename
            for member in vars(cls).values()
            if isinstance(member, types.FunctionType)
        ),
        getattr(module, "__file__", None),  # no method of its own: its module's file
    )
    if where is None:  # a module run from a file, not imported, is its own; else C code
        return module is None
    return not os.path.realpath(where).startswith(_LIBRARIES)


def _class_parts(cls: type, depth: int, hops: int) -> list[Any]:
    """A class as its code: every attribute its own classes define (methods by their
    code, class attributes by value), sorted by name, down its bases."""
    parts: list[Any] = []
    for klass in cls.__mro__:
        if klass is object or not _users(klass):
            continue
        for name, member in sorted(vars(klass).items()):
            inner = getattr(member, "__func__", None) or getattr(member, "fget", None) or member
            if isinstance(inner, types.FunctionType):
                parts.append([name, _code(inner.__code__)])
            elif not (name.startswith("__") and name.endswith("__")):
                # Not the class's plumbing (__dict__, __module__, a framework's own
                # __pydantic_core_schema__, which holds ids): its own attributes, each
                # by value, classes and functions in them by name (no walk from class to
                # class: a class whose attributes are its own instances stays linear).
                parts.append([name, stable_value(member, depth + 1, MAX_HOPS)])
    return parts


def _bound_to(fn: Any) -> Any:
    """The object a C method is bound to; None for a plain built-in function."""
    owner = getattr(fn, "__self__", None)
    return None if isinstance(owner, types.ModuleType) else owner


def _state(value: Any) -> dict[str, Any]:
    """An object's own attributes: its ``__dict__`` and the ``__slots__`` it has filled
    in (a dataclass's fields are either); empty for an object that has neither."""
    state = dict(getattr(value, "__dict__", None) or {})
    for cls in type(value).__mro__:
        slots = vars(cls).get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in state:
                try:
                    state[name] = getattr(value, name)
                except AttributeError:  # a slot never filled in
                    continue
    return state


def _source(fn: types.FunctionType) -> list[Any]:
    """The function's own source (not the function a decorator wrapped) and its code
    object's content: two lambdas on one line share their source, not their code."""
    try:
        source = textwrap.dedent(inspect.getsource(fn.__code__))
    except (OSError, TypeError):
        source = ""
    return [source, _code(fn.__code__)]


def _code(code: types.CodeType) -> list[Any]:
    """A code object's content without its place in a file (no line numbers)."""
    consts = [
        _code(c) if isinstance(c, types.CodeType) else stable_value(c) for c in code.co_consts
    ]
    return [code.co_code.hex(), consts, list(code.co_names), list(code.co_varnames)]


def _names(code: types.CodeType) -> list[str]:
    """The global (and attribute) names a code object and the code inside it use."""
    found = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(n for n in _names(const) if n not in found)
    return found


def code_fingerprint(fn: Callable[..., Any]) -> str:
    """The hash of ``fn``'s own code (and a partial's arguments, a function's defaults),
    not of the state it reads: what names a custom tool in a completion's run key, which
    a tool's cache or counter must not change from one attempt to the next."""
    parts: list[Any] = [_name(fn)]
    if isinstance(fn, functools.partial):
        parts += [code_fingerprint(fn.func), stable_value(fn.args), stable_value(fn.keywords)]
    elif isinstance(fn, types.MethodType):
        parts.append(code_fingerprint(fn.__func__))
    elif isinstance(fn, types.FunctionType):
        parts += [
            _code(fn.__code__),
            stable_value(fn.__defaults__),
            stable_value(fn.__kwdefaults__),
        ]
    elif not isinstance(fn, types.BuiltinFunctionType | types.BuiltinMethodType):
        call = next((vars(c)["__call__"] for c in type(fn).__mro__ if "__call__" in vars(c)), None)
        if isinstance(call, types.FunctionType):
            parts.append(code_fingerprint(call))
    text = repr(parts)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


_reading = threading.local()  # the fingerprints of the functions met in one reading


def function_fingerprint(fn: Callable[..., Any], hops: int = 0) -> str:
    """The hash of ``fn`` as the journal keys it (see the module docstring). Each
    function is read once per fingerprint: helpers that call each other cost their
    number, not their number to the power of the hops; one met again while it is being
    read (recursion) counts by its name there."""
    memo: dict[int, str] | None = getattr(_reading, "memo", None)
    top = memo is None
    if memo is None:
        memo = _reading.memo = {}
    try:
        if id(fn) not in memo:
            memo[id(fn)] = _name(fn)
            memo[id(fn)] = _fingerprint(fn, hops)
        return memo[id(fn)]
    finally:
        if top:
            _reading.memo = None


def _fingerprint(fn: Callable[..., Any], hops: int) -> str:
    parts: list[Any] = [_name(fn)]
    if isinstance(fn, functools.partial):
        parts += [
            stable_value(fn.func, hops=hops),
            stable_value(fn.args, hops=hops),
            stable_value(fn.keywords, hops=hops),
        ]
    elif isinstance(fn, types.MethodType):  # the instance counts with its class's code
        owner = fn.__self__
        parts += [stable_value(fn.__func__, hops=hops), stable_value(owner, hops=hops)]
        parts.append(stable_value(owner if isinstance(owner, type) else type(owner), hops=hops))
    elif isinstance(fn, types.FunctionType):
        parts += _function_parts(fn, hops)
    elif isinstance(fn, types.BuiltinMethodType):
        parts += [stable_value(_bound_to(fn), hops=hops)]
    else:  # a callable object: its class's code and its own state
        call = next((vars(c)["__call__"] for c in type(fn).__mro__ if "__call__" in vars(c)), None)
        parts += [stable_value(call, hops=hops), stable_value(fn, hops=hops)]
        parts.append(stable_value(type(fn), hops=hops))
    text = repr(parts)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _function_parts(fn: types.FunctionType, hops: int) -> list[Any]:
    code = fn.__code__
    cells = []
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            cells.append([name, stable_value(cell.cell_contents, hops=hops)])
        except ValueError:  # a cell not filled in yet
            cells.append([name, "<empty>"])
    module_globals = fn.__globals__
    used = [
        [name, stable_value(module_globals[name], hops=hops)]
        for name in _names(code)
        if name in module_globals and module_globals[name] is not fn
    ]
    defaults = stable_value(fn.__defaults__, hops=hops), stable_value(fn.__kwdefaults__, hops=hops)
    return [_source(fn), cells, used, list(defaults)]
