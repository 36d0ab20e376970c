"""`RLM(...)`'s keyword arguments, checked and normalised at configuration, and the
reference library's callbacks as an observer.

Each check fails with a `ConfigError` naming the keyword and the fix, so bad input is
refused when the `RLM` is built, never at the first block of a run.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from .contracts import ChatRequest, lacking
from .errors import ConfigError, PluginError, checked_flag, config_error
from .graph import Graph, NodeKind, NodeRecord
from .hooks import hookimpl
from .hooks.checks import contract_problem
from .journal.tools import JournaledTool
from .repl import RESERVED_NAMES

__all__ = [
    "Callbacks",
    "check_direct",
    "check_loop_options",
    "check_environment_kwargs",
    "compaction_strategy",
    "normalise_tools",
    "sampling_params",
]


def normalise_tools(
    tools: Mapping[str, Any] | None, keyword: str
) -> dict[str, tuple[Any, str | None]]:
    table: dict[str, tuple[Any, str | None]] = {}
    if tools is not None and not isinstance(tools, Mapping):
        raise ConfigError(
            f"{keyword} must be a dict of name -> function or value, not {type(tools).__name__}"
        )
    for name, entry in (tools or {}).items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{keyword}: tool name {name!r} is not a Python identifier")
        if name in RESERVED_NAMES or name.startswith(("context_", "history_")):
            raise ConfigError(
                f"{keyword}: {name!r} is a reserved REPL name ({', '.join(RESERVED_NAMES)}, "
                "context_N, history_N); rename the tool"
            )
        if isinstance(entry, Mapping) and "tool" in entry:
            unknown = set(entry) - {"tool", "description", "journal"}
            if unknown:
                raise ConfigError(
                    f"{keyword}[{name!r}]: unknown keys {sorted(unknown)}; use 'tool', "
                    "'description' and 'journal'"
                )
            tool = entry["tool"]
            if entry.get("journal"):
                if not callable(tool):
                    raise ConfigError(
                        f"{keyword}[{name!r}]: 'journal' is for functions; {name!r} is data"
                    )
                tool = JournaledTool(tool, name)
            table[name] = (tool, entry.get("description"))
        else:
            table[name] = (entry, None)
    return table


_REQUEST_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "stop")


def sampling_params(args: Mapping[str, Any] | None, keyword: str) -> dict[str, Any] | None:
    """``sampling_args`` as request parameters: known fields as such (the reference's
    ``max_completion_tokens`` as ``max_tokens``), anything else passed through in ``extra``."""
    if args is None:
        return None
    if not isinstance(args, Mapping):
        raise ConfigError(f"{keyword} must be a dict (e.g. {{'temperature': 0}})")
    params: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in args.items():
        name = "max_tokens" if key == "max_completion_tokens" else key
        if name in _REQUEST_FIELDS:
            params[name] = tuple(value) if name == "stop" and isinstance(value, list) else value
        elif key == "extra_body" and isinstance(value, Mapping):
            extra.update(value)
        else:
            extra[key] = value
    if extra:
        params["extra"] = extra
    try:
        ChatRequest(messages=(), model="check", **params)
    except ValidationError as exc:
        raise config_error(keyword, exc) from None
    return params


def check_environment_kwargs(factory: Any, name: str, kwargs: Mapping[str, Any] | None) -> None:
    """Fail at configuration, not at the first block, on bad ``environment_kwargs``."""
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"environment_kwargs must be a dict, not {type(kwargs).__name__}")
    check = getattr(factory, "check_kwargs", None)
    try:
        if callable(check):
            check(**kwargs)
        else:
            inspect.signature(factory).bind(bridge=None, tools={}, depth=0, **kwargs)
    except TypeError:
        target = check if callable(check) else factory
        known = [
            p.name
            for p in inspect.signature(target).parameters.values()
            if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        known = [k for k in known if k not in ("bridge", "tools", "depth")]
        setup = "; set-up code goes in RLM(tool_code=...)" if "setup_code" in kwargs else ""
        raise ConfigError(
            f"environment {name!r} does not take environment_kwargs "
            f"{sorted(set(kwargs) - set(known))}; it takes {', '.join(known) or 'none'} "
            f"(see docs/environments.md){setup}"
        ) from None


_CALLED, _AWAITED = ("should_compact",), ("compact",)  # a strategy's methods, by how used
_STRATEGY_METHODS = _CALLED + _AWAITED


def compaction_strategy(host: Any, compaction: Any, kwargs: Mapping[str, Any] | None) -> Any:
    """The strategy ``RLM(compaction=...)`` asks for: None, a registered one, or an object."""
    if compaction is None or compaction is False:
        return None
    if compaction is True or isinstance(compaction, str):
        name = "summarize" if compaction is True else compaction
        factory = host.lookup("compaction_strategies", name)
        try:
            made = factory(**dict(kwargs or {}))
        except TypeError as exc:
            raise ConfigError(f"compaction {name!r} rejected compaction_kwargs: {exc}") from None
        problem = contract_problem(made, _AWAITED, _CALLED) or _sizes_problem(made)
        if problem is not None:
            raise PluginError(
                f"compaction {name!r}: its factory made {type(made).__name__}, which "
                f"{problem}; a strategy must follow rlm_graph.contracts.CompactionStrategy"
            )
        return made
    if isinstance(compaction, type):
        raise ConfigError(
            f"compaction= takes a strategy object ({compaction.__name__}()), not the class "
            f"{compaction.__name__}; or register the class by name (docs/compaction.md)"
        )
    missing = lacking(compaction, _STRATEGY_METHODS)
    if missing is not None:
        raise ConfigError(
            "compaction must be True, a strategy name or a CompactionStrategy; "
            f"{type(compaction).__name__} has no {missing}()"
        )
    problem = contract_problem(compaction, _AWAITED, _CALLED) or _sizes_problem(compaction)
    if problem is not None:
        raise PluginError(f"compaction {type(compaction).__name__} {problem}")
    return compaction


def _sizes_problem(strategy: Any) -> str | None:
    """Whether ``should_compact`` takes what the loop passes (the messages, then the
    sizes by keyword), said as the problem (a mismatch failed the first turn)."""
    try:
        signature = inspect.signature(strategy.should_compact)
    except (TypeError, ValueError):  # no signature to read (a builtin): its call will say
        return None
    try:
        signature.bind([], tokens=0, context_window=1, threshold_pct=0.85)
    except TypeError as exc:
        return (
            f"has a should_compact() that cannot take (messages, *, tokens, context_window, "
            f"threshold_pct): {exc}"
        )
    return None


def check_loop_options(
    *,
    custom_system_prompt: object,
    compaction: object,
    compaction_threshold_pct: object,
    compaction_kwargs: object,
    output_chars: object,
    callbacks: Mapping[str, object],
) -> None:
    """The loop's own keywords: their types and ranges, each a `ConfigError` naming it."""
    if custom_system_prompt is not None and not isinstance(custom_system_prompt, str):
        raise ConfigError(
            "custom_system_prompt must be a str (the whole system prompt) or None, not "
            f"{type(custom_system_prompt).__name__}"
        )
    share = compaction_threshold_pct
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ConfigError(
            f"compaction_threshold_pct must be a share of the window in (0, 1], e.g. 0.85, not {share!r}"
        )
    if compaction_kwargs and (compaction is None or compaction is False):
        raise ConfigError(
            "compaction_kwargs is set but compaction is off; pass compaction='summarize' "
            "(or True, or another strategy's name) with it"
        )
    if isinstance(output_chars, bool) or not isinstance(output_chars, int) or output_chars < 100:
        raise ConfigError(
            f"output_chars must be a whole number of at least 100 characters, not {output_chars!r}"
        )
    for name, value in callbacks.items():
        if value is not None and not callable(value):
            raise ConfigError(f"{name} must be a function (or None), not {type(value).__name__}")


