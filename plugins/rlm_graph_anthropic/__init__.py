"""The Anthropic Messages provider: backend ``anthropic``.

Registered through the entry point group ``rlm_graph`` like any third-party plugin. The
price table below is approximate (USD per million tokens, list prices when written;
prompt-cache reads at 0.1x and 5-minute cache writes at 1.25x the input price, as
Anthropic bills them): check Anthropic's pricing page, and override or extend it with
``Engine(models=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlm_graph.contracts import ModelInfo, ProviderFactory
from rlm_graph.hooks import hookimpl

from .provider import AnthropicProvider

__all__ = ["MODELS", "AnthropicProvider", "rlm_register_models", "rlm_register_providers"]


def _info(window: int, input_usd: float, output_usd: float) -> ModelInfo:
    return ModelInfo(
        context_window=window,
        input_usd_per_mtok=input_usd,
        output_usd_per_mtok=output_usd,
        cached_input_usd_per_mtok=round(input_usd * 0.1, 6),
        cache_write_usd_per_mtok=round(input_usd * 1.25, 6),
    )


MODELS: dict[str, ModelInfo] = {
    "claude-opus-4-1": _info(200_000, 15.00, 75.00),
    "claude-sonnet-4-5": _info(200_000, 3.00, 15.00),
    "claude-sonnet-4-0": _info(200_000, 3.00, 15.00),
    "claude-haiku-4-5": _info(200_000, 1.00, 5.00),
    "claude-3-5-haiku-latest": _info(200_000, 0.80, 4.00),
}


@hookimpl
def rlm_register_providers() -> Mapping[str, ProviderFactory]:
    return {"anthropic": AnthropicProvider}


@hookimpl
def rlm_register_models() -> Mapping[str, ModelInfo]:
    return dict(MODELS)
