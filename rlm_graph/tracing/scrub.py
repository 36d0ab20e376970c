"""Keeping secrets out of spans and trace files.

Invariants:
    - Every free text that reaches a span (captured content, error messages, attributes a
      caller hands to a run span) goes through a `Scrubber` first; trace files pass every
      string through one more time on their way to disk.
    - A scrubber redacts three things: literal secret values it was given (an ``api_key``
      from ``backend_kwargs``), the values of environment variables whose name holds
      ``KEY``, ``TOKEN``, ``SECRET`` or ``PASSWORD``, and text shaped like a credential
      (``sk-...`` keys, ``Bearer ...`` tokens, ``api_key=...`` pairs, a few vendor prefixes).
    - Redaction replaces the secret with ``[REDACTED]``; it never raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

__all__ = ["REDACTED", "Scrubber", "secret_values"]

REDACTED = "[REDACTED]"

# The shortest literal worth redacting: shorter env values ("1", "true") are settings,
# and replacing them everywhere would shred ordinary text.
MIN_SECRET_CHARS = 6

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)

_SHAPE_PATTERNS = (
    r"\bsk-[A-Za-z0-9_\-]{8,}",  # OpenAI, Anthropic (sk-ant-...), OpenRouter (sk-or-...)
    r"\b(?:gh[pousr]_|github_pat_)[A-Za-z0-9_]{16,}",  # GitHub
    r"\bhf_[A-Za-z0-9]{16,}",  # Hugging Face
    r"\bAIza[0-9A-Za-z_\-]{20,}",  # Google
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",  # Slack
    r"\bAKIA[0-9A-Z]{16}\b",  # AWS access key id
    r"(?i:\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}",
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",  # JWT
)
_SHAPES = re.compile("|".join(_SHAPE_PATTERNS))

# ``api_key=...``, ``"password": "..."``, ``Authorization: ...``: keep the name, drop the value
# (but not a number: ``max_tokens=2000`` is a setting, not a secret).
_PAIR = re.compile(
    r"(?i)(\b[\w\-]*(?:api[_\-]?key|token|secret|password|passwd|authorization)[\w\-]*"
    r"[\"']?\s*[:=]\s*[\"']?)(?!\[REDACTED\])(?![\d.]+\b)([^\s\"'&,;}]{4,})"
)


def secret_values(
    kwargs: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Secret-looking values of ``kwargs`` and of the environment.

    A value counts when its name holds ``KEY``, ``TOKEN``, ``SECRET``, ``PASSWORD`` (and a
    few spellings) and it is a string of at least `MIN_SECRET_CHARS` characters.

    Args:
        kwargs: keyword arguments, e.g. a provider's ``backend_kwargs`` (``api_key``).
        environ: the environment to read; default ``os.environ``.

    Returns:
        The values, longest first (so a longer secret is redacted before a prefix of it).
    """
    found: set[str] = set()
    for source in (kwargs or {}, os.environ if environ is None else environ):
        for name, value in source.items():
            if (
                isinstance(value, str)
                and len(value) >= MIN_SECRET_CHARS
                and _SECRET_NAME.search(name)
            ):
                found.add(value)
    return sorted(found, key=len, reverse=True)


class Scrubber:
    """Redacts secrets from text.

    Args:
        secrets: literal values to redact wherever they appear.
        environ: read secret-named variables from this environment (default
            ``os.environ``); pass ``{}`` to skip the environment.

    Example:
        >>> Scrubber(["hunter2hunter2"], environ={}).scrub("pw hunter2hunter2, sk-abcdefgh123")
        'pw [REDACTED], [REDACTED]'
    """

    __slots__ = ("_literals",)

    def __init__(
        self, secrets: Iterable[str] = (), *, environ: Mapping[str, str] | None = None
    ) -> None:
        values = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_CHARS}
        values.update(secret_values(environ=environ))
        ordered = sorted(values, key=len, reverse=True)
        self._literals = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def scrub(self, text: str) -> str:
        """``text`` with every secret replaced by ``[REDACTED]``."""
        if self._literals is not None:
            text = self._literals.sub(REDACTED, text)
        text = _SHAPES.sub(REDACTED, text)
        return _PAIR.sub(lambda m: m.group(1) + REDACTED, text)

    def __call__(self, text: str) -> str:
        return self.scrub(text)

    @property
    def has_literals(self) -> bool:
        return self._literals is not None

    def scrub_literals(self, text: str) -> str:
        """Only the known secret values (no shape matching): cheap enough for every node."""
        if self._literals is None:
            return text
        return self._literals.sub(REDACTED, text)
