"""The sync doorway: run a trio function from plain code, with plain exceptions out.

trio nurseries wrap what escapes them in exception groups; a user who pressed Ctrl-C or
whose provider failed expects ``KeyboardInterrupt`` or ``ProviderError``, not a group
that also lists the cancellations it caused. `unwrap` gives back the one real error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import trio

from ..errors import ConfigError

__all__ = ["refuse_inside_trio", "reraise", "run_sync", "single_or_group", "unwrap"]

T = TypeVar("T")


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def unwrap(exc: BaseExceptionGroup[Any]) -> BaseException | None:
    """The single error in a group once cancellations are set aside, else None."""
    real = [leaf for leaf in _leaves(exc) if not isinstance(leaf, trio.Cancelled)]
    if len(real) == 1:
        return real[0]
    return None


def single_or_group(group: BaseExceptionGroup[Any]) -> BaseException:
    """What to raise for ``group``: its single error (`unwrap`); one of its cancellations
    when it holds nothing else (a cancel scope outside catches it as it would the group);
    else the group itself."""
    single = unwrap(group)
    if single is None:
        leaves = _leaves(group)
        if not all(isinstance(leaf, trio.Cancelled) for leaf in leaves):
            return group
        single = leaves[0]
    return single.with_traceback(single.__traceback__)


def reraise(error: BaseException) -> NoReturn:
    """Raise ``error``, taken out of the exception group it came in, with its own cause
    and context, not the group's (``raise error from None`` dropped its cause)."""
    chain = error.__cause__, error.__context__, error.__suppress_context__
    try:
        raise error
    finally:
        error.__cause__, error.__context__, error.__suppress_context__ = chain


def refuse_inside_trio(sync_name: str, instead: str) -> None:
    """Refuse a sync door called from trio code (it would nest a second trio loop).

    Raises:
        ConfigError: naming ``instead``, what to write there.
    """
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return  # not inside trio: the normal case
    raise ConfigError(
        f"{sync_name}() runs its own trio loop and cannot be called from trio code; "
        f"use `{instead}` there"
    )


def run_sync(fn: Callable[..., Awaitable[T]], *args: Any, sync_name: str, async_name: str) -> T:
    """``trio.run(fn, *args)``, refusing to nest inside a running trio loop."""
    refuse_inside_trio(sync_name, f"await {async_name}(...)")
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        single = unwrap(group)
        if single is None:
            raise
        reraise(single)
