"""A block of model code, compiled: what `ReplSession` runs, cached by its exact text.

A block is parsed, its ``except`` handlers and ``finally`` bodies get the stop check
(`STOP_CHECK`), and a last expression is split off to be shown the way a notebook shows
it. For a short block that costs more than running it: about 6% of the instructions of a
batch completion whose block makes eight sub-calls (docs/benchmarks.md). Models write
the same block again and again (a batch of items under one prompt: the item is in
``context``, the code the same), so the compiled pair is kept, keyed by the block's
exact text.

Invariants:
    - A hit is the same source compiled the same way (``dont_inherit=True``, the one file
      name): code objects are immutable, so one serves any number of sessions and
      threads at once.
    - Bounded: at most `CACHED_BLOCKS` blocks of at most `CACHED_CHARS` characters each
      are kept (longer blocks are compiled every time); a block that fails to compile is
      never kept, its error is raised each time.
"""

from __future__ import annotations

import ast
import functools
from types import CodeType

__all__ = ["CACHED_BLOCKS", "CACHED_CHARS", "REPL_FILENAME", "STOP_CHECK", "compiled"]

REPL_FILENAME = "<repl>"
"""The file name of model code in tracebacks."""

STOP_CHECK = "__rlm_stop_check__"
"""The name each handler of model code calls first (`ReplSession.stop_thread`)."""

CACHED_BLOCKS = 256
CACHED_CHARS = 16_384


def compiled(code: str) -> tuple[CodeType, CodeType | None]:
    """The block ``code`` as (its statements, its last expression or None).

    Raises:
        SyntaxError: ``code`` is not Python.
    """
    if len(code) > CACHED_CHARS:
        return _compile(code)
    return _cached(code)


def _compile(code: str) -> tuple[CodeType, CodeType | None]:
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


_cached = functools.lru_cache(maxsize=CACHED_BLOCKS)(_compile)


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
