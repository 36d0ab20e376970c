"""The plugin host: one pluggy manager per engine, fed by entry points and by code.

Invariants:
    - Entry points of group ``rlm_graph`` are imported once per process and registered in
      every engine; plugins passed in code are registered after them and win on a name
      clash.
    - An entry point that fails to import is skipped and remembered (`broken_plugins`):
      `rlm-graph plugins` lists it with its error, an engine that needs none of its names
      works, and a lookup of a name it might have provided says so. So is an installed
      plugin whose hook raises or answers wrongly, or that implements an unknown hook
      (`PluginHost.broken`); a plugin passed in code fails the engine instead, with a
      `PluginError` naming it and the hook.
    - Two installed plugins registering one name: a name of rlm-graph's own plugins stays
      theirs, else the later wins; either way a warning names both. Code wins silently
      over installed plugins; of two plugins passed in code, the later wins, with a
      warning.
    - Hooks are called through pluggy's hook callers (wrappers and ``pm.trace`` apply),
      one plugin at a time, so that each registration names the plugin it came from.
    - An unknown name fails when the engine is configured, never mid-run, with the list of
      registered names.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import logging
import re
import types
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy
from pydantic import ValidationError

from ..contracts import ModelInfo
from ..errors import PluginError
from .specs import PROJECT, HookSpecs

__all__ = ["BrokenPlugin", "PluginHost", "Registration", "broken_plugins"]

logger = logging.getLogger("rlm_graph")

_OWN = "rlm-graph"
"""The distribution of the first-party plugins (plugins/)."""

_IN_CODE = "registered in code"
"""The origin of a plugin passed in code (`PluginHost(plugins=...)`, `register`)."""

_SINGULAR = {
    "providers": "backend",
    "environments": "environment",
    "compaction_strategies": "compaction strategy",
    "executors": "executor",
    "eval_methods": "eval method",
}


@dataclass(frozen=True, slots=True)
class BrokenPlugin:
    """An entry point of group ``rlm_graph`` that failed to import, or whose hook
    raised or answered wrongly (``error`` says which)."""

    name: str
    value: str
    distribution: str
    error: str


_ENTRY_POINT_CACHE: tuple[list[tuple[str, str, str, object]], list[BrokenPlugin]] | None = None


def _entry_points() -> tuple[list[tuple[str, str, str, object]], list[BrokenPlugin]]:
    """(entry point name, value, distribution, loaded plugin) for group ``rlm_graph``,
    and the entry points that failed to load; cached for the process."""
    global _ENTRY_POINT_CACHE
    if _ENTRY_POINT_CACHE is None:
        loaded, broken = [], []
        for ep in importlib.metadata.entry_points(group=PROJECT):
            dist = ep.dist.name if ep.dist is not None else "?"
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:  # a third-party import can fail in any way
                broken.append(BrokenPlugin(ep.name, ep.value, dist, f"{type(exc).__name__}: {exc}"))
                continue
            loaded.append((ep.name, ep.value, dist, _hook_object(plugin)))
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


def _bad_registrations(category: str, result: object) -> str | None:
    """What is wrong with an ``rlm_register_<category>`` answer, if anything."""
    if not isinstance(result, Mapping):
        return (
            f"rlm_register_{category} must return a dict of name -> factory, got "
            f"{type(result).__name__}"
        )
    for name, factory in result.items():
        if not isinstance(name, str) or not name:
            return f"rlm_register_{category} returned the name {name!r}; names are strings"
        if not callable(factory):
            return (
                f"{category} entry {name!r} is not callable; register a factory (a class or "
                "function)"
            )
    return None


def _models_of(result: object) -> dict[str, ModelInfo] | str:
    """An ``rlm_register_models`` answer as ModelInfos (a dict per model is validated
    into one), or what is wrong with it."""
    if not isinstance(result, Mapping):
        return f"rlm_register_models must return a dict of model -> ModelInfo, got {type(result).__name__}"
    models: dict[str, ModelInfo] = {}
    for name, info in result.items():
        if not isinstance(name, str) or not name:
            return f"rlm_register_models returned the model name {name!r}; names are strings"
        try:
            models[name] = info if isinstance(info, ModelInfo) else ModelInfo.model_validate(info)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()
            )
            return f"rlm_register_models[{name!r}] is not a ModelInfo ({problems})"
    return models


def _keeps(earlier: Registration, origin: str) -> bool:
    """Whether a name registered by ``earlier`` stays its own when the installed plugin
    ``origin`` registers it too: rlm-graph's own plugins keep their names."""
    return origin.startswith("entry point") and earlier.origin.endswith(f" of {_OWN}")


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
        self._installed: dict[int, BrokenPlugin] = {}  # id(plugin) -> its entry point
        self.broken: list[BrokenPlugin] = []
        if entry_points:
            loaded, broken = _entry_points()
            self.broken = list(broken)
            for name, value, dist, plugin in loaded:
                self._register_installed(plugin, BrokenPlugin(name, value, dist, ""))
        if isinstance(plugins, str | bytes) or not isinstance(plugins, Iterable):
            raise PluginError(
                f"plugins must be a list of plugin objects or modules, not "
                f"{type(plugins).__name__}; pass plugins=[MyPlugin()]"
            )
        for plugin in plugins:
            self._register_code(plugin)
        self._registry, self._models = self._collect_all()

    def _register(self, plugin: object, origin: str) -> None:
        if plugin is None or isinstance(plugin, str | bytes | type):
            what = f"the class {plugin.__name__}" if isinstance(plugin, type) else repr(plugin)
            raise PluginError(
                f"cannot register {what} as a plugin ({origin}): pass an instance or a "
                "module, e.g. plugins=[MyPlugin()]"
            )
        plugin = _hook_object(plugin)
        if self.pm.is_registered(plugin):
            return
        named = getattr(plugin, "__name__", None) or f"{type(plugin).__name__} object"
        try:
            self.pm.register(plugin, name=getattr(plugin, "__name__", None))
        except pluggy.PluginValidationError as exc:  # pluggy's lines name it by its id()
            lines = str(exc).splitlines() or [""]
            lines[0] = re.sub(r"^Plugin '[^']*' ", "", lines[0])  # "for hook 'name'"
            said = "; ".join(line.strip() for line in lines if line.strip())
            if "can not be found in the hookspec" in said:
                said += (
                    ": a hook takes only the arguments its spec names (the rlm_register_* "
                    "hooks none but self; docs/plugins.md lists them)"
                )
            raise PluginError(f"cannot register plugin {named} ({origin}): {said}") from exc
        except ValueError as exc:
            raise PluginError(f"cannot register plugin {named} ({origin}): {exc}") from exc
        self._origins[id(plugin)] = origin

    def _register_installed(self, plugin: object, entry: BrokenPlugin) -> None:
        """An installed plugin that cannot be registered (a hook whose arguments are not
        the hook's, an entry point naming a class) or has an ``async`` hook is skipped
        with a warning and listed as broken: one package never stops every engine."""
        try:
            self._register(plugin, f"entry point {entry.name!r} of {entry.distribution}")
        except PluginError as exc:
            _warn_once(
                "the installed rlm-graph plugin %r (%s) is skipped: %s",
                entry.name,
                entry.distribution,
                exc,
            )
            self.broken.append(dataclasses.replace(entry, error=str(exc)))
            return
        hooked = _hook_object(plugin)
        if self.pm.is_registered(hooked) and not self.pm.get_hookcallers(hooked):
            self.pm.unregister(
                hooked
            )  # an entry point naming a hook function, a module without hooks
            hookless = (
                f"its entry point ({entry.value}) names an object with no @hookimpl hooks: "
                "point it at the module (or an instance) holding the hooks"
            )
            _warn_once(
                "the installed rlm-graph plugin %r (%s) is skipped: %s",
                entry.name,
                entry.distribution,
                hookless,
            )
            self.broken.append(dataclasses.replace(entry, error=hookless))
            return
        self._installed[id(hooked)] = entry
        problem = _async_hook(self.pm, hooked)
        if problem is not None:
            self._fault(hooked, problem)

    def _register_code(self, plugin: object) -> None:
        """A plugin passed in code; one with no hook implementation is a mistake (its
        methods lack ``@hookimpl``, or it is not a plugin at all), said at once, as is an
        ``async`` hook (it would never run: hooks are called, not awaited). An installed
        plugin passed in code is code's from then on: registered last, it wins."""
        hooked = _hook_object(plugin)
        if self._installed.pop(id(hooked), None) is not None:
            self.pm.unregister(hooked)
        self._register(plugin, _IN_CODE)
        if self.pm.is_registered(hooked) and not self.pm.get_hookcallers(hooked):
            self.pm.unregister(hooked)
            raise PluginError(
                f"{type(plugin).__name__} object {plugin!r:.60} implements no rlm-graph hook: "
                "mark a plugin's or an observer's methods with @rlm_graph.hooks.hookimpl "
                "and name them after the hooks (docs/plugins.md)"
            )
        problem = _async_hook(self.pm, hooked)
        if problem is not None:
            self.pm.unregister(hooked)
            raise PluginError(f"plugin {plugin!r:.60} (registered in code): {problem}")

    def register(self, plugin: object) -> None:
        """Register one more plugin (an observer, say) after construction."""
        self._register_code(plugin)
        self._registry, self._models = self._collect_all()

    def _collect_all(self) -> tuple[dict[str, dict[str, Registration]], dict[str, ModelInfo]]:
        """Every category's registrations and the models, from the plugins that answer
        well; gathered again whenever an installed plugin had to be skipped, so that
        nothing of a skipped plugin stays."""
        while True:
            skipped = len(self.broken)
            self._check_pending()
            registry = {c: self._collect(c) for c in self.CATEGORIES}
            models = self._collect_models()
            if len(self.broken) == skipped:
                return registry, models

    def _fault(self, plugin: object, problem: str) -> PluginError | None:
        """An installed plugin that answered wrongly is skipped from now on (and listed
        as broken); for one registered in code, the error to raise."""
        installed = self._installed.pop(id(plugin), None)
        if installed is None:
            name = getattr(plugin, "__name__", None) or type(plugin).__qualname__
            return PluginError(f"plugin {name} ({self._origin(plugin)}): {problem}")
        _warn_once(
            "the installed rlm-graph plugin %r (%s) is skipped: %s",
            installed.name,
            installed.distribution,
            problem,
        )
        self.broken.append(
            BrokenPlugin(installed.name, installed.value, installed.distribution, problem)
        )
        self.pm.unregister(plugin)
        return None

    def _origin(self, plugin: object) -> str:
        return self._origins.get(id(plugin), self.pm.get_name(plugin) or repr(plugin))

    def _check_pending(self) -> None:
        """A hook implementation whose name is no hook (a typo) fails loudly, not never."""
        hooks = ", ".join(name for name in vars(HookSpecs) if name.startswith("rlm_"))
        for name in list(vars(self.pm.hook)):
            caller = getattr(self.pm.hook, name)
            if name.startswith("_") or caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if impl.optionalhook:
                    continue
                error = self._fault(
                    impl.plugin, f"unknown hook {name!r}; the rlm-graph hooks are: {hooks}"
                )
                if error is not None:
                    raise error

    def _results(self, hook_name: str) -> list[tuple[object, Any]]:
        """(plugin, result) of hook ``hook_name`` for each plugin implementing it, in
        registration order (so that later registrations, code, override earlier ones,
        entry points), each called through pluggy."""
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        plugins = [impl.plugin for impl in impls]
        results: list[tuple[object, Any]] = []
        for plugin in dict.fromkeys(plugins):  # pluggy lists them in registration order
            others = [p for p in plugins if p is not plugin]
            try:
                answers = self.pm.subset_hook_caller(hook_name, others)()
            except (Exception, SystemExit) as exc:  # a third party's hook can fail in any way
                error = self._fault(plugin, f"{hook_name} raised {type(exc).__name__}: {exc}")
                if error is not None:
                    raise error from exc
                continue
            if not answers and any(
                impl.plugin is plugin and not (impl.wrapper or impl.hookwrapper) for impl in impls
            ):  # pluggy leaves a None answer out: nothing, or a forgotten ``return``
                _warn_once(
                    "the rlm-graph plugin %s (%s): %s returned None, so it registers nothing "
                    "there (a forgotten return?)",
                    getattr(plugin, "__name__", None) or type(plugin).__qualname__,
                    self._origin(plugin),
                    hook_name,
                )
            results.extend((plugin, r) for r in answers)
        return results

    def _collect(self, category: str) -> dict[str, Registration]:
        found: dict[str, Registration] = {}
        for plugin, result in self._results(f"rlm_register_{category}"):
            problem = _bad_registrations(category, result)
            if problem is not None:
                error = self._fault(plugin, problem)
                if error is not None:
                    raise error
                continue
            origin = self._origin(plugin)
            for name, factory in result.items():
                self._warn_clash(found.get(name), origin, category, name)
                if found.get(name) is None or not _keeps(found[name], origin):
                    found[name] = Registration(category, name, origin, factory)
        return found

    def _warn_clash(
        self, earlier: Registration | None, origin: str, category: str, name: str
    ) -> None:
        """Two installed plugins registering one name: say which one stays. Two plugins
        passed in code: the later one's (code chose the order), said once."""
        if earlier is None:
            return
        if origin == earlier.origin == _IN_CODE:
            _warn_once(
                "%s %r is registered by two plugins passed in code; the later one's is used "
                "(pass one of them to keep this quiet)",
                _SINGULAR[category],
                name,
            )
            return
        if not origin.startswith("entry point"):
            return
        kept = earlier.origin if _keeps(earlier, origin) else origin
        _warn_once(
            "%s %r is registered by %s and by %s; %s's is used (register yours in code, "
            "plugins=[...], to choose)",
            _SINGULAR[category],
            name,
            earlier.origin,
            origin,
            kept,
        )

    def _collect_models(self) -> dict[str, ModelInfo]:
        models: dict[str, ModelInfo] = {}
        for plugin, result in self._results("rlm_register_models"):
            checked = _models_of(result)
            if isinstance(checked, str):
                error = self._fault(plugin, checked)
                if error is not None:
                    raise error
                continue
            for name, info in checked.items():
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


def _async_hook(pm: pluggy.PluginManager, plugin: object) -> str | None:
    """What is wrong with ``plugin`` if one of its hooks is ``async`` (or a generator):
    the engine calls hooks and never awaits them, so such a hook would never run."""
    for caller in pm.get_hookcallers(plugin) or ():
        for impl in caller.get_hookimpls():
            function = impl.function
            if impl.plugin is plugin and (
                inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)
            ):
                return (
                    f"hook {caller.name} is async, and would never run: hooks are called, "
                    "not awaited; make it a plain def and start async work elsewhere"
                )
    return None


_WARNED: set[str] = set()
"""Warnings about installed plugins already given in this process."""


def _warn_once(message: str, *args: object) -> None:
    """A warning about the installed plugins, given once per process: every engine
    (a batch may build one per completion) finds the same plugins again, and a pass
    gathering them again after a skip meets the same clash again."""
    text = message % args
    if text in _WARNED:
        logger.debug("%s", text)
        return
    if len(_WARNED) < 1024:
        _WARNED.add(text)
    logger.warning("%s", text)
