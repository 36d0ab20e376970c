"""``rlm-graph run``: answer a query over a context file (or stdin) with a real backend.

API keys come only from the environment (``OPENAI_API_KEY``, ``OPENROUTER_API_KEY``,
``ANTHROPIC_API_KEY``...): a flag would land in the shell's history.

Exit codes (see `rlm_graph.cli`): 0 answered, 2 bad usage or configuration, 3 a limit
stopped the run (the partial answer is printed), 4 a provider failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ConfigError, LimitExceeded, ProviderError
from . import EXIT_LIMIT, EXIT_OK, EXIT_PROVIDER, EXIT_USAGE
from .trace import add_trace_argument, finish_tracing, tracer_provider_for

__all__ = ["register", "run"]

LIMIT_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("max_depth", int, "deepest child completion (1: rlm_query is a plain call)"),
    ("max_iterations", int, "root turns per completion"),
    ("max_timeout", float, "wall-clock seconds for the whole run"),
    ("max_tokens", int, "input + output tokens over the whole tree"),
    ("max_budget", float, "USD over the whole tree"),
    ("max_errors", int, "consecutive failing turns"),
    ("max_concurrent_subcalls", int, "child completions in flight per depth"),
    ("batch_max_concurrent", int, "slots of one batch in flight"),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="answer a query over a context file or stdin",
        description="Answer --query over the context in FILE (or stdin with '-'). API keys "
        "are read from the environment only (OPENAI_API_KEY, OPENROUTER_API_KEY, "
        "ANTHROPIC_API_KEY). Exit codes: 0 answered, 2 bad usage, 3 limit reached "
        "(partial answer printed), 4 provider error.",
    )
    parser.add_argument("--context", required=True, metavar="FILE|-", help="the context; '-' reads stdin")
    parser.add_argument("--query", required=True, help="the question to answer over the context")
    parser.add_argument("--backend", default="openai", help="provider name (default openai; see `rlm-graph plugins`)")
    parser.add_argument("--model", required=True, help="the root model's name")
    parser.add_argument("--base-url", help="the API root (default: the backend's)")
    parser.add_argument("--sub-model", help="a (cheaper) model for sub-calls at depth >= 1, same backend")
    parser.add_argument("--environment", default="local", help="the REPL environment (default local)")
    parser.add_argument("--max-concurrent", type=int, help="requests in flight to the provider")
    parser.add_argument("--requests-per-minute", type=float, help="the provider's request rate limit")
    limits = parser.add_argument_group("limits")
    for name, kind, text in LIMIT_FLAGS:
        limits.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_trace_argument(parser)
    parser.set_defaults(func=run)


def _backend_kwargs(args: argparse.Namespace, model: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"model_name": model}
    if args.base_url:
        kwargs["base_url"] = args.base_url
    if args.max_concurrent is not None:
        kwargs["max_concurrent"] = args.max_concurrent
    if args.requests_per_minute is not None:
        kwargs["requests_per_minute"] = args.requests_per_minute
    return kwargs


def _read_context(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot read --context {path!r}: {exc.strerror or exc}") from None


def _rlm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "backend": args.backend,
        "backend_kwargs": _backend_kwargs(args, args.model),
        "environment": args.environment,
        "on_limit": "return",
    }
    if args.sub_model:
        kwargs["other_backends"] = [args.backend]
        kwargs["other_backend_kwargs"] = [_backend_kwargs(args, args.sub_model)]
    for name, _, _ in LIMIT_FLAGS:
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    return kwargs


def run(args: argparse.Namespace) -> int:
    from ..rlm import RLM

    try:
        context = _read_context(args.context)
        provider = tracer_provider_for(args)
        rlm = RLM(**_rlm_kwargs(args), tracer_provider=provider,
                  trace_content=getattr(args, "trace_content", False))
    except ConfigError as exc:
        print(f"rlm-graph run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = rlm.completion(context, root_prompt=args.query)
    except ProviderError as exc:
        print(f"rlm-graph run: provider error: {exc}", file=sys.stderr)
        return EXIT_PROVIDER
    except LimitExceeded as exc:  # on_limit is "return"; kept for plugins that raise
        _print(args, exc.partial, exc.reason, None)
        return EXIT_LIMIT
    finally:
        finish_tracing(provider)
    _print(args, result.response, result.stop_reason, result)
    return EXIT_OK if result.stop_reason is None else EXIT_LIMIT


def _print(args: argparse.Namespace, answer: str, stop_reason: str | None, result: Any) -> None:
    summary = result.usage_summary if result is not None else None
    if args.json:
        payload = {
            "answer": answer,
            "stop_reason": stop_reason,
            "usage": summary.to_dict() if summary is not None else None,
            "execution_time": result.execution_time if result is not None else None,
        }
        print(json.dumps(payload, indent=2))
        return
    if stop_reason is not None:
        print(f"[stopped by {stop_reason}; partial answer]", file=sys.stderr)
    print(answer)
    if summary is not None:
        cost = summary.total_cost
        print(
            f"[{summary.total_calls} calls, {summary.total_input_tokens:,} input and "
            f"{summary.total_output_tokens:,} output tokens"
            + (f", ${cost:.4f}" if cost is not None else "")
            + f", {result.execution_time:.1f} s]",
            file=sys.stderr,
        )
