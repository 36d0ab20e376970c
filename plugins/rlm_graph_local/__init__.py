"""The ``local`` plugin: the REPL environment in worker threads of the engine's own
process, and the batch executor that runs a batch's completions in one trio loop.

The environment is fast and simple, and no boundary: use ``subprocess`` for code you do
not trust.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlm_graph.contracts import EnvironmentFactory
from rlm_graph.hooks import hookimpl

from .environment import LocalEnvironment
from .executor import LocalExecutor

__all__ = [
    "LocalEnvironment",
    "LocalExecutor",
    "rlm_register_environments",
    "rlm_register_executors",
]


@hookimpl
def rlm_register_environments() -> Mapping[str, EnvironmentFactory]:
    return {"local": LocalEnvironment}


@hookimpl
def rlm_register_executors() -> Mapping[str, Any]:
    return {"local": LocalExecutor}
