"""``rlm-graph run``: answer a query over a context file (or stdin) with a real backend.

API keys come only from the environment (``OPENAI_API_KEY``, ``OPENROUTER_API_KEY``,
``ANTHROPIC_API_KEY``...): a flag would land in the shell's history. Such a key goes only
to the provider's official host unless ``--api-key-env NAME`` says to send ``$NAME`` to
``--base-url`` (see `rlm_graph.http.resolve_key`).

Exit codes (see `rlm_graph.cli`): 0 answered, 1 the run failed otherwise, 2 bad usage or
configuration (an unreadable or binary context file too), 3 a limit stopped the run (the
partial answer is printed), 4 a provider failed (the partial answer and the usage so far
are printed), 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP. With ``--json`` every one of them
prints one JSON object.
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import (
    ConfigError,
    ContextLengthExceeded,
    LimitExceeded,
    ProviderAuthError,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    RLMGraphError,
)
from . import EXIT_FAILED, EXIT_LIMIT, EXIT_OK, EXIT_PROVIDER, EXIT_USAGE, on_the_command_line
from .output import Output
from .progress import ProgressDisplay, add_progress_arguments, progress_for
from .report import add_report_argument, report_writers
from .trace import add_trace_argument, finish_tracing, tracer_provider_for

__all__ = [
    "LIMIT_FLAGS",
    "add_backend_arguments",
    "add_hedge_argument",
    "add_engine_arguments",
    "provider_message",
    "register",
    "rlm_kwargs",
    "run",
]

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
        # No abbreviations: "--api-key SECRET" must fail, not pass as --api-key-env.
        allow_abbrev=False,
        description="Answer --query over the context in FILE (or stdin with '-'). API keys "
        "are read from the environment only (OPENAI_API_KEY, OPENROUTER_API_KEY, "
        "ANTHROPIC_API_KEY). Exit codes: 0 answered, 1 failed, 2 bad usage, 3 limit reached "
        "(partial answer printed), 4 provider error (partial answer printed), 130 Ctrl-C, "
        "143 SIGTERM, 129 SIGHUP.",
    )
    parser.add_argument(
        "--context", required=True, metavar="FILE|-", help="the context; '-' reads stdin"
    )
    parser.add_argument(
        "--encoding", default="utf-8", help="the context file's text encoding (default utf-8)"
    )
    parser.add_argument("--query", required=True, help="the question to answer over the context")
    parser.add_argument(
        "--schema",
        metavar="FILE.json",
        help="a JSON Schema the answer must match: the model is told it, refused answers go "
        "back to it, and the answer is printed as JSON (exit 3 if none ever matched)",
    )
    add_engine_arguments(parser)
    parser.add_argument(
        "--read-path",
        action="append",
        dest="guest_read_paths",
        metavar="PATH",
        help="a file or folder the model's code may read (repeatable); in the subprocess "
        "environment it reads nothing else of yours (docs/environments.md)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of text (errors too)"
    )
    parser.add_argument(
        "--journal",
        metavar="PATH",
        help="record finished nodes in this SQLite file; rerunning the same command resumes "
        "from it (see docs/durability.md, `rlm-graph journal ls`)",
    )
    add_trace_argument(parser)
    add_progress_arguments(parser)
    add_report_argument(parser)
    parser.set_defaults(func=run)


def add_engine_arguments(
    parser: argparse.ArgumentParser,
    *,
    model_required: bool = True,
    limits: str = "limits",
    limit_help: Mapping[str, str] | None = None,
) -> None:
    """Add the backend, model, environment, provider, context-window and limit flags:
    what `rlm_kwargs` turns into ``RLM(...)`` keywords (every command that runs
    completions shares them). ``limits`` titles the limit flags' group; ``limit_help``
    rewords a flag's help where a command reads it differently."""
    add_backend_arguments(parser, model_required=model_required)
    _add_provider_arguments(parser)
    _add_window_arguments(parser)
    group = parser.add_argument_group(limits)
    for name, kind, text in LIMIT_FLAGS:
        text = (limit_help or {}).get(name, text)
        group.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    group.add_argument(
        "--price",
        nargs=2,
        type=float,
        metavar=("INPUT", "OUTPUT"),
        help="USD per million input and output tokens of --model (and --sub-model), for a "
        "model the price table does not know; 0 0 for a local one (what --max-budget needs)",
    )
    add_hedge_argument(group)


