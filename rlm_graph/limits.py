"""Limits: their configuration and the tree-wide budget arithmetic. Pure: no trio.

One `Budget` is shared by every completion of a recursion tree, so a child's tokens and
dollars count against the root's ``max_tokens`` and ``max_budget``. The runtime charges
it after every model call and, when ``charge`` names a limit, cancels the whole tree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .contracts import ModelInfo, Usage, estimate_tokens
from .errors import ConfigError, config_error
from .hedging import HedgePolicy

__all__ = [
    "reserved_tokens",
    "Budget",
    "Limits",
    "OnLimit",
    "RateBucket",
    "Reservation",
    "Tally",
    "is_rate",
    "model_names",
    "resolve_model_info",
]

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
        hedge: hedged sub-calls (`HedgePolicy`; True for the defaults, or a dict of its
            keys; None/False: off): a sub-call slower than most of its model's get one
            duplicate, the first answer wins (docs/limits.md, "Hedged sub-calls").
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
    hedge: HedgePolicy | None = None

    @field_validator("hedge", mode="before")
    @classmethod
    def _hedge(cls, value: object) -> HedgePolicy | None:
        return HedgePolicy.of(value)  # type: ignore[arg-type]

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
            errors = exc.errors()
            own = errors[0].get("ctx", {}).get("error") if len(errors) == 1 else None
            if isinstance(own, ConfigError):  # hedge=: a policy, which says its own error
                raise ConfigError(str(own)) from None
            raise config_error("bad limit", exc, unnamed="limits") from None


# A dated snapshot id: gpt-5-mini-2025-08-07, claude-sonnet-4-5-20250929.
_DATE_SUFFIX = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8})$")


def model_names(name: str) -> list[str]:
    """The names a model's price may be listed under, most specific first.

    ``openai/gpt-5-mini-2025-08-07`` -> itself, ``openai/gpt-5-mini``,
    ``gpt-5-mini-2025-08-07``, ``gpt-5-mini``: a dated snapshot is priced as its base model,
    an OpenRouter-style ``vendor/model`` id as the model.
    """
    names = [name]
    undated = _DATE_SUFFIX.sub("", name)
    if undated != name:
        names.append(undated)
    for known in list(names):
        if "/" in known:
            names.append(known.rsplit("/", 1)[1])
    return list(dict.fromkeys(names))


def resolve_model_info(table: Mapping[str, ModelInfo], name: str) -> ModelInfo | None:
    """What ``table`` knows of model ``name``, looking through `model_names`.

    Fields merge: an exact entry's context window stays even when its price comes from
    the base model's entry. ``None`` when no name is in the table.
    """
    found: dict[str, object] = {}
    for candidate in model_names(name):
        info = table.get(candidate)
        if info is None:
            continue
        for field, value in info.model_dump(exclude_none=True).items():
            found.setdefault(field, value)
    return ModelInfo(**found) if found else None  # type: ignore[arg-type]


class _Counts:
    """Running token counts as plain ints: one call adds to several of these, and a frozen
    `Usage` per addition would cost a validation each (see docs/benchmarks.md)."""

    __slots__ = (
        "cache_write_tokens",
        "cached_tokens",
        "cost",
        "estimated",
        "input_tokens",
        "output_tokens",
        "reasoning_tokens",
    )

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.cache_write_tokens = 0
        self.reasoning_tokens = 0
        self.cost = 0.0
        self.estimated = False

    def _add(self, usage: Usage, cost: float | None) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_tokens += usage.cached_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.cost += cost or 0.0
        self.estimated = self.estimated or usage.estimated

    @property
    def usage(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_tokens=self.cached_tokens,
            cache_write_tokens=self.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens,
            estimated=self.estimated,
        )


def reserved_tokens(text: str) -> int:
    """What the token and dollar limits reserve for ``text`` in a prompt: four ASCII
    characters a token, and about a token more for each character outside ASCII (CJK
    text is about a token a character, where four characters a token would reserve a
    quarter of it). An estimate that errs high, as a reservation should."""
    estimate = estimate_tokens(text)
    if text.isascii():
        return estimate
    extra = len(text.encode("utf-8", "surrogatepass")) - len(text)  # 1-3 bytes a character
    return estimate + (extra + 1) // 2


class Reservation:
    """Tokens and dollars set aside for one model call until its real usage is known.

    ``cost`` None: the call's price cannot be estimated yet (a provider that reports its
    own costs, before any call of ``model`` has); ``model`` names what it prices;
    ``estimated_input`` is the prompt's chars/4 estimate (what the real count corrects)."""

    __slots__ = ("cost", "estimated_input", "model", "tokens")

    def __init__(
        self, tokens: int, cost: float | None, model: str = "", estimated_input: int = 0
    ) -> None:
        self.tokens = tokens
        self.cost = cost
        self.model = model
        self.estimated_input = estimated_input