def check_direct(direct_if_fits: Any, share: Any, persistent: bool) -> None:
    checked_flag("direct_if_fits", direct_if_fits)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ConfigError(
            f"direct_share must be a share of the root model's window in (0, 1], not {share!r}"
        )
    if direct_if_fits and persistent:
        raise ConfigError(
            "direct_if_fits=True cannot be used with persistent=True: a direct answer has no "
            "REPL, so context_N and history_N would not be kept; use one or the other"
        )


@dataclasses.dataclass(eq=False)  # a plugin: pluggy tells plugins apart by identity
class Callbacks:
    """Observer for the reference's ``on_subcall_*`` and ``on_iteration_*`` callbacks
    and the ``verbose`` progress lines."""

    on_start: Callable[..., Any] | None
    on_complete: Callable[..., Any] | None
    on_iteration_start: Callable[..., Any] | None
    on_iteration_complete: Callable[..., Any] | None
    _: dataclasses.KW_ONLY
    verbose: bool

    @hookimpl
    def rlm_node_started(self, record: NodeRecord, graph: Graph) -> None:
        if record.kind == NodeKind.RLM_CALL and self.on_start is not None:
            self.on_start(record.depth, record.model, record.input_preview[:80])
        elif record.kind == NodeKind.ROOT_TURN and self.on_iteration_start is not None:
            self.on_iteration_start(record.depth, record.iteration)

    @hookimpl
    def rlm_node_finished(self, record: NodeRecord, graph: Graph) -> None:
        if record.kind == NodeKind.RLM_CALL and self.on_complete is not None:
            self.on_complete(record.depth, record.model, record.duration, record.error)
        elif record.kind == NodeKind.ROOT_TURN and self.on_iteration_complete is not None:
            self.on_iteration_complete(record.depth, record.iteration, record.duration)
        if self.verbose:
            print(
                f"[rlm-graph] {record.id:<10} {record.kind.value:<10} depth={record.depth} "
                f"{record.status.value:<9} {record.duration:7.3f}s {record.output_preview[:60]!r}",
                file=sys.stderr,
            )
