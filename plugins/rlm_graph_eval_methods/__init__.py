"""The evaluation methods of the RLM paper, for ``rlm-graph eval`` (docs/eval.md).

Registered under ``rlm``, ``rlm-no-subcalls``, ``base`` and ``summary`` through the entry
point group ``rlm_graph``, as a stranger's methods would be.

Every process that builds an engine loads the entry points, so this module imports
nothing: a method's module is imported when an evaluation builds the method.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from rlm_graph.hooks import hookimpl

__all__ = [
    "BaseMethod",
    "NoSubcallsMethod",
    "RLMMethod",
    "SummaryMethod",
    "rlm_register_eval_methods",
]

_CLASSES = {
    "rlm": "RLMMethod",
    "rlm-no-subcalls": "NoSubcallsMethod",
    "base": "BaseMethod",
    "summary": "SummaryMethod",
}


def _factory(class_name: str) -> Callable[[], Any]:
    def build() -> Any:
        return getattr(importlib.import_module(".methods", __name__), class_name)()

    build.__qualname__ = class_name
    return build


@hookimpl
def rlm_register_eval_methods() -> Mapping[str, Any]:
    return {name: _factory(class_name) for name, class_name in _CLASSES.items()}


def __getattr__(name: str) -> Any:
    if name in _CLASSES.values():
        return getattr(importlib.import_module(".methods", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
