"""The hook specifications, under the name the design gives them.

The specs live in `rlm_graph.hooks.specs`; this module re-exports them so that
``from rlm_graph.hookspecs import hookimpl`` works as well.
"""

from __future__ import annotations

from .hooks.specs import PROJECT, HookSpecs, hookimpl, hookspec

__all__ = ["PROJECT", "HookSpecs", "hookimpl", "hookspec"]
