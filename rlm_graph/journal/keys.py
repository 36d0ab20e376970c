"""Hashes the journal keys on: a run's inputs, and one request.

Pure: no trio, no I/O. A hash is a 128-bit BLAKE2b (32 hex digits) of a canonical text,
so the same inputs give the same key in any process, on any machine, in any run.
BLAKE2b rather than SHA-256: as strong, and built into Python, where SHA-256 goes
through OpenSSL's per-call set-up, which costs more than hashing a short prompt (this
runs once per model call of a journaled run).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..contracts import ChatRequest, Image, Message
from ..graph import NodeKind, Workflow
from ..graph.spec import NodeSpec
from .code import function_fingerprint, stable_value

__all__ = [
    "call_hash",
    "canonical_json",
    "provider_identity",
    "function_fingerprints",
    "function_key",
    "json_value",
    "qualname",
    "request_hash",
    "run_key",
    "text_hash",
    "value_hash",
    "workflow_key",
]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces, the same in every process for the same value:
    a set is its members' texts sorted (its own order is its hash order, which differs
    between processes); a dict whose keys cannot be sorted together (``1`` and ``"a"``)
    is its pairs sorted by their keys' texts; other values JSON cannot hold become their
    ``repr``."""
    try:
        return _dumps(value)
    except TypeError:  # keys of several types: '<' between them fails
        return _dumps(_sortable(value))


def _dumps(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), default=_default, ensure_ascii=False
    )


def _default(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return ["set", sorted(canonical_json(member) for member in value)]
    return _repr(value)


def _repr(value: Any) -> str:
    """``repr(value)``, or its type's name where that raises: a key never fails."""
    try:
        return repr(value)
    except Exception:
        return f"<{qualname(type(value))} object; its repr raised>"


def _sortable(value: Any, depth: int = 0) -> Any:
    """``value`` with every dict as its pairs sorted by their keys' canonical texts."""
    if depth > 200:  # as deep as json itself goes before RecursionError, roughly
        return _repr(value)
    if isinstance(value, dict):
        pairs = sorted((canonical_json(k), _sortable(v, depth + 1)) for k, v in value.items())
        return ["dict", [list(pair) for pair in pairs]]
    if isinstance(value, list | tuple):
        return [_sortable(v, depth + 1) for v in value]
    return value


def _digest(parts: list[str]) -> str:
    """The hash of a list of texts, told apart from every other list of texts.

    Joined by NUL, when no part holds a NUL itself (the join is then unambiguous);
    otherwise each part length-prefixed, hashed under another BLAKE2b personalisation,
    so the two framings never meet.
    """
    text = "\x00".join(parts)
    if text.count("\x00") == len(parts) - 1:
        return _hex(text)
    framed = "".join(f"{len(part)}:{part}" for part in parts)
    return _blake2b(
        framed.encode("utf-8", "surrogatepass"), digest_size=16, person=b"rlm-framed"
    ).hexdigest()


def _hex(text: str) -> str:
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON can carry one): kept as it is
        data = text.encode("utf-8", "surrogatepass")
    return _blake2b(data, digest_size=16).hexdigest()


_blake2b = hashlib.blake2b

_PARAMS = ("temperature", "top_p", "max_tokens", "seed", "stop")


def request_hash(request: ChatRequest) -> str:
    """The hash of what a model call asks: model, messages (with their images' bytes),
    parameters and the answer's schema.

    ``node_id`` and ``depth`` are left out: they say where the call is, which the
    journal's node id already says.
    """
    settled = (
        request.temperature is not None
        or request.top_p is not None
        or request.max_tokens is not None
        or request.seed is not None
        or request.stop is not None
        or bool(request.extra)
        or request.response_schema is not None
    )
    return call_hash(request.model, request.messages, request if settled else None)


def call_hash(model: str, messages: Sequence[Message], settings: ChatRequest | None) -> str:
    """`request_hash` from a request's parts: ``settings`` is the request when it sets a
    parameter or a schema, else None (the model-call path knows which without asking
    the request for each field, and runs once per model call of a journaled run)."""
    if len(messages) == 1 and settings is None:
        # The common case (a sub-call: one user message), without the general path's
        # list: this runs once per model call of a journaled run.
        message = messages[0]
        content = message.content
        if not message.parts and "\x00" not in content and "\x00" not in model:
            return _hex(f"{model}\x00{message.role}\x00{content}")
    parts = [model]
    for message in messages:
        parts.append(message.role)
        parts.append(message.content)
        if message.parts:
            # The content names an image by size and type only: its bytes tell two apart.
            parts.append(
                canonical_json(
                    [_image_digest(p) if isinstance(p, Image) else p for p in message.parts]
                )
            )
    if settings is not None:
        schema = settings.response_schema
        parts.append(
            canonical_json(
                [
                    *(getattr(settings, name) for name in _PARAMS),
                    dict(settings.extra),
                    None if schema is None else [schema.name, schema.json_schema],
                ]
            )
        )
    return _digest(parts)


