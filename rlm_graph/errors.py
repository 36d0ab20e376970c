"""The one error tree of rlm-graph.

Every error the engine raises on purpose derives from `RLMGraphError`, and every message
names what happened and what to do about it::

    RLMGraphError
    ├── ConfigError              bad configuration, found before anything runs
    │   └── PluginError          unknown or broken plugin name, hook or entry point
    ├── GraphError               a graph that cannot run: a cycle, a missing node
    ├── ProviderError            a model call that failed
    │   ├── ProviderTimeout
    │   ├── RateLimited
    │   ├── ProviderAuthError     401/403: check the key
    │   ├── ProviderNotFound      404: check the model name and the base URL
    │   ├── ContextLengthExceeded the request does not fit the model's context window
    │   └── BadResponse           the server answered something we cannot read
    ├── LimitExceeded            a run stopped by one of its limits; carries the partial answer
    │   ├── DeadlineExceeded      max_timeout
    │   ├── TokenLimitExceeded    max_tokens
    │   ├── BudgetExceeded        max_budget
    │   ├── IterationLimitExceeded max_iterations
    │   └── ErrorLimitExceeded    max_errors
    ├── EnvironmentCrashed       a REPL environment died under a block
    ├── SchemaMismatch           an answer that does not have the shape asked for (schema=)
    ├── NodeFailed               a node of a workflow failed (or was skipped): ``result[node]``
    ├── NodeCancelled            a node of a workflow was cancelled or never ran: ``result[node]``
    └── TraceFileError           a trace file that cannot be read (rlm_graph.tracing.reader)

What the model should see is data, not an exception: a failed sub-call becomes an
``"[ERROR] <type>: <message>"`` string in its slot, and these classes are only raised to
the user.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import ValidationError

__all__ = [
    "asyncio_on_trio",
    "checked_flag",
    "clipped",
    "message_of",
    "scrub_error",
    "config_error",
    "BadResponse",
    "BudgetExceeded",
    "BudgetExceededError",
    "ConfigError",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "EnvironmentCrashed",
    "ErrorLimitExceeded",
    "ErrorThresholdExceededError",
    "GraphError",
    "IterationLimitExceeded",
    "LimitExceeded",
    "NodeCancelled",
    "NodeFailed",
    "PluginError",
    "ProviderAuthError",
    "ProviderError",
    "ProviderNotFound",
    "ProviderTimeout",
    "RLMGraphError",
    "RateLimited",
    "SchemaMismatch",
    "STOPS_WORKFLOW",
    "mark_stops_workflow",
    "stops_workflow",
    "TokenLimitExceeded",
    "TokenLimitExceededError",
    "TimeoutExceededError",
    "error_slot",
    "is_context_length_error",
    "without_url_passwords",
    "URL_USERINFO",
]


# ``https://user:password@host``: the user kept, the password dropped; a user with no
# password (``http://glpat-...@host``, which httpx sends as Basic auth: a token) dropped
# itself. The scheme is looked for once per run of scheme characters (from its first
# letter after a word boundary; the atomic group keeps that choice), and the runs after
# it are possessive: read from each word boundary instead, 40,000 characters of
# ``a.a.a...`` took a second. After ``://`` there are two tries, each one linear scan:
# ``user:`` then the password, else the whole userinfo.
# A password runs to the authority's last ``@``, as a URL parser reads it: one with an
# ``@`` in it, unencoded, is redacted whole; so is one with a ``#`` or ``?`` (a parser
# reads no password there, but it is one). The parts after an ``@`` hold no quote,
# comma or bracket (``["http://u:p@a.com","bob@b.com"]`` keeps its hosts).
# A user with no password is a token of 8 characters or more (``ssh://git@`` is a user,
# not a secret), read as RFC 3986 reads one: no ``?``, ``#``, quote, comma or bracket
# (``https://example.com?email=a@b.org`` holds no user).
URL_USERINFO = re.compile(
    r"((?<![A-Za-z0-9+.\-])(?>[A-Za-z0-9+.\-]*?\b[A-Za-z])[A-Za-z0-9+.\-]*+://"
    r"(?:(?P<user>[^\s/@:]*+):)?+)(?!\[REDACTED\])"
    r"(?P<secret>(?(user)[^\s/@]*+(?:@[^\s/?#@\"',()\[\]<>]*+)*|[^\s/@?#\"',()\[\]<>]{8,}+))@"
)


def without_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it (``scheme://user:password@``), or
    its user when it has no password (``scheme://token@``), replaced by ``[REDACTED]``:
    what an error, a command or a span shows of a base URL or an endpoint."""
    if "://" not in text:  # most messages: no URL, no scan
        return text
    return URL_USERINFO.sub(lambda found: found.group(1) + "[REDACTED]@", text)


