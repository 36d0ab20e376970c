"""rlm-graph: Recursive Language Models run as a workflow graph.

Layout (bottom to top): ``graph``, ``protocol`` and ``limits`` are pure; ``contracts`` is
the seam plugins implement; ``runtime`` is the only package that knows trio; ``hooks`` is
the plugin layer; ``engine`` and ``cli`` are the facade.

``import rlm_graph`` is cheap: the names below load their module on first use (PEP 562
``__getattr__``), so a program that needs one pure module (the subprocess REPL's guest
needs ``rlm_graph.repl``) does not pay for trio, httpx, networkx and OpenTelemetry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:
    from .batch import (
        BatchItem as BatchItem,
        BatchResult as BatchResult,
        run_batch as run_batch,
    )
    from .contracts import (
        ChatRequest as ChatRequest,
        ChatResponse as ChatResponse,
        ExecResult as ExecResult,
        Image as Image,
        Message as Message,
        ModelInfo as ModelInfo,
        Usage as Usage,
    )
    from .engine import Engine as Engine
    from .errors import (
        BudgetExceeded as BudgetExceeded,
        ConfigError as ConfigError,
        ContextLengthExceeded as ContextLengthExceeded,
        DeadlineExceeded as DeadlineExceeded,
        EnvironmentCrashed as EnvironmentCrashed,
        ErrorLimitExceeded as ErrorLimitExceeded,
        GraphError as GraphError,
        IterationLimitExceeded as IterationLimitExceeded,
        LimitExceeded as LimitExceeded,
        NodeCancelled as NodeCancelled,
        NodeFailed as NodeFailed,
        PluginError as PluginError,
        ProviderAuthError as ProviderAuthError,
        ProviderError as ProviderError,
        ProviderNotFound as ProviderNotFound,
        ProviderTimeout as ProviderTimeout,
        RateLimited as RateLimited,
        RLMGraphError as RLMGraphError,
        SchemaMismatch as SchemaMismatch,
        TokenLimitExceeded as TokenLimitExceeded,
    )
    from .graph import (
        Graph as Graph,
        NodeKind as NodeKind,
        NodeRecord as NodeRecord,
        NodeRef as NodeRef,
        NodeStatus as NodeStatus,
        Workflow as Workflow,
    )
    from .hooks import hookimpl as hookimpl
    from .journal.summary import ReplaySummary as ReplaySummary
    from .limits import Limits as Limits
    from .result import WorkflowResult as WorkflowResult
    from .rlm import (
        RLM as RLM,
        ModelUsageSummary as ModelUsageSummary,
        RLMChatCompletion as RLMChatCompletion,
        UsageSummary as UsageSummary,
    )

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
    "NodeCancelled": ".errors",
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
    "WorkflowResult": ".result",
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
    "NodeCancelled",
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


__getattr__, __dir__ = lazy_names(__name__, globals(), _EXPORTS, __all__)
