"""Keeping secrets out of spans and trace files.

Invariants:
    - Every free text that reaches a span (captured content, error messages, attributes a
      caller hands to a run span) goes through a `Scrubber` first; trace files pass every
      string through one more time on their way to disk.
    - A scrubber redacts three things: literal secret values it was given (an ``api_key``
      or a secret-named header from ``backend_kwargs``), the values of environment
      variables whose name holds ``KEY``, ``TOKEN``, ``SECRET`` or ``PASSWORD`` (and of
      the OTLP exporter's ``OTEL_EXPORTER_OTLP_HEADERS``), and text shaped like a
      credential (``sk-...`` keys, ``Bearer ...`` tokens, ``api_key=...`` pairs, a URL's
      user and password, a few vendor prefixes).
    - Of a known secret, any run of `RUN_CHARS` (8) or more consecutive characters is
      redacted too (a server echoing ``...test-planted`` of a key leaks most of it), for
      secrets of at least `RUN_SECRET_CHARS` (12) characters that look like a key (no
      whitespace, no ``://``): a shorter secret's 8-character run is nearly all of it and
      is better matched whole, and a URL's or a sentence's 8-grams are ordinary text.
    - Redaction replaces the secret with ``[REDACTED]``; it never raises.
    - A scrubbed text is whole UTF-8: each lone surrogate (half a character: a file name
      that is not UTF-8, an exception's message) becomes U+FFFD, since a single one made
      the OTLP encoder lose the whole batch it was in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from urllib.parse import unquote

from .._files import utf8_text
from ..errors import URL_USERINFO, without_url_passwords as without_url_passwords

__all__ = [
    "REDACTED",
    "RUN_CHARS",
    "SecretRuns",
    "Scrubber",
    "secret_values",
    "without_key_shapes",
]

REDACTED = "[REDACTED]"

# The shortest literal worth redacting: shorter env values ("1", "true") are settings,
# and replacing them everywhere would shred ordinary text.
MIN_SECRET_CHARS = 6
# Any run this long of a known secret is redacted, for secrets at least RUN_SECRET_CHARS long.
RUN_CHARS = 8
RUN_SECRET_CHARS = 12

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
# A header holding a credential (``api-key``, ``x-api-key``, ``Authorization``, ``Cookie``),
# and the scheme before the token in its value.
_SECRET_HEADER = re.compile(r"key|token|auth|secret|passw", re.IGNORECASE)
# The OTLP exporter's headers (OTEL_EXPORTER_OTLP_HEADERS, ..._TRACES_HEADERS): a value
# whose header looks secret, or is a vendor's name for its credential (Honeycomb's team,
# a DSN, a licence key); not a dataset's or a tenant's name, which is ordinary text.
_EXPORTER_HEADERS = re.compile(r"OTEL_EXPORTER_OTLP_(?:[A-Z]++_)?HEADERS", re.IGNORECASE)
_EXPORTER_SECRET_HEADER = re.compile(
    r"key|token|auth|secret|passw|cookie|honeycomb-team|dsn|licen[cs]e", re.IGNORECASE
)
_AUTH_SCHEME = re.compile(r"(?i:bearer|basic|token|digest|apikey)\s++")

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


def without_key_shapes(text: str) -> str:
    """``text`` with what has a key's shape (``sk-...``, ``ghp_...``, a bearer token) as
    ``[REDACTED]``; names and values around it left as they are."""
    return _SHAPES.sub(REDACTED, text)


# ``api_key=...``, ``"password": "..."``, ``Authorization: ...``: keep the name (and an
# authorization's scheme, ``Basic``), drop the value; but not a number after a key or
# token name (``max_tokens=2000`` is a setting, not a secret), while a password of
# digits is still a password. A name ending in ``_env`` whose value is a variable's name
# (``api_key_env='TEAM_KEY'``: capitals, digits, underscores) names where the secret is:
# the name the user must set is not one (any other value of such a name is redacted).
# The text is the model's or a server's, so each part is tried once: a name is a whole
# run of ``[\w-]`` (from where no such character comes before it, not from each word
# boundary inside it), a lookahead checks the run holds the word, and every run after it
# is possessive (``*+``). Read as ``\b[\w-]*token[\w-]*...``, 40,000 characters of
# ``a-a-a-...`` took over a minute: each boundary rescanned the rest of the run.
_PAIR = re.compile(
    r"(?i)((?<![\w\-])(?=[\w\-]*?(?:api[_\-]?key|token|authorization))[\w\-]*+[\"']?\s*+[:=]"
    r"\s*+[\"']?(?:(?:basic|bearer|token|digest|apikey)\s++)?)(?!\[REDACTED\])(?![\d.]+\b)"
    r"([^\s\"'&,;}]{4,})"
    r"|((?<![\w\-])(?=[\w\-]*?(?:secret|password|passwd))[\w\-]*+[\"']?\s*+[:=]\s*+[\"']?)"
    r"(?!\[REDACTED\])([^\s\"'&,;}]{4,})"
)


def _keep_name(found: re.Match[str]) -> str:
    name, value = (found.group(1), found.group(2)) if found.group(1) else found.group(3, 4)
    if _NAMES_A_VARIABLE.search(name) and _VARIABLE.fullmatch(value):
        return found.group(0)
    return name + REDACTED


_NAMES_A_VARIABLE = re.compile(r"[_\-]env[\"']?\s*+[:=]", re.IGNORECASE)
_VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]*+")


def secret_values(
    kwargs: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Secret-looking values of ``kwargs`` and of the environment.

    A value counts when its name holds ``KEY``, ``TOKEN``, ``SECRET``, ``PASSWORD`` (and a
    few spellings) and it is a string of at least `MIN_SECRET_CHARS` characters; a keyword
    ending in ``_env`` (``api_key_env``) names a variable and is not one. The password of
    a URL among ``kwargs`` (a ``base_url`` with ``user:password@``) is one too, and so is
    the value of a header given in ``kwargs`` (``headers={"api-key": ...}``) whose name
    holds ``key``, ``token``, ``auth``, ``secret``, ``password`` or ``cookie``, without
    its scheme (the token of ``Bearer <token>``). Of the environment, every value of the
    OTLP exporter's ``OTEL_EXPORTER_OTLP_HEADERS`` counts too, as given and URL-decoded.

    Args:
        kwargs: keyword arguments, e.g. a provider's ``backend_kwargs`` (``api_key``).
        environ: the environment to read; default ``os.environ``.

    Returns:
        The values, longest first (so a longer secret is redacted before a prefix of it).
    """
    found: set[str] = set()
    keywords = kwargs or {}
    found.update(_url_passwords(keywords))
    found.update(_named_variables(keywords))
    found.update(_header_secrets(keywords))
    environment = os.environ if environ is None else environ
    found.update(_exporter_header_secrets(environment))
    for source in (keywords, environment):
        for name, value in source.items():
            if (
                isinstance(value, str)
                and len(value) >= MIN_SECRET_CHARS
                and _SECRET_NAME.search(name)
                # ``api_key_env="OPENAI_API_KEY"`` names where the key is: not a secret
                and not (source is keywords and name.lower().endswith("_env"))
            ):
                found.add(value)
    return sorted(found, key=len, reverse=True)