class RLMGraphError(Exception):
    """Root of every error rlm-graph raises on purpose."""


class ConfigError(RLMGraphError, ValueError):
    """Configuration that cannot work; raised before anything runs."""


class PluginError(ConfigError):
    """An unknown plugin name, or a plugin that failed to load or answered wrongly."""


class GraphError(RLMGraphError):
    """A graph that cannot be run as given (a cycle, an edge to a missing node)."""


class ProviderError(RLMGraphError):
    """A model call failed.

    Attributes:
        provider: the provider name (``"openai"``, ``"scripted"``...).
        status_code: the HTTP status, where there was one.
        retryable: whether trying again may succeed.
        partial: set by ``RLM.completion`` when the root model failed after some turns:
            the best partial answer the run had (may be empty).
        result: likewise, the partial result (an ``RLMChatCompletion`` with the usage
            so far), or ``None`` when the error came before any run.
    """

    partial: str = ""
    result: object = None

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status_code: int | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(without_url_passwords(message))  # a base_url's password, in any form
        self.provider = provider
        self.status_code = status_code
        self.retryable = retryable


class ProviderTimeout(ProviderError):
    """The request took longer than the provider's request timeout."""


class ContextLengthExceeded(ProviderError):
    """The server refused the request as longer than the model's context window.

    Retrying the same request cannot help: compact the history, ask for fewer output
    tokens, or give the server a larger window.

    Attributes:
        server_message: what the server said, scrubbed of the key and shortened.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status_code: int | None = None,
        server_message: str = "",
    ) -> None:
        super().__init__(message, provider=provider, status_code=status_code, retryable=False)
        self.server_message = server_message


class RateLimited(ProviderError):
    """The server said 429 (too many requests) and retries ran out."""


class ProviderAuthError(ProviderError):
    """401/403: the key is missing, wrong, or lacks access."""


class ProviderNotFound(ProviderError):
    """404: the model name or the base URL is wrong."""


class BadResponse(ProviderError):
    """The server's answer could not be read as the API's format."""


class LimitExceeded(RLMGraphError):
    """A run was stopped by one of its limits.

    Attributes:
        reason: which limit (``"max_timeout"``, ``"max_tokens"``...).
        partial: the best partial answer the run had when it stopped (may be empty).
        result: the full partial result (an ``RLMChatCompletion``) where there is one.
    """

    limit_name = "limit"

    def __init__(self, message: str, *, partial: str = "", result: object = None) -> None:
        super().__init__(message)
        self.reason = self.limit_name
        self.partial = partial
        self.result = result

    @property
    def partial_answer(self) -> str:
        """``partial``, by the reference library's name."""
        return self.partial


class DeadlineExceeded(LimitExceeded):
    limit_name = "max_timeout"


class TokenLimitExceeded(LimitExceeded):
    limit_name = "max_tokens"


class BudgetExceeded(LimitExceeded):
    limit_name = "max_budget"


class IterationLimitExceeded(LimitExceeded):
    limit_name = "max_iterations"


class ErrorLimitExceeded(LimitExceeded):
    limit_name = "max_errors"


# The reference library's names for the same errors: code written for it catches them.
TimeoutExceededError = DeadlineExceeded
TokenLimitExceededError = TokenLimitExceeded
BudgetExceededError = BudgetExceeded
ErrorThresholdExceededError = ErrorLimitExceeded


LIMIT_ERRORS: dict[str, type[LimitExceeded]] = {
    cls.limit_name: cls
    for cls in (
        DeadlineExceeded,
        TokenLimitExceeded,
        BudgetExceeded,
        IterationLimitExceeded,
        ErrorLimitExceeded,
    )
}


class EnvironmentCrashed(RLMGraphError):
    """The REPL environment died while running a block (a killed or crashed process)."""


