"""Limits: their configuration and the tree-wide budget arithmetic. Pure: no trio.

One `Budget` is shared by every completion of a recursion tree, so a child's tokens and
dollars count against the root's ``max_tokens`` and ``max_budget``. The runtime charges
it after every model call and, when ``charge`` names a limit, cancels the whole tree.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .contracts import Usage
from .errors import ConfigError

__all__ = ["Budget", "Limits", "OnLimit", "Tally"]

OnLimit = Literal["return", "raise"]


class Limits(BaseModel):
    """Every limit of a run. ``None`` means unlimited.

    Attributes:
        max_depth: deepest child completion; at this depth ``rlm_query`` falls back to a
            plain model call (the root is depth 0; default 1, as the reference library).
        max_iterations: root turns per completion before the model is asked once for
            a final answer.
        max_timeout: wall-clock seconds for the whole tree.
        max_tokens: input + output tokens over the whole tree.
        max_budget: USD over the whole tree (needs prices or server-reported costs).
        max_errors: consecutive turns whose code failed.
        batch_max_concurrent: slots of one batch in flight at once.
        max_concurrent_subcalls: child completions in flight at once, tree-wide.
        on_limit: ``"return"`` the best partial answer with the reason, or ``"raise"`` a
            `LimitExceeded` that carries it.
    """

    # strict: max_depth="2" or max_timeout=True is a mistake to report, not to coerce.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_depth: int = Field(1, ge=0)
    max_iterations: int = Field(30, ge=1)
    max_timeout: float | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, gt=0)
    max_budget: float | None = Field(None, gt=0)
    max_errors: int | None = Field(None, ge=1)
    batch_max_concurrent: int = Field(16, ge=1)
    max_concurrent_subcalls: int = Field(4, ge=1)
    on_limit: OnLimit = "return"

    @model_validator(mode="after")
    def _finite(self) -> Limits:
        if self.max_timeout is not None and not math.isfinite(self.max_timeout):
            raise ValueError("max_timeout must be a finite number of seconds, or None")
        return self

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> Limits:
        """Build limits, turning pydantic's error into a `ConfigError` that names the fix."""
        try:
            return cls(**kwargs)  # type: ignore[arg-type]
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'limits'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ConfigError(f"bad limit: {problems}") from None


class Budget:
    """Tokens and dollars spent by a whole recursion tree, against its limits."""

    __slots__ = ("cost", "exceeded", "limits", "usage")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.usage = Usage()
        self.cost = 0.0
        self.exceeded: str | None = None

    def charge(self, usage: Usage, cost: float | None) -> str | None:
        """Add one call's usage; return the name of the first limit now passed, if any."""
        self.usage = self.usage + usage
        self.cost += cost or 0.0
        if self.exceeded is None:
            self.exceeded = self.check()
        return self.exceeded

    def check(self) -> str | None:
        limits = self.limits
        if limits.max_tokens is not None and self.usage.total_tokens > limits.max_tokens:
            return "max_tokens"
        if limits.max_budget is not None and self.cost > limits.max_budget:
            return "max_budget"
        return None


class Tally:
    """Usage and cost of one completion including its children's.

    A child completion's tally points at its parent's, so one call adds to every
    completion above it: a parent's totals always include its children's.
    """

    __slots__ = ("cost", "parent", "usage")

    def __init__(self, parent: Tally | None = None) -> None:
        self.parent = parent
        self.usage = Usage()
        self.cost = 0.0

    def add(self, usage: Usage, cost: float | None) -> None:
        node: Tally | None = self
        while node is not None:
            node.usage = node.usage + usage
            node.cost += cost or 0.0
            node = node.parent
