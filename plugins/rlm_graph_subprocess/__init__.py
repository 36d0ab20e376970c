"""The ``subprocess`` environment: the REPL in a child Python process.

Use it for code you do not trust: a block can be killed at its ``timeout``, the guest
runs under resource limits, in its own temporary working directory, with an environment
stripped of secrets and, where the platform allows, without network. See
docs/environments.md for what it does and does not protect against.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_graph.contracts import EnvironmentFactory
from rlm_graph.hooks import hookimpl

from .boundaries import GuestLimits
from .environment import SubprocessEnvironment

__all__ = ["GuestLimits", "SubprocessEnvironment", "rlm_register_environments"]


@hookimpl
def rlm_register_environments() -> Mapping[str, EnvironmentFactory]:
    return {"subprocess": SubprocessEnvironment}
