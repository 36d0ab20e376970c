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
    Message as Message,
    ModelInfo as ModelInfo,
    Usage as Usage,
)
from .engine import Engine as Engine
from .errors import (
    ConfigError as ConfigError,
    LimitExceeded as LimitExceeded,
    PluginError as PluginError,
    ProviderError as ProviderError,
    RLMGraphError as RLMGraphError,
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
    "ChatRequest",
    "ChatResponse",
    "ConfigError",
    "Engine",
    "ExecResult",
    "Graph",
    "LimitExceeded",
    "Limits",
    "Message",
    "ModelInfo",
    "ModelUsageSummary",
    "NodeKind",
    "NodeRecord",
    "NodeRef",
    "NodeStatus",
    "PluginError",
    "ProviderError",
    "RLM",
    "RLMChatCompletion",
    "RLMGraphError",
    "Usage",
    "UsageSummary",
    "Workflow",
    "WorkflowResult",
    "hookimpl",
]