class Budget(_Counts):
    """Tokens and dollars spent by a whole recursion tree, against its limits.

    Concurrent calls reserve an estimate before they go out (`fits`, `reserve`) and settle
    it with the real usage after (`settle`, or `release` when the call failed). A call
    whose estimate does not fit beside the reservations in flight waits (the runtime's
    `rlm_graph.concurrency.capacity.BudgetGate`); one that finds nothing in flight always goes.
    So at most one call's worth passes a limit, not ``max_concurrent`` calls' worth. A
    call whose cost cannot be estimated (``cost=None``) under ``max_budget`` goes only
    alone, and nothing goes beside it: until a cost is known, calls go one at a time.
    """

    __slots__ = (
        "exceeded",
        "in_flight",
        "limits",
        "reserved_cost",
        "reserved_tokens",
        "unknown_in_flight",
    )

    def __init__(self, limits: Limits) -> None:
        super().__init__()
        self.limits = limits
        self.exceeded: str | None = None
        self.reserved_tokens = 0
        self.reserved_cost = 0.0
        self.in_flight = 0
        self.unknown_in_flight = 0

    @property
    def limited(self) -> bool:
        """A token or dollar limit is set (reservations are needed)."""
        return self.limits.max_tokens is not None or self.limits.max_budget is not None

    def fits(self, tokens: int, cost: float | None) -> bool:
        """Whether a call estimated at ``tokens`` and ``cost`` (None: not known) may go
        out now."""
        if self.in_flight == 0:
            return True  # alone, it may pass a limit: that is the one call's worth
        limits = self.limits
        spent = self.input_tokens + self.output_tokens + self.reserved_tokens + tokens
        if limits.max_tokens is not None and spent > limits.max_tokens:
            return False
        if limits.max_budget is None:
            return True
        if cost is None or self.unknown_in_flight:
            return False  # what is unknown may take the rest of the budget
        return self.cost + self.reserved_cost + cost <= limits.max_budget

    def reserve(
        self, tokens: int, cost: float | None, model: str = "", estimated_input: int = 0
    ) -> Reservation:
        self.reserved_tokens += tokens
        self.reserved_cost += cost or 0.0
        self.in_flight += 1
        self.unknown_in_flight += cost is None
        return Reservation(tokens, cost, model, estimated_input)

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation (the call failed, or is settling)."""
        self.reserved_tokens -= reservation.tokens
        self.reserved_cost -= reservation.cost or 0.0
        self.in_flight -= 1
        self.unknown_in_flight -= reservation.cost is None

    def settle(self, reservation: Reservation, usage: Usage, cost: float | None) -> str | None:
        """Replace a reservation by the call's real usage; see `charge`."""
        self.release(reservation)
        return self.charge(usage, cost)

    def charge(self, usage: Usage, cost: float | None) -> str | None:
        """Add one call's usage; return the name of the first limit now passed, if any."""
        self._add(usage, cost)
        if self.exceeded is None:
            self.exceeded = self.check()
        return self.exceeded

    def check(self) -> str | None:
        limits = self.limits
        spent = self.input_tokens + self.output_tokens
        if limits.max_tokens is not None and spent > limits.max_tokens:
            return "max_tokens"
        if limits.max_budget is not None and self.cost > limits.max_budget:
            return "max_budget"
        return None


class Tally(_Counts):
    """Usage and cost of one completion including its children's.

    A child completion's tally points at its parent's, so one call adds to every
    completion above it: a parent's totals always include its children's.
    """

    __slots__ = ("parent",)

    def __init__(self, parent: Tally | None = None) -> None:
        super().__init__()
        self.parent = parent

    def add(self, usage: Usage, cost: float | None) -> None:
        node: Tally | None = self
        while node is not None:
            node._add(usage, cost)
            node = node.parent


def is_rate(value: object) -> bool:
    """Whether ``value`` is a rate a provider may declare (``requests_per_minute``,
    ``tokens_per_minute``): a positive finite number (not a bool, NaN or infinity)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < math.inf


class RateBucket:
    """A provider's requests-per-minute and tokens-per-minute buckets: the arithmetic.

    Each bucket holds at most one minute's allowance and refills continuously, so a
    burst up to the per-minute limit passes at once and the steady rate never exceeds
    it. No clock and no lock here: the trio limiter (`rlm_graph.concurrency.limiter`) and
    the Ray executor's cluster-wide actor bring theirs, pass the time in, and keep their
    waiters in arrival order around `take_or_wait`.
    """

    __slots__ = ("requests", "rpm", "stamp", "tokens", "tpm")

    def __init__(self, rpm: float | None = None, tpm: float | None = None) -> None:
        self.rpm = rpm
        self.tpm = tpm
        # At least one request at once: below one a minute, the first would wait.
        self.requests = max(1.0, float(rpm)) if rpm else math.inf
        self.tokens = float(tpm) if tpm else math.inf
        self.stamp: float | None = None  # the time of the last refill; None: full, never read

    @property
    def limited(self) -> bool:
        return bool(self.rpm or self.tpm)

    def _refill(self, now: float) -> None:
        if self.stamp is not None:
            elapsed = now - self.stamp
            if self.rpm:
                most = max(1.0, float(self.rpm))
                self.requests = min(most, self.requests + elapsed * self.rpm / 60)
            if self.tpm:
                self.tokens = min(float(self.tpm), self.tokens + elapsed * self.tpm / 60)
        self.stamp = now

    def take_or_wait(self, tokens: int, now: float) -> float:
        """Take one request of about ``tokens`` tokens at time ``now`` (seconds) if the
        buckets allow it and return 0; else take nothing and return the seconds to wait
        before asking again. A request larger than a whole minute's tokens counts as one
        minute's, so that it can ever go."""
        tokens = min(tokens, int(self.tpm)) if self.tpm else 0
        self._refill(now)
        wait = 0.0
        if self.rpm and self.requests < 1:
            wait = max(wait, (1 - self.requests) * 60 / self.rpm)
        if self.tpm and self.tokens < tokens:
            wait = max(wait, (tokens - self.tokens) * 60 / self.tpm)
        if wait <= 0:
            self.requests -= 1
            self.tokens -= tokens
        return wait

    def settle(self, estimated: int, actual: int) -> None:
        """Correct the token bucket once the real usage of a request is known."""
        if self.tpm:
            self.tokens -= actual - estimated
