"""The plugin host: one pluggy manager per engine, fed by entry points and by code.

Invariants:
    - Entry points of group ``rlm_graph`` are imported once per process and registered in
      every engine; plugins passed in code are registered after them and win on a name
      clash.
    - An entry point that fails to import is skipped and remembered (`broken_plugins`):
      `rlm-graph plugins` lists it with its error, an engine that needs none of its names
      works, and a lookup of a name it might have provided says so.
    - Hooks are called through pluggy's hook callers (wrappers and ``pm.trace`` apply),
      one plugin at a time, so that each registration names the plugin it came from.
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

__all__ = ["BrokenPlugin", "PluginHost", "Registration", "broken_plugins"]

_SINGULAR = {
    "providers": "backend",
    "environments": "environment",
    "compaction_strategies": "compaction strategy",
    "executors": "executor",
    "eval_methods": "eval method",
}


@dataclass(frozen=True, slots=True)
class BrokenPlugin:
    """An entry point of group ``rlm_graph`` that failed to import."""

    name: str
    value: str
    distribution: str
    error: str


_ENTRY_POINT_CACHE: tuple[list[tuple[str, str, object]], list[BrokenPlugin]] | None = None


def _entry_points() -> tuple[list[tuple[str, str, object]], list[BrokenPlugin]]:
    """(entry point name, distribution, loaded plugin) for group ``rlm_graph``, and the
    entry points that failed to load; cached for the process."""
    global _ENTRY_POINT_CACHE
    if _ENTRY_POINT_CACHE is None:
        loaded, broken = [], []
        for ep in importlib.metadata.entry_points(group=PROJECT):
            dist = ep.dist.name if ep.dist is not None else "?"
            try:
                plugin = ep.load()
            except Exception as exc:  # a third-party import can fail in any way
                broken.append(BrokenPlugin(ep.name, ep.value, dist, f"{type(exc).__name__}: {exc}"))
                continue
            loaded.append((ep.name, dist, _hook_object(plugin)))
        _ENTRY_POINT_CACHE = (loaded, broken)
    return _ENTRY_POINT_CACHE


def broken_plugins() -> list[BrokenPlugin]:
    """The installed plugins that failed to load in this process (see `BrokenPlugin`)."""
    return list(_entry_points()[1])


_MARK = f"{PROJECT}_impl"
_HOOK_OBJECTS: weakref.WeakKeyDictionary[types.ModuleType, object] = weakref.WeakKeyDictionary()


def _hook_object(plugin: object) -> object:
    """What is registered for ``plugin``: a module's hook implementations, gathered once
    per process into a small object of their own; any other plugin as it is.

    pluggy looks at every attribute of what it registers (``inspect.getattr_static``,
    about 0.2 ms for a module and all it imports), and every engine registers the
    installed plugins again: a batch on Ray builds one per completion.
    """
    if not isinstance(plugin, types.ModuleType):
        return plugin
    found = _HOOK_OBJECTS.get(plugin)
    if found is None:
        hooks = {
            name: value
            for name, value in vars(plugin).items()
            if callable(value) and hasattr(value, _MARK)
        }
        found = _HOOK_OBJECTS[plugin] = _ModuleHooks(plugin.__name__, hooks)
    return found


class _ModuleHooks:
    """A plugin module's hook implementations, as pluggy registers them."""

    def __init__(self, name: str, hooks: Mapping[str, Any]) -> None:
        self.__name__ = name
        self._names = list(hooks)
        vars(self).update(hooks)

    def __dir__(self) -> list[str]:
        # What pluggy walks when it registers this: the hooks, and nothing else.
        return self._names

    def __repr__(self) -> str:
        return f"<module {self.__name__!r}>"


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
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(HookSpecs)
        self._origins: dict[int, str] = {}
        self.broken: list[BrokenPlugin] = []
        if entry_points:
            loaded, self.broken = _entry_points()
            for name, dist, plugin in loaded:
                self._register(plugin, f"entry point {name!r} of {dist}")
        for plugin in plugins:
            self._register(plugin, "registered in code")
        self._check_pending()
        self._registry = {c: self._collect(c) for c in self.CATEGORIES}
        self._models = self._collect_models()

    def _register(self, plugin: object, origin: str) -> None:
        plugin = _hook_object(plugin)
        if self.pm.is_registered(plugin):
            return
        try:
            self.pm.register(plugin, name=getattr(plugin, "__name__", None))
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

    def _results(self, hook_name: str) -> list[tuple[object, Any]]:
        """(plugin, result) of hook ``hook_name`` for each plugin implementing it, in
        registration order (so that later registrations, code, override earlier ones,
        entry points), each called through pluggy."""
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        plugins = [impl.plugin for impl in impls]
        results: list[tuple[object, Any]] = []
        for plugin in dict.fromkeys(plugins):  # pluggy lists them in registration order
            others = [p for p in plugins if p is not plugin]
            results.extend((plugin, r) for r in self.pm.subset_hook_caller(hook_name, others)())
        return results

    def _collect(self, category: str) -> dict[str, Registration]:
        found: dict[str, Registration] = {}
        for plugin, result in self._results(f"rlm_register_{category}"):
            origin = self._origins.get(id(plugin), self.pm.get_name(plugin) or repr(plugin))
            if not isinstance(result, Mapping):
                raise PluginError(
                    f"{origin}: rlm_register_{category} must return a dict of "
                    f"name -> factory, got {type(result).__name__}"
                )
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
        for _, result in self._results("rlm_register_models"):
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
            broken = "".join(
                f"; the installed plugin {b.name!r} ({b.distribution}), which may provide "
                f"it, failed to load: {b.error}"
                for b in self.broken
            )
            raise PluginError(
                f"unknown {singular} {name!r}; registered: {known}{broken}. Install or "
                "register the plugin that provides it, or pick one of those names"
            ) from None

    def registrations(self) -> list[Registration]:
        return [reg for c in self.CATEGORIES for reg in self._registry[c].values()]

    @property
    def models(self) -> dict[str, ModelInfo]:
        return dict(self._models)

    @property
    def hook(self) -> Any:
        return self.pm.hook
