"""The ``local`` environment: the REPL in worker threads of the engine's own process.

Fast and simple, and no boundary: use ``subprocess`` for code you do not trust.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_graph.contracts import EnvironmentFactory
from rlm_graph.hooks import hookimpl

from .environment import LocalEnvironment

__all__ = ["LocalEnvironment", "rlm_register_environments"]


@hookimpl
def rlm_register_environments() -> Mapping[str, EnvironmentFactory]:
    return {"local": LocalEnvironment}
