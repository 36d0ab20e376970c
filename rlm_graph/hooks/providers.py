"""A provider made from its registered factory and checked against the `Provider`
contract now, rather than mid-run: a factory's or a provider's mistake named as the
plugin's, with the fix, and a key it quoted redacted."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any, cast

from ..contracts import Provider
from ..errors import ConfigError, PluginError, RLMGraphError, message_of, scrub_error
from ..limits import is_rate
from ..tracing.scrub import Scrubber, secret_values
from .manager import PluginHost

__all__ = ["make_provider"]


def make_provider(
    host: PluginHost, backend: str | Provider, kwargs: Mapping[str, Any] | None
) -> Provider:
    if not isinstance(backend, str):
        # A ready provider object (e.g. a ScriptedProvider a test keeps a handle on).
        if callable(getattr(backend, "complete", None)) and not kwargs:
            return _checked(backend, type(backend).__name__)
        raise ConfigError(
            "a backend is a registered name (a str) or a provider object with complete(); "
            f"got {type(backend).__name__}" + (" with backend_kwargs" if kwargs else "")
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigError(
            f"the kwargs of backend {backend!r} must be a dict (e.g. {{'model_name': ...}}), "
            f"not {type(kwargs).__name__}"
        )
    factory = host.lookup("providers", backend)
    scrub = Scrubber(secret_values(kwargs, environ={})).scrub  # a key the factory quoted
    try:
        provider = factory(**dict(kwargs or {}))
    except TypeError as exc:
        found = _UNKNOWN_KEYWORD.search(str(exc))  # also one a factory's **kwargs passed on
        unknown = found.group(1) if found and found.group(1) in (kwargs or {}) else ""
        if not unknown and _binds(factory, kwargs):  # the keywords fit: a bug in the factory
            raise PluginError(
                f"backend {backend!r} failed to build: {scrub(message_of(exc))}"
            ) from None
        fix = _REFERENCE_KEYWORDS.get(
            unknown, "see the provider's documentation for the keywords it takes"
        )
        raise ConfigError(
            f"backend {backend!r} rejected its backend_kwargs: {scrub(message_of(exc))}; {fix}"
        ) from None
    except RLMGraphError as exc:  # the plugin's own verdict (a missing key, a bad base_url)
        scrub_error(exc, scrub)
        raise
    except (Exception, SystemExit) as exc:  # a third party's factory can fail in any way
        said = scrub(f"{type(exc).__name__}: {message_of(exc)}")
        raise PluginError(
            f"backend {backend!r} failed to build: {said}; check its backend_kwargs against "
            "the provider's documentation"
        ) from None
    return _checked(provider, repr(backend))


_UNKNOWN_KEYWORD = re.compile(r"__init__\(\) got an unexpected keyword argument '(\w+)'")
# The reference library's client keywords, and where each goes here.
_REFERENCE_KEYWORDS = {
    "sampling_args": "give the call's parameters as RLM(sampling_args={...})",
    "default_headers": "give headers as backend_kwargs['headers']",
    "max_retries": "give attempts as backend_kwargs['max_attempts'] (retries + 1)",
}


def _binds(factory: Any, kwargs: Mapping[str, Any] | None) -> bool:
    """Whether ``factory`` takes ``kwargs`` (False when that cannot be told)."""
    try:
        inspect.signature(factory).bind(**dict(kwargs or {}))
    except (TypeError, ValueError):
        return False
    return True


def _checked(provider: object, backend: str) -> Provider:
    """``provider`` checked against `Provider` and its capabilities' types, now rather
    than mid-run.

    Raises:
        PluginError: naming the backend, the attribute and what it must be.
    """
    for attr in ("complete", "aclose", "model", "max_concurrent", "name"):
        if not hasattr(provider, attr):
            raise PluginError(
                f"backend {backend} gave {type(provider).__name__}, which lacks {attr!r}; "
                "a provider must follow rlm_graph.contracts.Provider"
            )
    problem = _provider_problem(provider)
    if problem is not None:
        raise PluginError(
            f"backend {backend} ({type(provider).__name__}): {problem}; a provider must "
            "follow rlm_graph.contracts.Provider"
        )
    return cast(Provider, provider)


def _provider_problem(provider: object) -> str | None:
    """What is wrong with a provider's methods and declared fields, if anything."""
    for method in ("complete", "aclose"):
        if not callable(getattr(provider, method)):
            return f"{method} is not a method"
    for attr in ("model", "name"):
        value = getattr(provider, attr)
        if not isinstance(value, str) or not value:
            return f"{attr} must be a non-empty string, not {value!r:.60}"
    counts: tuple[tuple[str, bool], ...] = (
        ("max_concurrent", False),
        ("initial_concurrency", True),
        ("default_max_tokens", True),
    )
    for attr, optional in counts:
        value = getattr(provider, attr, None)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{attr} must be a whole number >= 1, not {value!r:.60}"
    for attr in ("requests_per_minute", "tokens_per_minute"):
        value = getattr(provider, attr, None)
        if value is not None and not is_rate(value):
            return f"{attr} must be a positive number, or None for no limit, not {value!r:.60}"
    for attr in ("streams", "reports_cost"):
        value = getattr(provider, attr, None)
        if value is not None and not isinstance(value, bool):
            return f"{attr} must be True or False, not {value!r:.60}"
    if getattr(provider, "streams", False) and not callable(getattr(provider, "stream", None)):
        return "streams is True but it has no stream(request, sink) method"
    return None
