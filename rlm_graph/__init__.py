"""rlm-graph: Recursive Language Models run as a workflow graph.

Layout (bottom to top): ``graph``, ``protocol`` and ``limits`` are pure; ``contracts`` is
the seam plugins implement; ``runtime`` is the only package that knows trio; ``hooks`` is
the plugin layer; ``engine`` and ``cli`` are the facade.
"""

from __future__ import annotations

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
    DeadlineExceeded as DeadlineExceeded,
    EnvironmentCrashed as EnvironmentCrashed,
    ErrorLimitExceeded as ErrorLimitExceeded,
    GraphError as GraphError,
    IterationLimitExceeded as IterationLimitExceeded,
    LimitExceeded as LimitExceeded,
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
from .limits import Limits as Limits
from .rlm import (
    RLM as RLM,
    ModelUsageSummary as ModelUsageSummary,
    RLMChatCompletion as RLMChatCompletion,
    UsageSummary as UsageSummary,
)
from .runtime.workflow import WorkflowResult as WorkflowResult

__version__ = "0.1.0"

__all__ = [
    "BudgetExceeded",
    "ChatRequest",
    "ChatResponse",
    "ConfigError",
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
    "SchemaMismatch",
    "TokenLimitExceeded",
    "Usage",
    "UsageSummary",
    "Workflow",
    "WorkflowResult",
    "hookimpl",
]
