"""`run_batch`: many completions, by an executor plugin, results as they finish.

An executor (hook ``rlm_register_executors``) decides where completions run: ``local``
(one trio loop in this process) or ``ray`` (completions spread over long-lived Ray
workers). Whatever it is, provider limits hold across all of its completions: it gives
every engine it builds one `SharedLimiter` (see `rlm_graph.concurrency.capacity`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from ..errors import ConfigError
from ..hooks import PluginHost
from ..journal.store import check_journal
from .items import BatchItem, coerce_items
from .results import BatchResult

__all__ = ["Executor", "run_batch"]

# Keywords of RLM(...) a batch sets itself: one completion per item, limits shared.
_RESERVED = {
    "limiter": "the executor supplies the limiter that every completion of the batch shares",
    "persistent": "each item is a completion of its own; a REPL is not kept between items",
}


class Executor(Protocol):
    """Where the completions of a batch run (registered with ``rlm_register_executors``)."""

    name: str

    def run(
        self, items: Iterator[BatchItem], rlm_kwargs: Mapping[str, Any], *, concurrency: int
    ) -> Iterator[BatchResult]:
        """Run each item as one completion of ``RLM(**rlm_kwargs)``, at most
        ``concurrency`` at once, and yield each result as it finishes.

        Every engine built must get the same `SharedLimiter` (``limiter=``), so that
        the providers' limits hold across the batch. A failing item is a result with
        ``error`` set, never an exception. Closing the iterator stops the batch, also
        before its first ``next()``: start the work lazily, in the iterator's body (a
        generator's ``finally`` never runs if its body never began).
        """


def check_rlm_kwargs(rlm_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``RLM(...)`` keywords of a batch, checked by building one `RLM` here.

    Raises:
        ConfigError: not a dict, a keyword a batch sets itself, any error
            ``RLM(**rlm_kwargs)`` reports (an unknown backend, a bad limit...), or a
            ``journal`` that cannot be opened or made.
    """
    if rlm_kwargs is None:
        return {}
    if not isinstance(rlm_kwargs, Mapping):
        raise ConfigError(
            f"rlm_kwargs must be a dict of RLM(...) keywords, not {type(rlm_kwargs).__name__}"
        )
    for key, why in _RESERVED.items():
        if key in rlm_kwargs:
            raise ConfigError(f"rlm_kwargs may not set {key!r}: {why}")
    kwargs = dict(rlm_kwargs)
    from ..rlm import RLM

    RLM(**kwargs)  # fail here, before any item runs, on a bad configuration
    if kwargs.get("journal") is not None:
        check_journal(kwargs["journal"])  # else every item would be a failed row
    return kwargs


def item_limits_check(rlm_kwargs: Mapping[str, Any]) -> Callable[[BatchItem, str], None]:
    """A check for `scan_items`: each item's own limits over the batch's, taken as its
    completion will take them, so that a limit that cannot be kept (a ``max_budget`` on
    a model with no price) is a bad line of the whole-file check, not a failed row.
    With a configuration that is bad itself, the check passes every item: the
    configuration's error is `check_batch`'s to say, after the items' own problems.
    """
    from ..rlm import RLM

    try:
        engine = RLM(**check_rlm_kwargs(rlm_kwargs)).engine
    except ConfigError:  # PluginError too
        return lambda item, where: None

    def check(item: BatchItem, where: str) -> None:
        if item.limits:
            try:
                engine.limits_with(item.limits)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None

    return check


def make_executor(
    name: str, executor_kwargs: Mapping[str, Any] | None, plugins: Iterable[object] = ()
) -> Executor:
    """The executor registered as ``name``, built with ``executor_kwargs``.

    Raises:
        PluginError: no executor of that name (the message lists the registered ones).
        ConfigError: it rejects its keywords, or needs something not installed.
    """
    factory = PluginHost(plugins).lookup("executors", name)
    try:
        executor: Executor = factory(**dict(executor_kwargs or {}))
    except TypeError as exc:
        raise ConfigError(f"executor {name!r} rejected its executor_kwargs: {exc}") from None
    return executor


def check_batch(
    rlm_kwargs: Mapping[str, Any] | None,
    concurrency: object,
    executor: str,
    executor_kwargs: Mapping[str, Any] | None,
) -> tuple[Executor, dict[str, Any]]:
    """A batch's settings checked, before anything runs or is written: its executor,
    and its ``RLM(...)`` keywords.

    Raises:
        ConfigError: a bad concurrency, configuration or executor keyword.
        PluginError: an unknown executor.
    """
    plugins = rlm_kwargs.get("plugins", ()) if isinstance(rlm_kwargs, Mapping) else ()
    runner = check_executor(concurrency, executor, executor_kwargs, plugins)
    return runner, check_rlm_kwargs(rlm_kwargs)


def check_executor(
    concurrency: object,
    executor: str,
    executor_kwargs: Mapping[str, Any] | None,
    plugins: Iterable[object] = (),
) -> Executor:
    """A batch's concurrency checked and its executor built (the part of `check_batch`
    that needs no ``RLM(...)`` keywords: an evaluation checks it before its ``--out``).

    Raises:
        ConfigError: a bad concurrency or executor keyword.
        PluginError: an unknown executor.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be a positive integer, not {concurrency!r}")
    return make_executor(executor, executor_kwargs, plugins)


def run_batch(
    items: Iterable[BatchItem | Mapping[str, Any]],
    rlm_kwargs: Mapping[str, Any] | None = None,
    *,
    concurrency: int = 8,
    executor: str = "local",
    executor_kwargs: Mapping[str, Any] | None = None,
    skip_ids: Iterable[str] = (),
) -> Iterator[BatchResult]:
    """Answer many items, ``concurrency`` completions at once; yield results as they finish.

    Args:
        items: `BatchItem`\\ s or dicts shaped as input lines (``{"id", "query",
            "context" | "context_file", ...limit overrides}``); read lazily.
        rlm_kwargs: the keywords of ``RLM(...)`` for every completion (backend, model,
            limits...). Provider limits (``max_concurrent``, requests and tokens per
            minute) hold across all completions of the batch.
        concurrency: completions in flight at once.
        executor: ``"local"`` (default), ``"ray"``, or a plugin's.
        executor_kwargs: the executor's keywords (``{"address": "auto"}`` for Ray).
        skip_ids: ids not to run (already done: resume).

    Returns:
        An iterator of `BatchResult`, in the order items finish; a failed item is a
        result with ``error`` set. Closing it early stops the batch.

    Raises:
        ConfigError: a bad configuration or a bad item (raised when reached).
        PluginError: an unknown executor.
    """
    runner, kwargs = check_batch(rlm_kwargs, concurrency, executor, executor_kwargs)
    skip = {str(i) for i in skip_ids}
    todo = (item for item in coerce_items(items) if item.id not in skip)
    return runner.run(todo, kwargs, concurrency=concurrency)
