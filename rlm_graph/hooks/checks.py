"""What a plugin's factory made, and what its methods answered, checked against its
contract before the engine uses it: the plugin's mistake named with the fix, not an
``AttributeError`` or ``TypeError`` from deep inside the engine."""

from __future__ import annotations

import inspect

from ..contracts import ExecResult, lacking
from ..errors import PluginError

__all__ = ["contract_problem", "exec_result"]


def contract_problem(
    made: object, awaited: tuple[str, ...], called: tuple[str, ...] = ()
) -> str | None:
    """What is wrong with ``made`` against a contract whose ``awaited`` methods the engine
    awaits and whose ``called`` ones it calls, if anything: "has no execute()", "has a
    plain def execute()...". A plain function where an ``async def`` belongs (or the other
    way round) would fail deep inside the engine, or (an async check) always pass."""
    missing = lacking(made, called + awaited)
    if missing is not None:
        return f"has no {missing}()"
    for name in awaited:
        method = getattr(made, name)
        if inspect.isroutine(method) and not inspect.iscoroutinefunction(method):
            return f"has a plain def {name}(), which the engine awaits: define it with async def"
    for name in called:
        if inspect.iscoroutinefunction(getattr(made, name)):
            return f"has an async def {name}(), which the engine calls: make it a plain def"
    return None


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
