"""What an evaluation method is: the contract of hook ``rlm_register_eval_methods``.

A method answers one item with model calls. It says which ``RLM(...)`` keywords its
completions run with, one set per *role* (``"root"``: the evaluation's model; ``"sub"``:
its sub-model as the model of a completion), and a solver: a generator that yields
`Call`\\ s, receives each call's answer, and returns the prediction::

    class Base:
        name = "base"
        description = "one call with the whole context"

        def rlm_kwargs(self, setup):
            return {"root": setup.root_kwargs(max_depth=0)}

        def solve(self, item, setup):
            return (yield item_call(item))

        def estimate(self, item, tokens, setup):
            return setup.price(setup.root_model, tokens, 1_000)

Each call runs as one completion of the batch layer (`rlm_graph.batch.run_batch`), with
the journal, limits and executor of the evaluation. A solver may instead return
`NotRun` (a context that does not fit the model's window, say): the item is recorded with
that ``stop_reason``, no call made, score 0.

Invariants:
    - A solver is run in one thread at a time but not always the caller's: it must not
      touch shared state without a lock (the first-party methods keep none).
    - A method never imports ``rlm_graph.runtime``; it reaches models only by yielding
      calls, so every call is counted, journaled and kept within the budget.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from ..contracts import ModelInfo
from ..errors import ConfigError
from ..hooks import PluginHost
from ..limits import resolve_model_info
from .items import EvalItem

__all__ = [
    "Call",
    "EvalMethod",
    "MethodSetup",
    "NotRun",
    "Solver",
    "item_call",
    "lookup_methods",
    "model_table",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Call(BaseModel):
    """One completion a solver asks for.

    Attributes:
        query: the question (the completion's ``root_prompt``).
        context: the context value; or
        context_file: a text file whose content is the context (read when the call starts).
        role: whose ``RLM(...)`` keywords it runs with (a key of ``rlm_kwargs()``).
        limits: this call's own limits (``{"max_iterations": 10}``), over the method's.
    """

    model_config = _FROZEN

    query: str
    context: Any = None
    context_file: str | None = None
    role: str = "root"
    limits: dict[str, Any] = {}


class NotRun(BaseModel):
    """A solver's verdict that an item is not run (recorded, scored 0).

    Attributes:
        stop_reason: a short word for the results (``"does_not_fit"``).
        note: why, in numbers, for a person reading the results.
    """

    model_config = _FROZEN

    stop_reason: str
    note: str


Solver = Generator[Call, str, str | NotRun]
"""``solve(item, setup)``: yields calls, is sent each call's answer, returns the
prediction (or `NotRun`)."""


class MethodSetup(BaseModel):
    """What a method knows of the evaluation it runs in.

    Attributes:
        rlm_kwargs: the evaluation's ``RLM(...)`` keywords: the root model's backend, and
            the sub-model's as ``other_backends[0]``; limits, environment, journal.
        root_model: the root model's name.
        sub_model: the sub-model's name (the root model's when none was given).
        models: the model table: windows and prices (the plugins', then ``models=``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    rlm_kwargs: dict[str, Any]
    root_model: str
    sub_model: str
    models: dict[str, ModelInfo] = {}

    @classmethod
    def of(cls, rlm_kwargs: Mapping[str, Any], plugins: Iterable[object] = ()) -> MethodSetup:
        """The setup of an evaluation run with ``rlm_kwargs``.

        Raises:
            ConfigError: ``rlm_kwargs`` is not a dict, or a ``models=`` entry is bad.
        """
        if not isinstance(rlm_kwargs, Mapping):
            raise ConfigError(
                f"rlm_kwargs must be a dict of RLM(...) keywords, not {type(rlm_kwargs).__name__}"
            )
        kwargs = dict(rlm_kwargs)
        root = str(
            (kwargs.get("backend_kwargs") or {}).get("model_name") or kwargs.get("backend") or "?"
        )
        others = list(kwargs.get("other_backend_kwargs") or [])
        sub = (
            str((others[0] or {}).get("model_name") or root)
            if kwargs.get("other_backends") and others
            else root
        )
        return cls(
            rlm_kwargs=kwargs, root_model=root, sub_model=sub, models=model_table(kwargs, plugins)
        )

    def info(self, model: str) -> ModelInfo | None:
        """What the model table knows of ``model`` (dated and ``vendor/`` ids resolved)."""
        return resolve_model_info(self.models, model)

    def window(self, model: str) -> int | None:
        """``model``'s context window in tokens, when the table knows it."""
        info = self.info(model)
        return info.context_window if info is not None else None

    def price(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """USD for that many tokens of ``model``, or ``None`` with no price known."""
        info = self.info(model)
        if info is None or (info.input_usd_per_mtok is None and info.output_usd_per_mtok is None):
            return None
        return (
            input_tokens * (info.input_usd_per_mtok or 0.0)
            + output_tokens * (info.output_usd_per_mtok or 0.0)
        ) / 1e6

    def root_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """The evaluation's keywords with ``overrides`` (``max_depth=0``...)."""
        return {**self.rlm_kwargs, **overrides}

    def sub_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Keywords whose main backend is the sub-model's (for one-call steps on it)."""
        kwargs = dict(self.rlm_kwargs)
        backends = list(kwargs.pop("other_backends", None) or [])
        others = list(kwargs.pop("other_backend_kwargs", None) or [])
        if backends:
            kwargs["backend"] = backends[0]
            kwargs["backend_kwargs"] = dict(others[0]) if others else {}
        return {**kwargs, **overrides}


def model_table(
    rlm_kwargs: Mapping[str, Any], plugins: Iterable[object] = ()
) -> dict[str, ModelInfo]:
    """The plugins' model table with ``rlm_kwargs["models"]`` over it (a dict entry
    updates what the plugins know, as the engine's ``models=`` does).

    Raises:
        ConfigError: an entry that is not a dict or a `ModelInfo`.
    """
    table = PluginHost([*plugins, *rlm_kwargs.get("plugins", ())]).models
    for name, entry in (rlm_kwargs.get("models") or {}).items():
        if isinstance(entry, ModelInfo):
            table[name] = entry
        elif isinstance(entry, Mapping):
            known = table.get(name)
            table[name] = ModelInfo(
                **{**(known.model_dump(exclude_unset=True) if known else {}), **entry}
            )
        else:
            raise ConfigError(
                f"models[{name!r}] must be a dict like {{'context_window': 8192}} or a ModelInfo"
            )
    return table


class EvalMethod(Protocol):
    """A way of answering an item, registered by name with ``rlm_register_eval_methods``.

    Attributes:
        name: the name ``--method`` takes.
        description: one line for tables and ``rlm-graph plugins``.
    """

    name: str
    description: str

    def rlm_kwargs(self, setup: MethodSetup) -> Mapping[str, Mapping[str, Any]]:
        """The ``RLM(...)`` keywords of this method's completions, per role.

        Called once per evaluation, before any item runs; each set is checked then (a bad
        keyword fails the evaluation before it costs anything).
        """

    def solve(self, item: EvalItem, setup: MethodSetup) -> Solver:
        """A generator answering ``item``: yield `Call`\\ s, receive their answers,
        return the prediction (a string) or `NotRun`."""

    def estimate(self, item: EvalItem, tokens: int, setup: MethodSetup) -> float | None:
        """A rough cost of answering ``item`` (``tokens``: its context and question) in
        USD from the price table, before anything runs; ``None`` without prices."""


def item_call(item: EvalItem, query: str | None = None, *, role: str = "root") -> Call:
    """A call over ``item``'s own context (a text file is read when the call starts)."""
    if item.text_file is not None:
        return Call(
            query=query if query is not None else item.question,
            context_file=item.text_file,
            role=role,
        )
    return Call(
        query=query if query is not None else item.question, context=item.load_context(), role=role
    )


def lookup_methods(names: Sequence[str], plugins: Iterable[object] = ()) -> list[EvalMethod]:
    """The methods registered under ``names``, built, in that order.

    Raises:
        PluginError: an unknown name (the message lists the registered ones).
        ConfigError: no name, or a name given twice.
    """
    if not names:
        raise ConfigError(
            "no method: --method one or more of the registered eval methods, e.g. rlm,base"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"a method is named twice in {', '.join(names)}")
    host = PluginHost(plugins)
    methods = []
    for name in names:
        method: EvalMethod = host.lookup("eval_methods", name)()
        methods.append(method)
    return methods
