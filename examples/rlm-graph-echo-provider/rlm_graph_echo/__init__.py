"""An example provider plugin for rlm-graph: the ``echo`` backend.

It talks to the "Echo API", a deliberately tiny JSON API (``POST {base_url}/echo``) that
stands in for whatever service you want to wrap. Read docs/writing-a-provider.md in the
rlm-graph repository for the walk-through.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_graph.contracts import ModelInfo, ProviderFactory
from rlm_graph.hooks import hookimpl

from .provider import EchoProvider

# The fake server (rlm_graph_echo.server) is for tests: it is not imported here, since
# every engine of an install imports this module to find its hooks.
__all__ = ["EchoProvider", "rlm_register_models", "rlm_register_providers"]


@hookimpl
def rlm_register_providers() -> Mapping[str, ProviderFactory]:
    return {"echo": EchoProvider}


@hookimpl
def rlm_register_models() -> Mapping[str, ModelInfo]:
    return {
        "echo-1": ModelInfo(context_window=8_000, input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    }