def add_hedge_argument(group: Any) -> None:
    """``--hedge [JSON]``: hedged sub-calls (``run``, ``mcp``, ``batch`` and ``eval``)."""
    group.add_argument(
        "--hedge",
        nargs="?",
        const="true",
        metavar="JSON",
        help="hedge slow sub-calls: one duplicate past the 90th percentile of the model's "
        "latencies, at most 10%% more requests; or a JSON object of quantile, max_extra, "
        "min_samples (docs/limits.md)",
    )


def _hedge(text: str) -> Any:
    """``--hedge``'s value as ``RLM(hedge=...)`` takes it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    except RecursionError:
        raise ConfigError(
            "--hedge: the JSON is nested too deep to read; give a flat object such as "
            "'{\"quantile\": 0.95}'"
        ) from None
    if value is True or isinstance(value, dict):
        return value
    raise ConfigError(
        f"--hedge takes no value or a JSON object such as '{{\"quantile\": 0.95}}', not {text!r}"
    )


def add_backend_arguments(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    """``--backend``, ``--model``, ``--base-url``, ``--sub-model``, ``--environment``: the
    models and the REPL (``run``, ``batch`` and ``eval`` share them)."""
    parser.add_argument(
        "--backend",
        default="openai",
        help="provider name (default openai; see `rlm-graph plugins`)",
    )
    parser.add_argument("--model", required=model_required, help="the root model's name")
    parser.add_argument("--base-url", help="the API root (default: the backend's)")
    parser.add_argument(
        "--sub-model", help="a (cheaper) model for sub-calls at depth >= 1, same backend"
    )
    parser.add_argument(
        "--backend-kwargs",
        metavar="JSON",
        help="more keywords for the backend, as a JSON object (a plugin's own settings, e.g. "
        "'{\"shout\": true}'); the flags above win over it, and keys come from the "
        "environment only (--api-key-env)",
    )
    parser.add_argument(
        "--environment",
        default="subprocess",
        help="the REPL environment (default subprocess: the model's code runs in a child "
        "process, apart from the engine and its keys; 'local' runs it in this process, "
        "faster, for trusted documents and models only; see docs/environments.md)",
    )


def _add_provider_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("provider")
    group.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="send the key in environment variable NAME to --base-url (without it, the "
        "backend's key variable goes only to the provider's official host)",
    )
    group.add_argument(
        "--max-concurrent",
        type=int,
        help="the most requests in flight to the provider (default: an adaptive limit that "
        "finds what the server takes, from 64 up, lower on 429s)",
    )
    group.add_argument(
        "--requests-per-minute", type=float, help="the provider's request rate limit"
    )
    group.add_argument(
        "--max-attempts",
        type=int,
        metavar="N",
        help="tries per request, the first included (retries on 429, 5xx, timeouts)",
    )
    group.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="seconds the first attempt of a request may take (doubled after each timeout)",
    )
    group.add_argument(
        "--max-timeouts",
        type=int,
        metavar="N",
        help="attempts in a row of a request that may time out before it fails (default 3)",
    )
    group.add_argument(
        "--no-stream",
        action="store_true",
        help="ask for whole replies: for a server that cannot stream (root turns stream "
        "by default, so their blocks run as they are written)",
    )


def _add_window_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("context window")
    group.add_argument(
        "--context-window",
        type=int,
        metavar="TOKENS",
        help="the model's context window in tokens (e.g. 2048 for a default llama.cpp "
        "server); the history is compacted before it fills up",
    )
    group.add_argument(
        "--compaction",
        choices=("summarize", "truncate", "none"),
        default=None,
        help="how the history is kept under the window: summarize (an LM summary), "
        "truncate (drop the oldest turns) or none; default summarize with "
        "--context-window, else none",
    )
    group.add_argument(
        "--max-output-tokens",
        type=int,
        metavar="TOKENS",
        help="the most tokens one model answer may have (max_tokens)",
    )


def _json_kwargs(text: str | None) -> dict[str, Any]:
    """``--backend-kwargs``: a JSON object of backend keywords, never holding a key."""
    if text is None:
        return {}
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"--backend-kwargs is not JSON ({exc}); e.g. '{{\"shout\": true}}'"
        ) from None
    except RecursionError:
        raise ConfigError(
            "--backend-kwargs: the JSON is nested too deep to read; give a flat object "
            "such as '{\"shout\": true}'"
        ) from None
    if not isinstance(given, dict):
        raise ConfigError(f"--backend-kwargs must be a JSON object, not {type(given).__name__}")
    if "api_key" in given:
        raise ConfigError(
            "--backend-kwargs cannot carry api_key (a key on a command line lands in the "
            "shell's history); put it in an environment variable and pass --api-key-env NAME"
        )
    return given


def _backend_kwargs(args: argparse.Namespace, model: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {**_json_kwargs(getattr(args, "backend_kwargs", None))}
    kwargs["model_name"] = model
    for flag in (
        "base_url",
        "api_key_env",
        "max_concurrent",
        "requests_per_minute",
        "max_attempts",
        "timeout",
        "max_timeouts",
    ):
        value = getattr(args, flag, None)
        if value is not None:
            kwargs[flag] = value
    if getattr(args, "no_stream", False):
        kwargs["stream"] = False
    return kwargs


def _read_context(path: str, encoding: str) -> str:
    try:
        b"a".decode(encoding, "ignore")  # a text encoding (not rot13, base64, zlib...)
    except (LookupError, UnicodeError):  # ("undefined" refuses every byte)
        raise ConfigError(
            f"unknown --encoding {encoding!r} (not a text encoding); e.g. utf-8, latin-1, utf-16"
        ) from None
    name = "stdin" if path == "-" else repr(path)
    try:
        if path == "-":
            if sys.stdin is None:  # started with stdin closed (<&-)
                raise ConfigError(
                    "--context -: stdin is closed, nothing to read; pipe the context in "
                    "(cat doc.txt | rlm-graph run --context - ...) or give its file"
                )
            stream = getattr(sys.stdin, "buffer", None)
            if stream is None:  # a text stream stood in for stdin (an embedding program)
                return str(sys.stdin.read())
            data, encoding = _read_text_bytes(stream, name, encoding)
        else:
            with open(path, "rb") as handle:
                data, encoding = _read_text_bytes(handle, name, encoding)
    except OSError as exc:
        raise ConfigError(f"cannot read --context {path!r}: {exc.strerror or exc}") from None
    except MemoryError:
        raise ConfigError(
            f"--context {name} does not fit in memory; give a smaller context (or split it)"
        ) from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--context {name} is not {encoding} text (byte 0x{data[exc.start]:02x} at "
            f"offset {exc.start}); pass --encoding (e.g. --encoding latin-1) if it is text "
            "in another encoding"
        ) from None
    except UnicodeError as exc:  # a codec's own complaint (punycode...)
        raise ConfigError(f"--context {name} is not {encoding} text ({exc})") from None


def _read_text_bytes(handle: Any, name: str, encoding: str) -> tuple[bytes, str]:
    """A context's bytes and the encoding to read them by (a byte order mark's, if it
    has one); a binary one refused at its first 64 KiB, before the rest is read (a file
    of gigabytes is not read whole to be refused)."""
    head: bytes = handle.read(65536)
    encoding = _by_byte_order_mark(head, encoding)
    if b"\0" in head and not codecs.lookup(encoding).name.startswith(("utf-16", "utf-32")):
        raise ConfigError(
            f"--context {name} looks like a binary file (it has NUL bytes), not text; "
            "extract its text first (e.g. pdftotext), or name its --encoding if it is text"
        )
    rest: bytes = handle.read()
    return (head + rest if rest else head), encoding


def _by_byte_order_mark(data: bytes, encoding: str) -> str:
    """The encoding a file's byte order mark names when ``encoding`` is the default
    UTF-8 (a UTF-16 file from Windows is text, not binary); else ``encoding``."""
    if codecs.lookup(encoding).name != "utf-8":
        return encoding
    for mark, named in (
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
        (codecs.BOM_UTF8, "utf-8-sig"),
    ):
        if data.startswith(mark):
            return named
    return encoding


def _models(args: argparse.Namespace) -> dict[str, dict[str, Any]] | None:
    """``models=`` from ``--context-window`` and ``--price``, for the models named."""
    entry: dict[str, Any] = {}
    if args.context_window is not None:
        if args.context_window < 256:
            raise ConfigError("--context-window must be at least 256 tokens")
        entry["context_window"] = args.context_window
    price = getattr(args, "price", None)
    if price is not None:
        if not all(0 <= value < math.inf for value in price):  # NaN too
            raise ConfigError(
                "--price takes two finite numbers >= 0: USD per million input, output tokens"
            )
        entry.update(input_usd_per_mtok=price[0], output_usd_per_mtok=price[1])
    if not entry:
        return None
    names = [args.model] + ([args.sub_model] if args.sub_model else [])
    return {name: dict(entry) for name in names}


def rlm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``RLM(...)`` keywords of the flags `add_engine_arguments` added (and
    ``--journal``, where a subcommand has it), ``on_limit="return"``.

    Raises:
        ConfigError: a flag's value that cannot work (``--context-window 10``).
    """
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
    if getattr(args, "hedge", None) is not None:
        kwargs["hedge"] = _hedge(args.hedge)
    models = _models(args)
    if models is not None:
        kwargs["models"] = models
    compaction = args.compaction or ("summarize" if args.context_window is not None else "none")
    if compaction != "none":
        kwargs["compaction"] = compaction
    if args.max_output_tokens is not None:
        if args.max_output_tokens < 1:
            raise ConfigError("--max-output-tokens must be at least 1")
        kwargs["sampling_args"] = {"max_tokens": args.max_output_tokens}
    journal = getattr(args, "journal", None)  # `rlm-graph batch` shares these, not the flag
    if journal is not None:
        if not journal:
            raise ConfigError("--journal needs a file path, such as run.sqlite")
        kwargs["journal"] = journal
    if getattr(args, "guest_read_paths", None):
        if args.environment == "local":
            raise ConfigError(
                "--read-path is for the subprocess environment: code in the local one "
                "reads every file you can"
            )
        kwargs["environment_kwargs"] = {"read_paths": list(args.guest_read_paths)}
    return kwargs


