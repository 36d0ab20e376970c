"""The version of rlm-graph (one place; the package, traces and pyproject read it)."""

__version__ = "0.2.0.dev0"
