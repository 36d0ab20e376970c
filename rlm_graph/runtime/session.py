"""A completion's REPL environment: made, started, loaded and always closed; and the
REPL a persistent RLM keeps across completions.

Invariants:
    - A completion's own environment (`environment_scope`) is closed when the completion
      ends, however it ends (shielded: a cancelled run still closes its guest).
    - A `PersistentSession` owns one environment for many completions, one at a time
      (`PersistentSession.claim`); completion ``n`` finds ``context_n`` and ``history_k``
      (k < n) in it. It outlives the trio loop it was started in: its bridge is a
      `BridgeProxy` pointed at the running completion's bridge, and at nothing between.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import trio

from ..contracts import Environment
from ..errors import ConfigError, PluginError
from ..hooks.checks import contract_problem
from ..journal.tools import JournaledTool
from ..protocol.state import CompletionState, LoopSettings, ToolTable
from ..protocol.tool_code import run_tool_code
from .bridge import BridgeProxy, CompletionBridge

if TYPE_CHECKING:
    from .context import Run

__all__ = [
    "CLOSE_SECONDS",
    "PersistentSession",
    "close_environment",
    "environment_scope",
    "make_environment",
]

CLOSE_SECONDS = 5.0
"""How long a plugin's ``aclose`` (an environment's, a provider's) may take before it is
logged and left: a close that hangs never holds a run, or its result."""

logger = logging.getLogger("rlm_graph")


def make_environment(
    factory: Any, settings: LoopSettings, bridge: Any, tools: ToolTable, depth: int
) -> Environment:
    """An environment for one completion (or a persistent session), not yet started."""
    bound = {
        name: (value.bind(bridge), text) if isinstance(value, JournaledTool) else (value, text)
        for name, (value, text) in tools.items()
    }
    env: Environment = factory(
        bridge=bridge, tools=bound, depth=depth, **dict(settings.environment_kwargs)
    )
    problem = contract_problem(env, _ENVIRONMENT_METHODS)
    if problem is not None:
        raise PluginError(
            f"the environment factory {getattr(factory, '__qualname__', factory)!r} made "
            f"{type(env).__name__}, which {problem}; an environment must follow "
            "rlm_graph.contracts.Environment"
        )
    return env


_ENVIRONMENT_METHODS = (
    "start",
    "add_context",
    "add_history",
    "set_variable",
    "execute",
    "reset_answer",
    "answer_content",
    "aclose",
)


@asynccontextmanager
async def environment_scope(
    factory: Any,
    settings: LoopSettings,
    bridge: CompletionBridge,
    tools: ToolTable,
    depth: int,
    context: Any,
) -> AsyncIterator[Environment]:
    """Make, start and load (``context`` as ``context_0``) one completion's
    environment; close it on the way out, and count the threads it left behind."""
    env = make_environment(factory, settings, bridge, tools, depth)
    try:  # closed once, however far it got (a start() that failed included)
        await env.start()
        await env.add_context(context, 0)
        await run_tool_code(env, settings.tool_code)
        yield env
    finally:
        await close_environment(env)
        bridge.run.leaked_threads += getattr(env, "leaked_threads", 0)


async def close_environment(env: Environment) -> None:
    """``env.aclose()``, shielded (it runs on the way out of a cancelled run too) and
    within `CLOSE_SECONDS`: an environment plugin whose close hangs is logged and left,
    rather than holding the run (and its result) past any limit."""
    with trio.move_on_after(CLOSE_SECONDS, shield=True) as waited:
        await env.aclose()
    if waited.cancelled_caught:
        logger.warning(
            "environment %s did not close within %s s; it is left as it is",
            type(env).__name__,
            CLOSE_SECONDS,
        )


_ONE_AT_A_TIME = (
    "a persistent session is one conversation, so its completions must come one at a time. "
    "Wait for the running one, or use one RLM per thread (persistent=False for independent ones)"
)


class PersistentSession:
    """The REPL of ``RLM(persistent=True)``: one conversation over many completions.

    Args:
        factory: the environment factory.
        settings: the loop's settings (the root's tools, the environment's keywords).
    """

    def __init__(self, factory: Any, settings: LoopSettings) -> None:
        self.factory = factory
        self.settings = settings
        self.proxy = BridgeProxy()
        self.env: Environment | None = None
        self.completions = 0  # finished completions: the next one's context_N
        self._leaked = 0
        self._busy = threading.Lock()
        self._first_history: list[dict[str, Any]] | None = None  # `end` restores ``history``
        self._set_up = False

    @contextmanager
    def claim(self, fix: str = _ONE_AT_A_TIME) -> Iterator[None]:
        """Hold the session for one completion (or its closing); a `ConfigError` when a
        completion of it already runs (in another thread or task), ``fix`` saying what to do."""
        if not self._busy.acquire(blocking=False):
            raise ConfigError(
                "persistent=True: this RLM is already running a completion (in another "
                f"thread or task); {fix}"
            )
        try:
            yield
        finally:
            self._busy.release()

    async def begin(self, context: Any) -> tuple[Environment, int]:
        """Ready the REPL for the next completion (started on first use): the answer
        reset, ``context`` loaded as ``context_N``. Returns the environment and N."""
        if self.env is None:
            env = make_environment(self.factory, self.settings, self.proxy, self.settings.tools, 0)
            try:
                await env.start()
            except BaseException:  # failed or cancelled: its folders go now, not at exit
                await close_environment(env)
                raise
            self.env = env
        self._leaked = getattr(self.env, "leaked_threads", 0)
        await self.env.reset_answer()
        await self.env.add_context(context, self.completions)
        if not self._set_up:  # tool_code, until it has run without an error
            await run_tool_code(self.env, self.settings.tool_code)
            self._set_up = True
        return self.env, self.completions

    async def end(self, run: Run, state: CompletionState) -> None:
        """The completion begun last has answered: its history goes in as ``history_N``
        (``history`` is the first's again, if a compaction moved it), and the threads its
        blocks left behind are counted on ``run``."""
        assert self.env is not None
        await self.env.add_history(state.trajectory, self.completions)
        compacts = self.settings.compaction is not None and "history" not in self.settings.tools
        if compacts and self.completions == 0:
            self._first_history = [m.model_dump() for m in state.trajectory]
        elif compacts and self._first_history is not None:
            await self.env.set_variable("history", self._first_history)
        self.completions += 1
        run.leaked_threads += getattr(self.env, "leaked_threads", 0) - self._leaked

    async def aclose(self) -> None:
        """Close the session's REPL: a next completion starts a new conversation
        (``context_0``, no history). Refused while a completion runs."""
        with self.claim("close it after the completion returns"):
            env, self.env = self.env, None
            self.completions, self._first_history, self._set_up = 0, None, False
            if env is not None:
                await close_environment(env)
