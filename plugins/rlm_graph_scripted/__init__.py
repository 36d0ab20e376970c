"""The ``scripted`` provider: deterministic answers for tests, demos and replays.

Registered under the backend name ``scripted`` through the entry point group
``rlm_graph``, like any third-party provider.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_graph.contracts import ProviderFactory
from rlm_graph.hooks import hookimpl

from .provider import Rule, ScriptedProvider, ScriptExhausted

__all__ = ["Rule", "ScriptExhausted", "ScriptedProvider", "rlm_register_providers"]


@hookimpl
def rlm_register_providers() -> Mapping[str, ProviderFactory]:
    return {"scripted": ScriptedProvider}
