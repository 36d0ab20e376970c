"""The plugin host: one pluggy manager per engine, fed by entry points and by code.

Invariants:
    - Entry points of group ``rlm_graph`` are imported once per process and registered in
      every engine; plugins passed in code are registered after them and win on a name
      clash.
    - An unknown name fails when the engine is configured, never mid-run, with the list of
      registered names.
"""

from __future__ import annotations

import importlib.metadata
import types
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from ..contracts import ModelInfo
from ..errors import PluginError
from .specs import PROJECT, HookSpecs

__all__ = ["PluginHost", "Registration"]

_SINGULAR = {
    "providers": "backend",
    "environments": "environment",
    "compaction_strategies": "compaction strategy",
    "executors": "executor",
    "eval_methods": "eval method",
}

_ENTRY_POINT_CACHE: list[tuple[str, str, object]] | None = None


def _entry_point_plugins() -> list[tuple[str, str, object]]:
    """(entry point name, distribution, loaded module) for group ``rlm_graph``, cached."""
    global _ENTRY_POINT_CACHE
    if _ENTRY_POINT_CACHE is None:
        loaded = []
        for ep in importlib.metadata.entry_points(group=PROJECT):
            try:
                plugin = ep.load()
            except Exception as exc:  # a third-party import can fail in any way
                raise PluginError(
                    f"the plugin entry point {ep.name!r} ({ep.value}) failed to load: "
                    f"{type(exc).__name__}: {exc}; fix or uninstall the package that declares it"
                ) from exc
            dist = ep.dist.name if ep.dist is not None else "?"
            loaded.append((ep.name, dist, plugin))
        _ENTRY_POINT_CACHE = loaded
    return _ENTRY_POINT_CACHE


# A module's hook options, per attribute name: pluggy looks at every attribute of every
# plugin it registers (inspect.getattr_static, ~0.2 ms a module), and an engine
# registers the same modules again: ~1.5 ms of every RLM(...), which a batch on Ray
# builds once per task.
_IMPL_OPTS: weakref.WeakKeyDictionary[types.ModuleType, dict[str, Any]] = weakref.WeakKeyDictionary()
_SPEC_OPTS: dict[str, Any] = {}


class _Manager(pluggy.PluginManager):
    """pluggy's manager, parsing the hook options of a module or of `HookSpecs` once per
    process (they are read off the module's functions, which do not change)."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        if not isinstance(plugin, types.ModuleType):
            return super().parse_hookimpl_opts(plugin, name)
        known = _IMPL_OPTS.setdefault(plugin, {})
        if name not in known:
            known[name] = super().parse_hookimpl_opts(plugin, name)
        return known[name]

    def parse_hookspec_opts(self, module_or_class: Any, name: str) -> Any:
        if module_or_class is not HookSpecs:
            return super().parse_hookspec_opts(module_or_class, name)
        if name not in _SPEC_OPTS:
            _SPEC_OPTS[name] = super().parse_hookspec_opts(module_or_class, name)
        return _SPEC_OPTS[name]


@dataclass(frozen=True, slots=True)
class Registration:
    """One registered name: what it is, where it came from."""

    category: str
    name: str
    origin: str
    factory: Any


class PluginHost:
    """Collects what the plugins register and answers name look-ups.

    Args:
        plugins: extra plugin objects or modules (hook implementations), registered after
            the entry points; observers are plugins too.
        entry_points: load installed entry points of group ``rlm_graph`` (default on).
    """

    CATEGORIES = ("providers", "environments", "compaction_strategies", "executors", "eval_methods")

    def __init__(self, plugins: Iterable[object] = (), *, entry_points: bool = True) -> None:
        self.pm = _Manager(PROJECT)
        self.pm.add_hookspecs(HookSpecs)
        self._origins: dict[int, str] = {}
        if entry_points:
            for name, dist, plugin in _entry_point_plugins():
                self._register(plugin, f"entry point {name!r} of {dist}")
        for plugin in plugins:
            self._register(plugin, "registered in code")
        self._check_pending()
        self._registry = {c: self._collect(c) for c in self.CATEGORIES}
        self._models = self._collect_models()

    def _register(self, plugin: object, origin: str) -> None:
        if self.pm.is_registered(plugin):
            return
        try:
            self.pm.register(plugin)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(f"cannot register plugin {plugin!r} ({origin}): {exc}") from exc
        self._origins[id(plugin)] = origin

    def register(self, plugin: object) -> None:
        """Register one more plugin (an observer, say) after construction."""
        self._register(plugin, "registered in code")
        self._check_pending()
        self._registry = {c: self._collect(c) for c in self.CATEGORIES}
        self._models = self._collect_models()

    def _check_pending(self) -> None:
        """A hook implementation whose name is no hook (a typo) fails loudly, not never."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            hooks = ", ".join(name for name in vars(HookSpecs) if name.startswith("rlm_"))
            raise PluginError(f"{exc}; the rlm-graph hooks are: {hooks}") from None

    def _collect(self, category: str) -> dict[str, Registration]:
        hook = getattr(self.pm.hook, f"rlm_register_{category}")
        found: dict[str, Registration] = {}
        # pluggy calls the last registered first; walk in registration order so that
        # later registrations (code) override earlier ones (entry points).
        for impl in hook.get_hookimpls():
            result = impl.function()
            if result is None:
                continue
            if not isinstance(result, Mapping):
                raise PluginError(
                    f"{impl.plugin_name}: rlm_register_{category} must return a dict of "
                    f"name -> factory, got {type(result).__name__}"
                )
            origin = self._origins.get(id(impl.plugin), impl.plugin_name)
            for name, factory in result.items():
                if not callable(factory):
                    raise PluginError(
                        f"{origin}: {category} entry {name!r} is not callable; register a "
                        "factory (a class or function)"
                    )
                found[name] = Registration(category, name, origin, factory)
        return found

    def _collect_models(self) -> dict[str, ModelInfo]:
        models: dict[str, ModelInfo] = {}
        for impl in self.pm.hook.rlm_register_models.get_hookimpls():
            result = impl.function()
            if not isinstance(result, Mapping):
                continue
            for name, info in result.items():
                # Merge field by field: one plugin may know a model's window and another
                # its price; neither should wipe the other's.
                known = models.get(name)
                if known is not None:
                    info = known.model_copy(update=info.model_dump(exclude_none=True))
                models[name] = info
        return models

    def names(self, category: str) -> list[str]:
        return sorted(self._registry[category])

    def lookup(self, category: str, name: str) -> Any:
        """The factory registered under ``name``.

        Raises:
            PluginError: no such name; the message lists what is registered.
        """
        try:
            return self._registry[category][name].factory
        except KeyError:
            singular = _SINGULAR[category]
            known = ", ".join(self.names(category)) or "(none)"
            raise PluginError(
                f"unknown {singular} {name!r}; registered: {known}. Install or register the "
                f"plugin that provides it, or pick one of those names"
            ) from None

    def registrations(self) -> list[Registration]:
        return [reg for c in self.CATEGORIES for reg in self._registry[c].values()]

    @property
    def models(self) -> dict[str, ModelInfo]:
        return dict(self._models)

    @property
    def hook(self) -> Any:
        return self.pm.hook