def _url_passwords(keywords: Mapping[str, object]) -> Iterator[str]:
    """The password of a URL (``base_url="https://u:pw@host"``)."""
    for value in keywords.values():
        if isinstance(value, str) and "@" in value:
            for found in URL_USERINFO.finditer(value):
                if len(found.group("secret")) >= MIN_SECRET_CHARS:
                    yield found.group("secret")


def _named_variables(keywords: Mapping[str, object]) -> Iterator[str]:
    """What the variable an ``..._env`` keyword names holds (``api_key_env="TEAM_CREDS"``)."""
    for name, value in keywords.items():
        if name.lower().endswith("_env") and _SECRET_NAME.search(name[:-4]):
            named = os.environ.get(value) if isinstance(value, str) and value else None
            if named is not None and len(named) >= MIN_SECRET_CHARS:
                yield named


def _header_secrets(keywords: Mapping[str, object]) -> Iterator[str]:
    """The values of secret-named headers in a ``headers`` keyword (Azure's ``api-key``,
    ``x-api-key``, ``Authorization: Bearer ...``), each without its scheme; of a
    ``Cookie``, each cookie's value."""
    for name, headers in keywords.items():
        if not (name.lower().endswith("headers") and isinstance(headers, Mapping)):
            continue
        for header, value in headers.items():
            if not (isinstance(header, str) and isinstance(value, str)):
                continue
            if "cookie" in header.lower():
                cookies = [part.partition("=")[2].strip() for part in value.split(";")]
                yield from (c for c in cookies if len(c) >= MIN_SECRET_CHARS)
            elif _SECRET_HEADER.search(header):
                yield from _credential(value)


def _exporter_header_secrets(environ: Mapping[str, str]) -> Iterator[str]:
    """The secret values of ``OTEL_EXPORTER_OTLP_HEADERS`` (and ``..._TRACES_HEADERS``...):
    comma-separated ``name=value`` pairs, URL-encoded, that carry the exporter's own
    credential (``x-honeycomb-team=...``, ``api-key=...``, ``Authorization=Basic ...``);
    a dataset's or a tenant's name is ordinary text, left alone."""
    for name, value in environ.items():
        if not (isinstance(value, str) and _EXPORTER_HEADERS.fullmatch(name)):
            continue
        for pair in value.split(","):
            header, _, encoded = (part.strip() for part in pair.partition("="))
            if not _EXPORTER_SECRET_HEADER.search(unquote(header)):
                continue
            if len(encoded) >= MIN_SECRET_CHARS:  # as code would print it, undecoded
                yield encoded
            yield from _credential(unquote(encoded))


