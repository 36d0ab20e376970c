"""Shared pieces of the provider plugins' tests: a planted fake key, engines on fake servers."""

from __future__ import annotations

from typing import Any

KEY = "sk-test-planted-1234"
"""A fake API key; every test that sees logs, errors or records checks it never appears."""


def openai_kwargs(server: Any, **overrides: Any) -> dict[str, Any]:
    """backend_kwargs for the ``openai`` backend pointed at a fake server, retries fast."""
    return {
        "model_name": "gpt-test",
        "base_url": server.base_url,
        "api_key": KEY,
        "backoff_base": 0.001,
        "timeout": 5.0,
        **overrides,
    }


def anthropic_kwargs(server: Any, **overrides: Any) -> dict[str, Any]:
    """backend_kwargs for the ``anthropic`` backend pointed at a fake server, retries fast."""
    return {
        "model_name": "claude-test",
        "base_url": server.base_url,
        "api_key": KEY,
        "backoff_base": 0.001,
        "timeout": 5.0,
        **overrides,
    }
