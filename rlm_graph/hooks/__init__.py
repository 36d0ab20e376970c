"""Plugin hooks: the specs plugins implement and the host that collects them."""

from __future__ import annotations

from .manager import PluginHost, Registration
from .specs import PROJECT, HookSpecs, hookimpl, hookspec

__all__ = ["PROJECT", "HookSpecs", "PluginHost", "Registration", "hookimpl", "hookspec"]