def _credential(value: str) -> Iterator[str]:
    """A credential without its auth scheme (``Bearer``, ``Basic``), if at least
    `MIN_SECRET_CHARS` long."""
    value = value.strip()
    scheme = _AUTH_SCHEME.match(value)
    token = value[scheme.end() :] if scheme else value
    if len(token) >= MIN_SECRET_CHARS:
        yield token


class SecretRuns:
    """Finds every run of `RUN_CHARS` or more consecutive characters of known secrets.

    Cheap enough per node: the set of every 8-character window of every secret is built
    once; a scan first finds, with one C-speed regex, the stretches of text made only of
    characters the secrets use (``[...]{8,}``), and only inside those checks each 8-character
    window against the set. Ordinary prose has few such stretches and each is short.
    A run is the union of overlapping matching windows, so ``...test-planted`` of the key
    ``sk-test-planted-1234`` is found whole, wherever it starts.

    Args:
        secrets: the secret values; those shorter than `RUN_SECRET_CHARS`, or holding
            whitespace or ``://``, are skipped (match them literally instead).
    """

    __slots__ = ("_candidates", "_grams")

    def __init__(self, secrets: Iterable[str]) -> None:
        eligible = [s for s in secrets if _runs_apply(s)]
        self._grams = frozenset(
            s[i : i + RUN_CHARS] for s in eligible for i in range(len(s) - RUN_CHARS + 1)
        )
        chars = "".join(sorted(set("".join(eligible))))
        self._candidates = re.compile(f"[{re.escape(chars)}]{{{RUN_CHARS},}}") if chars else None

    def __bool__(self) -> bool:
        return self._candidates is not None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Start and end of every maximal run of secret characters in ``text``, in order."""
        if self._candidates is None:
            return []
        grams, width = self._grams, RUN_CHARS
        found: list[tuple[int, int]] = []
        for stretch in self._candidates.finditer(text):
            begin, end = stretch.span()
            run_start = run_end = -1
            for i in range(begin, end - width + 1):
                if text[i : i + width] not in grams:
                    continue
                if i <= run_end:  # overlaps or touches the current run: extend it
                    run_end = i + width
                else:
                    if run_end >= 0:
                        found.append((run_start, run_end))
                    run_start, run_end = i, i + width
            if run_end >= 0:
                found.append((run_start, run_end))
        return found

    def redact(self, text: str) -> str:
        """``text`` with every run replaced by ``[REDACTED]``."""
        spans = self.spans(text)
        if not spans:
            return text
        parts: list[str] = []
        last = 0
        for start, end in spans:
            parts.append(text[last:start])
            parts.append(REDACTED)
            last = end
        parts.append(text[last:])
        return "".join(parts)


def _runs_apply(secret: str) -> bool:
    return (
        len(secret) >= RUN_SECRET_CHARS
        and "://" not in secret
        and not any(c.isspace() for c in secret)
    )


_SHORT_TEXT = 80  # a text this short, scrubbed once, is remembered (at most _SHORT_KEPT)
_SHORT_KEPT = 256


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

    __slots__ = ("_literals", "_runs", "_short")

    def __init__(
        self, secrets: Iterable[str] = (), *, environ: Mapping[str, str] | None = None
    ) -> None:
        values = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_CHARS}
        values.update(secret_values(environ=environ))
        ordered = sorted(values, key=len, reverse=True)
        self._literals = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._runs = SecretRuns(ordered)
        self._short: dict[str, str] = {}  # short texts scrubbed (a model's name, a reason)

    def scrub(self, text: str) -> str:
        """``text`` with every secret (and every 8+ character run of one) replaced by
        ``[REDACTED]``, and each lone surrogate by U+FFFD (`utf8_text`)."""
        text = self.scrub_literals(utf8_text(text))
        text = _SHAPES.sub(REDACTED, text)
        return _PAIR.sub(_keep_name, without_url_passwords(text))

    def __call__(self, text: str) -> str:
        return self.scrub(text)

    @property
    def has_literals(self) -> bool:
        return self._literals is not None

    def scrub_literals(self, text: str) -> str:
        """Only the known secret values and runs of them (no shape matching): cheap
        enough for every node."""
        if self._literals is None:
            return text
        if len(text) > _SHORT_TEXT:
            return self._runs.redact(self._literals.sub(REDACTED, text))
        done = self._short.get(text)  # every call's model and finish reason: the same few
        if done is None:
            done = self._runs.redact(self._literals.sub(REDACTED, text))
            if len(self._short) < _SHORT_KEPT:
                self._short[text] = done
        return done
