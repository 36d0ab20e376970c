"""Which provider serves a model: the routing rules, the model table, and what each
provider declares of itself (`ProviderCapabilities`, read once here).

Pure: no trio; `rlm_graph.runtime.calls` sends what this routes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .contracts import ModelInfo, Provider, ProviderCapabilities, Usage
from .errors import ConfigError, clipped
from .limits import resolve_model_info

__all__ = ["ProviderRouter", "Route"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where one call goes: the provider's limiter key, the provider, the model name it
    is asked for, and what the provider declares of itself."""

    key: str
    provider: Provider
    model: str
    capabilities: ProviderCapabilities


class ProviderRouter:
    """Maps a request's model (or its depth) to a configured provider.

    Rules, in order:
        1. A model named in the call (``llm_query(p, model="m")``) goes to the provider
           configured with that model name.
        2. Otherwise the root (depth 0) uses the main backend, and sub-calls (depth >= 1)
           use the first of ``other_backends`` when there is one, as in the reference.
        3. A named model no backend was configured with goes to the main backend under
           that name (OpenAI-compatible servers serve many models). Model code may name
           only ``allowed`` models (`check_allowed`): the backends' and ``allowed_models``.

    Prices come from the model table, a dated id (``gpt-5-mini-2025-08-07``) or a
    ``vendor/model`` id priced as its base model (`rlm_graph.limits.resolve_model_info`).
    """

    def __init__(
        self,
        providers: Sequence[tuple[str, Provider]],
        models: Mapping[str, ModelInfo] | None = None,
        allowed_models: Sequence[str] = (),
        *,
        labels: Sequence[str] | None = None,
    ) -> None:
        if not providers:
            raise ConfigError("at least one backend is needed")
        self.providers = list(providers)
        self.models = dict(models or {})
        self._by_model: dict[str, tuple[str, Provider]] = {}
        for key, provider in reversed(self.providers):
            self._by_model[provider.model] = (key, provider)
        self.allowed: tuple[str, ...] = tuple(
            dict.fromkeys([p.model for _, p in self.providers] + list(allowed_models))
        )
        self._allowed = frozenset(self.allowed)
        self._info: dict[str, ModelInfo | None] = {}
        # Read once: a provider's optional attributes are looked up nowhere else.
        self.capabilities = {key: ProviderCapabilities.of(p) for key, p in self.providers}
        # What a user reads for a provider: its backend's name (``openai``, from
        # ``labels``), the key itself (``openai/1``) where two share a name or none is
        # given.
        keys = [key for key, _ in self.providers]
        named = list(labels) if labels is not None and len(labels) == len(keys) else keys
        self.names = {
            key: label if named.count(label) == 1 and label not in set(keys) - {key} else key
            for key, label in zip(keys, named, strict=True)
        }
        self._routes: dict[tuple[str | None, bool], Route] = {}

    def route(self, model: str | None, depth: int) -> Route:
        """Where a call of ``model`` (None: the default for ``depth``) goes."""
        cached = self._routes.get((model, depth >= 1))
        if cached is not None:  # every call asks: one dict lookup
            return cached
        if model:
            found = self._by_model.get(model)
            key, provider = found if found is not None else self.providers[0]
        else:
            key, provider = (
                self.providers[1] if depth >= 1 and len(self.providers) > 1 else self.providers[0]
            )
        route = Route(key, provider, model or provider.model, self.capabilities[key])
        if len(self._routes) < 1024:  # model names come from model code: bounded
            self._routes[(model, depth >= 1)] = route
        return route

    def check_allowed(self, model: str | None, caller: str = "llm_query") -> None:
        """Refuse a model name that no backend and no ``allowed_models`` entry names.

        Raises:
            ConfigError: naming the model, the allowed ones and the keyword to add it.
        """
        if model is None or model in self._allowed:
            return
        raise ConfigError(
            f"{caller}(..., model={clipped(repr(model), 200)}): that model is not configured; allowed: "
            f"{', '.join(map(repr, self.allowed))}. To allow it, add it to "
            "allowed_models=[...] (or configure a backend with it)"
        )

    def info(self, model: str) -> ModelInfo | None:
        """What the model table knows of ``model`` (dated and vendor/ ids resolved)."""
        try:
            return self._info[model]
        except KeyError:
            found = self._info[model] = resolve_model_info(self.models, model)
            return found

    def price(self, model: str, usage: Usage) -> float | None:
        info = self.info(model)
        return info.price(usage) if info is not None else None

    def can_price(self, route: Route) -> bool:
        """Calls along ``route`` get a cost: the table prices the model, or the provider
        reports costs itself (``reports_cost = True``)."""
        info = self.info(route.model)
        priced = info is not None and (
            info.input_usd_per_mtok is not None or info.output_usd_per_mtok is not None
        )
        return priced or route.capabilities.reports_cost

    def unpriced(self) -> list[tuple[str, str]]:
        """(model, provider name) of every allowed model whose calls would cost nothing."""
        missing = []
        for model in self.allowed:
            route = self.route(model, 0)
            if not self.can_price(route):
                missing.append((model, route.provider.name))
        return missing
