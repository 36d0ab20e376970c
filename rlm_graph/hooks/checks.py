"""What a plugin's factory made, and what its methods answered, checked against its
contract before the engine uses it: the plugin's mistake named with the fix, not an
``AttributeError`` or ``TypeError`` from deep inside the engine."""

from __future__ import annotations

import inspect
import weakref

from ..contracts import ExecResult, lacking
from ..errors import PluginError
from .manager import _warn_once

__all__ = ["contract_problem", "exec_result"]


def contract_problem(
    made: object, awaited: tuple[str, ...], called: tuple[str, ...] = ()
) -> str | None:
    """What is wrong with ``made`` against a contract whose ``awaited`` methods the engine
    awaits and whose ``called`` ones it calls, if anything: "has no execute()", "has an
    async def should_compact()..." (a coroutine is always true: such a check would always
    pass). A plain ``def`` where the engine awaits is only warned of (logger
    ``rlm_graph``): it may return an awaitable (a method delegating to another object's,
    one under a decorator), and if it does not, awaiting its answer says so."""
    missing = lacking(made, called + awaited)
    if missing is not None:
        return f"has no {missing}()"
    if type(made) in _CONFORMING:  # checked before (a batch makes one per completion)
        return None
    for name in called:
        if inspect.iscoroutinefunction(inspect.unwrap(getattr(made, name))):
            return f"has an async def {name}(), which the engine calls: make it a plain def"
    for name in awaited:
        method = inspect.unwrap(getattr(made, name))
        if inspect.isroutine(method) and not (
            inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
        ):
            _warn_once(
                "%s.%s() is a plain def, and the engine awaits it: if it does not return an "
                "awaitable, define it with async def",
                type(made).__qualname__,
                name,
            )
    _CONFORMING.add(type(made))
    return None


_CONFORMING: weakref.WeakSet[type] = weakref.WeakSet()
"""Classes whose methods `contract_problem` found as the contract says."""


def exec_result(env: object, result: object) -> ExecResult:
    """What ``env.execute`` answered, if it is an `ExecResult`.

    Raises:
        PluginError: it is something else (the environment plugin's mistake, named).
    """
    if isinstance(result, ExecResult):
        return result
    raise PluginError(
        f"environment {type(env).__name__}: execute() answered with {type(result).__name__}, "
        "not an ExecResult; return rlm_graph.contracts.ExecResult(stdout=..., error=...)"
    )
