"""A workflow's plan, before it runs, as JSON data and as Graphviz DOT (pure).

``Workflow.to_json()`` / ``Workflow.to_dot()`` call these. The JSON (``"format":
"rlm-graph-workflow/1"``) lists every node with its kind, dependencies, arguments (node
references as ``{"ref": id}``, constants as JSON, or ``{"repr": ...}`` when JSON cannot
hold them: an object, NaN, an infinity), model, parameters and options, and every
dependency edge.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .export import dot_quote
from .nodes import NodeKind, preview
from .spec import NodeRef, NodeSpec, is_async

__all__ = ["PLAN_FORMAT", "plan_dot", "plan_jsonable"]

PLAN_FORMAT = "rlm-graph-workflow/1"
_REPR_LIMIT = 200


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _shown(value: Any) -> Any:
    """An argument as JSON: references as ``{"ref": id}``, containers walked."""
    if isinstance(value, NodeRef):
        return {"ref": value.id}
    if isinstance(value, dict):
        return {str(key): _shown(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(item) for item in value]
    if isinstance(value, set | frozenset):
        return {"set": sorted((_shown(item) for item in value), key=repr)}
    try:
        json.dumps(value, allow_nan=False)  # NaN and infinities are not JSON
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except Exception:  # its preview names its type
            text = preview(value)
        return {"repr": text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + "..."}
    return value


def _node(spec: NodeSpec) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": spec.id,
        "kind": spec.kind.value,
        "deps": list(spec.deps),
        "args": _shown(list(spec.args)),
        "kwargs": _shown(spec.kwargs),
        "retries": spec.retries,
        "timeout": spec.timeout,
        "cache": spec.cache,
        "receive_failures": spec.receive_failures,
    }
    if spec.kind == NodeKind.LLM_CALL:
        prompt = spec.prompt
        node["prompt"] = {"function": _name(prompt)} if callable(prompt) else prompt
        node.update(system=spec.system, model=spec.model, params=_shown(spec.params))
    else:
        # A plain function runs in a worker thread, whatever its spec's default loop.
        node.update(function=_name(spec.fn), loop=spec.loop if is_async(spec.fn) else "thread")
    return node


def plan_jsonable(specs: Iterable[NodeSpec]) -> dict[str, Any]:
    """The plan of the workflow whose node specs are ``specs``, as JSON data."""
    nodes = [_node(spec) for spec in specs]
    edges = [[dep, node["id"]] for node in nodes for dep in node["deps"]]
    return {"format": PLAN_FORMAT, "nodes": nodes, "edges": edges}


def plan_dot(specs: Iterable[NodeSpec]) -> str:
    """The plan as DOT text: a box per model call (its model), a component per function
    (its name), an edge per dependency; options (retries, timeout) in the label."""
    lines = ["digraph workflow {", "  rankdir=LR;"]
    edges: list[str] = []
    for spec in specs:
        if spec.kind == NodeKind.LLM_CALL:
            label, shape = f"{spec.id}\nllm {spec.model or '(default model)'}", "box"
        else:
            label, shape = f"{spec.id}\n{getattr(spec.fn, '__name__', 'fn')}()", "component"
        if spec.retries:
            label += f"\nretries={spec.retries}"
        if spec.timeout is not None:
            label += f"\ntimeout={spec.timeout:g}s"
        lines.append(f"  {dot_quote(spec.id)} [label={dot_quote(label)}, shape={shape}];")
        edges.extend(f"  {dot_quote(dep)} -> {dot_quote(spec.id)};" for dep in spec.deps)
    lines.extend(edges)
    lines.append("}")
    return "\n".join(lines) + "\n"
