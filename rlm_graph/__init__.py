"""rlm-graph: Recursive Language Models run as a workflow graph.

Layout (bottom to top): ``graph``, ``protocol`` and ``limits`` are pure; ``contracts`` is
the seam plugins implement; ``runtime`` is the only package that knows trio; ``hooks`` is
the plugin layer; ``engine`` and ``cli`` are the facade.

``import rlm_graph`` is cheap: the names below load their module on first use (PEP 562
``__getattr__``), so a program that needs one pure module (the subprocess REPL's guest
needs ``rlm_graph.repl``) does not pay for trio, httpx, networkx and OpenTelemetry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batch import (
        BatchItem as BatchItem,
    )
    from .batch import (
        BatchResult as BatchResult,
    )
    from .batch import (
        run_batch as run_batch,
    )
    from .contracts import (
        ChatRequest as ChatRequest,
    )
    from .contracts import (
        ChatResponse as ChatResponse,
    )
    from .contracts import (
        ExecResult as ExecResult,
    )
    from .contracts import (
        Image as Image,
    )
    from .contracts import (
        Message as Message,
    )
    from .contracts import (
        ModelInfo as ModelInfo,
    )
    from .contracts import (
        Usage as Usage,
    )
    from .engine import Engine as Engine
    from .errors import (
        BudgetExceeded as BudgetExceeded,
    )
    from .errors import (
        ConfigError as ConfigError,
    )
    from .errors import (
        ContextLengthExceeded as ContextLengthExceeded,
    )
    from .errors import (
        DeadlineExceeded as DeadlineExceeded,
    )
    from .errors import (
        EnvironmentCrashed as EnvironmentCrashed,
    )
    from .errors import (
        ErrorLimitExceeded as ErrorLimitExceeded,
    )
    from .errors import (
        GraphError as GraphError,
    )
    from .errors import (
        IterationLimitExceeded as IterationLimitExceeded,
    )
    from .errors import (
        LimitExceeded as LimitExceeded,
    )
    from .errors import (
        NodeFailed as NodeFailed,
    )
    from .errors import (
        PluginError as PluginError,
    )
    from .errors import (
        ProviderAuthError as ProviderAuthError,
    )
    from .errors import (
        ProviderError as ProviderError,
    )
    from .errors import (
        ProviderNotFound as ProviderNotFound,
    )
    from .errors import (
        ProviderTimeout as ProviderTimeout,
    )
    from .errors import (
        RateLimited as RateLimited,
    )
    from .errors import (
        RLMGraphError as RLMGraphError,
    )
    from .errors import (
        SchemaMismatch as SchemaMismatch,
    )
    from .errors import (
        TokenLimitExceeded as TokenLimitExceeded,
    )
    from .graph import (
        Graph as Graph,
    )
    from .graph import (
        NodeKind as NodeKind,
    )
    from .graph import (
        NodeRecord as NodeRecord,
    )
    from .graph import (
        NodeRef as NodeRef,
    )
    from .graph import (
        NodeStatus as NodeStatus,
    )
    from .graph import (
        Workflow as Workflow,
    )
    from .hooks import hookimpl as hookimpl
    from .journal.summary import ReplaySummary as ReplaySummary
    from .limits import Limits as Limits
    from .rlm import (
        RLM as RLM,
    )
    from .rlm import (
        ModelUsageSummary as ModelUsageSummary,
    )
    from .rlm import (
        RLMChatCompletion as RLMChatCompletion,
    )
    from .rlm import (
        UsageSummary as UsageSummary,
    )
    from .runtime.workflow import WorkflowResult as WorkflowResult

from ._version import __version__ as __version__

# name -> the module that defines it, imported on first access.
_EXPORTS: dict[str, str] = {
    "BatchItem": ".batch",
    "BatchResult": ".batch",
    "BudgetExceeded": ".errors",
    "ChatRequest": ".contracts",
    "ChatResponse": ".contracts",
    "ConfigError": ".errors",
    "ContextLengthExceeded": ".errors",
    "DeadlineExceeded": ".errors",
    "Engine": ".engine",
    "EnvironmentCrashed": ".errors",
    "ErrorLimitExceeded": ".errors",
    "ExecResult": ".contracts",
    "Graph": ".graph",
    "GraphError": ".errors",
    "Image": ".contracts",
    "IterationLimitExceeded": ".errors",
    "LimitExceeded": ".errors",
    "Limits": ".limits",
    "Message": ".contracts",
    "ModelInfo": ".contracts",
    "ModelUsageSummary": ".rlm",
    "NodeFailed": ".errors",
    "NodeKind": ".graph",
    "NodeRecord": ".graph",
    "NodeRef": ".graph",
    "NodeStatus": ".graph",
    "PluginError": ".errors",
    "ProviderAuthError": ".errors",
    "ProviderError": ".errors",
    "ProviderNotFound": ".errors",
    "ProviderTimeout": ".errors",
    "RLM": ".rlm",
    "RLMChatCompletion": ".rlm",
    "RLMGraphError": ".errors",
    "RateLimited": ".errors",
    "ReplaySummary": ".journal.summary",
    "SchemaMismatch": ".errors",
    "TokenLimitExceeded": ".errors",
    "Usage": ".contracts",
    "UsageSummary": ".rlm",
    "Workflow": ".graph",
    "WorkflowResult": ".runtime.workflow",
    "hookimpl": ".hooks",
    "run_batch": ".batch",
}

__all__ = [
    "BatchItem",
    "BatchResult",
    "BudgetExceeded",
    "ChatRequest",
    "ChatResponse",
    "ConfigError",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "Engine",
    "EnvironmentCrashed",
    "ErrorLimitExceeded",
    "ExecResult",
    "Graph",
    "GraphError",
    "Image",
    "IterationLimitExceeded",
    "LimitExceeded",
    "Limits",
    "Message",
    "ModelInfo",
    "ModelUsageSummary",
    "NodeFailed",
    "NodeKind",
    "NodeRecord",
    "NodeRef",
    "NodeStatus",
    "PluginError",
    "ProviderAuthError",
    "ProviderError",
    "ProviderNotFound",
    "ProviderTimeout",
    "RLM",
    "RLMChatCompletion",
    "RLMGraphError",
    "RateLimited",
    "ReplaySummary",
    "SchemaMismatch",
    "TokenLimitExceeded",
    "Usage",
    "UsageSummary",
    "Workflow",
    "WorkflowResult",
    "hookimpl",
    "run_batch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlm_graph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
