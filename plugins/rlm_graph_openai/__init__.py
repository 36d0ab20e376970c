"""OpenAI-compatible providers: backends ``openai``, ``openrouter``, ``vllm``, ``ollama``.

Registered through the entry point group ``rlm_graph`` like any third-party plugin. The
price table below is approximate (USD per million tokens, list prices when written;
``cached_input_usd_per_mtok`` is what input read from OpenAI's automatic prompt cache
costs): check your vendor's pricing page, and override or extend it with
``Engine(models={"name": {"input_usd_per_mtok": ..., "output_usd_per_mtok": ...}})``.
A cost the server reports (OpenRouter) always wins over the table.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_graph.contracts import ModelInfo, ProviderFactory
from rlm_graph.hooks import hookimpl

from .provider import BACKENDS, OpenAIProvider, factory

__all__ = ["MODELS", "OpenAIProvider", "rlm_register_models", "rlm_register_providers"]


def _info(window: int, input_usd: float, output_usd: float, cached_usd: float) -> ModelInfo:
    return ModelInfo(
        context_window=window,
        input_usd_per_mtok=input_usd,
        output_usd_per_mtok=output_usd,
        cached_input_usd_per_mtok=cached_usd,
    )


MODELS: dict[str, ModelInfo] = {
    "gpt-5": _info(400_000, 1.25, 10.00, 0.125),
    "gpt-5-mini": _info(400_000, 0.25, 2.00, 0.025),
    "gpt-5-nano": _info(400_000, 0.05, 0.40, 0.005),
    "gpt-4.1": _info(1_047_576, 2.00, 8.00, 0.50),
    "gpt-4.1-mini": _info(1_047_576, 0.40, 1.60, 0.10),
    "gpt-4.1-nano": _info(1_047_576, 0.10, 0.40, 0.025),
    "gpt-4o": _info(128_000, 2.50, 10.00, 1.25),
    "gpt-4o-mini": _info(128_000, 0.15, 0.60, 0.075),
    "o3": _info(200_000, 2.00, 8.00, 0.50),
    "o4-mini": _info(200_000, 1.10, 4.40, 0.275),
}


@hookimpl
def rlm_register_providers() -> Mapping[str, ProviderFactory]:
    return {name: factory(name) for name in BACKENDS}


@hookimpl
def rlm_register_models() -> Mapping[str, ModelInfo]:
    return dict(MODELS)
