"""The version of rlm-graph (one place; the package, traces and pyproject read it)."""

__version__ = "0.1.0"
