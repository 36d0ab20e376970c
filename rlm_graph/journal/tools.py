"""Custom tools a journaled run records (``{"tool": fn, "journal": True}``), and the seed
that makes a re-run block draw the same random numbers.

Pure: no trio. A tool's call runs on a REPL thread; it asks the run's journal (the
scheduler's `rlm_graph.runtime.replay.Replayer`, duck-typed here) for a recorded result
and records a new one with one list append.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

from ..graph import NodeKind, NodeRecord, NodeStatus
from .code import code_fingerprint, stable_value
from .keys import json_value, value_hash

__all__ = ["MISSING", "NOT_JOURNALED", "JournaledTool", "seed_code", "tools_key"]

MISSING: Any = object()
"""What a journal answers for a tool call it holds no result for."""

NOT_JOURNALED: Any = object()
"""What a journal answers for a node it holds no result for (the node's body runs)."""


class JournaledTool:
    """A custom tool given as ``{"tool": fn, "journal": True}``: in a journaled run each
    call's result (JSON only) is recorded, keyed ``<block>/tool-<ordinal>`` and by a hash
    of the arguments, and replayed on resume instead of calling ``fn`` again.

    Called outside a journaled run it is just ``fn``.
    """

    def __init__(self, fn: Any, name: str) -> None:
        self.fn = fn
        self.name = name
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def bind(self, bridge: Any) -> Any:
        """The tool as one completion's REPL calls it (``bridge``: its bridge, or the
        proxy of a persistent session)."""

        @functools.wraps(self.fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(getattr(bridge, "target", None) or bridge, args, kwargs)

        return call

    def call(self, bridge: Any, args: Any, kwargs: Any) -> Any:
        """Call the tool for code of ``bridge``'s current block (any thread)."""
        journal: Any = getattr(getattr(bridge, "run", None), "journal", None)
        if journal is None or bridge.block is None:
            return self.fn(*args, **kwargs)
        node_id = f"{bridge.block}/tool-{bridge.next_ordinal()}"
        request = value_hash("tool", self.name, list(args), dict(kwargs))
        stored = journal.tool_result(node_id, request)
        if stored is not MISSING:
            return stored
        value = self.fn(*args, **kwargs)
        text = json_value(value)
        if text is None:  # JSON cannot give it back as it is: the tool runs again on resume
            return value
        journal.record_tool(
            NodeRecord(
                id=node_id,
                kind=NodeKind.FUNCTION,
                depth=bridge.depth,
                completion=bridge.completion,
                status=NodeStatus.OK,
                wall_start=time.time(),
                input_preview=f"{self.name}(...)",
            ),
            request,
            text,
        )
        return value


def seed_code(key: str, block_id: str) -> str:
    """Code that seeds the REPL's `random` for one block of a journaled run: the same
    block of the same run draws the same numbers in every attempt."""
    seed = int(value_hash("seed", key, block_id)[:16], 16)
    return f"__import__('random').seed({seed})"


def tools_key(tools: Mapping[str, tuple[Any, Any]]) -> str:
    """A completion's custom tools as one hash, part of a child completion's journal key
    (a child is replayed whole, so its tools must be what they were): each one's name
    and, for a function, its code (not the state it reads: a tool's cache must not change
    the key), for data its value."""
    shown = []
    for name in sorted(tools):
        value = tools[name][0]
        value = value.fn if isinstance(value, JournaledTool) else value
        if callable(value):
            shown.append([name, "function", code_fingerprint(value)])
        else:
            shown.append([name, "data", stable_value(value)])
    return value_hash("tools", shown)