class SchemaMismatch(RLMGraphError, ValueError):
    """An answer (``FINAL``, ``answer["content"]``, a typed ``llm_query``) that does not
    match the schema asked for; the message lists what is wrong, field by field."""


class NodeFailed(RLMGraphError):
    """A node of a workflow failed, or was skipped because a dependency failed; raised
    by ``result[node]`` (``from`` the node's own exception, so the traceback shows both).

    Attributes:
        node_id: the node.
        cause: the exception the node raised (for a skipped node, its failed
            dependency's `NodeFailed`).
        traceback: for a function node, the function's traceback as text.
        upstream: for a skipped node, the id of the failed node it depended on.
    """

    def __init__(
        self,
        message: str,
        *,
        node_id: str = "",
        cause: BaseException | None = None,
        traceback: str = "",
        upstream: str | None = None,
    ) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.cause = cause
        self.traceback = traceback
        self.upstream = upstream


class NodeCancelled(RLMGraphError):
    """A node of a workflow was cancelled while it ran, or never ran, because the run
    stopped first (a limit, Ctrl-C, or another node's error that stops the workflow);
    raised by ``result[node]``.

    Attributes:
        node_id: the node.
        stop_reason: why the run stopped (``"max_timeout"``, ``"interrupted"``...).
    """

    def __init__(self, message: str, *, node_id: str = "", stop_reason: str | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.stop_reason = stop_reason


STOPS_WORKFLOW: tuple[type[Exception], ...] = (ProviderAuthError, ProviderNotFound, ConfigError)
"""Errors of a workflow's model call that stop the whole workflow: every other model node
would meet them too (a rejected key, an unknown model or base URL, a configuration error
of the run). Not a function's or a prompt function's own error, nor one answer of a
plugin that broke its contract (a `PluginError`): those fail their node only
(`stops_workflow`)."""

_STOPS = "_rlm_graph_stops_workflow"


def mark_stops_workflow(exc: BaseException) -> None:
    """Mark ``exc``, raised by a workflow node's model call, if it stops the workflow."""
    if isinstance(exc, STOPS_WORKFLOW) and not isinstance(exc, PluginError):
        _mark(exc, _STOPS, True)


def _mark(exc: BaseException, name: str, value: object) -> None:
    """Keep ``value`` on ``exc`` as ``name``, for the engine's own reading of it later."""
    try:
        setattr(exc, name, value)
    except (AttributeError, TypeError):  # an error that takes no attributes
        pass


# What asyncio code says on trio's loop: asyncio.get_running_loop() (and all that calls
# it), and trio's answer to the bare yield of asyncio.sleep(0) or an asyncio future.
_ASYNCIO_SIGNS = ("no running event loop", "trio.run received unrecognized yield message")


def asyncio_on_trio(exc: BaseException) -> bool:
    """Whether ``exc`` is what code written for asyncio raises on trio's loop."""
    return isinstance(exc, RuntimeError | TypeError) and any(
        sign in str(exc) for sign in _ASYNCIO_SIGNS
    )


def stops_workflow(exc: BaseException | None) -> bool:
    """Whether a workflow node's ``exc`` stops the workflow (`mark_stops_workflow`)."""
    return getattr(exc, _STOPS, False) is True


# The wordings of "your prompt is longer than my window" of the servers we speak to:
# OpenAI ("maximum context length is N tokens", code context_length_exceeded), Anthropic
# ("prompt is too long: N tokens > M maximum", "input length and `max_tokens` exceed
# context limit"), vLLM ("maximum context length", "longer than the maximum model length"),
# llama.cpp ("the request exceeds the available context size", exceed_context_size_error,
# "input is too large to process") and Ollama ("exceeded max context length",
# "input length exceeds the context length").
_CONTEXT_LENGTH = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|max(?:imum)? context length"
    r"|exceeds? (?:the )?(?:available |maximum )?context|exceed_context_size"
    r"|exceeds? (?:the )?context (?:size|length|window|limit)|context (?:size|window) (?:has been |is )?exceeded"
    r"|prompt is too long|prompt too long|longer than the maximum model length"
    r"|input is too large to process|exceeds? the model'?s? context",
    re.IGNORECASE,
)


