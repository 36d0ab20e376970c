"""The evaluation methods of the RLM paper, for ``rlm-graph eval`` (docs/eval.md).

Registered under ``rlm``, ``rlm-no-subcalls``, ``base`` and ``summary`` through the entry
point group ``rlm_graph``, as a stranger's methods would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlm_graph.hooks import hookimpl

from .methods import BaseMethod, NoSubcallsMethod, RLMMethod, SummaryMethod

__all__ = ["BaseMethod", "NoSubcallsMethod", "RLMMethod", "SummaryMethod", "rlm_register_eval_methods"]


@hookimpl
def rlm_register_eval_methods() -> Mapping[str, Any]:
    return {
        method.name: method
        for method in (RLMMethod, NoSubcallsMethod, BaseMethod, SummaryMethod)
    }
