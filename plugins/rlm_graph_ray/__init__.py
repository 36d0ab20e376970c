"""The ``ray`` batch executor: each completion of a batch a call to a long-lived Ray
worker, provider limits held cluster-wide by one Ray actor. Ray is optional
(``pip install 'rlm-graph[ray]'``): this module imports without it, and asking for the
executor without it says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlm_graph.hooks import hookimpl

__all__ = ["rlm_register_executors"]


def _ray_executor(**kwargs: Any) -> Any:
    from .executor import RayExecutor

    return RayExecutor(**kwargs)


@hookimpl
def rlm_register_executors() -> Mapping[str, Any]:
    return {"ray": _ray_executor}