def run(args: argparse.Namespace) -> int:
    from ..rlm import RLM

    out = Output("run", as_json=args.json)
    provider = None
    try:
        context = _read_context(args.context, args.encoding)
        schema = _read_schema(args.schema)
        provider = tracer_provider_for(args)
        display = progress_for(args)
        reports = report_writers(args, display.say, "rlm-graph run: " + args.query[:80])
        rlm = RLM(
            **rlm_kwargs(args),
            tracer_provider=provider,
            trace_content=getattr(args, "trace_content", False),
            record_content=getattr(args, "trace_content", False),
            listeners=[*display.listeners(), *reports],
            observers=reports,  # they keep the graph of a run cut short
        )
        display.redact = rlm.engine.redact  # -v echoes the model's reply
    except ConfigError as exc:
        finish_tracing(provider)
        text = on_the_command_line(str(exc))  # the library's fixes are Python's
        return out.error(EXIT_USAGE, text, kind=type(exc).__name__, error=exc)
    try:
        return _complete(out, rlm, context, args.query, display, schema)
    finally:
        finish_tracing(provider)


def _read_schema(path: str | None) -> dict[str, Any] | None:
    """``--schema FILE.json``: a JSON Schema object, checked against its meta-schema."""
    if path is None:
        return None
    from ..protocol.schema import AnswerSchema

    try:
        with open(path, encoding="utf-8") as handle:
            schema = json.load(handle)
    except OSError as exc:
        raise ConfigError(f"--schema: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"--schema: {path} is not JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(
            f"--schema: {path} is nested too deep to read; give a JSON Schema of fewer levels"
        ) from None
    if not isinstance(schema, dict):
        raise ConfigError(
            f"--schema: {path} must hold a JSON Schema object, not a {type(schema).__name__}"
        )
    AnswerSchema.of(schema)  # an invalid schema fails here, before any call
    return schema


def _complete(
    out: Output,
    rlm: Any,
    context: str,
    query: str,
    display: ProgressDisplay,
    schema: dict[str, Any] | None = None,
) -> int:
    try:
        with display:  # the live line ends before anything is printed
            result = rlm.completion(context, root_prompt=query, schema=schema)
    except ProviderError as exc:
        return out.result(
            EXIT_PROVIDER,
            answer=exc.partial if exc.result is not None else None,
            stop_reason="provider_error" if exc.result is not None else None,
            result=exc.result,
            error=exc,
            message=provider_message(exc),
        )
    except LimitExceeded as exc:  # on_limit is "return"; kept for plugins that raise
        return out.result(EXIT_LIMIT, answer=exc.partial, stop_reason=exc.reason, result=exc.result)
    except ConfigError as exc:  # found at the first use (a plugin's late check)
        return out.error(EXIT_USAGE, str(exc), kind=type(exc).__name__, error=exc)
    except RLMGraphError as exc:  # a crashed environment, a broken graph
        return out.error(EXIT_FAILED, str(exc), kind=type(exc).__name__, error=exc)
    code = EXIT_OK if result.stop_reason is None else EXIT_LIMIT
    if schema is not None and result.parsed is None and result.error is not None:
        return out.result(  # no answer ever matched --schema: the last reply, and why
            EXIT_LIMIT if result.stop_reason else EXIT_FAILED,
            answer=result.response,
            stop_reason=result.stop_reason,
            result=result,
            message=result.error,
            kind="SchemaMismatch",
        )
    return out.result(code, answer=result.response, stop_reason=result.stop_reason, result=result)


def provider_message(exc: ProviderError) -> str:
    """The error line: the provider's message, plus what to do in this command's flags."""
    if isinstance(exc, ContextLengthExceeded):
        said = exc.server_message or str(exc)
        return (
            f"the request is longer than the model's context window (the server said: {said}). "
            "Give the window with --context-window TOKENS so that the history is compacted "
            "before it fills up (--compaction summarize or truncate), lower "
            "--max-output-tokens, or start the server with a larger window (llama.cpp: "
            "-c 16384; Ollama: num_ctx)"
        )
    text = f"provider error: {exc}"
    if isinstance(exc, ProviderAuthError):
        return text + (
            " [on the command line the key comes from the provider's variable "
            "(OPENAI_API_KEY, ANTHROPIC_API_KEY...) or --api-key-env NAME]"
        )
    if isinstance(exc, RateLimited) and "max_retry_after" in str(exc):
        return text + " [on the command line: --backend-kwargs '{\"max_retry_after\": SECONDS}']"
    if isinstance(exc, ProviderTimeout):
        return text + " [flags: --timeout S for slower models, --max-timeouts N, --max-attempts N]"
    if isinstance(exc, RateLimited):
        return text + " [flags: --requests-per-minute, --max-concurrent, --max-attempts N]"
    if exc.retryable:
        return text + " [flag: --max-attempts N to keep trying longer]"
    return text