def _image_digest(image: Image) -> str:
    return f"{image.media_type}:{hashlib.sha256(image.data).hexdigest()}"


def value_hash(kind: str, *values: Any) -> str:
    """The hash of a non-model node's inputs (a child's prompt, a function's arguments)."""
    return _digest([kind, *(canonical_json(v) for v in values)])


def text_hash(kind: str, *texts: str) -> str:
    """The hash of texts as they are (no JSON on the way: a system prompt is long)."""
    return _digest([kind, *texts])


def run_key(kind: str, inputs: Mapping[str, Any], configuration: Sequence[Any]) -> str:
    """The key of a run: what it was asked (``inputs``) and how it was set up.

    Two runs with the same key are the same run; the journal resumes one with the other.
    """
    return _digest([kind, canonical_json(dict(inputs)), canonical_json(list(configuration))])


def qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def json_value(value: Any) -> str | None:
    """``value`` as JSON when it comes back the same, types included all the way down
    (so replay returns what the function did: a tuple, which comes back a list, a dict
    with int keys or a defaultdict, nested or not, is not journaled)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        return text if _same(json.loads(text), value) else None
    except (TypeError, ValueError, RecursionError):
        return None


def _same(back: Any, value: Any) -> bool:
    """Whether ``back`` (read from JSON) is ``value``, type for type."""
    if type(back) is not type(value):
        return False
    if type(back) is dict:
        return back.keys() == value.keys() and all(_same(back[k], value[k]) for k in back)
    if type(back) is list:
        return len(back) == len(value) and all(map(_same, back, value))
    return bool(back == value)


def function_key(
    spec: NodeSpec, args: Sequence[Any], kwargs: Mapping[str, Any], fingerprint: str | None = None
) -> str:
    """The request hash of a workflow's function node: its function's fingerprint (its
    code, closure and the globals it reads: `rlm_graph.journal.code`; ``fingerprint``,
    taken when the run started, else now) and its arguments, so that a changed function
    or argument is a divergence, not a stale replay."""
    assert spec.fn is not None
    return _digest(
        [
            "function",
            fingerprint or function_fingerprint(spec.fn),
            canonical_json(stable_value(list(args))),
            canonical_json(stable_value(dict(kwargs))),
        ]
    )


def function_fingerprints(specs: Iterable[NodeSpec]) -> dict[str, str]:
    """The fingerprint of every cached function node's function, by node id, taken once
    as a run starts: what the code reads then (a memo an earlier node fills, a global
    an earlier node sets) would make the same run's keys depend on which of its nodes
    were replayed."""
    taken: dict[int, str] = {}
    fingerprints = {}
    for spec in specs:
        if spec.fn is None or not spec.cache or spec.kind == NodeKind.LLM_CALL:
            continue
        try:
            fingerprints[spec.id] = taken.get(id(spec.fn)) or function_fingerprint(spec.fn)
        except Exception:  # noqa: BLE001 - read again when its node runs, and fails there
            continue
        taken[id(spec.fn)] = fingerprints[spec.id]
    return fingerprints


def provider_identity(key: str, provider: Any) -> list[Any]:
    """What of a provider a run's key holds: its backend, model, the server it talks to
    and the fields it adds to every request (``base_url``, ``extra_body``), so that a
    journal never answers one server's or setting's run with another's replies."""
    return [
        key,
        provider.name,
        provider.model,
        getattr(provider, "base_url", None),
        stable_value(getattr(provider, "extra_body", None) or {}),
    ]


def workflow_key(workflow: Workflow, providers: list[list[Any]]) -> str:
    """The run key of a workflow: its nodes (ids, kinds, dependencies, prompts, models,
    parameters, functions by qualified name) and the engine's providers.

    A function's code and the nodes' arguments are not in it but in each node's own
    key (`function_key`): a change there is a divergence the run reports, inside the
    same run."""
    nodes = [
        [
            spec.id,
            spec.kind.value,
            list(spec.deps),
            qualname(spec.prompt) if callable(spec.prompt) else spec.prompt,
            spec.system,
            spec.model,
            spec.params,
            qualname(spec.fn) if spec.fn else None,
        ]
        for spec in workflow
    ]
    return run_key("workflow", {"nodes": nodes}, providers)
