"""A block of model code, compiled: what `ReplSession` runs, kept by its exact text.

A block is parsed, its ``except`` handlers and ``finally`` bodies get the stop check
(`STOP_CHECK`), and a last expression is split off to be shown the way a notebook shows
it. For a short block that costs more than running it: about 6% of the instructions of a
batch completion whose block makes eight sub-calls (docs/benchmarks.md). Models write
the same block again and again (a batch of items under one prompt: the item is in
``context``, the code the same), so `ReplSession` keeps the compiled pair (`keep`) and
looks it up by the block's exact text (`cached`) before compiling it (`compile_block`).

Invariants:
    - A hit is the same source compiled the same way (``dont_inherit=True``, the one file
      name, the stop checks in): code objects are immutable, so one serves any number of
      sessions and threads at once.
    - Bounded by weight, not only by count: at most `CACHED_BLOCKS` blocks, of at most
      `CACHED_CHARS` characters each, weighing together at most `CACHED_BYTES` (a block's
      weight is its source and its compiled constants: ``"0" * 4000`` is folded into a
      4,000-character constant at compile time). The least recently used go first; a
      block heavier than a sixteenth of the budget is never kept.
    - What is kept compiled without a word: a block whose compilation printed something
      (a ``SyntaxWarning``: ``x is 1``, an invalid escape) is never kept, so the model
      sees the warning every time, as it would without the cache (the session decides,
      from its captured stderr). A block that fails to compile is never kept either.
"""

from __future__ import annotations

import ast
import sys
import threading
from collections import OrderedDict
from types import CodeType

__all__ = [
    "CACHED_BLOCKS",
    "CACHED_BYTES",
    "CACHED_CHARS",
    "REPL_FILENAME",
    "STOP_CHECK",
    "Compiled",
    "cached",
    "compile_block",
    "keep",
]

REPL_FILENAME = "<repl>"
"""The file name of model code in tracebacks."""

STOP_CHECK = "__rlm_stop_check__"
"""The name each handler of model code calls first (`ReplSession.stop_thread`)."""

CACHED_BLOCKS = 256
CACHED_CHARS = 16_384
CACHED_BYTES = 4 * 1024 * 1024

Compiled = tuple[CodeType, CodeType | None]
"""A block as (its statements, its last expression or None)."""

_lock = threading.Lock()
_kept: OrderedDict[str, tuple[Compiled, int]] = OrderedDict()  # code -> (pair, weight)
_weight = 0


def cached(code: str) -> Compiled | None:
    """The kept compiled form of ``code``, or None."""
    with _lock:
        found = _kept.get(code)
        if found is None:
            return None
        _kept.move_to_end(code)
        return found[0]


def keep(code: str, pair: Compiled) -> None:
    """Keep ``pair``, the compiled form of ``code``, if it is light enough (the module's
    invariants)."""
    global _weight
    if len(code) > CACHED_CHARS:
        return
    weight = sys.getsizeof(code) + _constants_weight(pair[0])
    if pair[1] is not None:
        weight += _constants_weight(pair[1])
    if weight > CACHED_BYTES // 16:
        return
    with _lock:
        if code in _kept:
            return
        _kept[code] = (pair, weight)
        _weight += weight
        while len(_kept) > CACHED_BLOCKS or _weight > CACHED_BYTES:
            _, (_, dropped) = _kept.popitem(last=False)
            _weight -= dropped


def compile_block(code: str) -> Compiled:
    """Compile the block ``code`` (see the module's docstring).

    Raises:
        SyntaxError: ``code`` is not Python.
    """
    tree = ast.parse(code, REPL_FILENAME, "exec")
    if "except" in code or "finally" in code:  # no handler is written without them
        _CheckHandlers().visit(tree)
    last: ast.expr | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop().value  # type: ignore[attr-defined]
    body = compile(tree, REPL_FILENAME, "exec", dont_inherit=True)
    if last is None:
        return body, None
    return body, compile(ast.Expression(last), REPL_FILENAME, "eval", dont_inherit=True)


def _constants_weight(code: CodeType) -> int:
    """Bytes held by ``code``'s constants, those of its nested functions included."""
    total, stack = 0, list(code.co_consts)
    while stack:
        item = stack.pop()
        if isinstance(item, CodeType):
            stack.extend(item.co_consts)
        elif isinstance(item, tuple | frozenset):
            stack.extend(item)
        total += sys.getsizeof(item)
    return total


class _CheckHandlers(ast.NodeTransformer):
    """Start every ``except`` handler and ``finally`` body with ``__rlm_stop_check__()``."""

    def _check(self, anchor: ast.AST) -> ast.stmt:
        call = ast.Expr(ast.Call(ast.Name(STOP_CHECK, ast.Load()), [], []))
        return ast.fix_missing_locations(ast.copy_location(call, anchor))

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.AST:
        self.generic_visit(node)
        node.body.insert(0, self._check(node.body[0]))
        return node

    def _visit_try(self, node: ast.Try | ast.TryStar) -> ast.AST:
        self.generic_visit(node)
        if node.finalbody:
            node.finalbody.insert(0, self._check(node.finalbody[0]))
        return node

    visit_Try = _visit_try
    visit_TryStar = _visit_try
