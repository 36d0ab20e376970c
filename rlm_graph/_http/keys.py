"""Which API key a provider sends, and to where: keys go only where they belong.

A key found in the environment (``OPENAI_API_KEY``...) was put there for the provider's
own API. Sending it to whatever ``base_url`` a configuration names would hand it to a
local llama.cpp, a test server or a hostile proxy. The rules, in order:

    1. ``api_key="..."`` given explicitly: sent to the configured ``base_url``, whatever it is.
    2. ``api_key_env="NAME"`` given explicitly: the value of ``$NAME`` (an error when unset),
       sent to the configured ``base_url``, whatever it is (the explicit opt-in).
    3. The backend's own variable (``OPENAI_API_KEY``...) is sent only when the base URL is
       the backend's default or the provider's official host over https, or also came
       from the environment (the backend's base-URL variable, ``OPENAI_BASE_URL``...).
    4. Otherwise no key is sent. That is right for local servers that need none (vLLM,
       Ollama, llama.cpp); when the backend's variable is set, one warning names the
       rule and how to opt in, and a 401 from the server repeats it.

Invariants:
    - A key is never logged, and no message here quotes one: only variable names and hosts.
    - Pure: no trio, no httpx (URLs are parsed with ``urllib.parse``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError

__all__ = ["KeyPolicy", "ResolvedKey", "Secret", "resolve_key"]

logger = logging.getLogger("rlm_graph.providers")


class Secret:
    """A string that never shows itself: its repr and str are ``'<hidden>'``.

    Keeps an API key out of reprs, ``vars()`` dumps and debuggers' variable views; call
    `reveal` at the one place the value is needed (building a request header).
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<hidden>"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """Where one backend's key comes from and where it may go.

    Attributes:
        backend: the backend's name, for messages.
        default_base_url: the API root used when no ``base_url`` is configured.
        key_env: the backend's key variable (``OPENAI_API_KEY``), or ``None`` for a backend
            that never reads one (``vllm``, ``ollama``).
        base_url_env: the variable that may name a base URL the key belongs to
            (``OPENAI_BASE_URL``), or ``None``.
        official_hosts: hosts (over https) an environment key may always go to.
        key_required: fail at configuration when the official API would get no key.
    """

    backend: str
    default_base_url: str
    key_env: str | None = None
    base_url_env: str | None = None
    official_hosts: frozenset[str] = frozenset()
    key_required: bool = False

    def is_official(self, base_url: str) -> bool:
        """``base_url`` is the backend's default, or https to one of its own hosts."""
        if _same_url(base_url, self.default_base_url):
            return True
        parts = urlsplit(base_url)
        return parts.scheme == "https" and (parts.hostname or "") in self.official_hosts


