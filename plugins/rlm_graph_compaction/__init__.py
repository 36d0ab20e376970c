"""Compaction strategies: ``summarize`` and ``truncate``, plus context windows.

Turn compaction on with ``RLM(..., compaction=True)`` (``summarize``) or
``compaction="truncate"``; ``compaction_threshold_pct`` (default 0.85) is the share of
the root model's window at which it starts. See docs/compaction.md.

This plugin also registers the context windows of common open-weight models served
through OpenAI-compatible servers (vLLM, llama.cpp); the ``openai`` and ``anthropic``
plugins register their own models with prices. Override or add with
``RLM(models={"name": {"context_window": n}})``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlm_graph.contracts import ModelInfo
from rlm_graph.hooks import hookimpl

from .strategies import SUMMARY_PROMPT, SummarizeStrategy, TruncateStrategy

__all__ = [
    "MODELS",
    "SUMMARY_PROMPT",
    "SummarizeStrategy",
    "TruncateStrategy",
    "rlm_register_compaction_strategies",
    "rlm_register_models",
]

MODELS: dict[str, ModelInfo] = {
    name: ModelInfo(context_window=window)
    for name, window in {
        "meta-llama/Llama-3.1-8B-Instruct": 131_072,
        "meta-llama/Llama-3.1-70B-Instruct": 131_072,
        "meta-llama/Llama-3.3-70B-Instruct": 131_072,
        "Qwen/Qwen2.5-7B-Instruct": 32_768,
        "Qwen/Qwen2.5-72B-Instruct": 32_768,
        "Qwen/Qwen2.5-Coder-32B-Instruct": 32_768,
        "Qwen/Qwen3-8B": 32_768,
        "Qwen/Qwen3-32B": 32_768,
        "mistralai/Mistral-7B-Instruct-v0.3": 32_768,
        "google/gemma-3-27b-it": 131_072,
        "deepseek-ai/DeepSeek-V3": 131_072,
        "openai/gpt-oss-20b": 131_072,
        "openai/gpt-oss-120b": 131_072,
    }.items()
}
"""Native context windows of common open-weight models, by their Hugging Face names.
A server may be configured with a smaller window (vLLM ``--max-model-len``); say so with
``models=``."""


@hookimpl
def rlm_register_compaction_strategies() -> Mapping[str, Any]:
    return {"summarize": SummarizeStrategy, "truncate": TruncateStrategy}


@hookimpl
def rlm_register_models() -> Mapping[str, ModelInfo]:
    return dict(MODELS)