def is_context_length_error(text: str) -> bool:
    """Whether a server's error text says the request is longer than the model's window.

    Args:
        text: the error body or message as the server sent it.
    """
    return bool(_CONTEXT_LENGTH.search(text))


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or what it is when that raises (a plugin's error whose ``__str__``
    formats a field its server left out): the failure stays the error's, not the
    ``__str__``'s."""
    said = getattr(exc, _SAID, None)
    if isinstance(said, str):
        return said
    try:
        return str(exc)
    except Exception as inner:
        return f"(its message could not be made: {type(inner).__name__} in __str__)"


_SAID = "_rlm_graph_said"  # the redacted message of an error whose __str__ ignores its args


def scrub_error(exc: BaseException, scrub: Callable[[str], str] | None) -> None:
    """Redact ``exc``'s message in place (its text arguments and notes, and those of the
    errors it was raised from and of those an exception group holds), so that a key a
    plugin quoted reaches neither the slot the model reads nor ``result.errors``, a
    traceback or a log. An error whose
    ``__str__`` ignores its arguments (``OSError(5, ...)``, pydantic's ``ValidationError``)
    keeps its redacted text beside it, for `message_of` to give. No ``scrub`` (no secret
    known): nothing to do."""
    if scrub is None:
        return
    seen: set[int] = set()
    waiting: list[BaseException] = [exc]
    while waiting and len(seen) < 64:
        error = waiting.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, BaseExceptionGroup):  # a nursery's: each error it holds
            waiting.extend(error.exceptions)
        else:
            args = tuple(scrub(a) if isinstance(a, str) else a for a in error.args)
            if args != error.args:
                error.args = args
            if isinstance(error, OSError):  # its text is made of these, not of its args
                for field in ("strerror", "filename", "filename2"):
                    value = getattr(error, field, None)
                    if isinstance(value, str):
                        setattr(error, field, scrub(value))
            _keep_said(error, scrub)
        notes = getattr(error, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [scrub(n) if isinstance(n, str) else n for n in notes]
        waiting.extend(e for e in (error.__cause__, error.__context__) if e is not None)


def _keep_said(error: BaseException, scrub: Callable[[str], str]) -> None:
    """Beside ``error``, its redacted message when its ``__str__`` still quotes a secret
    (it reads fields, not the arguments `scrub_error` rewrote)."""
    said = message_of(error)
    redacted = scrub(said)
    if redacted != said:
        _mark(error, _SAID, redacted)


def clipped(text: str, limit: int = 1_000) -> str:
    """``text`` cut to about ``limit`` characters in the middle, keeping its start and its
    end (where a message says what to do): an error that quotes what a guest sent stays
    short, however much it sent."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 3) :]
    return f"{head} [... {len(text) - len(head) - len(tail):,} characters ...] {tail}"


def error_slot(exc: BaseException) -> str:
    """The string a failed slot carries: ``"[ERROR] <type>: <message>"``."""
    message = message_of(exc).strip() or "(no message)"
    return f"[ERROR] {type(exc).__name__}: {message}"


def config_error(
    where: str, exc: ValidationError, *, unnamed: str = "value", hint: str = ""
) -> ConfigError:
    """One line a user can act on, for pydantic's ``exc`` about a configuration value:
    ``"<where>: <field>: <problem> (got <value>); ...<hint>"`` (the one place a
    `ValidationError` becomes a `ConfigError`; raise it ``from None``).

    Args:
        where: what was being configured (``"bad limit"``, ``"models['m']"``).
        exc: the validation error.
        unnamed: what to call a problem with no field (the whole value).
        hint: appended as is (``". Known keywords: ..."``).
    """
    problems = []
    for error in exc.errors(include_url=False):
        field = ".".join(map(str, error["loc"])) or unnamed
        given = error.get("input")
        shown = (
            f" (got {given!r})"
            if isinstance(given, int | float | str) and len(repr(given)) <= 40
            else ""
        )
        # A validator's own ValueError reads as its message, not as pydantic's label.
        said = error["msg"].removeprefix("Value error, ")
        problems.append(f"{field}: {said}{shown}")
    return ConfigError(f"{where}: {'; '.join(problems)}{hint}")


def checked_flag(name: str, value: object) -> bool:
    """``value`` of the on/off keyword ``name``, or a `ConfigError`: a string such as
    ``"no"`` is true to Python, and would turn the feature on."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, not {value!r}")
    return value