@dataclass(frozen=True, slots=True)
class ResolvedKey:
    """The outcome: the base URL to call, the key to send (or none), and why.

    Attributes:
        base_url: the API root to use.
        key: the key to send, or ``None``.
        rule: one sentence on which rule chose the key (never the key): for logs and
            for the hint a 401 carries.
        variables: the environment variables the key and the base URL were taken from
            (``api_key_env``'s, the backend's key variable, its base-URL variable): what
            a process building the same provider elsewhere needs (the ray executor
            sends these to its workers).
    """

    base_url: str
    key: str | None
    rule: str
    variables: tuple[str, ...] = ()


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def resolve_key(
    policy: KeyPolicy,
    *,
    api_key: str | None = None,
    api_key_env: str | None = None,
    base_url: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ResolvedKey:
    """Apply the module's rules to one provider's configuration.

    Args:
        policy: the backend's `KeyPolicy`.
        api_key: an explicit key (``backend_kwargs['api_key']``).
        api_key_env: the name of a variable holding the key, an explicit opt-in to send
            it to ``base_url`` wherever that is.
        base_url: the configured API root, or ``None`` for the environment's or the
            backend's default.
        environ: the environment (default ``os.environ``).

    Returns:
        A `ResolvedKey`.

    Raises:
        ConfigError: both ``api_key`` and ``api_key_env``; ``api_key_env`` unset or not a
            name; the official API with no key where one is required.
    """
    env = os.environ if environ is None else environ
    url, url_from_env = _base_url(policy, base_url, env)
    name = policy.backend
    if api_key is not None and api_key_env is not None:
        raise ConfigError(f"{name}: pass api_key or api_key_env, not both")
    url_variable = (policy.base_url_env,) if url_from_env and policy.base_url_env else ()
    if api_key:
        if not isinstance(api_key, str):
            raise ConfigError(f"{name}: api_key must be a string")
        return ResolvedKey(url, api_key, "the key passed as api_key", url_variable)
    if api_key_env is not None:
        key = _from_named_variable(name, api_key_env, env)
        rule = f"${api_key_env} (api_key_env)"
        return ResolvedKey(url, key, rule, (api_key_env, *url_variable))
    env_key = env.get(policy.key_env) if policy.key_env else None
    if env_key and policy.key_env and (url_from_env or policy.is_official(url)):
        where = f"${policy.base_url_env}" if url_from_env else "the official host"
        rule = f"${policy.key_env}, sent to {where}"
        return ResolvedKey(url, env_key, rule, (policy.key_env, *url_variable))
    if env_key:
        rule = _withheld_rule(policy, url)
        logger.warning("%s", rule)
        return ResolvedKey(url, None, rule)
    if policy.key_required and policy.is_official(url):
        raise ConfigError(
            f"{name}: no API key; set the {policy.key_env} environment variable, or name "
            "another that holds it (rlm-graph: --api-key-env NAME; Python: "
            "backend_kwargs={'api_key_env': 'NAME'} or {'api_key': ...})"
        )
    return ResolvedKey(url, None, _no_key_rule(policy), url_variable)


def _base_url(policy: KeyPolicy, base_url: str | None, env: Mapping[str, str]) -> tuple[str, bool]:
    """The base URL to use, and whether it came from (or matches) the environment."""
    from_env = env.get(policy.base_url_env) if policy.base_url_env else None
    if base_url is None:
        return (from_env, True) if from_env else (policy.default_base_url, False)
    if not isinstance(base_url, str) or not base_url.strip():
        raise ConfigError(
            f"{policy.backend}: base_url must be a URL string, e.g. 'http://127.0.0.1:8000/v1'"
        )
    return base_url, bool(from_env) and _same_url(base_url, from_env or "")


def _from_named_variable(backend: str, variable: str, env: Mapping[str, str]) -> str:
    if not isinstance(variable, str) or not variable.strip():
        raise ConfigError(
            f"{backend}: api_key_env must name an environment variable, e.g. 'OPENAI_API_KEY'"
        )
    if not _VARIABLE.fullmatch(variable):  # a key pasted where its name goes: not echoed
        raise ConfigError(
            f"{backend}: api_key_env must be the name of an environment variable (letters, "
            "digits and _), not the key itself; export the key as a variable and name it "
            "(rlm-graph run --api-key-env NAME)"
        )
    value = env.get(variable)
    if not value:
        raise ConfigError(
            f"{backend}: api_key_env={variable!r} but ${variable} is not set (or empty); "
            "export it (or pass api_key)"
        )
    return value


def _withheld_rule(policy: KeyPolicy, url: str) -> str:
    host = urlsplit(url).hostname or url
    official = ", ".join(sorted(policy.official_hosts)) or "the provider's host"
    via = f" nor from ${policy.base_url_env}" if policy.base_url_env else ""
    return (
        f"{policy.backend}: ${policy.key_env} is not sent to {host}: base_url is not "
        f"{official} over https{via}. Fine for a server that needs no key; to send a key "
        f"there, pass backend_kwargs={{'api_key_env': '{policy.key_env}'}} or "
        f"{{'api_key': ...}} (on the command line: --api-key-env {policy.key_env})"
    )


def _no_key_rule(policy: KeyPolicy) -> str:
    if policy.key_env is None:
        return f"{policy.backend}: no key configured (the {policy.backend} backend reads none from the environment)"
    return f"{policy.backend}: no key configured (${policy.key_env} is not set)"
